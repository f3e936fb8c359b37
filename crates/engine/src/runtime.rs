//! The process-wide PJRT client, created on first use from the plugin the Python package chose.
use crate::Error;
use std::sync::{Mutex, OnceLock};

pub struct Runtime {
    pub client: pjrt::Client,
    pub devices: Vec<pjrt::Device>,
    pub compile_options: Vec<u8>,
    /// Identifies the plugin for caches: path, API version, platform and its version.
    pub identity: String,
}

#[derive(Clone, Debug, Default)]
pub struct Config {
    pub plugin_path: String,
    pub options: Vec<(String, i64)>,
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

pub fn runtime() -> Result<&'static Runtime, Error> {
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
    let opts: Vec<(&str, pjrt::NamedValue)> =
        cfg.options.iter().map(|(k, v)| (k.as_str(), pjrt::NamedValue::I64(*v))).collect();
    let client = pjrt::Client::new(&plugin, &opts)?;
    let devices = client.addressable_devices();
    let (maj, min) = plugin.api_version();
    let identity = format!(
        "{}|{}.{}|{}|{}",
        cfg.plugin_path,
        maj,
        min,
        client.platform_name(),
        client.platform_version()
    );
    // Portable executables run on any device of the client: one compiled op serves all devices.
    Ok(Runtime { client, devices, compile_options: pjrt::portable_compile_options_proto(), identity })
}

impl Runtime {
    pub fn device(&self, index: i32) -> Result<&pjrt::Device, Error> {
        self.devices
            .get(index.max(0) as usize)
            .ok_or_else(|| Error::runtime(format!("torchtpu: invalid device index {index}")))
    }
}
