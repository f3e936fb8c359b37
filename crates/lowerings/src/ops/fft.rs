//! Discrete Fourier transforms: the three aten primitives behind torch.fft (_fft_r2c, _fft_c2r,
//! _fft_c2c), each as stablehlo.fft over the trailing dims.
//!
//! torch.fft's composites (fft, ifft, rfft, irfft, hfft, ihfft, fftn, fft2, ...) pad or trim the
//! input, promote integers, and pick the normalization; they reach us with the signal dims, a
//! normalization mode (0: none, 1: 1/sqrt(n), 2: 1/n, where n is the signal size) and the
//! direction. stablehlo.fft transforms the last 1 to 3 dims: the signal dims are moved to the
//! end (in the order given: for r2c/c2r the last listed dim is the halved one), transformed in
//! groups of at most three, and moved back. XLA's inverse transforms already divide by n, so
//! the scale applied afterwards is relative to that.
use crate::args::Args;
use crate::cx::{wrap_dim, Cx};
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use stablehlo::{TensorType, Value};

pub(crate) const OPS: &[Op] = &[
    op("_fft_r2c", fft_r2c),
    op("_fft_c2r", fft_c2r),
    op("_fft_c2c", fft_c2c),
];

/// The kinds of stablehlo.fft.
#[derive(Copy, Clone, PartialEq)]
enum Kind {
    Fft,
    Ifft,
    Rfft,
    Irfft,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Fft => "FFT",
            Kind::Ifft => "IFFT",
            Kind::Rfft => "RFFT",
            Kind::Irfft => "IRFFT",
        }
    }
}

/// One stablehlo.fft over the last `lengths.len()` (1..=3) dims of `x`. `lengths` are the
/// signal lengths: the input dims for FFT/IFFT/RFFT, the real output dims for IRFFT.
fn hlo_fft(cx: &mut Cx, x: Value, kind: Kind, lengths: &[i64]) -> Value {
    assert!((1..=3).contains(&lengths.len()));
    let t = cx.ty(x).clone();
    let mut dims = t.dims.clone();
    let last = dims.len() - 1;
    let elem = match kind {
        Kind::Fft | Kind::Ifft => t.elem,
        Kind::Rfft => {
            dims[last] = lengths[lengths.len() - 1] / 2 + 1;
            t.elem.complex_of().expect("RFFT of a real input")
        }
        Kind::Irfft => {
            dims[last] = lengths[lengths.len() - 1];
            t.elem.real_type()
        }
    };
    let list = lengths.iter().map(|l| l.to_string()).collect::<Vec<_>>().join(", ");
    let attrs = format!("fft_type = #stablehlo<fft_type {}>, fft_length = array<i64: {list}>", kind.name());
    cx.custom_op("stablehlo.fft", &[x], &attrs, &[TensorType::new(elem, &dims)])[0]
}

/// The signal dims of an `_fft_*` call, wrapped and checked for repeats.
fn signal_dims(cx: &Cx, x: Value, args: &Args) -> Result<Vec<usize>> {
    let rank = cx.dims(x).len();
    let raw = args.ints("dim")?;
    let mut dims = Vec::with_capacity(raw.len());
    for d in raw {
        let w = wrap_dim(d, rank)?;
        check!(!dims.contains(&w), Runtime, "FFT dims must be unique");
        dims.push(w);
    }
    check!(!dims.is_empty() && rank > 0, Runtime, "FFT expects at least one dimension to transform");
    Ok(dims)
}

/// The permutation moving `dims` (in order) to the end, the other dims keeping theirs.
fn to_end(rank: usize, dims: &[usize]) -> Vec<i64> {
    let mut perm: Vec<i64> = (0..rank).filter(|d| !dims.contains(d)).map(|d| d as i64).collect();
    perm.extend(dims.iter().map(|&d| d as i64));
    perm
}

fn inverse(perm: &[i64]) -> Vec<i64> {
    let mut inv = vec![0i64; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p as usize] = i as i64;
    }
    inv
}

/// Complex-to-complex transform of the last `k` dims of `x`, at most three at a time (the
/// transform is separable). Unnormalized forward; inverse divided by the signal size.
fn c2c_trailing(cx: &mut Cx, x: Value, k: usize, forward: bool) -> Value {
    let rank = cx.dims(x).len();
    let kind = if forward { Kind::Fft } else { Kind::Ifft };
    let mut v = x;
    let mut done = 0;
    while done < k {
        let n = (k - done).min(3);
        // Bring dims [rank-done-n, rank-done) to the end, transform, put them back.
        let group: Vec<usize> = (rank - done - n..rank - done).collect();
        let perm = to_end(rank, &group);
        let moved = cx.transpose(v, &perm);
        let lengths = cx.dims(moved)[rank - n..].to_vec();
        let f = hlo_fft(cx, moved, kind, &lengths);
        v = cx.transpose(f, &inverse(&perm));
        done += n;
    }
    v
}

