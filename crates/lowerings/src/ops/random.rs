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
use crate::error::{ErrorKind, Result};
use crate::{check, one, Out, op, Op};
use stablehlo::{Builder, CmpDir, ElemType, Ex, RngAlgorithm, TensorType, Value, E};

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
    let e = Ex::new(b);
    let u = (e.of(m).cast(float_elem) + 0.5) * 2f64.powi(-mant);
    (next, u.v)
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
    let e = Ex::new(b);
    let [u1, u2] = e.all([u1, u2]);
    let z = (u1.ln() * -2.0).sqrt() * (u2 * std::f64::consts::TAU).cos();
    (next, z.v)
}

/// The tensor an in-place fill writes: `self`.
fn target(args: &Args) -> Result<Tensor> {
    args.tensor("self")
}

fn float_param(args: &Args, name: &str, default: f64) -> Result<f64> {
    Ok(match args.opt_scalar(name)? {
        None => default,
        Some(s) => s.to_real(DType::F64)?.to_f64(),
    })
}

/// The draw of a random fill of `d`: open uniforms in f64 for f64, else in f32.
fn draw_uniform(cx: &mut Cx, args: &Args, dims: &[i64], d: DType) -> Result<Value> {
    let state = args.generator("generator")?;
    let (_, u) = uniform_open(&mut cx.b, state, dims, d == DType::F64);
    Ok(u)
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
    let u = draw_uniform(cx, args, &dims, x.dtype)?;
    let v = (Ex::new(cx).of(u).ln() * (-1.0 / lambd)).v;
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
    let u = draw_uniform(cx, args, &dims, x.dtype)?;
    let v = (Ex::new(cx).of(u).ln() * (1.0 / (-p).ln_1p())).ceil().max(1.0).v;
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
    let (_, z) = standard_normal(&mut cx.b, state, &dims, x.dtype == DType::F64);
    let v = (Ex::new(cx).of(z) * std + mean).exp().v;
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
    let u = draw_uniform(cx, args, &dims, x.dtype)?;
    let v = (((Ex::new(cx).of(u) - 0.5) * std::f64::consts::PI).tan() * sigma + median).v;
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
    let e = Ex::new(cx);
    let lam = e.of(lam);
    let big = lam.ge(10.0);
    // exp(-lambda) for the product method; PTRS constants for the large rates.
    let enlam = (-lam).exp();
    let bb = 2.53 * lam.sqrt() + 0.931;
    let a = 0.02483 * bb - 0.059;
    let invalpha = 1.1239 + 1.1328 / (bb - 3.4);
    let vr = 0.9277 - 3.6224 / (bb - 2.0);
    let loglam = lam.ln();
    // Rate 0 gives 0 at once. Rates PyTorch's CPU check rejects (negative, NaN) give NaN and
    // infinite rates infinity, without iterating.
    let fin = lam.is_finite();
    let done0 = lam.eq(0.0) | !(lam.gt(0.0) & fin);
    let it0 = e.with(|b| b.constant_i64(0, ElemType::I64));
    let init = [state, lam.k(0.0).v, lam.k(1.0).v, done0.v, it0];
    let consts = [lam.v, enlam.v, bb.v, a.v, invalpha.v, vr.v, loglam.v, big.v];
    let r = e.with(|b| {
        b.while_loop(
            &init,
            |b, v| {
                let nd = b.not(v[3]);
                loop_more(b, v[4], nd, MAX_TRIES)
            },
            |b, v| {
                let iters = next_count(b, v[4]);
                let (state, u, vv) = uniform_pair(b, v[0], &dims, double);
                let e = Ex::new(b);
                let [k, prod, done, u, vv] = e.all([v[1], v[2], v[3], u, vv]);
                let [lam, enlam, bb, a, invalpha, vr, loglam, big] = e.all(consts);
                // Small rates: multiply uniforms until the product drops to exp(-lambda).
                let prod1 = prod * u;
                let more = prod1.gt(enlam);
                // Large rates: one PTRS attempt.
                let uu = u - 0.5;
                let us = 0.5 - uu.abs();
                let kk = ((2.0 * a / us + bb) * uu + lam + 0.43).floor();
                let quick = us.ge(0.07) & vv.le(vr);
                let reject = kk.lt(0.0) | (us.lt(0.013) & vv.gt(us));
                let lhs = vv.ln() + invalpha.ln() - (a / (us * us) + bb).ln();
                let rhs = kk * loglam - lam - (kk + 1.0).chlo("lgamma");
                let big_ok = quick | (lhs.le(rhs) & !reject);
                // Elements already done keep their value; small rates count one more factor
                // while the product stays above exp(-lambda); large rates take an accepted
                // attempt.
                let new_k = big.select(big_ok.select(kk, k), more.select(k + 1.0, k));
                let k_out = done.select(k, new_k);
                let now = big.select(big_ok, !more);
                let prod = done.select(prod, prod1);
                let done = done | now;
                vec![state, k_out.v, prod.v, done.v, iters]
            },
        )
    });
    let bad = lam.ne(lam) | lam.lt(0.0);
    let k = bad.select(f64::NAN, fin.select(r[1], lam)).v;
    drop(e);
    one(cx.cast(k, x.dtype))
}

