//! Random sampling with the device generator: the in-place fills exponential_, geometric_,
//! log_normal_ and cauchy_, poisson, multinomial (with and without replacement), randperm,
//! _standard_gamma and _sample_dirichlet, and the reparameterization gradients
//! _standard_gamma_grad and _dirichlet_grad. (uniform_, normal_, bernoulli_ and random_ are in
//! factories.rs.)
//!
//! Each call gets one generator state (seed and offset, advanced by the shim), so results are
//! reproducible under torch.manual_seed. A lowering that draws several times threads the
//! state from one stablehlo.rng_bit_generator to the next; rejection samplers carry it through
//! a while loop that runs until every element has accepted a sample.
use crate::args::{Args, Tensor};
use crate::blocks::loops::{loop_more, next_count};
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use stablehlo::{Builder, CmpDir, ElemType, RngAlgorithm, TensorType, Value};

pub(crate) const OPS: &[Op] = &[
    // Their float parameters are validated (lambda > 0, 0 < p < 1, ...), so their values are
    // compiled in: a cached program must never skip a check.
    op("exponential", exponential).specialized(),
    op("geometric", geometric).specialized(),
    op("log_normal", log_normal).specialized(),
    op("cauchy", cauchy).specialized(),
    op("poisson", poisson),
    op("multinomial", multinomial),
    op("randperm", randperm),
    op("_standard_gamma", standard_gamma),
    op("_sample_dirichlet", sample_dirichlet),
    op("_standard_gamma_grad", standard_gamma_grad),
    op("_dirichlet_grad", dirichlet_grad),
];

/// The most rounds a rejection sampler runs (each accepts with probability well above 1/2,
/// so this bound is never reached by valid parameters; it guards against endless loops).
const MAX_TRIES: i64 = 10_000;

// ---- drawing ----------------------------------------------------------------------------------

/// Uniform floats of `dims` from `state`, in the open interval (0, 1) (the mantissa bits plus
/// half a step, so that logarithms stay finite), in f32 or f64. Returns the next state too.
fn uniform_open(b: &mut Builder, state: Value, dims: &[i64], double: bool) -> (Value, Value) {
    // m + 1/2 is exact with one bit to spare: 52 (23) mantissa bits.
    let (bits_elem, float_elem, shift, mant) = if double { (ElemType::U64, ElemType::F64, 12, 52) } else { (ElemType::U32, ElemType::F32, 9, 23) };
    let ty = TensorType::new(bits_elem, dims);
    let (next, bits) = b.rng_bit_generator(RngAlgorithm::ThreeFry, state, &ty);
    let sh = b.splat_i64(shift, &ty);
    let m = b.shift_right_logical(bits, sh);
    let f = b.convert(m, float_elem);
    let fty = TensorType::new(float_elem, dims);
    let half = b.splat_f64(0.5, &fty);
    let f = b.add(f, half);
    let scale = b.splat_f64(2f64.powi(-mant), &fty);
    (next, b.mul(f, scale))
}

/// Two open uniforms of `dims` per element from one draw of [2, dims], and the next state.
fn uniform_pair(b: &mut Builder, state: Value, dims: &[i64], double: bool) -> (Value, Value, Value) {
    let mut two = vec![2];
    two.extend_from_slice(dims);
    let (next, u) = uniform_open(b, state, &two, double);
    let r = dims.len();
    let mut lim = two.clone();
    lim[0] = 1;
    let u1 = b.slice(u, &vec![0; r + 1], &lim, &vec![1; r + 1]);
    let mut st = vec![0; r + 1];
    st[0] = 1;
    let u2 = b.slice(u, &st, &two, &vec![1; r + 1]);
    let u1 = b.reshape(u1, dims);
    let u2 = b.reshape(u2, dims);
    (next, u1, u2)
}

/// Standard normal floats (Box-Muller on two open uniforms) and the next state.
fn standard_normal(b: &mut Builder, state: Value, dims: &[i64], double: bool) -> (Value, Value) {
    let (next, u1, u2) = uniform_pair(b, state, dims, double);
    let l = b.log(u1);
    let m2 = b.splat_f64(-2.0, &b.ty(l).clone());
    let rr = b.mul(l, m2);
    let rr = b.sqrt(rr);
    let tau = b.splat_f64(std::f64::consts::TAU, &b.ty(l).clone());
    let th = b.mul(u2, tau);
    let c = b.cos(th);
    (next, b.mul(rr, c))
}

/// The tensor an in-place fill writes: `self`.
fn target(args: &Args) -> Result<Tensor> {
    args.tensor("self")
}

fn float_param(args: &Args, name: &str, default: f64) -> Result<f64> {
    Ok(match args.opt_scalar(name)? {
        None => default,
        Some(crate::Scalar::Float(f)) => f.value,
        Some(crate::Scalar::Int(i)) => i as f64,
        Some(crate::Scalar::Bool(b)) => b as i64 as f64,
    })
}

/// The f32/f64 compute type of a random fill of `d`, and the draw.
fn draw_uniform(cx: &mut Cx, args: &Args, dims: &[i64], d: DType) -> Result<(DType, Value)> {
    let state = args.generator("generator")?;
    let double = d == DType::F64;
    let (_, u) = uniform_open(&mut cx.b, state, dims, double);
    Ok((if double { DType::F64 } else { DType::F32 }, u))
}

/// The check of the gamma family's CPU kernels: float32 and float64 only.
fn check_f32_f64(d: DType, kernel: &str) -> Result<()> {
    check!(matches!(d, DType::F32 | DType::F64), NotImplemented, "\"{}\" not implemented for '{}'", kernel, d.torch_name());
    Ok(())
}

fn continuous_check(x: &Tensor, what: &str, name: fn(DType) -> &'static str) -> Result<()> {
    check!(
        x.dtype.is_float(),
        Runtime,
        "{} distribution is a continuous probability distribution. dtype must be a floating point but you specified {}",
        what,
        name(x.dtype)
    );
    Ok(())
}

// ---- in-place fills ----------------------------------------------------------------------------

/// exponential_(self, lambd): -log(u) / lambd.
fn exponential(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = target(args)?;
    let lambd = float_param(args, "lambd", 1.0)?;
    check!(lambd > 0.0, Runtime, "exponential_ expects lambda > 0.0, but found lambda={}", lambd);
    continuous_check(&x, "Exponential", |d| d.torch_name())?;
    let dims = cx.dims(x.v);
    let (acc, u) = draw_uniform(cx, args, &dims, x.dtype)?;
    let l = cx.log(u);
    let k = cx.full(-1.0 / lambd, acc, &dims);
    let v = cx.mul(l, k);
    one(cx.cast(v, x.dtype))
}

