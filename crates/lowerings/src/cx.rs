//! The lowering context: a StableHLO builder plus the record of which module inputs come from
//! runtime scalars, and the helpers every lowering shares (broadcasting, casts, dims).
use crate::args::{Scalar, Tensor};
use crate::dtype::{DType, Rank};
use crate::error::{ErrorKind, Result};
use crate::{bail, check};
use stablehlo::{Builder, CmpDir, ElemType, TensorType, Value};

/// What feeds one parameter of the module at run time.
#[derive(Clone, Debug, PartialEq)]
pub enum Feed {
    /// A float scalar argument (slot), converted to `elem` on the host.
    Scalar { slot: u32, elem: ElemType },
    /// An input the caller (engine or graph compiler) created and tagged.
    External(u32),
}

pub struct Cx {
    pub b: Builder,
    pub feeds: Vec<Feed>,
    /// The program's data-dependent checks (out-of-range indices), in the order PyTorch makes
    /// them; the caller runs them (see `Check`).
    pub checks: Vec<Check>,
    /// Parameters whose values the caller also holds in host memory (CPU index tensors), with
    /// their feed tags: checks on them run on the host before the program.
    host_params: Vec<(Value, u32)>,
    /// A serialized module to compile instead of the printed one (a user's kernel, see
    /// ops/custom_kernels.rs): its @main takes the params and returns the results built here.
    pub module_override: Option<std::sync::Arc<Vec<u8>>>,
    /// In a bucketed program (the engine's buckets.rs), where tensor arguments arrive padded.
    pub padded: Option<Padded>,
}

/// Tensor arguments padded to bucketed sizes, for lowerings declared `.bucketed()`.
#[derive(Default)]
pub struct Padded {
    /// Per padded argument value, its real sizes (0-d int64 values).
    pub real: Vec<(Value, Vec<Value>)>,
    /// The padded dims each result must have.
    pub results: Vec<Vec<i64>>,
    /// Set by a lowering that cannot serve this call padded (`Cx::decline_padded`): the call
    /// then compiles for its exact shapes.
    pub declined: bool,
}

impl Padded {
    pub fn real_sizes(&self, v: Value) -> Option<&[Value]> {
        self.real.iter().find(|(x, _)| *x == v).map(|(_, s)| s.as_slice())
    }
}

/// A data-dependent check, as PyTorch's kernels make while reading indices: when it fails,
/// `kind` is raised with the message of the failing member, where `{value}` stands for the
/// failing value and `{position}` for its position (row-major in the checked shape).
#[derive(Clone, Debug)]
pub struct Check {
    pub kind: ErrorKind,
    pub messages: Vec<String>,
    pub eval: CheckEval,
}

#[derive(Clone, Debug)]
pub enum CheckEval {
    /// Computed by the program: an int64 [3] value, [0, _, _] when the check passes, else
    /// [1 + the failing member, position, value]. The caller reads it after the program ran.
    Device(Value),
    /// Every member is an index tensor fed from host memory: the caller checks the values
    /// itself before running the program (the error is raised at the call, like PyTorch).
    Host { members: Vec<HostBound>, shape: Vec<i64> },
}

/// One index tensor of a host check: the feed tag of its parameter, its dims (broadcast to
/// the check's shape) and the valid range `lo..hi`.
#[derive(Clone, Debug)]
pub struct HostBound {
    pub tag: u32,
    pub dims: Vec<i64>,
    pub lo: i64,
    pub hi: i64,
}

/// An index tensor and its valid range `lo..hi`, for `Cx::check_indices`.
#[derive(Clone, Debug)]
pub struct Bound {
    pub index: Value,
    pub lo: i64,
    pub hi: i64,
    pub message: String,
    /// In a bucketed program, the indexed dim's real size (0-d int64, known at run time): it
    /// takes the place of `hi`, and of `-hi` where `lo` is `-hi` (`hi` being the padded size).
    pub real_size: Option<Value>,
}

impl std::ops::Deref for Cx {
    type Target = Builder;
    fn deref(&self) -> &Builder {
        &self.b
    }
}
impl std::ops::DerefMut for Cx {
    fn deref_mut(&mut self) -> &mut Builder {
        &mut self.b
    }
}

