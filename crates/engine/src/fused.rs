//! Fused eager mode (the default; strict eager, one program run per call, with
//! `TORCHTPU_FUSED_EAGER=0` or `torch.tpu.set_fused_eager(False)`).
//! Calls are looked up (lowered, their new programs compiled) as in strict eager, so they
//! raise the same errors at the same call, but not run: they are recorded into the process's graph, and their results are
//! pending cells. The graph runs when a value is needed (a read to the host, synchronize, a
//! data-dependent size, the size limit). A graph's first runs are op by op, each op with its
//! own program, as strict eager would, the ops' new programs compiling side by side on worker
//! threads (compile_pool.rs); a graph whose structure keeps coming (a training step, a decode
//! step) is compiled once as one program (the ops' programs as functions of one module that
//! XLA inlines and fuses) on a worker thread while its next runs go op by op, and runs as that
//! from then on. With TORCHTPU_FUSE_NEW_GRAPHS=1 a new graph of programs never compiled
//! compiles as one program at its first run instead (`fuse_new_graphs`). A fused program
//! returns only the results a tensor still holds, so intermediates that PyTorch has freed are
//! never kept.
use crate::cell::{DevBuf, PendingOut};
use crate::compile_pool;
use crate::error::Error;
use crate::runtime::{first_build, runtime, FirstBuild, Tiering};
use lowerings::DType;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

/// Whether calls are recorded: UNSET until the environment is read or a call sets it.
static MODE: AtomicU8 = AtomicU8::new(UNSET);
const UNSET: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;

/// Whether calls are recorded: unless TORCHTPU_FUSED_EAGER=0, read at the first question
/// (unless `set_enabled` said first: a call before the device starts is not undone by the
/// variable). On by default: it matches strict eager on the whole test suite and is faster
/// on repeated work (README, Measured).
pub fn enabled() -> bool {
    if crate::blocking::enabled() {
        return false;
    }
    match MODE.load(Ordering::Relaxed) {
        UNSET => {
            let on = std::env::var("TORCHTPU_FUSED_EAGER").map_or(true, |v| v.trim() != "0");
            let _ = MODE.compare_exchange(UNSET, if on { ON } else { OFF }, Ordering::Relaxed, Ordering::Relaxed);
            MODE.load(Ordering::Relaxed) == ON
        }
        mode => mode == ON,
    }
}

/// Turns recording on or off; the caller runs what was recorded when turning it off.
pub fn set_enabled(on: bool) {
    MODE.store(if on { ON } else { OFF }, Ordering::Relaxed);
}

/// Ops a graph holds at most before it runs (TORCHTPU_FUSED_MAX_OPS, default 512): a longer
/// program compiles longer, and the cut must fall at the same place each time for a graph's
/// structure to repeat.
fn max_ops() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| std::env::var("TORCHTPU_FUSED_MAX_OPS").ok().and_then(|v| v.trim().parse().ok()).filter(|&n| n > 0).unwrap_or(512))
}

/// Runs of a graph structure, op by op, after which it is compiled as one program: a structure
/// seen once (a prompt's first step, a shape met once) is not worth a compile, nor one seen
/// twice while a training loop's first steps still change (AdamW's first step creates its
/// state; bucketed programs give way to exact ones after `buckets::PROMOTE_AFTER` and
/// `PROMOTE_CALLS` calls, which changes the structure once more).
const FUSE_AFTER: u32 = 3;

/// Runs of a structure, op by op, while its fused program compiles on a worker thread; the
/// next run waits for the program if it is not done yet. The switch falls on the same run
/// whatever the compile's speed: the fused program may round differently from the ops' own
/// (XLA fuses across them), and a script run twice must give the same numbers.
const COMPILE_RUNS: u32 = 4;

/// Graphs cut by the size limit since the last read that may still be fused. A loop that
/// reads nothing is cut every `max_ops` ops wherever its iterations are: the pieces drift
/// along the iteration and each would be a new program. Pieces that follow a read (a
/// step's `loss.item()`) start at the same op each time.
const FUSED_PIECES_AFTER_A_READ: u32 = 8;

/// Fused programs kept (least recently used out): each holds a compiled executable.
const MAX_PROGRAMS: usize = 64;

/// First-run programs kept for graphs that may repeat: enough for the graphs of a whole
/// `generate` call (a call's second run then runs them again, its ops' programs never
/// compiled), few enough to stay far from the process's memory-mapping limit.
const MAX_INTERIM: usize = 512;

