//! Views as values, for compiled graphs: permute, view/reshape, expand, squeeze/unsqueeze,
//! slice, select, t/transpose, alias/detach/lift_fresh_copy, split, split_with_sizes and
//! unbind. In eager mode these never reach a lowering (the C++ shim makes views as metadata
//! over shared storage), but a functional ATen graph from AOTAutograd contains them.
use crate::args::Args;
use crate::cx::{wrap_dim, Cx};
use crate::error::Result;
use crate::{bail, check, one, Out, op, Op};

pub(crate) const OPS: &[Op] = &[
    op("permute", permute).float4(),
    op("view", view).float4(),
    op("_unsafe_view", view).float4(),
    op("reshape", view).float4(),
    op("_reshape_alias", view).float4(),
    op("expand", expand).float4(),
    op("squeeze", squeeze).float4(),
    op("unsqueeze", unsqueeze).float4(),
    op("slice", slice).float4(),
    op("select", select).float4(),
    op("t", t).float4(),
    op("transpose", transpose).float4(),
    op("alias", identity).float4(),
    op("detach", identity).float4(),
    op("lift_fresh_copy", identity).float4(),
    op("split_with_sizes", split_with_sizes).float4(),
    op("split", split).float4(),
    op("unbind", unbind).float4(),
];

fn pieces(cx: &mut Cx, v: stablehlo::Value, d: usize, sizes: &[i64]) -> Vec<stablehlo::Value> {
    let dims = cx.dims(v);
    let mut start = 0;
    let mut out = Vec::with_capacity(sizes.len());
    for &n in sizes {
        let mut lo = vec![0; dims.len()];
        let mut hi = dims.clone();
        lo[d] = start;
        hi[d] = start + n;
        out.push(cx.slice(v, &lo, &hi, &vec![1; dims.len()]));
        start += n;
    }
    out
}

fn split_with_sizes(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let dims = cx.dims(x.v);
    let d = wrap_dim(args.int_or("dim", 0)?, dims.len())?;
    let sizes = args.ints("split_sizes")?;
    check!(
        sizes.iter().all(|&n| n >= 0) && sizes.iter().sum::<i64>() == dims[d],
        Runtime,
        "split_with_sizes expects split_sizes to sum exactly to {} (input tensor's size at dimension {}), but got split_sizes={:?}",
        dims[d],
        d,
        sizes
    );
    Ok(vec![Out::List(pieces(cx, x.v, d, &sizes))])
}

fn split(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let dims = cx.dims(x.v);
    let d = wrap_dim(args.int_or("dim", 0)?, dims.len())?;
    let size = args.int("split_size")?;
    check!(size > 0 || dims[d] == 0, Runtime, "split_size can only be 0 if dimension size is 0, but got dimension size of {}", dims[d]);
    let mut sizes = Vec::new();
    let mut left = dims[d];
    while left > 0 {
        sizes.push(size.min(left));
        left -= size;
    }
    if sizes.is_empty() {
        sizes.push(0);
    }
    Ok(vec![Out::List(pieces(cx, x.v, d, &sizes))])
}

fn unbind(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let dims = cx.dims(x.v);
    let d = wrap_dim(args.int_or("dim", 0)?, dims.len())?;
    let mut rest = dims.clone();
    rest.remove(d);
    let parts = pieces(cx, x.v, d, &vec![1; dims[d] as usize]);
    Ok(vec![Out::List(parts.into_iter().map(|p| cx.reshape(p, &rest)).collect())])
}

fn identity(_cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    one(args.tensor("self")?.v)
}

fn permute(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let nd = cx.dims(x.v).len();
    let dims = args.ints("dims")?;
    check!(dims.len() == nd, Runtime, "permute(sparse_coo): number of dimensions in the tensor input does not match the length of the desired ordering of dimensions i.e. input.dim() = {} is not equal to len(dims) = {}", nd, dims.len());
    let perm: Vec<i64> = dims.iter().map(|&d| wrap_dim(d, nd).map(|d| d as i64)).collect::<Result<_>>()?;
    one(cx.transpose(x.v, &perm))
}

/// The target shape of view/reshape with one -1 inferred, with PyTorch's errors.
fn infer_shape(shape: &[i64], numel: i64) -> Result<Vec<i64>> {
    let mut out = shape.to_vec();
    let mut infer = None;
    let mut known = 1i64;
    for (i, &d) in shape.iter().enumerate() {
        if d == -1 {
            check!(infer.is_none(), Runtime, "only one dimension can be inferred");
            infer = Some(i);
        } else {
            check!(d >= 0, Runtime, "invalid shape dimension {}", d);
            known *= d;
        }
    }
    match infer {
        Some(i) => {
            check!(known != 0 && numel % known == 0, Runtime, "shape '{:?}' is invalid for input of size {}", shape, numel);
            out[i] = numel / known;
        }
        None => check!(known == numel, Runtime, "shape '{:?}' is invalid for input of size {}", shape, numel),
    }
    Ok(out)
}

