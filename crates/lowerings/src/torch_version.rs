//! The torch release this process runs with, for the few behaviours that differ between the
//! supported releases (2.11 to 2.15). The Python package sets it once at start; until then
//! (the crate's own tests) the newest behaviour applies.
use crate::ErrorKind;
use std::sync::atomic::{AtomicU32, Ordering};

static MINOR: AtomicU32 = AtomicU32::new(u32::MAX);

/// Records the running torch 2.`minor` (a torch 3 counts as newer than every 2.x).
pub fn set(major: u32, minor: u32) {
    MINOR.store(if major == 2 { minor } else { u32::MAX }, Ordering::Relaxed);
}

fn at_least_2(minor: u32) -> bool {
    MINOR.load(Ordering::Relaxed) >= minor
}

/// Conversions to float8_e4m3fn saturate from torch 2.12 (overflow and inf give +-448, as
/// its CUDA kernels and compiled code do); before, they gave nan.
pub fn float8_e4m3fn_saturates() -> bool {
    at_least_2(12)
}

/// The `-` operator on bool tensors (sub, rsub, neg): NotImplementedError from torch 2.14,
/// RuntimeError before.
pub fn bool_minus_error() -> ErrorKind {
    if at_least_2(14) {
        ErrorKind::NotImplemented
    } else {
        ErrorKind::Runtime
    }
}

/// Activations given a bool tensor ("Bool inputs not supported for hardtanh"):
/// NotImplementedError from torch 2.14, RuntimeError before.
pub fn bool_activation_error() -> ErrorKind {
    bool_minus_error()
}

/// softshrink rounds lambda to a 16-bit input's dtype before comparing from torch 2.14
/// (an input equal to the rounded lambda then shrinks to 0); before, it compared in float.
pub fn softshrink_rounds_lambda() -> bool {
    at_least_2(14)
}

/// addmv/mv with operands of different dtypes: from torch 2.12 one message names all three
/// ("addmv input tensors must have the same dtype, ..."); before, the first mismatch.
pub fn addmv_names_all_dtypes() -> bool {
    at_least_2(12)
}

/// trace of float16/bfloat16 matrices: runs on CPU from torch 2.13 (NotImplementedError before).
pub fn trace_has_16_bit_floats() -> bool {
    at_least_2(13)
}

/// native_group_norm rejects inputs with no spatial elements (HxW = 0) from torch 2.14.
pub fn group_norm_rejects_empty_spatial() -> bool {
    at_least_2(14)
}
