//! Hand-written `#[repr(C)]` declarations for the part of the PJRT C API this
//! crate uses.
//!
//! Written from reading `pjrt_c_api.h` (API 0.81, cross-checked against newer
//! revisions of the header). Only the structs and function-table entries we
//! call are declared; unused table entries are opaque placeholders that keep
//! the offsets right.
//!
//! Versioning rules we follow (see the header's own comments):
//! * Args structs only grow by appending fields. Each struct below lists every
//!   field up to the newest revision we know about, is zero-initialised, and
//!   its `struct_size` is set to "offset of last field + its size" (the C
//!   `PJRT_STRUCT_SIZE`). Plugins accept a larger struct than they know, and
//!   reject a smaller one.
//! * The `PJRT_Api` function table only grows at the end. [`Api::load`] copies
//!   at most the plugin's `struct_size` bytes into a zeroed table, and every
//!   call checks the entry is covered (see [`crate::call!`]).
#![allow(non_camel_case_types, non_snake_case, dead_code, clippy::new_without_default)]

use std::ffi::c_char;
use std::ffi::c_void;
use std::mem::{offset_of, size_of};

// ----------------------------------------------------------------- opaque types

macro_rules! opaque {
    ($($name:ident),*) => {$(
        #[repr(C)]
        pub struct $name { _private: [u8; 0] }
    )*};
}
opaque!(
    PJRT_Error,
    PJRT_Event,
    PJRT_Client,
    PJRT_Device,
    PJRT_DeviceDescription,
    PJRT_Memory,
    PJRT_Executable,
    PJRT_LoadedExecutable,
    PJRT_Buffer,
    PJRT_SerializedExecutable,
    PJRT_ExecuteContext,
    PJRT_Extension_Base,
    PJRT_Buffer_MemoryLayout,
    PJRT_MultiSlice_Config
);

/// Size of the field selected by `f`, without needing a value.
pub fn field_size<T, F>(_f: impl Fn(&T) -> &F) -> usize {
    size_of::<F>()
}

/// Declares an args struct: `struct_size` and `extension_start` come first in
/// every one of them; `new()` zero-fills it and sets `struct_size` to the end
/// of the last declared field.
macro_rules! args_struct {
    ($name:ident { $($field:ident : $ty:ty),+ $(,)? }) => {
        #[repr(C)]
        pub struct $name {
            pub struct_size: usize,
            pub extension_start: *mut PJRT_Extension_Base,
            $(pub $field: $ty),+
        }
        impl $name {
            #[inline(always)]
            pub fn new() -> Self {
                // SAFETY: every field is an integer, bool, raw pointer or
                // Option<fn>, all of which are valid when zeroed.
                let mut a: Self = unsafe { std::mem::zeroed() };
                a.struct_size = args_struct!(@size $name; $($field),+);
                a
            }
        }
    };
    (@size $name:ident; $first:ident $(, $rest:ident)+) => { args_struct!(@size $name; $($rest),+) };
    (@size $name:ident; $last:ident) => {
        offset_of!($name, $last) + field_size(|a: &$name| &a.$last)
    };
}

// C enums are `int` on every ABI we target.
pub type PJRT_Error_Code = i32;
pub type PJRT_Buffer_Type = i32;
pub type PJRT_NamedValue_Type = i32;
pub type PJRT_HostBufferSemantics = i32;

pub const NAMED_VALUE_STRING: PJRT_NamedValue_Type = 0;
pub const NAMED_VALUE_INT64: PJRT_NamedValue_Type = 1;
pub const NAMED_VALUE_INT64_LIST: PJRT_NamedValue_Type = 2;
pub const NAMED_VALUE_FLOAT: PJRT_NamedValue_Type = 3;
pub const NAMED_VALUE_BOOL: PJRT_NamedValue_Type = 4;

pub const HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL: PJRT_HostBufferSemantics = 0;
pub const HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES: PJRT_HostBufferSemantics = 1;

// ---------------------------------------------------------------------- errors

args_struct!(PJRT_Error_Destroy_Args { error: *mut PJRT_Error });
args_struct!(PJRT_Error_Message_Args {
    error: *const PJRT_Error,
    message: *const c_char,
    message_size: usize,
});
args_struct!(PJRT_Error_GetCode_Args {
    error: *const PJRT_Error,
    code: PJRT_Error_Code,
});

