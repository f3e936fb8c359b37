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
}

/// A Python number argument (Scalar): int and bool values are compiled in, floats are inputs.
#[derive(Copy, Clone, Debug)]
pub enum Scalar {
    Int(i64),
    Bool(bool),
    Float(FloatArg),
}

impl Scalar {
    /// The dtype PyTorch gives this number in type promotion (a wrapped number).
    pub fn dtype(&self) -> DType {
        match self {
            Scalar::Int(_) => DType::I64,
            Scalar::Bool(_) => DType::Bool,
            Scalar::Float(_) => DType::F64,
        }
    }
}

impl<'a> Args<'a> {
    fn index(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    pub fn get(&self, name: &str) -> Option<&'a Arg> {
        self.index(name).map(|i| &self.values[i])
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
            Some(Arg::Complex(..)) => {
                Err(TorchError::new(ErrorKind::NotImplemented, format!("{}: complex scalars are not supported on tpu yet", self.op)))
            }
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
