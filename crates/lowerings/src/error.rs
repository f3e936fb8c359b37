//! Errors with the Python exception class PyTorch raises for the same bad input.

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    Runtime,
    Value,
    Type,
    Index,
    NotImplemented,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TorchError {
    pub kind: ErrorKind,
    pub message: String,
}

impl std::fmt::Display for TorchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for TorchError {}

pub type Result<T> = std::result::Result<T, TorchError>;

impl TorchError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        TorchError { kind, message: message.into() }
    }
}

/// `bail!(Runtime, "...")`: return a TorchError of that kind.
#[macro_export]
macro_rules! bail {
    ($kind:ident, $($fmt:tt)*) => {
        return Err($crate::TorchError::new($crate::ErrorKind::$kind, format!($($fmt)*)))
    };
}

/// `check!(cond, Runtime, "...")`: PyTorch's TORCH_CHECK with an exception class.
#[macro_export]
macro_rules! check {
    ($cond:expr, $kind:ident, $($fmt:tt)*) => {
        if !$cond {
            $crate::bail!($kind, $($fmt)*);
        }
    };
}