/// An op's program input in a graph.
pub enum Input {
    /// A computed buffer (a cell's, when the op was recorded).
    Ready(Arc<DevBuf>),
    /// A buffer uploaded when the op was recorded (host tensors, random state).
    Owned(pjrt::Buffer),
    /// A float scalar's buffer, shared by the calls fed the same number (never donated). Each
    /// occurrence is a parameter of its own: a graph's structure does not depend on which of
    /// its numbers happen to be equal.
    Scalar(Arc<pjrt::Buffer>),
    /// Result `out` of the graph's op `node`.
    Out(usize, usize),
}

/// One recorded call: its program, inputs and results.
pub struct Op {
    /// The op's name, for errors and profiles.
    pub name: String,
    /// Its program: the executable, its tier, identity and module text (for fusing), and the
    /// op's qualified name (for compile_stats).
    pub(crate) entry: Arc<crate::dispatch::Entry>,
    pub inputs: Vec<Input>,
    /// Each result: its pending value, dtype and the buffer's dims.
    pub outs: Vec<(Arc<PendingOut>, DType, Vec<i64>)>,
}

pub struct Graph {
    pub generation: u64,
    pub device: i32,
    ops: Vec<Op>,
    /// The graph's check accumulator: the last result of its last op with device checks
    /// (checks.rs). The graph holds it, so it is kept and, after the run, checked at the
    /// next synchronization.
    pub acc: Option<Arc<PendingOut>>,
}

impl Graph {
    /// A pending result of the op about to be pushed.
    pub fn pending(&self, out: usize) -> Arc<PendingOut> {
        Arc::new(PendingOut { done: std::sync::OnceLock::new(), generation: self.generation, node: self.ops.len(), out })
    }

    /// Where a pending value of this graph is read from.
    pub fn input_of(&self, p: &PendingOut) -> Option<Input> {
        (p.generation == self.generation).then_some(Input::Out(p.node, p.out))
    }
}

/// A graph structure's way to run.
enum Fusing {
    /// Runs op by op so far: how many times.
    Seen(u32),
    /// Being compiled: runs op by op so far (up to `COMPILE_RUNS`).
    Compiling(FusedProgram, u32),
    /// Runs as its fused program.
    Fused(FusedProgram),
    /// Could not be composed or compiled: always op by op.
    Never,
}

/// A graph structure's fused program and its uses, for compile_stats' "programs".
struct FusedProgram {
    program: Arc<compile_pool::Program>,
    /// The ops it holds, in order, its parameters' types and whether it took the quick tier.
    ops: Vec<String>,
    signature: String,
    quick: bool,
    /// Graphs it ran; the flush count and the engine tick of its last run.
    runs: u64,
    used: u64,
    tick: u64,
}

impl FusedProgram {
    /// The graph's program compiled from `text` at `tiering`, at once (`urgency` None: the
    /// caller waits for it) or on a worker thread; where its first build is quick-then-full,
    /// its full-tier build takes over at a fixed run (compile_pool's tier-up).
    fn new(g: &Graph, text: String, tiering: Tiering, urgency: Option<compile_pool::Urgency>) -> FusedProgram {
        let (ops, signature) = (g.ops.iter().map(|op| op.entry.op.to_string()).collect(), crate::runtime::signature(&text));
        let first = first_build(&text, tiering);
        let text: Arc<str> = text.into();
        let compiler = |tier: Option<Tiering>| {
            let text = text.clone();
            move || {
                let rt = runtime().map_err(|e| e.to_string())?;
                match tier {
                    Some(tier) => rt.compile("torchtpu::fused", &text, tier),
                    None => rt.tier_up("torchtpu::fused", &text),
                }
                .map_err(|e| e.message)
            }
        };
        let compile = compiler(Some(if first == FirstBuild::Full { Tiering::Full } else { Tiering::Quick }));
        let program = match urgency {
            Some(urgency) => compile_pool::submit(urgency, compile),
            None => compile_pool::deferred(compile),
        };
        if first == FirstBuild::QuickThenFull {
            program.tier_up_to(compiler(None));
        }
        FusedProgram { program, ops, signature, quick: first != FirstBuild::Full, runs: 0, used: 0, tick: 0 }
    }

    /// Its executable for the run of flush `now` at engine tick `tick`.
    fn run(&mut self, now: u64, tick: u64) -> Arc<pjrt::LoadedExecutable> {
        (self.runs, self.used, self.tick) = (self.runs + 1, now, tick);
        self.program.for_run().expect("a fused program runs once compiled").clone()
    }

