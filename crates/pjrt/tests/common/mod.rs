//! Shared test helpers: finding the plugin and converting host data.
#![allow(dead_code)]

use pjrt::{Client, NamedValue, Plugin};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

pub const DEFAULT_PLUGIN: &str =
    "/work/venv/lib/python3.11/site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so";

/// `$PJRT_TEST_PLUGIN`, else the xla_cpu_pjrt plugin of the project venv;
/// `None` (test skipped) when neither exists.
pub fn plugin_path() -> Option<PathBuf> {
    let path = std::env::var_os("PJRT_TEST_PLUGIN")
        .or_else(|| std::env::var_os("PJRT_CPU_PLUGIN"))
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_PLUGIN));
    if path.exists() {
        Some(path)
    } else {
        // CI sets TORCHTPU_REQUIRE_PLUGINS so that a missing plugin fails instead of skipping.
        assert!(std::env::var_os("TORCHTPU_REQUIRE_PLUGINS").is_none(), "PJRT plugin {} not found", path.display());
        eprintln!("skipping: PJRT plugin {} not found (set PJRT_TEST_PLUGIN)", path.display());
        None
    }
}

pub fn plugin() -> Option<Arc<Plugin>> {
    Some(Plugin::load(plugin_path()?).expect("load plugin"))
}

/// One single-device client shared by the tests of a binary.
pub fn client() -> Option<&'static Client> {
    static CLIENT: OnceLock<Option<Client>> = OnceLock::new();
    CLIENT
        .get_or_init(|| Some(Client::new(&plugin()?, &[]).expect("create client")))
        .as_ref()
}

/// A CPU client with two devices (`cpu_device_count = 2`).
pub fn client2() -> Option<&'static Client> {
    static CLIENT: OnceLock<Option<Client>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            let opts = [("cpu_device_count", NamedValue::I64(2))];
            Some(Client::new(&plugin()?, &opts).expect("create 2-device client"))
        })
        .as_ref()
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

pub fn bytes_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect()
}

pub fn read_f32(buf: &pjrt::Buffer) -> Vec<f32> {
    let n: i64 = buf.dims().unwrap().iter().product();
    let mut host = vec![0u8; n as usize * 4];
    buf.to_host(&mut host).unwrap();
    bytes_f32(&host)
}

pub const ADD_2X3: &str = r#"
func.func @main(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %0 = stablehlo.add %a, %b : tensor<2x3xf32>
  return %0 : tensor<2x3xf32>
}
"#;

pub const ADD_2X2: &str = r#"
func.func @main(%a: tensor<2x2xf32>, %b: tensor<2x2xf32>) -> tensor<2x2xf32> {
  %0 = stablehlo.add %a, %b : tensor<2x2xf32>
  return %0 : tensor<2x2xf32>
}
"#;
