//! End-to-end tests against a real PJRT plugin (see common::plugin_path).

mod common;

use common::*;
use pjrt::{compile_options_proto, portable_compile_options_proto, ElementType, NamedValue};

fn opts() -> Vec<u8> {
    compile_options_proto(1, 1)
}

#[test]
fn compile_options_bytes() {
    assert_eq!(compile_options_proto(1, 1), [0x1a, 0x04, 0x20, 0x01, 0x28, 0x01]);
    assert_eq!(compile_options_proto(2, 1), [0x1a, 0x04, 0x20, 0x02, 0x28, 0x01]);
    assert_eq!(compile_options_proto(300, 1), [0x1a, 0x05, 0x20, 0xac, 0x02, 0x28, 0x01]);
    assert_eq!(portable_compile_options_proto(), [0x1a, 0x04, 0x20, 0x01, 0x28, 0x01, 0x20, 0x01]);
}

#[test]
fn element_type_mapping() {
    assert_eq!(ElementType::Pred.to_c(), 1);
    assert_eq!(ElementType::F32.to_c(), 11);
    assert_eq!(ElementType::BF16.to_c(), 13);
    assert_eq!(ElementType::F8E4M3FN.to_c(), 17);
    for v in 1..=17 {
        assert_eq!(ElementType::from_c(v).unwrap().to_c(), v);
    }
    assert_eq!(ElementType::from_c(0), None);
    assert_eq!(ElementType::from_c(18), None);
    assert_eq!(ElementType::C128.byte_size(), 16);
}

#[test]
fn load_client_devices() {
    let Some(client) = client() else { return };
    let plugin = client.plugin();
    let (major, minor) = plugin.api_version();
    assert_eq!(major, 0);
    assert!(minor >= 40, "minor {minor}");
    // Loading again gives the same plugin (initialized once).
    let again = pjrt::Plugin::load(plugin.path()).unwrap();
    assert!(std::sync::Arc::ptr_eq(plugin, &again));
    let attrs = plugin.attributes();
    eprintln!("plugin API {major}.{minor}, attributes {attrs:?}");
    assert!(attrs.iter().any(|(k, v)| k == "stablehlo_current_version" && matches!(v, NamedValue::I64List(_))));
    assert_eq!(client.platform_name(), "cpu");
    eprintln!("platform {} {}", client.platform_name(), client.platform_version());
    assert_eq!(client.process_index(), 0);
    let devices = client.addressable_devices();
    assert!(!devices.is_empty());
    for d in &devices {
        eprintln!("{d:?} hw={} debug={:?}", d.local_hardware_id(), d.debug_string());
        assert!(d.id() >= 0);
        assert!(!d.kind().is_empty());
        assert!(!d.debug_string().is_empty());
    }
}

#[test]
fn missing_plugin_is_an_error() {
    let err = pjrt::Plugin::load("/nonexistent/plugin.so").unwrap_err();
    assert!(err.message.contains("/nonexistent/plugin.so"), "{err}");
}

#[test]
fn memory_stats_does_not_crash() {
    let Some(client) = client() else { return };
    for d in client.addressable_devices() {
        match d.memory_stats() {
            Ok(stats) => eprintln!("memory stats of {d:?}: {stats:?}"),
            Err(e) => eprintln!("memory stats of {d:?}: error {e}"),
        }
    }
}