// ---- gamma and Dirichlet ------------------------------------------------------------------------

/// Gamma(alpha, 1) samples in alpha's dtype (Marsaglia and Tsang; alpha < 1 boosted by u^(1/alpha)),
/// at least the smallest normal number, as PyTorch's sample_gamma.
fn gamma_values(cx: &mut Cx, state: Value, alpha: Value) -> Value {
    let dims = cx.dims(alpha);
    let double = cx.dtype(alpha) == DType::F64;
    let e = Ex::new(cx);
    let alpha = e.of(alpha);
    let small = alpha.lt(1.0);
    let d = small.select(alpha + 1.0, alpha) - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    // alpha <= 0 and NaN skip the loop; PyTorch's clamp to the smallest normal number answers
    // them (std::max(min, NaN) is min).
    let valid = alpha.gt(0.0);
    let it0 = e.with(|b| b.constant_i64(0, ElemType::I64));
    let init = [state, alpha.k(0.0).v, (!valid).v, it0];
    let r = e.with(|b| {
        b.while_loop(
            &init,
            |b, v| {
                let nd = b.not(v[2]);
                loop_more(b, v[3], nd, MAX_TRIES)
            },
            |b, v| {
                let iters = next_count(b, v[3]);
                let (state, x) = standard_normal(b, v[0], &dims, double);
                let (state, u) = uniform_open(b, state, &dims, double);
                let e = Ex::new(b);
                let [out, done, x, u, c, d] = e.all([v[1], v[2], x, u, c.v, d.v]);
                let y = 1.0 + c * x;
                let v3 = y * y * y;
                let xx = x * x;
                let quick = u.lt(1.0 - 0.0331 * xx * xx);
                let slow = u.ln().lt(0.5 * xx + d * (1.0 - v3 + v3.ln()));
                let ok = (quick | slow) & y.gt(0.0);
                let out = (!done & ok).select(d * v3, out);
                let done = done | ok;
                vec![state, out.v, done.v, iters]
            },
        )
    });
    let (state, g) = (r[0], e.of(r[1]));
    // The boost for alpha < 1 uses one more uniform (drawn after the loop's last state).
    let (_, u) = e.with(|b| uniform_open(b, state, &dims, double));
    let g = small.select(g * e.of(u).pow(1.0 / alpha), g);
    let tiny = if double { f64::MIN_POSITIVE } else { f32::MIN_POSITIVE as f64 };
    (g.gt(tiny) & valid).select(g, tiny).v
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
        let r = (Ex::new(cx).of(g) / g).v;
        return one(cx.cast(r, x.dtype));
    }
    let last = dims.len() as i64 - 1;
    let z = cx.constant_f64(0.0, ElemType::F64);
    let s = cx.reduce(&[g], &[z], &[last], |b, a| vec![b.add(a[0], a[1])])[0];
    let kept: Vec<i64> = (0..last).collect();
    let s = cx.broadcast_in_dim(s, &dims, &kept);
    let r = (Ex::new(cx).of(g) / s).v;
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
    let e = Ex::new(cx);
    let [al, x] = e.all([vs[0], vs[1]]);
    // Taylor series.
    let mut numer = al.k(1.0);
    let mut denom = al;
    let mut s1 = numer / denom;
    let mut s2 = numer / (denom * denom);
    for i in 1..=5 {
        numer = numer * (x * (-1.0 / i as f64));
        denom = denom + 1.0;
        s1 = s1 + numer / denom;
        s2 = s2 + numer / (denom * denom);
    }
    // -((log x - digamma(alpha)) cdf - x^alpha series2) / pdf with cdf = x^alpha series1 and
    // pdf = x^(alpha - 1) e^-x, with x^alpha / pdf = x e^x taken first so that nothing
    // underflows in float32 (PyTorch computes this in double).
    let taylor = -(((x.ln() - al.chlo("digamma")) * s1 - s2) * (x * x.exp()));
    let taylor = taylor.ne(taylor).select(0.0, taylor);
    // Rice saddle point, near the mode and away from it.
    let aa = al * al;
    let numer_1 = 1.0 + 24.0 * (1.0 + 12.0 * al) * al;
    let numer_2 =
        1440.0 * aa + 6.0 * ((53.0 - 120.0 * x) * x) - 65.0 * x * x / al + al * (107.0 + 3600.0 * x);
    let near = numer_1 * numer_2 / (1244160.0 * aa * aa);
    let denom = (8.0 * al).sqrt();
    let amx = al - x;
    let term2 = denom / amx;
    let lxa = (x / al).ln();
    let term3 = (x - al - al * lxa).pow(-1.5);
    let term23 = x.lt(al).select(term2 - term3, term2 + term3);
    let term1 = lxa * term23 - (2.0 / al).sqrt() * (al + x) / (amx * amx);
    let stirling = 1.0 + 1.0 / (12.0 * al) * (1.0 + 1.0 / (24.0 * al));
    let far = -(stirling * (x * term1) / denom);
    let in_band = (0.9 * al).le(x) & x.le(1.1 * al);
    let rice = in_band.select(near, far);
    // Rational approximation in u = log(x / alpha), v = log(alpha).
    const UV: [[f64; 8]; 3] = [
        [0.16009398, -0.094634809, 0.025146376, -0.0030648343, 1.0, 0.32668115, 0.10406089, 0.0014179084],
        [0.53487893, 0.1298071, 0.065735949, -0.0015649758, 0.16639465, 0.020070113, -0.0035938915, -0.00058392623],
        [0.040121004, -0.0065914022, -0.0026286047, -0.0013441777, 0.017050642, -0.0021309326, 0.00085092367, -1.5247877e-07],
    ];
    let u = lxa;
    let v = al.ln();
    let cv: Vec<_> = (0..8).map(|i| UV[0][i] + u * (UV[1][i] + u * UV[2][i])).collect();
    let [p, q] = [&cv[0..4], &cv[4..8]].map(|k| k[0] + v * (k[1] + v * (k[2] + v * k[3])));
    let rational = (p / q).exp();
    let r = al.gt(8.0).select(rice, rational);
    one(x.lt(0.8).select(taylor, r).v)
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
    let e = Ex::new(cx);
    let [x, alpha, total] = e.all([vs[0], vs[1], vs[2]]);
    let beta = total - alpha;
    let omx = 1.0 - x;
    let small = beta_grad_alpha_small(x, alpha, beta);
    let large = -beta_grad_beta_small(omx, beta, alpha);
    // PyTorch evaluates the saddle point expansion in double: its terms cancel near the mean.
    let [x64, a64, t64] = [x, alpha, total].map(|v| v.cast(ElemType::F64));
    let mid = beta_grad_alpha_mid(x64, a64, t64 - a64).cast(dt.elem());
    let rational = dirichlet_rational(x, alpha, total, beta);
    // Regimes in PyTorch's order of precedence.
    let r = (alpha.gt(6.0) & beta.gt(6.0)).select(mid, rational);
    let boundary = total * x * omx;
    let r = (x.ge(0.5) & boundary.lt(0.75)).select(large, r);
    one((x.le(0.5) & boundary.lt(2.5)).select(small, r).v)
}

