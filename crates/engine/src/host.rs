//! Moving data between the host and cells: reading a view into host memory, writing host
//! bytes into a view, and the allocator's resize and copy of whole cells. Cells are read and
//! written under the engine lock (`dispatch::locked`), or by running ops through `dispatch`.
use crate::abi::*;
use crate::cell::{Cell, DevBuf, Stored, Transfer};
use crate::checks;
use crate::dispatch::{self, CallResult, Produced};
use crate::error::{not_computed, Error};
use crate::runtime::runtime;
use crate::values::element_type;
use crate::view::Geometry;
use lowerings::{contiguous_strides, DType};
use std::sync::OnceLock;

fn internal_op(slot: &'static OnceLock<i32>, name: &str, args: &[&str], write_mask: u64) -> i32 {
    *slot.get_or_init(|| dispatch::register_op(name, "", args.iter().map(|s| s.to_string()).collect(), write_mask))
}

fn clone_op() -> i32 {
    static ID: OnceLock<i32> = OnceLock::new();
    internal_op(&ID, "aten::clone", &["self", "memory_format"], 0)
}

fn copy_op() -> i32 {
    static ID: OnceLock<i32> = OnceLock::new();
    internal_op(&ID, "aten::copy_", &["self", "src", "non_blocking"], 1)
}

fn none_arg() -> TtArg {
    TtArg { kind: TT_NONE, p: TtPayload { n: TtPair { i: 0, i2: 0 } } }
}

/// Reads the view `t` into `dst` (dense row-major bytes of its dtype). A synchronization: a
/// failed check of an earlier op raises here first.
pub fn to_host(t: &TtTensor, dst: &mut [u8]) -> Result<(), Error> {
    let cell = unsafe { &*(t.cell as *const Cell) };
    let g = Geometry { sizes: t.sizes(), strides: t.strides(), offset: t.offset };
    // A cell that waits for recorded ops runs them first, and so does any read while recorded
    // ops have device checks: their failures raise here, as in strict eager. (Not the read
    // of a constant number a recorded op returned: that is part of the op's call.)
    let stored = dispatch::stored_ready(cell)?;
    if !stored.as_ref().is_some_and(|s| s.constant) {
        dispatch::flush_checked()?;
        checks::raise_pending()?;
    }
    let direct = match &stored {
        None => Some(None),
        Some(s) if s.dtype as i8 == t.dtype && s.dims.as_slice() == t.sizes() && g.covers(s.dims.iter().product()) => {
            Some(Some((s.clone(), 0)))
        }
        // A contiguous run of a 1-d buffer at most twice its size (a bucketed result's bucket).
        Some(s) if s.dtype as i8 == t.dtype && s.dims.len() == 1 && g.is_contiguous() && g.offset + g.numel() <= s.dims[0] && s.dims[0] <= 2 * g.numel() => {
            Some(Some((s.clone(), g.offset as usize)))
        }
        Some(_) => None,
    };
    match direct {
        Some(None) => {
            dst.fill(0);
            Ok(())
        }
        Some(Some((s, offset))) => read_run(&s, offset, dst),
        None => {
            // A strided view or a part of the storage: materialize it on the device first.
            let args = [TtArg { kind: TT_TENSOR, p: TtPayload { t: *t } }, none_arg()];
            let produced = match dispatch::call(clone_op(), &args)? {
                CallResult::Done(p) => p,
                CallResult::Resize(..) => unreachable!("clone has no out= argument"),
            };
            let Some(Produced::Tensor { cell, .. }) = produced.into_iter().next() else { unreachable!() };
            let owned = unsafe { Box::from_raw(cell) };
            let s = dispatch::stored_ready(&owned)?;
            read_run(&s.expect("clone produced a buffer"), 0, dst)
        }
    }
}

