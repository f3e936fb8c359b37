//! Reflection and replication padding: reflection_pad1d/2d/3d and replication_pad1d/2d/3d
//! with their backward ops.
use crate::args::Args;
use crate::blocks::type_names::shape_str;
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use super::{dtype_check, product, take, take_transpose, zeros};

pub(crate) const OPS: &[Op] = &[
    op("reflection_pad1d", |cx, a| pad(cx, a, 1, true)),
    op("reflection_pad2d", |cx, a| pad(cx, a, 2, true)),
    op("reflection_pad3d", |cx, a| pad(cx, a, 3, true)),
    op("replication_pad1d", |cx, a| pad(cx, a, 1, false)),
    op("replication_pad2d", |cx, a| pad(cx, a, 2, false)),
    op("replication_pad3d", |cx, a| pad(cx, a, 3, false)),
    op("reflection_pad1d_backward", |cx, a| pad_backward(cx, a, 1, true)),
    op("reflection_pad2d_backward", |cx, a| pad_backward(cx, a, 2, true)),
    op("reflection_pad3d_backward", |cx, a| pad_backward(cx, a, 3, true)),
    op("replication_pad1d_backward", |cx, a| pad_backward(cx, a, 1, false)),
    op("replication_pad2d_backward", |cx, a| pad_backward(cx, a, 2, false)),
    op("replication_pad3d_backward", |cx, a| pad_backward(cx, a, 3, false)),
];

// ---- reflection / replication padding ---------------------------------------------------------

/// The source index of padded position `o` along a dim of `input` with `left` padding.
fn pad_source(o: i64, left: i64, input: i64, reflect: bool) -> i64 {
    let i = o - left;
    if reflect {
        if i < 0 {
            -i
        } else if i >= input {
            2 * (input - 1) - i
        } else {
            i
        }
    } else {
        i.clamp(0, input - 1)
    }
}

/// The per-dim source indices of a padding op (padding pairs from the last dim backwards).
fn pad_tables(dims: &[i64], padding: &[i64], reflect: bool) -> Vec<(usize, Vec<i64>)> {
    let n = padding.len() / 2;
    let r = dims.len();
    (0..n)
        .map(|i| {
            let a = r - 1 - i;
            let (l, h) = (padding[2 * i], padding[2 * i + 1]);
            let out = dims[a] + l + h;
            (a, (0..out).map(|o| pad_source(o, l, dims[a], reflect)).collect())
        })
        .collect()
}

fn pad_name(n: usize, reflect: bool) -> String {
    format!("{}_pad{}d", if reflect { "reflection" } else { "replication" }, n)
}

/// Checks of reflection/replication padding (padding::check_valid_input and the size checks);
/// returns the output dims.
fn pad_checks(dims: &[i64], padding: &[i64], n: usize, reflect: bool) -> Result<Vec<i64>> {
    check!(
        padding.len() == 2 * n,
        Runtime,
        "padding size is expected to be {}, but got: {}",
        2 * n,
        padding.len()
    );
    let r = dims.len();
    let ok = if r == n + 2 {
        dims[1..].iter().all(|&d| d != 0)
    } else {
        r == n + 1 && dims.iter().all(|&d| d != 0)
    };
    check!(
        ok,
        Runtime,
        "Expected {}D or {}D (batch mode) tensor with possibly 0 batch size and other non-zero dimensions for input, but got: {}",
        n + 1,
        n + 2,
        shape_str(dims)
    );
    let mut out = dims.to_vec();
    for i in 0..n {
        let a = r - 1 - i;
        let (l, h) = (padding[2 * i], padding[2 * i + 1]);
        if reflect {
            check!(
                l < dims[a] && h < dims[a],
                Runtime,
                "Argument #{}: Padding size should be less than the corresponding input dimension, but got: padding ({}, {}) at dimension {} of input {}",
                4 + 2 * i,
                l,
                h,
                a,
                shape_str(dims)
            );
        }
        out[a] = dims[a] + l + h;
    }
    check!(
        out[r - n..].iter().all(|&o| o >= 1),
        Runtime,
        "input (sizes {}) is too small. Calculated output sizes: {}",
        shape_str(&dims[r - n..]),
        shape_str(&out[r - n..])
    );
    Ok(out)
}

/// reflection_pad{1,2,3}d / replication_pad{1,2,3}d: gathers along each padded dim.
fn pad(cx: &mut Cx, args: &Args, n: usize, reflect: bool) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let padding = args.ints("padding")?;
    let dims = cx.dims(x.v);
    let out = pad_checks(&dims, &padding, n, reflect)?;
    dtype_check(x.dtype != DType::Bool, &pad_name(n, reflect), x.dtype)?;
    if product(&out) == 0 {
        return one(zeros(cx, x.dtype, &out));
    }
    let mut y = x.v;
    for (a, idx) in pad_tables(&dims, &padding, reflect) {
        y = take(cx, y, a, &idx);
    }
    one(y)
}

fn pad_backward(cx: &mut Cx, args: &Args, n: usize, reflect: bool) -> Result<Vec<Out>> {
    let g = args.tensor("grad_output")?;
    let x = args.tensor("self")?;
    let padding = args.ints("padding")?;
    let dims = cx.dims(x.v);
    let out = pad_checks(&dims, &padding, n, reflect)?;
    let gd = cx.dims(g.v);
    check!(
        gd == out,
        Runtime,
        "grad_output size unexpected. Expected: {}, Got: {}",
        shape_str(&out),
        shape_str(&gd)
    );
    dtype_check(x.dtype != DType::Bool, &format!("{}_backward", pad_name(n, reflect)), x.dtype)?;
    if product(&gd) == 0 || product(&dims) == 0 {
        return one(zeros(cx, x.dtype, &dims));
    }
    let work = if x.dtype.is_float() { x.dtype.opmath() } else { x.dtype };
    let mut y = cx.cast(g.v, work);
    for (a, idx) in pad_tables(&dims, &padding, reflect) {
        y = take_transpose(cx, y, a, &idx, dims[a]);
    }
    one(cx.cast(y, x.dtype))
}