impl Default for Cx {
    fn default() -> Self {
        Self::new()
    }
}

impl Cx {
    pub fn new() -> Self {
        Cx { b: Builder::new(), feeds: Vec::new(), checks: Vec::new(), host_params: Vec::new(), module_override: None, padded: None }
    }

    /// A module parameter fed by the caller; `tag` says which of its inputs.
    pub fn external_param(&mut self, ty: TensorType, tag: u32) -> Value {
        self.feeds.push(Feed::External(tag));
        self.b.param(ty)
    }

    /// An `external_param` whose values the caller holds in host memory: checks of it as an
    /// index tensor become host checks.
    pub fn host_param(&mut self, ty: TensorType, tag: u32) -> Value {
        let v = self.external_param(ty, tag);
        self.host_params.push((v, tag));
        v
    }

    /// PyTorch's bounds check of an index tensor: every value must lie in `lo..hi` (`-size..size`
    /// where negative indices wrap, `0..size` where they don't), else `kind` with `message`
    /// (`{value}`: the first bad value, `{position}`: its row-major position). Pass the index
    /// tensor as the lowering got it (not a converted copy), so that a CPU index is checked on
    /// the host at the call.
    pub fn check_index(&mut self, index: Value, lo: i64, hi: i64, kind: ErrorKind, message: impl Into<String>) {
        self.check_indices(kind, vec![Bound { index, lo, hi, message: message.into(), real_size: None }]);
    }

    /// In a bucketed program, the real sizes of the padded argument `v` (0-d int64 values);
    /// None elsewhere.
    pub fn real_sizes(&self, v: Value) -> Option<Vec<Value>> {
        self.padded.as_ref().and_then(|p| p.real_sizes(v)).map(<[Value]>::to_vec)
    }

    /// In a bucketed program, says that this lowering cannot serve the call padded.
    pub fn decline_padded(&mut self) {
        if let Some(p) = self.padded.as_mut() {
            p.declined = true;
        }
    }

    /// Index tensors that broadcast together (`x[i, j]`): the failure reported is the first
    /// element (row-major in the broadcast shape) where any member fails, and there the first
    /// failing member, as PyTorch's index kernel meets them.
    pub fn check_indices(&mut self, kind: ErrorKind, bounds: Vec<Bound>) {
        if bounds.is_empty() {
            return;
        }
        let shapes: Vec<Vec<i64>> = bounds.iter().map(|b| self.dims(b.index)).collect();
        let shape = broadcast_shapes(&shapes).expect("check_indices: the index tensors broadcast together");
        let n: i64 = shape.iter().product();
        if n == 0 {
            return;
        }
        let messages = bounds.iter().map(|b| b.message.clone()).collect();
        let tags: Vec<Option<u32>> =
            bounds.iter().map(|b| self.host_params.iter().find(|(v, _)| *v == b.index).map(|&(_, t)| t)).collect();
        if tags.iter().all(|t| t.is_some()) && bounds.iter().all(|b| b.real_size.is_none()) {
            let members = bounds
                .iter()
                .zip(&tags)
                .zip(shapes)
                .map(|((b, t), dims)| HostBound { tag: t.unwrap(), dims, lo: b.lo, hi: b.hi })
                .collect();
            self.checks.push(Check { kind, messages, eval: CheckEval::Host { members, shape } });
            return;
        }
        let k = bounds.len() as i64;
        let i64t = ElemType::I64;
        let (mut vals, mut bads) = (Vec::new(), Vec::new());
        for b in &bounds {
            let v = self.b.convert(b.index, i64t);
            let v = self.b.broadcast_to(v, &shape);
            let v = self.b.reshape(v, &[n, 1]);
            let (lo, hi) = match b.real_size {
                None => (self.const_i64(b.lo, &[n, 1]), self.const_i64(b.hi, &[n, 1])),
                Some(real) => {
                    let hi = self.b.broadcast_in_dim(real, &[n, 1], &[]);
                    let lo = if b.lo < 0 { self.b.neg(hi) } else { self.const_i64(b.lo, &[n, 1]) };
                    (lo, hi)
                }
            };
            let below = self.b.compare(CmpDir::Lt, v, lo);
            let above = self.b.compare(CmpDir::Ge, v, hi);
            bads.push(self.b.or(below, above));
            vals.push(v);
        }
        // Row-major over [element, member]: the first failing slot is PyTorch's first error.
        // One reduction finds it and its value.
        let (vals, bads) = if k == 1 {
            (self.b.reshape(vals[0], &[n]), self.b.reshape(bads[0], &[n]))
        } else {
            let v = self.b.concatenate(&vals, 1);
            let b = self.b.concatenate(&bads, 1);
            (self.b.reshape(v, &[n * k]), self.b.reshape(b, &[n * k]))
        };
        let slot = self.b.iota(&TensorType::new(i64t, &[n * k]), 0);
        let none = self.const_i64(n * k, &[n * k]);
        let cand = self.b.select(bads, slot, none);
        let init = self.b.constant_i64(n * k, i64t);
        let zero = self.b.constant_i64(0, i64t);
        let found = self.b.reduce(&[cand, vals], &[init, zero], &[0], |b, a| {
            let take = b.compare(CmpDir::Lt, a[2], a[0]);
            vec![b.select(take, a[2], a[0]), b.select(take, a[3], a[1])]
        });
        let (first, value) = (found[0], found[1]);
        let (member, position) = if k == 1 {
            (zero, first)
        } else {
            let kk = self.b.constant_i64(k, i64t);
            (self.b.rem(first, kk), self.b.div(first, kk))
        };
        let position = self.real_position(position, &shape, &shapes, &bounds);
        let one = self.b.constant_i64(1, i64t);
        let code = self.b.add(member, one);
        let total = self.b.constant_i64(n * k, i64t);
        let failed = self.b.compare(CmpDir::Lt, first, total);
        let code = self.b.select(failed, code, zero);
        let parts: Vec<Value> = [code, position, value].iter().map(|&v| self.b.reshape(v, &[1])).collect();
        let bad = self.b.concatenate(&parts, 0);
        self.checks.push(Check { kind, messages, eval: CheckEval::Device(bad) });
    }

