//! Constants and elementwise ops (including compare/select/convert and CHLO).

use crate::builder::Builder;
use crate::literal;
use crate::types::{CmpDir, ElemType, TensorType};
use crate::Value;

/// Which element types an op accepts; checked so misuse panics here with the
/// op name instead of as a compile error deep inside the plugin.
#[derive(Copy, Clone)]
enum Class {
    Any,
    IntOrPred,
    Int,
    Float,
    FloatOrComplex,
}

impl Class {
    fn accepts(self, e: ElemType) -> bool {
        match self {
            Class::Any => true,
            Class::IntOrPred => e.is_int() || e == ElemType::Pred,
            Class::Int => e.is_int(),
            Class::Float => e.is_float(),
            Class::FloatOrComplex => e.is_float() || e.is_complex(),
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Class::Any => "any",
            Class::IntOrPred => "integer or i1",
            Class::Int => "integer",
            Class::Float => "float",
            Class::FloatOrComplex => "float or complex",
        }
    }
}

impl Builder {
    // ---- constants ----

    fn constant_text(&mut self, body: &str, ty: TensorType) -> Value {
        let attrs = format!("value = dense<{body}> : {ty}");
        self.emit1("stablehlo.constant", &[], &[], &attrs, ty)
    }

    /// 0-d constant; `x` converted to `elem` (floats round to nearest, ints
    /// truncate toward zero and wrap, Pred is `x != 0`).
    pub fn constant_f64(&mut self, x: f64, elem: ElemType) -> Value {
        self.splat_f64(x, &TensorType::scalar(elem))
    }

    /// 0-d constant; `x` wrapped to the width of `elem` (so -1 as U8 is 255).
    pub fn constant_i64(&mut self, x: i64, elem: ElemType) -> Value {
        self.splat_i64(x, &TensorType::scalar(elem))
    }

    pub fn constant_bool(&mut self, x: bool) -> Value {
        self.constant_text(&literal::bool_literal(x), TensorType::scalar(ElemType::Pred))
    }

    /// 0-d complex constant (`elem` is C64 or C128).
    pub fn constant_complex(&mut self, re: f64, im: f64, elem: ElemType) -> Value {
        assert!(elem.is_complex(), "constant_complex: {elem} is not complex");
        self.constant_text(&literal::complex_literal(re, im, elem), TensorType::scalar(elem))
    }

    /// Constant of shape `ty` with every element `x` (converted as in `constant_f64`).
    pub fn splat_f64(&mut self, x: f64, ty: &TensorType) -> Value {
        let body = if ty.num_elements() == 0 { String::new() } else { literal::scalar_from_f64(x, ty.elem) };
        self.constant_text(&body, ty.clone())
    }

    /// Constant of shape `ty` with every element `x` (converted as in `constant_i64`).
    pub fn splat_i64(&mut self, x: i64, ty: &TensorType) -> Value {
        let body = if ty.num_elements() == 0 { String::new() } else { literal::scalar_from_i64(x, ty.elem) };
        self.constant_text(&body, ty.clone())
    }

    /// Constant with row-major values `xs` of shape `dims`.
    pub fn constant_array_i64(&mut self, xs: &[i64], dims: &[i64], elem: ElemType) -> Value {
        let lits: Vec<String> = xs.iter().map(|&x| literal::scalar_from_i64(x, elem)).collect();
        self.constant_text(&literal::dense_body(&lits, dims), TensorType::new(elem, dims))
    }

    /// Constant with row-major values `xs` of shape `dims`.
    pub fn constant_array_f64(&mut self, xs: &[f64], dims: &[i64], elem: ElemType) -> Value {
        let lits: Vec<String> = xs.iter().map(|&x| literal::scalar_from_f64(x, elem)).collect();
        self.constant_text(&literal::dense_body(&lits, dims), TensorType::new(elem, dims))
    }

    // ---- elementwise helpers ----

    fn require(&self, op: &str, v: Value, class: Class) {
        let e = self.elem(v);
        assert!(class.accepts(e), "{op}: needs {} elements, got {}", class.describe(), self.ty(v));
    }

    fn same_types(&self, op: &str, vs: &[Value]) {
        for &v in &vs[1..] {
            assert_eq!(
                self.ty(vs[0]),
                self.ty(v),
                "{op}: operand types differ: {} vs {}",
                self.ty(vs[0]),
                self.ty(v)
            );
        }
    }

