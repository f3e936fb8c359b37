//! A small builder for StableHLO programs that prints MLIR text.
//!
//! Used to lower PyTorch ATen ops for XLA PJRT plugins: build a function with
//! [`Builder`], call [`Builder::finish`], and hand the text to a plugin's
//! compile call in the "mlir" format. Ops are printed in MLIR's generic form
//! (`%2 = "stablehlo.add"(%0, %1) : (...) -> ...`), which does not depend on
//! each op's pretty syntax; the text is tested against StableHLO 1.13 (the
//! XLA CPU plugin, PJRT API 0.81). CHLO ops (`chlo.erf`, ...) are accepted
//! too, as PJRT legalizes them.
//!
//! The builder infers every result type and panics with the op name on
//! misuse (mismatched types, out-of-range dims); lowerings check user input
//! before calling it.
//!
//! ```
//! use stablehlo::{Builder, ElemType, TensorType};
//! let mut b = Builder::new();
//! let x = b.param(TensorType::new(ElemType::F32, &[2, 3]));
//! let y = b.exp(x);
//! let text = b.finish(&[y]);
//! assert!(text.contains("\"stablehlo.exponential\"(%arg0)"));
//! ```

mod builder;
mod compute;
mod control;
mod elementwise;
mod expr;
mod literal;
mod shape;
mod types;

pub use builder::{Builder, Precision, Value};
pub use expr::{Ex, Operand, E};
pub use literal::{f8_bits, round_to};
pub use types::{CmpDir, ConvDims, ElemType, GatherDims, RngAlgorithm, ScatterDims, TensorType};