    /// A check of data whose outcome is a code: the int64 scalar `code` is 0 when the data
    /// passes, else 1 + the index into `messages` of the error raised at the next synchronization.
    pub fn add_code_check(&mut self, code: Value, kind: ErrorKind, messages: Vec<String>) {
        let code = self.b.reshape(code, &[1]);
        let rest = self.const_i64(0, &[2]);
        let row = self.b.concatenate(&[code, rest], 0);
        self.add_check(row, kind, messages);
    }

    /// A check of one condition on data: `message` raises at the next synchronization when
    /// the boolean scalar `failed` is true.
    pub fn add_condition_check(&mut self, failed: Value, kind: ErrorKind, message: String) {
        let code = self.b.convert(failed, ElemType::I64);
        self.add_code_check(code, kind, vec![message]);
    }

    /// In a bucketed program, a position in the padded broadcast `shape` as the position of
    /// the same element in the real one (PyTorch's report). The first failure is always a real
    /// element: padding repeats the last real index along each dim. Elsewhere, and for one
    /// dim (where padding only appends), `position` itself.
    fn real_position(&mut self, position: Value, shape: &[i64], shapes: &[Vec<i64>], bounds: &[Bound]) -> Value {
        if self.padded.is_none() || shape.len() < 2 {
            return position;
        }
        // Each dim's real size: that of a member whose padded size there is not 1.
        let mut real = Vec::with_capacity(shape.len());
        for (d, &s) in shape.iter().enumerate() {
            if s == 1 {
                real.push(self.b.constant_i64(1, ElemType::I64));
                continue;
            }
            let member = bounds.iter().zip(shapes).find_map(|(b, dims)| {
                let at = (d + dims.len()).checked_sub(shape.len())?;
                (dims[at] == s).then(|| self.padded.as_ref().unwrap().real_sizes(b.index).map(|r| r[at]))
            });
            match member.flatten() {
                Some(r) => real.push(r),
                None => return position,
            }
        }
        let mut rest = position;
        let mut at = self.b.constant_i64(0, ElemType::I64);
        let mut stride = self.b.constant_i64(1, ElemType::I64);
        for (d, &s) in shape.iter().enumerate().rev() {
            let size = self.b.constant_i64(s, ElemType::I64);
            let coord = self.b.rem(rest, size);
            rest = self.b.div(rest, size);
            let part = self.b.mul(coord, stride);
            at = self.b.add(at, part);
            stride = self.b.mul(stride, real[d]);
        }
        at
    }