    fn binary(&mut self, op: &str, a: Value, b: Value, class: Class) -> Value {
        self.same_types(op, &[a, b]);
        self.require(op, a, class);
        let ty = self.ty(a).clone();
        self.emit1(op, &[a, b], &[], "", ty)
    }

    fn unary(&mut self, op: &str, a: Value, class: Class) -> Value {
        self.require(op, a, class);
        let ty = self.ty(a).clone();
        self.emit1(op, &[a], &[], "", ty)
    }

    /// Unary op whose result keeps the dims but has element type `elem`.
    fn unary_to(&mut self, op: &str, a: Value, class: Class, elem: ElemType) -> Value {
        self.require(op, a, class);
        let ty = self.ty(a).with_elem(elem);
        self.emit1(op, &[a], &[], "", ty)
    }

    // ---- binary ----

    pub fn add(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.add", a, b, Class::Any)
    }
    pub fn sub(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.subtract", a, b, Class::Any)
    }
    pub fn mul(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.multiply", a, b, Class::Any)
    }
    /// Integer division truncates toward zero (C semantics).
    pub fn div(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.divide", a, b, Class::Any)
    }
    /// Remainder with the sign of the dividend (C fmod semantics).
    pub fn rem(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.remainder", a, b, Class::Any)
    }
    pub fn pow(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.power", a, b, Class::Any)
    }
    /// Propagates NaN for floats.
    pub fn max(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.maximum", a, b, Class::Any)
    }
    pub fn min(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.minimum", a, b, Class::Any)
    }
    pub fn and(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.and", a, b, Class::IntOrPred)
    }
    pub fn or(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.or", a, b, Class::IntOrPred)
    }
    pub fn xor(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.xor", a, b, Class::IntOrPred)
    }
    pub fn shift_left(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.shift_left", a, b, Class::Int)
    }
    pub fn shift_right_arithmetic(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.shift_right_arithmetic", a, b, Class::Int)
    }
    pub fn shift_right_logical(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.shift_right_logical", a, b, Class::Int)
    }
    pub fn atan2(&mut self, a: Value, b: Value) -> Value {
        self.binary("stablehlo.atan2", a, b, Class::FloatOrComplex)
    }
    /// Complex from real and imaginary parts (f32 -> complex<f32>, f64 -> complex<f64>).
    pub fn complex(&mut self, re: Value, im: Value) -> Value {
        self.same_types("stablehlo.complex", &[re, im]);
        let e = self.elem(re);
        let c = e.complex_of().unwrap_or_else(|| panic!("stablehlo.complex: parts must be f32 or f64, got {e}"));
        let ty = self.ty(re).with_elem(c);
        self.emit1("stablehlo.complex", &[re, im], &[], "", ty)
    }

    // ---- unary ----