/// NaN results of the Taylor regimes are 0 in PyTorch.
fn nan_to_zero(v: E) -> E {
    v.ne(v).select(0.0, v)
}

/// d/d alpha of Beta(x; alpha, beta) samples for x near 0 (Taylor expansion).
fn beta_grad_alpha_small<'e>(x: E<'e>, alpha: E<'e>, beta: E<'e>) -> E<'e> {
    let factor = alpha.chlo("digamma") - (alpha + beta).chlo("digamma") - x.ln();
    let mut numer = x.k(1.0);
    let inv_a = 1.0 / alpha;
    let mut series = numer * (inv_a * (factor + inv_a));
    for i in 1..=10 {
        let i = i as f64;
        numer = numer * ((i - beta) * x / i);
        let denom = alpha + i;
        series = series + numer / denom * (factor + 1.0 / denom);
    }
    nan_to_zero(x * (1.0 - x).pow(-beta) * series)
}

/// d/d beta of Beta(x; alpha, beta) samples for x near 0 (Taylor expansion).
fn beta_grad_beta_small<'e>(x: E<'e>, alpha: E<'e>, beta: E<'e>) -> E<'e> {
    let factor = (alpha + beta).chlo("digamma") - beta.chlo("digamma");
    let mut numer = x.k(1.0);
    let mut betas = numer;
    let mut dbetas = x.k(0.0);
    let mut series = factor / alpha;
    for i in 1..=8 {
        let i = i as f64;
        numer = numer * (-x / i);
        let bmi = beta - i;
        dbetas = dbetas * bmi + betas;
        betas = betas * bmi;
        series = series + numer / (alpha + i) * (dbetas + factor * betas);
    }
    nan_to_zero(-((1.0 - x).pow(1.0 - beta) * series))
}

