//! Plugin loading, clients and devices.

use crate::call;
use crate::error::{c_str, code, take_error, Error, Result};
use crate::ffi;
use std::ffi::c_char;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A typed value for plugin attributes and client-create options.
#[derive(Clone, Debug, PartialEq)]
pub enum NamedValue {
    Str(String),
    I64(i64),
    I64List(Vec<i64>),
    F32(f32),
    Bool(bool),
}

impl NamedValue {
    /// # Safety
    /// `v` must be a valid named value whose pointers are live.
    unsafe fn from_c(v: &ffi::PJRT_NamedValue) -> Option<(String, NamedValue)> {
        let name = c_str(v.name, v.name_size);
        let value = match v.type_ {
            ffi::NAMED_VALUE_STRING => NamedValue::Str(c_str(v.value.string_value, v.value_size)),
            ffi::NAMED_VALUE_INT64 => NamedValue::I64(v.value.int64_value),
            ffi::NAMED_VALUE_INT64_LIST => {
                let p = v.value.int64_array_value;
                if p.is_null() || v.value_size == 0 {
                    NamedValue::I64List(Vec::new())
                } else {
                    NamedValue::I64List(std::slice::from_raw_parts(p, v.value_size).to_vec())
                }
            }
            ffi::NAMED_VALUE_FLOAT => NamedValue::F32(v.value.float_value),
            ffi::NAMED_VALUE_BOOL => NamedValue::Bool(v.value.bool_value),
            _ => return None,
        };
        Some((name, value))
    }

    /// C view of `(name, self)`; borrows both, so keep them alive for the call.
    fn to_c(name: &str, value: &NamedValue) -> ffi::PJRT_NamedValue {
        let (type_, v, value_size) = match value {
            NamedValue::Str(s) => (
                ffi::NAMED_VALUE_STRING,
                ffi::PJRT_NamedValue_Value { string_value: s.as_ptr() as *const c_char },
                s.len(),
            ),
            NamedValue::I64(i) => (ffi::NAMED_VALUE_INT64, ffi::PJRT_NamedValue_Value { int64_value: *i }, 1),
            NamedValue::I64List(l) => (
                ffi::NAMED_VALUE_INT64_LIST,
                ffi::PJRT_NamedValue_Value { int64_array_value: l.as_ptr() },
                l.len(),
            ),
            NamedValue::F32(f) => (ffi::NAMED_VALUE_FLOAT, ffi::PJRT_NamedValue_Value { float_value: *f }, 1),
            NamedValue::Bool(b) => (ffi::NAMED_VALUE_BOOL, ffi::PJRT_NamedValue_Value { bool_value: *b }, 1),
        };
        ffi::PJRT_NamedValue {
            struct_size: ffi::PJRT_NAMED_VALUE_SIZE,
            extension_start: std::ptr::null_mut(),
            name: name.as_ptr() as *const c_char,
            name_size: name.len(),
            type_,
            value: v,
            value_size,
        }
    }
}

// ---------------------------------------------------------------------- Plugin

/// A loaded PJRT plugin. Loading the same file twice returns the same
/// `Arc<Plugin>`: `PJRT_Plugin_Initialize` runs once per plugin, and the
/// library is never unloaded (plugins do not support `dlclose`).
pub struct Plugin {
    pub(crate) api: &'static ffi::Api,
    path: PathBuf,
}

static PLUGINS: Mutex<Vec<Arc<Plugin>>> = Mutex::new(Vec::new());

