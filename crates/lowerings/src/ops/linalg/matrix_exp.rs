//! The matrix exponential: linalg_matrix_exp, following PyTorch's mexp (Taylor degrees 1-18 by
//! norm, scaling and squaring for degree 18).
use crate::args::Args;
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use super::{bcast, bcast0, bmm, check_float_or_complex, check_square, eye3, mats, max, splat, sum, to_elem, unflatten, I64};
use stablehlo::{Builder, CmpDir, ElemType, Value};

pub(crate) const OPS: &[Op] = &[
    op("linalg_matrix_exp", linalg_matrix_exp),
];

/// sum_j c_j M_j over matrices of one shape, accumulated in order (PyTorch's
/// _compute_linear_combination); the coefficients are rounded to the real type first.
fn lin_comb(b: &mut Builder, ms: &[Value], cs: &[f64]) -> Value {
    let e = b.elem(ms[0]);
    let dims = b.dims(ms[0]).to_vec();
    let round = |c: f64| if e.real_type() == ElemType::F64 { c } else { c as f32 as f64 };
    let mut acc = splat(b, 0.0, e, &dims);
    for (&m, &c) in ms.iter().zip(cs) {
        let cv = splat(b, round(c), e, &dims);
        let t = b.mul(m, cv);
        acc = b.add(acc, t);
    }
    acc
}

/// The Taylor approximations of exp(A) PyTorch's mexp uses (Bader, Blanes, Casas 2019): degree
/// 1, 2, 4, 8, 12 or 18, each evaluated with PyTorch's sequence of products and combinations.
#[allow(clippy::excessive_precision)]
fn mexp_taylor(b: &mut Builder, a: Value, degree: u32) -> Value {
    let d = b.dims(a).to_vec();
    let (bs, n) = (d[0], d[1]);
    let e = b.elem(a);
    let id = eye3(b, e, bs, n, n);
    match degree {
        1 => b.add(id, a),
        2 => {
            let a2 = bmm(b, a, a);
            let two = splat(b, 2.0, e, &d);
            let h = b.div(a2, two);
            let s = b.add(id, a);
            b.add(s, h)
        }
        4 => {
            let a2 = bmm(b, a, a);
            let c = lin_comb(b, &[id, a, a2], &[1.0 / 2.0, 1.0 / 6.0, 1.0 / 24.0]);
            let t = bmm(b, a2, c);
            lin_comb(b, &[id, a, a2, t], &[1.0, 1.0, 0.0, 1.0])
        }
        8 => {
            // The constants as PyTorch's constexpr scalar_t computes them.
            let f = |x: f64| if e.real_type() == ElemType::F64 { x } else { x as f32 as f64 };
            let sqrt_177 = f(0.1330413469565007072504e+2);
            let x3 = f(2.0 / 3.0);
            let x1 = f(x3 * ((1.0 + sqrt_177) / 88.0));
            let x2 = f(x3 * ((1.0 + sqrt_177) / 352.0));
            let x4 = f((-271.0 + 29.0 * sqrt_177) / (315.0 * x3));
            let x5 = f((-11.0 + 11.0 * sqrt_177) / (1260.0 * x3));
            let x6 = f((-99.0 + 11.0 * sqrt_177) / (5040.0 * x3));
            let x7 = f((89.0 - sqrt_177) / (5040.0 * x3));
            let y2 = f((857.0 - 58.0 * sqrt_177) / 630.0);
            let a2 = bmm(b, a, a);
            let c = lin_comb(b, &[a, a2], &[x1, x2]);
            let a4 = bmm(b, a2, c);
            let l = lin_comb(b, &[a2, a4], &[x3, 1.0]);
            let r = lin_comb(b, &[id, a, a2, a4], &[x4, x5, x6, x7]);
            let a8 = bmm(b, l, r);
            lin_comb(b, &[id, a, a2, a4, a8], &[1.0, 1.0, y2, 0.0, 1.0])
        }
        12 => {
            const B: [[f64; 4]; 4] = [
                [9.0198e-16, 0.46932117595418237389, -0.20099424927047284052, -0.04623946134063071740],
                [5.31597895759871264183, 1.19926790417132231573, 0.01179296240992997031, 0.01108844528519167989],
                [0.18188869982170434744, 0.05502798439925399070, 0.09351590770535414968, 0.00610700528898058230],
                [-2.0861320e-13, -0.13181061013830184015, -0.02027855540589259079, -0.00675951846863086359],
            ];
            let a2 = bmm(b, a, a);
            let a3 = bmm(b, a, a2);
            let ps = [id, a, a2, a3];
            let bsv: Vec<Value> = B.iter().map(|row| lin_comb(b, &ps, row)).collect();
            let a6 = bmm(b, bsv[3], bsv[3]);
            let b2 = b.add(bsv[2], a6);
            let l = b.add(bsv[1], b2);
            let p = bmm(b, l, b2);
            b.add(bsv[0], p)
        }
        _ => {
            const B: [[f64; 5]; 5] = [
                [0., -1.00365581030144618291e-01, -8.02924648241156932449e-03, -8.92138498045729985177e-04, 0.],
                [
                    0.,
                    3.97849749499645077844e-01,
                    1.36783778460411720168e+00,
                    4.98289622525382669416e-01,
                    -6.37898194594723280150e-04,
                ],
                [
                    -1.09676396052962061844e+01,
                    1.68015813878906206114e+00,
                    5.71779846478865511061e-02,
                    -6.98210122488052056106e-03,
                    3.34975017086070470649e-05,
                ],
                [
                    -9.04316832390810593223e-02,
                    -6.76404519071381882256e-02,
                    6.75961301770459654925e-02,
                    2.95552570429315521194e-02,
                    -1.39180257516060693404e-05,
                ],
                [0., 0., -9.23364619367118555360e-02, -1.69364939002081722752e-02, -1.40086798182036094347e-05],
            ];
            let a2 = bmm(b, a, a);
            let a3 = bmm(b, a, a2);
            let a6 = bmm(b, a3, a3);
            let ps = [id, a, a2, a3, a6];
            let bsv: Vec<Value> = B.iter().map(|row| lin_comb(b, &ps, row)).collect();
            let a9 = bmm(b, bsv[0], bsv[4]);
            let b3 = b.add(bsv[3], a9);
            let l = b.add(bsv[2], b3);
            let p = bmm(b, l, b3);
            b.add(bsv[1], p)
        }
    }
}

