//! Compiling, loading, serializing and running executables.

use crate::buffer::Buffer;
use crate::call;
use crate::client::{Client, ClientInner, Device};
use crate::error::{c_str, code, Error, Result};
use crate::ffi;
use std::ffi::c_char;
use std::ptr::null_mut;
use std::sync::Arc;

/// Serialized `xla.CompileOptionsProto` with only
/// `executable_build_options { num_replicas, num_partitions }` set.
///
/// Plugins abort on empty compile options; `compile_options_proto(1, 1)` is
/// the smallest options message known to work (`1a 04 20 01 28 01`).
pub fn compile_options_proto(num_replicas: i64, num_partitions: i64) -> Vec<u8> {
    // ExecutableBuildOptionsProto: num_replicas = 4, num_partitions = 5 (varints).
    let mut build = Vec::with_capacity(24);
    put_varint_field(&mut build, 4, num_replicas as u64);
    put_varint_field(&mut build, 5, num_partitions as u64);
    // CompileOptionsProto: executable_build_options = 3 (length-delimited).
    let mut out = Vec::with_capacity(build.len() + 2);
    put_varint(&mut out, (3 << 3) | 2);
    put_varint(&mut out, build.len() as u64);
    out.extend_from_slice(&build);
    out
}

/// Like `compile_options_proto(1, 1)` plus `compile_portable_executable:
/// true`: the executable is not bound to a device (its
/// `addressable_devices()` is empty) and [`LoadedExecutable::execute`] runs
/// it on whichever device it is given.
pub fn portable_compile_options_proto() -> Vec<u8> {
    let mut out = compile_options_proto(1, 1);
    put_varint_field(&mut out, 4, 1); // CompileOptionsProto.compile_portable_executable
    out
}

/// A compiler option set by name for one compilation (`CompileOptionsProto.env_option_overrides`):
/// the plugin looks the name up among XLA's `DebugOptions` fields and rejects unknown ones.
#[derive(Clone, Copy, Debug)]
pub enum OptionOverride {
    Bool(bool),
    Int(i64),
}

/// `options` (a serialized `CompileOptionsProto`) with `overrides` added; the plugin's other
/// defaults (and its `XLA_FLAGS`) stay as they are.
pub fn with_option_overrides(options: &[u8], overrides: &[(&str, OptionOverride)]) -> Vec<u8> {
    let mut out = options.to_vec();
    for (name, value) in overrides {
        // OptionOverrideProto: bool_field = 2, int_field = 3.
        let mut v = Vec::new();
        match *value {
            OptionOverride::Bool(b) => put_varint_field(&mut v, 2, b as u64),
            OptionOverride::Int(i) => put_varint_field(&mut v, 3, i as u64),
        }
        // The map entry: key = 1 (string), value = 2 (message).
        let mut entry = Vec::new();
        put_bytes_field(&mut entry, 1, name.as_bytes());
        put_bytes_field(&mut entry, 2, &v);
        put_bytes_field(&mut out, 7, &entry); // CompileOptionsProto.env_option_overrides
    }
    out
}

fn put_bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    put_varint(out, (field << 3) | 2); // wire type 2 = length-delimited
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn put_varint_field(out: &mut Vec<u8>, field: u64, value: u64) {
    put_varint(out, field << 3); // wire type 0 = varint
    put_varint(out, value);
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Owns a `PJRT_Executable*` (the unloaded view of a loaded executable).
struct ExecutableRef<'a> {
    raw: *mut ffi::PJRT_Executable,
    api: &'a ffi::Api,
}

impl Drop for ExecutableRef<'_> {
    fn drop(&mut self) {
        let mut a = ffi::PJRT_Executable_Destroy_Args::new();
        a.executable = self.raw;
        let _ = call!(self.api, PJRT_Executable_Destroy, &mut a);
    }
}

/// A compiled program loaded on the client's devices.
pub struct LoadedExecutable {
    raw: *mut ffi::PJRT_LoadedExecutable,
    client: Arc<ClientInner>,
    num_outputs: usize,
    /// Devices the executable runs on, in replica order.
    devices: Vec<*mut ffi::PJRT_Device>,
}

unsafe impl Send for LoadedExecutable {}
unsafe impl Sync for LoadedExecutable {}