impl Plugin {
    /// Loads the plugin `.so` at `path`, checks its API version and
    /// initializes it.
    pub fn load(path: impl AsRef<Path>) -> Result<Arc<Plugin>> {
        let path = path.as_ref();
        let path = path.canonicalize().map_err(|e| {
            Error::new(code::NOT_FOUND, format!("PJRT plugin {}: {e}", path.display()))
        })?;
        let mut plugins = PLUGINS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = plugins.iter().find(|p| p.path == path) {
            return Ok(p.clone());
        }

        let fail = |msg: String| Error::new(code::FAILED_PRECONDITION, msg);
        // SAFETY: loading a PJRT plugin runs its initialisers; that is the point.
        let lib = unsafe { libloading::Library::new(&path) }
            .map_err(|e| fail(format!("cannot load PJRT plugin {}: {e}", path.display())))?;
        let raw = unsafe {
            let get: libloading::Symbol<unsafe extern "C" fn() -> *const u8> = lib
                .get(b"GetPjrtApi\0")
                .map_err(|e| fail(format!("{} has no GetPjrtApi: {e}", path.display())))?;
            get()
        };
        if raw.is_null() {
            return Err(fail(format!("GetPjrtApi of {} returned null", path.display())));
        }
        // SAFETY: GetPjrtApi returns a table that lives as long as the library,
        // which we leak below.
        let api: &'static ffi::Api = Box::leak(Box::new(unsafe { ffi::Api::load(raw) }));
        let major = api.pjrt_api_version.major_version;
        if major != 0 {
            return Err(fail(format!(
                "{} has PJRT API major version {major}; this crate speaks 0.x",
                path.display()
            )));
        }
        let mut init = ffi::PJRT_Plugin_Initialize_Args::new();
        call!(api, PJRT_Plugin_Initialize, &mut init)?;
        // Never dlclose: plugins keep threads and static state alive.
        std::mem::forget(lib);

        let plugin = Arc::new(Plugin { api, path });
        plugins.push(plugin.clone());
        Ok(plugin)
    }

    /// `(major, minor)` of the PJRT C API the plugin was built with.
    pub fn api_version(&self) -> (i32, i32) {
        let v = &self.api.pjrt_api_version;
        (v.major_version, v.minor_version)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Registers `handler` as the typed XLA FFI custom-call target `target` for `platform`
    /// (as XLA names it: "cpu", "cuda"), through the plugin's FFI extension. UNIMPLEMENTED
    /// where the plugin has none, or is older than PJRT API 0.81 (another args layout).
    pub fn register_ffi_handler(&self, target: &str, platform: &str, handler: crate::xla_ffi::Handler) -> Result<()> {
        let unsupported = || Error::new(code::UNIMPLEMENTED, format!("{} has no FFI extension this crate speaks", self.path.display()));
        if self.api_version().1 < ffi::FFI_REGISTER_MIN_MINOR {
            return Err(unsupported());
        }
        // SAFETY: the extension chain lives as long as the plugin, which is never unloaded.
        let ext = unsafe { ffi::find_extension(self.api, ffi::EXTENSION_TYPE_FFI).cast::<ffi::PJRT_FFI_Extension>().as_ref() };
        let register = ext
            .filter(|e| e.base.struct_size >= std::mem::size_of::<ffi::PJRT_FFI_Extension>())
            .and_then(|e| e.register_handler)
            .ok_or_else(unsupported)?;
        let mut a = ffi::PJRT_FFI_Register_Handler_Args {
            struct_size: std::mem::size_of::<ffi::PJRT_FFI_Register_Handler_Args>(),
            target_name: target.as_ptr() as *const c_char,
            target_name_size: target.len(),
            handler: handler as *mut std::ffi::c_void,
            platform_name: platform.as_ptr() as *const c_char,
            platform_name_size: platform.len(),
            traits: 0,
        };
        // SAFETY: the args outlive the call; the plugin copies the names.
        unsafe { take_error(self.api, register(&mut a)) }
    }

    /// Plugin attributes such as `xla_version` or `stablehlo_current_version`;
    /// empty when the plugin does not report any.
    pub fn attributes(&self) -> Vec<(String, NamedValue)> {
        let mut a = ffi::PJRT_Plugin_Attributes_Args::new();
        if call!(self.api, PJRT_Plugin_Attributes, &mut a).is_err() || a.attributes.is_null() {
            return Vec::new();
        }
        // SAFETY: the attributes live as long as the process.
        unsafe {
            std::slice::from_raw_parts(a.attributes, a.num_attributes)
                .iter()
                .filter_map(|v| NamedValue::from_c(v))
                .collect()
        }
    }
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (major, minor) = self.api_version();
        write!(f, "Plugin({}, API {major}.{minor})", self.path.display())
    }
}

// ---------------------------------------------------------------------- Client

pub(crate) struct DeviceInfo {
    pub(crate) raw: *mut ffi::PJRT_Device,
    id: i32,
    local_hardware_id: i32,
    kind: String,
    debug_string: String,
    attributes: Vec<(String, NamedValue)>,
}

/// Shared by the client and everything made from it (devices, buffers,
/// executables), so the C client is destroyed only after all of them.
pub(crate) struct ClientInner {
    pub(crate) api: &'static ffi::Api,
    pub(crate) raw: *mut ffi::PJRT_Client,
    plugin: Arc<Plugin>,
    platform_name: String,
    platform_version: String,
    process_index: i32,
    pub(crate) devices: Vec<DeviceInfo>,
}

