//! Running one aten call: key the call by everything that shapes its program, find the
//! compiled executable (lower and compile on a miss), feed it the cells' buffers and runtime
//! scalars, and hand back new cells or swap new buffers into written cells. Home of the engine
//! lock (lock.rs): its data is the op table, the executable cache and the statistics, and its
//! token opens the cells that a call reads and writes.
use crate::abi::*;
use crate::cell::{Buf, Cell, DevBuf, Stored};
use crate::fused;
use crate::checks;
use crate::compile_pool::{self, Program, Urgency};
use crate::error::{not_computed, Error};
use crate::lock::{EngineLock, Held};
use crate::runtime::{runtime, Tiering};
use crate::buckets;
use crate::overlap;
use crate::values::{element_type, mix, scalar_bytes};
use crate::view::{self, Geometry};
use lowerings::{Arg, Args, Cx, DType, ErrorKind, FloatArg, Lowering, Out, Rank, Tensor, TorchError};
use stablehlo::{ElemType, TensorType, Value};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::time::Instant;

pub struct OpInfo {
    pub qualified: String,
    pub overload: String,
    pub base: String,
    pub arg_names: Vec<String>,
    pub write_args: Vec<usize>,
    pub inplace: bool,
    pub lowering: Option<Lowering>,
}

/// Where a module parameter's buffer comes from at run time.
#[derive(Clone, Debug)]
enum Feed {
    /// The current buffer of the call's `slot`-th distinct cell.
    Base(u32),
    /// A CPU tensor argument (arg, list item or -1), uploaded.
    Host(u32, i32),
    /// The `n`-th float scalar of the call, converted to `elem`.
    Scalar(u32, ElemType),
    /// The random state from a generator argument.
    Rng(u32),
    /// The device's check accumulator (see checks.rs).
    CheckAcc,
    /// A bucketed program's geometry vector (buckets.rs), from the call's `BucketCall`.
    Geometry,
}

#[derive(Clone, Debug)]
enum OutSpec {
    New { dtype: DType, dims: Vec<i64> },
    /// The new buffer of a written cell; `donated`: it reuses the cell's old buffer.
    Base { slot: u32, dtype: DType, dims: Vec<i64>, donated: bool },
}

impl OutSpec {
    fn dims(&self) -> &[i64] {
        match self {
            OutSpec::New { dims, .. } | OutSpec::Base { dims, .. } => dims,
        }
    }
}

#[derive(Clone, Debug)]
enum RetSpec {
    Tensor(usize),
    List(Vec<usize>),
    Undefined,
}

struct Entry {
    /// Compiled, or compiling on a worker thread (fused eager mode, promotions).
    exe: Arc<Program>,
    /// Whether it took the quick tier (a fused graph of such programs takes it too).
    quick: bool,
    /// Unique per entry (fused graphs are keyed by their ops' entries).
    id: u64,
    /// The program's text (fused.rs composes graphs of it); None for a user's module.
    text: Option<Arc<str>>,
    /// Per result, its bytes where the program returns a constant integer scalar (a number
    /// return such as attention's max_q): fused eager mode gives it as a computed tensor, so
    /// that the shim's read of the number does not run the recorded graph.
    constants: Vec<Option<[u8; 8]>>,
    feeds: Vec<Feed>,
    results: Vec<OutSpec>,
    returns: Vec<RetSpec>,
    /// Checks run on host-fed index tensors before the program.
    host_checks: Vec<checks::HostCheck>,
    /// Whether the program has device checks: it takes the device's check accumulator (fed
    /// as `Feed::CheckAcc`) and returns it updated as its last result.
    checks: bool,
}

/// FNV-style mixing of the u64 words of a key: keys are short and built fresh per call.
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Keys are u64 slices, hashed as their bytes: take them a word at a time.
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.write_u64(u64::from_le_bytes(c.try_into().unwrap()));
        }
        for &b in chunks.remainder() {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7cc1_b727_220a_95);
    }
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64)
    }
}

#[derive(Default, Clone, Debug)]
pub struct Stats {
    pub hits: u64,
    pub misses: u64,
    pub compile_seconds: f64,
    pub executions: u64,
    /// Executables dropped from the in-memory cache to stay under its bound.
    pub evictions: u64,
    /// Bucketed programs compiled (buckets.rs), and new shapes they served without compiling.
    pub bucket_programs: u64,
    pub bucket_shapes: u64,
    /// Shapes served by a bucketed program often enough to get their exact program.
    pub bucket_promoted: u64,
}

/// A cached executable and the engine tick of its last use; for a shape served by a bucketed
/// program, that shape's geometry and result sizes (kept once its own program takes over:
/// that program stores its results as the bucketed one did).
struct Cached {
    entry: Arc<Entry>,
    bucket: Option<Arc<BucketCall>>,
    promotion: Promotion,
    used: u64,
    /// Calls served from this entry.
    runs: u32,
    /// Fused eager mode: graphs in a row that held a call of it, and the last of them.
    graphs: u32,
    last_graph: u64,
}

/// Where a shape served by a bucketed program stands on the way to its own program.
enum Promotion {
    /// Served by the bucketed program.
    NotYet,
    /// Its own program compiles on a worker thread until it takes over (buckets::PROMOTE_AFTER).
    Compiling(Arc<Entry>),
    /// Its own program serves it.
    Done,
}

/// One exact shape run by a bucketed program (buckets.rs).
pub struct BucketCall {
    geometry: Vec<i64>,
    /// The geometry on the device of the shape's first run, reused by later runs there.
    uploaded: std::sync::OnceLock<(i32, pjrt::Buffer)>,
    /// The real sizes of the program's new results, in order.
    dims: Vec<Vec<i64>>,
    /// The constant numbers the exact shape's program returns (Entry::constants): the bucketed
    /// program computes them from the geometry, so a read of one would run a recorded graph.
    constants: Vec<Option<[u8; 8]>>,
}

impl BucketCall {
    fn upload(&self, device: i32) -> Result<pjrt::Buffer, Error> {
        let bytes: Vec<u8> = self.geometry.iter().flat_map(|x| x.to_le_bytes()).collect();
        upload(runtime()?, &bytes, DType::I64, &[self.geometry.len() as i64], device)
    }

    /// The geometry's kept buffer on `device`; None where it is kept on another device.
    fn kept(&self, device: i32) -> Result<Option<&pjrt::Buffer>, Error> {
        if self.uploaded.get().is_none() {
            let b = self.upload(device)?;
            let _ = self.uploaded.set((device, b));
        }
        Ok(self.uploaded.get().filter(|(d, _)| *d == device).map(|(_, b)| b))
    }
}

type KeyMap<V> = HashMap<Box<[u64]>, V, BuildHasherDefault<KeyHasher>>;

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

/// The next entry's id.
fn entry_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// How many executables the in-memory cache keeps at most (TORCHTPU_MAX_EXECUTABLES, default
/// 4096). The cache must be bounded: XLA:CPU maps each loaded executable's JIT code into
/// memory mappings of its own (about 4 for `x * 3`, over 100 for an SVD's while loops), and a
/// process that kept every executable (the whole test suite in one pytest process compiles
/// ~20,000) reached the kernel's vm.max_map_count (65,530), after which the next compile or
/// load failed and the process segfaulted. Evicted programs come back from the persistent
/// cache on their next use.
fn max_executables() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        std::env::var("TORCHTPU_MAX_EXECUTABLES").ok().and_then(|v| v.trim().parse().ok()).filter(|&n| n > 0).unwrap_or(4096)
    })
}

/// The kernel's limit on memory mappings per process (vm.max_map_count), where it has one.
fn map_limit() -> Option<usize> {
    static LIMIT: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| std::fs::read_to_string("/proc/sys/vm/max_map_count").ok()?.trim().parse().ok())
}