/// geometric_(self, p): the number of Bernoulli(p) trials up to the first success,
/// ceil(log(u) / log1p(-p)).
fn geometric(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = target(args)?;
    let p = float_param(args, "p", 0.5)?;
    check!(p > 0.0 && p < 1.0, Runtime, "geometric_ expects p to be in (0, 1), but got p={}", p);
    check!(!x.dtype.is_complex(), NotImplemented, "geometric_: complex tensors are not supported on tpu yet");
    let dims = cx.dims(x.v);
    let (acc, u) = draw_uniform(cx, args, &dims, x.dtype)?;
    let l = cx.log(u);
    let k = cx.full(1.0 / (-p).ln_1p(), acc, &dims);
    let v = cx.mul(l, k);
    let v = cx.ceil(v);
    let one_ = cx.full(1.0, acc, &dims);
    let v = cx.max(v, one_);
    one(cx.cast(v, x.dtype))
}

/// log_normal_(self, mean, std): exp(mean + std * z).
fn log_normal(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = target(args)?;
    let mean = float_param(args, "mean", 1.0)?;
    let std = float_param(args, "std", 2.0)?;
    check!(std > 0.0, Runtime, "log_normal_ expects std > 0.0, but found std={}", std);
    check!(x.dtype.is_float(), NotImplemented, "\"log_normal_cpu\" not implemented for '{}'", x.dtype.torch_name());
    let dims = cx.dims(x.v);
    let state = args.generator("generator")?;
    let double = x.dtype == DType::F64;
    let acc = if double { DType::F64 } else { DType::F32 };
    let (_, z) = standard_normal(&mut cx.b, state, &dims, double);
    let s = cx.full(std, acc, &dims);
    let m = cx.full(mean, acc, &dims);
    let v = cx.mul(z, s);
    let v = cx.add(v, m);
    let v = cx.exp(v);
    one(cx.cast(v, x.dtype))
}

/// cauchy_(self, median, sigma): median + sigma * tan(pi (u - 1/2)).
fn cauchy(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = target(args)?;
    let median = float_param(args, "median", 0.0)?;
    let sigma = float_param(args, "sigma", 1.0)?;
    check!(sigma > 0.0, Runtime, "cauchy_ expects sigma > 0.0, but found sigma={}", sigma);
    continuous_check(&x, "Cauchy", crate::blocks::type_names::cpp_type_name)?;
    let dims = cx.dims(x.v);
    let (acc, u) = draw_uniform(cx, args, &dims, x.dtype)?;
    let half = cx.full(0.5, acc, &dims);
    let t = cx.sub(u, half);
    let pi = cx.full(std::f64::consts::PI, acc, &dims);
    let t = cx.mul(t, pi);
    let t = cx.tan(t);
    let s = cx.full(sigma, acc, &dims);
    let m = cx.full(median, acc, &dims);
    let v = cx.mul(t, s);
    let v = cx.add(v, m);
    one(cx.cast(v, x.dtype))
}

// ---- poisson -------------------------------------------------------------------------------------

/// poisson(self): Poisson samples with rates `self`: the product-of-uniforms method below 10,
/// Hoermann's transformed rejection (PTRS) at and above, like PyTorch's CPU sampler.
fn poisson(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    check!(x.dtype.is_float(), NotImplemented, "\"poisson_cpu\" not implemented for '{}'", x.dtype.torch_name());
    let dims = cx.dims(x.v);
    if cx.numel(x.v) == 0 {
        return one(x.v);
    }
    let double = x.dtype == DType::F64;
    let acc = if double { DType::F64 } else { DType::F32 };
    let lam = cx.cast(x.v, acc);
    let state = args.generator("generator")?;
    let zero = cx.full(0.0, acc, &dims);
    let one_ = cx.full(1.0, acc, &dims);
    let ten = cx.full(10.0, acc, &dims);
    let big = cx.compare(CmpDir::Ge, lam, ten);
    // exp(-lambda) for the product method; PTRS constants for the large rates.
    let nl = cx.neg(lam);
    let enlam = cx.exp(nl);
    let sl = cx.sqrt(lam);
    let c = |cx: &mut Cx, v: f64| cx.full(v, acc, &dims);
    let k253 = c(cx, 2.53);
    let bb = cx.mul(k253, sl);
    let k0931 = c(cx, 0.931);
    let bb = cx.add(bb, k0931);
    let k02483 = c(cx, 0.02483);
    let a = cx.mul(k02483, bb);
    let k0059 = c(cx, 0.059);
    let a = cx.sub(a, k0059);
    let k34 = c(cx, 3.4);
    let t = cx.sub(bb, k34);
    let k11328 = c(cx, 1.1328);
    let t = cx.div(k11328, t);
    let k11239 = c(cx, 1.1239);
    let invalpha = cx.add(k11239, t);
    let two = c(cx, 2.0);
    let t = cx.sub(bb, two);
    let k36224 = c(cx, 3.6224);
    let t = cx.div(k36224, t);
    let k09277 = c(cx, 0.9277);
    let vr = cx.sub(k09277, t);
    let loglam = cx.log(lam);
    // Rate 0 gives 0 at once. Rates PyTorch's CPU check rejects (negative, NaN) give NaN and
    // infinite rates infinity, without iterating.
    let is0 = cx.compare(CmpDir::Eq, lam, zero);
    let pos = cx.compare(CmpDir::Gt, lam, zero);
    let fin = cx.is_finite(lam);
    let regular = cx.and(pos, fin);
    let irregular = cx.not(regular);
    let done0 = cx.or(is0, irregular);
    let it0 = cx.constant_i64(0, ElemType::I64);
    let r = cx.while_loop(
        &[state, zero, one_, done0, it0],
        |b, v| {
            let nd = b.not(v[3]);
            loop_more(b, v[4], nd, MAX_TRIES)
        },
        |b, v| {
            let (state, k, prod, done) = (v[0], v[1], v[2], v[3]);
            let iters = next_count(b, v[4]);
            let (state, u, vv) = uniform_pair(b, state, &dims, double);
            let ty = b.ty(u).clone();
            let kc = |b: &mut Builder, x: f64| b.splat_f64(x, &ty);
            // Small rates: multiply uniforms until the product drops to exp(-lambda).
            let prod1 = b.mul(prod, u);
            let more = b.compare(CmpDir::Gt, prod1, enlam);
            let o = kc(b, 1.0);
            let k_small = b.add(k, o);
            // Large rates: one PTRS attempt.
            let h = kc(b, 0.5);
            let uu = b.sub(u, h);
            let au = b.abs(uu);
            let us = b.sub(h, au);
            let two = kc(b, 2.0);
            let ta = b.mul(two, a);
            let q = b.div(ta, us);
            let q = b.add(q, bb);
            let q = b.mul(q, uu);
            let q = b.add(q, lam);
            let c043 = kc(b, 0.43);
            let q = b.add(q, c043);
            let kk = b.floor(q);
            let c007 = kc(b, 0.07);
            let us_ok = b.compare(CmpDir::Ge, us, c007);
            let v_ok = b.compare(CmpDir::Le, vv, vr);
            let quick = b.and(us_ok, v_ok);
            let z = kc(b, 0.0);
            let kneg = b.compare(CmpDir::Lt, kk, z);
            let c0013 = kc(b, 0.013);
            let us_small = b.compare(CmpDir::Lt, us, c0013);
            let v_big = b.compare(CmpDir::Gt, vv, us);
            let edge = b.and(us_small, v_big);
            let reject = b.or(kneg, edge);
            let lv = b.log(vv);
            let li = b.log(invalpha);
            let uss = b.mul(us, us);
            let t = b.div(a, uss);
            let t = b.add(t, bb);
            let lt = b.log(t);
            let lhs = b.add(lv, li);
            let lhs = b.sub(lhs, lt);
            let kl = b.mul(kk, loglam);
            let rhs = b.sub(kl, lam);
            let k1 = b.add(kk, o);
            let lg = b.chlo("lgamma", &[k1]);
            let rhs = b.sub(rhs, lg);
            let accept = b.compare(CmpDir::Le, lhs, rhs);
            let nreject = b.not(reject);
            let accept = b.and(accept, nreject);
            let big_ok = b.or(quick, accept);
            // Elements already done keep their value; small rates count one more factor while
            // the product stays above exp(-lambda); large rates take an accepted attempt.
            let small_k = b.select(more, k_small, k);
            let big_k = b.select(big_ok, kk, k);
            let new_k = b.select(big, big_k, small_k);
            let k_out = b.select(done, k, new_k);
            let small_done = b.not(more);
            let now = b.select(big, big_ok, small_done);
            let prod = b.select(done, prod, prod1);
            let done = b.or(done, now);
            vec![state, k_out, prod, done, iters]
        },
    );
    let nan = cx.full(f64::NAN, acc, &dims);
    let neg = cx.compare(CmpDir::Lt, lam, zero);
    let bad = cx.compare(CmpDir::Ne, lam, lam);
    let bad = cx.or(bad, neg);
    let k = cx.select(fin, r[1], lam);
    let k = cx.select(bad, nan, k);
    one(cx.cast(k, x.dtype))
}