    /// A check computed by the lowering itself: `bad` is an int64 [3] value, [0, _, _] when
    /// it passes, else [1 + index into `messages`, position, value] (see `Check`).
    pub fn add_check(&mut self, bad: Value, kind: ErrorKind, messages: Vec<String>) {
        assert!(self.b.elem(bad) == ElemType::I64 && self.b.dims(bad) == [3], "add_check: `bad` must be int64 [3]");
        self.checks.push(Check { kind, messages, eval: CheckEval::Device(bad) });
    }

    fn const_i64(&mut self, x: i64, dims: &[i64]) -> Value {
        let c = self.b.constant_i64(x, ElemType::I64);
        self.b.broadcast_in_dim(c, dims, &[])
    }

    pub fn dims(&self, v: Value) -> Vec<i64> {
        self.b.dims(v).to_vec()
    }

    pub fn numel(&self, v: Value) -> i64 {
        self.b.dims(v).iter().product()
    }

    pub fn dtype(&self, v: Value) -> DType {
        DType::from_elem(self.b.elem(v))
    }

    /// A scalar as a 0-d value of `dtype`: ints and bools are constants, floats are runtime
    /// inputs (unless compiled in).
    pub fn scalar(&mut self, s: Scalar, dtype: DType) -> Value {
        let elem = dtype.elem();
        match s {
            Scalar::Int(i) => self.b.constant_i64(i, elem),
            Scalar::Bool(x) => self.b.constant_i64(x as i64, elem),
            Scalar::Float(f) => match f.slot {
                Some(slot) => {
                    self.feeds.push(Feed::Scalar { slot, elem });
                    self.b.param(TensorType { elem, dims: vec![] })
                }
                None => self.b.constant_f64(f.value, elem),
            },
            // A real dtype takes the real part (callers check with Scalar::to_real first).
            Scalar::Complex(re, im) if dtype.is_complex() => self.b.constant_complex(re, im, elem),
            Scalar::Complex(re, _) => self.b.constant_f64(re, elem),
        }
    }

    /// A scalar as a value of dtype `dtype` broadcast to `dims`.
    pub fn scalar_like(&mut self, s: Scalar, dtype: DType, dims: &[i64]) -> Value {
        let v = self.scalar(s, dtype);
        self.b.broadcast_in_dim(v, dims, &[])
    }

    pub fn full(&mut self, x: f64, dtype: DType, dims: &[i64]) -> Value {
        let v = self.b.constant_f64(x, dtype.elem());
        self.b.broadcast_in_dim(v, dims, &[])
    }

    pub fn cast(&mut self, v: Value, dtype: DType) -> Value {
        let from = self.dtype(v);
        if from == dtype {
            return v;
        }
        if from == DType::F8E8M0FNU {
            // Through float64 for bool too: its smallest value is a float32 subnormal.
            let x = self.from_e8m0(v, matches!(dtype, DType::F64 | DType::Bool));
            return self.cast(x, dtype);
        }
        if dtype == DType::Bool {
            // PyTorch: nonzero is true (a plain convert would do the same, but be explicit for
            // complex and float NaN).
            let zero = self.full(0.0, from, &self.dims(v));
            return self.b.compare(stablehlo::CmpDir::Ne, v, zero);
        }
        if dtype == DType::F8E8M0FNU {
            return self.to_e8m0(v);
        }
        if let Some((mant, emin)) = float8_grid(dtype).filter(|_| !from.is_complex()) {
            return self.to_float8(v, dtype, mant, emin);
        }
        if from.is_float() && matches!(dtype, DType::U8 | DType::I8 | DType::I16 | DType::U16 | DType::I32 | DType::I64) {
            return self.float_to_int(v, dtype);
        }
        self.b.convert(v, dtype.elem())
    }