    pub fn neg(&mut self, a: Value) -> Value {
        self.unary("stablehlo.negate", a, Class::Any)
    }
    /// For complex input the result is the real magnitude.
    pub fn abs(&mut self, a: Value) -> Value {
        let e = self.elem(a).real_type();
        self.unary_to("stablehlo.abs", a, Class::Any, e)
    }
    pub fn exp(&mut self, a: Value) -> Value {
        self.unary("stablehlo.exponential", a, Class::FloatOrComplex)
    }
    /// 2^a, as `power(2, a)` (StableHLO has no exp2).
    pub fn exp2(&mut self, a: Value) -> Value {
        self.require("exp2", a, Class::FloatOrComplex);
        let ty = self.ty(a).clone();
        let two = self.splat_f64(2.0, &ty);
        self.pow(two, a)
    }
    pub fn expm1(&mut self, a: Value) -> Value {
        self.unary("stablehlo.exponential_minus_one", a, Class::FloatOrComplex)
    }
    pub fn log(&mut self, a: Value) -> Value {
        self.unary("stablehlo.log", a, Class::FloatOrComplex)
    }
    pub fn log1p(&mut self, a: Value) -> Value {
        self.unary("stablehlo.log_plus_one", a, Class::FloatOrComplex)
    }
    pub fn sqrt(&mut self, a: Value) -> Value {
        self.unary("stablehlo.sqrt", a, Class::FloatOrComplex)
    }
    pub fn rsqrt(&mut self, a: Value) -> Value {
        self.unary("stablehlo.rsqrt", a, Class::FloatOrComplex)
    }
    pub fn cbrt(&mut self, a: Value) -> Value {
        self.unary("stablehlo.cbrt", a, Class::FloatOrComplex)
    }
    pub fn sin(&mut self, a: Value) -> Value {
        self.unary("stablehlo.sine", a, Class::FloatOrComplex)
    }
    pub fn cos(&mut self, a: Value) -> Value {
        self.unary("stablehlo.cosine", a, Class::FloatOrComplex)
    }
    pub fn tan(&mut self, a: Value) -> Value {
        self.unary("stablehlo.tan", a, Class::FloatOrComplex)
    }
    pub fn tanh(&mut self, a: Value) -> Value {
        self.unary("stablehlo.tanh", a, Class::FloatOrComplex)
    }
    /// 1 / (1 + e^-a)
    pub fn logistic(&mut self, a: Value) -> Value {
        self.unary("stablehlo.logistic", a, Class::FloatOrComplex)
    }
    /// -1, 0 or 1 (NaN stays NaN; -0.0 stays -0.0).
    pub fn sign(&mut self, a: Value) -> Value {
        self.unary("stablehlo.sign", a, Class::Any)
    }
    pub fn floor(&mut self, a: Value) -> Value {
        self.unary("stablehlo.floor", a, Class::Float)
    }
    pub fn ceil(&mut self, a: Value) -> Value {
        self.unary("stablehlo.ceil", a, Class::Float)
    }
    /// Round half to even (torch.round).
    pub fn round_nearest_even(&mut self, a: Value) -> Value {
        self.unary("stablehlo.round_nearest_even", a, Class::Float)
    }
    /// Round half away from zero.
    pub fn round_nearest_afz(&mut self, a: Value) -> Value {
        self.unary("stablehlo.round_nearest_afz", a, Class::Float)
    }
    /// Logical not for i1, bitwise not for integers.
    pub fn not(&mut self, a: Value) -> Value {
        self.unary("stablehlo.not", a, Class::IntOrPred)
    }
    pub fn popcnt(&mut self, a: Value) -> Value {
        self.unary("stablehlo.popcnt", a, Class::Int)
    }
    pub fn count_leading_zeros(&mut self, a: Value) -> Value {
        self.unary("stablehlo.count_leading_zeros", a, Class::Int)
    }
    /// i1 tensor: true where `a` is neither inf nor nan.
    pub fn is_finite(&mut self, a: Value) -> Value {
        self.unary_to("stablehlo.is_finite", a, Class::Float, ElemType::Pred)
    }
    /// Real part (identity type-wise for real floats).
    pub fn real(&mut self, a: Value) -> Value {
        let e = self.elem(a).real_type();
        self.unary_to("stablehlo.real", a, Class::FloatOrComplex, e)
    }
    /// Imaginary part (zeros for real floats).
    pub fn imag(&mut self, a: Value) -> Value {
        let e = self.elem(a).real_type();
        self.unary_to("stablehlo.imag", a, Class::FloatOrComplex, e)
    }

    // ---- compare / select / clamp ----

    /// i1 tensor of `a dir b`. compare_type follows the element type: FLOAT for
    /// floats and complex (IEEE: NaN compares unequal), SIGNED for signed ints,
    /// UNSIGNED for unsigned ints and i1.
    pub fn compare(&mut self, dir: CmpDir, a: Value, b: Value) -> Value {
        let e = self.elem(a);
        let kind = if e.is_float() || e.is_complex() {
            "FLOAT"
        } else if e.is_signed_int() {
            "SIGNED"
        } else {
            "UNSIGNED"
        };
        self.compare_with(dir, kind, a, b)
    }

    /// Float compare in total order (-NaN < -inf < ... < -0 < +0 < ... < inf < NaN).
    pub fn compare_total(&mut self, dir: CmpDir, a: Value, b: Value) -> Value {
        self.require("stablehlo.compare", a, Class::Float);
        self.compare_with(dir, "TOTALORDER", a, b)
    }

    fn compare_with(&mut self, dir: CmpDir, kind: &str, a: Value, b: Value) -> Value {
        self.same_types("stablehlo.compare", &[a, b]);
        let ty = self.ty(a).with_elem(ElemType::Pred);
        let attrs = format!(
            "comparison_direction = #stablehlo<comparison_direction {}>, compare_type = #stablehlo<comparison_type {kind}>",
            dir.mlir_name()
        );
        self.emit1("stablehlo.compare", &[a, b], &[], &attrs, ty)
    }

