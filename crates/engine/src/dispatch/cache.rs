//! The executable cache: an entry (a compiled program, how its parameters are fed and its
//! results stored), a cached entry and the shape a bucketed program serves with it, eviction
//! under the cache's bounds, and the statistics.
use super::run::upload;
use super::{with_engine, Engine};
use crate::checks;
use crate::compile_pool::{self, Program};
use crate::error::Error;
use crate::runtime::runtime;
use lowerings::DType;
use stablehlo::ElemType;
use std::sync::Arc;

/// Where a module parameter's buffer comes from at run time.
#[derive(Clone, Debug)]
pub(super) enum Feed {
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
pub(super) enum OutSpec {
    New { dtype: DType, dims: Vec<i64> },
    /// The new buffer of a written cell; `donated`: it reuses the cell's old buffer.
    Base { slot: u32, dtype: DType, dims: Vec<i64>, donated: bool },
}

impl OutSpec {
    pub(super) fn dims(&self) -> &[i64] {
        match self {
            OutSpec::New { dims, .. } | OutSpec::Base { dims, .. } => dims,
        }
    }
}

#[derive(Clone, Debug)]
pub(super) enum RetSpec {
    Tensor(usize),
    List(Vec<usize>),
    Undefined,
}

pub(crate) struct Entry {
    /// Compiled, or compiling on a worker thread (fused eager mode, promotions).
    pub(crate) exe: Arc<Program>,
    /// Whether it took the quick tier for good (a fused graph of such programs takes it too);
    /// not one that compiled at the quick tier first and tiers up (compile_pool's `TierUp`).
    pub(crate) quick: bool,
    /// Unique per entry (fused graphs are keyed by their ops' entries).
    pub(crate) id: u64,
    /// The op it was compiled for (its qualified name), for compile_stats.
    pub(crate) op: Arc<str>,
    /// The program's text (fused.rs composes graphs of it); None for a user's module.
    pub(crate) text: Option<Arc<str>>,
    /// Per result, its bytes where the program returns a constant integer scalar (a number
    /// return such as attention's max_q): fused eager mode gives it as a computed tensor, so
    /// that the shim's read of the number does not run the recorded graph.
    pub(super) constants: Vec<Option<[u8; 8]>>,
    pub(super) feeds: Vec<Feed>,
    pub(super) results: Vec<OutSpec>,
    pub(super) returns: Vec<RetSpec>,
    /// Checks run on host-fed index tensors before the program.
    pub(super) host_checks: Vec<checks::HostCheck>,
    /// Whether the program has device checks: it takes the device's check accumulator (fed
    /// as `Feed::CheckAcc`) and returns it updated as its last result.
    pub(super) checks: bool,
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
pub(super) struct Cached {
    pub(super) entry: Arc<Entry>,
    pub(super) bucket: Option<Arc<BucketCall>>,
    pub(super) promotion: Promotion,
    pub(super) used: u64,
    /// Calls served from this entry.
    pub(super) runs: u32,
    /// Fused eager mode: graphs in a row that held a call of it, and the last of them.
    pub(super) graphs: u32,
    pub(super) last_graph: u64,
}

/// Where a shape served by a bucketed program stands on the way to its own program.
pub(super) enum Promotion {
    /// Served by the bucketed program.
    NotYet,
    /// Its own program compiles on a worker thread until it takes over (buckets::PROMOTE_AFTER).
    Compiling(Arc<Entry>),
    /// Its own program serves it.
    Done,
}

/// One exact shape run by a bucketed program (buckets.rs).
pub struct BucketCall {
    pub(super) geometry: Vec<i64>,
    /// The geometry on the device of the shape's first run, reused by later runs there.
    pub(super) uploaded: std::sync::OnceLock<(i32, pjrt::Buffer)>,
    /// The real sizes of the program's new results, in order.
    pub(super) dims: Vec<Vec<i64>>,
    /// The constant numbers the exact shape's program returns (Entry::constants): the bucketed
    /// program computes them from the geometry, so a read of one would run a recorded graph.
    pub(super) constants: Vec<Option<[u8; 8]>>,
}

impl BucketCall {
    pub(super) fn upload(&self, device: i32) -> Result<pjrt::Buffer, Error> {
        let bytes: Vec<u8> = self.geometry.iter().flat_map(|x| x.to_le_bytes()).collect();
        upload(runtime()?, &bytes, DType::I64, &[self.geometry.len() as i64], device)
    }

