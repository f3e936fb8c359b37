//! The negative log likelihood loss: nll_loss_forward, nll_loss2d_forward and their backward
//! ops.
use crate::args::{Args, Tensor};
// `constant` is this file's name for consts::k.
use crate::blocks::consts::k as constant;
use crate::blocks::gather::{along_coords, gather_points, take_along};
use crate::blocks::reduce::{reduce, Red};
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use super::{reduction, Reduction};
use stablehlo::{CmpDir, ElemType, TensorType, Value};

pub(crate) const OPS: &[Op] = &[
    op("nll_loss_forward", |cx, a| nll_loss_forward(cx, a, false)),
    op("nll_loss2d_forward", |cx, a| nll_loss_forward(cx, a, true)),
    op("nll_loss_backward", |cx, a| nll_loss_backward(cx, a, false)),
    op("nll_loss2d_backward", |cx, a| nll_loss_backward(cx, a, true)),
];

// ---- nll_loss -----------------------------------------------------------------------------------

/// Checks of nll_loss(2d) and the input/target shaped as [N, C, rest...] / [N, rest...].
struct Nll {
    x: Tensor,
    t: Tensor,
    w: Option<Tensor>,
    /// An unbatched input ([C] with a 0-d target), computed as a batch of one.
    unbatched: bool,
}

fn nll_args(cx: &mut Cx, args: &Args, two_d: bool) -> Result<Nll> {
    let x = args.tensor("self")?;
    let t = args.tensor("target")?;
    let w = args.opt_tensor("weight")?;
    let xd = cx.dims(x.v);
    let td = cx.dims(t.v);
    if two_d {
        check!(
            td.len() == 3,
            Runtime,
            "only batches of spatial targets supported (3D tensors) but got targets of dimension: {}",
            td.len()
        );
        check!(
            xd.len() == 4,
            Runtime,
            "only batches of spatial inputs supported (4D tensors), but got input of dimension: {}",
            xd.len()
        );
        if let Some(w) = w {
            check!(cx.numel(w.v) == xd[1], Runtime, "weight tensor should be defined either for all or no classes");
        }
        check!(
            xd[0] == td[0] && xd[2] == td[1] && xd[3] == td[2],
            Runtime,
            "size mismatch (got input: {:?} , target: {:?}",
            xd,
            td
        );
    } else {
        check!(!xd.is_empty() && xd.len() <= 2, Runtime, "input tensor should be 1D or 2D");
        check!(td.len() <= 1, Runtime, "0D or 1D target tensor expected, multi-target not supported");
        let no_batch = xd.len() == 1 && td.is_empty();
        check!(
            no_batch || xd[0] == td[0] || (xd.len() == 1 && td[0] == 1),
            Runtime,
            "size mismatch (got input: {:?}, target: {:?})",
            xd,
            td
        );
        let n_classes = *xd.last().unwrap();
        if let Some(w) = w {
            let wd = cx.dims(w.v);
            check!(
                wd.len() == 1 && wd[0] == n_classes,
                Runtime,
                "weight tensor should be defined either for all {} classes or no classes but got weight tensor of shape: {:?}",
                n_classes,
                wd
            );
        }
    }
    check!(
        x.dtype.is_float(),
        NotImplemented,
        "\"{}\" not implemented for '{}'",
        if two_d { "nll_loss2d_forward_out_frame" } else { "nll_loss_out_frame" },
        x.dtype.torch_name()
    );
    check!(
        t.dtype == DType::I64 || t.dtype == DType::U8,
        Runtime,
        "expected scalar type Long but found {}",
        t.dtype.torch_name()
    );
    if let Some(w) = w {
        check!(w.dtype == x.dtype, Runtime, "expected scalar type {} but found {}", x.dtype.torch_name(), w.dtype.torch_name());
    }
    let unbatched = xd.len() == 1;
    let (mut x, mut t) = (x, t);
    if unbatched {
        x.v = cx.reshape(x.v, &[1, xd[0]]);
        t.v = cx.reshape(t.v, &[1]);
    }
    Ok(Nll { x, t, w, unbatched })
}

/// For x [N, C, rest...] and targets [N, rest...]: each target as an int64 class index
/// clamped into [0, C), and each sample's weight in `acc` (0 where the target is
/// ignore_index or outside [0, C)).
fn nll_targets(cx: &mut Cx, n: &Nll, ignore_index: i64, acc: DType) -> (Value, Value) {
    let classes = cx.dims(n.x.v)[1];
    let t = cx.convert(n.t.v, ElemType::I64);
    let td = cx.dims(t);
    let i64s = TensorType::new(ElemType::I64, &td);
    let ig = cx.b.splat_i64(ignore_index, &i64s);
    let lo = cx.b.splat_i64(0, &i64s);
    let hi = cx.b.splat_i64(classes - 1, &i64s);
    let not_ignored = cx.compare(CmpDir::Ne, t, ig);
    let at_least_0 = cx.compare(CmpDir::Ge, t, lo);
    let at_most_last = cx.compare(CmpDir::Le, t, hi);
    let in_range = cx.and(at_least_0, at_most_last);
    let counted = cx.and(not_ignored, in_range);
    let t = cx.b.clamp(lo, t, hi);
    let wi = match n.w {
        // No classes: every target is out of range (and a gather from nothing is invalid).
        _ if classes == 0 => cx.full(0.0, acc, &td),
        Some(w) => {
            let wv = cx.cast(w.v, acc);
            take_along(cx, wv, 0, t)
        }
        None => cx.full(1.0, acc, &td),
    };
    let zero = cx.full(0.0, acc, &td);
    (t, cx.select(counted, wi, zero))
}

