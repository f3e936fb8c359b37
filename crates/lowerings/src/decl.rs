//! The declaration of a lowering: everything the engine, the C++ shim and the graph path know
//! about an op, written once in the op's family file (its `OPS` table), next to its function:
//!
//! ```ignore
//! pub(crate) const OPS: &[Op] = &[
//!     op("lerp", lerp),
//!     op("range", range).specialized().routed(&["range.out_"]),
//!     ops(FOREACH, foreach).list_op(),
//! ];
//! ```
use crate::LowerFn;

/// The aten ops one declaration serves, by base name (`add` serves `add`, `add_`, `add.out`).
#[derive(Copy, Clone)]
pub enum Names {
    One(&'static str),
    Many(&'static [&'static str]),
}

impl Names {
    pub fn iter(&self) -> impl Iterator<Item = &'static str> {
        let (one, many): (Option<&'static str>, &'static [&'static str]) = match *self {
            Names::One(n) => (Some(n), &[]),
            Names::Many(ns) => (None, ns),
        };
        one.into_iter().chain(many.iter().copied())
    }
}

/// One lowering and how the engine and the shim treat its ops.
#[derive(Copy, Clone)]
pub struct Op {
    pub names: Names,
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
    /// Overloads ("name" or "name.overload") whose own PyTorch kernels (composites) would
    /// shadow the boxed fallback on "tpu": the shim registers the fallback for them explicitly.
    pub routed: &'static [&'static str],
    /// A list op (`_foreach_*`): every overload runs as one program over the whole list
    /// instead of PyTorch's loop of one op per tensor.
    pub list_op: bool,
    /// The op takes CPU tensors with more than one element next to tpu ones (copies, index
    /// tensors); other ops raise PyTorch's "Expected all tensors to be on the same device".
    pub host_tensors: bool,
    /// Structured overloads whose generated composite (allocate, call out=) must stay: their
    /// output shape depends on data the composite's meta function computes.
    pub keep_composite: &'static [&'static str],
    /// Each output element depends only on the input elements at its own (broadcast) index,
    /// and the result's shape is the inputs' broadcast shape: the engine may then run the op
    /// on inputs padded to bucketed sizes and keep the prefix (see the engine's buckets.rs).
    pub pointwise: bool,
    /// The lowering runs on inputs padded to bucketed sizes itself, reading their real sizes
    /// from `Cx::padded` (cat, attention): the engine may serve it like a pointwise op.
    pub bucketed: bool,
    /// With `bucketed`: only inside a bucketed-programs scope (`torch.tpu.bucketed_programs()`).
    /// For indexing, whose results feed matmuls: outside a scope, a result laid out as a
    /// bucket's (once a family has met two shapes) would give the next matmul a new program.
    pub bucketed_in_scopes_only: bool,
    /// The op takes float4_e2m1fn_x2 tensors: it moves or compares their bytes as they are
    /// (copies, cat, indexing, eq), as PyTorch's CPU kernels do; other ops refuse them
    /// (`float4::check`).
    pub float4: bool,
    /// With `float4`: it pairs float4 tensors with other dtypes under checks of its own (copies
    /// refuse conversions; scaled products take float8 scales), so `float4::check` leaves
    /// mixing to it.
    pub float4_mixes: bool,
}

/// Declares the lowering `f` of the op `name`.
pub const fn op(name: &'static str, f: LowerFn) -> Op {
    ops_named(Names::One(name), f)
}

/// Declares one lowering `f` for several ops.
pub const fn ops(names: &'static [&'static str], f: LowerFn) -> Op {
    ops_named(Names::Many(names), f)
}

const fn ops_named(names: Names, f: LowerFn) -> Op {
    Op {
        names,
        f,
        specialize_floats: false,
        size: None,
        writes: &[],
        routed: &[],
        list_op: false,
        host_tensors: false,
        keep_composite: &[],
        pointwise: false,
        bucketed: false,
        bucketed_in_scopes_only: false,
        float4: false,
        float4_mixes: false,
    }
}

impl Op {
    /// See `Op::specialize_floats`.
    pub const fn specialized(self) -> Op {
        Op { specialize_floats: true, ..self }
    }

    /// See `Op::size`.
    pub const fn sized(self, size: LowerFn) -> Op {
        Op { size: Some(size), ..self }
    }

    /// See `Op::writes`.
    pub const fn writes(self, args: &'static [&'static str]) -> Op {
        Op { writes: args, ..self }
    }

    /// See `Op::routed`.
    pub const fn routed(self, overloads: &'static [&'static str]) -> Op {
        Op { routed: overloads, ..self }
    }

    /// See `Op::list_op`.
    pub const fn list_op(self) -> Op {
        Op { list_op: true, ..self }
    }

    /// See `Op::host_tensors`.
    pub const fn host_tensors(self) -> Op {
        Op { host_tensors: true, ..self }
    }

    /// See `Op::pointwise`.
    pub const fn pointwise(self) -> Op {
        Op { pointwise: true, ..self }
    }

    /// See `Op::bucketed`.
    pub const fn bucketed(self) -> Op {
        Op { bucketed: true, ..self }
    }

    /// See `Op::bucketed_in_scopes_only`.
    pub const fn bucketed_in_scopes(self) -> Op {
        Op { bucketed: true, bucketed_in_scopes_only: true, ..self }
    }

    /// See `Op::float4`.
    pub const fn float4(self) -> Op {
        Op { float4: true, ..self }
    }

    /// See `Op::float4_mixes`.
    pub const fn float4_mixes(self) -> Op {
        Op { float4: true, float4_mixes: true, ..self }
    }

    /// See `Op::keep_composite`.
    pub const fn keep_composite(self, overloads: &'static [&'static str]) -> Op {
        Op { keep_composite: overloads, ..self }
    }
}