    fn stats(&self, tick: u64) -> crate::dispatch::ProgramStats {
        crate::dispatch::ProgramStats {
            op: "torchtpu::fused".to_string(),
            ops: self.ops.clone(),
            signature: self.signature.clone(),
            compile_seconds: self.program.compile_seconds(),
            calls: self.runs,
            calls_ago: tick.saturating_sub(self.tick),
            bucketed: false,
            tier: if self.quick && self.program.tiered_up() != Some(true) { "quick" } else { "full" },
        }
    }
}

#[derive(Default, Clone, Debug)]
pub struct FusedStats {
    /// Why graphs were run: "read", "synchronize", "size limit", a size program's op, ...
    pub cuts: std::collections::BTreeMap<String, u64>,
    /// Graphs run, and how many of them as one fused program.
    pub graphs: u64,
    pub fused_runs: u64,
    /// Ops recorded, and fused programs compiled (of them, at a graph's first run).
    pub ops: u64,
    pub programs: u64,
    pub fused_at_first_run: u64,
}

#[derive(Default)]
pub struct Fused {
    graph: Option<Graph>,
    generation: u64,
    /// Graphs cut by the size limit since the last other flush (a read, a synchronize, ...).
    pieces: u32,
    programs: HashMap<Vec<u64>, Fusing>,
    /// Quick-tier programs compiled at a new graph's first run (`worth_fusing_at_first_run`),
    /// which run it until its own fused program takes over.
    interim: HashMap<Vec<u64>, FusedProgram>,
    /// The engine tick of the last call recorded (a fused program's last use, in op calls).
    tick: u64,
    pub stats: FusedStats,
}

impl Fused {
    /// Whether the recorded graph holds ops with device checks.
    pub fn has_checks(&self) -> bool {
        self.graph.as_ref().is_some_and(|g| g.acc.is_some())
    }

    /// The generation of the graph the next call is recorded into (unless it is cut first).
    pub fn next_generation(&self) -> u64 {
        self.graph.as_ref().map_or(self.generation + 1, |g| g.generation)
    }

    /// The graph to record a call on `device` into: a graph of another device, or a full
    /// one, runs first.
    pub fn graph(&mut self, device: i32) -> Result<&mut Graph, Error> {
        if self.graph.as_ref().is_some_and(|g| g.device != device || g.ops.len() >= max_ops()) {
            let by_size = self.graph.as_ref().is_some_and(|g| g.device == device);
            *self.stats.cuts.entry((if by_size { "size limit" } else { "another device" }).to_string()).or_insert(0) += 1;
            self.run(by_size)?;
        }
        if self.graph.is_none() {
            self.generation += 1;
            self.graph = Some(Graph { generation: self.generation, device, ops: Vec::new(), acc: None });
        }
        Ok(self.graph.as_mut().unwrap())
    }

    /// Records a call, the engine's `tick`-th.
    pub fn push(&mut self, op: Op, tick: u64) {
        self.stats.ops += 1;
        self.tick = tick;
        self.graph.as_mut().expect("a graph is open").ops.push(op);
    }

    /// The fused programs compiled or compiling, for compile_stats' "programs" (`tick`: the
    /// engine's now).
    pub fn program_stats(&self, tick: u64) -> Vec<crate::dispatch::ProgramStats> {
        let compiled = self.programs.values().filter_map(|f| match f {
            Fusing::Compiling(p, _) | Fusing::Fused(p) => Some(p),
            _ => None,
        });
        compiled.chain(self.interim.values()).map(|p| p.stats(tick)).collect()
    }

    /// Runs the recorded graph, if any, as its fused program where its structure has one;
    /// `why` is counted in the statistics.
    pub fn flush(&mut self, why: &str) -> Result<(), Error> {
        if self.graph.is_some() {
            *self.stats.cuts.entry(why.to_string()).or_insert(0) += 1;
        }
        self.run(false)
    }

    /// Runs the recorded graph; `by_size`: it was cut by the size limit.
    fn run(&mut self, by_size: bool) -> Result<(), Error> {
        let Some(mut g) = self.graph.take() else { return Ok(()) };
        self.stats.graphs += 1;
        let piece = self.pieces;
        self.pieces = if by_size { piece + 1 } else { 0 };
        // A result is kept where a cell still holds it (the graph holds one reference).
        let live: Vec<Vec<bool>> = g.ops.iter().map(|op| op.outs.iter().map(|(p, ..)| Arc::strong_count(p) > 1).collect()).collect();
        let done = self.run_graph(&mut g, &live, piece);
        if let Some(acc) = g.acc.as_ref().and_then(|a| a.done.get()) {
            crate::checks::keep_graph_acc(acc.clone());
        }
        done
    }

