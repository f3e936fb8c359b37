//! Contractions: one dot_general summed in float32 for 16-bit floats, at the float32 matmul
//! precision for float32 (`contract`, `acc_dtype`). On the CPU plugin, float32 matrix products
//! are calls into PyTorch's CPU matmul instead (`set_host_matmul`).
use crate::cx::Cx;
use crate::blocks::precision;
use crate::dtype::DType;
use stablehlo::{TensorType, Value};
use std::sync::atomic::{AtomicBool, Ordering};

/// One contraction of `a` and `b` (same dtype), summed in `acc_dtype`. Result dims: batch,
/// then a's free dims, then b's free dims.
pub(crate) fn contract(cx: &mut Cx, a: Value, b: Value, batch: (&[i64], &[i64]), contracting: (&[i64], &[i64])) -> Value {
    let d = cx.dtype(a);
    let acc = d.opmath();
    precision::set_for(cx, d);
    // At "highest" only: the other settings' programs keep their precision_config.
    if d == DType::F32 && precision::float32_matmul() == 0 && HOST_MATMUL.load(Ordering::Relaxed) {
        if let Some(r) = host_matmul(cx, a, b, batch, contracting) {
            return r;
        }
    }
    cx.dot_general(a, b, batch.0, batch.1, contracting.0, contracting.1, acc.elem())
}

/// The custom-call target of PyTorch's CPU matmul (its handler: the torchtpu crate's
/// host_matmul.rs, registered by the engine).
pub const HOST_MATMUL_TARGET: &str = "torchtpu.host_matmul";

static HOST_MATMUL: AtomicBool = AtomicBool::new(false);

/// Whether float32 products are `HOST_MATMUL_TARGET` calls (set once by the engine: on the
/// CPU plugin, where the handler registered). XLA:CPU's own products (Eigen's, XNNPACK's)
/// trail PyTorch's MKL/OpenBLAS kernel, most on a transposed operand (weight gradients).
pub fn set_host_matmul(on: bool) {
    HOST_MATMUL.store(on, Ordering::Relaxed);
}

/// Products smaller than this (multiply-adds) stay XLA's: a call costs more there (an eager
/// [96, 96] @ [96, 96] took 104 us as a call, 74 us as XLA's loop; even at [128, 128]).
const HOST_MATMUL_MIN: i64 = 1 << 21;

/// The dims of a rank-`rank` operand that are neither batch nor contracted, in order.
fn free_dims(rank: i64, batch: &[i64], contracting: &[i64]) -> Vec<i64> {
    (0..rank).filter(|d| !batch.contains(d) && !contracting.contains(d)).collect()
}

/// How an operand holds its matrices: leading batch dims, then its free and contracted dims,
/// each group consecutive (a row-major [batch, rows, cols] matrix or its transpose).
/// `free_first`: the free dims come first. None for any other arrangement.
fn matrix_layout(dims: &[i64], batch: &[i64], contracting: &[i64]) -> Option<(i64, i64, bool)> {
    let nb = batch.len() as i64;
    let consecutive = |ds: &[i64], from: i64| ds.iter().enumerate().all(|(i, &d)| d == from + i as i64);
    if !consecutive(batch, 0) || contracting.is_empty() {
        return None;
    }
    let nc = contracting.len() as i64;
    let rank = dims.len() as i64;
    let free_first = if consecutive(contracting, rank - nc) {
        true
    } else if consecutive(contracting, nb) {
        false
    } else {
        return None;
    };
    let k: i64 = contracting.iter().map(|&c| dims[c as usize]).product();
    let free: i64 = (nb..rank).filter(|d| !contracting.contains(d)).map(|d| dims[d as usize]).product();
    Some((free, k, free_first))
}

/// `v` as the product reads it: through transposes (a chain of them composed) to the first
/// operand whose layout `matrix_layout` takes, the earliest tried first (no transpose then need
/// be materialized for the product).
fn as_stored(cx: &Cx, v: Value, batch: &[i64], contracting: &[i64]) -> Option<(Value, i64, i64, bool)> {
    let rank = cx.dims(v).len() as i64;
    let free = free_dims(rank, batch, contracting);
    // Each candidate: a value and, for each of v's dims, the dim of that value it is.
    let mut chain = vec![(v, (0..rank).collect::<Vec<i64>>())];
    while let Some((src, perm)) = cx.b.transpose_of(chain.last().unwrap().0) {
        let through: Vec<i64> = chain.last().unwrap().1.iter().map(|&d| perm[d as usize]).collect();
        chain.push((src, through));
    }
    chain.iter().rev().find_map(|(src, at)| {
        let map = |ds: &[i64]| -> Vec<i64> { ds.iter().map(|&d| at[d as usize]).collect() };
        // The free dims must keep their order (their flattening is the result's).
        let in_order = map(&free).windows(2).all(|w| w[0] < w[1]);
        let (f, k, free_first) = matrix_layout(cx.dims(*src).as_slice(), &map(batch), &map(contracting))?;
        in_order.then_some((*src, f, k, free_first))
    })
}

/// `a` x `b` as one `HOST_MATMUL_TARGET` call, where both hold plain matrices (see
/// `matrix_layout`) and the product is large enough; else None.
fn host_matmul(cx: &mut Cx, a: Value, b: Value, batch: (&[i64], &[i64]), contracting: (&[i64], &[i64])) -> Option<Value> {
    let (sa, m, k, a_free_first) = as_stored(cx, a, batch.0, contracting.0)?;
    let (sb, n, kb, b_free_first) = as_stored(cx, b, batch.1, contracting.1)?;
    let a_dims = cx.dims(a);
    let count: i64 = batch.0.iter().map(|&d| a_dims[d as usize]).product();
    if k != kb || count * m * n * k < HOST_MATMUL_MIN || count * m * n == 0 {
        return None;
    }
    // dot_general's result dims: the batch dims, a's free dims, b's free dims.
    let b_dims = cx.dims(b);
    let a_free = free_dims(a_dims.len() as i64, batch.0, contracting.0);
    let b_free = free_dims(b_dims.len() as i64, batch.1, contracting.1);
    let out: Vec<i64> = batch.0.iter().chain(&a_free).map(|&d| a_dims[d as usize])
        .chain(b_free.iter().map(|&d| b_dims[d as usize]))
        .collect();
    let attrs = format!(
        "call_target_name = \"{HOST_MATMUL_TARGET}\", api_version = 4 : i32, backend_config = {{batch = {count} : i64, \
         k = {k} : i64, m = {m} : i64, n = {n} : i64, trans_a = {} : i64, trans_b = {} : i64}}",
        !a_free_first as i64,
        b_free_first as i64
    );
    let ty = TensorType::new(stablehlo::ElemType::F32, &out);
    Some(cx.custom_op("stablehlo.custom_call", &[sa, sb], &attrs, &[ty])[0])
}