// ---- gamma and Dirichlet ------------------------------------------------------------------------

/// Gamma(alpha, 1) samples in `acc` (Marsaglia and Tsang; alpha < 1 boosted by u^(1/alpha)),
/// at least the smallest normal number, as PyTorch's sample_gamma.
fn gamma_values(cx: &mut Cx, state: Value, alpha: Value) -> Value {
    let dims = cx.dims(alpha);
    let double = cx.dtype(alpha) == DType::F64;
    let acc = cx.dtype(alpha);
    let one_ = cx.full(1.0, acc, &dims);
    let zero = cx.full(0.0, acc, &dims);
    let small = cx.compare(CmpDir::Lt, alpha, one_);
    let boosted = cx.add(alpha, one_);
    let al = cx.select(small, boosted, alpha);
    let third = cx.full(1.0 / 3.0, acc, &dims);
    let d = cx.sub(al, third);
    let nine = cx.full(9.0, acc, &dims);
    let t = cx.mul(nine, d);
    let t = cx.sqrt(t);
    let c = cx.div(one_, t);
    // alpha <= 0 and NaN skip the loop; PyTorch's clamp to the smallest normal number answers
    // them (std::max(min, NaN) is min).
    let valid = cx.compare(CmpDir::Gt, alpha, zero);
    let done0 = cx.not(valid);
    let it0 = cx.constant_i64(0, ElemType::I64);
    let r = cx.while_loop(
        &[state, zero, done0, it0],
        |b, v| {
            let nd = b.not(v[2]);
            loop_more(b, v[3], nd, MAX_TRIES)
        },
        |b, v| {
            let (state, out, done) = (v[0], v[1], v[2]);
            let iters = next_count(b, v[3]);
            let (state, x) = standard_normal(b, state, &dims, double);
            let (state, u) = uniform_open(b, state, &dims, double);
            let ty = b.ty(x).clone();
            let o = b.splat_f64(1.0, &ty);
            let cx_ = b.mul(c, x);
            let y = b.add(o, cx_);
            let z = b.splat_f64(0.0, &ty);
            let y_ok = b.compare(CmpDir::Gt, y, z);
            let v3 = b.mul(y, y);
            let v3 = b.mul(v3, y);
            let xx = b.mul(x, x);
            let k = b.splat_f64(0.0331, &ty);
            let t = b.mul(k, xx);
            let t = b.mul(t, xx);
            let lim = b.sub(o, t);
            let quick = b.compare(CmpDir::Lt, u, lim);
            let lu = b.log(u);
            let h = b.splat_f64(0.5, &ty);
            let hx = b.mul(h, xx);
            let lv = b.log(v3);
            let t = b.sub(o, v3);
            let t = b.add(t, lv);
            let t = b.mul(d, t);
            let rhs = b.add(hx, t);
            let slow = b.compare(CmpDir::Lt, lu, rhs);
            let ok = b.or(quick, slow);
            let ok = b.and(ok, y_ok);
            let val = b.mul(d, v3);
            let nd = b.not(done);
            let take = b.and(nd, ok);
            let out = b.select(take, val, out);
            let done = b.or(done, ok);
            vec![state, out, done, iters]
        },
    );
    let (state, g) = (r[0], r[1]);
    // The boost for alpha < 1 uses one more uniform (drawn after the loop's last state).
    let (_, u) = uniform_open(&mut cx.b, state, &dims, double);
    let inv = cx.div(one_, alpha);
    let boost = cx.pow(u, inv);
    let g_boosted = cx.mul(g, boost);
    let g = cx.select(small, g_boosted, g);
    let tiny = cx.full(if double { f64::MIN_POSITIVE } else { f32::MIN_POSITIVE as f64 }, acc, &dims);
    let above = cx.compare(CmpDir::Gt, g, tiny);
    let above = cx.and(above, valid);
    cx.select(above, g, tiny)
}

