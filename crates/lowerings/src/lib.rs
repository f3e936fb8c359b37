//! ATen ops lowered to StableHLO. One function per op, grouped by family; each checks its
//! arguments the way PyTorch does and emits into a `Cx`. The engine (eager) and the graph
//! compiler (torch.compile) call the same functions.
//!
//! Layout: `ops/` holds the op families, one family per file (a directory where a family has
//! several, like `ops/linalg/`); each file of ops declares them in an `OPS` table (see
//! `decl`: name, function and how the engine and the shim treat the op), which `registry()`
//! reads. Declaring an op there is all it takes to add it.
//! `blocks/` holds the building blocks shared across families (reductions, contractions,
//! gathers and scatters, constants, 16-bit rounding, loop pieces, dtype names); args, cx,
//! dtype, error, graph and torch_version are the crate's API and machinery.
//!
//! Conventions:
//! - A lowering is found by the op's base name with any in-place `_` removed: `add`,
//!   `add_` and `add.out` all use `add`; it reads arguments by their schema names.
//! - It returns the functional result; the engine writes it into mutated arguments
//!   (in-place and out= variants) in schema order.
//! - Float scalars are runtime inputs (`Cx::scalar`) so that changed values reuse executables.
//!   A cached program runs without calling its lowering again, so a lowering that checks or
//!   branches on a float's value must be declared `.specialized()`.
//! - An op file imports helpers from `blocks/` and from its own family's directory, never from
//!   another family: a helper that a second family needs moves to `blocks/`.

pub mod args;
pub mod decl;
pub mod cx;
pub mod dtype;
pub mod error;
pub mod float4;
pub mod graph;
pub mod torch_version;

mod blocks;
mod ops;

pub use args::{contiguous_strides, is_contiguous, Arg, Args, FloatArg, Scalar, Tensor};
pub use decl::{op, ops, Names, Op};
pub use cx::{broadcast_shapes, wrap_dim, Bound, Check, CheckEval, Cx, Feed, HostBound, Padded};
pub use ops::grouped_mm::set_ragged_dot;
pub use blocks::reduce::set_sums_as_dots;
pub use blocks::gather::take_1d;
pub use blocks::contract::{set_host_matmul, HOST_MATMUL_TARGET};
pub use ops::custom_kernels::{kernel as ops_kernel, register_module as register_module_kernel, register_text as register_text_kernel};
pub use blocks::precision::{float32_matmul, set_float32_matmul};
pub use dtype::{can_cast, promote, result_type, DType, Rank};
pub use error::{ErrorKind, Result, TorchError};
use std::collections::HashMap;
use std::sync::OnceLock;
use stablehlo::Value;

/// A lowering's result: one entry per non-aliased return of the op.
#[derive(Clone, Debug)]
pub enum Out {
    Tensor(Value),
    List(Vec<Value>),
    /// An undefined tensor (Python's None), for optional results PyTorch leaves out.
    Undefined,
}

pub type LowerFn = fn(&mut Cx, &Args) -> Result<Vec<Out>>;

/// The engine's name for a declaration: what it needs of an op is in `Op`.
pub type Lowering = Op;

/// Every family's declarations.
const FAMILIES: &[&[Op]] = &[
    graph::OPS,
    ops::activations::OPS,
    ops::asserts::OPS,
    ops::attention::OPS,
    ops::complex::OPS,
    ops::conv::OPS,
    ops::custom_kernels::OPS,
    ops::distance::OPS,
    ops::elementwise::OPS,
    ops::embedding::OPS,
    ops::factories::OPS,
    ops::fft::OPS,
    ops::grouped_mm::OPS,
    ops::histogram::OPS,
    ops::host_memory::OPS,
    ops::indexing::OPS,
    ops::jagged::OPS,
    ops::linalg::cholesky::OPS,
    ops::linalg::eigen::jacobi::OPS,
    ops::linalg::eigen::OPS,
    ops::linalg::ldl::OPS,
    ops::linalg::lstsq::OPS,
    ops::linalg::lu::OPS,
    ops::linalg::matrix_exp::OPS,
    ops::linalg::products::OPS,
    ops::linalg::qr::OPS,
    ops::linalg::OPS,
    ops::losses::ctc::OPS,
    ops::losses::margin::OPS,
    ops::losses::nll::OPS,
    ops::losses::pointwise::OPS,
    ops::nonzero_unique::OPS,
    ops::normalization::OPS,
    ops::optim::OPS,
    ops::order_stats::OPS,
    ops::random::OPS,
    ops::recurrent::OPS,
    ops::reductions::OPS,
    ops::scaled_mm::OPS,
    ops::search::OPS,
    ops::shape_ops::OPS,
    ops::softmax::OPS,
    ops::spatial::fold::OPS,
    ops::spatial::grid_sample::OPS,
    ops::spatial::pad::OPS,
    ops::spatial::pool::OPS,
    ops::spatial::upsample::OPS,
    ops::special::bessel::OPS,
    ops::special::gamma::OPS,
    ops::special::logit::OPS,
    ops::special::math::OPS,
    ops::special::ndtr::OPS,
    ops::special::polynomials::OPS,
    ops::sync_batch_norm::OPS,
    ops::transformer_fastpath::OPS,
    ops::views::OPS,
];

/// Every declared op by base name.
pub struct Registry {
    map: HashMap<&'static str, &'static Op>,
    /// Which family table (index in FAMILIES) declares each name.
    family: HashMap<&'static str, usize>,
}

impl Registry {
    pub fn get(&self, base: &str) -> Option<&'static Op> {
        self.map.get(base).copied()
    }

    pub fn names(&self) -> Vec<&'static str> {
        let mut v: Vec<_> = self.map.keys().copied().collect();
        v.sort();
        v
    }

    /// The names declared in the same family table as `base` (itself included).
    pub fn family_names(&self, base: &str) -> Vec<&'static str> {
        let Some(&family) = self.family.get(base) else { return Vec::new() };
        FAMILIES[family].iter().flat_map(|d| d.names.iter()).collect()
    }

    /// Every declaration, each once.
    pub fn declarations(&self) -> impl Iterator<Item = &'static Op> {
        FAMILIES.iter().flat_map(|family| family.iter())
    }
}

/// Every lowering, from the families' declarations.
pub fn registry() -> &'static Registry {
    static REG: OnceLock<Registry> = OnceLock::new();
    REG.get_or_init(|| {
        let mut map = HashMap::new();
        let mut family = HashMap::new();
        for (index, table) in FAMILIES.iter().enumerate() {
            for decl in table.iter() {
                for name in decl.names.iter() {
                    let old = map.insert(name, decl);
                    assert!(old.is_none(), "lowering {name} declared twice");
                    family.insert(name, index);
                }
            }
        }
        Registry { map, family }
    })
}

/// The lowering name for an aten op: `aten::add_` -> `add`, `aten::__and__` -> `__and__`.
pub fn base_name(qualified: &str) -> &str {
    let name = qualified.strip_prefix("aten::").unwrap_or(qualified);
    if !name.starts_with("__") {
        if let Some(stripped) = name.strip_suffix('_') {
            return stripped;
        }
    }
    name
}

/// Shorthand for a single-tensor result.
pub fn one(v: Value) -> Result<Vec<Out>> {
    Ok(vec![Out::Tensor(v)])
}
