//! The CPU plugin's matrix products as calls into PyTorch's CPU kernel: the handler of the
//! `torchtpu.host_matmul` custom call (lowerings: blocks/contract.rs) that the engine registers
//! with XLA:CPU. Its attributes give the product's shape: `batch` products of [m, k] @ [k, n],
//! `trans_a` / `trans_b` where an operand is stored transposed.
use pjrt::xla_ffi::{CallFrame, DTYPE_F32};
use std::ffi::{c_char, c_void, CStr};

extern "C" {
    fn tt_host_matmul(rank: i64, a: *const f32, a_layout: *const i64, b: *const f32, b_layout: *const i64, c: *mut f32, c_layout: *const i64) -> *const c_char;
}

/// The sizes then strides of `batch` [rows, cols] matrices stored row-major, or as their
/// transposes when `trans` (one matrix: rank 2, for torch's mm).
fn layout(batch: i64, rows: i64, cols: i64, trans: bool) -> Vec<i64> {
    let (row_stride, col_stride) = if trans { (1, rows) } else { (cols, 1) };
    match batch {
        1 => vec![rows, cols, row_stride, col_stride],
        _ => vec![batch, rows, cols, rows * cols, row_stride, col_stride],
    }
}

/// The handler XLA calls (see pjrt::xla_ffi::Handler).
pub unsafe extern "C" fn handler(frame: *mut CallFrame) -> *mut c_void {
    let frame = &mut *frame;
    if !frame.should_execute() {
        return std::ptr::null_mut();
    }
    match run(frame) {
        Ok(()) => std::ptr::null_mut(),
        Err(message) => frame.error(&format!("torchtpu.host_matmul: {message}")),
    }
}

fn run(frame: &CallFrame) -> Result<(), String> {
    let attr = |name: &str| frame.attr_i64(name).ok_or_else(|| format!("no integer attribute {name}"));
    let (batch, m, n, k) = (attr("batch")?, attr("m")?, attr("n")?, attr("k")?);
    let (trans_a, trans_b) = (attr("trans_a")? != 0, attr("trans_b")? != 0);
    let (args, results) = (frame.args().unwrap_or_default(), frame.results().unwrap_or_default());
    let [a, b] = args[..] else { return Err(format!("{} operands, expected 2", args.len())) };
    let [c] = results[..] else { return Err(format!("{} results, expected 1", results.len())) };
    let sized = [(a, batch * m * k), (b, batch * k * n), (c, batch * m * n)];
    if sized.iter().any(|(buf, elements)| buf.dtype != DTYPE_F32 || buf.elements() != *elements) {
        return Err(format!("arrays {:?}, {:?} -> {:?} are not float32 products of {batch}x[{m},{k}]@[{k},{n}]", a.dims(), b.dims(), c.dims()));
    }
    // SAFETY: the three arrays hold the element counts just checked, and the result does not
    // alias an operand (XLA gives a custom call's result its own buffer).
    let (la, lb, lc) = (layout(batch, m, k, trans_a), layout(batch, k, n, trans_b), layout(batch, m, n, false));
    let rank = la.len() as i64 / 2;
    let error = unsafe {
        tt_host_matmul(rank, a.data as *const f32, la.as_ptr(), b.data as *const f32, lb.as_ptr(), c.data as *mut f32, lc.as_ptr())
    };
    match error.is_null() {
        true => Ok(()),
        false => Err(unsafe { CStr::from_ptr(error) }.to_string_lossy().into_owned()),
    }
}