/// _standard_gamma(self): Gamma(self, 1) samples.
fn standard_gamma(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    check_f32_f64(x.dtype, "gamma_cpu")?;
    if cx.numel(x.v) == 0 {
        return one(x.v);
    }
    let state = args.generator("generator")?;
    one(gamma_values(cx, state, x.v))
}

/// _sample_dirichlet(self): Gamma(alpha) samples normalized along the last dim (drawn in
/// double like PyTorch's CPU kernel).
fn sample_dirichlet(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    check_f32_f64(x.dtype, "dirichlet")?;
    let dims = cx.dims(x.v);
    if cx.numel(x.v) == 0 {
        return one(x.v);
    }
    let state = args.generator("generator")?;
    let a = cx.cast(x.v, DType::F64);
    let g = gamma_values(cx, state, a);
    if dims.is_empty() {
        let r = cx.div(g, g);
        return one(cx.cast(r, x.dtype));
    }
    let last = dims.len() as i64 - 1;
    let z = cx.constant_f64(0.0, ElemType::F64);
    let s = cx.reduce(&[g], &[z], &[last], |b, a| vec![b.add(a[0], a[1])])[0];
    let kept: Vec<i64> = (0..last).collect();
    let s = cx.broadcast_in_dim(s, &dims, &kept);
    let r = cx.div(g, s);
    one(cx.cast(r, x.dtype))
}

/// _standard_gamma_grad(self=alpha, output=x): d x / d alpha of Gamma(alpha) samples at fixed
/// CDF (the reparameterization gradient), PyTorch's three regimes: a Taylor series for x < 0.8,
/// Rice's saddle point expansion for alpha > 8, a bivariate rational approximation otherwise.
fn standard_gamma_grad(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    let x = args.tensor("output")?;
    check_f32_f64(a.dtype, "_standard_gamma_grad_cpu")?;
    let xv = cx.cast(x.v, a.dtype);
    let vs = cx.broadcast_all(&[a.v, xv])?;
    let (al, x) = (vs[0], vs[1]);
    let dims = cx.dims(al);
    let dt = a.dtype;
    let c = |cx: &mut Cx, v: f64| cx.full(v, dt, &dims);
    let one_ = c(cx, 1.0);
    // Taylor series.
    let mut numer = one_;
    let mut denom = al;
    let mut s1 = cx.div(numer, denom);
    let dd = cx.mul(denom, denom);
    let mut s2 = cx.div(numer, dd);
    for i in 1..=5 {
        let inv_i = c(cx, -1.0 / i as f64);
        let t = cx.mul(x, inv_i);
        numer = cx.mul(numer, t);
        denom = cx.add(denom, one_);
        let t1 = cx.div(numer, denom);
        s1 = cx.add(s1, t1);
        let dd = cx.mul(denom, denom);
        let t2 = cx.div(numer, dd);
        s2 = cx.add(s2, t2);
    }
    // -((log x - digamma(alpha)) cdf - x^alpha series2) / pdf with cdf = x^alpha series1 and
    // pdf = x^(alpha - 1) e^-x, with x^alpha / pdf = x e^x taken first so that nothing
    // underflows in float32 (PyTorch computes this in double).
    let lx = cx.log(x);
    let dg = cx.chlo("digamma", &[al]);
    let t = cx.sub(lx, dg);
    let t = cx.mul(t, s1);
    let t = cx.sub(t, s2);
    let ex = cx.exp(x);
    let xe = cx.mul(x, ex);
    let r = cx.mul(t, xe);
    let taylor = cx.neg(r);
    let zero = c(cx, 0.0);
    let tn = cx.compare(CmpDir::Ne, taylor, taylor);
    let taylor = cx.select(tn, zero, taylor);
    // Rice saddle point, near the mode and away from it.
    let aa = cx.mul(al, al);
    let k12 = c(cx, 12.0);
    let t = cx.mul(k12, al);
    let t = cx.add(one_, t);
    let k24 = c(cx, 24.0);
    let t = cx.mul(k24, t);
    let t = cx.mul(t, al);
    let numer_1 = cx.add(one_, t);
    let k1440 = c(cx, 1440.0);
    let p1 = cx.mul(k1440, aa);
    let k120 = c(cx, 120.0);
    let t = cx.mul(k120, x);
    let k53 = c(cx, 53.0);
    let t = cx.sub(k53, t);
    let k6 = c(cx, 6.0);
    let t = cx.mul(t, x);
    let p2 = cx.mul(k6, t);
    let k65 = c(cx, 65.0);
    let t = cx.mul(k65, x);
    let t = cx.mul(t, x);
    let p3 = cx.div(t, al);
    let k3600 = c(cx, 3600.0);
    let t = cx.mul(k3600, x);
    let k107 = c(cx, 107.0);
    let t = cx.add(k107, t);
    let p4 = cx.mul(al, t);
    let numer_2 = cx.add(p1, p2);
    let numer_2 = cx.sub(numer_2, p3);
    let numer_2 = cx.add(numer_2, p4);
    let k1244160 = c(cx, 1244160.0);
    let den = cx.mul(k1244160, aa);
    let den = cx.mul(den, aa);
    let near = cx.mul(numer_1, numer_2);
    let near = cx.div(near, den);
    let k8 = c(cx, 8.0);
    let t = cx.mul(k8, al);
    let denom = cx.sqrt(t);
    let amx = cx.sub(al, x);
    let term2 = cx.div(denom, amx);
    let xa = cx.div(x, al);
    let lxa = cx.log(xa);
    let t = cx.mul(al, lxa);
    let t3 = cx.sub(x, al);
    let t3 = cx.sub(t3, t);
    let km15 = c(cx, -1.5);
    let term3 = cx.pow(t3, km15);
    let below = cx.compare(CmpDir::Lt, x, al);
    let d23 = cx.sub(term2, term3);
    let s23 = cx.add(term2, term3);
    let term23 = cx.select(below, d23, s23);
    let t1 = cx.mul(lxa, term23);
    let two = c(cx, 2.0);
    let t = cx.div(two, al);
    let t = cx.sqrt(t);
    let apx = cx.add(al, x);
    let t = cx.mul(t, apx);
    let amx2 = cx.mul(amx, amx);
    let t = cx.div(t, amx2);
    let term1 = cx.sub(t1, t);
    let t = cx.mul(k24, al);
    let t = cx.div(one_, t);
    let t = cx.add(one_, t);
    let t12 = cx.mul(k12, al);
    let t12 = cx.div(one_, t12);
    let t = cx.mul(t12, t);
    let stirling = cx.add(one_, t);
    let numer = cx.mul(x, term1);
    let far = cx.mul(stirling, numer);
    let far = cx.div(far, denom);
    let far = cx.neg(far);
    let k09 = c(cx, 0.9);
    let k11 = c(cx, 1.1);
    let lo = cx.mul(k09, al);
    let hi = cx.mul(k11, al);
    let ge = cx.compare(CmpDir::Le, lo, x);
    let le = cx.compare(CmpDir::Le, x, hi);
    let in_band = cx.and(ge, le);
    let rice = cx.select(in_band, near, far);
    // Rational approximation in u = log(x / alpha), v = log(alpha).
    const UV: [[f64; 8]; 3] = [
        [0.16009398, -0.094634809, 0.025146376, -0.0030648343, 1.0, 0.32668115, 0.10406089, 0.0014179084],
        [0.53487893, 0.1298071, 0.065735949, -0.0015649758, 0.16639465, 0.020070113, -0.0035938915, -0.00058392623],
        [0.040121004, -0.0065914022, -0.0026286047, -0.0013441777, 0.017050642, -0.0021309326, 0.00085092367, -1.5247877e-07],
    ];
    let u = lxa;
    let v = cx.log(al);
    let mut cv = Vec::new();
    for i in 0..8 {
        let c2 = c(cx, UV[2][i]);
        let t = cx.mul(u, c2);
        let c1 = c(cx, UV[1][i]);
        let t = cx.add(c1, t);
        let t = cx.mul(u, t);
        let c0 = c(cx, UV[0][i]);
        cv.push(cx.add(c0, t));
    }
    let horner = |cx: &mut Cx, k: &[Value]| {
        let t = cx.mul(v, k[3]);
        let t = cx.add(k[2], t);
        let t = cx.mul(v, t);
        let t = cx.add(k[1], t);
        let t = cx.mul(v, t);
        cx.add(k[0], t)
    };
    let p = horner(cx, &cv[0..4]);
    let q = horner(cx, &cv[4..8]);
    let pq = cx.div(p, q);
    let rational = cx.exp(pq);
    let k08 = c(cx, 0.8);
    let small_x = cx.compare(CmpDir::Lt, x, k08);
    let big_a = cx.compare(CmpDir::Gt, al, k8);
    let r = cx.select(big_a, rice, rational);
    one(cx.select(small_x, taylor, r))
}