/// The process's memory mappings now (about 10 ms to read at 30,000 mappings).
fn map_count() -> Option<usize> {
    let maps = std::fs::read("/proc/self/maps").ok()?;
    Some(maps.iter().filter(|&&b| b == b'\n').count())
}

/// Misses between two looks at the process's mapping count.
const MAP_CHECK_EVERY: u64 = 16;

/// Drops the least recently used quarter of the cache (at least one entry); a call still
/// running an evicted executable keeps it alive through its Arc.
fn evict(engine: &mut Engine) {
    let mut used: Vec<u64> = engine.cache.values().map(|c| c.used).collect();
    if used.is_empty() {
        return;
    }
    let n = (used.len() / 4).max(1);
    // Ticks are distinct: exactly the n oldest entries are at or below the cutoff.
    let (_, &mut cutoff, _) = used.select_nth_unstable(n - 1);
    let before = engine.cache.len();
    engine.cache.retain(|_, c| c.used > cutoff);
    engine.stats.evictions += (before - engine.cache.len()) as u64;
}

/// Keeps the cache under its count bound and, since executables differ in how many mappings
/// they hold, the process under half its mapping limit (checked every few misses).
fn bound_cache(engine: &mut Engine) {
    if engine.cache.len() >= max_executables() {
        evict(engine);
    }
    if engine.stats.misses % MAP_CHECK_EVERY == 0 {
        if let Some(limit) = map_limit() {
            while !engine.cache.is_empty() && map_count().is_some_and(|n| n > limit / 2) {
                evict(engine);
            }
        }
    }
}

pub fn stats() -> Stats {
    let mut s = with_engine(|e| e.stats.clone());
    // Programs compiled on worker threads (fused eager mode, promotions) count as well.
    s.compile_seconds += compile_pool::seconds();
    s
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

// ---- scanning a call --------------------------------------------------------------------------

/// The parts of a call that are not in the arguments' values: distinct cells, float scalars.
#[derive(Default)]
struct Scan {
    key: Vec<u64>,
    cells: Vec<*mut Cell>,
    floats: Vec<f64>,
    device: i32,
}

const UNINIT: u64 = u64::MAX;

impl Scan {
    fn slot(&mut self, cell: *mut Cell) -> (u32, bool) {
        if let Some(i) = self.cells.iter().position(|&c| c == cell) {
            return (i as u32, false);
        }
        self.cells.push(cell);
        ((self.cells.len() - 1) as u32, true)
    }

    fn tensor(&mut self, t: &TtTensor, held: &Held) -> Result<(), Error> {
        let sizes = t.sizes();
        if t.is_host() {
            self.key.push(1 << 40 | (t.flags as u64) << 8 | t.dtype as u8 as u64);
            self.key.push(sizes.len() as u64);
            self.key.extend(sizes.iter().map(|&s| s as u64));
            return Ok(());
        }
        let (slot, first) = self.slot(t.cell as *mut Cell);
        // SAFETY: the argument's storage keeps its cell alive for the call.
        let cell = unsafe { &*(t.cell as *const Cell) };
        if first {
            let device = cell.device;
            if self.cells.len() == 1 {
                self.device = device;
            } else if device != self.device {
                return Err(Error::runtime(format!(
                    "Expected all tensors to be on the same device, but found at least two devices, tpu:{} and tpu:{}!",
                    self.device, device
                )));
            }
        }
        self.key.push(2 << 40 | (slot as u64) << 8 | t.dtype as u8 as u64);
        self.key.push(sizes.len() as u64);
        self.key.extend(sizes.iter().map(|&s| s as u64));
        if sizes.contains(&0) {
            // An empty view reads and writes nothing wherever it starts: one program serves
            // every offset and stride (a step buffer's unused tail, cut at each step's count).
            self.key.extend(std::iter::repeat(0).take(sizes.len() + 1));
        } else {
            self.key.extend(t.strides().iter().map(|&s| s as u64));
            self.key.push(t.offset as u64);
        }
        if first {
            // The base's layout shapes the program: its dtype and dims, or "nothing yet".
            match cell.get(held) {
                Some(s) => {
                    self.key.push(s.dtype as u8 as u64);
                    self.key.push(s.dims.len() as u64);
                    self.key.extend(s.dims.iter().map(|&d| d as u64));
                }
                None => {
                    self.key.push(UNINIT);
                    self.key.push(cell.nbytes() as u64);
                }
            }
        }
        Ok(())
    }

    fn arg(&mut self, a: &TtArg, specialize: bool, held: &Held) -> Result<(), Error> {
        self.key.push(a.kind as u64);
        match a.kind {
            TT_TENSOR => self.tensor(a.tensor(), held)?,
            TT_INT | TT_BOOL | TT_SCALAR_TYPE | TT_OTHER => self.key.push(a.int() as u64),
            TT_FLOAT => {
                let f = unsafe { a.p.f };
                self.floats.push(f);
                if specialize {
                    self.key.push(f.to_bits());
                }
            }
            TT_COMPLEX => {
                let c = unsafe { a.p.c };
                self.key.push(c.re.to_bits());
                self.key.push(c.im.to_bits());
            }
            TT_INT_LIST | TT_BOOL_LIST | TT_FLOAT_LIST => {
                let n = unsafe { a.p.list.len };
                self.key.push(n as u64);
                match a.kind {
                    TT_INT_LIST => self.key.extend(a.list::<i64>().iter().map(|&x| x as u64)),
                    TT_BOOL_LIST => self.key.extend(a.list::<u8>().iter().map(|&x| x as u64)),
                    _ => self.key.extend(a.list::<f64>().iter().map(|x| x.to_bits())),
                }
            }
            TT_STR => {
                let s = a.list::<u8>();
                self.key.push(s.len() as u64);
                for chunk in s.chunks(8) {
                    let mut w = [0u8; 8];
                    w[..chunk.len()].copy_from_slice(chunk);
                    self.key.push(u64::from_le_bytes(w));
                }
            }
            TT_TENSOR_LIST => {
                let items = a.list::<TtArg>();
                self.key.push(items.len() as u64);
                for item in items {
                    self.arg(item, specialize, held)?;
                }
            }
            _ => {}
        }
        Ok(())
    }
}

// ---- calls ------------------------------------------------------------------------------------

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
            let n = read_count(run(&entry, None, args, &scan, held)?, held)?;
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
    run(&entry, bucket.as_deref(), args, &scan, held).map(CallResult::Done)
}

const SIZE_PROGRAM: u64 = u64::MAX - 1;

/// Whether a program is a size program, or is given the size one computed.
#[derive(Copy, Clone)]
enum Sizing {
    None,
    Program,
    Known(i64),
}

enum Looked {
    Entry(Arc<Entry>, Option<Arc<BucketCall>>),
    Resize(usize, Vec<i64>),
}

