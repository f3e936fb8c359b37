//! The operands of promoting ops: a tensor or a Python number each (`Operand`), their promoted
//! dtype (`operands`), both cast and broadcast (`pair`), and PyTorch's float result rule.
use crate::args::{Arg, Args, Scalar, Tensor};
use crate::cx::Cx;
use crate::dtype::{result_type, DType, Rank};
use crate::error::Result;
use stablehlo::Value;

/// A tensor or a Python number in a promoting op.
#[derive(Copy, Clone)]
pub(crate) enum Operand {
    T(Tensor),
    S(Scalar),
}

impl Operand {
    pub(crate) fn get(args: &Args, name: &str) -> Result<Operand> {
        match args.get(name) {
            Some(Arg::Tensor(t)) => Ok(Operand::T(*t)),
            _ => Ok(Operand::S(args.scalar(name)?)),
        }
    }

    pub(crate) fn promo(&self) -> (DType, Rank) {
        match self {
            Operand::T(t) => (t.dtype, t.rank),
            Operand::S(s) => (s.dtype(), Rank::Wrapped),
        }
    }

    pub(crate) fn value(&self, cx: &mut Cx, dtype: DType) -> Value {
        match self {
            Operand::T(t) => cx.cast(t.v, dtype),
            Operand::S(s) => cx.scalar(*s, dtype),
        }
    }
}

/// Both operands, and their promoted dtype.
pub(crate) fn operands(args: &Args, a: &str, b: &str) -> Result<(Operand, Operand, DType)> {
    let x = Operand::get(args, a)?;
    let y = Operand::get(args, b)?;
    let dt = result_type(&[x.promo(), y.promo()]).unwrap();
    Ok((x, y, dt))
}

/// Both operands converted to `dtype` and broadcast together.
pub(crate) fn pair(cx: &mut Cx, a: Operand, b: Operand, dtype: DType) -> Result<(Value, Value)> {
    let av = a.value(cx, dtype);
    let bv = b.value(cx, dtype);
    let vs = cx.broadcast_all(&[av, bv])?;
    Ok((vs[0], vs[1]))
}

/// PyTorch's dtype for ops that always produce floats: integers and bools give the default float.
pub(crate) fn float_result(d: DType) -> DType {
    if d.is_float() || d.is_complex() {
        d
    } else {
        DType::F32
    }
}
