//! Searches in sorted sequences: searchsorted, bucketize, and isin.
use crate::args::{Arg, Args, Scalar, Tensor};
use crate::blocks::consts::I64;
use crate::blocks::gather::{along_coords, gather_points, numel, take_along};
use crate::blocks::reduce::sort_with_positions;
use crate::blocks::type_names::shape_str;
use crate::cx::Cx;
use crate::dtype::{DType, Rank};
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use stablehlo::{CmpDir, Value};

pub(crate) const OPS: &[Op] = &[
    op("searchsorted", searchsorted),
    op("bucketize", bucketize),
    // Bucketed as it is: padding repeats test elements, which leaves membership alone.
    op("isin", isin).bucketed(),
];

/// For each value, the insertion point in the rows of `seq` ([P, M] sorted along M; `vals` is
/// [P, K]; or `seq` [M] and `vals` [K]): the first i with !(seq[i] < v) (left) or
/// !(seq[i] <= v) (right), written like PyTorch's CPU kernel so NaNs land where they do there.
fn lower_bound(cx: &mut Cx, seq: Value, vals: Value, right: bool) -> Value {
    let sd = cx.dims(seq);
    let vd = cx.dims(vals);
    let m = *sd.last().unwrap();
    let mut lo = cx.full(0.0, I64, &vd);
    let mut hi = cx.full(m as f64, I64, &vd);
    let two = cx.full(2.0, I64, &vd);
    let one_ = cx.full(1.0, I64, &vd);
    let last = cx.full((m - 1).max(0) as f64, I64, &vd);
    let mut steps = 0;
    while (1i64 << steps) <= m {
        steps += 1;
    }
    for _ in 0..steps {
        let sum = cx.add(lo, hi);
        let mid = cx.div(sum, two);
        let at = cx.min(mid, last);
        let b = if sd.len() == 1 {
            take_along(cx, seq, 0, at)
        } else {
            let coords = along_coords(cx, at, 1);
            gather_points(cx, seq, coords)
        };
        // left: go right when !(b >= v); right: when !(b > v)
        let stop = cx.compare(if right { CmpDir::Gt } else { CmpDir::Ge }, b, vals);
        let go = cx.not(stop);
        let active = cx.compare(CmpDir::Lt, lo, hi);
        let go_right = cx.and(go, active);
        let stop_here = cx.and(stop, active);
        let m1 = cx.add(mid, one_);
        lo = cx.select(go_right, m1, lo);
        hi = cx.select(stop_here, mid, hi);
    }
    lo
}

#[allow(clippy::too_many_arguments)]
fn search(cx: &mut Cx, seq: Tensor, vals: Value, vrank: Rank, vdtype: DType, right: bool, out_int32: bool, sorter: Option<Tensor>) -> Result<Value> {
    let sd = cx.dims(seq.v);
    let vd = cx.dims(vals);
    let out_dt = if out_int32 { DType::I32 } else { I64 };
    let dt = crate::dtype::result_type(&[(seq.dtype, seq.rank), (vdtype, vrank)]).unwrap();
    let m = *sd.last().unwrap_or(&1);
    if numel(&vd) == 0 || m == 0 || numel(&sd) == 0 {
        return Ok(cx.full(0.0, out_dt, &vd));
    }
    let mut s = cx.cast(seq.v, dt);
    if let Some(so) = sorter {
        let r = sd.len() - 1;
        let coords = along_coords(cx, so.v, r);
        s = gather_points(cx, s, coords);
    }
    let v = cx.cast(vals, dt);
    let pos = if sd.len() == 1 {
        let n = numel(&vd);
        let flat = cx.reshape(v, &[n]);
        let p = lower_bound(cx, s, flat, right);
        cx.reshape(p, &vd)
    } else {
        let p: i64 = sd[..sd.len() - 1].iter().product();
        let k = *vd.last().unwrap();
        let s2 = cx.reshape(s, &[p, m]);
        let v2 = cx.reshape(v, &[p, k]);
        let r = lower_bound(cx, s2, v2, right);
        cx.reshape(r, &vd)
    };
    Ok(cx.convert(pos, out_dt.elem()))
}

