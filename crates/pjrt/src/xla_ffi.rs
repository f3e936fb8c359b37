//! Handlers for XLA's typed FFI custom calls, registered with a plugin through PJRT's FFI
//! extension: a `stablehlo.custom_call` with `api_version = 4` then calls into this process.
//!
//! Hand-written `#[repr(C)]` declarations of the call frame XLA passes to a handler (from
//! reading XLA's `ffi/api/c_api.h`, FFI API 0.x), and safe readers of its buffers and integer
//! attributes. Only what the handlers here read is declared.
#![allow(non_camel_case_types)]

use std::ffi::c_void;

/// What XLA calls: returns null on success, else an error made by [`CallFrame::error`].
pub type Handler = unsafe extern "C" fn(frame: *mut CallFrame) -> *mut c_void;

#[repr(C)]
struct ExtensionBase {
    struct_size: usize,
    kind: i32,
    next: *mut ExtensionBase,
}

/// `XLA_FFI_Extension_Metadata`: XLA asks a handler at registration which FFI API it speaks.
const EXTENSION_METADATA: i32 = 1;

#[repr(C)]
struct ApiVersion {
    struct_size: usize,
    extension_start: *mut c_void,
    major: i32,
    minor: i32,
}

#[repr(C)]
struct Metadata {
    struct_size: usize,
    api_version: ApiVersion,
    traits: u32,
}

#[repr(C)]
struct MetadataExtension {
    base: ExtensionBase,
    metadata: *mut Metadata,
}

/// The head of `XLA_FFI_Api`: its version, then the error constructor.
#[repr(C)]
struct Api {
    struct_size: usize,
    extension_start: *mut c_void,
    api_version: ApiVersion,
    internal_api: *mut c_void,
    error_create: Option<unsafe extern "C" fn(*mut ErrorCreateArgs) -> *mut c_void>,
}

#[repr(C)]
struct ErrorCreateArgs {
    struct_size: usize,
    extension_start: *mut c_void,
    message: *const std::ffi::c_char,
    code: i32,
}

#[repr(C)]
struct List {
    struct_size: usize,
    extension_start: *mut c_void,
    size: i64,
    types: *const i32,
    items: *const *mut c_void,
}

#[repr(C)]
struct Attrs {
    struct_size: usize,
    extension_start: *mut c_void,
    size: i64,
    types: *const i32,
    names: *const *const ByteSpan,
    attrs: *const *mut c_void,
}

#[repr(C)]
struct ByteSpan {
    ptr: *const u8,
    len: usize,
}

#[repr(C)]
struct Scalar {
    dtype: i32,
    value: *const c_void,
}

/// `XLA_FFI_Buffer`: an argument or result array in the device's memory.
#[repr(C)]
pub struct Buffer {
    struct_size: usize,
    extension_start: *mut c_void,
    /// XLA's `PrimitiveType` number (F32 is 11).
    pub dtype: i32,
    pub data: *mut c_void,
    rank: i64,
    dims: *const i64,
}

impl Buffer {
    pub fn dims(&self) -> &[i64] {
        if self.rank == 0 {
            return &[];
        }
        // SAFETY: XLA passes `rank` dims that live as long as the call.
        unsafe { std::slice::from_raw_parts(self.dims, self.rank as usize) }
    }

    pub fn elements(&self) -> i64 {
        self.dims().iter().product()
    }
}

/// `XLA_FFI_CallFrame`.
#[repr(C)]
pub struct CallFrame {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    api: *const Api,
    ctx: *mut c_void,
    stage: i32,
    args: List,
    rets: List,
    attrs: Attrs,
}

const ARG_BUFFER: i32 = 1;
const ATTR_SCALAR: i32 = 3;
const DTYPE_S64: i32 = 5;
const STAGE_EXECUTE: i32 = 3;
pub const DTYPE_F32: i32 = 11;

impl CallFrame {
    /// Answers XLA's question at registration (the handler's FFI API version: the one XLA
    /// itself speaks) and skips the stages before execution. True when the call is to run.
    ///
    /// # Safety
    /// `self` must be the frame XLA passed to the handler.
    pub unsafe fn should_execute(&mut self) -> bool {
        let mut ext = self.extension_start;
        while !ext.is_null() {
            if (*ext).kind == EXTENSION_METADATA {
                let meta = &mut *(*(ext as *mut MetadataExtension)).metadata;
                meta.api_version.major = (*self.api).api_version.major;
                meta.api_version.minor = (*self.api).api_version.minor;
                meta.traits = 0;
                return false;
            }
            ext = (*ext).next;
        }
        self.stage == STAGE_EXECUTE
    }

    fn buffers(list: &List) -> Option<Vec<&Buffer>> {
        (0..list.size as usize)
            .map(|i| {
                // SAFETY: XLA passes `size` entries that live as long as the call.
                unsafe { (*list.types.add(i) == ARG_BUFFER).then(|| &*(*list.items.add(i) as *const Buffer)) }
            })
            .collect()
    }

    /// The arguments, or None where one is not an array.
    pub fn args(&self) -> Option<Vec<&Buffer>> {
        Self::buffers(&self.args)
    }

    /// The results, or None where one is not an array.
    pub fn results(&self) -> Option<Vec<&Buffer>> {
        Self::buffers(&self.rets)
    }

    /// The 64-bit integer attribute `name` of the call's `backend_config`.
    pub fn attr_i64(&self, name: &str) -> Option<i64> {
        let a = &self.attrs;
        (0..a.size as usize).find_map(|i| unsafe {
            let n = &**a.names.add(i);
            let key = std::slice::from_raw_parts(n.ptr, n.len);
            if key != name.as_bytes() || *a.types.add(i) != ATTR_SCALAR {
                return None;
            }
            let s = &*(*a.attrs.add(i) as *const Scalar);
            (s.dtype == DTYPE_S64).then(|| *(s.value as *const i64))
        })
    }

    /// An error for XLA to raise from the running program (code INTERNAL).
    pub fn error(&self, message: &str) -> *mut c_void {
        let text = std::ffi::CString::new(message.replace('\0', " ")).unwrap_or_default();
        // SAFETY: `api` is XLA's table; it copies the message.
        unsafe {
            match (*self.api).error_create {
                Some(create) => create(&mut ErrorCreateArgs {
                    struct_size: std::mem::size_of::<ErrorCreateArgs>(),
                    extension_start: std::ptr::null_mut(),
                    message: text.as_ptr(),
                    code: 13,
                }),
                // Every XLA FFI table has it (it predates the versioned API).
                None => std::process::abort(),
            }
        }
    }
}