#[test]
fn compile_and_add() {
    let Some(client) = client() else { return };
    let dev = &client.addressable_devices()[0];
    let exe = client.compile(ADD_2X3, &opts()).unwrap();
    assert_eq!(exe.num_outputs(), 1);
    assert_eq!(exe.addressable_devices(), vec![dev.clone()]);
    let a = client
        .buffer_from_host(&f32_bytes(&[1., 2., 3., 4., 5., 6.]), ElementType::F32, &[2, 3], None, dev)
        .unwrap();
    let b = client
        .buffer_from_host(&f32_bytes(&[10., 20., 30., 40., 50., 60.]), ElementType::F32, &[2, 3], None, dev)
        .unwrap();
    let out = exe.execute(&[&a, &b], dev).unwrap();
    assert_eq!(out.len(), 1);
    out[0].ready().unwrap();
    assert_eq!(out[0].dims().unwrap(), &[2, 3]);
    assert_eq!(out[0].element_type().unwrap(), ElementType::F32);
    assert_eq!(out[0].device().unwrap(), *dev);
    assert!(out[0].on_device_size_in_bytes().unwrap() >= 24);
    assert!(!out[0].is_deleted().unwrap());
    assert_eq!(read_f32(&out[0]), [11., 22., 33., 44., 55., 66.]);
    // Inputs are not donated without aliasing.
    assert!(!a.is_deleted().unwrap());
    assert_eq!(read_f32(&a), [1., 2., 3., 4., 5., 6.]);
    let fingerprint = exe.fingerprint();
    eprintln!("fingerprint {fingerprint:?}");
    assert!(fingerprint.is_none_or(|f| !f.is_empty()));
}

#[test]
fn transfers_both_ways() {
    let Some(client) = client() else { return };
    let dev = &client.addressable_devices()[0];

    // Several element types round-trip bit-exactly.
    let bytes: Vec<u8> = (0..48u8).collect();
    for (ty, dims) in [
        (ElementType::U8, vec![48]),
        (ElementType::S16, vec![4, 6]),
        (ElementType::S32, vec![3, 4]),
        (ElementType::F64, vec![2, 3]),
        (ElementType::BF16, vec![24]),
        (ElementType::C64, vec![6]),
    ] {
        let buf = client.buffer_from_host(&bytes, ty, &dims, None, dev).unwrap();
        assert_eq!(buf.element_type().unwrap(), ty);
        assert_eq!(buf.dims().unwrap(), dims.as_slice());
        let mut back = vec![0u8; 48];
        buf.to_host(&mut back).unwrap();
        assert_eq!(back, bytes, "{ty:?}");
    }

    // Wrong sizes are rejected before reaching the plugin.
    assert!(client.buffer_from_host(&bytes, ElementType::F32, &[2, 3], None, dev).is_err());
    assert!(client.buffer_from_host(&bytes, ElementType::F32, &[-1, 3], None, dev).is_err());
    let buf = client.buffer_from_host(&bytes, ElementType::F32, &[12], None, dev).unwrap();
    assert!(buf.to_host(&mut [0u8; 47]).is_err());

    // Strided host -> device: a column-major 2x3 matrix (element (i, j) at
    // byte 4 * (i + 2 * j)) arrives as the row-major [[1,2,3],[4,5,6]].
    let col_major = f32_bytes(&[1., 4., 2., 5., 3., 6.]);
    let buf = client
        .buffer_from_host(&col_major, ElementType::F32, &[2, 3], Some(&[4, 8]), dev)
        .unwrap();
    assert_eq!(read_f32(&buf), [1., 2., 3., 4., 5., 6.]);

    // Strides that would read outside the slice are rejected.
    assert!(client
        .buffer_from_host(&col_major, ElementType::F32, &[2, 3], Some(&[4, 12]), dev)
        .is_err());

    // The other host-buffer semantics gives the same result.
    let buf = client
        .buffer_from_host_with(
            &f32_bytes(&[7., 8.]),
            ElementType::F32,
            &[2],
            None,
            dev,
            pjrt::HostBufferSemantics::ImmutableUntilTransferCompletes,
        )
        .unwrap();
    assert_eq!(read_f32(&buf), [7., 8.]);

    // Ready event.
    let ev = buf.ready_event().unwrap();
    ev.wait().unwrap();
    assert!(ev.is_ready());
}