/// _dirichlet_grad(x, alpha, total): the scaled reparameterized gradient of Beta(alpha,
/// total - alpha) samples x, -(d cdf / d alpha) / pdf / (1 - x), in PyTorch's four regimes:
/// Taylor series near 0 and near 1, Rice's saddle point expansion when both parameters exceed
/// 6, and a rational correction of an analytic approximation otherwise.
fn dirichlet_grad(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("x")?;
    let a = args.tensor("alpha")?;
    let t = args.tensor("total")?;
    check_f32_f64(x.dtype, "_dirichlet_grad_cpu")?;
    let dt = x.dtype;
    let av = cx.cast(a.v, dt);
    let tv = cx.cast(t.v, dt);
    let vs = cx.broadcast_all(&[x.v, av, tv])?;
    let (x, alpha, total) = (vs[0], vs[1], vs[2]);
    let dims = cx.dims(x);
    let beta = cx.sub(total, alpha);
    let one_ = cx.full(1.0, dt, &dims);
    let omx = cx.sub(one_, x);
    let small = beta_grad_alpha_small(cx, x, alpha, beta);
    let large = beta_grad_beta_small(cx, omx, beta, alpha);
    let large = cx.neg(large);
    // PyTorch evaluates the saddle point expansion in double: its terms cancel near the mean.
    let (x64, a64, t64) = (cx.cast(x, DType::F64), cx.cast(alpha, DType::F64), cx.cast(total, DType::F64));
    let b64 = cx.sub(t64, a64);
    let mid = beta_grad_alpha_mid(cx, x64, a64, b64);
    let mid = cx.cast(mid, dt);
    let rational = dirichlet_rational(cx, x, alpha, total, beta);
    // Regimes in PyTorch's order of precedence.
    let c = |cx: &mut Cx, v: f64| cx.full(v, dt, &dims);
    let six = c(cx, 6.0);
    let a6 = cx.compare(CmpDir::Gt, alpha, six);
    let b6 = cx.compare(CmpDir::Gt, beta, six);
    let both = cx.and(a6, b6);
    let r = cx.select(both, mid, rational);
    let boundary = cx.mul(total, x);
    let boundary = cx.mul(boundary, omx);
    let half = c(cx, 0.5);
    let hi_x = cx.compare(CmpDir::Ge, x, half);
    let k075 = c(cx, 0.75);
    let b075 = cx.compare(CmpDir::Lt, boundary, k075);
    let near1 = cx.and(hi_x, b075);
    let r = cx.select(near1, large, r);
    let lo_x = cx.compare(CmpDir::Le, x, half);
    let k25 = c(cx, 2.5);
    let b25 = cx.compare(CmpDir::Lt, boundary, k25);
    let near0 = cx.and(lo_x, b25);
    one(cx.select(near0, small, r))
}

/// NaN results of the Taylor regimes are 0 in PyTorch.
fn nan_to_zero(cx: &mut Cx, v: Value) -> Value {
    let nan = cx.compare(CmpDir::Ne, v, v);
    let z = cx.full(0.0, cx.dtype(v), &cx.dims(v));
    cx.select(nan, z, v)
}