/// Starts reading the view `t` into `len` bytes at `dst` and returns (a non-blocking copy into
/// pinned memory): `keep` (the host memory's owner) and the device buffer stay alive until
/// the copy is done; torch.tpu.synchronize and Events wait for it. A failed device check of an
/// earlier op raises at the next synchronization instead of here. A view that is not its
/// whole buffer is read as `to_host` reads it, before returning.
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes until the copy is done.
pub unsafe fn to_host_async(t: &TtTensor, dst: *mut u8, len: usize, keep: Box<dyn Send>) -> Result<(), Error> {
    let cell = unsafe { &*(t.cell as *const Cell) };
    let g = Geometry { sizes: t.sizes(), strides: t.strides(), offset: t.offset };
    let stored = dispatch::stored_ready(cell)?;
    let whole = stored.as_ref().filter(|s| !s.constant && s.dtype as i8 == t.dtype && s.dims.as_slice() == t.sizes() && g.covers(s.dims.iter().product()));
    match whole.and_then(|s| s.dev()) {
        Some(dev) if len > 0 => {
            if let Some(event) = unsafe { dev.buf.to_host_async(dst, len)? } {
                let host = (dst as usize, dst as usize + len);
                crate::cell::add_transfer(Transfer { event: std::sync::Arc::new(event), host, keep: Box::new((keep, dev.clone())) });
            }
            Ok(())
        }
        _ => to_host(t, if len == 0 { &mut [] } else { unsafe { std::slice::from_raw_parts_mut(dst, len) } }),
    }
}

/// Starts writing `len` dense bytes at `src` into the view `t` and returns (a non-blocking copy
/// from pinned memory): `keep` (the host memory's owner) stays alive until the plugin has read
/// the bytes; computations that read `t` wait for them, and so do torch.tpu.synchronize and
/// Events. A view that is not its whole storage, or a bucketed-programs scope, takes
/// `from_host`'s blocking copy.
///
/// # Safety
/// `src` must stay valid and unchanged until the copy is done (the caller's promise for
/// pinned memory, as with CUDA).
pub unsafe fn from_host_async(t: &TtTensor, src: *const u8, len: usize, keep: Box<dyn Send>) -> Result<(), Error> {
    let cell = unsafe { &*(t.cell as *const Cell) };
    let dtype = DType::from_code(t.dtype).ok_or_else(|| Error::runtime(format!("torchtpu: dtype code {} is not supported", t.dtype)))?;
    let g = Geometry { sizes: t.sizes(), strides: t.strides(), offset: t.offset };
    if len == 0 || crate::buckets::scoped() || !g.covers(cell.nbytes() / dtype.size() as i64) || len != g.numel() as usize * dtype.size() {
        return from_host(t, if len == 0 { &[] } else { unsafe { std::slice::from_raw_parts(src, len) } });
    }
    let rt = runtime()?;
    let (buf, done) = unsafe { rt.client.buffer_from_host_async(src, len, element_type(dtype), t.sizes(), rt.device(cell.device)?)? };
    let stored = Stored::ready(DevBuf::new(buf, len as i64, cell.device), dtype, t.sizes().to_vec());
    dispatch::locked(|held| cell.set(held, Some(stored)));
    if let Some(event) = done {
        crate::cell::add_transfer(Transfer { event: std::sync::Arc::new(event), host: (src as usize, src as usize + len), keep });
    }
    Ok(())
}

/// Reads `dst.len()` bytes of a buffer from its element `offset` (a buffer may hold more than
/// its storage: see buckets.rs).
fn read_run(s: &Stored, offset: usize, dst: &mut [u8]) -> Result<(), Error> {
    let total = s.dims.iter().product::<i64>() as usize * s.dtype.size();
    let buf = &s.dev().ok_or_else(not_computed)?.buf;
    if offset == 0 && total == dst.len() {
        return Ok(buf.to_host(dst)?);
    }
    let mut all = vec![0u8; total];
    buf.to_host(&mut all)?;
    let start = offset * s.dtype.size();
    dst.copy_from_slice(&all[start..start + dst.len()]);
    Ok(())
}