/// d/d alpha of Beta(x; alpha, beta) samples for large alpha and beta (Rice saddle point).
fn beta_grad_alpha_mid<'e>(x: E<'e>, alpha: E<'e>, beta: E<'e>) -> E<'e> {
    let total = alpha + beta;
    let mean = alpha / total;
    let ab = alpha * beta;
    let std = (ab / (total + 1.0)).sqrt() / total;
    let d = 0.1 * std;
    let at_mean = (mean - d).le(x) & x.le(mean + d);
    let omx = 1.0 - x;
    let bb = beta * beta;
    // Near the mean: a polynomial (avoids the singularity at x = mean).
    let poly = {
        // 8 (1 - x) (135 beta - 11)
        let inner4 = 8.0 * ((135.0 * beta - 11.0) * omx);
        // (453 + 1620 beta (1 - x) - 455 x) beta + alpha inner4
        let inner3 = (453.0 + 1620.0 * beta * omx - 455.0 * x) * beta + alpha * inner4;
        // 3 (59 + 180 beta - 90 x) beta^2 + alpha inner3
        let inner2 = 3.0 * (59.0 + 180.0 * beta - 90.0 * x) * bb + alpha * inner3;
        // (43 + 20 (16 + 27 beta) x) beta^2 beta + alpha inner2
        let inner1 = (43.0 + 20.0 * (16.0 + 27.0 * beta) * x) * bb * beta + alpha * inner2;
        // 47 x beta^4 + alpha inner1
        47.0 * x * bb * bb + alpha * inner1
    };
    let prefactor_num = (1.0 + 12.0 * alpha) * (1.0 + 12.0 * beta) / (total * total);
    let prefactor_den = 12960.0 * alpha * alpha * alpha * bb * (1.0 + 12.0 * total);
    let near = prefactor_num / omx * poly / prefactor_den;
    // Away from the mean.
    let prefactor = -x / (2.0 * ab / total).sqrt();
    let st = |v: E<'e>| 1.0 + 1.0 / (12.0 * v) + 1.0 / (288.0 * v * v);
    let stirling = st(alpha) * st(beta) / st(total);
    let xm1 = x - 1.0;
    let term1_num = 2.0 * (alpha * alpha) * xm1 + ab * xm1 - x * bb;
    let axbx = alpha * xm1 + beta * x;
    let term1_den = (2.0 * alpha / beta).sqrt() * total.pow(1.5) * axbx * axbx;
    let term1 = term1_num / term1_den;
    let lat = (alpha / (total * x)).ln();
    let term2 = 0.5 * lat;
    let term3 = (8.0 * ab / total).sqrt() / axbx;
    let term4 = (beta * (beta / (total * omx)).ln() + alpha * lat).pow(-1.5);
    let t4 = x.lt(mean).select(term4, -term4);
    let term1234 = term1 + term2 * (term3 + t4);
    let far = stirling * prefactor * term1234;
    at_mean.select(near, far)
}