#[allow(clippy::too_many_arguments)]
fn lookup(
    engine: &mut Engine,
    held: &Held,
    key: &[u64],
    info: &OpInfo,
    f: lowerings::LowerFn,
    specialize: bool,
    args: &[TtArg],
    scan: &Scan,
    sizing: Sizing,
) -> Result<Looked, Error> {
    engine.tick += 1;
    let tick = engine.tick;
    if let Some(c) = engine.cache.get_mut(key) {
        c.used = tick;
        engine.stats.hits += 1;
        c.runs = c.runs.saturating_add(1);
        // A shape a bucketed program keeps serving gets its own exact program: compiled on a
        // worker thread meanwhile, it takes over at a fixed call (the two may round differently
        // in the last place, and a script run twice must give the same numbers).
        let (due, takes_over) = if fused::enabled() {
            // By graphs in a row: a fused program is composed of its ops' programs, and its
            // structure must stop changing for it to be fused (fused.rs).
            let graph = engine.fused.next_generation();
            let first_in_graph = graph != c.last_graph;
            if first_in_graph {
                c.graphs = if graph - c.last_graph <= buckets::RECENT_GRAPHS { c.graphs + 1 } else { 1 };
                c.last_graph = graph;
            }
            (first_in_graph && c.graphs == buckets::PROMOTE_GRAPHS, c.graphs > buckets::PROMOTE_GRAPHS)
        } else {
            (c.runs == buckets::PROMOTE_AFTER + 1, c.runs > buckets::PROMOTE_AFTER + buckets::PROMOTE_CALLS)
        };
        if let (true, Promotion::Compiling(exact)) = (takes_over, &c.promotion) {
            c.entry = exact.clone();
            c.promotion = Promotion::Done;
        }
        let looked = Looked::Entry(c.entry.clone(), c.bucket.clone());
        if c.bucket.is_some() && due && matches!(c.promotion, Promotion::NotYet) && !buckets::scoped() {
            let t0 = Instant::now();
            if let Ok(Built::Entry(exact)) = build(info, f, specialize, args, scan, held, sizing, true) {
                engine.stats.bucket_promoted += 1;
                engine.stats.misses += 1;
                engine.stats.compile_seconds += t0.elapsed().as_secs_f64();
                engine.cache.get_mut(key).expect("the entry just used").promotion = Promotion::Compiling(Arc::new(exact));
            }
        }
        return Ok(looked);
    }
    // A key fixes the written views' geometry and which cells they share: checked once per key.
    overlap::check(&info.base, args, &info.write_args)?;
    if matches!(sizing, Sizing::None) && bucketed_here(info) {
        if let Some(looked) = lookup_bucketed(engine, held, key, info, f, specialize, args, scan)? {
            return Ok(looked);
        }
    }
    let t0 = Instant::now();
    let entry = match build(info, f, specialize, args, scan, held, sizing, false)? {
        Built::Entry(e) => Arc::new(e),
        Built::Resize(i, dims) => return Ok(Looked::Resize(i, dims)),
    };
    engine.stats.misses += 1;
    engine.stats.compile_seconds += t0.elapsed().as_secs_f64();
    bound_cache(engine);
    engine.cache.insert(key.to_vec().into_boxed_slice(), Cached { entry: entry.clone(), bucket: None, promotion: Promotion::NotYet, used: tick, runs: 0, graphs: 1, last_graph: engine.fused.next_generation() });
    Ok(Looked::Entry(entry, None))
}

/// A call of a bucketable op at a shape not seen yet: served by the bucketed program of its
/// sizes' buckets once its family has compiled `buckets::EXACT_SHAPES_FIRST` exact shapes
/// (compiling that program on its first use). None: compile this shape exactly.
#[allow(clippy::too_many_arguments)]
fn lookup_bucketed(
    engine: &mut Engine,
    held: &Held,
    key: &[u64],
    info: &OpInfo,
    f: lowerings::LowerFn,
    specialize: bool,
    args: &[TtArg],
    scan: &Scan,
) -> Result<Option<Looked>, Error> {
    let base_dtype = |t: &TtTensor| {
        // SAFETY: the call's arguments keep their cells alive.
        let cell = unsafe { &*(t.cell as *const Cell) };
        // A cell not written yet reads as zeros of any dtype.
        cell.get(held).as_ref().map_or(Some(t.dtype), |s| Some(s.dtype as i8))
    };
    if !buckets::servable(args, base_dtype, &info.write_args) {
        return Ok(None);
    }
    // Filling storage not written yet from nothing as large as itself (zeros_like's zero_, an
    // initializer's normal_ on empty) runs exactly: a bucketed fill would give the storage a
    // buffer of its bucket for life (optimizer state, parameters: up to twice the memory, and
    // every later fused step slicing the values out and updating them back in). A copy into
    // a new tensor keeps its bucket (a cache grown by copies compiles per bucket), and so does
    // every write in a `bucketed_programs()` scope (a server's step buffers, new at each size).
    let numel = |t: &TtTensor| t.sizes().iter().product::<i64>();
    let fills_new_storage = |i: &usize| {
        let Some(a) = args.get(*i).filter(|a| a.kind == TT_TENSOR) else { return false };
        let t = a.tensor();
        // SAFETY: the call's arguments keep their cells alive.
        let unwritten = unsafe { &*(t.cell as *const Cell) }.get(held).is_none();
        let others: i64 = args.iter().enumerate().filter(|(j, b)| j != i && b.kind == TT_TENSOR).map(|(_, b)| numel(b.tensor())).sum();
        unwritten && others < numel(t)
    };
    if !buckets::scoped() && info.write_args.iter().any(fills_new_storage) {
        return Ok(None);
    }
    // The family: the op, its arguments' kinds, dtypes, ranks and non-tensor values.
    let mut family = vec![BUCKET_PROGRAM, key[0]];
    for a in args {
        bucket_key_arg(&mut family, a, specialize, scan, held, true);
    }
    let seen = engine.families.entry(family.into_boxed_slice()).or_insert(0);
    if *seen < buckets::EXACT_SHAPES_FIRST && !buckets::scoped() {
        *seen += 1;
        return Ok(None);
    }
    // The program: the family with every tensor's sizes bucketed and its storage's dims (the
    // program's parameter); sizes, strides and offsets are its runtime geometry.
    let mut layout = vec![BUCKET_PROGRAM, key[0]];
    for a in args {
        bucket_key_arg(&mut layout, a, specialize, scan, held, false);
    }
    // The exact shapes' lowering, not compiled: PyTorch's errors, out= resizes, result sizes.
    let (dims, constants, failures) = match dry_run(info, f, specialize, args, scan, held)? {
        Dry::Resize(i, dims) => return Ok(Some(Looked::Resize(i, dims))),
        Dry::Exact => return Ok(None),
        Dry::Results(dims, constants, failures) => (dims, constants, failures),
    };
    let mut geometry = Vec::new();
    buckets::input_geometry(args, &mut geometry);
    // Each result's padded dims shape the program, and its capacity the buffer it fills: a cat
    // of inputs in the same buckets can have results in different ones.
    for d in &dims {
        layout.push(d.len() as u64);
        layout.extend(buckets::padded(d).iter().map(|&n| n as u64));
        layout.push(buckets::capacity(d) as u64);
        geometry.extend_from_slice(d);
    }
    layout.push(failures.len() as u64);
    geometry.extend_from_slice(&failures);
    engine.tick += 1;
    let tick = engine.tick;
    let entry = match engine.cache.get_mut(layout.as_slice()) {
        Some(c) => {
            c.used = tick;
            c.entry.clone()
        }
        None => {
            let t0 = Instant::now();
            let Some(e) = build_bucketed(info, f, specialize, args, scan, held, &geometry, &dims)? else {
                return Ok(None);
            };
            let e = Arc::new(e);
            engine.stats.misses += 1;
            engine.stats.bucket_programs += 1;
            engine.stats.compile_seconds += t0.elapsed().as_secs_f64();
            bound_cache(engine);
            engine.cache.insert(layout.into_boxed_slice(), Cached { entry: e.clone(), bucket: None, promotion: Promotion::NotYet, used: tick, runs: 0, graphs: 1, last_graph: engine.fused.next_generation() });
            e
        }
    };
    engine.stats.bucket_shapes += 1;
    let call = Arc::new(BucketCall { geometry, uploaded: std::sync::OnceLock::new(), dims, constants });
    engine.cache.insert(key.to_vec().into_boxed_slice(), Cached { entry: entry.clone(), bucket: Some(call.clone()), promotion: Promotion::NotYet, used: tick, runs: 0, graphs: 1, last_graph: engine.fused.next_generation() });
    Ok(Some(Looked::Entry(entry, Some(call))))
}

const BUCKET_PROGRAM: u64 = u64::MAX - 2;

/// Whether bucketed programs can serve the op (declared `.pointwise()` or `.bucketed()`).
fn bucketable(info: &OpInfo) -> bool {
    info.lowering.is_some_and(|l| l.pointwise || l.bucketed)
}

