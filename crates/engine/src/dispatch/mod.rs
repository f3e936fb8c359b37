//! Running one aten call (`call`): key it (key.rs), find its executable or lower and compile one
//! on a miss (lookup.rs, cache.rs, build.rs), then run it (run.rs) or record it (record.rs). Home
//! of the engine lock (lock.rs): its data is the op table, the executable cache and the statistics.
mod build;
mod cache;
mod key;
mod lookup;
mod record;
mod run;

pub use cache::{program_stats, reset_stats, stats, BucketCall, ProgramStats, Stats};
pub(crate) use cache::Entry;
pub use key::KeyHasher;

use crate::abi::*;
use crate::cell::{Cell, Stored};
use crate::error::Error;
use crate::fused;
use crate::lock::{EngineLock, Held};
use build::Sizing;
use cache::Cached;
use key::{KeyMap, Scan, SIZE_PROGRAM};
use lookup::{lookup, Looked};
use lowerings::{DType, ErrorKind, Lowering, TorchError};
use record::record;
use run::{read_count, run};
use std::collections::HashMap;
use std::sync::Arc;

pub struct OpInfo {
    pub qualified: String,
    pub overload: String,
    pub base: String,
    pub arg_names: Vec<String>,
    pub write_args: Vec<usize>,
    pub inplace: bool,
    pub lowering: Option<Lowering>,
}

struct Engine {
    ops: Vec<Arc<OpInfo>>,
    /// Fused eager mode's recorded graph and its programs.
    fused: fused::Fused,
    cache: KeyMap<Cached>,
    /// Per family of bucketed programs, the exact shapes compiled for it so far (buckets.rs).
    families: KeyMap<u32>,
    tick: u64,
    stats: Stats,
}

// SAFETY: the process's one engine lock (the only `EngineLock::new`).
static ENGINE: EngineLock<Option<Engine>> = unsafe { EngineLock::new(None) };

fn with_engine<R>(f: impl FnOnce(&mut Engine) -> R) -> R {
    let mut g = ENGINE.lock();
    let e = g.data().get_or_insert_with(|| Engine { ops: Vec::new(), fused: fused::Fused::default(), cache: HashMap::default(), families: HashMap::default(), tick: 0, stats: Stats::default() });
    f(e)
}

/// Runs `f` with the engine locked: `f` gets the token that reads (`&Held`) and writes
/// (`&mut Held`) cells.
pub fn locked<R>(f: impl FnOnce(&mut Held) -> R) -> R {
    f(ENGINE.lock().held())
}

/// Like `locked`, after running what fused eager mode recorded: every cell's buffer is then
/// computed (`Stored::dev`), except those of ops that failed.
pub fn ready<R>(why: &str, f: impl FnOnce(&mut Held) -> R) -> Result<R, Error> {
    let mut guard = ENGINE.lock();
    let (engine, held) = guard.split();
    if let Some(e) = engine.as_mut() {
        e.fused.flush(why)?;
    }
    Ok(f(held))
}

/// A cell's contents, computed: what fused eager mode recorded runs first only when the cell
/// waits for it.
pub fn stored_ready(cell: &Cell) -> Result<Option<Stored>, Error> {
    let s = locked(|held| cell.get(held).clone());
    if s.as_ref().is_some_and(|s| s.dev().is_none()) {
        return ready("read", |held| cell.get(held).clone());
    }
    Ok(s)
}

/// Runs what fused eager mode recorded if it holds ops with device checks: a read raises
/// their failures, as in strict eager.
pub fn flush_checked() -> Result<(), Error> {
    let mut guard = ENGINE.lock();
    match guard.data().as_mut() {
        Some(e) if e.fused.has_checks() => e.fused.flush("read (device checks)"),
        _ => Ok(()),
    }
}

/// Runs what fused eager mode recorded (a read, synchronize, a switch of mode: `why`).
pub fn flush_recorded(why: &str) -> Result<(), Error> {
    ready(why, |_| ())
}

/// Turns launch-blocking mode on or off (on: what fused eager mode recorded runs first).
pub fn set_launch_blocking(on: bool) -> Result<(), Error> {
    crate::blocking::set_enabled(on);
    if on {
        return flush_recorded("launch blocking turned on");
    }
    Ok(())
}

/// Turns fused eager mode on or off (off: what was recorded runs first).
pub fn set_fused_eager(on: bool) -> Result<(), Error> {
    if !on {
        fused::set_enabled(false);
        return flush_recorded("fused eager turned off");
    }
    fused::set_enabled(true);
    Ok(())
}