// ---------------------------------------------------------------- named values

#[repr(C)]
#[derive(Clone, Copy)]
pub union PJRT_NamedValue_Value {
    pub string_value: *const c_char,
    pub int64_value: i64,
    pub int64_array_value: *const i64,
    pub float_value: f32,
    pub bool_value: bool,
}

#[repr(C)]
pub struct PJRT_NamedValue {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub name: *const c_char,
    pub name_size: usize,
    pub type_: PJRT_NamedValue_Type,
    pub value: PJRT_NamedValue_Value,
    /// Number of elements for strings / lists, 1 for scalars.
    pub value_size: usize,
}
pub const PJRT_NAMED_VALUE_SIZE: usize =
    offset_of!(PJRT_NamedValue, value_size) + size_of::<usize>();

// ---------------------------------------------------------------------- plugin

args_struct!(PJRT_Plugin_Initialize_Args { _none: [u8; 0] });
args_struct!(PJRT_Plugin_Attributes_Args {
    attributes: *const PJRT_NamedValue,
    num_attributes: usize,
});

// ---------------------------------------------------------------------- events

args_struct!(PJRT_Event_Destroy_Args { event: *mut PJRT_Event });
args_struct!(PJRT_Event_IsReady_Args {
    event: *mut PJRT_Event,
    is_ready: bool,
});
args_struct!(PJRT_Event_Error_Args { event: *mut PJRT_Event });
args_struct!(PJRT_Event_Await_Args { event: *mut PJRT_Event });
/// Called once with the event's error (owned by the callee; null on success) and `user_arg`.
pub type OnReadyCallback = Option<unsafe extern "C" fn(*mut PJRT_Error, *mut c_void)>;
args_struct!(PJRT_Event_OnReady_Args {
    event: *mut PJRT_Event,
    callback: OnReadyCallback,
    user_arg: *mut c_void,
});

// ---------------------------------------------------------------------- client

pub type KvCallback = Option<unsafe extern "C" fn(*mut c_void) -> *mut PJRT_Error>;

args_struct!(PJRT_Client_Create_Args {
    create_options: *const PJRT_NamedValue,
    num_options: usize,
    kv_get_callback: KvCallback,
    kv_get_user_arg: *mut c_void,
    kv_put_callback: KvCallback,
    kv_put_user_arg: *mut c_void,
    client: *mut PJRT_Client,
    kv_try_get_callback: KvCallback,
    kv_try_get_user_arg: *mut c_void,
});
args_struct!(PJRT_Client_Destroy_Args { client: *mut PJRT_Client });
args_struct!(PJRT_Client_PlatformName_Args {
    client: *mut PJRT_Client,
    platform_name: *const c_char,
    platform_name_size: usize,
});
args_struct!(PJRT_Client_ProcessIndex_Args {
    client: *mut PJRT_Client,
    process_index: i32,
});
args_struct!(PJRT_Client_PlatformVersion_Args {
    client: *mut PJRT_Client,
    platform_version: *const c_char,
    platform_version_size: usize,
});
args_struct!(PJRT_Client_AddressableDevices_Args {
    client: *mut PJRT_Client,
    addressable_devices: *const *mut PJRT_Device,
    num_addressable_devices: usize,
});
args_struct!(PJRT_Program {
    code: *mut c_char,
    code_size: usize,
    format: *const c_char,
    format_size: usize,
});
args_struct!(PJRT_Client_Compile_Args {
    client: *mut PJRT_Client,
    program: *const PJRT_Program,
    compile_options: *const c_char,
    compile_options_size: usize,
    executable: *mut PJRT_LoadedExecutable,
});
args_struct!(PJRT_Client_BufferFromHostBuffer_Args {
    client: *mut PJRT_Client,
    data: *const c_void,
    type_: PJRT_Buffer_Type,
    dims: *const i64,
    num_dims: usize,
    byte_strides: *const i64,
    num_byte_strides: usize,
    host_buffer_semantics: PJRT_HostBufferSemantics,
    device: *mut PJRT_Device,
    memory: *mut PJRT_Memory,
    device_layout: *mut PJRT_Buffer_MemoryLayout,
    done_with_host_buffer: *mut PJRT_Event,
    buffer: *mut PJRT_Buffer,
});

// --------------------------------------------------------------------- devices