/// Writes dense host bytes into the view `t`.
pub fn from_host(t: &TtTensor, src: &[u8]) -> Result<(), Error> {
    let cell = unsafe { &*(t.cell as *const Cell) };
    let dtype = DType::from_code(t.dtype).ok_or_else(|| Error::runtime(format!("torchtpu: dtype code {} is not supported", t.dtype)))?;
    let g = Geometry { sizes: t.sizes(), strides: t.strides(), offset: t.offset };
    if g.covers(cell.nbytes() / dtype.size() as i64) {
        // The whole storage: upload straight into a new buffer. In a bucketed-programs scope
        // the buffer holds the storage's bucket, flat (zeros past the data), as a bucketed
        // program's result does: a tensor made from host data sized by the step (a serving
        // step's list of indices) then meets the same programs at every size in its bucket.
        let n = g.numel();
        let stored = if crate::buckets::scoped() && t.ndim > 0 && n > 1 && crate::buckets::bucket(n) <= crate::buckets::MAX_ELEMENTS {
            upload_bucket(src, dtype, n, cell.device)?
        } else {
            upload(src, dtype, t.sizes().to_vec(), cell.device)?
        };
        dispatch::locked(|held| cell.set(held, Some(stored)));
        return Ok(());
    }
    if g.numel() == 0 {
        return Ok(());
    }
    // A part of the storage: the bytes go up as a buffer of their own, then a device copy
    // writes them into the view (a program that bucketed programs can serve, where the
    // view's size changes from call to call). In a bucketed-programs scope the buffer holds
    // the bucket (zeros past the data): a bucketed program's key has its inputs' buffer sizes.
    let stored = if crate::buckets::scoped() {
        upload_bucket(src, dtype, g.numel(), cell.device)?
    } else {
        upload(src, dtype, t.sizes().to_vec(), cell.device)?
    };
    // Freed at the end of this call: a recorded copy holds the buffer, not the cell.
    let temp = unsafe { Box::from_raw(Cell::new(stored.dims.iter().product::<i64>() * dtype.size() as i64, cell.device, Some(stored))) };
    let strides = contiguous_strides(t.sizes());
    let src_tensor = TtTensor {
        cell: &*temp as *const Cell as *mut _,
        host: std::ptr::null(),
        sizes: t.sizes,
        strides: strides.as_ptr(),
        offset: 0,
        ndim: t.ndim,
        dtype: t.dtype,
        flags: 0,
    };
    let args = [
        TtArg { kind: TT_TENSOR, p: TtPayload { t: *t } },
        TtArg { kind: TT_TENSOR, p: TtPayload { t: src_tensor } },
        TtArg { kind: TT_BOOL, p: TtPayload { n: TtPair { i: 0, i2: 0 } } },
    ];
    dispatch::call(copy_op(), &args)?;
    Ok(())
}

/// `n` elements of dense host bytes as a flat buffer of their bucket (zeros past them).
fn upload_bucket(src: &[u8], dtype: DType, n: i64, device: i32) -> Result<Stored, Error> {
    let n = crate::buckets::bucket(n);
    let mut padded = src.to_vec();
    padded.resize(n as usize * dtype.size(), 0);
    upload(&padded, dtype, vec![n], device)
}

/// Dense host bytes as a new computed buffer of `dims` on `device`.
fn upload(bytes: &[u8], dtype: DType, dims: Vec<i64>, device: i32) -> Result<Stored, Error> {
    let rt = runtime()?;
    let buf = rt.client.buffer_from_host(bytes, element_type(dtype), &dims, None, rt.device(device)?)?;
    Ok(Stored::ready(DevBuf::new(buf, bytes.len() as i64, device), dtype, dims))
}

