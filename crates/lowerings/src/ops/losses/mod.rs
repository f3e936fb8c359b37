//! Losses, one family per file: nll.rs (nll_loss, nll_loss2d), pointwise.rs (mse, huber,
//! smooth_l1, binary_cross_entropy), margin.rs (multi_margin, multilabel_margin) and ctc.rs
//! (_ctc_loss). This file holds the `reduction` argument they share.
pub(crate) mod ctc;
pub(crate) mod margin;
pub(crate) mod nll;
pub(crate) mod pointwise;

use crate::args::Args;
use crate::bail;
// `constant` is this file's name for consts::k.
use crate::blocks::consts::k as constant;
use crate::blocks::reduce::{reduce, Red};
use crate::cx::Cx;
use crate::error::Result;
use stablehlo::Value;

/// Loss reductions as at::Reduction numbers them.
#[derive(Copy, Clone, PartialEq, Eq)]
pub(crate) enum Reduction {
    None,
    Mean,
    Sum,
}

pub(crate) fn reduction(args: &Args) -> Result<Reduction> {
    Ok(match args.int_or("reduction", 1)? {
        0 => Reduction::None,
        1 => Reduction::Mean,
        2 => Reduction::Sum,
        r => bail!(Value, "{} is not a valid value for reduction", r),
    })
}

/// at::native's apply_loss_reduction: the elementwise loss, its sum, or its mean.
fn apply_reduction(cx: &mut Cx, loss: Value, red: Reduction) -> Value {
    let all: Vec<i64> = (0..cx.dims(loss).len() as i64).collect();
    match red {
        Reduction::None => loss,
        Reduction::Sum => reduce(cx, loss, &all, Red::Sum),
        Reduction::Mean => {
            let n = cx.numel(loss);
            let s = reduce(cx, loss, &all, Red::Sum);
            let nv = constant(cx, n as f64, s);
            cx.div(s, nv)
        }
    }
}