/// d/d alpha of Beta(x; alpha, beta) samples for x near 0 (Taylor expansion).
fn beta_grad_alpha_small(cx: &mut Cx, x: Value, alpha: Value, beta: Value) -> Value {
    let (dt, dims) = (cx.dtype(x), cx.dims(x));
    let one_ = cx.full(1.0, dt, &dims);
    let da = cx.chlo("digamma", &[alpha]);
    let ab = cx.add(alpha, beta);
    let dab = cx.chlo("digamma", &[ab]);
    let lx = cx.log(x);
    let factor = cx.sub(da, dab);
    let factor = cx.sub(factor, lx);
    let mut numer = one_;
    let inv_a = cx.div(one_, alpha);
    let t = cx.add(factor, inv_a);
    let t = cx.mul(inv_a, t);
    let mut series = cx.mul(numer, t);
    for i in 1..=10 {
        let iv = cx.full(i as f64, dt, &dims);
        let t = cx.sub(iv, beta);
        let t = cx.mul(t, x);
        let t = cx.div(t, iv);
        numer = cx.mul(numer, t);
        let denom = cx.add(alpha, iv);
        let inv_d = cx.div(one_, denom);
        let t = cx.add(factor, inv_d);
        let n = cx.div(numer, denom);
        let t = cx.mul(n, t);
        series = cx.add(series, t);
    }
    let omx = cx.sub(one_, x);
    let nb = cx.neg(beta);
    let p = cx.pow(omx, nb);
    let r = cx.mul(x, p);
    let r = cx.mul(r, series);
    nan_to_zero(cx, r)
}

/// d/d beta of Beta(x; alpha, beta) samples for x near 0 (Taylor expansion).
fn beta_grad_beta_small(cx: &mut Cx, x: Value, alpha: Value, beta: Value) -> Value {
    let (dt, dims) = (cx.dtype(x), cx.dims(x));
    let one_ = cx.full(1.0, dt, &dims);
    let ab = cx.add(alpha, beta);
    let dab = cx.chlo("digamma", &[ab]);
    let db = cx.chlo("digamma", &[beta]);
    let factor = cx.sub(dab, db);
    let mut numer = one_;
    let mut betas = one_;
    let mut dbetas = cx.full(0.0, dt, &dims);
    let mut series = cx.div(factor, alpha);
    for i in 1..=8 {
        let iv = cx.full(i as f64, dt, &dims);
        let nx = cx.neg(x);
        let t = cx.div(nx, iv);
        numer = cx.mul(numer, t);
        let bmi = cx.sub(beta, iv);
        let t = cx.mul(dbetas, bmi);
        dbetas = cx.add(t, betas);
        betas = cx.mul(betas, bmi);
        let ai = cx.add(alpha, iv);
        let n = cx.div(numer, ai);
        let fb = cx.mul(factor, betas);
        let t = cx.add(dbetas, fb);
        let t = cx.mul(n, t);
        series = cx.add(series, t);
    }
    let omx = cx.sub(one_, x);
    let omb = cx.sub(one_, beta);
    let p = cx.pow(omx, omb);
    let r = cx.mul(p, series);
    let r = cx.neg(r);
    nan_to_zero(cx, r)
}