    /// Runs a graph, the `piece`-th cut by the size limit since a read.
    fn run_graph(&mut self, g: &mut Graph, live: &[Vec<bool>], piece: u32) -> Result<(), Error> {
        // A graph of one op is that op's program already: fusing it would compile the same
        // code again (seconds for an iterative one like linalg_eig) to save nothing.
        if piece >= FUSED_PIECES_AFTER_A_READ || g.ops.len() < 2 {
            return run_op_by_op(g, live);
        }
        let mut plan = Plan::new(g, live);
        plan.key.push(piece as u64);
        if self.programs.len() > 16 * MAX_PROGRAMS {
            // Structures seen once and never again: forget them.
            self.programs.retain(|_, p| !matches!(p, Fusing::Seen(_)));
        }
        let now = self.stats.graphs;
        let state = self.programs.entry(plan.key.clone()).or_insert(Fusing::Seen(0));
        if matches!(state, Fusing::Seen(0)) && worth_fusing_at_first_run(g) {
            // Compiled here and now at the quick tier: whether a graph runs fused must not
            // depend on how fast a compile is (a script run twice gives the same numbers).
            let program = compose(g, live, &plan).map(|text| FusedProgram::new(g, text, Tiering::Quick, None));
            if let Some(mut program) = program.filter(|p| p.program.get().is_ok()) {
                self.stats.programs += 1;
                self.stats.fused_at_first_run += 1;
                // It runs the graph until the graph's own fused program (of its ops' tier)
                // takes over, at the same run as after runs op by op; where that tier is the
                // quick one, the two are one program (the second loaded from the cache).
                program.used = now;
                self.interim.insert(plan.key.clone(), program);
            }
        }
        let mut ahead = false;
        if let Fusing::Seen(n) = state {
            *n += 1;
            if *n >= FUSE_AFTER {
                let tiering = fused_tiering(g);
                *state = match compose(g, live, &plan) {
                    Some(text) => Fusing::Compiling(FusedProgram::new(g, text, tiering, Some(compile_pool::Urgency::Ahead)), 0),
                    None => Fusing::Never,
                };
            }
            ahead = !matches!(state, Fusing::Never);
        } else if let Fusing::Compiling(_, runs) = state {
            *runs += 1;
            if *runs <= COMPILE_RUNS {
                ahead = true;
            } else {
                *state = match std::mem::replace(state, Fusing::Never) {
                    Fusing::Compiling(program, _) if program.program.get().is_ok() => {
                        self.stats.programs += 1;
                        Fusing::Fused(program)
                    }
                    _ => Fusing::Never,
                };
                // Its own program takes over (or none will): the first run's is done with.
                self.interim.remove(&plan.key);
            }
        }
        if ahead {
            // Before its own fused program: op by op, or the program of its first run.
            if let Some(program) = self.interim.get_mut(&plan.key) {
                let exe = program.run(now, self.tick);
                self.stats.fused_runs += 1;
                self.bound_interim();
                return run_fused(g, live, &plan, &exe);
            }
            return run_op_by_op(g, live);
        }
        let exe = match state {
            Fusing::Fused(program) => program.run(now, self.tick),
            _ => return run_op_by_op(g, live),
        };
        self.stats.fused_runs += 1;
        self.bound_programs();
        run_fused(g, live, &plan, &exe)
    }

    /// Drops the least recently used first-run program past `MAX_INTERIM` (each holds an
    /// executable, and most graphs are never met again).
    fn bound_interim(&mut self) {
        if self.interim.len() > MAX_INTERIM {
            let oldest = self.interim.iter().min_by_key(|(_, p)| p.used).map(|(k, _)| k.clone()).unwrap();
            self.interim.remove(&oldest);
        }
    }

    /// Drops the least recently used fused program past `MAX_PROGRAMS` (back to op by op
    /// until it is compiled again).
    fn bound_programs(&mut self) {
        let fused: Vec<(&Vec<u64>, u64)> = self.programs.iter().filter_map(|(k, p)| if let Fusing::Fused(p) = p { Some((k, p.used)) } else { None }).collect();
        if fused.len() > MAX_PROGRAMS {
            let oldest = fused.iter().min_by_key(|f| f.1).map(|f| f.0.clone()).unwrap();
            self.programs.remove(&oldest);
        }
    }
}

