//! The arguments of one aten call as a lowering sees them.
use crate::dtype::{DType, Rank};
use crate::error::{ErrorKind, Result, TorchError};
use stablehlo::Value;

/// A tensor argument already in the module: its value (dense, in PyTorch's logical shape),
/// its dtype and its promotion rank.
#[derive(Copy, Clone, Debug)]
pub struct Tensor {
    pub v: Value,
    pub dtype: DType,
    pub rank: Rank,
}

/// The strides of a dense row-major tensor of `sizes`.
pub fn contiguous_strides(sizes: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; sizes.len()];
    for i in (0..sizes.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * sizes[i + 1].max(1);
    }
    s
}

/// PyTorch's is_contiguous of a view: dense in row-major order, strides of dims of size 1
/// aside.
pub fn is_contiguous(sizes: &[i64], strides: &[i64]) -> bool {
    let mut expected = 1;
    for (&n, &s) in sizes.iter().zip(strides).rev() {
        if n != 1 && s != expected {
            return false;
        }
        expected *= n;
    }
    true
}

/// A floating-point (or complex) scalar: a runtime input of the compiled module unless the
/// op asks for specialization, so that changing values (learning rates) reuse executables.
#[derive(Copy, Clone, Debug)]
pub struct FloatArg {
    pub value: f64,
    /// Index of the runtime scalar input; None when the value is compiled in.
    pub slot: Option<u32>,
}

#[derive(Clone, Debug)]
pub enum Arg {
    None,
    Tensor(Tensor),
    Int(i64),
    Float(FloatArg),
    Bool(bool),
    Complex(f64, f64),
    IntList(Vec<i64>),
    FloatList(Vec<f64>),
    BoolList(Vec<bool>),
    /// Tensor[] or Tensor?[] (items are Tensor or None), or a Scalar[] (items Int/Float/Bool).
    List(Vec<Arg>),
    Str(String),
    DType(DType),
    /// The random state of this call: a u64[2] value in the module.
    Generator(Value),
    Other,
}

/// Named access to the arguments, with PyTorch-style errors for wrong kinds.
pub struct Args<'a> {
    pub op: &'a str,
    pub names: &'a [String],
    pub values: &'a [Arg],
    /// The strides of each argument's tensors by position (one item for a tensor, one per item
    /// of a tensor list, none for other arguments), where the call's views are known: eager
    /// calls. Empty in compiled graphs, whose tracing ran PyTorch's own checks of strides.
    pub strides: &'a [Vec<Vec<i64>>],
}

/// A Python number argument (Scalar): int, bool and complex values are compiled in, floats are
/// inputs.
#[derive(Copy, Clone, Debug)]
pub enum Scalar {
    Int(i64),
    Bool(bool),
    Float(FloatArg),
    /// Real and imaginary parts.
    Complex(f64, f64),
}

impl Scalar {
    /// The dtype PyTorch gives this number in type promotion (a wrapped number).
    pub fn dtype(&self) -> DType {
        match self {
            Scalar::Int(_) => DType::I64,
            Scalar::Bool(_) => DType::Bool,
            Scalar::Float(_) => DType::F64,
            Scalar::Complex(..) => DType::C128,
        }
    }

    /// The number as a double (c10::Scalar::to<double>; a complex number's real part, where
    /// `to_real` has checked there is no imaginary one).
    pub fn to_f64(self) -> f64 {
        match self {
            Scalar::Int(i) => i as f64,
            Scalar::Bool(b) => b as i64 as f64,
            Scalar::Float(f) => f.value,
            Scalar::Complex(re, _) => re,
        }
    }

    /// The number as a value of a real dtype: PyTorch's error for a complex number with an
    /// imaginary part (bool takes any number: nonzero is true).
    pub fn to_real(self, dtype: DType) -> Result<Scalar> {
        match self {
            Scalar::Complex(re, im) if !dtype.is_complex() => {
                crate::check!(
                    im == 0.0 || dtype == DType::Bool,
                    Runtime,
                    "value cannot be converted to type {} without overflow",
                    crate::blocks::type_names::convert_type_name(dtype)
                );
                Ok(if dtype == DType::Bool { Scalar::Bool(re != 0.0 || im != 0.0) } else { Scalar::Float(FloatArg { value: re, slot: None }) })
            }
            s => Ok(s),
        }
    }
}