args_struct!(PJRT_DeviceDescription_Id_Args {
    device_description: *mut PJRT_DeviceDescription,
    id: i32,
});
args_struct!(PJRT_DeviceDescription_Attributes_Args {
    device_description: *mut PJRT_DeviceDescription,
    num_attributes: usize,
    attributes: *const PJRT_NamedValue,
});
args_struct!(PJRT_DeviceDescription_Kind_Args {
    device_description: *mut PJRT_DeviceDescription,
    device_kind: *const c_char,
    device_kind_size: usize,
});
args_struct!(PJRT_DeviceDescription_DebugString_Args {
    device_description: *mut PJRT_DeviceDescription,
    debug_string: *const c_char,
    debug_string_size: usize,
});
args_struct!(PJRT_Device_GetDescription_Args {
    device: *mut PJRT_Device,
    device_description: *mut PJRT_DeviceDescription,
});
args_struct!(PJRT_Device_LocalHardwareId_Args {
    device: *mut PJRT_Device,
    local_hardware_id: i32,
});
args_struct!(PJRT_Device_MemoryStats_Args {
    device: *mut PJRT_Device,
    bytes_in_use: i64,
    peak_bytes_in_use: i64,
    peak_bytes_in_use_is_set: bool,
    num_allocs: i64,
    num_allocs_is_set: bool,
    largest_alloc_size: i64,
    largest_alloc_size_is_set: bool,
    bytes_limit: i64,
    bytes_limit_is_set: bool,
    bytes_reserved: i64,
    bytes_reserved_is_set: bool,
    peak_bytes_reserved: i64,
    peak_bytes_reserved_is_set: bool,
    bytes_reservable_limit: i64,
    bytes_reservable_limit_is_set: bool,
    largest_free_block_bytes: i64,
    largest_free_block_bytes_is_set: bool,
    pool_bytes: i64,
    pool_bytes_is_set: bool,
    peak_pool_bytes: i64,
    peak_pool_bytes_is_set: bool,
});

// ----------------------------------------------------------------- executables

args_struct!(PJRT_Executable_Destroy_Args { executable: *mut PJRT_Executable });
args_struct!(PJRT_Executable_NumOutputs_Args {
    executable: *mut PJRT_Executable,
    num_outputs: usize,
});
args_struct!(PJRT_Executable_Fingerprint_Args {
    executable: *mut PJRT_Executable,
    executable_fingerprint: *const c_char,
    executable_fingerprint_size: usize,
});
args_struct!(PJRT_Executable_Serialize_Args {
    executable: *const PJRT_Executable,
    serialized_bytes: *const c_char,
    serialized_bytes_size: usize,
    serialized_executable: *mut PJRT_SerializedExecutable,
    serialized_executable_deleter: Option<unsafe extern "C" fn(*mut PJRT_SerializedExecutable)>,
});
args_struct!(PJRT_Executable_DeserializeAndLoad_Args {
    client: *mut PJRT_Client,
    serialized_executable: *const c_char,
    serialized_executable_size: usize,
    loaded_executable: *mut PJRT_LoadedExecutable,
    overridden_serialized_compile_options: *const c_char,
    overridden_serialized_compile_options_size: usize,
});
args_struct!(PJRT_LoadedExecutable_Destroy_Args {
    executable: *mut PJRT_LoadedExecutable,
});
args_struct!(PJRT_LoadedExecutable_GetExecutable_Args {
    loaded_executable: *mut PJRT_LoadedExecutable,
    executable: *mut PJRT_Executable,
});
args_struct!(PJRT_LoadedExecutable_AddressableDevices_Args {
    executable: *mut PJRT_LoadedExecutable,
    addressable_devices: *const *mut PJRT_Device,
    num_addressable_devices: usize,
});
args_struct!(PJRT_ExecuteOptions {
    send_callbacks: *mut *mut c_void,
    recv_callbacks: *mut *mut c_void,
    num_send_ops: usize,
    num_recv_ops: usize,
    launch_id: i32,
    non_donatable_input_indices: *const i64,
    num_non_donatable_input_indices: usize,
    context: *mut PJRT_ExecuteContext,
    call_location: *const c_char,
    num_tasks: usize,
    task_ids: *mut i32,
    incarnation_ids: *mut i64,
    // 0.97
    multi_slice_config: *mut PJRT_MultiSlice_Config,
});
args_struct!(PJRT_LoadedExecutable_Execute_Args {
    executable: *mut PJRT_LoadedExecutable,
    options: *mut PJRT_ExecuteOptions,
    argument_lists: *const *const *mut PJRT_Buffer,
    num_devices: usize,
    num_args: usize,
    output_lists: *const *mut *mut PJRT_Buffer,
    device_complete_events: *mut *mut PJRT_Event,
    execute_device: *mut PJRT_Device,
});