// PJRT clients, devices, buffers and executables are thread-safe.
unsafe impl Send for ClientInner {}
unsafe impl Sync for ClientInner {}

impl Drop for ClientInner {
    fn drop(&mut self) {
        let mut a = ffi::PJRT_Client_Destroy_Args::new();
        a.client = self.raw;
        let _ = call!(self.api, PJRT_Client_Destroy, &mut a);
    }
}

impl ClientInner {
    pub(crate) fn device_for(self: &Arc<Self>, raw: *mut ffi::PJRT_Device) -> Result<Device> {
        match self.devices.iter().position(|d| d.raw == raw) {
            Some(index) => Ok(Device { client: self.clone(), index }),
            None => Err(Error::new(code::NOT_FOUND, "device is not addressable by this client")),
        }
    }
}

/// A PJRT client: owns the devices and creates buffers and executables.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

impl Client {
    /// Creates a client. `options` are plugin-specific, e.g.
    /// `("cpu_device_count", NamedValue::I64(2))` for the CPU plugin.
    pub fn new(plugin: &Arc<Plugin>, options: &[(&str, NamedValue)]) -> Result<Client> {
        let api = plugin.api;
        let c_options: Vec<ffi::PJRT_NamedValue> =
            options.iter().map(|(n, v)| NamedValue::to_c(n, v)).collect();
        let mut a = ffi::PJRT_Client_Create_Args::new();
        a.create_options = c_options.as_ptr();
        a.num_options = c_options.len();
        call!(api, PJRT_Client_Create, &mut a)?;
        let mut inner = ClientInner {
            api,
            raw: a.client,
            plugin: plugin.clone(),
            platform_name: String::new(),
            platform_version: String::new(),
            process_index: 0,
            devices: Vec::new(),
        };
        // From here on `inner` destroys the client if anything fails.

        let mut a = ffi::PJRT_Client_PlatformName_Args::new();
        a.client = inner.raw;
        call!(api, PJRT_Client_PlatformName, &mut a)?;
        inner.platform_name = unsafe { c_str(a.platform_name, a.platform_name_size) };

        let mut a = ffi::PJRT_Client_PlatformVersion_Args::new();
        a.client = inner.raw;
        call!(api, PJRT_Client_PlatformVersion, &mut a)?;
        inner.platform_version = unsafe { c_str(a.platform_version, a.platform_version_size) };

        let mut a = ffi::PJRT_Client_ProcessIndex_Args::new();
        a.client = inner.raw;
        call!(api, PJRT_Client_ProcessIndex, &mut a)?;
        inner.process_index = a.process_index;

        let mut a = ffi::PJRT_Client_AddressableDevices_Args::new();
        a.client = inner.raw;
        call!(api, PJRT_Client_AddressableDevices, &mut a)?;
        let raws: Vec<*mut ffi::PJRT_Device> = if a.addressable_devices.is_null() {
            Vec::new()
        } else {
            unsafe { std::slice::from_raw_parts(a.addressable_devices, a.num_addressable_devices) }
                .to_vec()
        };
        for raw in raws {
            inner.devices.push(device_info(api, raw)?);
        }
        Ok(Client { inner: Arc::new(inner) })
    }

    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.inner.plugin
    }

    /// E.g. "cpu", "cuda".
    pub fn platform_name(&self) -> &str {
        &self.inner.platform_name
    }

    pub fn platform_version(&self) -> &str {
        &self.inner.platform_version
    }

    pub fn process_index(&self) -> i32 {
        self.inner.process_index
    }

    /// Devices this client can run on, in the plugin's order.
    pub fn addressable_devices(&self) -> Vec<Device> {
        (0..self.inner.devices.len())
            .map(|index| Device { client: self.inner.clone(), index })
            .collect()
    }
}

