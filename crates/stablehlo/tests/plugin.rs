//! Compiles and runs printed modules on the XLA CPU PJRT plugin, proving the
//! syntax of every op kind the builder prints and checking the numbers.
//! Skips (with a message) when the plugin is absent.

use stablehlo::*;
use std::sync::OnceLock;
use ElemType::*;

const PLUGIN: &str = "/work/venv/lib/python3.11/site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so";

fn client() -> Option<&'static pjrt::Client> {
    static CLIENT: OnceLock<Option<pjrt::Client>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            let path = std::env::var("PJRT_CPU_PLUGIN").unwrap_or_else(|_| PLUGIN.to_string());
            if !std::path::Path::new(&path).exists() {
                assert!(std::env::var_os("TORCHTPU_REQUIRE_PLUGINS").is_none(), "no CPU PJRT plugin at {path}");
                eprintln!("skipping plugin tests: no CPU PJRT plugin at {path} (set PJRT_CPU_PLUGIN)");
                return None;
            }
            let plugin = pjrt::Plugin::load(&path).expect("load CPU plugin");
            Some(pjrt::Client::new(&plugin, &[]).expect("create CPU client"))
        })
        .as_ref()
}

fn pjrt_type(e: ElemType) -> pjrt::ElementType {
    use pjrt::ElementType as P;
    match e {
        Pred => P::Pred,
        I8 => P::S8,
        I16 => P::S16,
        I32 => P::S32,
        I64 => P::S64,
        U8 | F4E2M1FNX2 => P::U8,
        U16 => P::U16,
        U32 => P::U32,
        U64 => P::U64,
        F16 => P::F16,
        BF16 => P::BF16,
        F32 => P::F32,
        F64 => P::F64,
        C64 => P::C64,
        C128 => P::C128,
        F8E4M3FN => P::F8E4M3FN,
        F8E5M2 => P::F8E5M2,
        F8E4M3FNUZ => P::F8E4M3FNUZ,
        F8E5M2FNUZ => P::F8E5M2FNUZ,
        F8E8M0FNU => P::F8E8M0FNU,
    }
}

/// Host bytes of a tensor.
struct Host {
    ty: TensorType,
    bytes: Vec<u8>,
}

impl Host {
    fn f32(&self) -> Vec<f32> {
        assert!(self.ty.elem == F32 || self.ty.elem == C64, "{} is not f32", self.ty);
        self.bytes.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    }
    fn f64(&self) -> Vec<f64> {
        assert!(self.ty.elem == F64 || self.ty.elem == C128, "{} is not f64", self.ty);
        self.bytes.chunks(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect()
    }
    fn i32(&self) -> Vec<i32> {
        assert_eq!(self.ty.elem.byte_size(), 4, "{}", self.ty);
        self.bytes.chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect()
    }
    fn i64(&self) -> Vec<i64> {
        assert_eq!(self.ty.elem.byte_size(), 8, "{}", self.ty);
        self.bytes.chunks(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()
    }
    fn u16(&self) -> Vec<u16> {
        assert_eq!(self.ty.elem.byte_size(), 2, "{}", self.ty);
        self.bytes.chunks(2).map(|c| u16::from_le_bytes(c.try_into().unwrap())).collect()
    }
    fn bools(&self) -> Vec<bool> {
        assert_eq!(self.ty.elem, Pred);
        self.bytes.iter().map(|&b| b != 0).collect()
    }
}

fn f32s(dims: &[i64], xs: &[f32]) -> Host {
    Host { ty: TensorType::new(F32, dims), bytes: xs.iter().flat_map(|x| x.to_le_bytes()).collect() }
}
fn i32s(dims: &[i64], xs: &[i32]) -> Host {
    Host { ty: TensorType::new(I32, dims), bytes: xs.iter().flat_map(|x| x.to_le_bytes()).collect() }
}
fn i64s(dims: &[i64], xs: &[i64]) -> Host {
    Host { ty: TensorType::new(I64, dims), bytes: xs.iter().flat_map(|x| x.to_le_bytes()).collect() }
}
fn u8s(dims: &[i64], xs: &[u8]) -> Host {
    Host { ty: TensorType::new(U8, dims), bytes: xs.to_vec() }
}

/// Adds one param per arg, lets `f` build the body, then compiles the module
/// on the plugin, runs it and returns the outputs. None when there is no plugin.
fn run(args: &[Host], f: impl FnOnce(&mut Builder, &[Value]) -> Vec<Value>) -> Option<Vec<Host>> {
    let client = client()?;
    let mut b = Builder::new();
    let params: Vec<Value> = args.iter().map(|a| b.param(a.ty.clone())).collect();
    let outs = f(&mut b, &params);
    let out_types: Vec<TensorType> = outs.iter().map(|&v| b.ty(v).clone()).collect();
    let text = b.finish(&outs);
    let exe = client
        .compile(&text, &pjrt::compile_options_proto(1, 1))
        .unwrap_or_else(|e| panic!("compile failed: {e}\n{text}"));
    let dev = &client.addressable_devices()[0];
    let bufs: Vec<pjrt::Buffer> = args
        .iter()
        .map(|a| client.buffer_from_host(&a.bytes, pjrt_type(a.ty.elem), &a.ty.dims, None, dev).unwrap())
        .collect();
    let refs: Vec<&pjrt::Buffer> = bufs.iter().collect();
    let results = exe.execute(&refs, dev).unwrap_or_else(|e| panic!("execute failed: {e}\n{text}"));
    assert_eq!(results.len(), out_types.len());
    Some(
        results
            .iter()
            .zip(out_types)
            .map(|(buf, ty)| {
                let mut bytes = vec![0u8; ty.num_elements() as usize * ty.elem.byte_size()];
                buf.to_host(&mut bytes).unwrap();
                Host { ty, bytes }
            })
            .collect(),
    )
}

fn close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= 2e-6 * w.abs().max(1.0);
        assert!(ok, "{what}[{i}]: got {g}, want {w} (all: {got:?})");
    }
}