/// Whether this call may take a bucketed program: in a scope any bucketable op, elsewhere
/// (bucketed programs on) those not declared for scopes only.
fn bucketed_here(info: &OpInfo) -> bool {
    bucketable(info) && (buckets::scoped() || (buckets::enabled() && !info.lowering.is_some_and(|l| l.bucketed_in_scopes_only)))
}

/// A call's argument in a bucketed program's key, or in its family's (see lookup_bucketed).
fn bucket_key_arg(key: &mut Vec<u64>, a: &TtArg, specialize: bool, scan: &Scan, held: &Held, family: bool) {
    key.push(a.kind as u64);
    match a.kind {
        TT_TENSOR => {
            let t = a.tensor();
            if t.is_host() {
                key.push(1 << 40 | (t.flags as u64) << 8 | t.dtype as u8 as u64);
                return;
            }
            bucket_key_tensor(key, t, scan, held, family);
        }
        TT_TENSOR_LIST => {
            let items = a.list::<TtArg>();
            key.push(items.len() as u64);
            for item in items {
                bucket_key_tensor(key, item.tensor(), scan, held, family);
            }
        }
        TT_INT | TT_BOOL | TT_SCALAR_TYPE | TT_OTHER => key.push(a.int() as u64),
        TT_FLOAT if specialize => key.push(unsafe { a.p.f }.to_bits()),
        TT_COMPLEX => {
            let c = unsafe { a.p.c };
            key.push(c.re.to_bits());
            key.push(c.im.to_bits());
        }
        TT_INT_LIST | TT_BOOL_LIST | TT_FLOAT_LIST | TT_STR => {
            // Rare in pointwise ops: the exact scan's words for it.
            let mut scan = Scan::default();
            let _ = scan.arg(a, specialize, held);
            key.extend(scan.key);
        }
        _ => {}
    }
}

/// A device tensor in a bucketed program's key: its cell's slot, dtype, rank, and unless only
/// the family is keyed, its sizes' buckets and its storage's dims.
fn bucket_key_tensor(key: &mut Vec<u64>, t: &TtTensor, scan: &Scan, held: &Held, family: bool) {
    let slot = scan.cells.iter().position(|&c| c == t.cell as *mut Cell).unwrap();
    key.push(slot as u64);
    buckets::key_tensor(key, t, family);
    if family {
        return;
    }
    // SAFETY: the call's arguments keep their cells alive.
    let cell = unsafe { &*(t.cell as *const Cell) };
    match cell.get(held) {
        Some(s) => {
            key.push(s.dims.len() as u64);
            key.extend(s.dims.iter().map(|&d| d as u64));
        }
        // Not written yet: zeros of the storage's bucket (Builder::base).
        None => {
            let size = DType::from_code(t.dtype).map_or(1, |d| d.size() as i64);
            key.extend([u64::MAX, buckets::bucket(cell.nbytes() / size) as u64]);
        }
    }
}

/// The number a size program produced (waits for it: a synchronization, where pending checks
/// raise).
fn read_count(produced: Vec<Produced>, held: &Held) -> Result<i64, Error> {
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

// ---- building a program -----------------------------------------------------------------------

enum Built {
    Entry(Entry),
    Resize(usize, Vec<i64>),
}

fn dtype_of(code: i8) -> Result<DType, Error> {
    DType::from_code(code).ok_or_else(|| Error::Torch(TorchError::new(ErrorKind::NotImplemented, format!("torchtpu: {} is not supported on tpu", DType::unsupported_name(code)))))
}

struct Builder<'a> {
    cx: Cx,
    feeds: Vec<Feed>,
    scan: &'a Scan,
    /// The engine lock's token: the builder reads the cells' buffers' types.
    held: &'a Held,
    /// The current value of each distinct cell's base, and whether the call wrote it.
    bases: Vec<Value>,
    written: Vec<bool>,
    next_float: u32,
    specialize: bool,
    /// In a bucketed program (buckets.rs): the geometry parameter, the next unread position in it,
    /// and where each tensor argument's geometry starts.
    bucket: Option<BucketBuild>,
}

struct BucketBuild {
    geo: Value,
    next: usize,
    starts: Vec<(u32, usize)>,
}

