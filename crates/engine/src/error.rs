//! The engine's error type: a PyTorch exception (class and message) or a PJRT error.
use lowerings::{ErrorKind, TorchError};

#[derive(Debug)]
pub enum Error {
    Torch(TorchError),
    /// No lowering: NotImplementedError, or the CPU fallback when the user enabled it.
    NoLowering(TorchError),
    Pjrt(pjrt::Error),
}

impl Error {
    pub fn runtime(msg: impl Into<String>) -> Error {
        Error::Torch(TorchError::new(ErrorKind::Runtime, msg))
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Torch(e) | Error::NoLowering(e) => e.kind,
            Error::Pjrt(_) => ErrorKind::Runtime,
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Torch(e) | Error::NoLowering(e) => f.write_str(&e.message),
            Error::Pjrt(e) => write!(f, "torchtpu: PJRT error: {e}"),
        }
    }
}

impl From<pjrt::Error> for Error {
    fn from(e: pjrt::Error) -> Self {
        Error::Pjrt(e)
    }
}

/// For a cell whose recorded op never ran (fused eager mode: an op before it in its graph
/// failed, and that error was raised).
pub fn not_computed() -> Error {
    Error::runtime("torchtpu: this tensor has no value: the op that computes it was recorded in fused eager mode and an earlier op of its graph failed (that error was raised)")
}