#[test]
fn compile_error_is_err() {
    let Some(client) = client() else { return };
    let err = client.compile("func.func @main( this is not mlir", &opts()).err().unwrap();
    eprintln!("compile error: {err}");
    assert!(!err.message.is_empty());
    assert_ne!(err.code, 0);
    // Type error in otherwise well-formed MLIR.
    let bad = "func.func @main(%a: tensor<2xf32>) -> tensor<3xf32> { return %a : tensor<2xf32> }";
    assert!(client.compile(bad, &opts()).is_err());
    // Repeated parse errors (a second unknown-op error once crashed the 0.115
    // plugin when the text was not NUL-terminated).
    for _ in 0..3 {
        assert!(client.compile("bad", &opts()).is_err());
        assert!(client.compile("", &opts()).is_err());
        assert!(client.compile("module {", &opts()).is_err());
    }
    // Empty options would abort inside the plugin: refused up front.
    assert!(client.compile(ADD_2X3, &[]).is_err());
}

#[test]
fn wrong_argument_count_is_err() {
    let Some(client) = client() else { return };
    let dev = &client.addressable_devices()[0];
    let exe = client.compile(ADD_2X3, &opts()).unwrap();
    let a = client
        .buffer_from_host(&f32_bytes(&[1.; 6]), ElementType::F32, &[2, 3], None, dev)
        .unwrap();
    let err = exe.execute(&[&a], dev).err().unwrap();
    eprintln!("wrong arg count: {err}");
    assert!(!err.message.is_empty());
    assert!(exe.execute(&[&a, &a, &a], dev).is_err());
    // Still usable afterwards.
    let out = exe.execute(&[&a, &a], dev).unwrap();
    assert_eq!(read_f32(&out[0]), [2.; 6]);
}

/// How donation is expressed: `tf.aliasing_output` on the argument.
const DONATE: &str = r#"
func.func @main(%a: tensor<2x3xf32> {tf.aliasing_output = 0 : i32}, %b: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %0 = stablehlo.add %a, %b : tensor<2x3xf32>
  return %0 : tensor<2x3xf32>
}
"#;

#[test]
fn donation_deletes_input() {
    let Some(client) = client() else { return };
    let dev = &client.addressable_devices()[0];
    let exe = client.compile(DONATE, &opts()).unwrap();
    let a = client
        .buffer_from_host(&f32_bytes(&[1., 2., 3., 4., 5., 6.]), ElementType::F32, &[2, 3], None, dev)
        .unwrap();
    let b = client
        .buffer_from_host(&f32_bytes(&[1.; 6]), ElementType::F32, &[2, 3], None, dev)
        .unwrap();
    let out = exe.execute(&[&a, &b], dev).unwrap();
    assert_eq!(read_f32(&out[0]), [2., 3., 4., 5., 6., 7.]);
    assert!(a.is_deleted().unwrap(), "donated input should be deleted");
    assert!(!b.is_deleted().unwrap());

    // Reusing the donated buffer errors cleanly.
    let err = exe.execute(&[&a, &b], dev).err().unwrap();
    eprintln!("reuse donated: {err}");
    let mut host = [0u8; 24];
    let err = a.to_host(&mut host).err().unwrap();
    eprintln!("read donated: {err}");
    assert!(a.ready().is_err());

    // The output can be donated in turn.
    let out2 = exe.execute(&[&out[0], &b], dev).unwrap();
    assert!(out[0].is_deleted().unwrap());
    assert_eq!(read_f32(&out2[0]), [3., 4., 5., 6., 7., 8.]);
}

#[test]
fn explicit_delete() {
    let Some(client) = client() else { return };
    let dev = &client.addressable_devices()[0];
    let a = client.buffer_from_host(&[0u8; 4], ElementType::F32, &[], None, dev).unwrap();
    a.delete().unwrap();
    assert!(a.is_deleted().unwrap());
    assert!(a.to_host(&mut [0u8; 4]).is_err());
}