/// The tier of a graph's fused program: the quick tier for good where all its ops' programs
/// took it, so that it rounds as they do; else a graph's (quick first and tiering up where its
/// tensors are small enough, runtime::first_build): a small model's whole training step
/// compiled at the full tier took 4-9 s on the 2-core machine, far more than its runs before
/// the tier-up lose.
fn fused_tiering(g: &Graph) -> Tiering {
    if g.ops.iter().all(|op| op.entry.quick) {
        Tiering::Quick
    } else {
        Tiering::Graph
    }
}

/// Whether new graphs may compile as one program at their first run
/// (TORCHTPU_FUSE_NEW_GRAPHS=1; off by default). Where it is on, a new op's program compiles
/// only when its graph runs op by op (dispatch/build.rs defers it).
///
/// Measured on the CPU plugin against the default with tier-ups (benches/eager_compile.py): a
/// tiny Llama's first training step takes 2.3 s instead of 2.1 s (one program of 2.1 s instead
/// of 109), and a first `generate` 6.4 s instead of 4.1 s, its second call 0.71 s instead of
/// 0.19 s: its decoding steps' ops reuse bucketed programs across steps, while each step's
/// structure is new, and quick-tier code runs its larger ops slower. Until the choice weighs
/// that per graph, it is off by default.
pub fn fuse_new_graphs() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TORCHTPU_FUSE_NEW_GRAPHS").is_ok_and(|v| v.trim() == "1"))
}

/// Whether a graph met for the first time compiles as one program at once, at the quick tier
/// (where `fuse_new_graphs`): when enough of its ops' programs were never compiled. There a
/// fused program costs about one op's compile (20-30 ms) plus 2-3 ms per op (13 ops: 37-40 ms,
/// their programs 210-360 ms; a 300-op decoding step about 600 ms), so it pays where one op in
/// eight is new. Graphs with loops do not (their programs take no quick tier for good,
/// `runtime::first_build`); they, and graphs of programs compiled before, run op by op until their
/// structure repeats (`FUSE_AFTER`).
fn worth_fusing_at_first_run(g: &Graph) -> bool {
    if !fuse_new_graphs() {
        return false;
    }
    let new: HashSet<u64> = g.ops.iter().filter(|op| op.entry.exe.deferred()).map(|op| op.entry.id).collect();
    new.len() >= 2 && new.len() * 8 >= g.ops.len() + 12 && !g.ops.iter().any(|op| op.entry.text.as_deref().is_some_and(|t| t.contains("stablehlo.while")))
}

/// A graph's structure (its key) and its program inputs: each distinct ready buffer once, in
/// order of first use, then where each op's results are needed.
struct Plan {
    key: Vec<u64>,
    /// Per op, per input: the fused program's parameter it reads (None: another op's result).
    params: Vec<Vec<Option<usize>>>,
    /// The fused program's parameters: (op, input) of first use.
    externals: Vec<(usize, usize)>,
    /// Per op and result: the last op that reads it (None: no op does).
    last_use: Vec<Vec<Option<usize>>>,
}

impl Plan {
    fn new(g: &Graph, live: &[Vec<bool>]) -> Plan {
        let mut key = vec![g.device as u64, g.ops.len() as u64];
        let mut seen: HashMap<*const DevBuf, usize> = HashMap::new();
        let mut externals = Vec::new();
        let mut params = Vec::with_capacity(g.ops.len());
        let mut last_use: Vec<Vec<Option<usize>>> = g.ops.iter().map(|op| vec![None; op.outs.len()]).collect();
        for (i, op) in g.ops.iter().enumerate() {
            key.push(if op.entry.text.is_some() { op.entry.id } else { u64::MAX });
            key.push(op.inputs.len() as u64);
            let mut row = Vec::with_capacity(op.inputs.len());
            for (j, input) in op.inputs.iter().enumerate() {
                let p = match input {
                    Input::Ready(b) => Some(*seen.entry(Arc::as_ptr(b)).or_insert_with(|| {
                        externals.push((i, j));
                        externals.len() - 1
                    })),
                    Input::Owned(_) | Input::Scalar(_) => {
                        externals.push((i, j));
                        Some(externals.len() - 1)
                    }
                    Input::Out(n, o) => {
                        last_use[*n][*o] = Some(i);
                        key.push(1 << 63 | (*n as u64) << 16 | *o as u64);
                        None
                    }
                };
                if let Some(p) = p {
                    key.push(p as u64);
                }
                row.push(p);
            }
            params.push(row);
            key.push(live[i].iter().enumerate().fold(0u64, |m, (k, &l)| m | (l as u64) << (k % 64)));
        }
        Plan { key, params, externals, last_use }
    }
}

