//! Least squares: linalg_lstsq, through the SVD (the minimum-norm solution, like gelsd).
use crate::args::Args;
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, Out, op, Op};
use super::eigen::jacobi::svd_batch;
use super::{abs2, adjoint, bcast, bmm, broadcast_batch, check_lapack_dtype, eps, expand_batch, mats, max, splat, sum, to_elem, unflatten, I64};
use stablehlo::{CmpDir, Value};

pub(crate) const OPS: &[Op] = &[
    // Routed: its composite resizes four empty out= tensors, one more than the shim's retries allow.
    op("linalg_lstsq", linalg_lstsq).routed(&["linalg_lstsq"]),
];

/// linalg_lstsq(self=A, b, rcond, driver) -> (solution, residuals, rank, singular_values).
/// The solution is the minimum-norm least-squares one from the SVD, with singular values at or
/// below rcond * s_max dropped (rcond defaults to eps * max(m, n)); for full-rank problems every
/// LAPACK driver gives the same. Like PyTorch's CPU drivers: gelsy (default) returns the rank,
/// gelsd/gelss the rank, residuals and singular values, gels the residuals; residuals are
/// returned for m > n (computed for a full-rank A).
fn linalg_lstsq(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    let bt = args.tensor("b")?;
    let api = "torch.linalg.lstsq";
    let driver = args.str("driver")?.unwrap_or("gelsy");
    check!(
        matches!(driver, "gels" | "gelsy" | "gelsd" | "gelss"),
        Runtime,
        "{}: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)",
        api
    );
    let (da, db) = (cx.dims(a.v), cx.dims(bt.v));
    check!(da.len() >= 2, Runtime, "{}: input must have at least 2 dimensions.", api);
    check!(!db.is_empty(), Runtime, "{}: other must have at least 1 dimension.", api);
    check!(
        a.dtype == bt.dtype,
        Runtime,
        "{}: Expected input and other to have the same dtype, but got input's dtype {} and other's dtype {}",
        api,
        a.dtype.torch_name(),
        bt.dtype.torch_name()
    );
    check!(
        da.len() >= db.len() && da.len() - db.len() <= 1,
        Runtime,
        "{}: input.dim() must be greater or equal to other.dim() and (input.dim() - other.dim()) <= 1",
        api
    );
    let vector = db.len() + 1 == da.len();
    let m = da[da.len() - 2];
    let n = da[da.len() - 1];
    if vector {
        check!(db[db.len() - 1] == m, Runtime, "{}: input.size(-2) should match other.size(-1)", api);
    } else {
        check!(db[db.len() - 2] == m, Runtime, "{}: input.size(-2) should match other.size(-2)", api);
    }
    check!(
        a.dtype.is_float() || a.dtype.is_complex(),
        Runtime,
        "linalg.lstsq: Expected a floating point or complex tensor as input. Got {}",
        a.dtype.torch_name()
    );
    check_lapack_dtype(a.dtype, "linalg_lstsq_cpu")?;
    let b2 = if vector {
        let mut s = db.clone();
        s.push(1);
        cx.reshape(bt.v, &s)
    } else {
        bt.v
    };
    let batch = broadcast_batch(cx, a.v, b2)?;
    let bv = expand_batch(cx, b2, &batch);
    let bm = mats(cx, bv);
    // The SVD (and so rank and singular values) per matrix of A, broadcast for the solve.
    let own = mats(cx, a.v);
    let k = bm.n;
    let e = a.dtype.elem();
    let rdt = a.dtype.to_real();
    let re = rdt.elem();
    let mn = m.min(n);
    let rcond = match args.get("rcond") {
        Some(crate::Arg::Float(f)) => f.value,
        _ => eps(e) * (m.max(n) as f64),
    };
    let widen = |cx: &mut Cx, v: Value| {
        let v = unflatten(cx, v, &own.batch);
        let rest = cx.dims(v)[own.batch.len()..].to_vec();
        let mut target = batch.clone();
        target.extend_from_slice(&rest);
        let v = cx.broadcast_to(v, &target);
        let d = cx.dims(v);
        let mut f = vec![bm.bs];
        f.extend_from_slice(&d[batch.len()..]);
        cx.reshape(v, &f)
    };
    let (x, s, rank) = if own.bs == 0 || bm.bs == 0 || mn == 0 {
        let s = cx.full(0.0, rdt, &[own.bs, mn]);
        (cx.full(0.0, a.dtype, &[bm.bs, n, k]), s, cx.full(0.0, DType::I64, &[own.bs]))
    } else {
        let (u, s, vh) = svd_batch(cx, own.v, false, true);
        let smax = max(cx, s, &[1]);
        let d2 = [own.bs, mn];
        let smax2 = bcast(cx, smax, &d2, &[0]);
        let rc = splat(cx, rcond, re, &d2);
        let cut = cx.mul(smax2, rc);
        let keep = cx.compare(CmpDir::Gt, s, cut);
        let one = splat(cx, 1.0, re, &d2);
        let inv = cx.div(one, s);
        let zero = splat(cx, 0.0, re, &d2);
        let inv = cx.select(keep, inv, zero);
        let ones = splat(cx, 1.0, I64, &d2);
        let zeros = splat(cx, 0.0, I64, &d2);
        let counted = cx.select(keep, ones, zeros);
        let rank = sum(cx, counted, &[1]);
        // x = V diag(1/s) U^H b
        let (u, inv, vh) = (widen(cx, u), widen(cx, inv), widen(cx, vh));
        let uh = adjoint(cx, u);
        let ub = bmm(cx, uh, bm.v);
        let d3 = [bm.bs, mn, k];
        let inv3 = bcast(cx, inv, &d3, &[0, 1]);
        let inv3 = to_elem(cx, inv3, e);
        let scaled = cx.mul(ub, inv3);
        let v = adjoint(cx, vh);
        let x = bmm(cx, v, scaled);
        (x, s, rank)
    };
    let residuals = if driver != "gelsy" && m > n && bm.bs > 0 && own.bs > 0 {
        let aw = widen(cx, own.v);
        let ax = bmm(cx, aw, x);
        let r = cx.sub(ax, bm.v);
        let r2 = abs2(cx, r);
        let res = sum(cx, r2, &[1]);
        unflatten(cx, res, &batch)
    } else {
        cx.full(0.0, rdt, &[0])
    };
    let x = unflatten(cx, x, &batch);
    let x = if vector {
        let mut d = cx.dims(x);
        d.pop();
        cx.reshape(x, &d)
    } else {
        x
    };
    let rank = if driver == "gels" { cx.full(0.0, DType::I64, &[0]) } else { cx.reshape(rank, &own.batch) };
    let sv = if matches!(driver, "gelsd" | "gelss") { unflatten(cx, s, &own.batch) } else { cx.full(0.0, rdt, &[0]) };
    Ok(vec![Out::Tensor(x), Out::Tensor(residuals), Out::Tensor(rank), Out::Tensor(sv)])
}
