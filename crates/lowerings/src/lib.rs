//! ATen ops lowered to StableHLO. One function per op, grouped by family; each checks its
//! arguments the way PyTorch does and emits into a `Cx`. The engine (eager) and the graph
//! compiler (torch.compile) call the same functions.
//!
//! Layout: `ops/` holds the op families, one family per file (a directory where a family has
//! several, like `ops/linalg/`); each file of ops has a `register` that `registry()` calls.
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
//!   branches on a float's value must be registered with `add_specialized`.
//! - An op file imports helpers from `blocks/` and from its own family's directory, never from
//!   another family: a helper that a second family needs moves to `blocks/`.

pub mod args;
pub mod cx;
pub mod dtype;
pub mod error;
pub mod graph;
pub mod torch_version;

mod blocks;
mod ops;

pub use args::{Arg, Args, FloatArg, Scalar, Tensor};
pub use cx::{broadcast_shapes, wrap_dim, Bound, Check, CheckEval, Cx, Feed, HostBound};
pub use ops::grouped_mm::set_ragged_dot;
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

#[derive(Copy, Clone)]
pub struct Lowering {
    pub f: LowerFn,
    /// Compile float arguments in (their values become part of the cache key) because the
    /// lowering needs them to decide the program's structure.
    pub specialize_floats: bool,
    /// For ops whose output size depends on the data (nonzero, masked_select, unique): a first
    /// program computing that size as a 0-d int64 tensor. The engine runs it, reads the number
    /// and passes it to `f` as the int argument `__size`.
    pub size: Option<LowerFn>,
    /// Arguments the op writes without declaring it in its schema (native_batch_norm's
    /// running statistics): written like declared ones, after them, in this order.
    pub writes: &'static [&'static str],
}

/// Structured ops whose generated composite (allocate the output, call out=) must stay:
/// their output shape depends on data the composite's meta function computes.
pub const KEEP_COMPOSITE: &[&str] = &[
    // x[mask]: the composite sizes the output by counting the mask; the lowering reads it.
    "index.Tensor",
];

/// Aten ops (with overload) whose CompositeExplicitAutograd kernel would shadow the boxed
/// fallback on "tpu": the C++ shim registers the fallback for them explicitly, so that their
/// lowering runs instead.
pub const ROUTED_OPS: &[&str] = &[
    // Their composite kernels only raise for backends other than CPU/CUDA.
    "convolution_overrideable",
    "convolution_backward_overrideable",
    // Composites that would run as several programs with double rounding in 16-bit floats.
    "native_layer_norm",
    "logsumexp",
    "logsumexp.out",
    // Its composite resizes four empty out= tensors, one more than the shim's retries allow.
    "linalg_lstsq",
    // Its composite (math_group_norm) computes 16-bit statistics in 16 bits.
    "native_group_norm",
    // PyTorch's SDPA backend for other devices; the composites only raise.
    "_scaled_dot_product_fused_attention_overrideable",
    "_scaled_dot_product_fused_attention_overrideable_backward",
    // Its composite runs one product per group after reading the offsets on the host.
    "_grouped_mm",
    // Its composite calls the CPU kernel range_out directly, which writes through data_ptr.
    "range.out_",
    // Its composites (FSDP2's gradient packing) pad and copy one tensor at a time, and read
    // past a 0-d input's sizes.
    "_chunk_cat",
    "_chunk_cat.out",
    // Their composites run a kernel stub that only CPU and CUDA register.
    "kaiser_window",
    "kaiser_window.periodic",
    "kaiser_window.beta",
];

/// Ops whose device-generic kernels read or write tensor data as host memory (found by
/// `python -m torchtpu.probe`: on tpu they faulted in the device address region). Routed to
/// the fallback like ROUTED_OPS, they raise NotImplementedError naming the op instead.
pub const HOST_MEMORY_OPS: &[&str] = &[
    "_grid_sampler_2d_cpu_fallback",
    "_grid_sampler_2d_cpu_fallback.out",
    "_grid_sampler_2d_cpu_fallback_backward",
    "_nnpack_spatial_convolution",
    "_nnpack_spatial_convolution.out",
    "_saturate_weight_to_fp16",
    "choose_qparams_optimized",
    "fbgemm_linear_quantize_weight",
    "fbgemm_pack_gemm_matrix_fp16",
];