/// Multiply by the normalization of `mode` for a signal of `n` points, given that the raw
/// transform was already divided by n when `inverse_raw`.
fn normalize(cx: &mut Cx, v: Value, mode: i64, n: i64, inverse_raw: bool) -> Result<Value> {
    let want = match mode {
        0 => 1.0,
        1 => 1.0 / (n as f64).sqrt(),
        2 => 1.0 / n as f64,
        _ => crate::bail!(Runtime, "Invalid normalization mode: {}", mode),
    };
    let scale = if inverse_raw { want * n as f64 } else { want };
    if scale == 1.0 {
        return Ok(v);
    }
    let dt = cx.dtype(v);
    let s = cx.full(scale, dt, &cx.dims(v));
    Ok(cx.mul(v, s))
}

fn check_float(t: DType, op: &str) -> Result<()> {
    check!(
        matches!(t, DType::F32 | DType::F64),
        Runtime,
        "{}: expected a float32 or float64 input, got {}",
        op,
        t.torch_name()
    );
    Ok(())
}

fn check_complex(t: DType, op: &str) -> Result<()> {
    check!(
        matches!(t, DType::C64 | DType::C128),
        Runtime,
        "{}: expected a complex64 or complex128 input, got {}",
        op,
        t.torch_name()
    );
    Ok(())
}

/// _fft_c2c(self, dim, normalization, forward): complex to complex over `dim`.
fn fft_c2c(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    check_complex(x.dtype, "_fft_c2c")?;
    let dims = signal_dims(cx, x.v, args)?;
    let mode = args.int("normalization")?;
    let forward = args.bool("forward")?;
    let shape = cx.dims(x.v);
    let n: i64 = dims.iter().map(|&d| shape[d]).product();
    if shape.iter().product::<i64>() == 0 {
        return one(cx.full(0.0, x.dtype, &shape));
    }
    let perm = to_end(shape.len(), &dims);
    let moved = cx.transpose(x.v, &perm);
    let f = c2c_trailing(cx, moved, dims.len(), forward);
    let f = normalize(cx, f, mode, n, !forward)?;
    one(cx.transpose(f, &inverse(&perm)))
}

/// Complex transforms along the k dims before the last one of v (a real FFT's halved dim):
/// the halved dim is moved out of the way, the other k transformed, and it is moved back.
fn c2c_before_last(cx: &mut Cx, v: Value, k: usize, forward: bool) -> Value {
    let rank = cx.dims(v).len();
    // [.., d1, .., dk, last] -> [.., last, d1, .., dk]
    let mut rot: Vec<i64> = (0..(rank - 1 - k) as i64).collect();
    rot.push((rank - 1) as i64);
    rot.extend((rank - 1 - k) as i64..(rank - 1) as i64);
    let rotated = cx.transpose(v, &rot);
    let t = c2c_trailing(cx, rotated, k, forward);
    cx.transpose(t, &inverse(&rot))
}

/// _fft_r2c(self, dim, normalization, onesided): real to complex; onesided keeps the first
/// n/2 + 1 outputs of the last listed dim (the rest are conjugate-symmetric).
fn fft_r2c(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    check_float(x.dtype, "_fft_r2c")?;
    let dims = signal_dims(cx, x.v, args)?;
    let mode = args.int("normalization")?;
    let onesided = args.bool("onesided")?;
    let shape = cx.dims(x.v);
    let n: i64 = dims.iter().map(|&d| shape[d]).product();
    let cdt = x.dtype.to_complex();
    let last = *dims.last().unwrap();
    let mut out_shape = shape.clone();
    if onesided {
        out_shape[last] = shape[last] / 2 + 1;
    }
    if shape.iter().product::<i64>() == 0 {
        return one(cx.full(0.0, cdt, &out_shape));
    }
    let rank = shape.len();
    let perm = to_end(rank, &dims);
    let moved = cx.transpose(x.v, &perm);
    // RFFT along the last listed dim, then complex transforms along the others.
    let len = cx.dims(moved)[rank - 1];
    let mut f = hlo_fft(cx, moved, Kind::Rfft, &[len]);
    if dims.len() > 1 {
        f = c2c_before_last(cx, f, dims.len() - 1, true);
    }
    if !onesided {
        f = full_from_half(cx, f, len, dims.len());
    }
    let f = normalize(cx, f, mode, n, false)?;
    one(cx.transpose(f, &inverse(&perm)))
}