#[test]
fn serialize_roundtrip() {
    let Some(client) = client() else { return };
    let dev = &client.addressable_devices()[0];
    let exe = client.compile(ADD_2X3, &opts()).unwrap();
    let bytes = exe.serialize().unwrap();
    assert!(!bytes.is_empty());
    let a = client
        .buffer_from_host(&f32_bytes(&[1., 2., 3., 4., 5., 6.]), ElementType::F32, &[2, 3], None, dev)
        .unwrap();
    let want = read_f32(&exe.execute(&[&a, &a], dev).unwrap()[0]);
    for options in [None, Some(opts())] {
        let exe2 = client.deserialize_executable(&bytes, options.as_deref()).unwrap();
        assert_eq!(exe2.num_outputs(), 1);
        let got = read_f32(&exe2.execute(&[&a, &a], dev).unwrap()[0]);
        assert_eq!(got, want);
        assert_eq!(got, [2., 4., 6., 8., 10., 12.]);
    }
    assert!(client.deserialize_executable(b"garbage", None).is_err());
}

#[test]
fn multiple_outputs() {
    let Some(client) = client() else { return };
    let dev = &client.addressable_devices()[0];
    let mlir = r#"
func.func @main(%a: tensor<3xf32>, %b: tensor<3xf32>) -> (tensor<3xf32>, tensor<3xf32>, tensor<i32>) {
  %0 = stablehlo.add %a, %b : tensor<3xf32>
  %1 = stablehlo.multiply %a, %b : tensor<3xf32>
  %2 = stablehlo.constant dense<7> : tensor<i32>
  return %0, %1, %2 : tensor<3xf32>, tensor<3xf32>, tensor<i32>
}
"#;
    let exe = client.compile(mlir, &opts()).unwrap();
    assert_eq!(exe.num_outputs(), 3);
    let a = client.buffer_from_host(&f32_bytes(&[1., 2., 3.]), ElementType::F32, &[3], None, dev).unwrap();
    let b = client.buffer_from_host(&f32_bytes(&[4., 5., 6.]), ElementType::F32, &[3], None, dev).unwrap();
    let out = exe.execute(&[&a, &b], dev).unwrap();
    assert_eq!(out.len(), 3);
    assert_eq!(read_f32(&out[0]), [5., 7., 9.]);
    assert_eq!(read_f32(&out[1]), [4., 10., 18.]);
    assert_eq!(out[2].element_type().unwrap(), ElementType::S32);
    assert_eq!(out[2].dims().unwrap(), &[] as &[i64]);
    let mut host = [0u8; 4];
    out[2].to_host(&mut host).unwrap();
    assert_eq!(i32::from_ne_bytes(host), 7);
}

#[test]
fn scalar_and_empty_buffers() {
    let Some(client) = client() else { return };
    let dev = &client.addressable_devices()[0];

    let scalar = r#"
func.func @main(%a: tensor<f32>, %b: tensor<f32>) -> tensor<f32> {
  %0 = stablehlo.multiply %a, %b : tensor<f32>
  return %0 : tensor<f32>
}
"#;
    let exe = client.compile(scalar, &opts()).unwrap();
    let a = client.buffer_from_host(&f32_bytes(&[3.]), ElementType::F32, &[], None, dev).unwrap();
    let b = client.buffer_from_host(&f32_bytes(&[-2.5]), ElementType::F32, &[], None, dev).unwrap();
    assert_eq!(a.dims().unwrap(), &[] as &[i64]);
    let out = exe.execute(&[&a, &b], dev).unwrap();
    assert_eq!(read_f32(&out[0]), [-7.5]);

    let empty = r#"
func.func @main(%a: tensor<0x3xf32>, %b: tensor<0x3xf32>) -> tensor<0x3xf32> {
  %0 = stablehlo.add %a, %b : tensor<0x3xf32>
  return %0 : tensor<0x3xf32>
}
"#;
    let exe = client.compile(empty, &opts()).unwrap();
    let e = client.buffer_from_host(&[], ElementType::F32, &[0, 3], None, dev).unwrap();
    assert_eq!(e.dims().unwrap(), &[0, 3]);
    let out = exe.execute(&[&e, &e], dev).unwrap();
    out[0].ready().unwrap();
    assert_eq!(out[0].dims().unwrap(), &[0, 3]);
    out[0].to_host(&mut []).unwrap();
    // Strided empty buffers need no data either.
    let e2 = client.buffer_from_host(&[], ElementType::F32, &[0, 3], Some(&[12, 4]), dev).unwrap();
    e2.to_host(&mut []).unwrap();
}

