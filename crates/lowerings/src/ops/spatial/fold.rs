//! Sliding blocks: im2col (F.unfold) and col2im (F.fold).
use crate::args::Args;
use crate::blocks::type_names::shape_str;
use crate::cx::Cx;
use crate::dtype::DType;
use crate::error::Result;
use crate::{check, one, Out, op, Op};
use super::{div_floor, dtype_check, is_floating, product, take, take_transpose, zeros};

pub(crate) const OPS: &[Op] = &[
    op("im2col", im2col),
    op("col2im", col2im),
];

// ---- im2col / col2im --------------------------------------------------------------------------

fn pair(args: &Args, name: &str) -> Result<(i64, i64)> {
    let v = args.ints(name)?;
    check!(v.len() == 2, Runtime, "It is expected {} equals to 2, but got size {}", name, v.len());
    Ok((v[0], v[1]))
}

/// Unfold parameters: kernel, dilation, padding, stride as (height, width) pairs.
struct Unfold {
    k: [i64; 2],
    d: [i64; 2],
    p: [i64; 2],
    s: [i64; 2],
}

fn unfold_params(args: &Args) -> Result<Unfold> {
    let k = pair(args, "kernel_size")?;
    let d = pair(args, "dilation")?;
    let p = pair(args, "padding")?;
    let s = pair(args, "stride")?;
    let u = Unfold { k: [k.0, k.1], d: [d.0, d.1], p: [p.0, p.1], s: [s.0, s.1] };
    check!(
        u.k.iter().all(|&x| x > 0),
        Runtime,
        "kernel size should be greater than zero, but got kernel_height: {} kernel_width: {}",
        u.k[0],
        u.k[1]
    );
    check!(
        u.d.iter().all(|&x| x > 0),
        Runtime,
        "dilation should be greater than zero, but got dilation_height: {} dilation_width: {}",
        u.d[0],
        u.d[1]
    );
    check!(
        u.p.iter().all(|&x| x >= 0),
        Runtime,
        "padding should be non-negative, but got pad_height: {} pad_width: {}",
        u.p[0],
        u.p[1]
    );
    check!(
        u.s.iter().all(|&x| x > 0),
        Runtime,
        "stride should be greater than zero, but got stride_height: {} stride_width: {}",
        u.s[0],
        u.s[1]
    );
    Ok(u)
}

impl Unfold {
    /// Number of blocks along spatial dim i of an image of size `size`.
    fn blocks(&self, i: usize, size: i64) -> i64 {
        div_floor(size + 2 * self.p[i] - (self.d[i] * (self.k[i] - 1) + 1), self.s[i]) + 1
    }

    /// Gather indices (into the padded image) of dim i: kernel offset major, block minor.
    fn table(&self, i: usize, blocks: i64) -> Vec<i64> {
        let mut idx = Vec::new();
        for j in 0..self.k[i] {
            for b in 0..blocks {
                idx.push(b * self.s[i] + j * self.d[i]);
            }
        }
        idx
    }
}

fn unfold_dtype_check(kernel: &str, d: DType) -> Result<()> {
    dtype_check(is_floating(d) || d == DType::Bool || d.is_complex(), kernel, d)
}

/// im2col(self, kernel_size, dilation, padding, stride): (N, C, H, W) -> (N, C*kh*kw, L).
fn im2col(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let u = unfold_params(args)?;
    let dims = cx.dims(x.v);
    let r = dims.len();
    let valid = (r == 3 && dims[0] != 0 && dims[1] != 0 && dims[2] != 0) || (r == 4 && dims[1] != 0 && dims[2] != 0 && dims[3] != 0);
    check!(
        valid,
        Runtime,
        "Expected 3D or 4D (batch mode) tensor with possibly 0 batch size and other non-zero dimensions for input, but got: {}",
        shape_str(&dims)
    );
    let (h, w) = (dims[r - 2], dims[r - 1]);
    let (oh, ow) = (u.blocks(0, h), u.blocks(1, w));
    check!(
        oh >= 1 && ow >= 1,
        Runtime,
        "Given input with spatial size ({}, {}), kernel_size=({}, {}), dilation=({}, {}), padding=({}, {}), calculated shape of the array of sliding blocks as ({}, {}), but its components must be at least one.",
        h, w, u.k[0], u.k[1], u.d[0], u.d[1], u.p[0], u.p[1], oh, ow
    );
    unfold_dtype_check("im2col_out_cpu", x.dtype)?;
    let xv = if r == 3 { cx.reshape(x.v, &[1, dims[0], h, w]) } else { x.v };
    let (nb, c) = (if r == 3 { 1 } else { dims[0] }, dims[r - 3]);
    let (kh, kw) = (u.k[0], u.k[1]);
    let mut out_dims = vec![nb, c * kh * kw, oh * ow];
    if product(&out_dims) == 0 {
        if r == 3 {
            out_dims.remove(0);
        }
        return one(zeros(cx, x.dtype, &out_dims));
    }
    let z = cx.constant_f64(0.0, x.dtype.elem());
    let xp = cx.pad(xv, z, &[0, 0, u.p[0], u.p[1]], &[0, 0, u.p[0], u.p[1]], &[0; 4]);
    let y = take(cx, xp, 2, &u.table(0, oh));
    let y = take(cx, y, 3, &u.table(1, ow));
    let y = cx.reshape(y, &[nb, c, kh, oh, kw, ow]);
    let y = cx.transpose(y, &[0, 1, 2, 4, 3, 5]);
    let y = cx.reshape(y, &out_dims);
    if r == 3 {
        out_dims.remove(0);
        return one(cx.reshape(y, &out_dims));
    }
    one(y)
}

