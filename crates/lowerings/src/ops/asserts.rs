//! Assertions on data: _assert_async and _functional_assert_async, checked at the next
//! synchronization like the index checks (`Cx::check_index`).
use crate::args::Args;
use crate::cx::Cx;
use crate::error::{ErrorKind, Result};
use crate::{check, one, Out, op, Op};
use stablehlo::CmpDir;

pub(crate) const OPS: &[Op] = &[
    op("_assert_async", assert_async),
    op("_functional_assert_async", assert_async),
];

/// _assert_async(self[, assert_msg]) and _functional_assert_async.msg(self, assert_msg,
/// dep_token): a one-element tensor that must be nonzero. Like CUDA, the value is checked on
/// the device without waiting: a failure raises RuntimeError with the message at the next
/// synchronization (see the engine's checks). The functional form returns its dep_token.
fn assert_async(cx: &mut Cx, args: &Args) -> Result<Vec<Out>> {
    let x = args.tensor("self")?;
    let n = cx.numel(x.v);
    check!(n != 0, Runtime, "Boolean value of Tensor with no values is ambiguous");
    check!(n < 2, Runtime, "Boolean value of Tensor with more than one value is ambiguous");
    let msg = match args.str("assert_msg")? {
        Some(m) => m.to_string(),
        None => "Expected Tensor with single nonzero value, but got zero".to_string(),
    };
    let v = cx.reshape(x.v, &[]);
    let zero = cx.full(0.0, x.dtype, &[]);
    let is_zero = cx.compare(CmpDir::Eq, v, zero);
    cx.add_condition_check(is_zero, ErrorKind::Runtime, msg);
    match args.opt_tensor("dep_token")? {
        Some(t) => one(t.v),
        None => Ok(vec![]),
    }
}