#[test]
fn execute_from_many_threads() {
    let Some(client) = client() else { return };
    let dev = client.addressable_devices()[0].clone();
    let exe = client.compile(ADD_2X2, &opts()).unwrap();
    let x = client.buffer_from_host(&f32_bytes(&[1., 2., 3., 4.]), ElementType::F32, &[2, 2], None, &dev).unwrap();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..50 {
                    let out = exe.execute(&[&x, &x], &dev).unwrap();
                    assert_eq!(read_f32(&out[0]), [2., 4., 6., 8.]);
                }
            });
        }
    });
}

const ALL_REDUCE: &str = r#"
module @allreduce attributes {mhlo.num_replicas = 2 : i32, mhlo.num_partitions = 1 : i32} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = "stablehlo.all_reduce"(%a) ({
    ^bb0(%x: tensor<f32>, %y: tensor<f32>):
      %s = stablehlo.add %x, %y : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"#;

#[test]
fn all_reduce_on_two_devices() {
    let Some(client) = client2() else { return };
    let devices = client.addressable_devices();
    assert_eq!(devices.len(), 2);
    let exe = client.compile(ALL_REDUCE, &compile_options_proto(2, 1)).unwrap();
    let exe_devices = exe.addressable_devices();
    assert_eq!(exe_devices.len(), 2);
    let x0 = client
        .buffer_from_host(&f32_bytes(&[1., 2., 3., 4.]), ElementType::F32, &[4], None, &exe_devices[0])
        .unwrap();
    let x1 = client
        .buffer_from_host(&f32_bytes(&[10., 20., 30., 40.]), ElementType::F32, &[4], None, &exe_devices[1])
        .unwrap();
    let out = exe.execute_replicated(&[vec![&x0], vec![&x1]], &exe_devices).unwrap();
    assert_eq!(out.len(), 2);
    for (i, per_device) in out.iter().enumerate() {
        assert_eq!(per_device.len(), 1);
        assert_eq!(per_device[0].device().unwrap(), exe_devices[i]);
        assert_eq!(read_f32(&per_device[0]), [11., 22., 33., 44.]);
    }
    // Single-device execute of a replicated program is refused (it would hang).
    assert!(exe.execute(&[&x0], &exe_devices[0]).is_err());
    // Mismatched argument lists are refused.
    assert!(exe.execute_replicated(&[vec![&x0]], &exe_devices[..1]).is_err());
}

#[test]
fn execute_on_second_device() {
    let Some(client) = client2() else { return };
    let devices = client.addressable_devices();
    let d1 = &devices[1];
    let x = client.buffer_from_host(&f32_bytes(&[1., 2., 3., 4.]), ElementType::F32, &[2, 2], None, d1).unwrap();

    // An ordinary executable is bound to device 0: running it elsewhere is
    // an error from the plugin, not a crash.
    let exe = client.compile(ADD_2X2, &opts()).unwrap();
    let err = exe.execute(&[&x, &x], d1).err().unwrap();
    eprintln!("execute on a device other than the compiled one: {err}");

    // A portable executable runs on any device it is given.
    let exe = client.compile(ADD_2X2, &portable_compile_options_proto()).unwrap();
    assert!(exe.addressable_devices().is_empty());
    for d in &devices {
        let x = client.buffer_from_host(&f32_bytes(&[1., 2., 3., 4.]), ElementType::F32, &[2, 2], None, d).unwrap();
        let out = exe.execute(&[&x, &x], d).unwrap();
        assert_eq!(out[0].device().unwrap(), *d);
        assert_eq!(read_f32(&out[0]), [2., 4., 6., 8.]);
    }
}

/// The newer (API 0.115) CPU plugin shipped with lammps_jax.
const NEWER_PLUGIN: &str =
    "/work/venv/lib/python3.11/site-packages/lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so";

/// Without PJRT_TEST_PLUGIN, also run this whole suite against the newer
/// plugin, in a child process (one plugin per process).
#[test]
fn suite_passes_with_newer_plugin() {
    if std::env::var_os("PJRT_TEST_PLUGIN").is_some() {
        return;
    }
    let newer = std::env::var("PJRT_NEWER_CPU_PLUGIN").unwrap_or_else(|_| NEWER_PLUGIN.to_string());
    if !std::path::Path::new(&newer).exists() {
        assert!(std::env::var_os("TORCHTPU_REQUIRE_PLUGINS").is_none(), "PJRT plugin {newer} not found");
        eprintln!("skipping: {newer} not found");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .env("PJRT_TEST_PLUGIN", &newer)
        .args(["--skip", "suite_passes_with_newer_plugin", "--test-threads=2"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "suite failed with {newer}:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{newer}: {}", stdout.lines().filter(|l| l.starts_with("test result")).collect::<String>());
}

/// A typed FFI handler: out = in * the `factor` attribute, or an error where `factor` is 0.
unsafe extern "C" fn scale(frame: *mut pjrt::xla_ffi::CallFrame) -> *mut std::ffi::c_void {
    let frame = &mut *frame;
    if !frame.should_execute() {
        return std::ptr::null_mut();
    }
    let factor = frame.attr_i64("factor").unwrap_or(0);
    let (args, results) = (frame.args().unwrap(), frame.results().unwrap());
    if factor == 0 || args[0].dtype != pjrt::xla_ffi::DTYPE_F32 || args[0].dims() != results[0].dims() {
        return frame.error("scale: factor 0");
    }
    let n = args[0].elements() as usize;
    let (x, y) = (args[0].data as *const f32, results[0].data as *mut f32);
    for i in 0..n {
        *y.add(i) = *x.add(i) * factor as f32;
    }
    std::ptr::null_mut()
}

fn scale_program(factor: i64) -> String {
    format!(
        "func.func @main(%a: tensor<2x3xf32>) -> tensor<2x3xf32> {{
           %0 = \"stablehlo.custom_call\"(%a) {{call_target_name = \"pjrt_test.scale\", api_version = 4 : i32, \
                backend_config = {{factor = {factor} : i64}}}} : (tensor<2x3xf32>) -> tensor<2x3xf32>
           return %0 : tensor<2x3xf32>
         }}"
    )
}

#[test]
fn ffi_custom_call_runs_the_registered_handler() {
    let Some(client) = client() else { return };
    static REGISTER: std::sync::Once = std::sync::Once::new();
    REGISTER.call_once(|| client.plugin().register_ffi_handler("pjrt_test.scale", "cpu", scale).unwrap());
    let dev = &client.addressable_devices()[0];
    let a = client
        .buffer_from_host(&f32_bytes(&[1., 2., 3., 4., 5., 6.]), ElementType::F32, &[2, 3], None, dev)
        .unwrap();
    let exe = client.compile(&scale_program(3), &opts()).unwrap();
    let out = exe.execute(&[&a], dev).unwrap();
    assert_eq!(read_f32(&out[0]), [3., 6., 9., 12., 15., 18.]);
    // The handler's error is the execution's, with its message.
    let exe = client.compile(&scale_program(0), &opts()).unwrap();
    let err = exe.execute(&[&a], dev).and_then(|out| out[0].ready()).unwrap_err();
    assert!(err.message.contains("scale: factor 0"), "{err:?}");
}