/// The rational correction to x (digamma(total) - digamma(alpha)) / beta.
fn dirichlet_rational<'e>(x: E<'e>, alpha: E<'e>, total: E<'e>, beta: E<'e>) -> E<'e> {
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
    let u = x.ln();
    let a = alpha.ln() - u;
    let b = total.ln() - a;
    let one_ = x.k(1.0);
    let pow_u = [one_, u, u * u];
    let pow_a = [one_, a, a * a];
    let mut p = x.k(0.0);
    let mut q = p;
    for i in 0..3 {
        for j in 0..3 {
            let ua = pow_u[i] * pow_a[j];
            for (w, acc) in [(0usize, &mut p), (1usize, &mut q)] {
                let k = &C[w][i][j];
                *acc = *acc + ua * (k[0] + b * (k[1] + b * (k[2] + b * k[3])));
            }
        }
    }
    let approx = x * (total.chlo("digamma") - alpha.chlo("digamma")) / beta;
    p / q * approx
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
    if let Some(out) = args.opt_tensor("out")? {
        check!(out.dtype == DType::I64, Runtime, "multinomial expects Long tensor out, got: {}", out.dtype.torch_name());
    }
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
    check_probabilities(cx, p, !replacement || n == 1);
    let state = args.generator("generator")?;
    let idx = if !replacement || n == 1 {
        let (_, u) = uniform_open(&mut cx.b, state, &[rows, cats], double);
        let e = Ex::new(cx);
        let key = (e.of(p) / -e.of(u).ln()).v;
        drop(e);
        let (_, order) = crate::blocks::reduce::sort_with_indices(cx, key, 1, true);
        cx.slice(order, &[0, 0], &[rows, n], &[1, 1])
    } else {
        let cdf = crate::blocks::reduce::scan(cx, p, 1, crate::blocks::reduce::Red::Sum);
        let total = cx.slice(cdf, &[0, cats - 1], &[rows, cats], &[1, 1]);
        let total = cx.reshape(total, &[rows]);
        let tb = cx.broadcast_in_dim(total, &[rows, cats], &[0]);
        let cdf = (Ex::new(cx).of(cdf) / tb).v;
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

/// CPU's checks of multinomial's probabilities (made on the host there; here on the device,
/// raising at the next synchronization). Sampling by keys (without replacement, or one sample)
/// refuses any inf, NaN or negative entry, then any row summing to zero. Sampling by the
/// cumulative sum refuses the first bad entry in row order, each row's sum checked after its
/// entries, as CPU's loop meets them.
fn check_probabilities(cx: &mut Cx, p: Value, by_keys: bool) {
    use crate::blocks::reduce::{reduce, Red};
    let dims = cx.dims(p);
    let (rows, cats) = (dims[0], dims[1]);
    let sums = reduce(cx, p, &[1], Red::Sum);
    let (code, messages) = if by_keys {
        let e = Ex::new(cx);
        let pe = e.of(p);
        let bad = (!pe.ge(0.0) | pe.eq(f64::INFINITY)).cast(ElemType::I64).v;
        let zero_sum = e.of(sums).eq(0.0).cast(ElemType::I64).v;
        drop(e);
        let bad = reduce(cx, bad, &[0, 1], Red::Max);
        let zero_sum = reduce(cx, zero_sum, &[0], Red::Max);
        let e = Ex::new(cx);
        let (bad, zero_sum) = (e.of(bad), e.of(zero_sum));
        let code = bad.gt(0.0).select(bad, zero_sum * 2.0).v;
        drop(e);
        let messages = vec![
            "probability tensor contains either `inf`, `nan` or element < 0",
            "invalid multinomial distribution (sum of probabilities <= 0)",
        ];
        (code, messages)
    } else {
        // Each entry's code (1: < 0 or NaN, 2: infinite), then its row's (3: sum <= 0); the
        // first nonzero code in that order is the error, found as the least position * 4 + code.
        let e = Ex::new(cx);
        let pe = e.of(p);
        let negative = (!pe.ge(0.0)).cast(ElemType::I64);
        let infinite = (!pe.is_finite()).cast(ElemType::I64);
        let entries = negative.gt(0.0).select(negative, infinite * 2.0).v;
        let row_sum = (e.of(sums).le(0.0).cast(ElemType::I64) * 3.0).v;
        drop(e);
        let row_sum = cx.reshape(row_sum, &[rows, 1]);
        let codes = cx.concatenate(&[entries, row_sum], 1);
        let n = rows * (cats + 1);
        let codes = cx.reshape(codes, &[n]);
        let positions = cx.iota(&TensorType::new(ElemType::I64, &[n]), 0);
        let none = (4 * n + 4) as f64;
        let e = Ex::new(cx);
        let (c, at) = (e.of(codes), e.of(positions));
        let keys = c.gt(0.0).select(at * 4.0 + c, none).v;
        drop(e);
        let first = reduce(cx, keys, &[0], Red::Min);
        let e = Ex::new(cx);
        let first = e.of(first);
        let code = first.eq(none).select(0.0, first % 4.0).v;
        drop(e);
        let messages = vec![
            "invalid multinomial distribution (encountering probability entry < 0)",
            "invalid multinomial distribution (encountering probability entry = infinity or NaN)",
            "invalid multinomial distribution (sum of probabilities <= 0)",
        ];
        (code, messages)
    };
    cx.add_code_check(code, ErrorKind::Runtime, messages.into_iter().map(String::from).collect());
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