fn searchsorted(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let seq = args.tensor("sorted_sequence")?;
    let out_int32 = args.bool_or("out_int32", false)?;
    let mut right = args.bool_or("right", false)?;
    if let Some(side) = args.str("side")? {
        check!(
            side == "left" || side == "right",
            Runtime,
            "torch.searchsorted(): side can only be 'left' or 'right' but got {}",
            side
        );
        check!(
            !(side == "left" && right),
            Runtime,
            "torch.searchsorted(): side and right can't be set to opposites, got side of left while right was True"
        );
        right = side == "right";
    }
    let sorter = args.opt_tensor("sorter")?;
    let sd = cx.dims(seq.v);
    let (vals, vrank, vdtype) = match args.get("self") {
        Some(Arg::Tensor(t)) => (t.v, t.rank, t.dtype),
        _ => {
            let sc = args.scalar("self")?;
            let d = crate::dtype::result_type(&[(seq.dtype, seq.rank), (sc.dtype(), Rank::Wrapped)]).unwrap();
            (cx.scalar(sc, d), Rank::Wrapped, sc.dtype())
        }
    };
    let vd = cx.dims(vals);
    check!(!sd.is_empty(), Runtime, "torch.searchsorted(): boundaries tensor should have positive dimension, but got 0 dimension");
    let ok = sd.len() == 1 || (sd.len() == vd.len() && sd[..sd.len() - 1] == vd[..vd.len() - 1]);
    check!(
        ok,
        Runtime,
        "torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 dimensions of boundaries tensor and input value tensor must match, but we got boundaries tensor {} and input value tensor {}",
        shape_str(&sd),
        shape_str(&vd)
    );
    if let Some(so) = &sorter {
        check!(so.dtype == I64, Runtime, "torch.searchsorted(): sorter must be a tensor of long dtype but got dtype {}", so.dtype.torch_name());
        check!(
            cx.dims(so.v) == sd,
            Runtime,
            "torch.searchsorted(): boundary and sorter must have the same size, but got boundary tensor {} and got sorter tensor {}",
            shape_str(&sd),
            shape_str(&cx.dims(so.v))
        );
    }
    one(search(cx, seq, vals, vrank, vdtype, right, out_int32, sorter)?)
}

fn bucketize(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let b = args.tensor("boundaries")?;
    let bd = cx.dims(b.v);
    check!(bd.len() == 1, Runtime, "boundaries tensor must be 1 dimension, but got dim({})", bd.len());
    let out_int32 = args.bool_or("out_int32", false)?;
    let right = args.bool_or("right", false)?;
    let (vals, vrank, vdtype) = match args.get("self") {
        Some(Arg::Tensor(t)) => (t.v, t.rank, t.dtype),
        _ => {
            let sc = args.scalar("self")?;
            let d = crate::dtype::result_type(&[(b.dtype, b.rank), (sc.dtype(), Rank::Wrapped)]).unwrap();
            (cx.scalar(sc, d), Rank::Wrapped, sc.dtype())
        }
    };
    one(search(cx, b, vals, vrank, vdtype, right, out_int32, None)?)
}

/// isin(elements, test_elements, assume_unique=False, invert=False) for tensors and scalars.
fn isin(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let operand = |cx: &mut Cx, names: &[&str]| -> Result<(Value, DType, Rank)> {
        for n in names {
            match args.get(n) {
                Some(Arg::Tensor(t)) => return Ok((t.v, t.dtype, t.rank)),
                Some(Arg::None) | None => continue,
                Some(_) => {
                    let s = args.scalar(n)?;
                    let d = match s {
                        Scalar::Float(_) => DType::F64,
                        _ => s.dtype(),
                    };
                    return Ok((cx.scalar(s, d), d, Rank::Wrapped));
                }
            }
        }
        Err(crate::TorchError::new(crate::ErrorKind::Type, "isin(): missing argument"))
    };
    let (e, ed, er) = operand(cx, &["elements", "element"])?;
    let (t, td, tr) = operand(cx, &["test_elements", "test_element"])?;
    let invert = args.bool_or("invert", false)?;
    for d in [ed, td] {
        check!(d != DType::Bool, Runtime, "Unsupported input type encountered for isin(): {}", d.torch_name());
    }
    let dt = crate::dtype::result_type(&[(ed, er), (td, tr)]).unwrap();
    let edims = cx.dims(e);
    let nt = numel(&cx.dims(t));
    let found = if nt == 0 || numel(&edims) == 0 {
        cx.full(0.0, DType::Bool, &edims)
    } else {
        let tv = cx.cast(t, dt);
        let tv = cx.reshape(tv, &[nt]);
        let ev = cx.cast(e, dt);
        let (sorted, _) = sort_with_positions(cx, tv);
        let n = numel(&edims);
        let flat = cx.reshape(ev, &[n]);
        let pos = lower_bound(cx, sorted, flat, false);
        let last = cx.full((nt - 1) as f64, I64, &[n]);
        let at = cx.min(pos, last);
        let b = take_along(cx, sorted, 0, at);
        let eq = cx.compare(CmpDir::Eq, b, flat);
        cx.reshape(eq, &edims)
    };
    one(if invert { cx.not(found) } else { found })
}
