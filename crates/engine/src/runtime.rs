//! The process-wide PJRT client, created on first use from the plugin the Python package chose.
use crate::disk_cache;
use crate::error::Error;
use std::sync::{mpsc, Arc, Condvar, Mutex, OnceLock};

pub struct Runtime {
    pub client: pjrt::Client,
    pub devices: Vec<pjrt::Device>,
    pub compile_options: Vec<u8>,
    /// The quick tier of small eager programs, where the plugin has one.
    quick: Mutex<QuickTier>,
    /// Identifies the plugin for caches: its content hash, API version, platform and version.
    pub identity: String,
    /// The persistent executable cache's directory, if enabled.
    pub cache_dir: Option<std::path::PathBuf>,
}

#[derive(Clone, Debug, Default)]
pub struct Config {
    pub plugin_path: String,
    pub options: Vec<(String, pjrt::NamedValue)>,
    /// The handler of `torchtpu.host_matmul` custom calls (PyTorch's CPU matmul), registered
    /// with the CPU plugin: its programs then take their float32 products from it.
    pub host_matmul: Option<pjrt::xla_ffi::Handler>,
}

/// Where compile time went (torch.tpu.compile_stats()): XLA's compiles, the persistent cache's
/// loads and stores, and per op (the name a program was compiled for) programs and seconds.
#[derive(Clone, Debug, Default)]
pub struct CompileTimes {
    pub xla_compile: f64,
    pub cache_load: f64,
    pub cache_store: f64,
    pub per_op: std::collections::HashMap<String, (u64, f64)>,
}

static TIMES: Mutex<Option<CompileTimes>> = Mutex::new(None);

pub fn compile_times() -> CompileTimes {
    TIMES.lock().unwrap().clone().unwrap_or_default()
}

pub fn reset_compile_times() {
    *TIMES.lock().unwrap() = None;
}

/// Adds to the compile times (a leaf lock: nothing is called while it is held).
fn record(f: impl FnOnce(&mut CompileTimes)) {
    f(TIMES.lock().unwrap().get_or_insert_with(CompileTimes::default))
}

fn timed<T>(phase: fn(&mut CompileTimes) -> &mut f64, f: impl FnOnce() -> T) -> T {
    let t0 = std::time::Instant::now();
    let r = f();
    record(|t| *phase(t) += t0.elapsed().as_secs_f64());
    r
}

static CONFIG: Mutex<Option<Config>> = Mutex::new(None);
static RUNTIME: OnceLock<std::result::Result<Runtime, String>> = OnceLock::new();

/// Sets the plugin to load; takes effect at first use (later calls are ignored then).
pub fn configure(cfg: Config) {
    *CONFIG.lock().unwrap() = Some(cfg);
}

pub fn is_initialized() -> bool {
    RUNTIME.get().is_some()
}

/// The devices of the started client, also in a forked child (which cannot use them).
pub fn started_device_count() -> Option<usize> {
    RUNTIME.get()?.as_ref().ok().map(|r| r.devices.len())
}

/// What a child forked after the device started gets for any device work (as CUDA says it).
const FORKED: &str = "Cannot re-initialize tpu in forked subprocess. To use tpu with multiprocessing, you must use the 'spawn' start method";

pub fn runtime() -> Result<&'static Runtime, Error> {
    if pjrt::forked() {
        return Err(Error::runtime(FORKED));
    }
    let r = RUNTIME.get_or_init(|| {
        let cfg = CONFIG.lock().unwrap().clone().ok_or_else(|| {
            "torchtpu: no PJRT plugin configured (import torchtpu first)".to_string()
        })?;
        init(&cfg).map_err(|e| format!("torchtpu: could not start the PJRT plugin {}: {}", cfg.plugin_path, e))
    });
    r.as_ref().map_err(|m| Error::runtime(m.clone()))
}