// --------------------------------------------------------------------- buffers

args_struct!(PJRT_Buffer_Destroy_Args { buffer: *mut PJRT_Buffer });
args_struct!(PJRT_Buffer_ElementType_Args {
    buffer: *mut PJRT_Buffer,
    type_: PJRT_Buffer_Type,
});
args_struct!(PJRT_Buffer_Dimensions_Args {
    buffer: *mut PJRT_Buffer,
    dims: *const i64,
    num_dims: usize,
});
args_struct!(PJRT_Buffer_OnDeviceSizeInBytes_Args {
    buffer: *mut PJRT_Buffer,
    on_device_size_in_bytes: usize,
});
args_struct!(PJRT_Buffer_Device_Args {
    buffer: *mut PJRT_Buffer,
    device: *mut PJRT_Device,
});
args_struct!(PJRT_Buffer_Delete_Args { buffer: *mut PJRT_Buffer });
args_struct!(PJRT_Buffer_IsDeleted_Args {
    buffer: *mut PJRT_Buffer,
    is_deleted: bool,
});
args_struct!(PJRT_Buffer_ToHostBuffer_Args {
    src: *mut PJRT_Buffer,
    host_layout: *mut PJRT_Buffer_MemoryLayout,
    dst: *mut c_void,
    dst_size: usize,
    event: *mut PJRT_Event,
});
args_struct!(PJRT_Buffer_ReadyEvent_Args {
    buffer: *mut PJRT_Buffer,
    event: *mut PJRT_Event,
});
args_struct!(PJRT_Buffer_UnsafePointer_Args {
    buffer: *mut PJRT_Buffer,
    buffer_pointer: usize,
});

// ------------------------------------------------------------------- extensions

/// `PJRT_Extension_Base`'s fields: each extension struct starts with them.
#[repr(C)]
pub struct ExtensionHeader {
    pub struct_size: usize,
    pub kind: i32,
    pub next: *const ExtensionHeader,
}

/// `PJRT_Extension_Type_FFI`.
pub const EXTENSION_TYPE_FFI: i32 = 5;
/// The first PJRT API minor version whose FFI registration args we know (see below).
pub const FFI_REGISTER_MIN_MINOR: i32 = 81;

/// The plugin's extension of type `kind`, or null.
///
/// # Safety
/// `api` must be a plugin's table, whose extension chain lives as long as the plugin.
pub unsafe fn find_extension(api: &Api, kind: i32) -> *const ExtensionHeader {
    let mut ext = api.extension_start as *const ExtensionHeader;
    while !ext.is_null() && (*ext).kind != kind {
        ext = (*ext).next;
    }
    ext
}

#[repr(C)]
pub struct PJRT_FFI_Extension {
    pub base: ExtensionHeader,
    pub type_id_register: Unused,
    pub user_data_add: Unused,
    pub register_handler: F<PJRT_FFI_Register_Handler_Args>,
}

/// As plugins of PJRT API 0.81 and later read it (seen in their code; earlier headers had an
/// `api_version` int before `handler`). Unlike the other args structs, no `extension_start`.
#[repr(C)]
pub struct PJRT_FFI_Register_Handler_Args {
    pub struct_size: usize,
    pub target_name: *const c_char,
    pub target_name_size: usize,
    /// A typed XLA FFI handler (`XLA_FFI_Handler*`).
    pub handler: *mut c_void,
    pub platform_name: *const c_char,
    pub platform_name_size: usize,
    pub traits: u32,
}

// --------------------------------------------------------------- function table

#[repr(C)]
#[derive(Clone, Copy)]
pub struct PJRT_Api_Version {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub major_version: i32,
    pub minor_version: i32,
}

type F<A> = Option<unsafe extern "C" fn(*mut A) -> *mut PJRT_Error>;
/// A table entry we never call: only its size matters.
type Unused = Option<unsafe extern "C" fn()>;

