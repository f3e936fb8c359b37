//! view::read and view::write against a host reference, run on the CPU plugin.
use engine::view::{self, Geometry};
use lowerings::{Cx, DType};
use stablehlo::{ElemType, TensorType};

fn client() -> Option<pjrt::Client> {
    let path = std::env::var("PJRT_CPU_PLUGIN").unwrap_or_else(|_| {
        "/work/venv/lib/python3.11/site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so".to_string()
    });
    if !std::path::Path::new(&path).exists() {
        assert!(std::env::var_os("TORCHTPU_REQUIRE_PLUGINS").is_none(), "no CPU plugin at {path}");
        eprintln!("skipping: no CPU plugin at {path}");
        return None;
    }
    let plugin = pjrt::Plugin::load(&path).unwrap();
    Some(pjrt::Client::new(&plugin, &[]).unwrap())
}

/// Runs a one-input program on `base` (f32 values 0..n) and returns its f32 output.
fn run(client: &pjrt::Client, base_dims: &[i64], build: impl FnOnce(&mut Cx, stablehlo::Value) -> stablehlo::Value) -> Vec<f32> {
    let mut cx = Cx::new();
    let p = cx.param(TensorType { elem: ElemType::F32, dims: base_dims.to_vec() });
    let out = build(&mut cx, p);
    assert_eq!(cx.dtype(out), DType::F32);
    let text = cx.b.finish(&[out]);
    let exe = client.compile(&text, &pjrt::compile_options_proto(1, 1)).unwrap();
    let n: i64 = base_dims.iter().product();
    let data: Vec<u8> = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let dev = &client.addressable_devices()[0];
    let buf = client.buffer_from_host(&data, pjrt::ElementType::F32, base_dims, None, dev).unwrap();
    let outs = exe.execute(&[&buf], dev).unwrap();
    let mut host = vec![0u8; outs[0].dims().unwrap().iter().product::<i64>() as usize * 4];
    outs[0].to_host(&mut host).unwrap();
    host.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// The elements of a view of 0..n, computed on the host.
fn reference(g: &Geometry) -> Vec<f32> {
    let n = g.sizes.len();
    let total: i64 = g.sizes.iter().product();
    (0..total)
        .map(|mut flat| {
            let mut off = g.offset;
            for d in (0..n).rev() {
                off += (flat % g.sizes[d]) * g.strides[d];
                flat /= g.sizes[d];
            }
            off as f32
        })
        .collect()
}

const CASES: &[(&[i64], &[i64], i64)] = &[
    (&[4, 6], &[6, 1], 0),     // the whole base
    (&[6, 4], &[1, 6], 0),     // transposed
    (&[2, 6], &[6, 1], 6),     // rows 1..3
    (&[4, 3], &[6, 2], 1),     // stepped columns
    (&[4, 6, 3], &[6, 1, 0], 0), // expanded
    (&[3], &[7], 2),           // a diagonal
    (&[], &[], 5),             // one element
    (&[0, 6], &[6, 1], 0),     // empty
];

#[test]
fn read_matches_host_reference() {
    let Some(client) = client() else { return };
    for &(sizes, strides, offset) in CASES {
        let g = Geometry { sizes, strides, offset };
        let got = run(&client, &[4, 6], |cx, base| view::read(cx, base, &g));
        assert_eq!(got, reference(&g), "view {g:?}");
    }
}

#[test]
fn write_replaces_exactly_the_view() {
    let Some(client) = client() else { return };
    for &(sizes, strides, offset) in CASES {
        if strides.contains(&0) {
            continue; // writes through expanded views are undefined in PyTorch too
        }
        let g = Geometry { sizes, strides, offset };
        let got = run(&client, &[4, 6], |cx, base| {
            let v = cx.full(-1.0, DType::F32, sizes);
            let nb = view::write(cx, base, &g, v);
            cx.reshape(nb, &[24])
        });
        let mut want: Vec<f32> = (0..24).map(|i| i as f32).collect();
        if g.covers(24) {
            want = vec![-1.0; 24];
        } else {
            for idx in reference(&g) {
                want[idx as usize] = -1.0;
            }
        }
        assert_eq!(got, want, "view {g:?}");
    }
}
