//! The C ABI shared with the C++ shim (csrc/abi.h): plain data, mirrored field by field.
//! The torchtpu build script checks at compile time that both sides lay it out the same way
//! (crates/torchtpu/build.rs writes this crate's layout for csrc/abi_check.cpp).
use std::ffi::c_void;

pub const TT_NONE: u8 = 0;
pub const TT_TENSOR: u8 = 1;
pub const TT_INT: u8 = 2;
pub const TT_FLOAT: u8 = 3;
pub const TT_BOOL: u8 = 4;
pub const TT_COMPLEX: u8 = 5;
pub const TT_INT_LIST: u8 = 6;
pub const TT_FLOAT_LIST: u8 = 7;
pub const TT_BOOL_LIST: u8 = 8;
pub const TT_TENSOR_LIST: u8 = 9;
pub const TT_STR: u8 = 10;
pub const TT_SCALAR_TYPE: u8 = 11;
pub const TT_GENERATOR: u8 = 12;
pub const TT_OTHER: u8 = 13;

pub const TT_HOST: u8 = 1;
pub const TT_WRAPPED_NUMBER: u8 = 2;

#[repr(C)]
#[derive(Copy, Clone)]
pub struct TtTensor {
    pub cell: *mut c_void,
    pub host: *const c_void,
    pub sizes: *const i64,
    pub strides: *const i64,
    pub offset: i64,
    pub ndim: i32,
    pub dtype: i8,
    pub flags: u8,
}

#[repr(C)]
#[derive(Copy, Clone)]
pub struct TtPair {
    pub i: i64,
    pub i2: i64,
}

#[repr(C)]
#[derive(Copy, Clone)]
pub struct TtComplex {
    pub re: f64,
    pub im: f64,
}

#[repr(C)]
#[derive(Copy, Clone)]
pub struct TtList {
    pub ptr: *const c_void,
    pub len: usize,
}

#[repr(C)]
#[derive(Copy, Clone)]
pub union TtPayload {
    pub t: TtTensor,
    pub n: TtPair,
    pub f: f64,
    pub c: TtComplex,
    pub list: TtList,
}

#[repr(C)]
#[derive(Copy, Clone)]
pub struct TtArg {
    pub kind: u8,
    pub p: TtPayload,
}

pub const TT_OUT_TENSOR: u8 = 0;
pub const TT_OUT_LIST: u8 = 1;
pub const TT_OUT_UNDEFINED: u8 = 2;

#[repr(C)]
#[derive(Copy, Clone)]
pub struct TtOut {
    pub kind: u8,
    pub dtype: i8,
    pub ndim: i32,
    pub sizes: *const i64,
    pub cell: *mut c_void,
    pub i: i64,
}

pub const TT_OK: i32 = 0;
pub const TT_ERR_RUNTIME: i32 = 1;
pub const TT_ERR_VALUE: i32 = 2;
pub const TT_ERR_TYPE: i32 = 3;
pub const TT_ERR_INDEX: i32 = 4;
pub const TT_ERR_NOT_IMPLEMENTED: i32 = 5;
pub const TT_RESIZE: i32 = 6;
pub const TT_ERR_NO_LOWERING: i32 = 7;
pub const TT_ERR_OUT_OF_MEMORY: i32 = 8;

#[repr(C)]
pub struct TtResult {
    pub status: i32,
    pub resize_arg: i32,
    pub message: *const std::ffi::c_char,
    pub nouts: usize,
    pub outs: *const TtOut,
}

/// A device's memory statistic: current value, peak, total increase and total decrease.
#[repr(C)]
#[derive(Copy, Clone, Default)]
pub struct TtStat {
    pub current: i64,
    pub peak: i64,
    pub allocated: i64,
    pub freed: i64,
}

#[repr(C)]
#[derive(Copy, Clone, Default)]
pub struct TtMemoryStats {
    pub buffers: TtStat,
    pub bytes: TtStat,
    pub reserved: TtStat,
}

impl TtArg {
    pub fn tensor(&self) -> &TtTensor {
        unsafe { &self.p.t }
    }
    pub fn int(&self) -> i64 {
        unsafe { self.p.n.i }
    }
    pub fn list<T>(&self) -> &[T] {
        unsafe {
            let l = self.p.list;
            if l.len == 0 {
                &[]
            } else {
                std::slice::from_raw_parts(l.ptr as *const T, l.len)
            }
        }
    }
}

impl TtTensor {
    pub fn sizes(&self) -> &[i64] {
        if self.ndim == 0 {
            &[]
        } else {
            unsafe { std::slice::from_raw_parts(self.sizes, self.ndim as usize) }
        }
    }
    pub fn strides(&self) -> &[i64] {
        if self.ndim == 0 {
            &[]
        } else {
            unsafe { std::slice::from_raw_parts(self.strides, self.ndim as usize) }
        }
    }
    pub fn is_host(&self) -> bool {
        self.flags & TT_HOST != 0
    }
}