/// The input's value at each sample's target class: x [N, C, rest...] at t [N, rest...].
fn pick_targets(cx: &mut Cx, x: Value, t: Value) -> Value {
    let td = cx.dims(t);
    if cx.numel(x) == 0 {
        let dt = cx.dtype(x);
        return cx.full(0.0, dt, &td);
    }
    let mut at = td.clone();
    at.insert(1, 1);
    let t = cx.reshape(t, &at);
    let coords = along_coords(cx, t, 1);
    let picked = gather_points(cx, x, coords);
    cx.reshape(picked, &td)
}

/// nll_loss_forward / nll_loss2d_forward(self, target, weight, reduction, ignore_index)
/// -> (output, total_weight). Targets outside [0, C) other than ignore_index contribute
/// nothing here (PyTorch raises an IndexError on CPU).
fn nll_loss_forward(cx: &mut Cx, args: &Args, two_d: bool) -> Result<Vec<Out>> {
    let n = nll_args(cx, args, two_d)?;
    let red = reduction(args)?;
    let ignore = args.int("ignore_index")?;
    let acc = n.x.dtype.opmath();
    let (t, wi) = nll_targets(cx, &n, ignore, acc);
    // A gather of one value per sample, not a pass over every class.
    let xi = pick_targets(cx, n.x.v, t);
    let xi = cx.cast(xi, acc);
    let li = cx.mul(wi, xi);
    let li = cx.neg(li);
    // Ignored samples contribute exactly zero, whatever their input values.
    let zero_t = constant(cx, 0.0, li);
    let pos = constant(cx, 0.0, wi);
    let counted = cx.compare(CmpDir::Ne, wi, pos);
    let li = cx.select(counted, li, zero_t);
    let all: Vec<i64> = (0..cx.dims(li).len() as i64).collect();
    let total = reduce(cx, wi, &all, Red::Sum);
    let out = match red {
        Reduction::None => {
            if n.unbatched {
                cx.reshape(li, &[])
            } else {
                li
            }
        }
        Reduction::Sum => reduce(cx, li, &all, Red::Sum),
        Reduction::Mean => {
            let s = reduce(cx, li, &all, Red::Sum);
            cx.div(s, total)
        }
    };
    let total = if red == Reduction::None { cx.full(0.0, acc, &[]) } else { total };
    let out = cx.cast(out, n.x.dtype);
    let total = cx.cast(total, n.x.dtype);
    Ok(vec![Out::Tensor(out), Out::Tensor(total)])
}

/// nll_loss_backward / nll_loss2d_backward(grad_output, self, target, weight, reduction,
/// ignore_index, total_weight) -> grad_input.
fn nll_loss_backward(cx: &mut Cx, args: &Args, two_d: bool) -> Result<Vec<Out>> {
    let g = args.tensor("grad_output")?;
    let n = nll_args(cx, args, two_d)?;
    let red = reduction(args)?;
    let ignore = args.int("ignore_index")?;
    let acc = n.x.dtype.opmath();
    let (t, wi) = nll_targets(cx, &n, ignore, acc);
    let xd = cx.dims(n.x.v);
    let td = cx.dims(wi);
    let gv = cx.cast(g.v, acc);
    let gi = match red {
        Reduction::None => {
            let gd = cx.dims(gv);
            check!(
                cx.numel(gv) == td.iter().product::<i64>(),
                Runtime,
                "Expected a tensor of dimension 1 and tensor.size[0] == {} but got: dimension {} and tensor.size[0] == {}",
                td[0],
                gd.len(),
                gd.first().copied().unwrap_or(1)
            );
            cx.reshape(gv, &td)
        }
        _ => {
            check!(
                cx.numel(gv) == 1,
                Runtime,
                "Expected a single element grad_output tensor, but got: {:?}",
                cx.dims(gv)
            );
            let gs = cx.reshape(gv, &[]);
            let gs = if red == Reduction::Mean {
                let tw = args.tensor("total_weight")?;
                let twv = cx.cast(tw.v, acc);
                let twv = cx.reshape(twv, &[]);
                cx.div(gs, twv)
            } else {
                gs
            };
            cx.broadcast_in_dim(gs, &td, &[])
        }
    };
    let per = cx.mul(wi, gi);
    let per = cx.neg(per);
    let nd = xd.len() as i64;
    let tdims: Vec<i64> = std::iter::once(0).chain(2..nd).collect();
    let pb = cx.broadcast_in_dim(per, &xd, &tdims);
    let tb = cx.broadcast_in_dim(t, &xd, &tdims);
    let classes = cx.iota(&TensorType::new(ElemType::I64, &xd), 1);
    let onehot = cx.compare(CmpDir::Eq, classes, tb);
    let zero = cx.full(0.0, acc, &xd);
    let out = cx.select(onehot, pb, zero);
    let out = if n.unbatched { cx.reshape(out, &[xd[1]]) } else { out };
    one(cx.cast(out, n.x.dtype))
}