/// d/d alpha of Beta(x; alpha, beta) samples for large alpha and beta (Rice saddle point).
fn beta_grad_alpha_mid(cx: &mut Cx, x: Value, alpha: Value, beta: Value) -> Value {
    let (dt, dims) = (cx.dtype(x), cx.dims(x));
    let c = |cx: &mut Cx, v: f64| cx.full(v, dt, &dims);
    let one_ = c(cx, 1.0);
    let total = cx.add(alpha, beta);
    let mean = cx.div(alpha, total);
    let ab = cx.mul(alpha, beta);
    let t1 = cx.add(total, one_);
    let t = cx.div(ab, t1);
    let t = cx.sqrt(t);
    let std = cx.div(t, total);
    let k01 = c(cx, 0.1);
    let d = cx.mul(k01, std);
    let lo = cx.sub(mean, d);
    let hi = cx.add(mean, d);
    let ge = cx.compare(CmpDir::Le, lo, x);
    let le = cx.compare(CmpDir::Le, x, hi);
    let at_mean = cx.and(ge, le);
    let omx = cx.sub(one_, x);
    let bb = cx.mul(beta, beta);
    // Near the mean: a polynomial (avoids the singularity at x = mean).
    let poly = {
        // 8 (1 - x) (135 beta - 11)
        let k135 = c(cx, 135.0);
        let k11 = c(cx, 11.0);
        let t = cx.mul(k135, beta);
        let t = cx.sub(t, k11);
        let k8 = c(cx, 8.0);
        let t = cx.mul(t, omx);
        let inner4 = cx.mul(k8, t);
        // (453 + 1620 beta (1 - x) - 455 x) beta + alpha inner4
        let k1620 = c(cx, 1620.0);
        let t = cx.mul(k1620, beta);
        let t = cx.mul(t, omx);
        let k453 = c(cx, 453.0);
        let t = cx.add(k453, t);
        let k455 = c(cx, 455.0);
        let x455 = cx.mul(k455, x);
        let t = cx.sub(t, x455);
        let t = cx.mul(t, beta);
        let ai = cx.mul(alpha, inner4);
        let inner3 = cx.add(t, ai);
        // 3 (59 + 180 beta - 90 x) beta^2 + alpha inner3
        let k180 = c(cx, 180.0);
        let t = cx.mul(k180, beta);
        let k59 = c(cx, 59.0);
        let t = cx.add(k59, t);
        let k90 = c(cx, 90.0);
        let x90 = cx.mul(k90, x);
        let t = cx.sub(t, x90);
        let k3 = c(cx, 3.0);
        let t = cx.mul(k3, t);
        let t = cx.mul(t, bb);
        let ai = cx.mul(alpha, inner3);
        let inner2 = cx.add(t, ai);
        // (43 + 20 (16 + 27 beta) x) beta^2 beta + alpha inner2
        let k27 = c(cx, 27.0);
        let t = cx.mul(k27, beta);
        let k16 = c(cx, 16.0);
        let t = cx.add(k16, t);
        let k20 = c(cx, 20.0);
        let t = cx.mul(k20, t);
        let t = cx.mul(t, x);
        let k43 = c(cx, 43.0);
        let t = cx.add(k43, t);
        let t = cx.mul(t, bb);
        let t = cx.mul(t, beta);
        let ai = cx.mul(alpha, inner2);
        let inner1 = cx.add(t, ai);
        // 47 x beta^4 + alpha inner1
        let k47 = c(cx, 47.0);
        let t = cx.mul(k47, x);
        let t = cx.mul(t, bb);
        let t = cx.mul(t, bb);
        let ai = cx.mul(alpha, inner1);
        cx.add(t, ai)
    };
    let k12 = c(cx, 12.0);
    let t = cx.mul(k12, alpha);
    let pa = cx.add(one_, t);
    let t = cx.mul(k12, beta);
    let pb = cx.add(one_, t);
    let num = cx.mul(pa, pb);
    let tt = cx.mul(total, total);
    let prefactor_num = cx.div(num, tt);
    let k12960 = c(cx, 12960.0);
    let t = cx.mul(k12960, alpha);
    let t = cx.mul(t, alpha);
    let t = cx.mul(t, alpha);
    let t = cx.mul(t, bb);
    let t12 = cx.mul(k12, total);
    let t12 = cx.add(one_, t12);
    let prefactor_den = cx.mul(t, t12);
    let near = cx.div(prefactor_num, omx);
    let near = cx.mul(near, poly);
    let near = cx.div(near, prefactor_den);
    // Away from the mean.
    let two = c(cx, 2.0);
    let t = cx.mul(two, ab);
    let t = cx.div(t, total);
    let t = cx.sqrt(t);
    let nx = cx.neg(x);
    let prefactor = cx.div(nx, t);
    let st = |cx: &mut Cx, v: Value| {
        let k12 = cx.full(12.0, dt, &dims);
        let k288 = cx.full(288.0, dt, &dims);
        let one_ = cx.full(1.0, dt, &dims);
        let a = cx.mul(k12, v);
        let a = cx.div(one_, a);
        let b = cx.mul(k288, v);
        let b = cx.mul(b, v);
        let b = cx.div(one_, b);
        let s = cx.add(one_, a);
        cx.add(s, b)
    };
    let sa = st(cx, alpha);
    let sb = st(cx, beta);
    let stt = st(cx, total);
    let stirling = cx.mul(sa, sb);
    let stirling = cx.div(stirling, stt);
    let xm1 = cx.sub(x, one_);
    let aa = cx.mul(alpha, alpha);
    let t = cx.mul(two, aa);
    let t = cx.mul(t, xm1);
    let u = cx.mul(ab, xm1);
    let t = cx.add(t, u);
    let u = cx.mul(x, bb);
    let term1_num = cx.sub(t, u);
    let t = cx.mul(alpha, xm1);
    let u = cx.mul(beta, x);
    let axbx = cx.add(t, u);
    let t = cx.mul(two, alpha);
    let t = cx.div(t, beta);
    let t = cx.sqrt(t);
    let k15 = c(cx, 1.5);
    let p = cx.pow(total, k15);
    let t = cx.mul(t, p);
    let t = cx.mul(t, axbx);
    let term1_den = cx.mul(t, axbx);
    let term1 = cx.div(term1_num, term1_den);
    let tx = cx.mul(total, x);
    let t = cx.div(alpha, tx);
    let lat = cx.log(t);
    let half = c(cx, 0.5);
    let term2 = cx.mul(half, lat);
    let k8 = c(cx, 8.0);
    let t = cx.mul(k8, ab);
    let t = cx.div(t, total);
    let term3_num = cx.sqrt(t);
    let term3 = cx.div(term3_num, axbx);
    let tomx = cx.mul(total, omx);
    let t = cx.div(beta, tomx);
    let t = cx.log(t);
    let t = cx.mul(beta, t);
    let u = cx.mul(alpha, lat);
    let base = cx.add(t, u);
    let km15 = c(cx, -1.5);
    let term4 = cx.pow(base, km15);
    let below = cx.compare(CmpDir::Lt, x, mean);
    let nt4 = cx.neg(term4);
    let t4 = cx.select(below, term4, nt4);
    let t = cx.add(term3, t4);
    let t = cx.mul(term2, t);
    let term1234 = cx.add(term1, t);
    let far = cx.mul(stirling, prefactor);
    let far = cx.mul(far, term1234);
    cx.select(at_mean, near, far)
}

/// The rational correction to x (digamma(total) - digamma(alpha)) / beta.
fn dirichlet_rational(cx: &mut Cx, x: Value, alpha: Value, total: Value, beta: Value) -> Value {
    const C: [[[[f64; 4]; 3]; 3]; 2] = [
        [
            [
                [1.003668233, -0.01061107488, -0.0657888334, 0.01201642863],
                [0.6336835991, -0.3557432599, 0.05486251648, -0.001465281033],
                [-0.03276231906, 0.004474107445, 0.002429354597, -0.0001557569013],
            ],
            [
                [0.221950385, -0.3187676331, 0.01799915743, 0.01074823814],
                [-0.2951249643, 0.06219954479, 0.01535556598, 0.001550077057],
                [0.02155310298, 0.004170831599, 0.001292462449, 6.976601077e-05],
            ],
            [
                [-0.05980841433, 0.008441916499, 0.01085618172, 0.002319392565],
                [0.02911413504, 0.01400243777, -0.002721828457, 0.000751041181],
                [0.005900514878, -0.001936558688, -9.495446725e-06, 5.385558597e-05],
            ],
        ],
        [
            [
                [1.0, -0.02924021934, -0.04438342661, 0.007285809825],
                [0.6357567472, -0.3473456711, 0.05454656494, -0.002407477521],
                [-0.03301322327, 0.004845219414, 0.00231480583, -0.0002307248149],
            ],
            [
                [0.5925320577, -0.1757678135, 0.01505928619, 0.000564515273],
                [0.1014815858, -0.06589186703, 0.01272886114, -0.0007316646956],
                [-0.007258481865, 0.001096195486, 0.0003934994223, -4.12701925e-05],
            ],
            [
                [0.06469649321, -0.0236701437, 0.002902096474, -5.896963079e-05],
                [0.001925008108, -0.002869809258, 0.0008000589141, -6.063713228e-05],
                [-0.0003477407336, 6.959756487e-05, 1.097287507e-05, -1.650964693e-06],
            ],
        ],
    ];
    let (dt, dims) = (cx.dtype(x), cx.dims(x));
    let u = cx.log(x);
    let la = cx.log(alpha);
    let a = cx.sub(la, u);
    let lt = cx.log(total);
    let b = cx.sub(lt, a);
    let one_ = cx.full(1.0, dt, &dims);
    let uu = cx.mul(u, u);
    let aa = cx.mul(a, a);
    let pow_u = [one_, u, uu];
    let pow_a = [one_, a, aa];
    let mut p = cx.full(0.0, dt, &dims);
    let mut q = p;
    for i in 0..3 {
        for j in 0..3 {
            let ua = cx.mul(pow_u[i], pow_a[j]);
            for (w, acc) in [(0usize, &mut p), (1usize, &mut q)] {
                let k = &C[w][i][j];
                let c3 = cx.full(k[3], dt, &dims);
                let t = cx.mul(b, c3);
                let c2 = cx.full(k[2], dt, &dims);
                let t = cx.add(c2, t);
                let t = cx.mul(b, t);
                let c1 = cx.full(k[1], dt, &dims);
                let t = cx.add(c1, t);
                let t = cx.mul(b, t);
                let c0 = cx.full(k[0], dt, &dims);
                let t = cx.add(c0, t);
                let t = cx.mul(ua, t);
                *acc = cx.add(*acc, t);
            }
        }
    }
    let dtot = cx.chlo("digamma", &[total]);
    let dal = cx.chlo("digamma", &[alpha]);
    let d = cx.sub(dtot, dal);
    let approx = cx.mul(x, d);
    let approx = cx.div(approx, beta);
    let r = cx.div(p, q);
    cx.mul(r, approx)
}

