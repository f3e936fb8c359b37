//! Running a call's program: host checks, uploads (host tensors, random state, a bucketed call's
//! geometry, float scalars' reused buffers), the cells' buffers fed, and the results handed back
//! as new cells or swapped into written cells; a size program's number read back.
use super::build::dtype_of;
use super::cache::{BucketCall, Entry, Feed, OutSpec, RetSpec};
use super::key::Scan;
use super::Produced;
use crate::abi::*;
use crate::cell::{Cell, DevBuf, Stored};
use crate::checks;
use crate::error::{not_computed, Error};
use crate::lock::Held;
use crate::runtime::runtime;
use crate::values::{element_type, mix, scalar_bytes};
use lowerings::DType;
use stablehlo::ElemType;
use std::collections::HashMap;
use std::sync::Arc;

/// The number a size program produced (waits for it: a synchronization, where pending checks
/// raise).
pub(super) fn read_count(produced: Vec<Produced>, held: &Held) -> Result<i64, Error> {
    checks::raise_pending()?;
    let Some(Produced::Tensor { cell, dtype, .. }) = produced.into_iter().next() else {
        return Err(Error::runtime("torchtpu: a size program must return one tensor"));
    };
    // SAFETY: the size program just made this cell, and nothing else has it.
    let cell = unsafe { Box::from_raw(cell) };
    let s = cell.get(held).as_ref().expect("a produced cell holds a buffer");
    let mut bytes = vec![0u8; dtype.size()];
    s.dev().ok_or_else(not_computed)?.buf.to_host(&mut bytes)?;
    Ok(match dtype {
        DType::I64 => i64::from_le_bytes(bytes.try_into().unwrap()),
        DType::I32 => i32::from_le_bytes(bytes.try_into().unwrap()) as i64,
        _ => return Err(Error::runtime("torchtpu: a size program must return an int64 or int32 scalar")),
    })
}

fn arg_at(args: &[TtArg], arg: u32, item: i32) -> &TtArg {
    let a = &args[arg as usize];
    if item < 0 {
        a
    } else {
        &a.list::<TtArg>()[item as usize]
    }
}

pub(super) fn upload(rt: &crate::runtime::Runtime, bytes: &[u8], dtype: DType, dims: &[i64], device: i32) -> Result<pjrt::Buffer, Error> {
    let ty = element_type(dtype);
    Ok(rt.client.buffer_from_host(bytes, ty, dims, None, rt.device(device)?)?)
}

/// Float scalars' buffers by device, dtype and value: a number fed again (an optimizer's
/// betas, eps, learning rate) reads the buffer of its first upload instead of paying an upload
/// and a free per call. Programs donate only written cells (`donate_written_buffers`), so such
/// a buffer is never written. Engine-internal like a program's constants: not counted as tensor
/// memory. Emptied when it holds SCALAR_BUFFERS numbers (ones that change every step).
static SCALARS: std::sync::Mutex<Option<HashMap<(i32, DType, [u8; 16]), Arc<pjrt::Buffer>>>> = std::sync::Mutex::new(None);
const SCALAR_BUFFERS: usize = 1024;

/// The buffer of the call's `n`-th float scalar as `elem` (see SCALARS).
pub(super) fn scalar_buffer(scan: &Scan, n: u32, elem: ElemType) -> Result<Arc<pjrt::Buffer>, Error> {
    let (bytes, len) = scalar_bytes(scan.floats[n as usize], elem);
    let key = (scan.device, DType::from_elem(elem), bytes);
    let mut cache = SCALARS.lock().unwrap();
    let cache = cache.get_or_insert_with(HashMap::new);
    if let Some(b) = cache.get(&key) {
        return Ok(b.clone());
    }
    if cache.len() >= SCALAR_BUFFERS {
        cache.clear();
    }
    let b = Arc::new(upload(runtime()?, &bytes[..len], key.1, &[], scan.device)?);
    cache.insert(key, b.clone());
    Ok(b)
}

/// The buffer a non-cell feed uploads for this call (host tensors, random state, a bucketed
/// call's geometry where it is not kept); None for cell, accumulator and scalar feeds.
pub(super) fn upload_feed(f: &Feed, bucket: Option<&BucketCall>, kept_geometry: bool, args: &[TtArg], scan: &Scan) -> Result<Option<pjrt::Buffer>, Error> {
    // Cell feeds (most of a call's) return before anything else is looked up: the eager path.
    if matches!(f, Feed::Base(_) | Feed::CheckAcc | Feed::Scalar(..)) || (kept_geometry && matches!(f, Feed::Geometry)) {
        return Ok(None);
    }
    let rt = runtime()?;
    let device = scan.device;
    Ok(Some(match *f {
        Feed::Base(_) | Feed::CheckAcc => unreachable!("returned above"),
        Feed::Host(arg, item) => {
            let t = arg_at(args, arg, item).tensor();
            let dtype = dtype_of(t.dtype)?;
            let n = t.sizes().iter().product::<i64>() as usize * dtype.size();
            let bytes = if n == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(t.host as *const u8, n) } };
            upload(rt, bytes, dtype, t.sizes(), device)?
        }
        Feed::Scalar(..) => unreachable!("returned above"),
        Feed::Geometry => bucket.expect("a bucketed program runs with its call's geometry").upload(device)?,
        Feed::Rng(arg) => {
            let a = &args[arg as usize];
            let (seed, offset) = unsafe { (a.p.n.i as u64, a.p.n.i2 as u64) };
            let state = [mix(seed ^ mix(offset.wrapping_add(0x9E37_79B9_7F4A_7C15))), offset];
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&state[0].to_le_bytes());
            bytes[8..].copy_from_slice(&state[1].to_le_bytes());
            upload(rt, &bytes, DType::U64, &[2], device)?
        }
    }))
}

