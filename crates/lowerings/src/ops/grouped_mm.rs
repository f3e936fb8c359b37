//! torch._grouped_mm: the matrix products of mixture-of-experts layers, where consecutive runs
//! of rows (tokens sorted by expert) meet their own expert's weights. `offs` holds the int32
//! end of each group; rows after the last end give zeros. One program per call instead of
//! PyTorch's composite (one product per group, after a host read of `offs`): `chlo.ragged_dot`
//! where the plugin compiles it (`set_ragged_dot`), else dense products of every group that
//! keep each row's own (G times the arithmetic; XLA:CPU has no ragged dot).
use crate::args::{Args, Tensor};
use crate::blocks::precision;
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{bail, check, one, Out, op, Op};
use std::sync::atomic::{AtomicBool, Ordering};
use stablehlo::{CmpDir, Value};

static RAGGED_DOT: AtomicBool = AtomicBool::new(false);

/// Whether the plugin compiles `chlo.ragged_dot` (set once by the engine for its platform).
pub fn set_ragged_dot(supported: bool) {
    RAGGED_DOT.store(supported, Ordering::Relaxed);
}

pub(crate) const OPS: &[Op] = &[
    // Routed: its composite runs one product per group after reading the offsets on the host.
    op("_grouped_mm", grouped_mm).routed(&["_grouped_mm"]),
];

/// Group sizes from group ends: [e0, e1 - e0, e2 - e1, ...].
fn group_sizes(cx: &mut Cx, offs: Value) -> Value {
    let g = cx.dims(offs)[0];
    let ends = cx.cast(offs, DType::I32);
    if g == 0 {
        return ends;
    }
    let zero = cx.full(0.0, DType::I32, &[1]);
    let head = cx.b.slice(ends, &[0], &[g - 1], &[1]);
    let starts = cx.b.concatenate(&[zero, head], 0);
    cx.b.sub(ends, starts)
}

/// One-hot group membership [P, G] (f32 0/1) of positions 0..P given group ends; positions
/// past the last end belong to no group.
fn membership(cx: &mut Cx, offs: Value, positions: i64, acc: DType) -> Value {
    let g = cx.dims(offs)[0];
    let ends = cx.cast(offs, DType::I64);
    let ty = stablehlo::TensorType { elem: DType::I64.elem(), dims: vec![positions, g] };
    let pos = cx.b.iota(&ty, 0);
    let ends = cx.b.broadcast_in_dim(ends, &[positions, g], &[1]);
    // group(p) = number of ends <= p; p is in group j when group(p) == j.
    let past = cx.b.compare(CmpDir::Le, ends, pos);
    let past = cx.cast(past, DType::I64);
    let group = crate::blocks::reduce::reduce(cx, past, &[1], crate::blocks::reduce::Red::Sum);
    let group = cx.b.broadcast_in_dim(group, &[positions, g], &[0]);
    let col = cx.b.iota(&ty, 1);
    let member = cx.b.compare(CmpDir::Eq, group, col);
    cx.cast(member, acc)
}

fn transpose_last(cx: &mut Cx, v: Value) -> Value {
    let n = cx.dims(v).len() as i64;
    let mut perm: Vec<i64> = (0..n).collect();
    perm.swap(n as usize - 1, n as usize - 2);
    cx.b.transpose(v, &perm)
}