impl Builder<'_> {
    fn new<'a>(scan: &'a Scan, held: &'a Held, specialize: bool) -> Builder<'a> {
        Builder { cx: Cx::new(), feeds: Vec::new(), scan, held, bases: Vec::new(), written: Vec::new(), next_float: 0, specialize, bucket: None }
    }

    fn feed(&mut self, ty: TensorType, feed: Feed) -> Value {
        let tag = self.feeds.len() as u32;
        let host = matches!(feed, Feed::Host(..));
        self.feeds.push(feed);
        if host {
            self.cx.host_param(ty, tag)
        } else {
            self.cx.external_param(ty, tag)
        }
    }

    fn base(&mut self, slot: u32, t: &TtTensor) -> Result<Value, Error> {
        while self.bases.len() <= slot as usize {
            // SAFETY: the call's arguments keep their cells alive.
            let cell = unsafe { &*self.scan.cells[self.bases.len()] };
            let v = match cell.get(self.held) {
                Some(s) => self.feed(TensorType { elem: s.dtype.elem(), dims: s.dims.clone() }, Feed::Base(self.bases.len() as u32)),
                None => {
                    let dt = dtype_of(t.dtype)?;
                    let mut n = cell.nbytes() / dt.size() as i64;
                    if self.bucket.is_some() {
                        // Its buffer will hold a bucket, like a bucketed result's.
                        n = buckets::bucket(n);
                    }
                    self.cx.full(0.0, dt, &[n])
                }
            };
            self.bases.push(v);
            self.written.push(false);
        }
        Ok(self.bases[slot as usize])
    }

    fn tensor(&mut self, arg: u32, item: i32, t: &TtTensor) -> Result<Tensor, Error> {
        let dtype = dtype_of(t.dtype)?;
        let rank = if t.flags & TT_WRAPPED_NUMBER != 0 {
            Rank::Wrapped
        } else if t.ndim == 0 {
            Rank::ZeroDim
        } else {
            Rank::Dim
        };
        if t.is_host() {
            let v = self.feed(TensorType { elem: dtype.elem(), dims: t.sizes().to_vec() }, Feed::Host(arg, item));
            return Ok(Tensor { v, dtype, rank });
        }
        let slot = self.scan.cells.iter().position(|&c| c == t.cell as *mut Cell).unwrap() as u32;
        let mut base = self.base(slot, t)?;
        if let Some(sb) = &mut self.bucket {
            // Servable calls read views in their storage's dtype (buckets::servable).
            let (geo, at) = (sb.geo, sb.next);
            sb.next += 1 + 2 * t.sizes().len();
            sb.starts.push((arg, at));
            let v = buckets::read(&mut self.cx, base, geo, at, &buckets::padded(t.sizes()));
            if self.cx.padded.is_some() {
                let real = buckets::real_sizes(&mut self.cx, geo, at, t.sizes().len());
                self.cx.padded.as_mut().unwrap().real.push((v, real));
            }
            return Ok(Tensor { v, dtype, rank });
        }
        if self.cx.dtype(base) != dtype {
            // A view with another dtype than its storage's (view(dtype), view_as_real, ...).
            base = view::reinterpret(&mut self.cx, base, dtype);
        }
        let g = Geometry { sizes: t.sizes(), strides: t.strides(), offset: t.offset };
        let v = view::read(&mut self.cx, base, &g);
        Ok(Tensor { v, dtype, rank })
    }

    fn arg(&mut self, i: u32, item: i32, a: &TtArg) -> Result<Arg, Error> {
        Ok(match a.kind {
            TT_NONE => Arg::None,
            TT_TENSOR => Arg::Tensor(self.tensor(i, item, a.tensor())?),
            TT_INT => Arg::Int(a.int()),
            TT_BOOL => Arg::Bool(a.int() != 0),
            TT_FLOAT => {
                let value = self.scan.floats[self.next_float as usize];
                let slot = if self.specialize { None } else { Some(self.next_float) };
                self.next_float += 1;
                Arg::Float(FloatArg { value, slot })
            }
            TT_COMPLEX => {
                let c = unsafe { a.p.c };
                Arg::Complex(c.re, c.im)
            }
            TT_INT_LIST => Arg::IntList(a.list::<i64>().to_vec()),
            TT_FLOAT_LIST => Arg::FloatList(a.list::<f64>().to_vec()),
            TT_BOOL_LIST => Arg::BoolList(a.list::<u8>().iter().map(|&b| b != 0).collect()),
            TT_TENSOR_LIST => {
                let mut items = Vec::new();
                for (j, it) in a.list::<TtArg>().iter().enumerate() {
                    items.push(self.arg(i, j as i32, it)?);
                }
                Arg::List(items)
            }
            TT_STR => Arg::Str(String::from_utf8_lossy(a.list::<u8>()).into_owned()),
            TT_SCALAR_TYPE => Arg::DType(dtype_of(a.int() as i8)?),
            TT_GENERATOR => {
                let v = self.feed(TensorType { elem: ElemType::U64, dims: vec![2] }, Feed::Rng(i));
                Arg::Generator(v)
            }
            _ => Arg::Other,
        })
    }

    /// Writes `v` into the tensor argument `t` (in-place or out=).
    fn write(&mut self, info: &OpInfo, arg: usize, t: &TtTensor, v: Value) -> Result<Option<Built>, Error> {
        let dtype = dtype_of(t.dtype)?;
        let got = self.cx.dtype(v);
        if !lowerings::can_cast(got, dtype) {
            return Err(Error::Torch(TorchError::new(
                ErrorKind::Runtime,
                format!("result type {} can't be cast to the desired output type {}", got.torch_name(), dtype.torch_name()),
            )));
        }
        let dims = self.cx.dims(v);
        if let Some(sb) = &self.bucket {
            let padded = buckets::padded(t.sizes());
            if dims != padded {
                return Err(Error::runtime(format!("torchtpu: bucketed {}: result {:?} for a written {:?}", info.base, dims, padded)));
            }
            let (geo, at) = (sb.geo, sb.starts.iter().find(|s| s.0 as usize == arg).expect("a written tensor was read first").1);
            let v = self.cx.cast(v, dtype);
            let slot = self.scan.cells.iter().position(|&c| c == t.cell as *mut Cell).unwrap();
            let base = self.base(slot as u32, t)?;
            self.bases[slot] = buckets::write(&mut self.cx, base, geo, at, &padded, v);
            self.written[slot] = true;
            return Ok(None);
        }
        if dims.as_slice() != t.sizes() {
            if info.inplace {
                return Err(Error::Torch(TorchError::new(
                    ErrorKind::Runtime,
                    format!("output with shape {:?} doesn't match the broadcast shape {:?}", t.sizes(), dims),
                )));
            }
            return Ok(Some(Built::Resize(arg, dims)));
        }
        let v = self.cx.cast(v, dtype);
        let slot = self.scan.cells.iter().position(|&c| c == t.cell as *mut Cell).unwrap();
        let base = self.base(slot as u32, t)?;
        let g = Geometry { sizes: t.sizes(), strides: t.strides(), offset: t.offset };
        let nb = if self.cx.dtype(base) != dtype {
            // Written through a view of another dtype: write the reinterpreted base. The buffer
            // then keeps the writer's dtype where its bytes are the same either way, so that a
            // storage allocated as raw bytes and used as floats (vLLM's KV cache) is updated in
            // place from then on, instead of converted whole on every write.
            let seen = view::reinterpret(&mut self.cx, base, dtype);
            let written = view::write(&mut self.cx, seen, &g, v);
            let (from, elems) = (self.cx.dtype(base), self.cx.numel(base));
            if view::same_bytes_as(from, elems, dtype) { written } else { view::restore(&mut self.cx, written, base) }
        } else {
            view::write(&mut self.cx, base, &g, v)
        };
        self.bases[slot] = nb;
        self.written[slot] = true;
        Ok(None)
    }
}

/// What a program computes (`results`, each described by its `OutSpec`) and how the call's
/// returns are made of them.
#[derive(Default)]
struct Outputs {
    results: Vec<Value>,
    specs: Vec<OutSpec>,
    returns: Vec<RetSpec>,
}

impl Outputs {
    /// A new result the call returns; its index.
    fn push_new(&mut self, cx: &Cx, v: Value) -> usize {
        self.results.push(v);
        self.specs.push(OutSpec::New { dtype: cx.dtype(v), dims: cx.dims(v) });
        self.results.len() - 1
    }
}

/// Lowers one call into a program and compiles it, in these steps.
/// `promotion`: the program of a shape a bucketed program served (lookup): it compiles on a
/// worker thread, and stores its new results as the bucketed program did (flat, at their
/// bucket's capacity), so that the ops reading them keep their keys and their counts.
#[allow(clippy::too_many_arguments)]
fn build(info: &OpInfo, f: lowerings::LowerFn, specialize: bool, args: &[TtArg], scan: &Scan, held: &Held, sizing: Sizing, promotion: bool) -> Result<Built, Error> {
    let mut b = Builder::new(scan, held, specialize);
    let lowered = b.lower_call(info, f, args, sizing)?;
    let mut outs = lowered.into_iter();
    if let Some(resize) = b.write_arguments(info, args, sizing, &mut outs)? {
        return Ok(resize);
    }
    let mut o = b.returned_outputs(outs);
    let tiering = if bucketable(info) {
        Tiering::Class(buckets::size_class(args, o.specs.iter().map(OutSpec::dims)))
    } else {
        Tiering::Largest
    };
    if promotion {
        for (v, spec) in o.results.iter_mut().zip(o.specs.iter_mut()) {
            if let OutSpec::New { dims, .. } = spec {
                *v = buckets::pad_flat(&mut b.cx, *v, buckets::capacity(dims));
                *dims = b.cx.dims(*v);
            }
        }
    }
    b.append_written_bases(&mut o);
    let (host_checks, checks) = b.attach_checks(info, &mut o.results)?;
    let feeds = b.ordered_feeds();
    let aliases = donate_written_buffers(&b.cx, &feeds, &o.results, &mut o.specs);
    let module_override = b.cx.module_override.take();
    let text = b.cx.b.finish_with_aliases(&o.results, &aliases);
    let kept = module_override.is_none().then(|| Arc::from(text.as_str()));
    let constants = constant_scalars(&text, o.specs.len());
    let (exe, quick) = match module_override {
        Some(module) => (compile_module(info, &module)?, false),
        None => compile_program(info, text, tiering, promotion)?,
    };
    Ok(Built::Entry(Entry { exe, quick, id: entry_id(), text: kept, constants, feeds, results: o.specs, returns: o.returns, host_checks, checks }))
}

/// For each of a program's first `n` results, its little-endian bytes where it is a constant
/// 0-d i64 or i32 (`%v = "stablehlo.constant"() {value = dense<N> : tensor<i64>}`, maybe
/// through 0-d broadcasts).
fn constant_scalars(text: &str, n: usize) -> Vec<Option<[u8; 8]>> {
    let Some(ret) = text.lines().find(|l| l.trim_start().starts_with("\"func.return\"(")) else { return vec![None; n] };
    let names = ret.split_once('(').and_then(|(_, r)| r.split_once(')')).map_or("", |(names, _)| names);
    let definition = |name: &str| {
        let def = format!("{name} = ");
        text.lines().map(str::trim_start).find(|l| l.starts_with(&def)).map(|l| &l[def.len()..])
    };
    names
        .split(", ")
        .take(n)
        .map(|name| {
            let mut line = definition(name)?;
            for _ in 0..4 {
                let Some(src) = line.strip_prefix("\"stablehlo.broadcast_in_dim\"(") else { break };
                let (src, rest) = src.split_once(')')?;
                if !rest.ends_with(": (tensor<i64>) -> tensor<i64>") && !rest.ends_with(": (tensor<i32>) -> tensor<i32>") {
                    return None;
                }
                line = definition(src)?;
            }
            let lit = line.strip_prefix("\"stablehlo.constant\"() {value = dense<")?;
            let (lit, ty) = lit.split_once("> : tensor<")?;
            let x: i64 = lit.parse().ok()?;
            match ty.split('>').next()? {
                "i64" => Some(x.to_le_bytes()),
                "i32" => Some((x as i64).to_le_bytes()),
                _ => None,
            }
        })
        .chain(std::iter::repeat(None))
        .take(n)
        .collect()
}

