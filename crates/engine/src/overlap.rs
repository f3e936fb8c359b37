//! Writes whose memory aliases itself or the call's inputs, refused as PyTorch's CPU kernels
//! refuse them (`assert_no_internal_overlap` and `assert_no_partial_overlap` in ATen's
//! MemoryOverlap.cpp). A program computes a written value whole and then stores it, so a write
//! through aliased elements would store one copy's value where CPU's loops update the element
//! once per copy. Where PyTorch cannot tell (an unfold, "too hard"), CPU runs its loops over
//! the aliased memory; here such a write is refused with the same error rather than give
//! another answer. PyTorch only warns for index_fill_, masked_fill_ and index_put_ on expanded
//! tensors (deprecated); these are refused too.
use abi::{TtArg, TtTensor, TT_TENSOR, TT_TENSOR_LIST};
use lowerings::DType;

use crate::error::Error;

/// Ops that give every copy of an element the same value, so a write through aliased elements
/// stores what CPU stores (fills, and threshold_, a function of the element alone).
const REPEATS_ALLOWED: &[&str] = &["fill", "zero", "threshold"];

/// Ops whose CPU kernels refuse an out= that shares any memory with an input, all of it too
/// (`assert_no_overlap`): an output element is not a function of the input element it replaces.
const ANY_OVERLAP_REFUSED: &[&str] = &["cat", "gather", "index_select", "masked_select", "take", "kthvalue"];

/// Ops whose CPU kernels do not check their out= against their inputs (products).
const PARTIAL_OVERLAP_ALLOWED: &[&str] = &["mm", "addmm", "bmm", "baddbmm", "addmv", "mv", "addr", "addbmm", "dot", "vdot"];

const INTERNAL: &str = "unsupported operation: more than one element of the written-to tensor refers to a single memory location. Please clone() the tensor before performing the operation.";
const PARTIAL: &str = "unsupported operation: some elements of the input tensor and the written-to tensor refer to a single memory location. Please clone() the tensor before performing the operation.";

/// Refuses the call when a written tensor reaches one element of memory twice, or
/// shares part (not all) of its memory with a tensor the call reads.
pub fn check(base: &str, args: &[TtArg], written: &[usize]) -> Result<(), Error> {
    for &w in written {
        for t in tensors(&args[w]) {
            if !REPEATS_ALLOWED.contains(&base) && aliases_elements(t) {
                return Err(Error::runtime(INTERNAL));
            }
            if PARTIAL_OVERLAP_ALLOWED.contains(&base) {
                continue;
            }
            let shared = if ANY_OVERLAP_REFUSED.contains(&base) { any_shared } else { partly_shared };
            let read = args.iter().enumerate().filter(|(i, _)| *i != w).flat_map(|(_, a)| tensors(a));
            if read.into_iter().any(|r| shared(t, r)) {
                return Err(Error::runtime(PARTIAL));
            }
        }
    }
    Ok(())
}

/// The device tensors of an argument (a tensor, or a list's tensors).
fn tensors(a: &TtArg) -> Vec<&TtTensor> {
    let device = |t: &&TtTensor| !t.is_host();
    match a.kind {
        TT_TENSOR => Some(a.tensor()).into_iter().filter(device).collect(),
        TT_TENSOR_LIST => a.list::<TtArg>().iter().filter(|x| x.kind == TT_TENSOR).map(|x| x.tensor()).filter(device).collect(),
        _ => Vec::new(),
    }
}

/// Whether two elements of the view may be one element of memory: a dim of stride 0 and more
/// than one element (PyTorch's "MemOverlap::Yes"), or, dims sorted by stride, a stride that does
/// not pass over all the elements of the smaller dims (an unfold's windows).
fn aliases_elements(t: &TtTensor) -> bool {
    let mut dims: Vec<(i64, i64)> = t.sizes().iter().copied().zip(t.strides().iter().map(|s| s.abs())).filter(|&(n, _)| n != 1).collect();
    if numel(t) <= 1 {
        return false;
    }
    dims.sort_by_key(|&(_, s)| s);
    let mut span = 0;
    for (n, s) in dims {
        if s <= span {
            return true;
        }
        span += (n - 1) * s;
    }
    false
}

/// PyTorch's "MemOverlapStatus::Partial" between two dense tensors of one storage: their byte
/// ranges intersect, and they are not the same range read with the same strides.
fn partly_shared(a: &TtTensor, b: &TtTensor) -> bool {
    match byte_ranges(a, b) {
        Some((ra, rb)) if ra == rb => a.strides() != b.strides(),
        Some(((a0, a1), (b0, b1))) => a0 < b1 && b0 < a1,
        None => false,
    }
}

/// PyTorch's "Partial" or "Full" between two dense tensors of one storage.
fn any_shared(a: &TtTensor, b: &TtTensor) -> bool {
    byte_ranges(a, b).is_some_and(|((a0, a1), (b0, b1))| a0 < b1 && b0 < a1)
}

/// The byte ranges of two non-empty dense tensors of one storage (None: PyTorch's
/// "No" or "TooHard", which it does not refuse).
fn byte_ranges(a: &TtTensor, b: &TtTensor) -> Option<((i64, i64), (i64, i64))> {
    if a.cell != b.cell || numel(a) == 0 || numel(b) == 0 || !non_overlapping_and_dense(a) || !non_overlapping_and_dense(b) {
        return None;
    }
    let range = |t: &TtTensor| {
        let size = DType::from_code(t.dtype).map_or(1, DType::size) as i64;
        (t.offset * size, (t.offset + numel(t)) * size)
    };
    Some((range(a), range(b)))
}

fn numel(t: &TtTensor) -> i64 {
    t.sizes().iter().product()
}

/// Whether the elements fill a range of memory exactly once in some order of the dims (PyTorch's
/// `is_non_overlapping_and_dense`).
fn non_overlapping_and_dense(t: &TtTensor) -> bool {
    let mut dims: Vec<(i64, i64)> = t.sizes().iter().copied().zip(t.strides().iter().copied()).filter(|&(n, _)| n != 1).collect();
    dims.sort_by_key(|&(_, s)| s);
    let mut expected = 1;
    for (n, s) in dims {
        if s != expected {
            return false;
        }
        expected *= n;
    }
    true
}