/// col2im(self, output_size, kernel_size, dilation, padding, stride): the blocks of
/// (N, C*kh*kw, L) summed back into (N, C, H, W).
fn col2im(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let (oh_img, ow_img) = pair(args, "output_size")?;
    let u = unfold_params(args)?;
    let dims = cx.dims(x.v);
    let r = dims.len();
    let valid = (r == 2 && dims[0] != 0 && dims[1] != 0) || (r == 3 && dims[1] != 0 && dims[2] != 0);
    check!(
        valid,
        Runtime,
        "Expected 2D or 3D (batch mode) tensor for input with possibly 0 batch size and non-zero dimensions for input, but got: {}",
        shape_str(&dims)
    );
    let planes = dims[r - 2];
    let (kh, kw) = (u.k[0], u.k[1]);
    check!(
        planes % (kh * kw) == 0,
        Runtime,
        "Expected size of input's dimension 1 to be divisible by the product of kernel_size, but got input.size(1)={} and kernel_size=({}, {}).",
        planes,
        kh,
        kw
    );
    let (bh, bw) = (u.blocks(0, oh_img), u.blocks(1, ow_img));
    let len = dims[r - 1];
    check!(
        len == bh * bw,
        Runtime,
        "Given output_size=({}, {}), kernel_size=({}, {}), dilation=({}, {}), padding=({}, {}), stride=({}, {}), expected size of input's dimension 2 to match the calculated number of sliding blocks {} * {} = {}, but got input.size(2)={}.",
        oh_img, ow_img, kh, kw, u.d[0], u.d[1], u.p[0], u.p[1], u.s[0], u.s[1], bh, bw, bh * bw, len
    );
    check!(
        bh >= 1 && bw >= 1,
        Runtime,
        "Given output_size=({}, {}), calculated shape of the array of sliding blocks as ({}, {}), which is too small (non-positive)",
        oh_img,
        ow_img,
        bh,
        bw
    );
    check!(
        oh_img >= 1 && ow_img >= 1,
        Runtime,
        "Expected output spatial size to be positive, but got: output_size=({}, {}).",
        oh_img,
        ow_img
    );
    unfold_dtype_check("col2im_out_cpu", x.dtype)?;
    let nb = if r == 2 { 1 } else { dims[0] };
    let c = planes / (kh * kw);
    let mut out_dims = vec![nb, c, oh_img, ow_img];
    if r == 2 {
        out_dims.remove(0);
    }
    if nb * c == 0 {
        return one(zeros(cx, x.dtype, &out_dims));
    }
    let work = if x.dtype.is_float() { x.dtype.opmath() } else { x.dtype };
    let v = cx.cast(x.v, work);
    let v = cx.reshape(v, &[nb, c, kh, kw, bh, bw]);
    let v = cx.transpose(v, &[0, 1, 2, 4, 3, 5]);
    let v = cx.reshape(v, &[nb, c, kh * bh, kw * bw]);
    let (hp, wp) = (oh_img + 2 * u.p[0], ow_img + 2 * u.p[1]);
    let v = take_transpose(cx, v, 3, &u.table(1, bw), wp);
    let v = take_transpose(cx, v, 2, &u.table(0, bh), hp);
    let v = cx.slice(v, &[0, 0, u.p[0], u.p[1]], &[nb, c, u.p[0] + oh_img, u.p[1] + ow_img], &[1; 4]);
    let v = cx.cast(v, x.dtype);
    one(cx.reshape(v, &out_dims))
}
