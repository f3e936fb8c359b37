//! The float32 matmul precision (`torch.set_float32_matmul_precision`) as XLA's
//! `precision_config` on every contraction and convolution: "highest" (PyTorch's default) is
//! HIGHEST, "high" is HIGH (TF32 on GPUs, three bf16 passes on TPUs), "medium" is DEFAULT
//! (one bf16 pass). 16-bit and float8 operands carry no attribute: they are exact in any mode.
use crate::cx::Cx;
use crate::dtype::DType;
use stablehlo::Precision;
use std::sync::atomic::{AtomicU8, Ordering};

/// The setting, numbered as PyTorch's `at::Float32MatmulPrecision` (0 highest, 1 high, 2 medium).
static FLOAT32_MATMUL: AtomicU8 = AtomicU8::new(0);

/// Sets the precision of later lowerings (the engine keys programs by it: `float32_matmul`).
pub fn set_float32_matmul(code: u8) {
    FLOAT32_MATMUL.store(code.min(2), Ordering::Relaxed);
}

pub fn float32_matmul() -> u8 {
    FLOAT32_MATMUL.load(Ordering::Relaxed)
}

/// Sets the precision of the next dot_general / convolution on operands of dtype `d`.
pub(crate) fn set_for(cx: &mut Cx, d: DType) {
    let p = match d {
        DType::F32 | DType::C64 => match float32_matmul() {
            0 => Some(Precision::Highest),
            1 => Some(Precision::High),
            _ => Some(Precision::Default),
        },
        // float64 has no reduced-precision passes to allow.
        DType::F64 | DType::C128 => Some(Precision::Highest),
        _ => None,
    };
    cx.set_precision(p);
}