pub fn fused_stats() -> fused::FusedStats {
    with_engine(|e| e.fused.stats.clone())
}

pub fn register_op(qualified: &str, overload: &str, arg_names: Vec<String>, write_mask: u64) -> i32 {
    let base = lowerings::base_name(qualified).to_string();
    let lowering = lowerings::registry().get(&base).copied();
    let mut write_args: Vec<usize> = (0..arg_names.len()).filter(|&i| write_mask & (1 << i) != 0).collect();
    for name in lowering.map(|l| l.writes).unwrap_or(&[]) {
        if let Some(i) = arg_names.iter().position(|n| n == name) {
            write_args.push(i);
        }
    }
    let short = qualified.strip_prefix("aten::").unwrap_or(qualified);
    let inplace = short.ends_with('_') && !short.starts_with("__");
    let info = OpInfo { qualified: qualified.to_string(), overload: overload.to_string(), base, arg_names, write_args, inplace, lowering };
    with_engine(|e| {
        e.ops.push(Arc::new(info));
        (e.ops.len() - 1) as i32
    })
}

pub fn op_info(id: i32) -> Option<Arc<OpInfo>> {
    with_engine(|e| e.ops.get(id as usize).cloned())
}

/// What one call produced.
pub enum Produced {
    Tensor { cell: *mut Cell, dtype: DType, dims: Vec<i64> },
    List(Vec<Produced>),
    Undefined,
}

pub enum CallResult {
    Done(Vec<Produced>),
    /// An out= argument must be resized to these sizes first.
    Resize(usize, Vec<i64>),
}

fn no_lowering(info: &OpInfo) -> TorchError {
    let name = if info.overload.is_empty() { info.qualified.clone() } else { format!("{}.{}", info.qualified, info.overload) };
    TorchError::new(
        ErrorKind::NotImplemented,
        format!(
            "The operator '{name}' is not currently implemented for the tpu device. \
             As a temporary fix, you can set the environment variable `TORCHTPU_CPU_FALLBACK=1` \
             to run this operator on the CPU (slower)."
        ),
    )
}

pub fn call(op: i32, args: &[TtArg]) -> Result<CallResult, Error> {
    let mut guard = ENGINE.lock();
    let (engine, held) = guard.split();
    let engine = engine.as_mut().expect("ops are registered before they are called");
    let info = engine.ops.get(op as usize).cloned().ok_or_else(|| Error::runtime(format!("torchtpu: unknown op id {op}")))?;
    let lowering = info.lowering.ok_or_else(|| Error::NoLowering(no_lowering(&info)))?;

    let mut scan = Scan { key: Vec::with_capacity(64), ..Default::default() };
    // The float32 matmul precision shapes every program with a contraction or convolution.
    scan.key.push(op as u64 | (lowerings::float32_matmul() as u64) << 32);
    for a in args {
        scan.arg(a, lowering.specialize_floats, held)?;
    }
    // A data-dependent size is computed by its own program and read back first.
    let size = match lowering.size {
        None => None,
        Some(size_fn) => {
            engine.fused.flush(&format!("data-dependent size ({})", info.base))?;
            let mut key = scan.key.clone();
            key.push(SIZE_PROGRAM);
            let entry = match lookup(engine, held, &key, &info, size_fn, lowering.specialize_floats, args, &scan, Sizing::Program)? {
                Looked::Entry(e, _) => e,
                Looked::Resize(..) => unreachable!("size programs write nothing"),
            };
            let n = read_count(run(&entry, &info.qualified, None, args, &scan, held)?, held)?;
            scan.key.push(n as u64);
            Some(n)
        }
    };
    let key = std::mem::take(&mut scan.key);
    let sizing = size.map_or(Sizing::None, Sizing::Known);
    let (entry, bucket) = match lookup(engine, held, &key, &info, lowering.f, lowering.specialize_floats, args, &scan, sizing)? {
        Looked::Entry(e, s) => (e, s),
        Looked::Resize(i, dims) => return Ok(CallResult::Resize(i, dims)),
    };
    engine.stats.executions += 1;
    if fused::enabled() {
        return record(engine, &info, &entry, bucket.as_deref(), args, &scan, held).map(CallResult::Done);
    }
    // (Another thread may have turned the mode off after recording.)
    engine.fused.flush("fused eager turned off")?;
    let produced = run(&entry, &info.qualified, bucket.as_deref(), args, &scan, held)?;
    if crate::blocking::enabled() {
        // This op's program, waited for: its failures raise here, at the op.
        crate::cell::synchronize()?;
        crate::checks::raise_pending()?;
    }
    Ok(CallResult::Done(produced))
}