fn init(cfg: &Config) -> Result<Runtime, pjrt::Error> {
    let plugin = pjrt::Plugin::load(&cfg.plugin_path)?;
    let opts: Vec<(&str, pjrt::NamedValue)> = cfg.options.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let client = pjrt::Client::new(&plugin, &opts)?;
    // A child forked from now on has the client's memory but not its threads.
    extern "C" fn in_forked_child() {
        pjrt::mark_forked();
    }
    // SAFETY: registers a handler that only stores to an atomic.
    unsafe { libc::pthread_atfork(None, None, Some(in_forked_child)) };
    let devices = client.addressable_devices();
    let (maj, min) = plugin.api_version();
    let cache_dir = disk_cache::directory();
    let fingerprint = disk_cache::plugin_fingerprint(cache_dir.as_deref(), std::path::Path::new(&cfg.plugin_path))
        .map_err(|e| pjrt::Error::new(2, format!("reading the plugin file: {e}")))?;
    // The plugins read their compiler flags from these variables: executables compiled under
    // other flags are other programs.
    let flags: Vec<String> = ["XLA_FLAGS", "LIBTPU_INIT_ARGS"].iter().map(|v| std::env::var(v).unwrap_or_default()).collect();
    let identity = format!("{}|{}.{}|{}|{}|{}", fingerprint, maj, min, client.platform_name(), client.platform_version(), flags.join("|"));
    // XLA:CPU cannot compile chlo.ragged_dot (grouped matmuls); the GPU and TPU compilers can.
    lowerings::set_ragged_dot(client.platform_name() != "cpu");
    lowerings::set_sums_as_dots(client.platform_name() == "cpu");
    // XLA:CPU's own products (Eigen's and XNNPACK's) trailed PyTorch's MKL kernel by up to 1.9x
    // on transposed operands. A plugin without the FFI extension, and TORCHTPU_HOST_MATMUL=0
    // (to compare), keep them.
    let wanted = std::env::var("TORCHTPU_HOST_MATMUL").map_or(true, |v| v != "0");
    let host_matmul = match cfg.host_matmul {
        Some(handler) if wanted && client.platform_name() == "cpu" => {
            plugin.register_ffi_handler(lowerings::HOST_MATMUL_TARGET, "cpu", handler).is_ok()
        }
        _ => false,
    };
    lowerings::set_host_matmul(host_matmul);
    // With several devices, portable executables let one compiled op serve all of them; with
    // one, executables compiled for it take the plugin's usual (non-portable) execute path.
    let compile_options = if devices.len() == 1 {
        pjrt::compile_options_proto(1, 1)
    } else {
        pjrt::portable_compile_options_proto()
    };
    let quick = Mutex::new(QuickTier::new(client.platform_name() == "cpu", &compile_options));
    Ok(Runtime { client, devices, compile_options, quick, identity, cache_dir })
}

impl Runtime {
    pub fn device(&self, index: i32) -> Result<&pjrt::Device, Error> {
        self.devices
            .get(index.max(0) as usize)
            .ok_or_else(|| Error::runtime(format!("torchtpu: invalid device index {index}")))
    }
}

/// What decides whether a program may compile at the quick tier.
#[derive(Copy, Clone, Debug)]
pub enum Tiering {
    /// Never (tier-ups' own builds, fused graphs of full-tier programs).
    Full,
    /// A compiled graph's program: never for good, but first where it is small enough to tier
    /// up (its largest tensor).
    Graph,
    /// An eager op's program: when its largest tensor is small.
    Largest,
    /// A bucketable op's program: when its size class is small (buckets::size_class).
    Class(i64),
    /// Always (where the plugin has the tier): a fused eager graph of quick-tier programs,
    /// which must round as they do.
    Quick,
}

/// How a program's first build compiles.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum FirstBuild {
    /// At the quick tier for good (where the plugin has one).
    Quick,
    /// At the quick tier, then tiering up (compile_pool's `TierUp`).
    QuickThenFull,
    Full,
}

/// Decides a program's first build, reading its text once. Small loop-free eager programs take
/// the quick tier for good. Programs with at most `TORCHTPU_TIER_UP_ELEMENTS` elements that do
/// not (too large for it, with loops, or a compiled graph) compile there first where the plugin
/// has the quick tier: their first calls wait for a compile 2-5x shorter, and run slower by what
/// unoptimized code costs (measured on the CPU plugin: a 256x256 silu 0.6 ms instead of 0.1, an
/// add of 1M elements 2.3 ms instead of 0.3, svd of 32x32 6.6 ms instead of 1.8). Loops and
/// graphs keep no quick program for good: their bodies run many times, graphs hold a model's
/// whole step.
pub fn first_build(text: &str, tiering: Tiering) -> FirstBuild {
    let n = match tiering {
        Tiering::Full => return FirstBuild::Full,
        Tiering::Quick => return FirstBuild::Quick,
        Tiering::Largest | Tiering::Graph => largest_tensor(text),
        Tiering::Class(n) => n.max(largest_float_bucketed(text)),
    };
    let graph = matches!(tiering, Tiering::Graph);
    if !graph && n <= quick_tier_limit() && !text.contains("stablehlo.while") {
        FirstBuild::Quick
    } else if quick_tier_limit() > 0 && n <= tier_up_limit() && runtime().is_ok_and(|rt| rt.quick.lock().unwrap().options.is_some()) {
        FirstBuild::QuickThenFull
    } else {
        FirstBuild::Full
    }
}