fn deferred_error(op: &Op, e: pjrt::Error) -> Error {
    Error::runtime(format!("torchtpu: {} (recorded in fused eager mode) failed: {}", op.name, e.message))
}

fn new_buf(buf: pjrt::Buffer, dtype: DType, dims: &[i64], device: i32) -> Arc<DevBuf> {
    DevBuf::new(buf, dims.iter().product::<i64>() * dtype.size() as i64, device)
}

/// Runs each op with its own program, in order; a result no later op reads and no cell holds
/// is dropped at once, one that only later ops read after its last reader. An op's inputs are
/// released before its results are counted, as strict eager does (a buffer the op donated
/// into its result is gone).
fn run_op_by_op(g: &mut Graph, live: &[Vec<bool>]) -> Result<(), Error> {
    // Programs never compiled compile on worker threads, side by side, while the ops before
    // them run.
    for op in &g.ops {
        op.entry.exe.request();
    }
    let rt = runtime()?;
    let device = rt.device(g.device)?;
    let plan_uses = Plan::new(g, live).last_use;
    let mut results: Vec<Vec<Option<Arc<DevBuf>>>> = Vec::with_capacity(g.ops.len());
    for i in 0..g.ops.len() {
        let op = &g.ops[i];
        let inputs: Vec<&pjrt::Buffer> = op
            .inputs
            .iter()
            .map(|input| match input {
                Input::Ready(b) => &b.buf,
                Input::Owned(b) => b,
                Input::Scalar(b) => b,
                Input::Out(n, o) => &results[*n][*o].as_ref().expect("a result is kept until its last reader").buf,
            })
            .collect();
        let exe = op.entry.exe.for_run().map_err(|e| Error::runtime(format!("torchtpu: {} (recorded in fused eager mode): {e}", op.name)))?;
        let launched_ns = crate::trace::launch_clock();
        let outs = exe.execute(&inputs, device).map_err(|e| deferred_error(op, e))?;
        drop(inputs);
        crate::trace::launched(|| op.name.clone(), g.device, launched_ns, &outs);
        for input in std::mem::take(&mut g.ops[i].inputs) {
            if let Input::Out(n, o) = input {
                if plan_uses[n][o] == Some(i) {
                    results[n][o] = None;
                }
            }
        }
        let op = &g.ops[i];
        let mut row = Vec::with_capacity(outs.len());
        for (k, (buf, (p, dtype, dims))) in outs.into_iter().zip(&op.outs).enumerate() {
            let b = new_buf(buf, *dtype, dims, g.device);
            if live[i][k] {
                let _ = p.done.set(b.clone());
            }
            row.push(plan_uses[i][k].is_some().then_some(b));
        }
        results.push(row);
    }
    Ok(())
}

/// A fused program's name in profiles: the ops it holds, in order.
fn fused_name(g: &Graph) -> String {
    let ops: Vec<&str> = g.ops.iter().map(|op| op.name.as_str()).collect();
    format!("torchtpu fused graph ({} ops): {}", ops.len(), ops.join(", "))
}

/// Runs the graph's fused program: its parameters are the plan's external inputs, its results
/// the live results in op order. The inputs are released before the results are counted.
fn run_fused(g: &mut Graph, live: &[Vec<bool>], plan: &Plan, exe: &pjrt::LoadedExecutable) -> Result<(), Error> {
    let rt = runtime()?;
    let inputs: Vec<&pjrt::Buffer> = plan
        .externals
        .iter()
        .map(|&(i, j)| match &g.ops[i].inputs[j] {
            Input::Ready(b) => &b.buf,
            Input::Owned(b) => b,
            Input::Scalar(b) => b,
            Input::Out(..) => unreachable!("an external input is a buffer"),
        })
        .collect();
    let launched_ns = crate::trace::launch_clock();
    let outs = exe.execute(&inputs, rt.device(g.device)?).map_err(|e| Error::runtime(format!("torchtpu: a fused eager graph failed: {}", e.message)))?;
    drop(inputs);
    crate::trace::launched(|| fused_name(g), g.device, launched_ns, &outs);
    for op in &mut g.ops {
        op.inputs.clear();
    }
    let mut outs = outs.into_iter();
    for (i, op) in g.ops.iter().enumerate() {
        for (k, (p, dtype, dims)) in op.outs.iter().enumerate() {
            if live[i][k] {
                let buf = outs.next().expect("a fused program returns every live result");
                let _ = p.done.set(new_buf(buf, *dtype, dims, g.device));
            }
        }
    }
    Ok(())
}