fn device_info(api: &'static ffi::Api, raw: *mut ffi::PJRT_Device) -> Result<DeviceInfo> {
    let mut a = ffi::PJRT_Device_GetDescription_Args::new();
    a.device = raw;
    call!(api, PJRT_Device_GetDescription, &mut a)?;
    let desc = a.device_description;

    let mut a = ffi::PJRT_DeviceDescription_Id_Args::new();
    a.device_description = desc;
    call!(api, PJRT_DeviceDescription_Id, &mut a)?;
    let id = a.id;

    let mut a = ffi::PJRT_DeviceDescription_Kind_Args::new();
    a.device_description = desc;
    call!(api, PJRT_DeviceDescription_Kind, &mut a)?;
    let kind = unsafe { c_str(a.device_kind, a.device_kind_size) };

    let mut a = ffi::PJRT_DeviceDescription_DebugString_Args::new();
    a.device_description = desc;
    call!(api, PJRT_DeviceDescription_DebugString, &mut a)?;
    let debug_string = unsafe { c_str(a.debug_string, a.debug_string_size) };

    // Plugin-specific facts (a GPU's "core_count", "compute_capability", ...); none is required.
    let mut a = ffi::PJRT_DeviceDescription_Attributes_Args::new();
    a.device_description = desc;
    let attributes = match call!(api, PJRT_DeviceDescription_Attributes, &mut a) {
        Ok(()) if !a.attributes.is_null() => {
            // SAFETY: the plugin owns the attributes for the description's lifetime.
            unsafe { std::slice::from_raw_parts(a.attributes, a.num_attributes).iter().filter_map(|v| NamedValue::from_c(v)).collect() }
        }
        _ => Vec::new(),
    };

    let mut a = ffi::PJRT_Device_LocalHardwareId_Args::new();
    a.device = raw;
    call!(api, PJRT_Device_LocalHardwareId, &mut a)?;
    Ok(DeviceInfo { raw, id, local_hardware_id: a.local_hardware_id, kind, debug_string, attributes })
}

// ---------------------------------------------------------------------- Device

/// An addressable device of a client. Cheap to clone (it shares the client);
/// the properties are read once when the client is created.
#[derive(Clone)]
pub struct Device {
    pub(crate) client: Arc<ClientInner>,
    pub(crate) index: usize,
}

/// Allocator statistics; `None` fields were not reported by the plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryStats {
    pub bytes_in_use: i64,
    pub peak_bytes_in_use: Option<i64>,
    pub bytes_limit: Option<i64>,
    /// What the allocator holds from the device (its pool), free or not, and its peak.
    pub pool_bytes: Option<i64>,
    pub peak_pool_bytes: Option<i64>,
}

impl Device {
    fn info(&self) -> &DeviceInfo {
        &self.client.devices[self.index]
    }

    #[inline(always)]
    pub(crate) fn raw(&self) -> *mut ffi::PJRT_Device {
        self.client.devices[self.index].raw
    }

    /// Global device id.
    pub fn id(&self) -> i32 {
        self.info().id
    }

    /// Opaque hardware id (e.g. CUDA ordinal), -1 if undefined.
    pub fn local_hardware_id(&self) -> i32 {
        self.info().local_hardware_id
    }

    /// The plugin's named facts about the device (empty where it reports none).
    pub fn attributes(&self) -> &[(String, NamedValue)] {
        &self.info().attributes
    }

    /// Vendor string for the kind of device, e.g. "cpu".
    pub fn kind(&self) -> &str {
        &self.info().kind
    }

    pub fn debug_string(&self) -> &str {
        &self.info().debug_string
    }

    /// Allocator statistics, or `Ok(None)` when the plugin does not provide
    /// them (entry missing or `UNIMPLEMENTED`).
    pub fn memory_stats(&self) -> Result<Option<MemoryStats>> {
        let api = self.client.api;
        let mut a = ffi::PJRT_Device_MemoryStats_Args::new();
        a.device = self.raw();
        match call!(api, PJRT_Device_MemoryStats, &mut a) {
            Ok(()) => Ok(Some(MemoryStats {
                bytes_in_use: a.bytes_in_use,
                peak_bytes_in_use: a.peak_bytes_in_use_is_set.then_some(a.peak_bytes_in_use),
                bytes_limit: a.bytes_limit_is_set.then_some(a.bytes_limit),
                pool_bytes: a.pool_bytes_is_set.then_some(a.pool_bytes),
                peak_pool_bytes: a.peak_pool_bytes_is_set.then_some(a.peak_pool_bytes),
            })),
            Err(e) if e.code == code::UNIMPLEMENTED => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Device) -> bool {
        self.raw() == other.raw()
    }
}
impl Eq for Device {}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device(id={}, kind={})", self.id(), self.kind())
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Client({}, {} devices)", self.platform_name(), self.inner.devices.len())
    }
}