impl Drop for LoadedExecutable {
    fn drop(&mut self) {
        let mut a = ffi::PJRT_LoadedExecutable_Destroy_Args::new();
        a.executable = self.raw;
        let _ = call!(self.client.api, PJRT_LoadedExecutable_Destroy, &mut a);
    }
}

/// Argument / output pointer lists live on the stack up to this many entries.
const STACK_LIST: usize = 16;

impl Client {
    /// Compiles a StableHLO/MHLO module given as MLIR text.
    /// `compile_options` is a serialized `CompileOptionsProto`, e.g. from
    /// [`compile_options_proto`]; it must not be empty.
    pub fn compile(&self, mlir: &str, compile_options: &[u8]) -> Result<LoadedExecutable> {
        self.compile_code(mlir.as_bytes(), compile_options)
    }

    /// Compiles a module given as MLIR text or bytecode (a StableHLO portable artifact).
    pub fn compile_code(&self, mlir: &[u8], compile_options: &[u8]) -> Result<LoadedExecutable> {
        if compile_options.is_empty() {
            return Err(Error::invalid("compile options must not be empty (see compile_options_proto)"));
        }
        let format = "mlir";
        // MLIR's parser may read one byte past `code_size` expecting a NUL
        // terminator: without one, a second unknown-op parse error crashed
        // the 0.115 CPU plugin. So hand it a NUL-terminated copy.
        let mut code = Vec::with_capacity(mlir.len() + 1);
        code.extend_from_slice(mlir);
        code.push(0);
        let mut program = ffi::PJRT_Program::new();
        // The plugin only reads `code` when compiling.
        program.code = code.as_mut_ptr() as *mut c_char;
        program.code_size = mlir.len();
        program.format = format.as_ptr() as *const c_char;
        program.format_size = format.len();
        let mut a = ffi::PJRT_Client_Compile_Args::new();
        a.client = self.inner.raw;
        a.program = &program;
        a.compile_options = compile_options.as_ptr() as *const c_char;
        a.compile_options_size = compile_options.len();
        call!(self.inner.api, PJRT_Client_Compile, &mut a)?;
        LoadedExecutable::wrap(&self.inner, a.executable)
    }

    /// Loads bytes from [`LoadedExecutable::serialize`] (same plugin build
    /// only). `compile_options`, when given, replaces the serialized ones.
    pub fn deserialize_executable(&self, bytes: &[u8], compile_options: Option<&[u8]>) -> Result<LoadedExecutable> {
        let mut a = ffi::PJRT_Executable_DeserializeAndLoad_Args::new();
        a.client = self.inner.raw;
        a.serialized_executable = bytes.as_ptr() as *const c_char;
        a.serialized_executable_size = bytes.len();
        if let Some(opts) = compile_options {
            // The override fields arrived in API 0.71; older plugins would
            // silently ignore them.
            let (_, minor) = self.plugin().api_version();
            if minor < 71 {
                return Err(Error::new(
                    code::UNIMPLEMENTED,
                    "overriding compile options on deserialize needs PJRT API >= 0.71",
                ));
            }
            if opts.is_empty() {
                return Err(Error::invalid("compile options must not be empty"));
            }
            a.overridden_serialized_compile_options = opts.as_ptr() as *const c_char;
            a.overridden_serialized_compile_options_size = opts.len();
        }
        call!(self.inner.api, PJRT_Executable_DeserializeAndLoad, &mut a)?;
        LoadedExecutable::wrap(&self.inner, a.loaded_executable)
    }
}

impl LoadedExecutable {
    fn wrap(client: &Arc<ClientInner>, raw: *mut ffi::PJRT_LoadedExecutable) -> Result<LoadedExecutable> {
        let mut exe = LoadedExecutable { raw, client: client.clone(), num_outputs: 0, devices: Vec::new() };
        let api = client.api;

        let mut a = ffi::PJRT_LoadedExecutable_AddressableDevices_Args::new();
        a.executable = raw;
        call!(api, PJRT_LoadedExecutable_AddressableDevices, &mut a)?;
        if !a.addressable_devices.is_null() {
            exe.devices =
                unsafe { std::slice::from_raw_parts(a.addressable_devices, a.num_addressable_devices) }.to_vec();
        }

        let inner = exe.executable()?;
        let mut a = ffi::PJRT_Executable_NumOutputs_Args::new();
        a.executable = inner.raw;
        call!(api, PJRT_Executable_NumOutputs, &mut a)?;
        drop(inner);
        exe.num_outputs = a.num_outputs;
        Ok(exe)
    }