/// Op families whose composite kernels loop over a list one tensor at a time (`_foreach_*`):
/// every overload with a lowering is routed to it, so a whole list runs as one program.
pub const ROUTED_FAMILIES: &[&str] = &["_foreach_"];

pub struct Registry {
    map: HashMap<&'static str, Lowering>,
}

impl Registry {
    fn insert(&mut self, name: &'static str, l: Lowering) {
        let old = self.map.insert(name, l);
        assert!(old.is_none(), "lowering {name} registered twice");
    }

    pub fn add(&mut self, name: &'static str, f: LowerFn) {
        self.insert(name, Lowering { f, specialize_floats: false, size: None, writes: &[] });
    }

    pub fn add_specialized(&mut self, name: &'static str, f: LowerFn) {
        self.insert(name, Lowering { f, specialize_floats: true, size: None, writes: &[] });
    }

    /// An op with a data-dependent output size (see `Lowering::size`).
    pub fn add_sized(&mut self, name: &'static str, size: LowerFn, f: LowerFn) {
        self.insert(name, Lowering { f, specialize_floats: false, size: Some(size), writes: &[] });
    }

    /// An op that writes arguments its schema does not mark (see `Lowering::writes`).
    pub fn add_writing(&mut self, name: &'static str, writes: &'static [&'static str], f: LowerFn) {
        self.insert(name, Lowering { f, specialize_floats: false, size: None, writes });
    }

    pub fn get(&self, base: &str) -> Option<&Lowering> {
        self.map.get(base)
    }

    pub fn names(&self) -> Vec<&'static str> {
        let mut v: Vec<_> = self.map.keys().copied().collect();
        v.sort();
        v
    }
}

/// Every lowering, registered once.
pub fn registry() -> &'static Registry {
    static REG: OnceLock<Registry> = OnceLock::new();
    REG.get_or_init(|| {
        let mut r = Registry { map: HashMap::new() };
        graph::register(&mut r);
        ops::activations::register(&mut r);
        ops::asserts::register(&mut r);
        ops::attention::register(&mut r);
        ops::complex::register(&mut r);
        ops::conv::register(&mut r);
        ops::distance::register(&mut r);
        ops::elementwise::register(&mut r);
        ops::embedding::register(&mut r);
        ops::factories::register(&mut r);
        ops::fft::register(&mut r);
        ops::grouped_mm::register(&mut r);
        ops::histogram::register(&mut r);
        ops::indexing::register(&mut r);
        ops::linalg::cholesky::register(&mut r);
        ops::linalg::eigen::jacobi::register(&mut r);
        ops::linalg::eigen::register(&mut r);
        ops::linalg::ldl::register(&mut r);
        ops::linalg::lstsq::register(&mut r);
        ops::linalg::lu::register(&mut r);
        ops::linalg::matrix_exp::register(&mut r);
        ops::linalg::products::register(&mut r);
        ops::linalg::qr::register(&mut r);
        ops::linalg::register(&mut r);
        ops::losses::ctc::register(&mut r);
        ops::losses::margin::register(&mut r);
        ops::losses::nll::register(&mut r);
        ops::losses::pointwise::register(&mut r);
        ops::nonzero_unique::register(&mut r);
        ops::normalization::register(&mut r);
        ops::optim::register(&mut r);
        ops::order_stats::register(&mut r);
        ops::random::register(&mut r);
        ops::recurrent::register(&mut r);
        ops::reductions::register(&mut r);
        ops::search::register(&mut r);
        ops::shape_ops::register(&mut r);
        ops::softmax::register(&mut r);
        ops::spatial::fold::register(&mut r);
        ops::spatial::grid_sample::register(&mut r);
        ops::spatial::pad::register(&mut r);
        ops::spatial::pool::register(&mut r);
        ops::spatial::upsample::register(&mut r);
        ops::special::bessel::register(&mut r);
        ops::special::gamma::register(&mut r);
        ops::special::logit::register(&mut r);
        ops::special::math::register(&mut r);
        ops::special::ndtr::register(&mut r);
        ops::special::polynomials::register(&mut r);
        ops::transformer_fastpath::register(&mut r);
        ops::views::register(&mut r);
        r
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
