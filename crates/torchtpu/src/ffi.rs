//! The functions the C++ shim calls (declared in csrc/abi.h). Each catches panics: nothing may
//! unwind into C++. Results live in a thread-local buffer until the thread's next call.
use engine::abi::*;
use engine::cell::Cell;
use engine::dispatch::{self, CallResult, Produced};
use engine::Error;
use lowerings::ErrorKind;
use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

struct ResultBuf {
    result: TtResult,
    outs: Vec<TtOut>,
    dims: Vec<Vec<i64>>,
    message: CString,
}

thread_local! {
    static RESULT: RefCell<ResultBuf> = RefCell::new(ResultBuf {
        result: TtResult { status: 0, resize_arg: -1, message: std::ptr::null(), nouts: 0, outs: std::ptr::null() },
        outs: Vec::new(),
        dims: Vec::new(),
        message: CString::default(),
    });
}

fn status_of(e: &Error) -> i32 {
    match e {
        Error::NoLowering(_) => return TT_ERR_NO_LOWERING,
        // The device's memory is full: torch.OutOfMemoryError, which callers catch to retry
        // with smaller batches.
        Error::Pjrt(p) if p.code == pjrt::error::code::RESOURCE_EXHAUSTED => return TT_ERR_OUT_OF_MEMORY,
        _ => {}
    }
    match e.kind() {
        ErrorKind::Runtime => TT_ERR_RUNTIME,
        ErrorKind::Value => TT_ERR_VALUE,
        ErrorKind::Type => TT_ERR_TYPE,
        ErrorKind::Index => TT_ERR_INDEX,
        ErrorKind::NotImplemented => TT_ERR_NOT_IMPLEMENTED,
    }
}

fn push_produced(buf: &mut ResultBuf, p: Produced) {
    match p {
        Produced::Tensor { cell, dtype, dims } => {
            buf.outs.push(TtOut {
                kind: TT_OUT_TENSOR,
                dtype: dtype as i8,
                ndim: dims.len() as i32,
                sizes: std::ptr::null(),
                cell: cell as *mut c_void,
                i: 0,
            });
            buf.dims.push(dims);
        }
        Produced::Undefined => {
            buf.outs.push(TtOut { kind: TT_OUT_UNDEFINED, dtype: 0, ndim: 0, sizes: std::ptr::null(), cell: std::ptr::null_mut(), i: 0 });
            buf.dims.push(Vec::new());
        }
        Produced::List(items) => {
            buf.outs.push(TtOut { kind: TT_OUT_LIST, dtype: 0, ndim: 0, sizes: std::ptr::null(), cell: std::ptr::null_mut(), i: items.len() as i64 });
            buf.dims.push(Vec::new());
            for it in items {
                push_produced(buf, it);
            }
        }
    }
}

/// Runs `f` and stores its outcome in this thread's result buffer.
fn respond(f: impl FnOnce() -> Result<CallResult, Error>) -> *const TtResult {
    let outcome = catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown panic".into());
        Err(Error::runtime(format!("torchtpu internal error: {msg}")))
    });
    RESULT.with(|r| {
        let mut buf = r.borrow_mut();
        let buf = &mut *buf;
        buf.outs.clear();
        buf.dims.clear();
        buf.result.resize_arg = -1;
        match outcome {
            Ok(CallResult::Done(produced)) => {
                buf.result.status = TT_OK;
                for p in produced {
                    push_produced(buf, p);
                }
            }
            Ok(CallResult::Resize(arg, dims)) => {
                buf.result.status = TT_RESIZE;
                buf.result.resize_arg = arg as i32;
                buf.outs.push(TtOut { kind: TT_OUT_TENSOR, dtype: 0, ndim: dims.len() as i32, sizes: std::ptr::null(), cell: std::ptr::null_mut(), i: 0 });
                buf.dims.push(dims);
            }
            Err(e) => {
                buf.result.status = status_of(&e);
                buf.message = CString::new(e.to_string().replace('\0', " ")).unwrap_or_default();
            }
        }
        for (o, d) in buf.outs.iter_mut().zip(&buf.dims) {
            o.sizes = d.as_ptr();
        }
        buf.result.message = buf.message.as_ptr();
        buf.result.nouts = buf.outs.len();
        buf.result.outs = buf.outs.as_ptr();
        &buf.result as *const TtResult
    })
}

fn done() -> Result<CallResult, Error> {
    Ok(CallResult::Done(Vec::new()))
}

#[no_mangle]
pub extern "C" fn tt_op_register(name: *const c_char, overload: *const c_char, arg_names: *const c_char, nargs: i32, write_mask: u64) -> i32 {
    catch_unwind(|| {
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
        let overload = unsafe { CStr::from_ptr(overload) }.to_string_lossy().into_owned();
        let mut names = Vec::with_capacity(nargs as usize);
        let mut p = arg_names;
        for _ in 0..nargs {
            let s = unsafe { CStr::from_ptr(p) };
            names.push(s.to_string_lossy().into_owned());
            p = unsafe { p.add(s.to_bytes().len() + 1) };
        }
        dispatch::register_op(&name, &overload, names, write_mask)
    })
    .unwrap_or(-1)
}