enum Dry {
    Resize(usize, Vec<i64>),
    /// The lowering replaces the module, or adds checks a bucketed program cannot make: not
    /// for a bucketed program.
    Exact,
    /// The sizes of the new results, their constants (Entry::constants), and the failure ids
    /// of the call's device checks, member by member (`bucketed_failure_ids`).
    Results(Vec<Vec<i64>>, Vec<Option<[u8; 8]>>, Vec<i64>),
}

/// Lowers the call at its exact shapes without compiling (see lookup_bucketed).
fn dry_run(info: &OpInfo, f: lowerings::LowerFn, specialize: bool, args: &[TtArg], scan: &Scan, held: &Held) -> Result<Dry, Error> {
    let mut b = Builder::new(scan, held, specialize);
    let lowered = b.lower_call(info, f, args, Sizing::None)?;
    let mut outs = lowered.into_iter();
    if let Some(r) = b.write_arguments(info, args, Sizing::None, &mut outs)? {
        let Built::Resize(i, dims) = r else { unreachable!("writes resize or succeed") };
        return Ok(Dry::Resize(i, dims));
    }
    let o = b.returned_outputs(outs);
    let Some(failures) = bucketed_failure_ids(info, &b.cx.checks).filter(|_| b.cx.module_override.is_none()) else {
        return Ok(Dry::Exact);
    };
    // Only a 0-d result can be a constant number: most calls skip printing the module.
    let n = o.specs.len();
    let constants = if o.specs.iter().any(|s| s.dims().is_empty()) { constant_scalars(&b.cx.b.finish_with_aliases(&o.results, &[]), n) } else { vec![None; n] };
    Ok(Dry::Results(o.specs.iter().map(|s| s.dims().to_vec()).collect(), constants, failures))
}

/// A bucketed program's checks (an op declared `.bucketed()` that checks its indices against
/// its inputs' real sizes) report the messages of the call's exact shapes ("... with size 5"):
/// their failure ids, computed here from the exact lowering's checks, are runtime inputs
/// (after the result sizes in the geometry). None if a check is made on the host.
fn bucketed_failure_ids(info: &OpInfo, checks: &[lowerings::Check]) -> Option<Vec<i64>> {
    if checks.is_empty() {
        return Some(Vec::new());
    }
    if !info.lowering.is_some_and(|l| l.bucketed) {
        return None;
    }
    let mut ids = Vec::new();
    for c in checks {
        if !matches!(c.eval, lowerings::CheckEval::Device(_)) {
            return None;
        }
        ids.extend(c.messages.iter().map(|m| checks::failure_id(c.kind, m, &info.base)));
    }
    Some(ids)
}

/// Lowers and compiles the bucketed program of a call (buckets.rs); None if the op's lowering does
/// not keep the padded shapes (then the call compiles exactly).
#[allow(clippy::too_many_arguments)]
fn build_bucketed(info: &OpInfo, f: lowerings::LowerFn, specialize: bool, args: &[TtArg], scan: &Scan, held: &Held, geometry: &[i64], dims: &[Vec<i64>]) -> Result<Option<Entry>, Error> {
    let mut b = Builder::new(scan, held, specialize);
    let geo = b.feed(TensorType { elem: ElemType::I64, dims: vec![geometry.len() as i64] }, Feed::Geometry);
    b.bucket = Some(BucketBuild { geo, next: 0, starts: Vec::new() });
    if info.lowering.is_some_and(|l| l.bucketed) {
        b.cx.padded = Some(lowerings::Padded { real: Vec::new(), results: dims.iter().map(|d| buckets::padded(d)).collect(), declined: false });
    }
    let lowered = b.lower_call(info, f, args, Sizing::None)?;
    if b.cx.padded.as_ref().is_some_and(|p| p.declined) {
        return Ok(None);
    }
    let mut outs = lowered.into_iter();
    if b.write_arguments(info, args, Sizing::None, &mut outs)?.is_some() {
        return Ok(None);
    }
    let mut o = b.returned_outputs(outs);
    let mut at = b.bucket.as_ref().unwrap().next;
    for (i, d) in dims.iter().enumerate() {
        let padded = buckets::padded(d);
        if b.cx.dims(o.results[i]) != padded {
            return Ok(None);
        }
        let flat = buckets::flatten(&mut b.cx, o.results[i], geo, at, &padded, buckets::capacity(d));
        at += d.len();
        o.specs[i] = OutSpec::New { dtype: b.cx.dtype(flat), dims: b.cx.dims(flat) };
        o.results[i] = flat;
    }
    b.append_written_bases(&mut o);
    // The failure ids follow the result sizes in the geometry (lookup_bucketed).
    let Some(checks) = b.attach_bucketed_checks(geo, at, geometry.len() - at, &mut o.results) else {
        return Ok(None);
    };
    let feeds = b.ordered_feeds();
    let aliases = donate_written_buffers(&b.cx, &feeds, &o.results, &mut o.specs);
    let text = b.cx.b.finish_with_aliases(&o.results, &aliases);
    let class = buckets::size_class(args, dims.iter().map(Vec::as_slice));
    let kept = Some(Arc::from(text.as_str()));
    let constants = constant_scalars(&text, o.specs.len());
    let (exe, quick) = compile_program(info, text, Tiering::Class(class), false)?;
    Ok(Some(Entry { exe, quick, id: entry_id(), text: kept, constants, feeds, results: o.specs, returns: o.returns, host_checks: Vec::new(), checks }))
}

