//! Programs reused across sizes ("bucketed programs"): a pointwise op (declared `.pointwise()`)
//! or one whose lowering handles padded inputs (`.bucketed()`: cat, isin, attention, index,
//! gather, scatter) that meets
//! a new shape once its family has compiled `EXACT_SHAPES_FIRST` shapes runs one program per
//! *bucket* of sizes instead of one per size. Its inputs are gathered, through their views'
//! sizes, strides and offsets given as a runtime vector (the "geometry"), into values padded
//! to the bucket; the op's own lowering runs on the padded values; each result
//! is written back in PyTorch's contiguous order into a flat buffer that holds the bucket (the
//! cell's buffer is then larger than its storage, which every reader of a cell allows).
//!
//! Exactness: the padding lanes read clamped indices, so they hold values of the tensor itself
//! (never garbage, and no lane can fail where a real element would not), and only the real
//! elements reach the result; the exact shapes' lowering runs first (without compiling) for
//! PyTorch's errors and the result shapes. Writes (in-place ops) scatter the real lanes only.
//! Index checks compare with the real sizes; their failure ids (the exact shapes' messages,
//! "... with size 5") are runtime values at the end of the geometry.
//!
//! Geometry layout: for each device tensor argument in visiting order (arguments in order,
//! list items in order), `[offset, sizes.., strides..]`; then for each new result its sizes;
//! then the failure id of each check member.
use abi::{TtArg, TtTensor, TT_TENSOR, TT_TENSOR_LIST};
use lowerings::Cx;
use stablehlo::{ElemType, GatherDims, TensorType, Value};

/// Distinct shapes of one family (op, argument kinds, dtypes and ranks) compiled exactly
/// before bucketed programs serve it: code with few shapes keeps its dense programs; a size
/// that keeps changing (a growing KV cache, a serving step's token count) stops compiling.
pub const EXACT_SHAPES_FIRST: u32 = 2;

/// The largest bucket (elements of one padded value) served; larger tensors compile exactly,
/// where a gather's cost would show.
pub const MAX_ELEMENTS: i64 = 1 << 22;

/// Calls of one exact shape a bucketed program serves before that shape compiles its own
/// program: a shape that keeps coming back (a training step's) stops paying for the gathers,
/// one that passes (a decoding step's, in one `generate` call) never compiles. (At 1000, the
/// tiny-Llama training step ran at 0.48x torch CPU for its first hundred steps, against 0.88x
/// with exact programs.)
pub const PROMOTE_AFTER: u32 = 8;

/// Calls a bucketed program still serves a promoted shape while the shape's own program
/// compiles on a worker thread; the next call waits for it if it is not done. (Promoting at
/// once stalled the fifth HF `generate` call of a tiny Llama for 9.5 s: its 48 decode shapes
/// crossed PROMOTE_AFTER together.)
pub const PROMOTE_CALLS: u32 = 16;

/// In fused eager mode a shape is promoted by graphs rather than calls: its own program
/// compiles when it is in its PROMOTE_GRAPHS-th graph in a row and takes over in the next one,
/// so a repeating graph settles on exact programs before it is fused (the gathers would stay
/// in the fused program). A promoted program stores its results as the bucketed one did
/// (pad_flat), so the next op's key and count stay: a chain of ops settles together. Graphs
/// count as in a row when at most RECENT_GRAPHS apart: a step cut into a few graphs still
/// counts each step, while a decoding step's shapes, met again only in the next `generate`
/// call, never count twice.
pub const PROMOTE_GRAPHS: u32 = 2;
pub const RECENT_GRAPHS: u64 = 8;

/// Whether bucketed programs are on without TORCHTPU_BUCKET_PROGRAMS set.
const ON_BY_DEFAULT: bool = true;

/// Whether bucketed programs are on (TORCHTPU_BUCKET_PROGRAMS=1 or 0 turns them on or off).
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TORCHTPU_BUCKET_PROGRAMS").map_or(ON_BY_DEFAULT, |v| v.trim() != "0"))
}