// ---- multinomial and randperm --------------------------------------------------------------------

/// multinomial(self, num_samples, replacement): category indices per row. Without replacement
/// (or for one sample) the largest p / q with q ~ Exp(1) (PyTorch's Gumbel trick); with
/// replacement, inverse-CDF sampling of uniforms against the normalized cumulative sums.
/// PyTorch's CPU checks of the probability values (non-negative, finite, positive sum) need
/// the data on the host and are not made.
fn multinomial(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let n = args.int("num_samples")?;
    let replacement = args.bool_or("replacement", false)?;
    let dims = cx.dims(x.v);
    check!(
        x.dtype.is_float(),
        Runtime,
        "multinomial only supports floating-point dtypes for input, got: {}",
        x.dtype.torch_name()
    );
    check!(dims.len() == 1 || dims.len() == 2, Runtime, "prob_dist must be 1 or 2 dim");
    check!(n > 0, Runtime, "cannot sample n_sample <= 0 samples");
    let cats = *dims.last().unwrap();
    check!(
        replacement || n <= cats,
        Runtime,
        "cannot sample n_sample > prob_dist.size(-1) samples without replacement"
    );
    check!(cats <= 1 << 24, Runtime, "number of categories cannot exceed 2^24");
    let rows = if dims.len() == 2 { dims[0] } else { 1 };
    let out_dims: Vec<i64> = if dims.len() == 2 { vec![rows, n] } else { vec![n] };
    if rows == 0 {
        return one(cx.full(0.0, DType::I64, &out_dims));
    }
    let double = x.dtype == DType::F64;
    let acc = if double { DType::F64 } else { DType::F32 };
    let p = cx.cast(x.v, acc);
    let p = cx.reshape(p, &[rows, cats]);
    let state = args.generator("generator")?;
    let idx = if !replacement || n == 1 {
        let (_, u) = uniform_open(&mut cx.b, state, &[rows, cats], double);
        let l = cx.log(u);
        let q = cx.neg(l);
        let key = cx.div(p, q);
        let (_, order) = crate::blocks::reduce::sort_with_indices(cx, key, 1, true);
        cx.slice(order, &[0, 0], &[rows, n], &[1, 1])
    } else {
        let cdf = crate::blocks::reduce::scan(cx, p, 1, crate::blocks::reduce::Red::Sum);
        let total = cx.slice(cdf, &[0, cats - 1], &[rows, cats], &[1, 1]);
        let total = cx.reshape(total, &[rows]);
        let tb = cx.broadcast_in_dim(total, &[rows, cats], &[0]);
        let cdf = cx.div(cdf, tb);
        let (_, u) = uniform_open(&mut cx.b, state, &[rows, n], double);
        // The first category whose cumulative probability reaches u.
        let cdf3 = cx.broadcast_in_dim(cdf, &[rows, n, cats], &[0, 2]);
        let u3 = cx.broadcast_in_dim(u, &[rows, n, cats], &[0, 1]);
        let below = cx.compare(CmpDir::Lt, cdf3, u3);
        let below = cx.convert(below, ElemType::I64);
        let z = cx.constant_i64(0, ElemType::I64);
        let cnt = cx.reduce(&[below], &[z], &[2], |b, a| vec![b.add(a[0], a[1])])[0];
        let last = cx.full((cats - 1) as f64, DType::I64, &[rows, n]);
        cx.min(cnt, last)
    };
    one(cx.reshape(idx, &out_dims))
}

/// randperm.generator_out(n, generator, out): a random permutation of 0..n (random keys
/// sorted along with their positions), in the out tensor's dtype.
fn randperm(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let n = args.int("n")?;
    check!(n >= 0, Runtime, "n must be non-negative, got{}", n);
    let dtype = match args.tensor("out") {
        Ok(o) => o.dtype,
        Err(_) => crate::blocks::reduce::opt_dtype(args, "dtype")?.unwrap_or(DType::I64),
    };
    check!(!dtype.is_complex() && dtype != DType::Bool, NotImplemented, "randperm is not implemented for {} on tpu", dtype.torch_name());
    let limit = match dtype {
        DType::F16 => Some(1i64 << 11),
        DType::BF16 => Some(1 << 8),
        DType::F32 => Some(1 << 24),
        DType::U8 => Some(256),
        DType::I8 => Some(128),
        DType::I16 => Some(1 << 15),
        _ => None,
    };
    if let Some(l) = limit {
        check!(n <= l, Runtime, "n cannot be larger than {} for the dtype {}", l, dtype.torch_name());
    }
    if n == 0 {
        return one(cx.full(0.0, dtype, &[0]));
    }
    let state = args.generator("generator")?;
    let ty = TensorType::new(ElemType::U64, &[n]);
    let (_, keys) = cx.rng_bit_generator(RngAlgorithm::ThreeFry, state, &ty);
    let pos = cx.iota(&TensorType::new(ElemType::I64, &[n]), 0);
    let r = cx.sort(&[keys, pos], 0, true, |b, a| b.compare(CmpDir::Lt, a[0], a[1]));
    one(cx.cast(r[1], dtype))
}