/// (self, mat2, offs?, bias?, out_dtype?) -> Tensor
fn grouped_mm(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let a = args.tensor("self")?;
    let b = args.tensor("mat2")?;
    let offs: Option<Tensor> = args.opt_tensor("offs")?;
    check!(args.opt_tensor("bias")?.is_none(), Runtime, "Bias tensor provided, but it is not supported yet.");
    check!(
        a.dtype == b.dtype && a.dtype.is_float(),
        Runtime,
        "Expected mat_a and mat_b to have the same floating-point dtype, got mat_a.dtype={} and mat_b.dtype={}",
        a.dtype.torch_name(),
        b.dtype.torch_name()
    );
    let out_dtype = args.dtype("out_dtype")?.unwrap_or(a.dtype);
    check!(out_dtype.is_float(), Runtime, "_grouped_mm: out_dtype must be a floating-point dtype");
    let (ad, bd) = (cx.dims(a.v), cx.dims(b.v));
    check!(
        matches!(ad.len(), 2 | 3) && matches!(bd.len(), 2 | 3),
        Runtime,
        "Multiplicands must be 2D or 3D but got mat_a.dim()={} and mat_b.dim()={}",
        ad.len(),
        bd.len()
    );
    let (a2, b2) = (ad.len() == 2, bd.len() == 2);
    if !(a2 && b2) {
        check!(ad[ad.len() - 1] == bd[bd.len() - 2], Runtime, "contraction dimension of mat_a and mat_b must match");
    }
    let acc = a.dtype.opmath().elem();
    precision::set_for(cx, a.dtype);
    let out = if !a2 && !b2 {
        check!(offs.is_none(), Runtime, "Offsets tensor provided, but is not needed for 3D/3D multiplicand layouts.");
        check!(ad[0] == bd[0], Runtime, "batched dimension has to match");
        cx.b.dot_general(a.v, b.v, &[0], &[0], &[2], &[1], acc)
    } else {
        let Some(offs) = offs else {
            bail!(Runtime, "Offsets tensor not provided, but is needed for {}D/{}D multiplicand layouts.", ad.len(), bd.len());
        };
        check!(cx.dims(offs.v).len() == 1, Runtime, "Offsets tensor must be 1D, but got offs.dim()={}.", cx.dims(offs.v).len());
        check!(
            offs.dtype == DType::I32,
            Runtime,
            "Offsets tensor must be integer (int32) tensor, but got {}.",
            offs.dtype.torch_name()
        );
        let g = cx.dims(offs.v)[0];
        match (a2, b2) {
            (true, false) => check!(g == bd[0], Runtime, "matrix batch sizes have to match"),
            (true, true) => check!(ad[1] == bd[0], Runtime, "contraction dimension of mat_a and mat_b must match"),
            _ => check!(g == ad[0], Runtime, "matrix batch sizes have to match"),
        }
        if RAGGED_DOT.load(Ordering::Relaxed) {
            ragged(cx, a.v, b.v, offs.v, a2, b2, acc)
        } else {
            dense(cx, a.v, b.v, offs.v, a2, b2, acc)
        }
    };
    one(cx.cast(out, out_dtype))
}

/// The grouped product as one `chlo.ragged_dot`.
fn ragged(cx: &mut Cx, a: Value, b: Value, offs: Value, a2: bool, b2: bool, acc: stablehlo::ElemType) -> Value {
    let sizes = group_sizes(cx, offs);
    match (a2, b2) {
        // Rows of a grouped, one expert matrix per group: [M, K] x [G, K, N] -> [M, N].
        (true, false) => cx.b.ragged_dot(a, b, sizes, 1, 1, 0, Some(0), acc),
        // The shared dim grouped (the weight gradient): [M, K] x [K, N] -> [G, M, N].
        (true, true) => cx.b.ragged_dot(a, b, sizes, 1, 0, 1, None, acc),
        // Columns of b grouped: [G, M, K] x [K, N] -> [M, N], as [N, K] x [G, K, M] -> [N, M].
        _ => {
            let bt = transpose_last(cx, b);
            let at = transpose_last(cx, a);
            let r = cx.b.ragged_dot(bt, at, sizes, 1, 1, 0, Some(0), acc);
            transpose_last(cx, r)
        }
    }
}

/// The grouped product from every group's dense product, keeping each position's own group.
fn dense(cx: &mut Cx, a: Value, b: Value, offs: Value, a2: bool, b2: bool, acc: stablehlo::ElemType) -> Value {
    let acc_dt = DType::from_elem(acc);
    let (ad, bd) = (cx.dims(a), cx.dims(b));
    match (a2, b2) {
        // [M, K] x [G, K, N]: all [M, G, N], then row m keeps group(m).
        (true, false) => {
            let all = cx.b.dot_general(a, b, &[], &[], &[1], &[1], acc);
            let member = membership(cx, offs, ad[0], acc_dt);
            cx.b.dot_general(member, all, &[0], &[0], &[1], &[1], acc)
        }
        // [M, K] x [K, N] grouped along K: a masked per group [G, M, K] x b -> [G, M, N].
        (true, true) => {
            let member = membership(cx, offs, ad[1], acc_dt);
            let g = cx.dims(member)[1];
            let mask = cx.b.transpose(member, &[1, 0]);
            let mask = cx.cast(mask, DType::from_elem(cx.b.elem(a)));
            let mask = cx.b.broadcast_in_dim(mask, &[g, ad[0], ad[1]], &[0, 2]);
            let ab = cx.b.broadcast_in_dim(a, &[g, ad[0], ad[1]], &[1, 2]);
            let masked = cx.b.mul(ab, mask);
            cx.b.dot_general(masked, b, &[], &[], &[2], &[0], acc)
        }
        // [G, M, K] x [K, N] grouped along N: all [G, M, N], then column n keeps group(n).
        _ => {
            let all = cx.b.dot_general(a, b, &[], &[], &[2], &[0], acc);
            let member = membership(cx, offs, bd[1], acc_dt);
            let r = cx.b.dot_general(all, member, &[2], &[0], &[0], &[1], acc);
            cx.b.transpose(r, &[1, 0])
        }
    }
}