    /// Float to integer as PyTorch's CPU kernels convert on x86: uint8 through int64 (c10's
    /// static_cast_with_inter_type), the other narrow types through int32, keeping the low bits
    /// (-2.5 gives uint8 254, 300.2 gives 44). Out of the intermediate's range, and NaN, give its
    /// minimum, as x86's truncating convert does; XLA's convert would saturate instead.
    fn float_to_int(&mut self, v: Value, dtype: DType) -> Value {
        let wide = if matches!(dtype, DType::U8 | DType::I64) { DType::I64 } else { DType::I32 };
        let bits = if wide == DType::I64 { 63 } else { 31 };
        let x = self.cast(v, if self.dtype(v) == DType::F64 { DType::F64 } else { DType::F32 });
        let (dims, float) = (self.dims(v), self.dtype(x));
        let hi = self.full(2f64.powi(bits), float, &dims);
        let lo = self.full(-(2f64.powi(bits)), float, &dims);
        let below = self.b.compare(stablehlo::CmpDir::Lt, x, hi);
        let above = self.b.compare(stablehlo::CmpDir::Ge, x, lo);
        let in_range = self.b.and(below, above);
        let converted = self.b.convert(x, wide.elem());
        let min = self.full(-(2f64.powi(bits)), wide, &dims);
        let wrapped = self.b.select(in_range, converted, min);
        self.b.convert(wrapped, dtype.elem())
    }

    /// A conversion to a float8 format as c10 makes it: through float32 (as its constructors
    /// take), rounded to nearest-even once. XLA:CPU's own convert from float32 rounds through
    /// float16 first (twice: wrong next to ties), so the value is rounded to the format's grid
    /// here, in float32, exactly, and only then converted. float8_e4m3fn saturates from torch
    /// 2.12 (overflow and inf give +-448).
    fn to_float8(&mut self, v: Value, dtype: DType, mant: i64, emin: i32) -> Value {
        let dims = self.dims(v);
        let x = self.cast(v, DType::F32);
        // Normal range: round the float32 bits to `mant` mantissa bits (the carry may bump the
        // exponent, which is right).
        let drop = 23 - mant;
        let bits = self.b.bitcast_convert(x, ElemType::U32);
        let u = |cx: &mut Cx, k: i64| cx.full(k as f64, DType::U32, &dims);
        let (c_drop, one, half) = (u(self, drop), u(self, 1), u(self, (1 << (drop - 1)) - 1));
        let low_mask = u(self, !((1i64 << drop) - 1) & 0xFFFF_FFFF);
        let kept_lsb = self.b.shift_right_logical(bits, c_drop);
        let kept_lsb = self.b.and(kept_lsb, one);
        let bumped = self.b.add(bits, half);
        let bumped = self.b.add(bumped, kept_lsb);
        let normal = self.b.and(bumped, low_mask);
        let normal = self.b.bitcast_convert(normal, ElemType::F32);
        // Subnormal range: a whole number of the format's subnormal steps, rounded by
        // round_nearest_even (scaling by powers of two is exact).
        let a = self.b.abs(x);
        let up = self.full(2f64.powi(mant as i32 - emin), DType::F32, &dims);
        let steps = self.b.mul(a, up);
        let steps = self.b.round_nearest_even(steps);
        let down = self.full(2f64.powi(emin - mant as i32), DType::F32, &dims);
        let sub = self.b.mul(steps, down);
        let sign_mask = u(self, 0x8000_0000);
        let sign = self.b.and(bits, sign_mask);
        let sub = self.b.bitcast_convert(sub, ElemType::U32);
        let sub = self.b.or(sub, sign);
        let sub = self.b.bitcast_convert(sub, ElemType::F32);
        let smallest_normal = self.full(2f64.powi(emin), DType::F32, &dims);
        let is_sub = self.b.compare(CmpDir::Lt, a, smallest_normal);
        let finite = self.b.is_finite(x);
        let rounded = self.b.select(is_sub, sub, normal);
        let mut rounded = self.b.select(finite, rounded, x);
        if matches!(dtype, DType::F8E4M3FNUZ | DType::F8E5M2FNUZ) {
            // No negative zero there: its byte is the nan.
            let zero = self.full(0.0, DType::F32, &dims);
            let is_zero = self.b.compare(CmpDir::Eq, rounded, zero);
            rounded = self.b.select(is_zero, zero, rounded);
        }
        let out = self.b.convert(rounded, dtype.elem());
        if dtype != DType::F8E4M3FN || !crate::torch_version::float8_e4m3fn_saturates() {
            return out;
        }
        let (lo, hi) = (self.full(-448.0, DType::F32, &dims), self.full(448.0, DType::F32, &dims));
        let (lo8, hi8) = (self.full(-448.0, dtype, &dims), self.full(448.0, dtype, &dims));
        let above = self.b.compare(CmpDir::Gt, x, hi);
        let below = self.b.compare(CmpDir::Lt, x, lo);
        let out = self.b.select(above, hi8, out);
        self.b.select(below, lo8, out)
    }