/// The host address of a whole storage's device memory, for a collective to read and write in
/// place (torch.distributed's host staging without its copies). Only where device memory is
/// host memory (the CPU plugin), and only for a computed buffer of exactly the storage's
/// `numel` elements of `dtype` (not a bucket's, not a recorded constant) that the cell alone
/// holds. Runs what fused eager mode recorded and waits for every queued computation first,
/// so that nothing still reads the buffer when it is written. None where any of that does not
/// hold: the caller copies through host memory instead.
pub fn host_alias(cell: &Cell, dtype: DType, numel: i64) -> Result<Option<usize>, Error> {
    if runtime()?.client.platform_name() != "cpu" || numel <= 0 || numel * dtype.size() as i64 != cell.nbytes() {
        return Ok(None);
    }
    dispatch::flush_recorded("collective")?;
    checks::raise_pending()?;
    crate::cell::synchronize()?;
    dispatch::locked(|held| {
        let Some(s) = cell.get(held) else { return Ok(None) };
        let Some(dev) = s.dev() else { return Ok(None) };
        if s.constant || s.dtype != dtype || s.dims.iter().product::<i64>() != numel || std::sync::Arc::strong_count(dev) != 1 {
            return Ok(None);
        }
        Ok(Some(dev.buf.unsafe_pointer()?))
    })
}

/// The whole cell's contents as bytes (zeros when never written).
pub fn cell_bytes(cell: &Cell) -> Result<(Option<(DType, Vec<i64>)>, Vec<u8>), Error> {
    let stored = dispatch::stored_ready(cell)?;
    let mut bytes = vec![0u8; cell.nbytes() as usize];
    match stored {
        None => Ok((None, bytes)),
        Some(s) => {
            let n = (s.dims.iter().product::<i64>() as usize * s.dtype.size()).min(bytes.len());
            let mut tmp = vec![0u8; s.dims.iter().product::<i64>() as usize * s.dtype.size()];
            s.dev().ok_or_else(not_computed)?.buf.to_host(&mut tmp)?;
            bytes[..n].copy_from_slice(&tmp[..n]);
            Ok((Some((s.dtype, s.dims)), bytes))
        }
    }
}

/// Replaces a cell's contents with `bytes` as a 1-d buffer of `dtype` (or clears it).
pub fn set_cell_bytes(cell: &Cell, dtype: Option<DType>, bytes: &[u8]) -> Result<(), Error> {
    let Some(dtype) = dtype else {
        dispatch::locked(|held| cell.set(held, None));
        return Ok(());
    };
    let n = bytes.len() / dtype.size();
    let rt = runtime()?;
    let buf = rt.client.buffer_from_host(&bytes[..n * dtype.size()], element_type(dtype), &[n as i64], None, rt.device(cell.device)?)?;
    let stored = Stored::ready(DevBuf::new(buf, (n * dtype.size()) as i64, cell.device), dtype, vec![n as i64]);
    dispatch::locked(|held| cell.set(held, Some(stored)));
    Ok(())
}

/// Grows a cell to `nbytes` keeping its contents; new bytes read as zeros.
pub fn resize_cell(c: &Cell, nbytes: i64) -> Result<(), Error> {
    if nbytes <= c.nbytes() {
        return Ok(());
    }
    let (layout, mut bytes) = cell_bytes(c)?;
    bytes.resize(nbytes as usize, 0);
    c.set_nbytes(nbytes);
    set_cell_bytes(c, layout.map(|(d, _)| d), &bytes)
}

/// Copies `nbytes` of `src`'s contents into `dst` (the allocator's copy_data).
pub fn copy_cell_bytes(dst: &Cell, src: &Cell, nbytes: i64) -> Result<(), Error> {
    let (layout, bytes) = cell_bytes(src)?;
    let (_, mut out) = cell_bytes(dst)?;
    let n = (nbytes as usize).min(bytes.len()).min(out.len());
    out[..n].copy_from_slice(&bytes[..n]);
    set_cell_bytes(dst, layout.map(|(d, _)| d), &out)
}