thread_local! {
    /// Scopes open on this thread (`enter_scope`).
    static SCOPES: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Until the matching `exit_scope`, this thread's servable calls take their bucket's program
/// at once, whether bucketed programs are on or not: no exact shapes first, no promotion. For
/// code whose sizes change at every call by design (a serving runner's input preparation,
/// sized by each step's token and request counts): its programs then come one per bucket.
pub fn enter_scope() {
    SCOPES.with(|n| n.set(n.get() + 1));
}

pub fn exit_scope() {
    SCOPES.with(|n| n.set(n.get().saturating_sub(1)));
}

/// Whether a scope is open on this thread.
pub fn scoped() -> bool {
    SCOPES.with(|n| n.get() > 0)
}

/// A size's bucket: 0 and 1 stay (a size-1 dim broadcasts), others round up to a power of two.
pub fn bucket(n: i64) -> i64 {
    if n <= 1 {
        n
    } else {
        1i64 << (64 - (n - 1).leading_zeros())
    }
}

pub fn padded(sizes: &[i64]) -> Vec<i64> {
    sizes.iter().map(|&n| bucket(n)).collect()
}

/// Calls a bucketed program can serve: device tensors that are non-empty, in their storage's
/// dtype, padded to at most MAX_ELEMENTS, and written ones without repeated elements (lists of
/// them are read only); CPU tensors only as 0-d values.
pub fn servable(args: &[TtArg], base_dtype: impl Fn(&TtTensor) -> Option<i8>, written: &[usize]) -> bool {
    let device_tensor = |t: &TtTensor| {
        let sizes = t.sizes();
        !t.is_host() && !sizes.contains(&0) && padded(sizes).iter().product::<i64>() <= MAX_ELEMENTS && base_dtype(t) == Some(t.dtype)
    };
    let mut any = false;
    for (i, a) in args.iter().enumerate() {
        match a.kind {
            TT_TENSOR_LIST => {
                let items = a.list::<TtArg>();
                if written.contains(&i) || items.is_empty() || !items.iter().all(|x| x.kind == TT_TENSOR && device_tensor(x.tensor())) {
                    return false;
                }
                any = true;
            }
            TT_TENSOR => {
                let t = a.tensor();
                if t.is_host() && t.ndim == 0 {
                    continue;
                }
                if !device_tensor(t) {
                    return false;
                }
                if written.contains(&i) && t.strides().iter().zip(t.sizes()).any(|(&s, &n)| s == 0 && n > 1) {
                    return false;
                }
                any = true;
            }
            _ => {}
        }
    }
    any
}

/// The key words of a device tensor in a bucketed program: dtype, rank, then (unless only the
/// family is keyed) per dim its bucket; sizes, strides and offset are runtime values.
pub fn key_tensor(key: &mut Vec<u64>, t: &TtTensor, family: bool) {
    key.push(t.dtype as u8 as u64 | (t.flags as u64) << 8);
    key.push(t.ndim as u64);
    if !family {
        key.extend(t.sizes().iter().map(|&n| bucket(n) as u64));
    }
}

/// A bucketable call's size class: the most elements of any of its device tensors and results,
/// each with its sizes rounded up to their buckets. Its exact and its bucketed program compile
/// at the tier this and their float intermediates pick (runtime::Tiering::Class), so a call
/// gets the same bits whichever program serves it (the quick tier's unoptimized code rounds
/// some functions differently).
pub fn size_class<'a>(args: &[TtArg], results: impl Iterator<Item = &'a [i64]>) -> i64 {
    let elements = |sizes: &[i64]| padded(sizes).iter().product::<i64>();
    let mut most = results.map(elements).max().unwrap_or(0);
    for a in args {
        match a.kind {
            TT_TENSOR if !a.tensor().is_host() => most = most.max(elements(a.tensor().sizes())),
            TT_TENSOR_LIST => {
                for x in a.list::<TtArg>().iter().filter(|x| x.kind == TT_TENSOR && !x.tensor().is_host()) {
                    most = most.max(elements(x.tensor().sizes()));
                }
            }
            _ => {}
        }
    }
    most
}

