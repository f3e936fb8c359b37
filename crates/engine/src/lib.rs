//! The eager engine behind device "tpu": storage cells, the executable cache and execution of
//! aten calls on a PJRT plugin. The C ABI types it speaks are in `abi` (the crate crates/abi,
//! which mirrors csrc/abi.h).
pub use ::abi;
pub mod address;
pub mod cell;
pub mod checks;
pub mod dispatch;
pub mod disk_cache;
pub mod host;
pub mod memory;
pub mod runtime;
pub mod view;

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

pub fn device_count() -> i32 {
    if let Some(n) = runtime::started_device_count() {
        return n as i32;
    }
    match runtime::runtime() {
        Ok(rt) => rt.devices.len() as i32,
        Err(_) => 0,
    }
}

/// Grows a cell to `nbytes` keeping its contents; new bytes read as zeros.
pub fn resize_cell(c: &cell::Cell, nbytes: i64) -> Result<(), Error> {
    if nbytes <= c.nbytes() {
        return Ok(());
    }
    let (layout, mut bytes) = host::cell_bytes(c)?;
    bytes.resize(nbytes as usize, 0);
    c.set_nbytes(nbytes);
    host::set_cell_bytes(c, layout.map(|(d, _)| d), &bytes)
}

/// Copies `nbytes` of `src`'s contents into `dst` (the allocator's copy_data).
pub fn copy_cell_bytes(dst: &cell::Cell, src: &cell::Cell, nbytes: i64) -> Result<(), Error> {
    let (layout, bytes) = host::cell_bytes(src)?;
    let (_, mut out) = host::cell_bytes(dst)?;
    let n = (nbytes as usize).min(bytes.len()).min(out.len());
    out[..n].copy_from_slice(&bytes[..n]);
    host::set_cell_bytes(dst, layout.map(|(d, _)| d), &out)
}