/// linalg_matrix_exp(self), as PyTorch's mexp: a single matrix uses the Taylor degree its 1-norm
/// calls for (1, 2, 4, 8, 12 up to the thresholds, else 18); batches always use degree 18. Degree
/// 18 runs on A / 2^s with s = max(0, ceil(log2(||A||_1 / theta_18))), then squares s times.
/// 16-bit floats are computed in float32 (PyTorch's kernels misread their coefficients there).
#[allow(clippy::excessive_precision)]
fn linalg_matrix_exp(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    let api = "linalg.matrix_exp";
    check_square(cx, &a, api)?;
    check_float_or_complex(&a, api)?;
    check!(
        matches!(a.dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::C64 | DType::C128),
        NotImplemented,
        "\"linalg_matrix_exp\" not implemented for '{}'",
        a.dtype.torch_name()
    );
    let wide = a.dtype.opmath();
    let mm = mats(cx, a.v);
    if mm.bs == 0 || mm.n == 0 {
        return one(a.v);
    }
    if mm.n == 1 {
        let x = cx.convert(a.v, wide.elem());
        let r = cx.exp(x);
        return one(cx.convert(r, a.dtype.elem()));
    }
    let (bs, n) = (mm.bs, mm.n);
    let e = wide.elem();
    let re = e.real_type();
    let x = cx.convert(mm.v, e);
    let thetas: [f64; 6] = if re == ElemType::F64 {
        [2.220446049250313e-16, 2.580956802971767e-08, 3.397168839976962e-04, 4.991228871115323e-02, 2.996158913811580e-01, 1.090863719290036e+00]
    } else {
        [1.192092800768788e-07, 5.978858893805233e-04, 5.116619363445086e-02, 5.800524627688768e-01, 1.461661507209034e+00, 3.010066362817634e+00]
    };
    let th = |t: f64| if re == ElemType::F64 { t } else { t as f32 as f64 };
    // 1-norm: the largest column sum of |a_ij|.
    let ab = cx.abs(x);
    let colsum = sum(cx, ab, &[1]);
    let norm = max(cx, colsum, &[1]);
    // Degree 18 with scaling and squaring.
    let t18 = {
        let th18 = splat(cx, th(thetas[5]), re, &[bs]);
        let q = cx.div(norm, th18);
        // ceil(log2(q)), exact at powers of two: log(q) / ln 2, then corrected by one step
        // where 2^(s - 1) already reaches q or 2^s falls short of it.
        let lg = cx.log(q);
        let inv_ln2 = splat(cx, 1.0 / std::f64::consts::LN_2, re, &[bs]);
        let lg = cx.mul(lg, inv_ln2);
        let s = cx.ceil(lg);
        let two = splat(cx, 2.0, re, &[bs]);
        let one_r = splat(cx, 1.0, re, &[bs]);
        let sm1 = cx.sub(s, one_r);
        let p_lo = cx.pow(two, sm1);
        let too_big = cx.compare(CmpDir::Ge, p_lo, q);
        let s = cx.select(too_big, sm1, s);
        let p_hi = cx.pow(two, s);
        let too_small = cx.compare(CmpDir::Lt, p_hi, q);
        let sp1 = cx.add(s, one_r);
        let s = cx.select(too_small, sp1, s);
        let zero = splat(cx, 0.0, re, &[bs]);
        let s = cx.max(s, zero);
        let fin = cx.is_finite(s);
        let s = cx.select(fin, s, zero);
        let cap = splat(cx, 1100.0, re, &[bs]);
        let s = cx.min(s, cap);
        let two = splat(cx, 2.0, re, &[bs]);
        let ns = cx.neg(s);
        let scale = cx.pow(two, ns);
        let d3 = [bs, n, n];
        let scale3 = bcast(cx, scale, &d3, &[0]);
        let scale3 = to_elem(cx, scale3, e);
        let xs = cx.mul(x, scale3);
        let t = mexp_taylor(cx, xs, 18);
        let si = cx.convert(s, I64);
        let z0 = cx.b.constant_i64(0, I64);
        let smax = cx.reduce(&[si], &[z0], &[0], |b, v| vec![b.max(v[0], v[1])])[0];
        let k0 = cx.b.constant_i64(0, I64);
        let out = cx.while_loop(
            &[k0, t],
            |b, v| b.compare(CmpDir::Lt, v[0], smax),
            |b, v| {
                let (k, t) = (v[0], v[1]);
                let sq = bmm(b, t, t);
                let kb = bcast0(b, k, &[bs]);
                let more = b.compare(CmpDir::Lt, kb, si);
                let more3 = bcast(b, more, &d3, &[0]);
                let t = b.select(more3, sq, t);
                let one = b.constant_i64(1, I64);
                vec![b.add(k, one), t]
            },
        );
        out[1]
    };
    let r = if bs > 1 {
        t18
    } else {
        // One matrix: the degree its norm calls for; a NaN norm matches no interval (NaN result).
        let d3 = [bs, n, n];
        let mut r = splat(cx, f64::NAN, e, &d3);
        let mut lower = -1.0;
        for (i, deg) in [1u32, 2, 4, 8, 12].into_iter().enumerate() {
            let t = mexp_taylor(cx, x, deg);
            let lo = splat(cx, lower, re, &[bs]);
            let hi = splat(cx, th(thetas[i]), re, &[bs]);
            let above = cx.compare(CmpDir::Gt, norm, lo);
            let below = cx.compare(CmpDir::Le, norm, hi);
            let inside = cx.and(above, below);
            let inside = bcast(cx, inside, &d3, &[0]);
            r = cx.select(inside, t, r);
            lower = th(thetas[i]);
        }
        let lo = splat(cx, th(thetas[4]), re, &[bs]);
        let large = cx.compare(CmpDir::Ge, norm, lo);
        let large = bcast(cx, large, &d3, &[0]);
        cx.select(large, t18, r)
    };
    let r = cx.convert(r, a.dtype.elem());
    one(unflatten(cx, r, &mm.batch))
}