/// The call's returns, from its results (None where a result went to a written cell).
pub(super) fn returns_of(entry: &Entry, mut made: Vec<Option<Produced>>) -> Vec<Produced> {
    let mut produced = Vec::with_capacity(entry.returns.len());
    for r in &entry.returns {
        match r {
            RetSpec::Tensor(i) => produced.push(made[*i].take().unwrap()),
            RetSpec::List(is) => produced.push(Produced::List(is.iter().map(|&i| made[i].take().unwrap()).collect())),
            RetSpec::Undefined => produced.push(Produced::Undefined),
        }
    }
    produced
}

pub(super) fn run(entry: &Entry, name: &str, bucket: Option<&BucketCall>, args: &[TtArg], scan: &Scan, held: &mut Held) -> Result<Vec<Produced>, Error> {
    for c in &entry.host_checks {
        checks::run_host(c, args)?;
    }
    let rt = runtime()?;
    let device = scan.device;
    // (A promoted shape's own program has no geometry: its bucket call gives result sizes.)
    let kept_geometry = match bucket {
        Some(call) if entry.feeds.iter().any(|f| matches!(f, Feed::Geometry)) => call.kept(device)?,
        _ => None,
    };
    // Owned uploads and scalars first, so that the references below stay valid.
    let mut owned: Vec<pjrt::Buffer> = Vec::new();
    let mut scalars: Vec<Arc<pjrt::Buffer>> = Vec::new();
    for f in &entry.feeds {
        match *f {
            Feed::Scalar(n, elem) => scalars.push(scalar_buffer(scan, n, elem)?),
            _ => owned.extend(upload_feed(f, bucket, kept_geometry.is_some(), args, scan)?),
        }
    }
    // Held from here until the program's new accumulator is stored (see checks.rs).
    let acc = if entry.checks { Some(checks::acc(device)?) } else { None };
    let mut inputs: Vec<&pjrt::Buffer> = Vec::with_capacity(entry.feeds.len());
    let (mut next_owned, mut next_scalar) = (0, 0);
    for f in &entry.feeds {
        match *f {
            Feed::Base(slot) => {
                // SAFETY: the call's arguments keep their cells alive.
                let cell = unsafe { &*scan.cells[slot as usize] };
                let s = cell.get(held).as_ref().expect("a fed cell holds a buffer");
                inputs.push(&s.dev().ok_or_else(not_computed)?.buf);
            }
            Feed::CheckAcc => inputs.push(acc.as_ref().unwrap().input()),
            Feed::Geometry if kept_geometry.is_some() => inputs.push(kept_geometry.unwrap()),
            Feed::Scalar(..) => {
                inputs.push(&scalars[next_scalar]);
                next_scalar += 1;
            }
            _ => {
                inputs.push(&owned[next_owned]);
                next_owned += 1;
            }
        }
    }
    let exe = entry.exe.for_run()?;
    let launched_ns = crate::trace::launch_clock();
    let mut outputs = exe.execute(&inputs, rt.device(device)?)?;
    drop(inputs);
    crate::trace::launched(|| name.to_string(), device, launched_ns, &outputs);
    if let Some(acc) = acc {
        acc.store(outputs.pop().expect("a program with checks returns its check accumulator last"));
    }

    let mut made: Vec<Option<Produced>> = Vec::with_capacity(outputs.len());
    for (i, (buf, spec)) in outputs.into_iter().zip(&entry.results).enumerate() {
        match spec {
            OutSpec::New { dtype, dims } => {
                let bytes = dims.iter().product::<i64>() * dtype.size() as i64;
                // A bucketed program's result (or its promoted shape's) holds its bucket: the
                // tensor has its real sizes.
                let shown = bucket.map_or(dims, |s| &s.dims[i]);
                let nbytes = shown.iter().product::<i64>() * dtype.size() as i64;
                let stored = Stored::ready(DevBuf::new(buf, bytes, device), *dtype, dims.clone());
                let cell = Cell::new(nbytes, device, Some(stored));
                made.push(Some(Produced::Tensor { cell, dtype: *dtype, dims: shown.clone() }));
            }
            OutSpec::Base { slot, dtype, dims, donated } => {
                // SAFETY: the call's arguments keep their cells alive.
                let cell = unsafe { &*scan.cells[*slot as usize] };
                if *donated {
                    // The old buffer's memory now belongs to the new one: release it first, so
                    // that the byte counts (and their peak) count it once.
                    cell.set(held, None);
                }
                let nbytes = dims.iter().product::<i64>() * dtype.size() as i64;
                cell.set(held, Some(Stored::ready(DevBuf::new(buf, nbytes, device), *dtype, dims.clone())));
                made.push(None);
            }
        }
    }
    Ok(returns_of(entry, made))
}