// ---- one module from the ops' modules ---------------------------------------------------------

/// An op's module, parsed: its main function's parameter and result types, the donations
/// its parameters declare, and its functions renamed under `prefix`.
struct Parsed {
    params: Vec<String>,
    results: Vec<String>,
    /// (parameter, result) pairs of `tf.aliasing_output`.
    aliases: Vec<(usize, usize)>,
    functions: String,
}

/// Splits `s` at the commas outside brackets.
fn split_top(s: &str) -> Vec<&str> {
    let (mut depth, mut start, mut parts) = (0i32, 0, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '<' | '(' | '{' | '[' => depth += 1,
            '>' | ')' | '}' | ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if !s[start..].trim().is_empty() {
        parts.push(s[start..].trim());
    }
    parts
}

/// Every `@symbol` in `text` as `@<prefix>symbol`.
fn rename_symbols(text: &str, prefix: &str) -> String {
    let mut out = String::with_capacity(text.len() + 64);
    let mut rest = text;
    while let Some(at) = rest.find('@') {
        out.push_str(&rest[..=at]);
        out.push_str(prefix);
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
    out
}

fn parse(text: &str, prefix: &str) -> Option<Parsed> {
    let lines: Vec<&str> = text.lines().collect();
    let main_at = lines.iter().position(|l| l.trim_start().starts_with("func.func public @main("))?;
    let header = lines[main_at];
    let open = header.find("@main(")? + "@main(".len();
    let arrow = header.rfind(") -> (")?;
    let close = header.rfind(") {")?;
    let mut params = Vec::new();
    let mut aliases = Vec::new();
    for (i, arg) in split_top(&header[open..arrow]).into_iter().enumerate() {
        let ty = arg.split_once(": ")?.1;
        let (ty, attrs) = match ty.find(" {") {
            Some(b) => (&ty[..b], &ty[b..]),
            None => (ty, ""),
        };
        if let Some(r) = attrs.split("tf.aliasing_output = ").nth(1) {
            aliases.push((i, r.split(' ').next()?.parse().ok()?));
        }
        params.push(ty.to_string());
    }
    let results: Vec<String> = split_top(&header[arrow + ") -> (".len()..close]).into_iter().map(str::to_string).collect();
    // The main function as a private one without donations, then the module's other functions.
    let args: Vec<String> = params.iter().enumerate().map(|(i, t)| format!("%arg{i}: {t}")).collect();
    let mut functions = format!("  func.func private @{prefix}main({}) -> ({}) {{\n", args.join(", "), results.join(", "));
    let end = lines.len().checked_sub(1)?; // the module's closing brace
    for line in &lines[main_at + 1..end] {
        functions.push_str(&rename_symbols(line, prefix));
        functions.push('\n');
    }
    Some(Parsed { params, results, aliases, functions })
}

/// The graph as one module: a main function calling each op's main in order, returning the
/// live results, and donating an input where its op donated it into a returned result.
fn compose(g: &Graph, live: &[Vec<bool>], plan: &Plan) -> Option<String> {
    let parsed: Vec<Parsed> = g.ops.iter().enumerate().map(|(i, op)| parse(op.entry.text.as_deref()?, &format!("n{i}_"))).collect::<Option<_>>()?;
    let mut body = String::new();
    let mut returned: Vec<(String, String)> = Vec::new(); // (value, type)
    let mut result_of: HashMap<(usize, usize), usize> = HashMap::new();
    for (i, p) in parsed.iter().enumerate() {
        if p.params.len() != g.ops[i].inputs.len() || p.results.len() != g.ops[i].outs.len() {
            return None;
        }
        let operands: Vec<String> = g.ops[i]
            .inputs
            .iter()
            .enumerate()
            .map(|(j, input)| match input {
                Input::Out(n, o) => format!("%c{n}#{o}"),
                _ => format!("%arg{}", plan.params[i][j].unwrap()),
            })
            .collect();
        let results = if p.results.is_empty() { String::new() } else { format!("%c{i}:{} = ", p.results.len()) };
        body.push_str(&format!(
            "    {results}\"func.call\"({}) {{callee = @n{i}_main}} : ({}) -> ({})\n",
            operands.join(", "),
            p.params.join(", "),
            p.results.join(", ")
        ));
        for (k, ty) in p.results.iter().enumerate() {
            if live[i][k] {
                result_of.insert((i, k), returned.len());
                returned.push((format!("%c{i}#{k}"), ty.clone()));
            }
        }
    }
    // Donations: an external buffer an op donated, read by no later op, into the result the
    // program returns for it: that op's result, or where a later op updated that result in
    // place in turn, the last of that chain's results (a KV cache written by every layer of a
    // step: without it the program copied the whole cache each run).
    let mut last_reader = vec![0usize; plan.externals.len()];
    for (i, row) in plan.params.iter().enumerate() {
        for &e in row.iter().flatten() {
            last_reader[e] = i;
        }
    }
    let mut updated_by: HashMap<(usize, usize), (usize, usize)> = HashMap::new();
    for (j, p) in parsed.iter().enumerate() {
        for &(param, r) in &p.aliases {
            if let Input::Out(n, o) = g.ops[j].inputs[param] {
                updated_by.entry((n, o)).or_insert((j, r));
            }
        }
    }
    let mut donated: HashMap<usize, usize> = HashMap::new();
    let mut taken: HashSet<usize> = HashSet::new();
    for (i, p) in parsed.iter().enumerate() {
        for &(param, r) in &p.aliases {
            let Some(e) = plan.params[i][param] else { continue };
            if last_reader[e] != i || !matches!(g.ops[i].inputs[param], Input::Ready(_)) || donated.contains_key(&e) {
                continue;
            }
            let mut value = (i, r);
            while !result_of.contains_key(&value) {
                match updated_by.get(&value) {
                    Some(&next) => value = next,
                    None => break,
                }
            }
            if let Some(&res) = result_of.get(&value) {
                if returned[res].1 == p.params[param] && taken.insert(res) {
                    donated.insert(e, res);
                }
            }
        }
    }
    let args: Vec<String> = plan
        .externals
        .iter()
        .enumerate()
        .map(|(e, &(i, j))| {
            let ty = &parsed[i].params[j];
            match donated.get(&e) {
                Some(r) => format!("%arg{e}: {ty} {{tf.aliasing_output = {r} : i32}}"),
                None => format!("%arg{e}: {ty}"),
            }
        })
        .collect();
    let types: Vec<&str> = returned.iter().map(|r| r.1.as_str()).collect();
    let values: Vec<&str> = returned.iter().map(|r| r.0.as_str()).collect();
    let mut text = format!("module @fused {{\n  func.func public @main({}) -> ({}) {{\n", args.join(", "), types.join(", "));
    text.push_str(&body);
    text.push_str(&format!("    \"func.return\"({}) : ({}) -> ()\n  }}\n", values.join(", "), types.join(", ")));
    for p in &parsed {
        text.push_str(&p.functions);
    }
    text.push_str("}\n");
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_renames_a_module() {
        let text = "module @m {\n  func.func public @main(%arg0: tensor<4x4xf32> {tf.aliasing_output = 0 : i32}, %arg1: tensor<i64>) -> (tensor<4x4xf32>, tensor<2xcomplex<f32>>) {\n    %0 = \"func.call\"(%arg0) {callee = @helper} : (tensor<4x4xf32>) -> tensor<4x4xf32>\n    \"func.return\"(%0, %x) : (tensor<4x4xf32>, tensor<2xcomplex<f32>>) -> ()\n  }\n  func.func private @helper(%arg0: tensor<4x4xf32>) -> (tensor<4x4xf32>) {\n  }\n}\n";
        let p = parse(text, "n3_").unwrap();
        assert_eq!(p.params, ["tensor<4x4xf32>", "tensor<i64>"]);
        assert_eq!(p.results, ["tensor<4x4xf32>", "tensor<2xcomplex<f32>>"]);
        assert_eq!(p.aliases, [(0, 0)]);
        assert!(p.functions.starts_with("  func.func private @n3_main(%arg0: tensor<4x4xf32>, %arg1: tensor<i64>) -> (tensor<4x4xf32>, tensor<2xcomplex<f32>>) {\n"));
        assert!(p.functions.contains("callee = @n3_helper"));
        assert!(p.functions.contains("func.func private @n3_helper("));
        assert!(!p.functions.contains("aliasing"));
    }
}