#[test]
fn float_elementwise() {
    let x = [0.5f32, 1.5, -2.5, 3.25];
    let y = [2.0f32, -0.5, 1.5, 4.0];
    type Op = (&'static str, fn(&mut Builder, Value, Value) -> Value, fn(f32, f32) -> f32);
    let ops: Vec<Op> = vec![
        ("add", |b, x, y| b.add(x, y), |x, y| x + y),
        ("sub", |b, x, y| b.sub(x, y), |x, y| x - y),
        ("mul", |b, x, y| b.mul(x, y), |x, y| x * y),
        ("div", |b, x, y| b.div(x, y), |x, y| x / y),
        ("rem", |b, x, y| b.rem(x, y), |x, y| x % y),
        ("pow", |b, x, y| { let a = b.abs(x); b.pow(a, y) }, |x, y| x.abs().powf(y)),
        ("max", |b, x, y| b.max(x, y), f32::max),
        ("min", |b, x, y| b.min(x, y), f32::min),
        ("atan2", |b, x, y| b.atan2(x, y), f32::atan2),
        ("neg", |b, x, _| b.neg(x), |x, _| -x),
        ("abs", |b, x, _| b.abs(x), |x, _| x.abs()),
        ("exp", |b, x, _| b.exp(x), |x, _| x.exp()),
        ("exp2", |b, x, _| b.exp2(x), |x, _| x.exp2()),
        ("expm1", |b, x, _| b.expm1(x), |x, _| x.exp_m1()),
        ("log", |b, x, _| { let a = b.abs(x); b.log(a) }, |x, _| x.abs().ln()),
        ("log1p", |b, x, _| { let a = b.abs(x); b.log1p(a) }, |x, _| x.abs().ln_1p()),
        ("sqrt", |b, x, _| { let a = b.abs(x); b.sqrt(a) }, |x, _| x.abs().sqrt()),
        ("rsqrt", |b, x, _| { let a = b.abs(x); b.rsqrt(a) }, |x, _| 1.0 / x.abs().sqrt()),
        ("cbrt", |b, x, _| b.cbrt(x), |x, _| x.cbrt()),
        ("sin", |b, x, _| b.sin(x), |x, _| x.sin()),
        ("cos", |b, x, _| b.cos(x), |x, _| x.cos()),
        ("tan", |b, x, _| b.tan(x), |x, _| x.tan()),
        ("tanh", |b, x, _| b.tanh(x), |x, _| x.tanh()),
        ("logistic", |b, x, _| b.logistic(x), |x, _| 1.0 / (1.0 + (-x).exp())),
        ("sign", |b, x, _| b.sign(x), |x, _| x.signum()),
        ("floor", |b, x, _| b.floor(x), |x, _| x.floor()),
        ("ceil", |b, x, _| b.ceil(x), |x, _| x.ceil()),
        ("round_even", |b, x, _| b.round_nearest_even(x), |x, _| x.round_ties_even()),
        ("round_afz", |b, x, _| b.round_nearest_afz(x), |x, _| x.round()),
        ("chlo.tan", |b, x, _| b.chlo("tan", &[x]), |x, _| x.tan()),
        ("clamp", |b, x, y| { let lo = b.constant_f64(-1.0, F32); b.clamp(lo, x, y) }, |x, y| x.max(-1.0).min(y)),
        ("select", |b, x, y| { let p = b.compare(CmpDir::Gt, x, y); b.select(p, x, y) }, f32::max),
    ];
    let out = run(&[f32s(&[4], &x), f32s(&[4], &y)], |b, p| ops.iter().map(|(_, f, _)| f(b, p[0], p[1])).collect());
    let Some(out) = out else { return };
    for ((name, _, reference), got) in ops.iter().zip(&out) {
        let want: Vec<f32> = x.iter().zip(&y).map(|(&a, &c)| reference(a, c)).collect();
        close(&got.f32(), &want, name);
    }
}

#[test]
fn compare_select_and_predicates() {
    let x = [1.0f32, f32::NAN, -0.0, f32::INFINITY];
    let y = [2.0f32, f32::NAN, 0.0, 1.0];
    let out = run(&[f32s(&[4], &x), f32s(&[4], &y), u8s(&[2], &[200, 1]), u8s(&[2], &[100, 2])], |b, p| {
        let lt = b.compare(CmpDir::Lt, p[0], p[1]);
        let eq = b.compare(CmpDir::Eq, p[0], p[1]);
        let total_eq = b.compare_total(CmpDir::Eq, p[0], p[1]);
        let finite = b.is_finite(p[0]);
        let ult = b.compare(CmpDir::Lt, p[2], p[3]);
        let t = b.constant_bool(true);
        let pick = b.select(t, p[2], p[3]); // 0-d predicate
        let any = b.or(lt, finite);
        let both = b.and(lt, finite);
        let nlt = b.not(lt);
        let x = b.xor(lt, eq);
        vec![lt, eq, total_eq, finite, ult, pick, any, both, nlt, x]
    });
    let Some(out) = out else { return };
    assert_eq!(out[0].bools(), [true, false, false, false]);
    assert_eq!(out[1].bools(), [false, false, true, false]); // NaN != NaN, -0 == 0
    assert_eq!(out[2].bools(), [false, true, false, false]); // total order: NaN == NaN, -0 != 0
    assert_eq!(out[3].bools(), [true, false, true, false]);
    assert_eq!(out[4].bools(), [false, true]); // unsigned: 200 > 100
    assert_eq!(out[5].bytes, [200, 1]);
    assert_eq!(out[6].bools(), [true, false, true, false]);
    assert_eq!(out[7].bools(), [true, false, false, false]);
    assert_eq!(out[8].bools(), [false, true, true, true]);
    assert_eq!(out[9].bools(), [true, false, true, false]);
}

#[test]
fn integer_ops_and_conversions() {
    let a = [7i32, -8, 5, -1];
    let c = [2i32, 3, 1, 4];
    let out = run(&[i32s(&[4], &a), i32s(&[4], &c), f32s(&[2], &[1.0, -2.75])], |b, p| {
        let (a, c, f) = (p[0], p[1], p[2]);
        let to_u8 = b.bitcast_convert(f, U8);
        let back = b.bitcast_convert(to_u8, F32);
        let lt = b.compare(CmpDir::Lt, a, c);
        vec![
            b.div(a, c),
            b.rem(a, c),
            b.and(a, c),
            b.or(a, c),
            b.xor(a, c),
            b.shift_left(a, c),
            b.shift_right_arithmetic(a, c),
            b.shift_right_logical(a, c),
            b.popcnt(a),
            b.count_leading_zeros(a),
            b.not(a),
            b.neg(a),
            b.abs(a),
            b.sign(a),
            b.max(a, c),
            b.pow(c, c),
            lt,
            b.convert(f, I32),
            b.convert(a, F32),
            b.bitcast_convert(f, I32),
            to_u8,
            back,
            b.convert(a, I64),
        ]
    });
    let Some(out) = out else { return };
    assert_eq!(out[0].i32(), [3, -2, 5, 0]);
    assert_eq!(out[1].i32(), [1, -2, 0, -1]);
    assert_eq!(out[2].i32(), [2, 0, 1, 4]);
    assert_eq!(out[3].i32(), [7, -5, 5, -1]);
    assert_eq!(out[4].i32(), [5, -5, 4, -5]);
    assert_eq!(out[5].i32(), [28, -64, 10, -16]);
    assert_eq!(out[6].i32(), [1, -1, 2, -1]);
    assert_eq!(out[7].i32(), [1, (-8i32 as u32 >> 3) as i32, 2, (u32::MAX >> 4) as i32]);
    assert_eq!(out[8].i32(), [3, 29, 2, 32]);
    assert_eq!(out[9].i32(), [29, 0, 29, 0]);
    assert_eq!(out[10].i32(), [!7, !-8, !5, !-1]);
    assert_eq!(out[11].i32(), [-7, 8, -5, 1]);
    assert_eq!(out[12].i32(), [7, 8, 5, 1]);
    assert_eq!(out[13].i32(), [1, -1, 1, -1]);
    assert_eq!(out[14].i32(), [7, 3, 5, 4]);
    assert_eq!(out[15].i32(), [4, 27, 1, 256]);
    assert_eq!(out[16].bools(), [false, true, false, true]);
    assert_eq!(out[17].i32(), [1, -2]); // truncation toward zero
    assert_eq!(out[18].f32(), [7.0, -8.0, 5.0, -1.0]);
    assert_eq!(out[19].i32(), [0x3F80_0000, (-2.75f32).to_bits() as i32]);
    assert_eq!(out[20].ty, TensorType::new(U8, &[2, 4]));
    assert_eq!(out[20].bytes[..4], 1.0f32.to_le_bytes());
    assert_eq!(out[21].f32(), [1.0, -2.75]);
    assert_eq!(out[22].i64(), [7, -8, 5, -1]);
}

#[test]
fn complex_and_small_floats() {
    let out = run(&[f32s(&[2], &[3.0, 0.0]), f32s(&[2], &[4.0, 1.0])], |b, p| {
        let z = b.complex(p[0], p[1]);
        let zz = b.mul(z, z);
        let bf = b.convert(p[0], BF16);
        let bf2 = b.add(bf, bf);
        let h = b.convert(p[1], F16);
        let hh = b.exp(h);
        let d = b.convert(p[1], F64);
        let dd = b.sqrt(d);
        vec![b.abs(z), b.real(zz), b.imag(zz), zz, bf2, hh, dd]
    });
    let Some(out) = out else { return };
    assert_eq!(out[0].f32(), [5.0, 1.0]);
    assert_eq!(out[1].f32(), [-7.0, -1.0]); // (3+4i)^2 = -7+24i ; i^2 = -1
    assert_eq!(out[2].f32(), [24.0, 0.0]);
    assert_eq!(out[3].f32(), [-7.0, 24.0, -1.0, 0.0]);
    assert_eq!(out[4].u16(), [0x40C0, 0x0000]); // bf16 6.0
    let e = out[5].u16(); // f16 exp(4) = 54.6, exp(1) = 2.718
    assert_eq!(e, [0x52D3, 0x4170]);
    assert_eq!(out[6].f64(), [2.0, 1.0]);
}

#[test]
fn constants_round_trip() {
    let out = run(&[], |b, _| {
        vec![
            b.constant_f64(f64::NAN, F32),
            b.constant_f64(f64::INFINITY, F32),
            b.constant_f64(f64::NEG_INFINITY, F32),
            b.constant_f64(-0.0, F32),
            b.constant_f64(0.1, F32),
            b.constant_f64(1e-300, F64),
            b.constant_f64(0.1, F64),
            b.constant_f64(0.1, BF16),
            b.constant_f64(1.0 / 3.0, F16),
            b.constant_f64(f64::NEG_INFINITY, F16),
            b.constant_i64(i64::MIN, I64),
            b.constant_i64(-1, U32),
            b.constant_f64(-3.9, I8),
            b.constant_bool(true),
            b.constant_complex(1.5, -2.0, C64),
            b.splat_f64(2.5, &TensorType::new(F32, &[2, 3])),
            b.constant_array_i64(&[1, 2, 3, 4, 5, 6], &[2, 3], I32),
            b.constant_array_f64(&[0.5, f64::INFINITY, f64::NAN], &[3], F32),
            b.splat_f64(1.0, &TensorType::new(F32, &[0, 3])),
            b.constant_f64(448.0, F8E4M3FN),
            b.constant_f64(-0.3, F8E5M2),
            b.constant_f64(f64::NAN, BF16),
            b.constant_i64(-1, U64),
            b.constant_f64(f64::MAX, F64),
            b.constant_f64(f32::MIN_POSITIVE as f64 / 8.0, F32), // subnormal
        ]
    });
    let Some(out) = out else { return };
    assert!(out[0].f32()[0].is_nan());
    assert_eq!(out[1].f32(), [f32::INFINITY]);
    assert_eq!(out[2].f32(), [f32::NEG_INFINITY]);
    assert_eq!(out[3].f32()[0].to_bits(), 0x8000_0000);
    assert_eq!(out[4].f32(), [0.1f32]);
    assert_eq!(out[5].f64(), [1e-300]);
    assert_eq!(out[6].f64(), [0.1]);
    assert_eq!(out[7].u16(), [0x3DCD]);
    assert_eq!(out[8].u16(), [0x3555]);
    assert_eq!(out[9].u16(), [0xFC00]);
    assert_eq!(out[10].i64(), [i64::MIN]);
    assert_eq!(out[11].i32(), [-1]);
    assert_eq!(out[12].bytes, [(-3i8) as u8]);
    assert_eq!(out[13].bytes, [1]);
    assert_eq!(out[14].f32(), [1.5, -2.0]);
    assert_eq!(out[15].f32(), [2.5; 6]);
    assert_eq!(out[16].i32(), [1, 2, 3, 4, 5, 6]);
    let v = out[17].f32();
    assert!(v[0] == 0.5 && v[1] == f32::INFINITY && v[2].is_nan());
    assert!(out[18].bytes.is_empty());
    assert_eq!(out[19].bytes, [0x7E]);
    assert_eq!(out[20].bytes, [0xB5]);
    assert_eq!(out[21].u16()[0] & 0x7FC0, 0x7FC0);
    assert_eq!(out[22].i64(), [-1]);
    assert_eq!(out[23].f64(), [f64::MAX]);
    assert_eq!(out[24].f32(), [f32::MIN_POSITIVE / 8.0]);
}

#[test]
fn shape_ops() {
    let x: Vec<f32> = (0..6).map(|i| i as f32).collect();
    let out = run(&[f32s(&[2, 3], &x), f32s(&[2], &[10.0, 20.0]), f32s(&[3], &[1.0, 2.0, 3.0])], |b, p| {
        let x = p[0];
        let i1 = b.constant_i64(1, I32);
        let i0 = b.constant_i64(0, I32);
        let nine = b.splat_f64(9.0, &TensorType::new(F32, &[1, 2]));
        let m1 = b.constant_f64(-1.0, F32);
        vec![
            b.transpose(x, &[1, 0]),
            b.reshape(x, &[3, 2]),
            b.broadcast_in_dim(p[1], &[2, 3], &[0]),
            b.broadcast_to(p[2], &[2, 3]),
            b.slice(x, &[0, 1], &[2, 3], &[1, 2]),
            b.dynamic_slice(x, &[i1, i1], &[1, 2]),
            b.dynamic_update_slice(x, nine, &[i0, i1]),
            b.concatenate(&[x, x], 1),
            b.pad(x, m1, &[1, 0], &[0, -1], &[0, 1]),
            b.iota(&TensorType::new(I32, &[2, 3]), 1),
            b.reverse(x, &[1]),
            b.broadcast_to(m1, &[2, 2]),
        ]
    });
    let Some(out) = out else { return };
    assert_eq!(out[0].f32(), [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    assert_eq!(out[1].f32(), x);
    assert_eq!(out[2].f32(), [10.0, 10.0, 10.0, 20.0, 20.0, 20.0]);
    assert_eq!(out[3].f32(), [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
    assert_eq!(out[4].f32(), [1.0, 4.0]);
    assert_eq!(out[5].f32(), [4.0, 5.0]);
    assert_eq!(out[6].f32(), [0.0, 9.0, 9.0, 3.0, 4.0, 5.0]);
    assert_eq!(out[7].f32(), [0.0, 1.0, 2.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 3.0, 4.0, 5.0]);
    assert_eq!(out[8].ty.dims, [3, 4]);
    assert_eq!(out[8].f32(), [-1.0, -1.0, -1.0, -1.0, 0.0, -1.0, 1.0, -1.0, 3.0, -1.0, 4.0, -1.0]);
    assert_eq!(out[9].i32(), [0, 1, 2, 0, 1, 2]);
    assert_eq!(out[10].f32(), [2.0, 1.0, 0.0, 5.0, 4.0, 3.0]);
    assert_eq!(out[11].f32(), [-1.0; 4]);
}

#[test]
fn gather_and_scatter() {
    let table: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let args = [
        f32s(&[4, 3], &table),
        i64s(&[2, 1], &[2, 0]),
        i32s(&[2, 2, 1], &[2, 0, 1, 1]),
        f32s(&[2, 3], &[1.0; 6]),
        i64s(&[2, 1], &[1, 1]),
    ];
    let out = run(&args, |b, p| {
        // Row lookup (embedding).
        let rows = GatherDims {
            offset_dims: vec![1],
            collapsed_slice_dims: vec![0],
            start_index_map: vec![0],
            index_vector_dim: 1,
            ..Default::default()
        };
        let g1 = b.gather(p[0], p[1], &rows, &[1, 3], false);
        // torch.gather(x[:2], 1, idx): batching dims pair operand dim 0 with index dim 0.
        let x2 = b.slice(p[0], &[0, 0], &[2, 3], &[1, 1]);
        let along = GatherDims {
            offset_dims: vec![],
            collapsed_slice_dims: vec![1],
            operand_batching_dims: vec![0],
            start_indices_batching_dims: vec![0],
            start_index_map: vec![1],
            index_vector_dim: 2,
        };
        let g2 = b.gather(x2, p[2], &along, &[1, 1], false);
        // index_add_ of two rows of ones into row 1.
        let sdn = ScatterDims {
            update_window_dims: vec![1],
            inserted_window_dims: vec![0],
            scatter_dims_to_operand_dims: vec![0],
            index_vector_dim: 1,
            ..Default::default()
        };
        let s = b.scatter(p[0], p[4], p[3], &sdn, |b, cur, upd| b.add(cur, upd));
        vec![g1, g2, s]
    });
    let Some(out) = out else { return };
    assert_eq!(out[0].f32(), [6.0, 7.0, 8.0, 0.0, 1.0, 2.0]);
    assert_eq!(out[1].f32(), [2.0, 0.0, 4.0, 4.0]);
    let mut want = table.clone();
    for w in &mut want[3..6] {
        *w += 2.0;
    }
    assert_eq!(out[2].f32(), want);
}

/// Direct NCHW/OIHW convolution reference with stride, padding, kernel dilation and groups.
#[allow(clippy::too_many_arguments)]
fn conv_ref(
    x: &[f32],
    xd: [usize; 4],
    w: &[f32],
    wd: [usize; 4],
    stride: usize,
    pad: usize,
    dil: usize,
    groups: usize,
) -> (Vec<f32>, [usize; 4]) {
    let [n, c, h, wi] = xd;
    let [o, ci, kh, kw] = wd;
    let oh = (h + 2 * pad - (dil * (kh - 1) + 1)) / stride + 1;
    let ow = (wi + 2 * pad - (dil * (kw - 1) + 1)) / stride + 1;
    let mut out = vec![0.0; n * o * oh * ow];
    for b in 0..n {
        for oc in 0..o {
            let g = oc / (o / groups);
            for y in 0..oh {
                for xx in 0..ow {
                    let mut s = 0.0;
                    for ic in 0..ci {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (y * stride + ky * dil) as isize - pad as isize;
                                let ix = (xx * stride + kx * dil) as isize - pad as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= wi as isize {
                                    continue;
                                }
                                let cin = g * ci + ic;
                                s += x[((b * c + cin) * h + iy as usize) * wi + ix as usize]
                                    * w[((oc * ci + ic) * kh + ky) * kw + kx];
                            }
                        }
                    }
                    out[((b * o + oc) * oh + y) * ow + xx] = s;
                }
            }
        }
    }
    (out, [n, o, oh, ow])
}

#[test]
fn dot_general_and_convolution() {
    let l: Vec<f32> = (0..12).map(|i| i as f32 * 0.5).collect();
    let r: Vec<f32> = (0..12).map(|i| 1.0 - i as f32 * 0.25).collect();
    let x: Vec<f32> = (0..2 * 4 * 5 * 5).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
    let w: Vec<f32> = (0..6 * 2 * 3 * 3).map(|i| ((i * 5) % 7) as f32 - 3.0).collect();
    let args = [f32s(&[2, 2, 3], &l), f32s(&[2, 3, 2], &r), f32s(&[2, 4, 5, 5], &x), f32s(&[6, 2, 3, 3], &w)];
    let out = run(&args, |b, p| {
        let d = b.dot_general(p[0], p[1], &[0], &[0], &[2], &[1], F32);
        b.set_precision(Some(Precision::Highest));
        // Plain matmul of the first batch: [2,3] x [3,2].
        let l0 = b.slice(p[0], &[0, 0, 0], &[1, 2, 3], &[1, 1, 1]);
        let l0 = b.reshape(l0, &[2, 3]);
        let r0 = b.slice(p[1], &[0, 0, 0], &[1, 3, 2], &[1, 1, 1]);
        let r0 = b.reshape(r0, &[3, 2]);
        let m = b.dot_general(l0, r0, &[], &[], &[1], &[0], F32);
        let c1 = b.convolution(p[2], p[3], &[1, 1], &[(0, 0), (0, 0)], &[], &[], &ConvDims::nchw(2), 2, 1, F32);
        let c2 = b.convolution(p[2], p[3], &[2, 2], &[(1, 1), (1, 1)], &[1, 1], &[2, 2], &ConvDims::nchw(2), 2, 1, F32);
        vec![d, m, c1, c2]
    });
    let Some(out) = out else { return };
    let mut want = vec![0.0f32; 8];
    for bt in 0..2 {
        for i in 0..2 {
            for j in 0..2 {
                want[bt * 4 + i * 2 + j] = (0..3).map(|k| l[bt * 6 + i * 3 + k] * r[bt * 6 + k * 2 + j]).sum();
            }
        }
    }
    close(&out[0].f32(), &want, "dot_general batched");
    close(&out[1].f32(), &want[..4], "dot_general matmul");
    let (c1, d1) = conv_ref(&x, [2, 4, 5, 5], &w, [6, 2, 3, 3], 1, 0, 1, 2);
    assert_eq!(out[2].ty.dims.iter().map(|&d| d as usize).collect::<Vec<_>>(), d1);
    close(&out[2].f32(), &c1, "conv");
    let (c2, d2) = conv_ref(&x, [2, 4, 5, 5], &w, [6, 2, 3, 3], 2, 1, 2, 2);
    assert_eq!(out[3].ty.dims.iter().map(|&d| d as usize).collect::<Vec<_>>(), d2);
    close(&out[3].f32(), &c2, "conv strided dilated padded");
}

#[test]
fn reductions_pooling_and_sort() {
    let x: Vec<f32> = vec![1.0, 5.0, 2.0, 0.0, 3.0, 4.0, 9.0, 1.0, 6.0, 2.0, 7.0, 8.0, 0.5, 1.5, 2.5, 3.5];
    let out = run(&[f32s(&[4, 4], &x), f32s(&[5], &[3.0, 1.0, 2.0, 1.0, 0.0])], |b, p| {
        let x = p[0];
        let zero = b.constant_f64(0.0, F32);
        let sum = b.reduce(&[x], &[zero], &[1], |b, a| vec![b.add(a[0], a[1])]);
        // argmax over dim 1 with a variadic reduce (ties pick the lower index).
        let idx = b.iota(&TensorType::new(I32, &[4, 4]), 1);
        let ninf = b.constant_f64(f64::NEG_INFINITY, F32);
        let z = b.constant_i64(0, I32);
        let am = b.reduce(&[x, idx], &[ninf, z], &[1], |b, a| {
            let gt = b.compare(CmpDir::Gt, a[2], a[0]);
            let eq = b.compare(CmpDir::Eq, a[2], a[0]);
            let lower = b.compare(CmpDir::Lt, a[3], a[1]);
            let tie = b.and(eq, lower);
            let take = b.or(gt, tie);
            vec![b.select(take, a[2], a[0]), b.select(take, a[3], a[1])]
        });
        let pool = b.reduce_window(&[x], &[ninf], &[2, 2], &[2, 2], &[], &[], &[], |b, a| vec![b.max(a[0], a[1])]);
        // 1-d sum pool, window 3, padding 1 each side.
        let spool = b.reduce_window(&[p[1]], &[zero], &[3], &[1], &[], &[], &[(1, 1)], |b, a| vec![b.add(a[0], a[1])]);
        let ones = b.splat_f64(1.0, &TensorType::new(F32, &[2, 2]));
        let grad = b.select_and_scatter(
            x,
            ones,
            zero,
            &[2, 2],
            &[2, 2],
            &[],
            |b, a, c| b.compare(CmpDir::Ge, a, c),
            |b, a, c| b.add(a, c),
        );
        let pos = b.iota(&TensorType::new(I32, &[5]), 0);
        let sorted = b.sort(&[p[1], pos], 0, true, |b, a| b.compare(CmpDir::Gt, a[0], a[1]));
        vec![sum[0], am[0], am[1], pool[0], spool[0], grad, sorted[0], sorted[1]]
    });
    let Some(out) = out else { return };
    assert_eq!(out[0].f32(), [8.0, 17.0, 23.0, 8.0]);
    assert_eq!(out[1].f32(), [5.0, 9.0, 8.0, 3.5]);
    assert_eq!(out[2].i32(), [1, 2, 3, 3]);
    assert_eq!(out[3].f32(), [5.0, 9.0, 6.0, 8.0]);
    assert_eq!(out[4].f32(), [4.0, 6.0, 4.0, 3.0, 1.0]);
    let mut g = vec![0.0f32; 16];
    for i in [1, 6, 8, 11] {
        g[i] = 1.0;
    }
    assert_eq!(out[5].f32(), g);
    assert_eq!(out[6].f32(), [3.0, 2.0, 1.0, 1.0, 0.0]);
    assert_eq!(out[7].i32(), [0, 2, 1, 3, 4]); // stable: equal 1.0s keep order
}

#[test]
fn chlo_ops() {
    let out = run(&[f32s(&[1], &[0.5]), f32s(&[1], &[4.5]), f32s(&[1], &[1.0]), f32s(&[5], &[3.0, 9.0, 1.0, 7.0, 5.0])], |b, p| {
        let two = b.splat_f64(2.0, &TensorType::new(F32, &[1]));
        let (vals, idx) = b.top_k(p[3], 2);
        vec![
            b.chlo("erf", &[p[0]]),
            b.chlo("erf_inv", &[p[0]]),
            b.chlo("lgamma", &[p[1]]),
            b.chlo("digamma", &[p[2]]),
            b.chlo("next_after", &[p[2], two]),
            b.chlo("polygamma", &[p[2], p[2]]),
            b.chlo("zeta", &[two, p[2]]),
            b.chlo("bessel_i1e", &[p[2]]),
            b.chlo_typed("is_inf", &[p[0]], TensorType::new(Pred, &[1])),
            vals,
            idx,
        ]
    });
    let Some(out) = out else { return };
    let pi2_6 = std::f32::consts::PI * std::f32::consts::PI / 6.0;
    close(&out[0].f32(), &[0.520_499_9], "erf");
    close(&out[1].f32(), &[0.476_936_28], "erf_inv");
    close(&out[2].f32(), &[2.453_736_6], "lgamma");
    close(&out[3].f32(), &[-0.577_215_7], "digamma");
    assert_eq!(out[4].f32(), [1.0 + f32::EPSILON]);
    close(&out[5].f32(), &[pi2_6], "polygamma");
    close(&out[6].f32(), &[pi2_6], "zeta");
    close(&out[7].f32(), &[0.207_910_4], "bessel_i1e");
    assert_eq!(out[8].bools(), [false]);
    assert_eq!(out[9].f32(), [9.0, 7.0]);
    assert_eq!(out[10].i32(), [1, 3]);
}

#[test]
fn rng_while_collective_and_escape_hatch() {
    let state = Host { ty: TensorType::new(U64, &[2]), bytes: [42u64, 7].iter().flat_map(|x| x.to_le_bytes()).collect() };
    let out = run(&[state, f32s(&[3], &[1.0, 2.0, 0.1])], |b, p| {
        let (st, bits) = b.rng_bit_generator(RngAlgorithm::ThreeFry, p[0], &TensorType::new(U32, &[64]));
        let (_, bits_default) = b.rng_bit_generator(RngAlgorithm::Default, p[0], &TensorType::new(U64, &[2, 2]));
        let i0 = b.constant_i64(0, I32);
        let looped = b.while_loop(
            &[i0, p[1]],
            |b, a| {
                let n = b.constant_i64(5, I32);
                b.compare(CmpDir::Lt, a[0], n)
            },
            |b, a| {
                let one = b.constant_i64(1, I32);
                vec![b.add(a[0], one), b.add(a[1], a[1])]
            },
        );
        let summed = b.all_reduce(p[1], &[vec![0]], None, |b, x, y| b.add(x, y));
        let half = b.custom_op(
            "stablehlo.reduce_precision",
            &[p[1]],
            "exponent_bits = 5 : i32, mantissa_bits = 10 : i32",
            &[TensorType::new(F32, &[3])],
        );
        vec![st, bits, bits_default, looped[0], looped[1], summed, half[0]]
    });
    let Some(out) = out else { return };
    assert_ne!(out[0].i64(), [42, 7], "state must advance");
    let words = out[1].i32();
    assert_eq!(words.len(), 64);
    let ones: u32 = words.iter().map(|w| w.count_ones()).sum();
    assert!((800..1250).contains(&ones), "random bits look biased: {ones} of 2048 set");
    assert_eq!(out[2].ty.dims, [2, 2]);
    assert_eq!(out[3].i32(), [5]);
    assert_eq!(out[4].f32(), [32.0, 64.0, 3.2]);
    assert_eq!(out[5].f32(), [1.0, 2.0, 0.1]);
    assert_eq!(out[6].f32(), [1.0, 2.0, 0.099_975_586]);
}

#[test]
fn donated_params_alias_outputs() {
    let Some(client) = client() else { return };
    let mut b = Builder::new();
    let x = b.param(TensorType::new(F32, &[4]));
    let y = b.param(TensorType::new(F32, &[4]));
    let s = b.add(x, y);
    let text = b.finish_with_aliases(&[s], &[(0, 0)]);
    let exe = client.compile(&text, &pjrt::compile_options_proto(1, 1)).unwrap();
    let dev = &client.addressable_devices()[0];
    let host = |v: [f32; 4]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let xb = client.buffer_from_host(&host([1.0, 2.0, 3.0, 4.0]), pjrt::ElementType::F32, &[4], None, dev).unwrap();
    let yb = client.buffer_from_host(&host([0.5; 4]), pjrt::ElementType::F32, &[4], None, dev).unwrap();
    let out = exe.execute(&[&xb, &yb], dev).unwrap();
    let mut bytes = [0u8; 16];
    out[0].to_host(&mut bytes).unwrap();
    assert_eq!(bytes, host([1.5, 2.5, 3.5, 4.5]).as_slice());
    assert!(xb.is_deleted().unwrap(), "param 0 should have been donated");
    assert!(!yb.is_deleted().unwrap());
}

#[test]
fn invalid_text_is_rejected() {
    // Guards the other tests: the plugin really parses and verifies what we print.
    let Some(client) = client() else { return };
    let mut b = Builder::new();
    let x = b.param(TensorType::new(F32, &[2]));
    let y = b.custom_op("stablehlo.no_such_op", &[x], "", &[TensorType::new(F32, &[2])]);
    let text = b.finish(&y);
    assert!(client.compile(&text, &pjrt::compile_options_proto(1, 1)).is_err());
    // A wrong result type is caught by the verifier too.
    let mut b = Builder::new();
    let x = b.param(TensorType::new(F32, &[2]));
    let y = b.custom_op("stablehlo.negate", &[x], "", &[TensorType::new(F32, &[3])]);
    let text = b.finish(&y);
    assert!(client.compile(&text, &pjrt::compile_options_proto(1, 1)).is_err());
}

#[test]
fn option_overrides_reach_the_compiler() {
    // The quick tier of eager programs: the plugin takes options by DebugOptions field name,
    // compiles with them, and refuses a name it does not know (so a typo cannot pass silently).
    let Some(client) = client() else { return };
    let mut b = Builder::new();
    let x = b.param(TensorType::new(F32, &[3]));
    let y = b.exp(x);
    let y = b.mul(y, x);
    let text = b.finish(&[y]);
    use pjrt::OptionOverride::{Bool, Int};
    let base = pjrt::compile_options_proto(1, 1);
    let quick = pjrt::with_option_overrides(&base, &[("xla_backend_optimization_level", Int(0)), ("xla_cpu_use_fusion_emitters", Bool(false))]);
    let exe = client.compile(&text, &quick).unwrap();
    let dev = &client.addressable_devices()[0];
    let xs = [0.5f32, -1.0, 2.0];
    let bytes: Vec<u8> = xs.iter().flat_map(|v| v.to_le_bytes()).collect();
    let xb = client.buffer_from_host(&bytes, pjrt::ElementType::F32, &[3], None, dev).unwrap();
    let out = exe.execute(&[&xb], dev).unwrap();
    let mut got = [0u8; 12];
    out[0].to_host(&mut got).unwrap();
    let got: Vec<f32> = got.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    close(&got, &xs.map(|v| v.exp() * v), "exp(x) * x at the quick tier");
    let bad = pjrt::with_option_overrides(&base, &[("xla_no_such_option", Int(1))]);
    assert!(client.compile(&text, &bad).is_err());
}
