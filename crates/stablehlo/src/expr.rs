//! Formulas that read like formulas: values with arithmetic operators and methods, and plain
//! numbers as constants shaped like the value they meet.
//!
//! ```
//! use stablehlo::{Builder, ElemType, Ex, TensorType};
//! let mut b = Builder::new();
//! let x = b.param(TensorType::new(ElemType::F32, &[4]));
//! let e = Ex::new(&mut b);
//! let x = e.of(x);
//! // 1 / (1 + exp(-x)), and where x < 0 its square instead
//! let y = x.lt(0.0).select(x * x, 1.0 / ((-x).exp() + 1.0));
//! let y = y.v;
//! drop(e);
//! assert!(b.finish(&[y]).contains("stablehlo.select"));
//! ```
//!
//! An [`Ex`] borrows a [`Builder`] (a lowering's context derefs to one, and loop and reduce
//! bodies get one), so the same formulas work everywhere. Operands of one operation must have
//! the same type, as in StableHLO; a number takes the type of the value it meets.
use crate::{Builder, CmpDir, ElemType, TensorType, Value};
use std::cell::{RefCell, RefMut};
use std::ops::{Add, BitAnd, BitOr, BitXor, Div, Mul, Neg, Not, Rem, Sub};

/// A builder lent to expressions; [`E`] values made from it emit into it.
pub struct Ex<'b> {
    b: RefCell<&'b mut Builder>,
}

/// Object-safe access to the builder, so that a value's type names one lifetime only.
trait Emit {
    fn builder(&self) -> RefMut<'_, Builder>;
}

impl Emit for Ex<'_> {
    fn builder(&self) -> RefMut<'_, Builder> {
        RefMut::map(self.b.borrow_mut(), |b| &mut **b)
    }
}

impl<'b> Ex<'b> {
    pub fn new(b: &'b mut Builder) -> Self {
        Ex { b: RefCell::new(b) }
    }

    /// A value of the builder as an expression.
    pub fn of(&self, v: Value) -> E<'_> {
        E { v, ex: self }
    }

    /// Several values at once.
    pub fn all<const N: usize>(&self, vs: [Value; N]) -> [E<'_>; N] {
        vs.map(|v| self.of(v))
    }

    /// The builder itself, for operations this layer does not name.
    pub fn with<R>(&self, f: impl FnOnce(&mut Builder) -> R) -> R {
        f(&mut self.builder())
    }

    /// A 0-d constant.
    pub fn scalar(&self, x: f64, elem: ElemType) -> E<'_> {
        let v = self.with(|b| b.constant_f64(x, elem));
        self.of(v)
    }

    /// A 0-d integer constant (exact, where `scalar` goes through f64).
    pub fn int(&self, x: i64, elem: ElemType) -> E<'_> {
        let v = self.with(|b| b.constant_i64(x, elem));
        self.of(v)
    }

    /// A constant of type `ty`, every element `x`.
    pub fn full(&self, x: f64, ty: &TensorType) -> E<'_> {
        let v = self.with(|b| b.splat_f64(x, ty));
        self.of(v)
    }

    /// The value `f` builds, for operations this layer does not name: `e.of(e.with(f))`.
    pub fn make(&self, f: impl FnOnce(&mut Builder) -> Value) -> E<'_> {
        let v = self.with(f);
        self.of(v)
    }
}

/// A value in a formula. Copy it freely; every operation emits one op.
#[derive(Copy, Clone)]
pub struct E<'e> {
    pub v: Value,
    ex: &'e dyn Emit,
}

/// What an operation accepts next to an [`E`]: another value, or a number that becomes a
/// constant of the value's type.
pub trait Operand<'e>: Copy {
    fn value_like(self, like: E<'e>) -> Value;
    /// The operand's own value; None for a number.
    fn as_value(self) -> Option<Value> {
        None
    }
}

impl<'e> Operand<'e> for E<'e> {
    fn value_like(self, _: E<'e>) -> Value {
        self.v
    }
    fn as_value(self) -> Option<Value> {
        Some(self.v)
    }
}

impl<'e> Operand<'e> for Value {
    fn value_like(self, _: E<'e>) -> Value {
        self
    }
    fn as_value(self) -> Option<Value> {
        Some(self)
    }
}

impl<'e> Operand<'e> for f64 {
    fn value_like(self, like: E<'e>) -> Value {
        like.k(self).v
    }
}

impl<'e> Operand<'e> for i64 {
    fn value_like(self, like: E<'e>) -> Value {
        let ty = like.ty();
        like.ex.builder().splat_i64(self, &ty)
    }
}