/// XLA:CPU spends most of a small program's compile time in LLVM's optimizations and in
/// setting up its MLIR fusion emitters (without them a one-op program compiles 3-6x faster);
/// for small tensors the unoptimized code runs about as fast, so small eager programs skip both.
const QUICK_TIER: &[(&str, pjrt::OptionOverride)] = &[
    ("xla_backend_optimization_level", pjrt::OptionOverride::Int(0)),
    ("xla_cpu_use_fusion_emitters", pjrt::OptionOverride::Bool(false)),
];

/// Loop-free programs whose tensors all have at most this many elements compile at the quick
/// tier (`TORCHTPU_QUICK_COMPILE_ELEMENTS`, 0 for never). Above it, unoptimized loops cost more
/// than the compile saves (softmax over 16k elements runs 3-4x slower).
fn quick_tier_limit() -> i64 {
    static LIMIT: OnceLock<i64> = OnceLock::new();
    *LIMIT.get_or_init(|| std::env::var("TORCHTPU_QUICK_COMPILE_ELEMENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(4096))
}

/// Eager programs above the quick tier's limit, up to this many elements, compile at the quick
/// tier first and tier up (`TORCHTPU_TIER_UP_ELEMENTS`, 0 for never): below it the slower runs
/// before the full tier takes over cost less than the compile time saved.
fn tier_up_limit() -> i64 {
    static LIMIT: OnceLock<i64> = OnceLock::new();
    *LIMIT.get_or_init(|| std::env::var("TORCHTPU_TIER_UP_ELEMENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(1 << 18))
}

/// The quick tier's options: QUICK_TIER less the options this plugin's XLA does not know
/// (plugins of other XLA versions reject unknown names; each is dropped at its first refusal).
struct QuickTier {
    overrides: Vec<(&'static str, pjrt::OptionOverride)>,
    options: Option<Vec<u8>>,
}

impl QuickTier {
    fn new(enabled: bool, base: &[u8]) -> Self {
        let overrides = if enabled { QUICK_TIER.to_vec() } else { Vec::new() };
        let options = (!overrides.is_empty()).then(|| pjrt::with_option_overrides(base, &overrides));
        QuickTier { overrides, options }
    }

    /// Drops the option an error names as unknown; false when the error is about something
    /// else. (Another thread's compile may have dropped it already: then the current options
    /// are to be retried.)
    fn drop_unknown(&mut self, error: &pjrt::Error, base: &[u8]) -> bool {
        let unknown = |name: &str| error.message.contains(&format!("No such compile option: '{name}'"));
        if !QUICK_TIER.iter().any(|(name, _)| unknown(name)) {
            return false;
        }
        self.overrides.retain(|(name, _)| !unknown(name));
        self.options = (!self.overrides.is_empty()).then(|| pjrt::with_option_overrides(base, &self.overrides));
        true
    }
}

impl Runtime {
    /// Compiles a program, or loads it from the persistent cache when an entry for exactly
    /// this program, plugin and options exists. `what` names it in the compile log; `tiering`
    /// says whether it may take the quick tier.
    pub fn compile(&self, what: &str, text: &str, tiering: Tiering) -> Result<Arc<pjrt::LoadedExecutable>, pjrt::Error> {
        self.compile_logged("compile", what, text, tiering)
    }

    /// The full-tier build of a program that compiled at the quick tier first (compile_pool's
    /// tier-up): logged as `torchtpu: tier-up ...`, being no new program.
    pub fn tier_up(&self, what: &str, text: &str) -> Result<Arc<pjrt::LoadedExecutable>, pjrt::Error> {
        self.compile_logged("tier-up", what, text, Tiering::Full)
    }

    fn compile_logged(&self, verb: &str, what: &str, text: &str, tiering: Tiering) -> Result<Arc<pjrt::LoadedExecutable>, pjrt::Error> {
        let t0 = std::time::Instant::now();
        let traced_from = crate::trace::launch_clock();
        let small = first_build(text, tiering) == FirstBuild::Quick;
        let (exe, from, quick) = loop {
            let quick = if small { self.quick.lock().unwrap().options.clone() } else { None };
            match self.compile_or_load(text, quick.as_deref().unwrap_or(&self.compile_options)) {
                Err(e) if quick.is_some() && self.quick.lock().unwrap().drop_unknown(&e, &self.compile_options) => continue,
                r => {
                    let (exe, from) = r?;
                    break (exe, from, quick.is_some());
                }
            }
        };
        if let Some(dir) = dump_dir() {
            dump_program(dir, what, text);
        }
        let seconds = t0.elapsed().as_secs_f64();
        record_program(what, seconds);
        crate::trace::compiled(what, from, traced_from);
        if log_compiles() {
            let tier = if quick { ", quick tier" } else { "" };
            eprintln!("torchtpu: {verb} {what}{} {:.1} ms ({from}{tier})", signature(text), seconds * 1e3);
        }
        Ok(exe)
    }

    /// Compiles a serialized module (MLIR bytecode or text) as it is: no quick tier, no
    /// persistent cache (it is the user's file, read again each run).
    pub fn compile_code(&self, what: &str, code: &[u8]) -> Result<Arc<pjrt::LoadedExecutable>, pjrt::Error> {
        let t0 = std::time::Instant::now();
        let exe = timed(|t| &mut t.xla_compile, || self.client.compile_code(code, &self.compile_options))?;
        let seconds = t0.elapsed().as_secs_f64();
        record_program(what, seconds);
        if log_compiles() {
            eprintln!("torchtpu: compile {what} (a serialized module) {:.1} ms", seconds * 1e3);
        }
        Ok(Arc::new(exe))
    }

    fn compile_or_load(&self, text: &str, options: &[u8]) -> Result<(Arc<pjrt::LoadedExecutable>, &'static str), pjrt::Error> {
        let compile = || timed(|t| &mut t.xla_compile, || self.client.compile(text, options)).map(Arc::new);
        let Some(dir) = &self.cache_dir else {
            return Ok((compile()?, "compiled"));
        };
        let loaded = timed(|t| &mut t.cache_load, || {
            let bytes = disk_cache::load(dir, &self.identity, options, text)?;
            self.client.deserialize_executable(&bytes, None).ok()
        });
        if let Some(exe) = loaded {
            disk_cache::DISK_HITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Ok((Arc::new(exe), "persistent cache"));
        }
        let exe = compile()?;
        let store = Store { exe: exe.clone(), dir: dir.clone(), identity: self.identity.clone(), options: options.to_vec(), text: text.to_string() };
        stores().send(store);
        Ok((exe, "compiled"))
    }
}

/// A compiled program to write to the persistent cache.
struct Store {
    exe: Arc<pjrt::LoadedExecutable>,
    dir: std::path::PathBuf,
    identity: String,
    options: Vec<u8>,
    text: String,
}

impl Store {
    fn write(self) {
        timed(|t| &mut t.cache_store, || {
            if let Ok(bytes) = self.exe.serialize() {
                disk_cache::store(&self.dir, &self.identity, &self.options, &self.text, &bytes);
            }
        });
    }
}

/// Persistent-cache writes run on a thread of their own: serializing and writing executables
/// took about a ninth of the compile time (1.0 of 8.9 s over the 176 programs of a tiny
/// Llama's first `generate`), and nothing waits for the file. `flush_stores` waits for
/// the writes queued so far (compile_stats and interpreter exit call it).
struct Stores {
    queue: Mutex<mpsc::Sender<Store>>,
    /// Writes queued and not finished.
    pending: Arc<(Mutex<usize>, Condvar)>,
}

fn stores() -> &'static Stores {
    static STORES: OnceLock<Stores> = OnceLock::new();
    STORES.get_or_init(|| {
        let (queue, jobs) = mpsc::channel::<Store>();
        let pending = Arc::new((Mutex::new(0usize), Condvar::new()));
        let done = pending.clone();
        std::thread::Builder::new()
            .name("torchtpu-cache-writer".into())
            .spawn(move || {
                for store in jobs {
                    store.write();
                    *done.0.lock().unwrap() -= 1;
                    done.1.notify_all();
                }
            })
            .expect("starting the persistent cache's writer thread");
        Stores { queue: Mutex::new(queue), pending }
    })
}

impl Stores {
    fn send(&self, store: Store) {
        *self.pending.0.lock().unwrap() += 1;
        if let Err(mpsc::SendError(store)) = self.queue.lock().unwrap().send(store) {
            *self.pending.0.lock().unwrap() -= 1;
            store.write();
        }
    }
}

/// Waits until the persistent-cache writes queued so far are on disk. (A forked child has the
/// parent's count but not its writer thread, and compiles nothing: it does not wait.)
pub fn flush_stores() {
    if pjrt::forked() {
        return;
    }
    let stores = stores();
    let mut pending = stores.pending.0.lock().unwrap();
    while *pending > 0 {
        pending = stores.pending.1.wait(pending).unwrap();
    }
}

fn record_program(what: &str, seconds: f64) {
    record(|t| {
        let op = t.per_op.entry(what.to_string()).or_default();
        op.0 += 1;
        op.1 += seconds;
    });
}

/// The element count of the largest tensor type a program's text names (parameters, results
/// and every intermediate).
fn largest_tensor(text: &str) -> i64 {
    tensor_types(text).map(|(dims, _)| dims.iter().product::<i64>()).max().unwrap_or(0)
}

/// The same over floating-point tensors, each dim rounded up to its bucket: equal for a call's
/// exact and bucketed programs (the padded values have the bucketed dims; the bucketed one's
/// gather indices and geometry are integers), and it sees intermediates larger than the call's
/// tensors (attention's scores), which unoptimized code would run slowly.
fn largest_float_bucketed(text: &str) -> i64 {
    tensor_types(text)
        .filter(|(_, elem)| elem.starts_with('f') || elem.starts_with("bf") || elem.starts_with("complex"))
        .map(|(dims, _)| dims.iter().map(|&n| crate::buckets::bucket(n)).product::<i64>())
        .max()
        .unwrap_or(0)
}

/// The tensor types a program's text names: "tensor<4x16xf32>" gives ([4, 16], "f32"),
/// "tensor<f32>" ([], "f32").
fn tensor_types(text: &str) -> impl Iterator<Item = (Vec<i64>, &str)> {
    text.split("tensor<").skip(1).map(|t| {
        let mut dims = Vec::new();
        let mut rest = t;
        while let Some((d, tail)) = rest.split_once('x') {
            match d.parse::<i64>() {
                Ok(n) => {
                    dims.push(n);
                    rest = tail;
                }
                Err(_) => break,
            }
        }
        (dims, rest)
    })
}

/// `TORCHTPU_LOG_COMPILES=1`: a line on stderr per program compiled or loaded, with its op,
/// parameter types and milliseconds.
fn log_compiles() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("TORCHTPU_LOG_COMPILES").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// `TORCHTPU_DUMP_PROGRAMS=<dir>`: each program compiled or loaded is written there as
/// StableHLO text, `<n>-<op>.mlir`, numbered in compile order.
fn dump_dir() -> Option<&'static std::path::Path> {
    static DIR: OnceLock<Option<std::path::PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| std::env::var_os("TORCHTPU_DUMP_PROGRAMS").filter(|v| !v.is_empty()).map(Into::into)).as_deref()
}

fn dump_program(dir: &std::path::Path, what: &str, text: &str) {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name: String = what.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '.' { c } else { '_' }).collect();
    // A debugging aid: a directory that cannot be written is reported once, not raised.
    let written = std::fs::create_dir_all(dir).and_then(|_| std::fs::write(dir.join(format!("{n:05}-{name}.mlir")), text));
    if let Err(e) = written {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| eprintln!("torchtpu: TORCHTPU_DUMP_PROGRAMS: cannot write to {}: {e}", dir.display()));
    }
}

/// A program's parameter types, as `(2x3xf32, f32)`: the compile log and compile_stats show them.
pub fn signature(text: &str) -> String {
    let Some(line) = text.lines().find(|l| l.contains("@main(")) else { return String::new() };
    let params = line.split(") ->").next().unwrap_or("");
    let types: Vec<&str> = params.split("tensor<").skip(1).map(|t| t.split('>').next().unwrap_or("")).collect();
    format!("({})", types.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn largest_tensor_counts_every_type() {
        let text = "func.func public @main(%arg0: tensor<4x16xf32>, %arg1: tensor<i64>) -> (tensor<64xf32>) {\n  %0 = stablehlo.broadcast_in_dim %arg0, dims = [0, 1] : (tensor<4x16xf32>) -> tensor<8x4x16xf32>\n";
        assert_eq!(largest_tensor(text), 512);
        assert_eq!(largest_tensor("tensor<f32>"), 1);
        assert_eq!(largest_tensor("tensor<0x3xf32>"), 0);
        assert_eq!(signature(text), "(4x16xf32, i64)");
    }
}