/// The input part of the geometry vector (see the module comment).
pub fn input_geometry(args: &[TtArg], out: &mut Vec<i64>) {
    for a in args {
        match a.kind {
            TT_TENSOR => tensor_geometry(a.tensor(), out),
            TT_TENSOR_LIST => a.list::<TtArg>().iter().filter(|x| x.kind == TT_TENSOR).for_each(|x| tensor_geometry(x.tensor(), out)),
            _ => {}
        }
    }
}

fn tensor_geometry(t: &TtTensor, out: &mut Vec<i64>) {
    if t.is_host() {
        return;
    }
    out.push(t.offset);
    out.extend_from_slice(t.sizes());
    out.extend_from_slice(t.strides());
}

/// The real sizes of the view whose geometry is at `at`, as 0-d int64 values.
pub fn real_sizes(cx: &mut Cx, geo: Value, at: usize, rank: usize) -> Vec<Value> {
    (0..rank).map(|d| entry(cx, geo, at + 1 + d)).collect()
}

/// geometry[i] as a 0-d i64 value.
fn entry(cx: &mut Cx, geo: Value, i: usize) -> Value {
    let one = cx.slice(geo, &[i as i64], &[i as i64 + 1], &[1]);
    cx.reshape(one, &[])
}

fn splat(cx: &mut Cx, scalar: Value, dims: &[i64]) -> Value {
    cx.broadcast_in_dim(scalar, dims, &[])
}

/// The flat storage index of each lane of a view padded to `dims` (geometry at `at`), each
/// lane's index clamped into the view; with `valid`, also whether the lane is a real element.
fn lane_indices(cx: &mut Cx, geo: Value, at: usize, dims: &[i64], valid: bool) -> (Value, Option<Value>) {
    let rank = dims.len();
    let ty = TensorType { elem: ElemType::I64, dims: dims.to_vec() };
    let offset = entry(cx, geo, at);
    let mut idx = splat(cx, offset, dims);
    let mut ok: Option<Value> = None;
    for d in 0..rank {
        if dims[d] == 1 {
            continue; // a size-1 dim: lane 0 only
        }
        let size = entry(cx, geo, at + 1 + d);
        let stride = entry(cx, geo, at + 1 + rank + d);
        let i = cx.iota(&ty, d as i64);
        let size = splat(cx, size, dims);
        if valid {
            let inside = cx.compare(stablehlo::CmpDir::Lt, i, size);
            ok = Some(match ok {
                None => inside,
                Some(prev) => cx.b.and(prev, inside),
            });
        }
        let one = cx.full(1.0, lowerings::DType::I64, dims);
        let last = cx.sub(size, one);
        let i = cx.min(i, last);
        let stride = splat(cx, stride, dims);
        let term = cx.mul(i, stride);
        idx = cx.add(idx, term);
    }
    (idx, ok)
}

fn gather_dims(rank: usize) -> GatherDims {
    GatherDims {
        offset_dims: vec![],
        collapsed_slice_dims: vec![0],
        operand_batching_dims: vec![],
        start_indices_batching_dims: vec![],
        start_index_map: vec![0],
        index_vector_dim: rank as i64,
    }
}

/// The view whose geometry is at `at` of `base` (any dims), padded to `dims`.
pub fn read(cx: &mut Cx, base: Value, geo: Value, at: usize, dims: &[i64]) -> Value {
    let n = cx.numel(base);
    let flat = cx.reshape(base, &[n]);
    let (idx, _) = lane_indices(cx, geo, at, dims, false);
    let mut idims = dims.to_vec();
    idims.push(1);
    let idx = cx.reshape(idx, &idims);
    cx.gather(flat, idx, &gather_dims(dims.len()), &[1], false)
}

