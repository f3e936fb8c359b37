//! Times the hot paths: `cargo run --release -p pjrt --example bench_execute [plugin.so]`.
//!
//! Prints microseconds per execute of a 2x2 f32 add whose inputs are already
//! on the device, per 24-byte host->device and device->host transfer, and the
//! compile time of a small module.

use pjrt::*;
use std::time::Instant;

const ADD: &str = r#"
func.func @main(%a: tensor<2x2xf32>, %b: tensor<2x2xf32>) -> tensor<2x2xf32> {
  %0 = stablehlo.add %a, %b : tensor<2x2xf32>
  return %0 : tensor<2x2xf32>
}
"#;

const DEFAULT_PLUGIN: &str = "/work/venv/lib/python3.11/site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so";

fn per_iter_us(n: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..n / 10 {
        f(); // warm up
    }
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_secs_f64() * 1e6 / n as f64
}

fn main() -> Result<()> {
    let path = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("PJRT_TEST_PLUGIN").ok())
        .unwrap_or_else(|| DEFAULT_PLUGIN.to_string());
    let plugin = Plugin::load(&path)?;
    let (major, minor) = plugin.api_version();
    let client = Client::new(&plugin, &[])?;
    let dev = &client.addressable_devices()[0];
    println!("plugin {path} (API {major}.{minor})");

    let opts = compile_options_proto(1, 1);
    let t = Instant::now();
    let exe = client.compile(ADD, &opts)?;
    println!("compile 2x2 add:                 {:8.2} ms", t.elapsed().as_secs_f64() * 1e3);
    let t = Instant::now();
    let _ = client.compile(ADD, &opts)?;
    println!("compile again:                   {:8.2} ms", t.elapsed().as_secs_f64() * 1e3);

    let data: Vec<u8> = [1f32, 2., 3., 4.].iter().flat_map(|x| x.to_ne_bytes()).collect();
    let a = client.buffer_from_host(&data, ElementType::F32, &[2, 2], None, dev)?;
    let b = client.buffer_from_host(&data, ElementType::F32, &[2, 2], None, dev)?;

    let n = 20_000;
    let us = per_iter_us(n, || {
        let out = exe.execute(&[&a, &b], dev).unwrap();
        drop(out);
    });
    // Let queued work drain before the next measurement.
    exe.execute(&[&a, &b], dev)?[0].ready()?;
    println!("execute (async, outputs dropped): {us:8.2} us");

    let us = per_iter_us(n, || {
        let out = exe.execute(&[&a, &b], dev).unwrap();
        out[0].ready().unwrap();
    });
    println!("execute + ready:                  {us:8.2} us");

    let h2d: Vec<u8> = vec![0u8; 24];
    for sem in [HostBufferSemantics::ImmutableOnlyDuringCall, HostBufferSemantics::ImmutableUntilTransferCompletes] {
        let us = per_iter_us(n, || {
            let buf = client.buffer_from_host_with(&h2d, ElementType::F32, &[2, 3], None, dev, sem).unwrap();
            drop(buf);
        });
        println!("h2d 24 B {sem:?}: {us:8.2} us");
    }
    let strides = [12i64, 4];
    let us = per_iter_us(n, || {
        drop(client.buffer_from_host(&h2d, ElementType::F32, &[2, 3], Some(&strides), dev).unwrap());
    });
    println!("h2d 24 B with byte_strides:      {us:8.2} us");

    let src = client.buffer_from_host(&h2d, ElementType::F32, &[2, 3], None, dev)?;
    let mut host = vec![0u8; 24];
    let us = per_iter_us(n, || src.to_host(&mut host).unwrap());
    println!("d2h 24 B:                        {us:8.2} us");

    let big = vec![0u8; 4 << 20];
    let us = per_iter_us(200, || {
        drop(client.buffer_from_host(&big, ElementType::F32, &[1 << 20], None, dev).unwrap());
    });
    println!("h2d 4 MiB:                       {us:8.2} us");
    let src = client.buffer_from_host(&big, ElementType::F32, &[1 << 20], None, dev)?;
    let mut host = vec![0u8; 4 << 20];
    let us = per_iter_us(200, || src.to_host(&mut host).unwrap());
    println!("d2h 4 MiB:                       {us:8.2} us");

    Ok(())
}
