//! A small, safe layer over XLA's PJRT C API.
//!
//! The plugin (`.so`) is loaded at run time with `libloading`; nothing links
//! against XLA. The C declarations in [`ffi`] are written by hand for the
//! functions used here, and stay compatible with plugins built against newer
//! API versions (args structs and the function table only grow at the end).
//!
//! ```no_run
//! use pjrt::*;
//! let plugin = Plugin::load("/path/to/pjrt_c_api_cpu_plugin.so")?;
//! let client = Client::new(&plugin, &[])?;
//! let dev = &client.addressable_devices()[0];
//! let exe = client.compile(
//!     "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
//!        %0 = stablehlo.add %a, %a : tensor<2xf32>
//!        return %0 : tensor<2xf32>
//!      }",
//!     &compile_options_proto(1, 1),
//! )?;
//! let x = client.buffer_from_host(&[0u8; 8], ElementType::F32, &[2], None, dev)?;
//! let out = exe.execute(&[&x], dev)?;
//! let mut host = [0u8; 8];
//! out[0].to_host(&mut host)?;
//! # Ok::<(), pjrt::Error>(())
//! ```
//!
//! Donation: mark an argument with `tf.aliasing_output = <output index> : i32`
//! in the MLIR signature; the input buffer is then consumed by `execute`
//! (see [`LoadedExecutable::execute`]).

pub mod ffi;

mod buffer;
mod client;
pub mod error;
mod executable;
pub mod xla_ffi;

pub use buffer::{dense_size_in_bytes, Buffer, ElementType, Event, HostBufferSemantics};
pub use client::{Client, Device, MemoryStats, NamedValue, Plugin};
pub use error::{Error, Result};

use std::sync::atomic::{AtomicBool, Ordering};

static FORKED: AtomicBool = AtomicBool::new(false);

/// Marks this process as a child forked after a client started. The child has the plugin's
/// memory but none of its threads, so a call into the plugin may hang or crash: from now on
/// every call fails instead (FAILED_PRECONDITION), and destructors leak what they would free.
pub fn mark_forked() {
    FORKED.store(true, Ordering::Relaxed);
}

pub fn forked() -> bool {
    FORKED.load(Ordering::Relaxed)
}
pub use executable::{compile_options_proto, portable_compile_options_proto, with_option_overrides, LoadedExecutable, OptionOverride};