/// `base` with the view at `at` replaced by the real lanes of `value` (padded to `dims`).
pub fn write(cx: &mut Cx, base: Value, geo: Value, at: usize, dims: &[i64], value: Value) -> Value {
    let base_dims = cx.dims(base);
    let n = cx.numel(base);
    let (idx, ok) = lane_indices(cx, geo, at, dims, true);
    // Padding lanes go to one extra element past the storage, dropped after the scatter.
    let idx = match ok {
        Some(ok) => {
            let spill = cx.full(n as f64, lowerings::DType::I64, dims);
            cx.select(ok, idx, spill)
        }
        None => idx,
    };
    let flat = cx.reshape(base, &[n]);
    let dtype = cx.dtype(base);
    let extra = cx.full(0.0, dtype, &[1]);
    let flat = cx.concatenate(&[flat, extra], 0);
    let written = crate::view::scatter_flat(cx, flat, idx, value);
    let kept = cx.slice(written, &[0], &[n], &[1]);
    cx.reshape(kept, &base_dims)
}

/// The elements of a bucketed result's buffer: its element count's bucket, so that a buffer holds
/// less than twice its tensor.
pub fn capacity(sizes: &[i64]) -> i64 {
    bucket(sizes.iter().product())
}

/// A result padded to `dims` as a flat contiguous buffer of `cap` elements: element j holds
/// the result's j-th element in row-major order of its real sizes (geometry at `at`); the
/// tail past the real count holds copies of real elements.
pub fn flatten(cx: &mut Cx, v: Value, geo: Value, at: usize, dims: &[i64], cap: i64) -> Value {
    let flat = cx.reshape(v, &[dims.iter().product()]);
    if cap == 0 {
        return flat;
    }
    let ty = TensorType { elem: ElemType::I64, dims: vec![cap] };
    let mut rest = cx.iota(&ty, 0);
    let mut pos: Option<Value> = None;
    let mut padded_stride = 1i64;
    for d in (0..dims.len()).rev() {
        if dims[d] == 1 {
            continue;
        }
        let size = entry(cx, geo, at + d);
        let size = splat(cx, size, &[cap]);
        let i = if d == dims.iter().position(|&n| n != 1).unwrap() {
            // The outermost non-trivial dim takes what is left, clamped to its last index.
            let one = cx.full(1.0, lowerings::DType::I64, &[cap]);
            let last = cx.sub(size, one);
            cx.min(rest, last)
        } else {
            let i = cx.rem(rest, size);
            rest = cx.div(rest, size);
            i
        };
        let s = cx.full(padded_stride as f64, lowerings::DType::I64, &[cap]);
        let term = cx.mul(i, s);
        pos = Some(match pos {
            None => term,
            Some(p) => cx.add(p, term),
        });
        padded_stride *= dims[d];
    }
    let Some(pos) = pos else { return flat };
    let pos = cx.reshape(pos, &[cap, 1]);
    cx.gather(flat, pos, &gather_dims(1), &[1], false)
}

/// A result as a flat buffer of `cap` elements: its elements in row-major order, then zeros
/// (how an exact program stores a shape a bucketed program served: bucketed programs read
/// real lanes only, exact ones their view of the buffer).
pub fn pad_flat(cx: &mut Cx, v: Value, cap: i64) -> Value {
    let n = cx.numel(v);
    let flat = cx.reshape(v, &[n]);
    if cap <= n {
        return flat;
    }
    let dtype = cx.dtype(v);
    let zeros = cx.full(0.0, dtype, &[cap - n]);
    cx.concatenate(&[flat, zeros], 0)
}

#[cfg(test)]
mod tests {
    use super::bucket;

    #[test]
    fn buckets_are_powers_of_two_and_keep_zero_and_one() {
        let got: Vec<i64> = [0, 1, 2, 3, 4, 5, 8, 9, 1000].iter().map(|&n| bucket(n)).collect();
        assert_eq!(got, vec![0, 1, 2, 4, 4, 8, 8, 16, 1024]);
    }
}