/// The argument names a lowering may read for an op: those of every overload of the ops
/// declared next to it. None when unknown (no source installed, or not an aten op).
pub type ArgNamesFn = fn(op: &str) -> Option<std::sync::Arc<std::collections::HashSet<String>>>;

static ARG_NAMES: std::sync::OnceLock<ArgNamesFn> = std::sync::OnceLock::new();

/// Installs the source of argument names (the extension reads the dispatcher's schemas). From
/// then on, reading a name that no overload has panics, which the extension turns into a
/// RuntimeError: a misspelled optional argument would otherwise read as "not given".
pub fn check_argument_names(source: ArgNamesFn) {
    let _ = ARG_NAMES.set(source);
}

impl<'a> Args<'a> {
    fn index(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// The argument `name`; None when this overload has no such argument (the name must be
    /// one that some overload of the op has, see `check_argument_names`).
    pub fn get(&self, name: &str) -> Option<&'a Arg> {
        match self.index(name) {
            Some(i) => Some(&self.values[i]),
            None => {
                self.check_known(name);
                None
            }
        }
    }

    /// Like `get`, for a name that only some of the ops sharing a lowering have.
    pub fn probe(&self, name: &str) -> Option<&'a Arg> {
        self.index(name).map(|i| &self.values[i])
    }

    fn check_known(&self, name: &str) {
        // Names the engine adds (`__size`, the size program's result) are in no schema.
        if name.starts_with("__") {
            return;
        }
        let Some(known) = ARG_NAMES.get().and_then(|source| source(self.op)) else { return };
        assert!(
            known.contains(name),
            "torchtpu: the lowering of {} reads argument '{}', which no overload of the ops it serves has",
            self.op,
            name
        );
    }

    pub fn has(&self, name: &str) -> bool {
        matches!(self.get(name), Some(a) if !matches!(a, Arg::None))
    }

    fn missing(&self, name: &str, what: &str) -> TorchError {
        TorchError::new(
            ErrorKind::Type,
            format!("{}(): expected argument '{}' to be {}", self.op, name, what),
        )
    }

    /// The strides of tensor argument `name` (of its `item`-th tensor, for a list), where known
    /// (see `Args::strides`): for the few checks PyTorch makes of a view's layout rather than
    /// its values.
    pub fn strides_of(&self, name: &str, item: usize) -> Option<&'a [i64]> {
        self.strides.get(self.index(name)?)?.get(item).map(|s| s.as_slice())
    }

    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        match self.get(name) {
            Some(Arg::Tensor(t)) => Ok(*t),
            _ => Err(self.missing(name, "a Tensor")),
        }
    }

    pub fn opt_tensor(&self, name: &str) -> Result<Option<Tensor>> {
        match self.get(name) {
            Some(Arg::Tensor(t)) => Ok(Some(*t)),
            None | Some(Arg::None) => Ok(None),
            _ => Err(self.missing(name, "a Tensor or None")),
        }
    }

    pub fn tensors(&self, name: &str) -> Result<Vec<Tensor>> {
        match self.get(name) {
            Some(Arg::List(items)) => items
                .iter()
                .map(|a| match a {
                    Arg::Tensor(t) => Ok(*t),
                    _ => Err(self.missing(name, "a list of Tensors")),
                })
                .collect(),
            _ => Err(self.missing(name, "a list of Tensors")),
        }
    }

    pub fn opt_tensors(&self, name: &str) -> Result<Vec<Option<Tensor>>> {
        match self.get(name) {
            Some(Arg::List(items)) => items
                .iter()
                .map(|a| match a {
                    Arg::Tensor(t) => Ok(Some(*t)),
                    Arg::None => Ok(None),
                    _ => Err(self.missing(name, "a list of optional Tensors")),
                })
                .collect(),
            _ => Err(self.missing(name, "a list of optional Tensors")),
        }
    }

    pub fn int(&self, name: &str) -> Result<i64> {
        match self.get(name) {
            Some(Arg::Int(i)) => Ok(*i),
            Some(Arg::Bool(b)) => Ok(*b as i64),
            _ => Err(self.missing(name, "an int")),
        }
    }

    pub fn int_or(&self, name: &str, default: i64) -> Result<i64> {
        match self.get(name) {
            None | Some(Arg::None) => Ok(default),
            _ => self.int(name),
        }
    }

    pub fn opt_int(&self, name: &str) -> Result<Option<i64>> {
        match self.get(name) {
            None | Some(Arg::None) => Ok(None),
            _ => self.int(name).map(Some),
        }
    }

    pub fn bool(&self, name: &str) -> Result<bool> {
        match self.get(name) {
            Some(Arg::Bool(b)) => Ok(*b),
            Some(Arg::Int(i)) => Ok(*i != 0),
            _ => Err(self.missing(name, "a bool")),
        }
    }

    pub fn bool_or(&self, name: &str, default: bool) -> Result<bool> {
        match self.get(name) {
            None | Some(Arg::None) => Ok(default),
            _ => self.bool(name),
        }
    }

    pub fn ints(&self, name: &str) -> Result<Vec<i64>> {
        match self.get(name) {
            Some(Arg::IntList(v)) => Ok(v.clone()),
            Some(Arg::Int(i)) => Ok(vec![*i]),
            _ => Err(self.missing(name, "a list of ints")),
        }
    }

    pub fn opt_ints(&self, name: &str) -> Result<Option<Vec<i64>>> {
        match self.get(name) {
            None | Some(Arg::None) => Ok(None),
            _ => self.ints(name).map(Some),
        }
    }

    pub fn str(&self, name: &str) -> Result<Option<&'a str>> {
        match self.get(name) {
            Some(Arg::Str(s)) => Ok(Some(s.as_str())),
            None | Some(Arg::None) => Ok(None),
            _ => Err(self.missing(name, "a string")),
        }
    }

    pub fn dtype(&self, name: &str) -> Result<Option<DType>> {
        match self.get(name) {
            Some(Arg::DType(d)) => Ok(Some(*d)),
            None | Some(Arg::None) => Ok(None),
            _ => Err(self.missing(name, "a dtype")),
        }
    }

    pub fn scalar(&self, name: &str) -> Result<Scalar> {
        match self.get(name) {
            Some(Arg::Int(i)) => Ok(Scalar::Int(*i)),
            Some(Arg::Bool(b)) => Ok(Scalar::Bool(*b)),
            Some(Arg::Float(f)) => Ok(Scalar::Float(*f)),
            Some(Arg::Complex(re, im)) => Ok(Scalar::Complex(*re, *im)),
            _ => Err(self.missing(name, "a number")),
        }
    }

    pub fn opt_scalar(&self, name: &str) -> Result<Option<Scalar>> {
        match self.get(name) {
            None | Some(Arg::None) => Ok(None),
            _ => self.scalar(name).map(Some),
        }
    }

    pub fn generator(&self, name: &str) -> Result<Value> {
        match self.get(name) {
            Some(Arg::Generator(v)) => Ok(*v),
            _ => Err(self.missing(name, "a Generator")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Arc;

    // Only this test's made-up op has known names, so other tests' Args are unaffected.
    fn names(op: &str) -> Option<Arc<HashSet<String>>> {
        (op == "made_up_op").then(|| Arc::new(["self", "weight"].iter().map(|s| s.to_string()).collect()))
    }

    #[test]
    fn reading_a_name_no_overload_has_panics() {
        check_argument_names(names);
        let names = vec!["self".to_string()];
        let values = vec![Arg::Int(1)];
        let args = Args { op: "made_up_op", names: &names, values: &values, strides: &[] };
        assert!(args.get("weight").is_none(), "another overload's argument reads as not given");
        assert!(args.probe("wieght").is_none(), "probe does not check");
        let misspelled = std::panic::catch_unwind(|| args.get("wieght"));
        let message = *misspelled.unwrap_err().downcast::<String>().unwrap();
        assert!(message.contains("made_up_op reads argument 'wieght'"), "{message}");
    }
}