#[no_mangle]
pub extern "C" fn tt_op_call(op: i32, args: *const TtArg, nargs: usize) -> *const TtResult {
    respond(|| {
        let args = if nargs == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(args, nargs) } };
        dispatch::call(op, args)
    })
}

#[no_mangle]
pub extern "C" fn tt_cell_new(nbytes: i64, device: i32) -> *mut c_void {
    Cell::new(nbytes, device, None) as *mut c_void
}

/// The storage's data pointer (address.rs); null when the storage is too large to have one.
#[no_mangle]
pub extern "C" fn tt_cell_address(cell: *mut c_void) -> *mut c_void {
    catch_unwind(|| unsafe { &*(cell as *const Cell) }.address()).ok().flatten().unwrap_or(0) as *mut c_void
}

/// The cell behind a data pointer (or an address inside its range); null if none.
#[no_mangle]
pub extern "C" fn tt_cell_at(addr: *const c_void) -> *mut c_void {
    engine::address::cell_at(addr as usize).unwrap_or(std::ptr::null_mut()) as *mut c_void
}

#[no_mangle]
pub extern "C" fn tt_address_region(base: *mut usize, len: *mut usize) {
    let (b, l) = engine::address::region_bounds();
    unsafe {
        *base = b;
        *len = l;
    }
}

#[no_mangle]
pub extern "C" fn tt_cell_release(cell: *mut c_void) {
    if !cell.is_null() {
        let _ = catch_unwind(|| drop(unsafe { Box::from_raw(cell as *mut Cell) }));
    }
}

#[no_mangle]
pub extern "C" fn tt_cell_resize(cell: *mut c_void, nbytes: i64) -> *const TtResult {
    respond(|| {
        engine::resize_cell(unsafe { &*(cell as *const Cell) }, nbytes)?;
        done()
    })
}

#[no_mangle]
pub extern "C" fn tt_cell_copy_bytes(dst: *mut c_void, src: *const c_void, nbytes: i64) -> *const TtResult {
    respond(|| {
        engine::copy_cell_bytes(unsafe { &*(dst as *const Cell) }, unsafe { &*(src as *const Cell) }, nbytes)?;
        done()
    })
}

#[no_mangle]
pub extern "C" fn tt_to_host(src: *const TtTensor, dst: *mut c_void, nbytes: i64) -> *const TtResult {
    respond(|| {
        let out = if nbytes == 0 { &mut [][..] } else { unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, nbytes as usize) } };
        engine::host::to_host(unsafe { &*src }, out)?;
        done()
    })
}

#[no_mangle]
pub extern "C" fn tt_from_host(dst: *const TtTensor, src: *const c_void, nbytes: i64) -> *const TtResult {
    respond(|| {
        let data = if nbytes == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(src as *const u8, nbytes as usize) } };
        engine::host::from_host(unsafe { &*dst }, data)?;
        done()
    })
}

/// Host memory a non-blocking copy reads or writes, held for it by the shim: `release(ctx)`
/// lets it go once the copy is done (or was never started).
struct HostMemory {
    release: extern "C" fn(*mut c_void),
    ctx: *mut c_void,
}

// SAFETY: the shim's release function may run on any thread.
unsafe impl Send for HostMemory {}

impl Drop for HostMemory {
    fn drop(&mut self) {
        (self.release)(self.ctx)
    }
}

#[no_mangle]
pub extern "C" fn tt_host_wait(ptr: *const c_void, nbytes: i64) -> *const TtResult {
    respond(|| {
        engine::cell::wait_host_range(ptr as usize, ptr as usize + nbytes.max(0) as usize)?;
        done()
    })
}

#[no_mangle]
pub extern "C" fn tt_to_host_async(src: *const TtTensor, dst: *mut c_void, nbytes: i64, release: extern "C" fn(*mut c_void), ctx: *mut c_void) -> *const TtResult {
    let keep = Box::new(HostMemory { release, ctx });
    respond(|| {
        unsafe { engine::host::to_host_async(&*src, dst as *mut u8, nbytes as usize, keep)? };
        done()
    })
}

#[no_mangle]
pub extern "C" fn tt_from_host_async(dst: *const TtTensor, src: *const c_void, nbytes: i64, release: extern "C" fn(*mut c_void), ctx: *mut c_void) -> *const TtResult {
    let keep = Box::new(HostMemory { release, ctx });
    respond(|| {
        unsafe { engine::host::from_host_async(&*dst, src as *const u8, nbytes as usize, keep)? };
        done()
    })
}

#[no_mangle]
pub extern "C" fn tt_device_count() -> i32 {
    catch_unwind(engine::device_count).unwrap_or(0)
}