/// true or false as a predicate like the other operand.
impl<'e> Operand<'e> for bool {
    fn value_like(self, like: E<'e>) -> Value {
        (self as i64).value_like(like)
    }
}

impl<'e> E<'e> {
    fn b(&self) -> RefMut<'e, Builder> {
        self.ex.builder()
    }

    fn wrap(&self, v: Value) -> E<'e> {
        E { v, ex: self.ex }
    }

    fn unary(self, f: impl FnOnce(&mut Builder, Value) -> Value) -> E<'e> {
        let v = f(&mut self.b(), self.v);
        self.wrap(v)
    }

    fn binary(self, o: impl Operand<'e>, f: impl FnOnce(&mut Builder, Value, Value) -> Value) -> E<'e> {
        let o = o.value_like(self);
        let v = f(&mut self.b(), self.v, o);
        self.wrap(v)
    }

    pub fn ty(&self) -> TensorType {
        self.b().ty(self.v).clone()
    }

    pub fn elem(&self) -> ElemType {
        self.b().elem(self.v)
    }

    pub fn dims(&self) -> Vec<i64> {
        self.b().dims(self.v).to_vec()
    }

    /// The constant `x` with this value's type.
    pub fn k(&self, x: f64) -> E<'e> {
        let ty = self.ty();
        let v = self.b().splat_f64(x, &ty);
        self.wrap(v)
    }

    /// Another value of the same formula.
    pub fn of(&self, v: Value) -> E<'e> {
        self.wrap(v)
    }

    /// The builder behind this value, for operations this layer does not name (loops,
    /// reductions); build no expressions inside `f`.
    pub fn with<R>(&self, f: impl FnOnce(&mut Builder) -> R) -> R {
        f(&mut self.b())
    }

    /// The value `f` builds, as another value of the same formula: `x.of(x.with(f))`.
    pub fn make(&self, f: impl FnOnce(&mut Builder) -> Value) -> E<'e> {
        let v = self.with(f);
        self.wrap(v)
    }

    pub fn exp(self) -> E<'e> {
        self.unary(Builder::exp)
    }
    pub fn exp2(self) -> E<'e> {
        self.unary(Builder::exp2)
    }
    pub fn expm1(self) -> E<'e> {
        self.unary(Builder::expm1)
    }
    pub fn ln(self) -> E<'e> {
        self.unary(Builder::log)
    }
    pub fn ln_1p(self) -> E<'e> {
        self.unary(Builder::log1p)
    }
    pub fn sqrt(self) -> E<'e> {
        self.unary(Builder::sqrt)
    }
    pub fn rsqrt(self) -> E<'e> {
        self.unary(Builder::rsqrt)
    }
    pub fn cbrt(self) -> E<'e> {
        self.unary(Builder::cbrt)
    }
    pub fn sin(self) -> E<'e> {
        self.unary(Builder::sin)
    }
    pub fn cos(self) -> E<'e> {
        self.unary(Builder::cos)
    }
    pub fn tan(self) -> E<'e> {
        self.unary(Builder::tan)
    }
    pub fn tanh(self) -> E<'e> {
        self.unary(Builder::tanh)
    }
    /// 1 / (1 + exp(-x)).
    pub fn sigmoid(self) -> E<'e> {
        self.unary(Builder::logistic)
    }
    pub fn abs(self) -> E<'e> {
        self.unary(Builder::abs)
    }
    pub fn signum(self) -> E<'e> {
        self.unary(Builder::sign)
    }
    pub fn floor(self) -> E<'e> {
        self.unary(Builder::floor)
    }
    pub fn ceil(self) -> E<'e> {
        self.unary(Builder::ceil)
    }
    /// Rounds half to even (torch.round).
    pub fn round(self) -> E<'e> {
        self.unary(Builder::round_nearest_even)
    }
    pub fn is_finite(self) -> E<'e> {
        self.unary(Builder::is_finite)
    }
    pub fn square(self) -> E<'e> {
        self * self
    }
    pub fn recip(self) -> E<'e> {
        1.0 / self
    }
    /// A CHLO op of one operand (`lgamma`, `digamma`, `erf`, ...).
    pub fn chlo(self, name: &str) -> E<'e> {
        self.unary(|b, v| b.chlo(name, &[v]))
    }
    /// Element type conversion (float to int truncates toward zero).
    pub fn cast(self, elem: ElemType) -> E<'e> {
        self.unary(|b, v| b.convert(v, elem))
    }

    /// A 0-d value repeated over `dims` (broadcast_in_dim with no mapped dimensions).
    pub fn splat(self, dims: &[i64]) -> E<'e> {
        self.unary(|b, v| b.broadcast_in_dim(v, dims, &[]))
    }
    /// broadcast_in_dim to `dims`, this value's dimensions landing on `at`.
    pub fn broadcast(self, dims: &[i64], at: &[i64]) -> E<'e> {
        self.unary(|b, v| b.broadcast_in_dim(v, dims, at))
    }

    /// The real part of a complex value (real type).
    pub fn real(self) -> E<'e> {
        self.unary(Builder::real)
    }
    /// The imaginary part of a complex value (real type).
    pub fn imag(self) -> E<'e> {
        self.unary(Builder::imag)
    }
    /// The complex value `self + i im` (f32 or f64 parts).
    pub fn complex(self, im: impl Operand<'e>) -> E<'e> {
        self.binary(im, Builder::complex)
    }

    pub fn pow(self, o: impl Operand<'e>) -> E<'e> {
        self.binary(o, Builder::pow)
    }
    pub fn max(self, o: impl Operand<'e>) -> E<'e> {
        self.binary(o, Builder::max)
    }
    pub fn min(self, o: impl Operand<'e>) -> E<'e> {
        self.binary(o, Builder::min)
    }
    pub fn atan2(self, o: impl Operand<'e>) -> E<'e> {
        self.binary(o, Builder::atan2)
    }

    pub fn lt(self, o: impl Operand<'e>) -> E<'e> {
        self.binary(o, |b, x, y| b.compare(CmpDir::Lt, x, y))
    }
    pub fn le(self, o: impl Operand<'e>) -> E<'e> {
        self.binary(o, |b, x, y| b.compare(CmpDir::Le, x, y))
    }
    pub fn gt(self, o: impl Operand<'e>) -> E<'e> {
        self.binary(o, |b, x, y| b.compare(CmpDir::Gt, x, y))
    }
    pub fn ge(self, o: impl Operand<'e>) -> E<'e> {
        self.binary(o, |b, x, y| b.compare(CmpDir::Ge, x, y))
    }
    pub fn eq(self, o: impl Operand<'e>) -> E<'e> {
        self.binary(o, |b, x, y| b.compare(CmpDir::Eq, x, y))
    }
    pub fn ne(self, o: impl Operand<'e>) -> E<'e> {
        self.binary(o, |b, x, y| b.compare(CmpDir::Ne, x, y))
    }

    /// `self ? on_true : on_false` for a predicate `self`; a number takes the other
    /// branch's type (give at least one branch as a value).
    pub fn select(self, on_true: impl Operand<'e>, on_false: impl Operand<'e>) -> E<'e> {
        let (t, f) = match (on_true.as_value(), on_false.as_value()) {
            (Some(t), _) => (t, on_false.value_like(self.wrap(t))),
            (None, Some(f)) => (on_true.value_like(self.wrap(f)), f),
            (None, None) => panic!("select: at least one branch must be a value"),
        };
        let v = self.b().select(self.v, t, f);
        self.wrap(v)
    }
}

macro_rules! binary_operator {
    ($trait:ident, $method:ident, $builder:ident) => {
        impl<'e, O: Operand<'e>> $trait<O> for E<'e> {
            type Output = E<'e>;
            fn $method(self, o: O) -> E<'e> {
                self.binary(o, Builder::$builder)
            }
        }
        impl<'e> $trait<E<'e>> for f64 {
            type Output = E<'e>;
            fn $method(self, e: E<'e>) -> E<'e> {
                e.k(self).binary(e, Builder::$builder)
            }
        }
        impl<'e> $trait<E<'e>> for i64 {
            type Output = E<'e>;
            fn $method(self, e: E<'e>) -> E<'e> {
                let k = e.wrap(self.value_like(e));
                k.binary(e, Builder::$builder)
            }
        }
    };
}

binary_operator!(Add, add, add);
binary_operator!(Sub, sub, sub);
binary_operator!(Mul, mul, mul);
binary_operator!(Div, div, div);
binary_operator!(Rem, rem, rem);
binary_operator!(BitAnd, bitand, and);
binary_operator!(BitOr, bitor, or);
binary_operator!(BitXor, bitxor, xor);

impl<'e> Neg for E<'e> {
    type Output = E<'e>;
    fn neg(self) -> E<'e> {
        self.unary(Builder::neg)
    }
}

impl<'e> Not for E<'e> {
    type Output = E<'e>;
    fn not(self) -> E<'e> {
        self.unary(Builder::not)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(b: &mut Builder, dims: &[i64]) -> Value {
        b.param(TensorType::new(ElemType::F32, dims))
    }

    #[test]
    fn formula_emits_one_op_per_operation() {
        let mut b = Builder::new();
        let x = f32s(&mut b, &[3]);
        let e = Ex::new(&mut b);
        let x = e.of(x);
        let y = (x * 2.0 + 1.0).exp() / x;
        let y = y.v;
        drop(e);
        let text = b.finish(&[y]);
        for op in ["stablehlo.multiply", "stablehlo.add", "stablehlo.exponential", "stablehlo.divide"] {
            assert_eq!(text.matches(op).count(), 1, "{op} in {text}");
        }
        // Numbers become constants of the operand's type.
        assert!(text.contains("dense<2.0> : tensor<3xf32>"), "{text}");
    }

    #[test]
    fn numbers_on_the_left_and_select_with_a_number_branch() {
        let mut b = Builder::new();
        let x = f32s(&mut b, &[2, 2]);
        let e = Ex::new(&mut b);
        let x = e.of(x);
        let y = x.lt(0.0).select(0.0, 1.0 - x);
        let z = x.ge(1.0).select(y, 5.0);
        assert_eq!(z.dims(), vec![2, 2]);
        assert_eq!(z.elem(), ElemType::F32);
        let z = z.v;
        drop(e);
        let text = b.finish(&[z]);
        assert_eq!(text.matches("stablehlo.select").count(), 2, "{text}");
        assert!(text.contains("stablehlo.subtract"), "{text}");
    }

    #[test]
    fn integer_constants_are_exact() {
        let mut b = Builder::new();
        let i = b.param(TensorType::new(ElemType::I64, &[]));
        let e = Ex::new(&mut b);
        let i = e.of(i);
        let j = (i + (1i64 << 60)) % 7i64;
        let j = j.v;
        drop(e);
        let text = b.finish(&[j]);
        assert!(text.contains(&(1i64 << 60).to_string()), "{text}");
    }

    #[test]
    fn splat_repeats_a_scalar() {
        let mut b = Builder::new();
        let i = b.param(TensorType::new(ElemType::I64, &[]));
        let e = Ex::new(&mut b);
        let n = e.of(i).cast(ElemType::F32).splat(&[2, 3]);
        assert_eq!(n.dims(), vec![2, 3]);
        assert_eq!(n.elem(), ElemType::F32);
        let n = n.v;
        drop(e);
        let text = b.finish(&[n]);
        assert!(text.contains("stablehlo.broadcast_in_dim"), "{text}");
    }

    #[test]
    fn xor_bool_constants_and_built_values() {
        let mut b = Builder::new();
        let x = f32s(&mut b, &[3]);
        let e = Ex::new(&mut b);
        let x = e.of(x);
        let p = x.lt(0.0) ^ x.gt(1.0);
        let q = p.select(false, x.eq(2.0));
        let i = e.int(1 << 40, ElemType::I64);
        let j = i.make(|b| b.convert(i.v, ElemType::F32)).splat(&[3]);
        let y = q.select(x, j).v;
        drop(e);
        let text = b.finish(&[y]);
        assert!(text.contains("stablehlo.xor"), "{text}");
        assert!(text.contains("dense<false> : tensor<3xi1>"), "{text}");
        assert!(text.contains(&(1i64 << 40).to_string()), "{text}");
    }

    #[test]
    fn complex_parts_and_broadcast() {
        let mut b = Builder::new();
        let x = f32s(&mut b, &[3]);
        let e = Ex::new(&mut b);
        let x = e.of(x);
        let z = x.complex(0.0);
        assert_eq!(z.elem(), ElemType::C64);
        let m = (z.real() + z.imag()).broadcast(&[2, 3], &[1]);
        assert_eq!(m.dims(), vec![2, 3]);
        let m = m.v;
        drop(e);
        let text = b.finish(&[m]);
        for op in ["stablehlo.complex", "stablehlo.real", "stablehlo.imag", "stablehlo.broadcast_in_dim"] {
            assert!(text.contains(op), "{op} in {text}");
        }
    }

    #[test]
    #[should_panic(expected = "at least one branch")]
    fn select_needs_a_value_branch() {
        let mut b = Builder::new();
        let x = f32s(&mut b, &[2]);
        let e = Ex::new(&mut b);
        let p = e.of(x).lt(0.0);
        p.select(1.0, 2.0);
    }
}
