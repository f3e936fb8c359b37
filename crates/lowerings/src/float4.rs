//! Which ops take float4_e2m1fn_x2 tensors (two float4 e2m1 values per byte): those that move
//! or compare their bytes as they are (declared with `Op::float4`), as PyTorch's CPU kernels
//! do, and the scaled matrix products, which decode them. The rest raise PyTorch's
//! NotImplementedError before lowering: on bytes, their arithmetic would give wrong numbers
//! silently.
use crate::args::{Arg, Args};
use crate::bail;
use crate::decl::Op;
use crate::dtype::DType;
use crate::error::Result;

const NAME: &str = "Float4_e2m1fn_x2";

/// Refuses a call with float4 tensors (or a float4 dtype argument) to an op that does not take
/// them, and one mixing float4 with another floating-point or byte dtype (PyTorch defines no
/// promotion for it).
pub fn check(decl: &Op, args: &Args) -> Result<()> {
    let mut dtypes = Vec::new();
    for a in args.values {
        collect(a, &mut dtypes);
    }
    if !dtypes.contains(&DType::F4E2M1FNX2) {
        return Ok(());
    }
    if !decl.float4 {
        bail!(NotImplemented, "\"{}\" not implemented for '{NAME}'", args.op);
    }
    // Index tensors (integers) and masks (bool) go with float4 data; other data does not
    // (where the op does not check its own pairs: `Op::float4_mixes`).
    if decl.float4_mixes {
        return Ok(());
    }
    if let Some(other) = dtypes.iter().find(|&&d| d != DType::F4E2M1FNX2 && (d.is_float() || d.is_complex() || d == DType::U8)) {
        bail!(Runtime, "Promotion for Float4 types is not supported, attempted to promote {NAME} and {}", other.torch_name());
    }
    Ok(())
}

/// Refuses a conversion between float4 and another dtype (`kernel`: the name PyTorch's CPU
/// kernel gives it in the message).
pub fn check_same(kernel: &str, from: DType, to: DType) -> Result<()> {
    if from != to && (from == DType::F4E2M1FNX2 || to == DType::F4E2M1FNX2) {
        bail!(NotImplemented, "\"{kernel}\" not implemented for '{NAME}'");
    }
    Ok(())
}

fn collect(a: &Arg, dtypes: &mut Vec<DType>) {
    match a {
        Arg::Tensor(t) => dtypes.push(t.dtype),
        Arg::DType(d) => dtypes.push(*d),
        Arg::List(items) => items.iter().for_each(|i| collect(i, dtypes)),
        _ => {}
    }
}