impl Builder<'_> {
    /// The call's arguments as the lowering's values (CPU tensors with dimensions only where
    /// the op takes them), the computed size where there is one, and the op's lowering on them.
    fn lower_call(&mut self, info: &OpInfo, f: lowerings::LowerFn, args: &[TtArg], sizing: Sizing) -> Result<Vec<Out>, Error> {
        let mut values = Vec::with_capacity(args.len());
        for (i, a) in args.iter().enumerate() {
            if a.kind == TT_TENSOR && a.tensor().is_host() && a.tensor().ndim > 0 && !host_tensors_allowed(&info.base) {
                return Err(Error::Torch(TorchError::new(
                    ErrorKind::Runtime,
                    "Expected all tensors to be on the same device, but found at least two devices, tpu:0 and cpu!",
                )));
            }
            values.push(self.arg(i as u32, -1, a)?);
        }
        let mut names = std::borrow::Cow::Borrowed(&info.arg_names[..]);
        if let Sizing::Known(n) = sizing {
            names.to_mut().push("__size".to_string());
            values.push(Arg::Int(n));
        }
        f(&mut self.cx, &Args { op: &info.base, names: &names, values: &values }).map_err(Error::Torch)
    }

    /// The first outputs go to the written arguments (in-place, out=), in order. Some(Resize)
    /// when an out= argument must be resized first.
    fn write_arguments(&mut self, info: &OpInfo, args: &[TtArg], sizing: Sizing, outs: &mut impl Iterator<Item = Out>) -> Result<Option<Built>, Error> {
        let write_args = if matches!(sizing, Sizing::Program) { &[][..] } else { &info.write_args[..] };
        for &w in write_args {
            let a = &args[w];
            match a.kind {
                TT_NONE => continue,
                TT_TENSOR => match outs.next() {
                    Some(Out::Tensor(v)) => {
                        if let Some(r) = self.write(info, w, a.tensor(), v)? {
                            return Ok(Some(r));
                        }
                    }
                    _ => return Err(Error::runtime(format!("torchtpu: lowering of {} gave no tensor for written argument {}", info.base, info.arg_names[w]))),
                },
                TT_TENSOR_LIST => match outs.next() {
                    Some(Out::List(vs)) if vs.len() == a.list::<TtArg>().len() => {
                        for (item, v) in a.list::<TtArg>().iter().zip(vs) {
                            if let Some(r) = self.write(info, w, item.tensor(), v)? {
                                return Ok(Some(r));
                            }
                        }
                    }
                    _ => return Err(Error::runtime(format!("torchtpu: lowering of {} gave no list for written argument {}", info.base, info.arg_names[w]))),
                },
                _ => return Err(Error::runtime(format!("torchtpu: {} writes an argument of an unsupported kind", info.base))),
            }
        }
        Ok(None)
    }

    /// The remaining outputs are the call's returns: each tensor a new result.
    fn returned_outputs(&self, outs: impl Iterator<Item = Out>) -> Outputs {
        let mut o = Outputs::default();
        for out in outs {
            match out {
                Out::Tensor(v) => {
                    let i = o.push_new(&self.cx, v);
                    o.returns.push(RetSpec::Tensor(i));
                }
                Out::List(vs) => {
                    let idx = vs.iter().map(|&v| o.push_new(&self.cx, v)).collect();
                    o.returns.push(RetSpec::List(idx));
                }
                Out::Undefined => o.returns.push(RetSpec::Undefined),
            }
        }
        o
    }

    /// After them, the new base of each cell the call wrote.
    fn append_written_bases(&self, o: &mut Outputs) {
        for (slot, &w) in self.written.iter().enumerate() {
            if w {
                let v = self.bases[slot];
                o.results.push(v);
                o.specs.push(OutSpec::Base { slot: slot as u32, dtype: self.cx.dtype(v), dims: self.cx.dims(v), donated: false });
            }
        }
    }

    /// Data-dependent checks: host ones run before the program; device ones update the
    /// device's check accumulator, then the program's last result. Returns the host checks
    /// and whether there are device ones.
    fn attach_checks(&mut self, info: &OpInfo, results: &mut Vec<Value>) -> Result<(Vec<checks::HostCheck>, bool), Error> {
        let mut host_checks = Vec::new();
        let mut first: Option<Value> = None;
        for c in std::mem::take(&mut self.cx.checks) {
            match c.eval {
                lowerings::CheckEval::Host { members, shape } => {
                    let members = members
                        .into_iter()
                        .map(|m| match self.feeds[m.tag as usize] {
                            Feed::Host(arg, item) => Ok((arg, item, m.dims, m.lo, m.hi)),
                            _ => Err(Error::runtime("torchtpu: a host check on an input that is not a host tensor")),
                        })
                        .collect::<Result<_, Error>>()?;
                    host_checks.push(checks::HostCheck { kind: c.kind, messages: c.messages, members, shape });
                }
                lowerings::CheckEval::Device(v) => {
                    let ids: Vec<Value> = c
                        .messages
                        .iter()
                        .map(|m| {
                            let id = self.cx.b.constant_i64(checks::failure_id(c.kind, m, &info.base), ElemType::I64);
                            self.cx.b.broadcast_in_dim(id, &[1], &[])
                        })
                        .collect();
                    let row = failure_row(&mut self.cx, v, &ids);
                    first = Some(match first {
                        None => row,
                        Some(prev) => keep_first(&mut self.cx, prev, row),
                    });
                }
            }
        }
        Ok((host_checks, self.update_check_acc(first, results)))
    }

    /// A bucketed program's device checks, their failure ids read from the geometry
    /// (`count` of them from `at`). Whether it has any; None if the lowering made a different
    /// number of check members than the exact shapes' lowering did.
    fn attach_bucketed_checks(&mut self, geo: Value, at: usize, count: usize, results: &mut Vec<Value>) -> Option<bool> {
        let mut first: Option<Value> = None;
        let mut next = at;
        for c in std::mem::take(&mut self.cx.checks) {
            let lowerings::CheckEval::Device(v) = c.eval else { return None };
            if next + c.messages.len() > at + count {
                return None;
            }
            let ids: Vec<Value> = (next..next + c.messages.len()).map(|i| self.cx.b.slice(geo, &[i as i64], &[i as i64 + 1], &[1])).collect();
            next += ids.len();
            let row = failure_row(&mut self.cx, v, &ids);
            first = Some(match first {
                None => row,
                Some(prev) => keep_first(&mut self.cx, prev, row),
            });
        }
        (next == at + count).then(|| self.update_check_acc(first, results))
    }

    /// With checks (`first`: their first failure), the device's check accumulator becomes an
    /// input and, updated, the program's last result. Whether there were checks.
    fn update_check_acc(&mut self, first: Option<Value>, results: &mut Vec<Value>) -> bool {
        let Some(row) = first else { return false };
        // (Not aliased to its input: XLA would add a copy to update it in place.)
        let acc = self.feed(TensorType { elem: ElemType::I64, dims: vec![3] }, Feed::CheckAcc);
        results.push(keep_first(&mut self.cx, acc, row));
        true
    }

    /// The program's parameters in order: the builder's feeds, and the float scalars the
    /// lowering made into inputs.
    fn ordered_feeds(&mut self) -> Vec<Feed> {
        let feeds = &self.feeds;
        std::mem::take(&mut self.cx.feeds)
            .into_iter()
            .map(|f| match f {
                lowerings::Feed::External(tag) => feeds[tag as usize].clone(),
                lowerings::Feed::Scalar { slot, elem } => Feed::Scalar(slot, elem),
            })
            .collect()
    }
}

/// A written cell's old buffer is donated to its new one when their types match: in-place
/// updates (optimizer steps) then reuse the memory instead of holding two copies. The cell
/// holds the only reference to its buffer, and it is replaced by the output right after.
/// (Donation was off for a while as a suspect in a long-run segfault; the cause was the
/// unbounded executable cache, see max_executables.) Returns (parameter, result) aliases and
/// marks the donated specs.
fn donate_written_buffers(cx: &Cx, feeds: &[Feed], results: &[Value], specs: &mut [OutSpec]) -> Vec<(usize, usize)> {
    let mut aliases = Vec::new();
    for (r, spec) in specs.iter_mut().enumerate() {
        if let OutSpec::Base { slot, donated, .. } = spec {
            if let Some(p) = feeds.iter().position(|f| matches!(f, Feed::Base(s) if s == slot)) {
                if cx.b.ty(cx.b.param_value(p)) == cx.b.ty(results[r]) {
                    aliases.push((p, r));
                    *donated = true;
                }
            }
        }
    }
    aliases
}

/// Compiles the program's text (or loads it from the persistent cache); compiled graphs
/// take full optimization whatever the tiering asked. In fused eager mode it compiles on a
/// worker thread (compile_pool.rs): the call is recorded, not run, and the graph's run waits
/// for the program; so it does where `background` asks. Also says whether the program takes
/// the quick tier.
fn compile_program(info: &OpInfo, text: String, tiering: Tiering, background: bool) -> Result<(Arc<Program>, bool), Error> {
    let rt = runtime()?;
    let tiering = if info.qualified.starts_with("torchtpu::run_graph") { Tiering::Full } else { tiering };
    let quick = crate::runtime::takes_quick_tier(&text, tiering);
    let (qualified, base) = (info.qualified.clone(), info.base.clone());
    let compile = move || rt.compile(&qualified, &text, tiering).map_err(|e| format!("torchtpu: compiling {base} failed: {}\n{text}", e.message));
    // A user's kernel compiles at its call even in fused eager mode: its text is the user's
    // (a compile error is a usage error, raised at the call).
    let users_text = info.qualified == "torchtpu::stablehlo_kernel";
    if background || (fused::enabled() && !users_text) {
        let urgency = if background { Urgency::Ahead } else { Urgency::Needed };
        return Ok((compile_pool::submit(urgency, compile), quick));
    }
    compile().map(|exe| (Program::compiled(exe), quick)).map_err(Error::runtime)
}