/// The prefix of `PJRT_Api` up to the last entry this crate calls.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Api {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub pjrt_api_version: PJRT_Api_Version,

    pub PJRT_Error_Destroy: Option<unsafe extern "C" fn(*mut PJRT_Error_Destroy_Args)>,
    pub PJRT_Error_Message: Option<unsafe extern "C" fn(*mut PJRT_Error_Message_Args)>,
    pub PJRT_Error_GetCode: F<PJRT_Error_GetCode_Args>,

    pub PJRT_Plugin_Initialize: F<PJRT_Plugin_Initialize_Args>,
    pub PJRT_Plugin_Attributes: F<PJRT_Plugin_Attributes_Args>,

    pub PJRT_Event_Destroy: F<PJRT_Event_Destroy_Args>,
    pub PJRT_Event_IsReady: F<PJRT_Event_IsReady_Args>,
    pub PJRT_Event_Error: F<PJRT_Event_Error_Args>,
    pub PJRT_Event_Await: F<PJRT_Event_Await_Args>,
    pub PJRT_Event_OnReady: F<PJRT_Event_OnReady_Args>,

    pub PJRT_Client_Create: F<PJRT_Client_Create_Args>,
    pub PJRT_Client_Destroy: F<PJRT_Client_Destroy_Args>,
    pub PJRT_Client_PlatformName: F<PJRT_Client_PlatformName_Args>,
    pub PJRT_Client_ProcessIndex: F<PJRT_Client_ProcessIndex_Args>,
    pub PJRT_Client_PlatformVersion: F<PJRT_Client_PlatformVersion_Args>,
    pub PJRT_Client_Devices: Unused,
    pub PJRT_Client_AddressableDevices: F<PJRT_Client_AddressableDevices_Args>,
    pub PJRT_Client_LookupDevice: Unused,
    pub PJRT_Client_LookupAddressableDevice: Unused,
    pub PJRT_Client_AddressableMemories: Unused,
    pub PJRT_Client_Compile: F<PJRT_Client_Compile_Args>,
    pub PJRT_Client_DefaultDeviceAssignment: Unused,
    pub PJRT_Client_BufferFromHostBuffer: F<PJRT_Client_BufferFromHostBuffer_Args>,

    pub PJRT_DeviceDescription_Id: F<PJRT_DeviceDescription_Id_Args>,
    pub PJRT_DeviceDescription_ProcessIndex: Unused,
    pub PJRT_DeviceDescription_Attributes: F<PJRT_DeviceDescription_Attributes_Args>,
    pub PJRT_DeviceDescription_Kind: F<PJRT_DeviceDescription_Kind_Args>,
    pub PJRT_DeviceDescription_DebugString: F<PJRT_DeviceDescription_DebugString_Args>,
    pub PJRT_DeviceDescription_ToString: Unused,

    pub PJRT_Device_GetDescription: F<PJRT_Device_GetDescription_Args>,
    pub PJRT_Device_IsAddressable: Unused,
    pub PJRT_Device_LocalHardwareId: F<PJRT_Device_LocalHardwareId_Args>,
    pub PJRT_Device_AddressableMemories: Unused,
    pub PJRT_Device_DefaultMemory: Unused,
    pub PJRT_Device_MemoryStats: F<PJRT_Device_MemoryStats_Args>,

    pub PJRT_Memory_Id: Unused,
    pub PJRT_Memory_Kind: Unused,
    pub PJRT_Memory_DebugString: Unused,
    pub PJRT_Memory_ToString: Unused,
    pub PJRT_Memory_AddressableByDevices: Unused,

    pub PJRT_Executable_Destroy: F<PJRT_Executable_Destroy_Args>,
    pub PJRT_Executable_Name: Unused,
    pub PJRT_Executable_NumReplicas: Unused,
    pub PJRT_Executable_NumPartitions: Unused,
    pub PJRT_Executable_NumOutputs: F<PJRT_Executable_NumOutputs_Args>,
    pub PJRT_Executable_SizeOfGeneratedCodeInBytes: Unused,
    pub PJRT_Executable_GetCostAnalysis: Unused,
    pub PJRT_Executable_OutputMemoryKinds: Unused,
    pub PJRT_Executable_OptimizedProgram: Unused,
    pub PJRT_Executable_Serialize: F<PJRT_Executable_Serialize_Args>,

    pub PJRT_LoadedExecutable_Destroy: F<PJRT_LoadedExecutable_Destroy_Args>,
    pub PJRT_LoadedExecutable_GetExecutable: F<PJRT_LoadedExecutable_GetExecutable_Args>,
    pub PJRT_LoadedExecutable_AddressableDevices: F<PJRT_LoadedExecutable_AddressableDevices_Args>,
    pub PJRT_LoadedExecutable_Delete: Unused,
    pub PJRT_LoadedExecutable_IsDeleted: Unused,
    pub PJRT_LoadedExecutable_Execute: F<PJRT_LoadedExecutable_Execute_Args>,
    pub PJRT_Executable_DeserializeAndLoad: F<PJRT_Executable_DeserializeAndLoad_Args>,
    pub PJRT_LoadedExecutable_Fingerprint: Unused,

    pub PJRT_Buffer_Destroy: F<PJRT_Buffer_Destroy_Args>,
    pub PJRT_Buffer_ElementType: F<PJRT_Buffer_ElementType_Args>,
    pub PJRT_Buffer_Dimensions: F<PJRT_Buffer_Dimensions_Args>,
    pub PJRT_Buffer_UnpaddedDimensions: Unused,
    pub PJRT_Buffer_DynamicDimensionIndices: Unused,
    pub PJRT_Buffer_GetMemoryLayout: Unused,
    pub PJRT_Buffer_OnDeviceSizeInBytes: F<PJRT_Buffer_OnDeviceSizeInBytes_Args>,
    pub PJRT_Buffer_Device: F<PJRT_Buffer_Device_Args>,
    pub PJRT_Buffer_Memory: Unused,
    pub PJRT_Buffer_Delete: F<PJRT_Buffer_Delete_Args>,
    pub PJRT_Buffer_IsDeleted: F<PJRT_Buffer_IsDeleted_Args>,
    pub PJRT_Buffer_CopyToDevice: Unused,
    pub PJRT_Buffer_ToHostBuffer: F<PJRT_Buffer_ToHostBuffer_Args>,
    pub PJRT_Buffer_IsOnCpu: Unused,
    pub PJRT_Buffer_ReadyEvent: F<PJRT_Buffer_ReadyEvent_Args>,
    pub PJRT_Buffer_UnsafePointer: F<PJRT_Buffer_UnsafePointer_Args>,
    pub PJRT_Buffer_IncreaseExternalReferenceCount: Unused,
    pub PJRT_Buffer_DecreaseExternalReferenceCount: Unused,
    pub PJRT_Buffer_OpaqueDeviceMemoryDataPointer: Unused,

    pub PJRT_CopyToDeviceStream_Destroy: Unused,
    pub PJRT_CopyToDeviceStream_AddChunk: Unused,
    pub PJRT_CopyToDeviceStream_TotalBytes: Unused,
    pub PJRT_CopyToDeviceStream_GranuleSize: Unused,
    pub PJRT_CopyToDeviceStream_CurrentBytes: Unused,

    pub PJRT_TopologyDescription_Create: Unused,
    pub PJRT_TopologyDescription_Destroy: Unused,
    pub PJRT_TopologyDescription_PlatformName: Unused,
    pub PJRT_TopologyDescription_PlatformVersion: Unused,
    pub PJRT_TopologyDescription_GetDeviceDescriptions: Unused,
    pub PJRT_TopologyDescription_Serialize: Unused,
    pub PJRT_TopologyDescription_Attributes: Unused,

    pub PJRT_Compile: Unused,

    // Entries appended after the table was first laid out.
    pub PJRT_Executable_OutputElementTypes: Unused,
    pub PJRT_Executable_OutputDimensions: Unused,
    pub PJRT_Buffer_CopyToMemory: Unused,
    pub PJRT_Client_CreateViewOfDeviceBuffer: Unused,
    pub PJRT_Executable_Fingerprint: F<PJRT_Executable_Fingerprint_Args>,
}

