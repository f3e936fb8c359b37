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