    /// The geometry's kept buffer on `device`; None where it is kept on another device.
    pub(super) fn kept(&self, device: i32) -> Result<Option<&pjrt::Buffer>, Error> {
        if self.uploaded.get().is_none() {
            let b = self.upload(device)?;
            let _ = self.uploaded.set((device, b));
        }
        Ok(self.uploaded.get().filter(|(d, _)| *d == device).map(|(_, b)| b))
    }
}

/// The next entry's id.
pub(super) fn entry_id() -> u64 {
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
pub(super) fn bound_cache(engine: &mut Engine) {
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

/// One cached program, for compile_stats' "programs".
#[derive(Clone, Debug)]
pub struct ProgramStats {
    /// The op it was compiled for ("torchtpu::fused" for a fused eager graph's program), the
    /// ops it runs (that op, or the graph's in order) and its parameters' types ("(4x4xf32, f32)").
    pub op: String,
    pub ops: Vec<String>,
    pub signature: String,
    /// Its compile's (or persistent-cache load's) seconds; None while it compiles or where it
    /// failed.
    pub compile_seconds: Option<f64>,
    /// Calls it served since it was cached, and how many op calls ago the last one was.
    pub calls: u64,
    pub calls_ago: u64,
    /// Whether it is a bucketed program serving shapes other than its own (buckets.rs).
    pub bucketed: bool,
    /// The tier of the code that runs it now: "quick" or "full" (a program that compiled at
    /// the quick tier first is "full" once its full-tier build took over).
    pub tier: &'static str,
}

/// The in-memory cache's programs, each once (an entry cached under several keys sums their
/// calls), and fused eager mode's, most recently used first.
pub fn program_stats() -> Vec<ProgramStats> {
    with_engine(|e| {
        let mut by_id: std::collections::HashMap<u64, ProgramStats> = std::collections::HashMap::new();
        for c in e.cache.values() {
            let calls_ago = e.tick - c.used;
            let row = by_id.entry(c.entry.id).or_insert_with(|| ProgramStats {
                op: c.entry.op.to_string(),
                ops: vec![c.entry.op.to_string()],
                signature: c.entry.text.as_deref().map(crate::runtime::signature).unwrap_or_default(),
                compile_seconds: c.entry.exe.compile_seconds(),
                calls: 0,
                calls_ago,
                bucketed: c.bucket.is_some() && !matches!(c.promotion, Promotion::Done),
                tier: match c.entry.exe.tiered_up() {
                    Some(up) => if up { "full" } else { "quick" },
                    None => if c.entry.quick { "quick" } else { "full" },
                },
            });
            // The call that compiled it is its first.
            row.calls += c.runs as u64 + 1;
            row.calls_ago = row.calls_ago.min(calls_ago);
        }
        let mut rows: Vec<ProgramStats> = by_id.into_values().chain(e.fused.program_stats(e.tick)).collect();
        rows.sort_by_key(|r| r.calls_ago);
        rows
    })
}

/// Starts the counts of `stats`, fused eager mode's, the compile times and the persistent
/// cache's over from zero (torch.tpu.compile_stats(reset=True)); cached programs stay.
pub fn reset_stats() {
    with_engine(|e| {
        e.stats = Stats::default();
        e.fused.stats = Default::default();
    });
    compile_pool::reset_counts();
    crate::runtime::reset_compile_times();
    crate::disk_cache::reset_counts();
}