    /// `pred ? on_true : on_false` elementwise; `pred` is i1 of the same dims, or 0-d.
    pub fn select(&mut self, pred: Value, on_true: Value, on_false: Value) -> Value {
        self.same_types("stablehlo.select", &[on_true, on_false]);
        let pt = self.ty(pred);
        assert!(
            pt.elem == ElemType::Pred && (pt.dims.is_empty() || pt.dims == self.ty(on_true).dims),
            "stablehlo.select: pred must be i1 with dims of the operands or 0-d, got {pt} for {}",
            self.ty(on_true)
        );
        let ty = self.ty(on_true).clone();
        self.emit1("stablehlo.select", &[pred, on_true, on_false], &[], "", ty)
    }

    /// min(max(x, lo), hi); `lo`/`hi` have x's type or are 0-d of x's element type.
    pub fn clamp(&mut self, lo: Value, x: Value, hi: Value) -> Value {
        let xt = self.ty(x).clone();
        for b in [lo, hi] {
            let bt = self.ty(b);
            assert!(
                bt.elem == xt.elem && (bt.dims.is_empty() || bt.dims == xt.dims),
                "stablehlo.clamp: bound {bt} does not fit operand {xt}"
            );
        }
        self.emit1("stablehlo.clamp", &[lo, x, hi], &[], "", xt)
    }

    // ---- conversions ----

    /// Element type conversion (float->int truncates toward zero); returns `v` if already `elem`.
    pub fn convert(&mut self, v: Value, elem: ElemType) -> Value {
        if self.elem(v) == elem {
            return v;
        }
        let ty = self.ty(v).with_elem(elem);
        self.emit1("stablehlo.convert", &[v], &[], "", ty)
    }

    /// Reinterprets bits. Narrowing adds a trailing dim of (in bits / out bits);
    /// widening removes a trailing dim that must equal (out bits / in bits).
    pub fn bitcast_convert(&mut self, v: Value, elem: ElemType) -> Value {
        let t = self.ty(v).clone();
        if t.elem == elem {
            return v;
        }
        let (win, wout) = (t.elem.bit_width() as i64, elem.bit_width() as i64);
        assert!(
            t.elem != ElemType::Pred && elem != ElemType::Pred,
            "stablehlo.bitcast_convert: i1 cannot be bitcast ({t} -> {elem})"
        );
        let mut dims = t.dims.clone();
        if win > wout {
            dims.push(win / wout);
        } else if win < wout {
            assert_eq!(
                dims.last().copied(),
                Some(wout / win),
                "stablehlo.bitcast_convert: {t} -> {elem} needs a last dim of {}",
                wout / win
            );
            dims.pop();
        }
        self.emit1("stablehlo.bitcast_convert", &[v], &[], "", TensorType { elem, dims })
    }

    // ---- CHLO ----

    /// Elementwise CHLO op (`erf`, `erf_inv`, `lgamma`, `digamma`, `next_after`,
    /// `polygamma`, `zeta`, `bessel_i1e`, `tan`, ...) with the result type of
    /// the first operand. PJRT's "mlir" input legalizes CHLO to StableHLO.
    pub fn chlo(&mut self, name: &str, operands: &[Value]) -> Value {
        assert!(!operands.is_empty(), "chlo.{name}: needs operands");
        let ty = self.ty(operands[0]).clone();
        self.chlo_typed(name, operands, ty)
    }

    /// CHLO op with an explicit result type (e.g. `is_inf` -> i1).
    pub fn chlo_typed(&mut self, name: &str, operands: &[Value], result: TensorType) -> Value {
        let op = if name.starts_with("chlo.") { name.to_string() } else { format!("chlo.{name}") };
        self.emit1(&op, operands, &[], "", result)
    }

    /// `chlo.top_k` along the last dim: (values, i32 indices), largest first.
    pub fn top_k(&mut self, v: Value, k: i64) -> (Value, Value) {
        let t = self.ty(v).clone();
        let last = *t.dims.last().unwrap_or_else(|| panic!("chlo.top_k: operand {t} is 0-d"));
        assert!(k >= 0 && k <= last, "chlo.top_k: k = {k} out of range for {t}");
        let mut dims = t.dims.clone();
        *dims.last_mut().unwrap() = k;
        let vals = TensorType { elem: t.elem, dims: dims.clone() };
        let idx = TensorType { elem: ElemType::I32, dims };
        let r = self.emit("chlo.top_k", &[v], &[], &format!("k = {k} : i64"), &[vals, idx]);
        (r[0], r[1])
    }
}