    /// c10's float -> Float8_e8m0fnu on the float32 bits (stablehlo's convert rounds ties to
    /// even; c10 rounds them up and drops the sign): the exponent byte, plus one when the
    /// mantissa's top bit is set and anything below it is, or the value is normal; nan, inf and
    /// overflow give the nan byte 0xFF.
    fn to_e8m0(&mut self, v: Value) -> Value {
        let dims = self.dims(v);
        let x = self.cast(v, DType::F32);
        let bits = self.b.bitcast_convert(x, ElemType::U32);
        let u = |cx: &mut Cx, k: i64| cx.full(k as f64, DType::U32, &dims);
        let (c23, c_ff, c_guard, c_below, zero, one) =
            (u(self, 23), u(self, 0xFF), u(self, 0x40_0000), u(self, 0x3F_FFFF), u(self, 0), u(self, 1));
        let shifted = self.b.shift_right_logical(bits, c23);
        let exp = self.b.and(shifted, c_ff);
        let g = self.b.and(bits, c_guard);
        let guard = self.b.compare(CmpDir::Ne, g, zero);
        let b = self.b.and(bits, c_below);
        let below = self.b.compare(CmpDir::Ne, b, zero);
        let normal = self.b.compare(CmpDir::Ne, exp, zero);
        let either = self.b.or(below, normal);
        let up = self.b.and(guard, either);
        let bumped = self.b.add(exp, one);
        let not_special = self.b.compare(CmpDir::Ne, exp, c_ff);
        let bump = self.b.and(up, not_special);
        let e = self.b.select(bump, bumped, exp);
        let byte = self.b.convert(e, ElemType::U8);
        self.b.bitcast_convert(byte, ElemType::F8E8M0FNU)
    }

    /// Float8_e8m0fnu -> float32 (or float64) exactly, from the bits: 2^(byte - 127), 0xFF is
    /// nan. Byte 0 is a float32 subnormal, which a convert to float64 would flush to zero.
    fn from_e8m0(&mut self, v: Value, wide: bool) -> Value {
        let dims = self.dims(v);
        let byte = self.b.bitcast_convert(v, ElemType::U8);
        let (uint, float, mant, nan) = if wide {
            (DType::U64, ElemType::F64, 52, 0x7FF8_0000_0000_0000_u64 as i64)
        } else {
            (DType::U32, ElemType::F32, 23, 0x7FC0_0000)
        };
        let e = self.cast(byte, uint);
        let u = |cx: &mut Cx, k: i64| {
            let c = cx.b.constant_i64(k, uint.elem());
            cx.b.broadcast_in_dim(c, &dims, &[])
        };
        let (shift, c_ff, c_nan) = (u(self, mant), u(self, 0xFF), u(self, nan));
        let bits = if wide {
            // Rebias the exponent: every byte is a normal float64.
            let rebias = u(self, 1023 - 127);
            let field = self.b.add(e, rebias);
            self.b.shift_left(field, shift)
        } else {
            // The byte is the float32 exponent field; 0 is the subnormal 2^-127.
            let normal = self.b.shift_left(e, shift);
            let (zero, tiny) = (u(self, 0), u(self, 0x40_0000));
            let is_zero = self.b.compare(CmpDir::Eq, e, zero);
            self.b.select(is_zero, tiny, normal)
        };
        let is_nan = self.b.compare(CmpDir::Eq, e, c_ff);
        let bits = self.b.select(is_nan, c_nan, bits);
        self.b.bitcast_convert(bits, float)
    }