/// The full spectrum of a real signal from its onesided half along the last dim: entries past
/// n/2 are the conjugates of the mirrored entries, X[k] = conj(X[(-k) mod n]), where the other
/// signal dims (the `k_dims - 1` before the last) are mirrored too.
fn full_from_half(cx: &mut Cx, half: Value, n: i64, k_dims: usize) -> Value {
    let dims = cx.dims(half);
    let rank = dims.len();
    let h = dims[rank - 1];
    let missing = n - h;
    if missing <= 0 {
        return half;
    }
    // Entries k = h..n-1 come from j = n - k, i.e. j = n-h .. 1 (descending): slice 1..=n-h of the
    // half, reversed.
    let mut start = vec![0i64; rank];
    start[rank - 1] = 1;
    let mut limit = dims.clone();
    limit[rank - 1] = 1 + missing;
    let part = cx.slice(half, &start, &limit, &vec![1; rank]);
    let part = cx.reverse(part, &[(rank - 1) as i64]);
    // The other signal dims are mirrored as index i -> (-i) mod len: reverse then roll by one.
    let mut part = part;
    for d in rank - k_dims..rank - 1 {
        part = mirror(cx, part, d);
    }
    let part = conj(cx, part);
    cx.concatenate(&[half, part], (rank - 1) as i64)
}

/// x[(-i) mod len] along dim `d`.
fn mirror(cx: &mut Cx, x: Value, d: usize) -> Value {
    let dims = cx.dims(x);
    let len = dims[d];
    if len <= 1 {
        return x;
    }
    let rank = dims.len();
    let r = cx.reverse(x, &[d as i64]);
    // reversed[i] = x[len-1-i]; we want x[(len - i) % len]: element 0 is x[0] (= reversed[len-1]),
    // then x[len-1], x[len-2], ... = reversed[0..len-1].
    let mut s = vec![0i64; rank];
    let mut l = dims.clone();
    s[d] = len - 1;
    let first = cx.slice(r, &s, &l, &vec![1; rank]);
    s[d] = 0;
    l[d] = len - 1;
    let rest = cx.slice(r, &s, &l, &vec![1; rank]);
    cx.concatenate(&[first, rest], d as i64)
}

pub(crate) fn conj(cx: &mut Cx, x: Value) -> Value {
    if !cx.elem(x).is_complex() {
        return x;
    }
    let re = cx.real(x);
    let im = cx.imag(x);
    let im = cx.neg(im);
    cx.complex(re, im)
}

/// _fft_c2r(self, dim, normalization, last_dim_size): the inverse of a onesided r2c; the last
/// listed dim of the input holds last_dim_size / 2 + 1 entries.
fn fft_c2r(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    check_complex(x.dtype, "_fft_c2r")?;
    let dims = signal_dims(cx, x.v, args)?;
    let mode = args.int("normalization")?;
    let last_size = args.int("last_dim_size")?;
    check!(last_size >= 1, Runtime, "Invalid number of data points ({}) specified", last_size);
    let shape = cx.dims(x.v);
    let last = *dims.last().unwrap();
    let mut out_shape = shape.clone();
    out_shape[last] = last_size;
    let n: i64 = dims.iter().map(|&d| out_shape[d]).product();
    let rdt = x.dtype.to_real();
    if out_shape.iter().product::<i64>() == 0 || shape.iter().product::<i64>() == 0 {
        return one(cx.full(0.0, rdt, &out_shape));
    }
    let rank = shape.len();
    let perm = to_end(rank, &dims);
    let mut v = cx.transpose(x.v, &perm);
    // IRFFT reads exactly last_size / 2 + 1 entries: trim or zero-pad the halved dim.
    let want = last_size / 2 + 1;
    let have = cx.dims(v)[rank - 1];
    if have != want {
        let zero = cx.b.constant_f64(0.0, x.dtype.elem());
        let mut high = vec![0i64; rank];
        high[rank - 1] = want - have;
        v = cx.pad(v, zero, &vec![0; rank], &high, &vec![0; rank]);
    }
    if dims.len() > 1 {
        // Inverse complex transforms along the other dims first.
        v = c2c_before_last(cx, v, dims.len() - 1, false);
    }
    let f = hlo_fft(cx, v, Kind::Irfft, &[last_size]);
    let f = normalize(cx, f, mode, n, true)?;
    one(cx.transpose(f, &inverse(&perm)))
}