// The table only holds plain function pointers into a plugin we never unload.
unsafe impl Send for Api {}
unsafe impl Sync for Api {}

impl Api {
    /// Copies the plugin's table. Entries beyond the plugin's `struct_size`
    /// stay `None`, so a newer crate never reads past an older plugin's table.
    ///
    /// # Safety
    /// `raw` must point to a live `PJRT_Api` whose first field is its size.
    pub unsafe fn load(raw: *const u8) -> Api {
        let plugin_size = std::ptr::read_unaligned(raw as *const usize);
        let mut api: Api = std::mem::zeroed();
        let n = plugin_size.min(size_of::<Api>());
        std::ptr::copy_nonoverlapping(raw, &mut api as *mut Api as *mut u8, n);
        api.struct_size = plugin_size;
        api
    }

    /// Whether the plugin's table is large enough to hold the entry at `offset`.
    #[inline(always)]
    pub fn covers(&self, offset: usize) -> bool {
        offset + size_of::<usize>() <= self.struct_size
    }
}

/// Calls a function-table entry, turning a returned `PJRT_Error` into
/// `Err`, and a missing entry (table too short, or null) into an
/// `UNIMPLEMENTED` error naming the function. In a process forked after a
/// client started, nothing is called (see `crate::forked`).
#[macro_export]
#[doc(hidden)]
macro_rules! call {
    ($api:expr, $name:ident, $args:expr) => {{
        let api: &$crate::ffi::Api = $api;
        match api.$name {
            _ if $crate::forked() => Err($crate::Error::forked()),
            Some(f) if api.covers(::std::mem::offset_of!($crate::ffi::Api, $name)) => {
                #[allow(unused_unsafe)]
                let err = unsafe { f($args) };
                #[allow(unused_unsafe)]
                unsafe {
                    $crate::error::take_error(api, err)
                }
            }
            _ => Err($crate::Error::missing(stringify!($name))),
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes and offsets as a C compiler computes them from `pjrt_c_api.h`
    /// (0.81; `PJRT_ExecuteOptions` has the 0.97 field on top).
    #[test]
    fn layout_matches_the_c_header() {
        assert_eq!(PJRT_NAMED_VALUE_SIZE, 56);
        assert_eq!(PJRT_Client_Create_Args::new().struct_size, 88);
        assert_eq!(PJRT_Client_BufferFromHostBuffer_Args::new().struct_size, 120);
        assert_eq!(PJRT_Device_MemoryStats_Args::new().struct_size, 185);
        assert_eq!(PJRT_DeviceDescription_Attributes_Args::new().struct_size, 40);
        assert_eq!(PJRT_ExecuteOptions::new().struct_size, 112 + 8);
        assert_eq!(PJRT_LoadedExecutable_Execute_Args::new().struct_size, 80);
        assert_eq!(PJRT_Event_IsReady_Args::new().struct_size, 25);
        assert_eq!(PJRT_Plugin_Initialize_Args::new().struct_size, 16);
        assert_eq!(offset_of!(Api, PJRT_Error_Destroy), 40);
        assert_eq!(offset_of!(Api, PJRT_Client_Create), 120);
        assert_eq!(offset_of!(Api, PJRT_Client_BufferFromHostBuffer), 216);
        assert_eq!(offset_of!(Api, PJRT_LoadedExecutable_Execute), 480);
        assert_eq!(offset_of!(Api, PJRT_Buffer_ToHostBuffer), 600);
        assert_eq!(offset_of!(Api, PJRT_Executable_Fingerprint), 792);
    }

    /// A table shorter than an entry's offset makes calls to it fail cleanly.
    #[test]
    fn short_table_reports_missing_function() {
        unsafe extern "C" fn fake(_: *mut PJRT_Executable_Fingerprint_Args) -> *mut PJRT_Error {
            std::ptr::null_mut()
        }
        let mut api: Api = unsafe { std::mem::zeroed() };
        api.PJRT_Executable_Fingerprint = Some(fake);
        api.struct_size = offset_of!(Api, PJRT_Executable_Fingerprint);
        let mut a = PJRT_Executable_Fingerprint_Args::new();
        let err = crate::call!(&api, PJRT_Executable_Fingerprint, &mut a).unwrap_err();
        assert_eq!(err.code, crate::error::code::UNIMPLEMENTED);
        assert!(err.message.contains("PJRT_Executable_Fingerprint"), "{}", err.message);
        api.struct_size += 8;
        assert!(crate::call!(&api, PJRT_Executable_Fingerprint, &mut a).is_ok());
    }
}