    /// Broadcast every value to the common shape (PyTorch's error message when they can't).
    pub fn broadcast_all(&mut self, vs: &[Value]) -> Result<Vec<Value>> {
        let shapes: Vec<Vec<i64>> = vs.iter().map(|&v| self.dims(v)).collect();
        let out = broadcast_shapes(&shapes)?;
        Ok(vs.iter().map(|&v| self.b.broadcast_to(v, &out)).collect())
    }
}

/// The broadcast shape of several shapes, with PyTorch's error text.
pub fn broadcast_shapes(shapes: &[Vec<i64>]) -> Result<Vec<i64>> {
    let nd = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1i64; nd];
    for s in shapes {
        let off = nd - s.len();
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[off + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                // PyTorch names the first mismatching pair, counting dims from the right.
                bail!(
                    Runtime,
                    "The size of tensor a ({}) must match the size of tensor b ({}) at non-singleton dimension {}",
                    *o,
                    d,
                    i + off
                );
            }
        }
    }
    Ok(out)
}

/// Wrap a possibly negative dim like PyTorch's maybe_wrap_dim (0-d tensors accept -1 and 0).
pub fn wrap_dim(dim: i64, ndim: usize) -> Result<usize> {
    let n = ndim.max(1) as i64;
    check!(
        dim >= -n && dim < n,
        Index,
        "Dimension out of range (expected to be in range of [{}, {}], but got {})",
        -n,
        n - 1,
        dim
    );
    Ok(if dim < 0 { (dim + n) as usize } else { dim as usize })
}

/// Operands of a promoting op: tensors and scalars with their ranks.
pub fn operand(t: &Tensor) -> (DType, Rank) {
    (t.dtype, t.rank)
}

pub fn is_floating_or_complex(d: DType) -> bool {
    d.is_float() || d.is_complex()
}

/// (mantissa bits, exponent of the smallest normal) of the float8 formats rounded by
/// `Cx::to_float8` (E8M0 has its own conversion).
fn float8_grid(d: DType) -> Option<(i64, i32)> {
    match d {
        DType::F8E4M3FN => Some((3, -6)),
        DType::F8E5M2 => Some((2, -14)),
        DType::F8E4M3FNUZ => Some((3, -7)),
        DType::F8E5M2FNUZ => Some((2, -15)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(cx: &mut Cx, dims: &[i64], host: bool) -> Value {
        let ty = TensorType::new(ElemType::I64, dims);
        if host {
            cx.host_param(ty, 7)
        } else {
            cx.external_param(ty, 3)
        }
    }

    #[test]
    fn host_fed_indices_are_checked_on_the_host() {
        let mut cx = Cx::new();
        let i = param(&mut cx, &[2, 1], true);
        let j = param(&mut cx, &[3], true);
        let b = |index, size: i64| Bound { index, lo: -size, hi: size, message: "m {value}".into(), real_size: None };
        cx.check_indices(ErrorKind::Index, vec![b(i, 4), b(j, 5)]);
        let CheckEval::Host { members, shape } = &cx.checks[0].eval else { panic!("expected a host check") };
        assert_eq!(shape, &vec![2, 3]);
        assert_eq!((members[0].tag, members[1].dims.clone(), members[1].lo), (7, vec![3], -5));
    }

    #[test]
    fn device_indices_become_a_program_value() {
        let mut cx = Cx::new();
        let i = param(&mut cx, &[4], true);
        let j = param(&mut cx, &[4], false);
        cx.check_index(j, 0, 9, ErrorKind::Runtime, "bad {value}");
        cx.check_indices(ErrorKind::Index, vec![
            Bound { index: i, lo: 0, hi: 2, message: "a".into(), real_size: None },
            Bound { index: j, lo: 0, hi: 2, message: "b".into(), real_size: None },
        ]);
        assert_eq!(cx.checks.len(), 2);
        for c in &cx.checks {
            let CheckEval::Device(v) = c.eval else { panic!("expected a device check") };
            assert_eq!((cx.dims(v), cx.dtype(v)), (vec![3], DType::I64));
        }
        assert_eq!(cx.checks[1].messages, vec!["a".to_string(), "b".to_string()]);
    }

    #[test]
    fn empty_indices_are_not_checked() {
        let mut cx = Cx::new();
        let i = param(&mut cx, &[0, 3], false);
        cx.check_index(i, 0, 1, ErrorKind::Index, "x");
        assert!(cx.checks.is_empty());
    }
}