/// Compiles a user's serialized module (a kernel whose program is the module itself).
fn compile_module(info: &OpInfo, module: &[u8]) -> Result<Arc<Program>, Error> {
    let rt = runtime()?;
    rt.compile_code(&info.qualified, module).map(Program::compiled).map_err(|e| Error::runtime(format!("torchtpu: compiling a kernel module failed: {}", e.message)))
}

/// A device check's result [1 + member, position, value] as [failure id, position, value]
/// (id 0: passed).
fn failure_row(cx: &mut Cx, v: Value, ids: &[Value]) -> Value {
    let code = cx.b.slice(v, &[0], &[1], &[1]);
    let rest = cx.b.slice(v, &[1], &[3], &[1]);
    let mut id = cx.b.constant_i64(0, ElemType::I64);
    let id_dims = [1];
    id = cx.b.broadcast_in_dim(id, &id_dims, &[]);
    for (m, &h) in ids.iter().enumerate().rev() {
        let mc = cx.b.constant_i64(m as i64 + 1, ElemType::I64);
        let mc = cx.b.broadcast_in_dim(mc, &id_dims, &[]);
        let hit = cx.b.compare(stablehlo::CmpDir::Eq, code, mc);
        id = cx.b.select(hit, h, id);
    }
    cx.b.concatenate(&[id, rest], 0)
}

/// `prev` if it holds a failure, else `next` (both [failure id, position, value]).
fn keep_first(cx: &mut Cx, prev: Value, next: Value) -> Value {
    let id = cx.b.slice(prev, &[0], &[1], &[1]);
    let zero = cx.b.constant_i64(0, ElemType::I64);
    let zero = cx.b.broadcast_in_dim(zero, &[1], &[]);
    let failed = cx.b.compare(stablehlo::CmpDir::Ne, id, zero);
    let failed = cx.b.broadcast_in_dim(failed, &[3], &[0]);
    cx.b.select(failed, prev, next)
}

/// Whether the op takes CPU tensors next to tpu ones (declared `.host_tensors()`).
fn host_tensors_allowed(base: &str) -> bool {
    lowerings::registry().get(base).is_some_and(|d| d.host_tensors)
}

// ---- running ----------------------------------------------------------------------------------

fn arg_at(args: &[TtArg], arg: u32, item: i32) -> &TtArg {
    let a = &args[arg as usize];
    if item < 0 {
        a
    } else {
        &a.list::<TtArg>()[item as usize]
    }
}

fn upload(rt: &crate::runtime::Runtime, bytes: &[u8], dtype: DType, dims: &[i64], device: i32) -> Result<pjrt::Buffer, Error> {
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
fn scalar_buffer(scan: &Scan, n: u32, elem: ElemType) -> Result<Arc<pjrt::Buffer>, Error> {
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
fn upload_feed(f: &Feed, bucket: Option<&BucketCall>, kept_geometry: bool, args: &[TtArg], scan: &Scan) -> Result<Option<pjrt::Buffer>, Error> {
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
fn returns_of(entry: &Entry, mut made: Vec<Option<Produced>>) -> Vec<Produced> {
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

fn run(entry: &Entry, bucket: Option<&BucketCall>, args: &[TtArg], scan: &Scan, held: &mut Held) -> Result<Vec<Produced>, Error> {
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
    let mut outputs = entry.exe.get()?.execute(&inputs, rt.device(device)?)?;
    drop(inputs);
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

/// Records the call into fused eager mode's graph instead of running it (fused.rs): its
/// inputs are the cells' buffers as they are now (or pending results of the graph) and its
/// uploads, made now; its results are pending cells.
fn record(engine: &mut Engine, info: &OpInfo, entry: &Arc<Entry>, bucket: Option<&BucketCall>, args: &[TtArg], scan: &Scan, held: &mut Held) -> Result<Vec<Produced>, Error> {
    for c in &entry.host_checks {
        checks::run_host(c, args)?;
    }
    let device = scan.device;
    let graph = engine.fused.graph(device)?;
    let mut inputs = Vec::with_capacity(entry.feeds.len());
    for f in &entry.feeds {
        let input = match *f {
            Feed::Base(slot) => {
                // SAFETY: the call's arguments keep their cells alive.
                let cell = unsafe { &*scan.cells[slot as usize] };
                let s = cell.get(held).as_ref().expect("a fed cell holds a buffer");
                match (&s.buf, s.dev()) {
                    (_, Some(b)) => fused::Input::Ready(b.clone()),
                    (Buf::Pending(p), None) => graph.input_of(p).ok_or_else(not_computed)?,
                    (Buf::Ready(_), None) => unreachable!("a ready buffer is computed"),
                }
            }
            // The graph's own check accumulator: the last checked op's, or zeros.
            Feed::CheckAcc => match &graph.acc {
                Some(p) => graph.input_of(p).expect("a graph's accumulator is its own result"),
                None => fused::Input::Owned(upload(runtime()?, &[0u8; 24], DType::I64, &[3], device)?),
            },
            Feed::Scalar(n, elem) => fused::Input::Scalar(scalar_buffer(scan, n, elem)?),
            _ => fused::Input::Owned(upload_feed(f, bucket, false, args, scan)?.expect("a recorded call's feeds are cells or uploads")),
        };
        inputs.push(input);
    }
    let mut made: Vec<Option<Produced>> = Vec::with_capacity(entry.results.len());
    let mut outs = Vec::with_capacity(entry.results.len());
    for (i, spec) in entry.results.iter().enumerate() {
        let pending = graph.pending(i);
        let (dtype, dims) = match spec {
            OutSpec::New { dtype, dims } | OutSpec::Base { dtype, dims, .. } => (*dtype, dims.clone()),
        };
        let stored = Stored { buf: Buf::Pending(pending.clone()), dtype, dims: dims.clone(), constant: false };
        match spec {
            OutSpec::New { .. } => {
                let shown = bucket.map_or(&dims, |s| &s.dims[i]).clone();
                let nbytes = shown.iter().product::<i64>() * dtype.size() as i64;
                let constant = |c: &[Option<[u8; 8]>]| c.get(i).copied().flatten();
                let stored = match constant(&entry.constants).or_else(|| bucket.and_then(|b| constant(&b.constants))) {
                    Some(bytes) => {
                        // One element: a 0-d result, or its bucketed program's [1].
                        let n = dtype.size();
                        let buf = DevBuf::new(upload(runtime()?, &bytes[..n], dtype, &dims, device)?, n as i64, device);
                        Stored { constant: true, ..Stored::ready(buf, dtype, dims.clone()) }
                    }
                    None => stored,
                };
                made.push(Some(Produced::Tensor { cell: Cell::new(nbytes, device, Some(stored)), dtype, dims: shown }));
            }
            OutSpec::Base { slot, .. } => {
                // SAFETY: the call's arguments keep their cells alive.
                unsafe { &*scan.cells[*slot as usize] }.set(held, Some(stored));
                made.push(None);
            }
        }
        outs.push((pending, dtype, dims));
    }
    if entry.checks {
        // Its updated accumulator, the program's last result.
        let acc = graph.pending(outs.len());
        graph.acc = Some(acc.clone());
        outs.push((acc, DType::I64, vec![3]));
    }
    engine.fused.push(fused::Op { name: info.base.clone(), exe: entry.exe.clone(), quick: entry.quick, id: entry.id, text: entry.text.clone(), inputs, outs });
    Ok(returns_of(entry, made))
}
