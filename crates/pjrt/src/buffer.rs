//! Device buffers, events and host <-> device transfers.

use crate::call;
use crate::client::{Client, ClientInner, Device};
use crate::error::{code, take_error, Error, Result};
use crate::ffi;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Element types, numbered as `PJRT_Buffer_Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElementType {
    Pred = 1,
    S8 = 2,
    S16 = 3,
    S32 = 4,
    S64 = 5,
    U8 = 6,
    U16 = 7,
    U32 = 8,
    U64 = 9,
    F16 = 10,
    F32 = 11,
    F64 = 12,
    BF16 = 13,
    C64 = 14,
    C128 = 15,
    F8E5M2 = 16,
    F8E4M3FN = 17,
    F8E5M2FNUZ = 19,
    F8E4M3FNUZ = 20,
    F8E8M0FNU = 28,
}

impl ElementType {
    const ALL: [ElementType; 20] = {
        use ElementType::*;
        [Pred, S8, S16, S32, S64, U8, U16, U32, U64, F16, F32, F64, BF16, C64, C128, F8E5M2, F8E4M3FN, F8E5M2FNUZ, F8E4M3FNUZ, F8E8M0FNU]
    };

    /// The `PJRT_Buffer_Type` value.
    pub fn to_c(self) -> i32 {
        self as i32
    }

    /// From a `PJRT_Buffer_Type` value; `None` for types this crate does not model (INVALID,
    /// sub-byte integers, TOKEN, the fp8 and fp4 formats torch lacks, ...).
    pub fn from_c(v: i32) -> Option<ElementType> {
        Self::ALL.iter().copied().find(|t| t.to_c() == v)
    }

    /// Bytes per element (PRED is stored as one byte).
    pub fn byte_size(self) -> usize {
        use ElementType::*;
        match self {
            Pred | S8 | U8 | F8E5M2 | F8E4M3FN | F8E5M2FNUZ | F8E4M3FNUZ | F8E8M0FNU => 1,
            S16 | U16 | F16 | BF16 => 2,
            S32 | U32 | F32 => 4,
            S64 | U64 | F64 | C64 => 8,
            C128 => 16,
        }
    }
}

/// How `PJRT_Client_BufferFromHostBuffer` may use the host data. Either way
/// [`Client::buffer_from_host_with`] returns only once the data is no longer
/// needed, so the slice can be reused right away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostBufferSemantics {
    /// The plugin copies during the call (`kImmutableOnlyDuringCall`).
    ImmutableOnlyDuringCall,
    /// The plugin may read later (`kImmutableUntilTransferCompletes`); we
    /// block on `done_with_host_buffer` before returning.
    ImmutableUntilTransferCompletes,
}

fn element_count(dims: &[i64]) -> Result<usize> {
    let mut n: usize = 1;
    for &d in dims {
        let d = usize::try_from(d).map_err(|_| Error::invalid(format!("negative dimension in {dims:?}")))?;
        n = n
            .checked_mul(d)
            .ok_or_else(|| Error::invalid(format!("shape {dims:?} overflows")))?;
    }
    Ok(n)
}

/// Bytes a dense row-major array of `ty` and `dims` occupies.
pub fn dense_size_in_bytes(ty: ElementType, dims: &[i64]) -> Result<usize> {
    element_count(dims)?
        .checked_mul(ty.byte_size())
        .ok_or_else(|| Error::invalid(format!("shape {dims:?} overflows")))
}

/// Checks that `data` holds every element that `dims` / `byte_strides`
/// address, so the plugin never reads outside the slice.
fn check_host_data(data: &[u8], ty: ElementType, dims: &[i64], byte_strides: Option<&[i64]>) -> Result<()> {
    let n = element_count(dims)?;
    match byte_strides {
        None => {
            let need = dense_size_in_bytes(ty, dims)?;
            if data.len() != need {
                return Err(Error::invalid(format!(
                    "host data has {} bytes, dense {ty:?}{dims:?} needs {need}",
                    data.len()
                )));
            }
        }
        Some(strides) => {
            if strides.len() != dims.len() {
                return Err(Error::invalid(format!(
                    "{} byte strides for {} dimensions",
                    strides.len(),
                    dims.len()
                )));
            }
            if strides.iter().any(|&s| s < 0) {
                return Err(Error::invalid("negative byte strides are not supported"));
            }
            if n > 0 {
                // Offset of the last element plus its size.
                let mut end = ty.byte_size() as u128;
                for (&d, &s) in dims.iter().zip(strides) {
                    end += (d as u128 - 1) * s as u128;
                }
                if end > data.len() as u128 {
                    return Err(Error::invalid(format!(
                        "strided host data needs {end} bytes, got {}",
                        data.len()
                    )));
                }
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------- Event

/// A PJRT event: completes once, possibly with an error.
pub struct Event {
    raw: *mut ffi::PJRT_Event,
    client: Arc<ClientInner>,
}

unsafe impl Send for Event {}
unsafe impl Sync for Event {}

impl Event {
    /// Blocks until the event completes; returns its error, if any.
    pub fn wait(&self) -> Result<()> {
        wait_event(self.client.api, self.raw)
    }

    /// Whether the event has completed (successfully or not). A failing query
    /// counts as ready, so that `wait` reports the error.
    pub fn is_ready(&self) -> bool {
        let mut a = ffi::PJRT_Event_IsReady_Args::new();
        a.event = self.raw;
        call!(self.client.api, PJRT_Event_IsReady, &mut a).map_or(true, |()| a.is_ready)
    }

    /// Calls `f` with the event's status once it completes: on a plugin thread, or at once
    /// when it already has. (The plugin keeps what it needs; the event may be dropped after.)
    pub fn on_ready(&self, f: Box<dyn FnOnce(Result<()>) + Send + 'static>) -> Result<()> {
        struct Callback {
            api: &'static ffi::Api,
            f: Box<dyn FnOnce(Result<()>) + Send + 'static>,
        }
        unsafe extern "C" fn trampoline(err: *mut ffi::PJRT_Error, arg: *mut std::ffi::c_void) {
            let cb = Box::from_raw(arg as *mut Callback);
            let status = take_error(cb.api, err);
            // A panic must not unwind into the plugin.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || (cb.f)(status)));
        }
        let arg = Box::into_raw(Box::new(Callback { api: self.client.api, f }));
        let mut a = ffi::PJRT_Event_OnReady_Args::new();
        a.event = self.raw;
        a.callback = Some(trampoline);
        a.user_arg = arg as *mut std::ffi::c_void;
        let r = call!(self.client.api, PJRT_Event_OnReady, &mut a);
        if r.is_err() {
            // Not registered: the callback will never run.
            drop(unsafe { Box::from_raw(arg) });
        }
        r
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        destroy_event(self.client.api, self.raw);
    }
}

fn destroy_event(api: &ffi::Api, raw: *mut ffi::PJRT_Event) {
    if !raw.is_null() {
        let mut a = ffi::PJRT_Event_Destroy_Args::new();
        a.event = raw;
        let _ = call!(api, PJRT_Event_Destroy, &mut a);
    }
}

/// How long to poll an event before blocking on it.
const POLL: Duration = Duration::from_micros(50);

/// Blocks until `raw` completes and returns its status.
///
/// Small transfers complete within microseconds on a plugin worker thread,
/// but a blocking `PJRT_Event_Await` then costs a sleep / wake-up round trip
/// (a 24-byte device->host copy measured ~55 us on the 0.81 CPU plugin,
/// ~10 us when polling first). So poll `IsReady` briefly, yielding the CPU,
/// and only then block.
fn wait_event(api: &ffi::Api, raw: *mut ffi::PJRT_Event) -> Result<()> {
    let mut start: Option<Instant> = None;
    loop {
        let mut a = ffi::PJRT_Event_IsReady_Args::new();
        a.event = raw;
        if call!(api, PJRT_Event_IsReady, &mut a).is_err() || a.is_ready {
            break;
        }
        let t0 = *start.get_or_insert_with(Instant::now);
        if t0.elapsed() > POLL {
            break;
        }
        std::thread::yield_now();
    }
    let mut a = ffi::PJRT_Event_Await_Args::new();
    a.event = raw;
    call!(api, PJRT_Event_Await, &mut a)
}

/// Waits for and destroys an event handed to us by the plugin (may be null).
fn await_event(api: &ffi::Api, raw: *mut ffi::PJRT_Event) -> Result<()> {
    if raw.is_null() {
        return Ok(());
    }
    let r = wait_event(api, raw);
    destroy_event(api, raw);
    r
}

// --------------------------------------------------------------------- Buffer

/// An array on a device. Destroyed (and its memory released once pending
/// work is done) on drop.
pub struct Buffer {
    pub(crate) raw: *mut ffi::PJRT_Buffer,
    pub(crate) client: Arc<ClientInner>,
}

unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

impl Drop for Buffer {
    fn drop(&mut self) {
        let mut a = ffi::PJRT_Buffer_Destroy_Args::new();
        a.buffer = self.raw;
        let _ = call!(self.client.api, PJRT_Buffer_Destroy, &mut a);
    }
}

impl Buffer {
    /// Dimensions, major to minor.
    pub fn dims(&self) -> Result<&[i64]> {
        let mut a = ffi::PJRT_Buffer_Dimensions_Args::new();
        a.buffer = self.raw;
        call!(self.client.api, PJRT_Buffer_Dimensions, &mut a)?;
        if a.num_dims == 0 || a.dims.is_null() {
            return Ok(&[]);
        }
        // SAFETY: the dims array has the lifetime of the buffer.
        Ok(unsafe { std::slice::from_raw_parts(a.dims, a.num_dims) })
    }

    pub fn element_type(&self) -> Result<ElementType> {
        let mut a = ffi::PJRT_Buffer_ElementType_Args::new();
        a.buffer = self.raw;
        call!(self.client.api, PJRT_Buffer_ElementType, &mut a)?;
        ElementType::from_c(a.type_)
            .ok_or_else(|| Error::new(code::UNIMPLEMENTED, format!("unsupported PJRT_Buffer_Type {}", a.type_)))
    }

    pub fn on_device_size_in_bytes(&self) -> Result<usize> {
        let mut a = ffi::PJRT_Buffer_OnDeviceSizeInBytes_Args::new();
        a.buffer = self.raw;
        call!(self.client.api, PJRT_Buffer_OnDeviceSizeInBytes, &mut a)?;
        Ok(a.on_device_size_in_bytes)
    }

    pub fn device(&self) -> Result<Device> {
        let mut a = ffi::PJRT_Buffer_Device_Args::new();
        a.buffer = self.raw;
        call!(self.client.api, PJRT_Buffer_Device, &mut a)?;
        self.client.device_for(a.device)
    }

    /// True once the buffer was deleted or donated to an execution.
    pub fn is_deleted(&self) -> Result<bool> {
        let mut a = ffi::PJRT_Buffer_IsDeleted_Args::new();
        a.buffer = self.raw;
        call!(self.client.api, PJRT_Buffer_IsDeleted, &mut a)?;
        Ok(a.is_deleted)
    }

    /// Releases the device memory now (once pending work is done). Afterwards
    /// only `is_deleted` and drop are meaningful.
    pub fn delete(&self) -> Result<()> {
        let mut a = ffi::PJRT_Buffer_Delete_Args::new();
        a.buffer = self.raw;
        call!(self.client.api, PJRT_Buffer_Delete, &mut a)
    }

    /// An event that completes when the buffer's data is computed (or failed).
    pub fn ready_event(&self) -> Result<Event> {
        let mut a = ffi::PJRT_Buffer_ReadyEvent_Args::new();
        a.buffer = self.raw;
        call!(self.client.api, PJRT_Buffer_ReadyEvent, &mut a)?;
        Ok(Event { raw: a.event, client: self.client.clone() })
    }

    /// Blocks until the buffer is ready; returns the error of the computation
    /// that produces it, if any.
    pub fn ready(&self) -> Result<()> {
        let mut a = ffi::PJRT_Buffer_ReadyEvent_Args::new();
        a.buffer = self.raw;
        call!(self.client.api, PJRT_Buffer_ReadyEvent, &mut a)?;
        await_event(self.client.api, a.event)
    }

    /// Copies the buffer into `dst` as a dense row-major array and waits for
    /// the copy. `dst.len()` must equal the dense size of the buffer.
    pub fn to_host(&self, dst: &mut [u8]) -> Result<()> {
        let need = dense_size_in_bytes(self.element_type()?, self.dims()?)?;
        if dst.len() != need {
            return Err(Error::invalid(format!(
                "destination has {} bytes, buffer needs {need}",
                dst.len()
            )));
        }
        let api = self.client.api;
        let mut a = ffi::PJRT_Buffer_ToHostBuffer_Args::new();
        a.src = self.raw;
        a.dst = dst.as_mut_ptr() as *mut c_void;
        a.dst_size = dst.len();
        call!(api, PJRT_Buffer_ToHostBuffer, &mut a)?;
        await_event(api, a.event)
    }

    /// Starts copying the buffer into `len` bytes at `dst` (dense row-major) and returns the
    /// copy's event (None when the plugin finished it during the call). The copy waits for
    /// the buffer's computation on the plugin's side.
    ///
    /// # Safety
    /// `dst` must stay valid for writes of `len` bytes, and not be read, until the event
    /// completes.
    pub unsafe fn to_host_async(&self, dst: *mut u8, len: usize) -> Result<Option<Event>> {
        let need = dense_size_in_bytes(self.element_type()?, self.dims()?)?;
        if len != need {
            return Err(Error::invalid(format!("destination has {len} bytes, buffer needs {need}")));
        }
        let mut a = ffi::PJRT_Buffer_ToHostBuffer_Args::new();
        a.src = self.raw;
        a.dst = dst as *mut c_void;
        a.dst_size = len;
        call!(self.client.api, PJRT_Buffer_ToHostBuffer, &mut a)?;
        Ok((!a.event.is_null()).then(|| Event { raw: a.event, client: self.client.clone() }))
    }

    /// Platform-dependent address of the data (a host pointer on CPU). Only
    /// valid while the buffer is alive and not donated.
    pub fn unsafe_pointer(&self) -> Result<usize> {
        let mut a = ffi::PJRT_Buffer_UnsafePointer_Args::new();
        a.buffer = self.raw;
        call!(self.client.api, PJRT_Buffer_UnsafePointer, &mut a)?;
        Ok(a.buffer_pointer)
    }

    /// The `PJRT_Buffer*` handle, for use with other PJRT code.
    pub fn as_raw(&self) -> *mut c_void {
        self.raw as *mut c_void
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({:?}{:?})", self.element_type().ok(), self.dims().ok())
    }
}

impl Client {
    /// Copies host data to a new buffer on `device`. `data` is dense
    /// row-major unless `byte_strides` (non-negative, one per dimension) says
    /// otherwise. The slice may be reused as soon as this returns.
    pub fn buffer_from_host(
        &self,
        data: &[u8],
        ty: ElementType,
        dims: &[i64],
        byte_strides: Option<&[i64]>,
        device: &Device,
    ) -> Result<Buffer> {
        // Copying during the call measured as fast as waiting on
        // done_with_host_buffer (0.8 / 1.3 us for 24 bytes on the 0.81 / 0.115
        // CPU plugins, see examples/bench_execute.rs), and is simpler.
        self.buffer_from_host_with(data, ty, dims, byte_strides, device, HostBufferSemantics::ImmutableOnlyDuringCall)
    }

    /// Starts copying `len` dense row-major bytes at `data` into a new buffer on `device`:
    /// returns the buffer (computations that read it wait for the copy) and the event after
    /// which the plugin no longer reads `data` (None when it finished during the call).
    ///
    /// # Safety
    /// `data` must stay valid and unchanged until the event completes.
    pub unsafe fn buffer_from_host_async(
        &self,
        data: *const u8,
        len: usize,
        ty: ElementType,
        dims: &[i64],
        device: &Device,
    ) -> Result<(Buffer, Option<Event>)> {
        let bytes = std::slice::from_raw_parts(data, len);
        check_host_data(bytes, ty, dims, None)?;
        if !Arc::ptr_eq(&device.client, &self.inner) {
            return Err(Error::invalid("device belongs to another client"));
        }
        let mut a = ffi::PJRT_Client_BufferFromHostBuffer_Args::new();
        a.client = self.inner.raw;
        a.data = data as *const c_void;
        a.type_ = ty.to_c();
        a.dims = dims.as_ptr();
        a.num_dims = dims.len();
        a.host_buffer_semantics = ffi::HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES;
        a.device = device.raw();
        call!(self.inner.api, PJRT_Client_BufferFromHostBuffer, &mut a)?;
        let buffer = Buffer { raw: a.buffer, client: self.inner.clone() };
        let done = (!a.done_with_host_buffer.is_null()).then(|| Event { raw: a.done_with_host_buffer, client: self.inner.clone() });
        Ok((buffer, done))
    }

    /// [`Client::buffer_from_host`] with an explicit host-buffer semantics.
    pub fn buffer_from_host_with(
        &self,
        data: &[u8],
        ty: ElementType,
        dims: &[i64],
        byte_strides: Option<&[i64]>,
        device: &Device,
        semantics: HostBufferSemantics,
    ) -> Result<Buffer> {
        check_host_data(data, ty, dims, byte_strides)?;
        if !Arc::ptr_eq(&device.client, &self.inner) {
            return Err(Error::invalid("device belongs to another client"));
        }
        let api = self.inner.api;
        let mut a = ffi::PJRT_Client_BufferFromHostBuffer_Args::new();
        a.client = self.inner.raw;
        a.data = data.as_ptr() as *const c_void;
        a.type_ = ty.to_c();
        a.dims = dims.as_ptr();
        a.num_dims = dims.len();
        if let Some(s) = byte_strides {
            a.byte_strides = s.as_ptr();
            a.num_byte_strides = s.len();
        }
        a.host_buffer_semantics = match semantics {
            HostBufferSemantics::ImmutableOnlyDuringCall => ffi::HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL,
            HostBufferSemantics::ImmutableUntilTransferCompletes => {
                ffi::HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES
            }
        };
        a.device = device.raw();
        call!(api, PJRT_Client_BufferFromHostBuffer, &mut a)?;
        let buffer = Buffer { raw: a.buffer, client: self.inner.clone() };
        // The event must be consumed either way; waiting on it is what makes
        // returning (and letting the caller reuse `data`) safe.
        await_event(api, a.done_with_host_buffer)?;
        Ok(buffer)
    }
}
