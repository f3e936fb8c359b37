//! The process-wide PJRT client, created on first use from the plugin the Python package chose.
use crate::disk_cache;
use crate::error::Error;
use std::sync::{Mutex, OnceLock};

pub struct Runtime {
    pub client: pjrt::Client,
    pub devices: Vec<pjrt::Device>,
    pub compile_options: Vec<u8>,
    /// Identifies the plugin for caches: its content hash, API version, platform and version.
    pub identity: String,
    /// The persistent executable cache's directory, if enabled.
    pub cache_dir: Option<std::path::PathBuf>,
}

#[derive(Clone, Debug, Default)]
pub struct Config {
    pub plugin_path: String,
    pub options: Vec<(String, pjrt::NamedValue)>,
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
    let identity = format!("{}|{}.{}|{}|{}", fingerprint, maj, min, client.platform_name(), client.platform_version());
    // XLA:CPU cannot compile chlo.ragged_dot (grouped matmuls); the GPU and TPU compilers can.
    lowerings::set_ragged_dot(client.platform_name() != "cpu");
    // With several devices, portable executables let one compiled op serve all of them; with
    // one, executables compiled for it take the plugin's usual (non-portable) execute path.
    let compile_options = if devices.len() == 1 {
        pjrt::compile_options_proto(1, 1)
    } else {
        pjrt::portable_compile_options_proto()
    };
    Ok(Runtime { client, devices, compile_options, identity, cache_dir })
}

impl Runtime {
    pub fn device(&self, index: i32) -> Result<&pjrt::Device, Error> {
        self.devices
            .get(index.max(0) as usize)
            .ok_or_else(|| Error::runtime(format!("torchtpu: invalid device index {index}")))
    }
}

impl Runtime {
    /// Compiles a program, or loads it from the persistent cache when an entry for exactly
    /// this program, plugin and options exists.
    pub fn compile(&self, text: &str) -> Result<pjrt::LoadedExecutable, pjrt::Error> {
        let Some(dir) = &self.cache_dir else {
            return self.client.compile(text, &self.compile_options);
        };
        if let Some(bytes) = disk_cache::load(dir, &self.identity, &self.compile_options, text) {
            if let Ok(exe) = self.client.deserialize_executable(&bytes, None) {
                disk_cache::DISK_HITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return Ok(exe);
            }
        }
        let exe = self.client.compile(text, &self.compile_options)?;
        if let Ok(bytes) = exe.serialize() {
            disk_cache::store(dir, &self.identity, &self.compile_options, text, &bytes);
        }
        Ok(exe)
    }
}