fn view(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let shape = args.ints("size").or_else(|_| args.ints("shape"))?;
    let dims = infer_shape(&shape, cx.numel(x.v))?;
    one(cx.reshape(x.v, &dims))
}

fn expand(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let size = args.ints("size")?;
    let xd = cx.dims(x.v);
    check!(size.len() >= xd.len(), Runtime, "expand: the number of sizes provided ({}) must be greater or equal to the number of dimensions in the tensor ({})", size.len(), xd.len());
    let off = size.len() - xd.len();
    let mut out = size.clone();
    for (i, d) in out.iter_mut().enumerate() {
        if i >= off && *d == -1 {
            *d = xd[i - off];
        }
        if i >= off && xd[i - off] != 1 && xd[i - off] != *d {
            bail!(Runtime, "The expanded size of the tensor ({}) must match the existing size ({}) at non-singleton dimension {}.  Target sizes: {:?}.  Tensor sizes: {:?}", *d, xd[i - off], i, size, xd);
        }
    }
    one(cx.broadcast_to(x.v, &out))
}

fn squeeze(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let xd = cx.dims(x.v);
    let which: Vec<usize> = match args.get("dim") {
        None | Some(crate::Arg::None) => (0..xd.len()).collect(),
        _ => args.ints("dim")?.iter().map(|&d| wrap_dim(d, xd.len())).collect::<Result<_>>()?,
    };
    let out: Vec<i64> = xd.iter().enumerate().filter(|(i, &d)| !(d == 1 && which.contains(i))).map(|(_, &d)| d).collect();
    one(cx.reshape(x.v, &out))
}

fn unsqueeze(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let mut xd = cx.dims(x.v);
    let d = wrap_dim(args.int("dim")?, xd.len() + 1)?;
    xd.insert(d, 1);
    one(cx.reshape(x.v, &xd))
}

fn slice(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let xd = cx.dims(x.v);
    let d = wrap_dim(args.int_or("dim", 0)?, xd.len())?;
    let n = xd[d];
    let step = args.int_or("step", 1)?;
    check!(step > 0, Runtime, "slice step must be positive");
    // Python slice clamping: negative wraps, then clamp to [0, n].
    let clamp = |v: i64| if v < 0 { (v + n).max(0) } else { v.min(n) };
    let start = clamp(args.opt_int("start")?.unwrap_or(0));
    let end = clamp(args.opt_int("end")?.unwrap_or(n)).max(start);
    let mut lo = vec![0; xd.len()];
    let mut hi = xd.clone();
    let mut st = vec![1; xd.len()];
    lo[d] = start;
    hi[d] = end;
    st[d] = step;
    one(cx.slice(x.v, &lo, &hi, &st))
}

fn select(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let xd = cx.dims(x.v);
    check!(!xd.is_empty(), Index, "select() cannot be applied to a 0-dim tensor.");
    let d = wrap_dim(args.int("dim")?, xd.len())?;
    let n = xd[d];
    let i = args.int("index")?;
    check!(i >= -n && i < n, Index, "select(): index {} out of range for tensor of size {:?} at dimension {}", i, xd, d);
    let i = if i < 0 { i + n } else { i };
    let mut lo = vec![0; xd.len()];
    let mut hi = xd.clone();
    lo[d] = i;
    hi[d] = i + 1;
    let s = cx.slice(x.v, &lo, &hi, &vec![1; xd.len()]);
    let mut out = xd.clone();
    out.remove(d);
    one(cx.reshape(s, &out))
}

fn transpose_dims(cx: &mut Cx, v: stablehlo::Value, a: i64, b: i64) -> Result<stablehlo::Value> {
    let nd = cx.dims(v).len();
    let (a, b) = (wrap_dim(a, nd)?, wrap_dim(b, nd)?);
    let mut perm: Vec<i64> = (0..nd as i64).collect();
    if nd > 0 {
        perm.swap(a, b);
    }
    Ok(cx.transpose(v, &perm))
}

fn t(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let nd = cx.dims(x.v).len();
    check!(nd <= 2, Runtime, "t() expects a tensor with <= 2 dimensions, but self is {}D", nd);
    if nd < 2 {
        return one(x.v);
    }
    one(transpose_dims(cx, x.v, 0, 1)?)
}

fn transpose(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    one(transpose_dims(cx, x.v, args.int("dim0")?, args.int("dim1")?)?)
}
