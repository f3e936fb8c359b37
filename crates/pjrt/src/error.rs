//! Errors: every `PJRT_Error` the plugin returns becomes an [`Error`] carrying
//! the plugin's message and status code, and the C error is destroyed.

use crate::ffi;
use std::fmt;

/// Status codes, as in `absl::StatusCode` / `PJRT_Error_Code`.
pub mod code {
    pub const CANCELLED: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const NOT_FOUND: i32 = 5;
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    pub const FAILED_PRECONDITION: i32 = 9;
    pub const OUT_OF_RANGE: i32 = 11;
    pub const UNIMPLEMENTED: i32 = 12;
    pub const INTERNAL: i32 = 13;
}

/// An error from the plugin (its code and message) or from this crate's own
/// checks (then `code` is one of [`code`]'s values too).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub code: i32,
    pub message: String,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The error of every call in a process forked after a client started (`crate::forked`).
    pub fn forked() -> Error {
        Error::new(code::FAILED_PRECONDITION, "the PJRT client cannot be used in a process forked after it started")
    }

    pub fn new(code: i32, message: impl Into<String>) -> Error {
        Error { code, message: message.into() }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::new(code::INVALID_ARGUMENT, message)
    }

    /// The plugin's function table lacks `function` (too old, or left null).
    pub fn missing(function: &str) -> Error {
        Error::new(
            code::UNIMPLEMENTED,
            format!("{function} is not provided by this PJRT plugin"),
        )
    }

    /// Name of the status code, for messages.
    pub fn code_name(&self) -> &'static str {
        match self.code {
            0 => "OK",
            1 => "CANCELLED",
            2 => "UNKNOWN",
            3 => "INVALID_ARGUMENT",
            4 => "DEADLINE_EXCEEDED",
            5 => "NOT_FOUND",
            6 => "ALREADY_EXISTS",
            7 => "PERMISSION_DENIED",
            8 => "RESOURCE_EXHAUSTED",
            9 => "FAILED_PRECONDITION",
            10 => "ABORTED",
            11 => "OUT_OF_RANGE",
            12 => "UNIMPLEMENTED",
            13 => "INTERNAL",
            14 => "UNAVAILABLE",
            15 => "DATA_LOSS",
            16 => "UNAUTHENTICATED",
            _ => "UNKNOWN_CODE",
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PJRT error {}: {}", self.code_name(), self.message)
    }
}

impl std::error::Error for Error {}

/// Converts a returned `PJRT_Error*` (null means success) into a `Result`,
/// destroying the C error.
///
/// # Safety
/// `err` must be null or an error freshly returned by `api`'s plugin.
#[inline(always)]
pub unsafe fn take_error(api: &ffi::Api, err: *mut ffi::PJRT_Error) -> Result<()> {
    if err.is_null() {
        Ok(())
    } else {
        Err(convert_error(api, err))
    }
}

#[cold]
unsafe fn convert_error(api: &ffi::Api, err: *mut ffi::PJRT_Error) -> Error {
    let mut message = String::from("(no message)");
    if let Some(f) = api.PJRT_Error_Message {
        let mut a = ffi::PJRT_Error_Message_Args::new();
        a.error = err;
        f(&mut a);
        if !a.message.is_null() {
            message = String::from_utf8_lossy(std::slice::from_raw_parts(
                a.message as *const u8,
                a.message_size,
            ))
            .into_owned();
        }
    }
    let mut code = code::UNKNOWN;
    if let Some(f) = api.PJRT_Error_GetCode {
        let mut a = ffi::PJRT_Error_GetCode_Args::new();
        a.error = err;
        let e2 = f(&mut a);
        if e2.is_null() {
            code = a.code;
        } else {
            destroy_error(api, e2);
        }
    }
    destroy_error(api, err);
    Error { code, message }
}

unsafe fn destroy_error(api: &ffi::Api, err: *mut ffi::PJRT_Error) {
    if let Some(f) = api.PJRT_Error_Destroy {
        let mut a = ffi::PJRT_Error_Destroy_Args::new();
        a.error = err;
        f(&mut a);
    }
}

/// Copies a (pointer, length) string owned by the plugin.
///
/// # Safety
/// `ptr` must be null or valid for `len` bytes.
pub(crate) unsafe fn c_str(ptr: *const std::ffi::c_char, len: usize) -> String {
    if ptr.is_null() || len == 0 {
        return String::new();
    }
    String::from_utf8_lossy(std::slice::from_raw_parts(ptr as *const u8, len)).into_owned()
}
