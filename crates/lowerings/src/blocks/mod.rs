//! Building blocks shared by the op families: block scales, reductions, contractions, gathers
//! and scatters, constants, the operands of promoting ops, 16-bit rounding, loop pieces, NaN
//! handling, generator draws and the dtype names of messages. Nothing here registers a lowering.
pub(crate) mod block_scales;
pub(crate) mod consts;
pub(crate) mod contract;
pub(crate) mod gather;
pub(crate) mod loops;
pub(crate) mod nan;
pub(crate) mod operands;
pub(crate) mod precision;
pub(crate) mod reduce;
pub(crate) mod rng;
pub(crate) mod round16;
pub(crate) mod type_names;