fn tt_stat(s: engine::memory::Stat) -> TtStat {
    TtStat { current: s.current, peak: s.peak, allocated: s.allocated, freed: s.freed }
}

#[no_mangle]
pub extern "C" fn tt_memory_stats(device: i32, out: *mut TtMemoryStats) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // What fused eager mode recorded runs first: its buffers count (a failure of it
        // raises at the next read of its results).
        let _ = engine::dispatch::flush_recorded("memory statistics");
        let (buffers, bytes) = engine::memory::stats(device);
        let reserved = engine::memory::reserved(device);
        unsafe { *out = TtMemoryStats { buffers: tt_stat(buffers), bytes: tt_stat(bytes), reserved: tt_stat(reserved) } };
    }));
}

#[no_mangle]
pub extern "C" fn tt_memory_reset(device: i32, peak: bool, accumulated: bool) {
    let _ = engine::dispatch::flush_recorded("memory statistics");
    if peak {
        engine::memory::reset_peak(device);
    }
    if accumulated {
        engine::memory::reset_accumulated(device);
    }
}

#[no_mangle]
pub extern "C" fn tt_memory_info(device: i32, free_bytes: *mut i64, total_bytes: *mut i64) -> *const TtResult {
    respond(|| {
        engine::dispatch::flush_recorded("memory statistics")?;
        let (free, total) = engine::memory::info(device)?;
        unsafe {
            *free_bytes = free;
            *total_bytes = total;
        }
        done()
    })
}

#[no_mangle]
pub extern "C" fn tt_set_float32_matmul_precision(precision: i32) {
    lowerings::set_float32_matmul(precision.clamp(0, 2) as u8);
}

#[no_mangle]
pub extern "C" fn tt_is_initialized() -> bool {
    engine::runtime::is_initialized()
}

#[no_mangle]
pub extern "C" fn tt_trace_record(on: bool) {
    engine::trace::set_recording(on);
}

#[no_mangle]
pub extern "C" fn tt_trace_correlation(id: u64) {
    engine::trace::set_correlation(id);
}

pub type EmitActivity =
    extern "C" fn(ctx: *mut c_void, name: *const c_char, name_len: i64, device: i32, host_thread: i32, correlation: u64, start_ns: i64, end_ns: i64);

#[no_mangle]
pub extern "C" fn tt_trace_take(emit: EmitActivity, ctx: *mut c_void) {
    for a in engine::trace::take() {
        let host_thread = a.host_thread.unwrap_or(-1);
        emit(ctx, a.name.as_ptr() as *const c_char, a.name.len() as i64, a.device, host_thread, a.correlation, a.start_ns, a.end_ns);
    }
}

#[no_mangle]
pub extern "C" fn tt_synchronize(_device: i32) {
    // Reads wait for their producers; what fused eager mode recorded is started here (a
    // failure of it raises at the next read of its results).
    let _ = engine::dispatch::flush_recorded("synchronize");
    // Non-blocking copies to and from host memory are done when it returns, as CUDA's are.
    let _ = engine::cell::wait_transfers();
}

/// The aten ops the shim must route to the fallback explicitly (declared `.routed(...)`):
/// NUL-separated, ending with an empty name.
#[no_mangle]
pub extern "C" fn tt_routed_ops() -> *const c_char {
    static LIST: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    LIST.get_or_init(|| {
        let mut v = Vec::new();
        for name in lowerings::registry().declarations().flat_map(|d| d.routed.iter()) {
            v.extend_from_slice(name.as_bytes());
            v.push(0);
        }
        v.push(0);
        v
    })
    .as_ptr() as *const c_char
}

/// Whether an op ("aten::_foreach_add_") is a list op (declared `.list_op()`).
#[no_mangle]
pub extern "C" fn tt_route_family(qualified: *const c_char) -> bool {
    catch_unwind(|| {
        let name = unsafe { CStr::from_ptr(qualified) }.to_string_lossy();
        lowerings::registry().get(lowerings::base_name(&name)).is_some_and(|d| d.list_op)
    })
    .unwrap_or(false)
}

/// Whether a structured op ("aten::add", "Tensor") should run its lowering directly rather
/// than through its generated composite.
#[no_mangle]
pub extern "C" fn tt_route_structured(qualified: *const c_char, overload: *const c_char) -> bool {
    catch_unwind(|| {
        let name = unsafe { CStr::from_ptr(qualified) }.to_string_lossy();
        let overload = unsafe { CStr::from_ptr(overload) }.to_string_lossy();
        let short = name.strip_prefix("aten::").unwrap_or(&name);
        let full = if overload.is_empty() { short.to_string() } else { format!("{short}.{overload}") };
        lowerings::registry().get(lowerings::base_name(&name)).is_some_and(|d| !d.keep_composite.contains(&full.as_str()))
    })
    .unwrap_or(false)
}