    fn executable(&self) -> Result<ExecutableRef<'_>> {
        let mut a = ffi::PJRT_LoadedExecutable_GetExecutable_Args::new();
        a.loaded_executable = self.raw;
        call!(self.client.api, PJRT_LoadedExecutable_GetExecutable, &mut a)?;
        Ok(ExecutableRef { raw: a.executable, api: self.client.api })
    }

    /// Outputs per device.
    pub fn num_outputs(&self) -> usize {
        self.num_outputs
    }

    /// Devices the executable runs on (one per replica / partition; none for
    /// a portable executable).
    pub fn addressable_devices(&self) -> Vec<Device> {
        self.devices.iter().filter_map(|&d| self.client.device_for(d).ok()).collect()
    }

    /// Runs on one device and returns the outputs without waiting for them
    /// (use [`Buffer::ready`] or [`Buffer::to_host`] to synchronise).
    ///
    /// Donation: an input aliased to an output is consumed by the call (the
    /// `Buffer` stays valid to drop, `is_deleted()` becomes true, and using it
    /// again returns an error). Aliasing is expressed in the MLIR module with
    /// the argument attribute `tf.aliasing_output = <output index> : i32`, e.g.
    /// `func.func @main(%a: tensor<2xf32> {tf.aliasing_output = 0 : i32}) -> tensor<2xf32>`.
    pub fn execute(&self, args: &[&Buffer], device: &Device) -> Result<Vec<Buffer>> {
        let client = &self.client;
        // The usual case: a single-device executable run where it was
        // compiled. Leaving `execute_device` null avoids the portable path.
        let dev = device.raw();
        let execute_device = match self.devices.as_slice() {
            [only] if *only == dev => null_mut(),
            // Portable executables (no fixed device) run where they are told;
            // a fixed single-device one elsewhere gets the plugin's error.
            [] | [_] => dev,
            _ => return Err(self.multi_device_error()),
        };
        if !Arc::ptr_eq(&device.client, client) {
            return Err(Error::invalid("device belongs to another client"));
        }

        let mut in_stack = [null_mut(); STACK_LIST];
        let mut in_heap = Vec::new();
        let inputs: &mut [*mut ffi::PJRT_Buffer] = if args.len() <= STACK_LIST {
            &mut in_stack[..args.len()]
        } else {
            in_heap.resize(args.len(), null_mut());
            &mut in_heap
        };
        for (slot, b) in inputs.iter_mut().zip(args) {
            if !Arc::ptr_eq(&b.client, client) {
                return Err(Error::invalid("argument buffer belongs to another client"));
            }
            *slot = b.raw;
        }
        let n_out = self.num_outputs;
        let mut out_stack = [null_mut(); STACK_LIST];
        let mut out_heap = Vec::new();
        let outputs: &mut [*mut ffi::PJRT_Buffer] = if n_out <= STACK_LIST {
            &mut out_stack[..n_out]
        } else {
            out_heap.resize(n_out, null_mut());
            &mut out_heap
        };

        let arg_list: *const *mut ffi::PJRT_Buffer = inputs.as_ptr();
        let out_list: *mut *mut ffi::PJRT_Buffer = outputs.as_mut_ptr();
        let mut options = ffi::PJRT_ExecuteOptions::new();
        let mut a = ffi::PJRT_LoadedExecutable_Execute_Args::new();
        a.executable = self.raw;
        a.options = &mut options;
        a.argument_lists = &arg_list;
        a.num_devices = 1;
        a.num_args = inputs.len();
        a.output_lists = &out_list;
        a.execute_device = execute_device;
        call!(client.api, PJRT_LoadedExecutable_Execute, &mut a)?;

        let mut result = Vec::with_capacity(n_out);
        for &raw in outputs.iter() {
            result.push(Buffer { raw, client: client.clone() });
        }
        Ok(result)
    }

    #[cold]
    fn multi_device_error(&self) -> Error {
        Error::invalid(format!(
            "executable runs on {} devices; use execute_replicated",
            self.devices.len()
        ))
    }

    /// Runs a multi-device (replicated / SPMD) executable: `args[i]` are the
    /// arguments for `devices[i]`, which must be the executable's
    /// [`addressable_devices`](Self::addressable_devices) in that order.
    /// Returns `outputs[i]` for `devices[i]`, without waiting.
    pub fn execute_replicated(&self, args: &[Vec<&Buffer>], devices: &[Device]) -> Result<Vec<Vec<Buffer>>> {
        let client = &self.client;
        let n_dev = self.devices.len();
        if args.len() != n_dev || devices.len() != n_dev {
            return Err(Error::invalid(format!(
                "executable runs on {n_dev} devices; got {} argument lists and {} devices",
                args.len(),
                devices.len()
            )));
        }
        for (i, d) in devices.iter().enumerate() {
            if !Arc::ptr_eq(&d.client, client) || d.raw() != self.devices[i] {
                return Err(Error::invalid(format!(
                    "device {i} ({d:?}) is not the executable's device {i}; see addressable_devices()"
                )));
            }
        }
        let num_args = args.first().map_or(0, |a| a.len());
        let mut inputs: Vec<Vec<*mut ffi::PJRT_Buffer>> = Vec::with_capacity(n_dev);
        for list in args {
            if list.len() != num_args {
                return Err(Error::invalid("argument lists differ in length"));
            }
            if list.iter().any(|b| !Arc::ptr_eq(&b.client, client)) {
                return Err(Error::invalid("argument buffer belongs to another client"));
            }
            inputs.push(list.iter().map(|b| b.raw).collect());
        }
        let mut outputs: Vec<Vec<*mut ffi::PJRT_Buffer>> = vec![vec![null_mut(); self.num_outputs]; n_dev];
        let arg_lists: Vec<*const *mut ffi::PJRT_Buffer> = inputs.iter().map(|l| l.as_ptr()).collect();
        let out_lists: Vec<*mut *mut ffi::PJRT_Buffer> = outputs.iter_mut().map(|l| l.as_mut_ptr()).collect();

        let mut options = ffi::PJRT_ExecuteOptions::new();
        let mut a = ffi::PJRT_LoadedExecutable_Execute_Args::new();
        a.executable = self.raw;
        a.options = &mut options;
        a.argument_lists = arg_lists.as_ptr();
        a.num_devices = n_dev;
        a.num_args = num_args;
        a.output_lists = out_lists.as_ptr();
        call!(client.api, PJRT_LoadedExecutable_Execute, &mut a)?;

        Ok(outputs
            .into_iter()
            .map(|l| l.into_iter().map(|raw| Buffer { raw, client: client.clone() }).collect())
            .collect())
    }

    /// Plugin-specific bytes for [`Client::deserialize_executable`].
    pub fn serialize(&self) -> Result<Vec<u8>> {
        let exe = self.executable()?;
        let mut a = ffi::PJRT_Executable_Serialize_Args::new();
        a.executable = exe.raw;
        call!(self.client.api, PJRT_Executable_Serialize, &mut a)?;
        let bytes = if a.serialized_bytes.is_null() {
            Vec::new()
        } else {
            unsafe { std::slice::from_raw_parts(a.serialized_bytes as *const u8, a.serialized_bytes_size) }.to_vec()
        };
        if let Some(deleter) = a.serialized_executable_deleter {
            unsafe { deleter(a.serialized_executable) };
        }
        Ok(bytes)
    }

    /// A fingerprint identifying the compiled program, when the plugin has one.
    pub fn fingerprint(&self) -> Option<String> {
        let exe = self.executable().ok()?;
        let mut a = ffi::PJRT_Executable_Fingerprint_Args::new();
        a.executable = exe.raw;
        call!(self.client.api, PJRT_Executable_Fingerprint, &mut a).ok()?;
        if a.executable_fingerprint.is_null() {
            return None;
        }
        Some(unsafe { c_str(a.executable_fingerprint, a.executable_fingerprint_size) })
    }
}

impl std::fmt::Debug for LoadedExecutable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LoadedExecutable(outputs={}, devices={})", self.num_outputs, self.devices.len())
    }
}
