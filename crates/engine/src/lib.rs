//! The eager engine behind device "tpu": storage cells, the executable cache and execution of
//! aten calls on a PJRT plugin. The C ABI types it speaks are in `abi` (the crate crates/abi,
//! which mirrors csrc/abi.h).
//!
//! Modules form layers; a module uses only modules of lower layers (no cycles):
//!
//! ```text
//! 5  host       moving data between the host and cells        uses dispatch, checks, cell, view, runtime, values, error, abi
//! 4  dispatch   running one aten call; the engine lock         uses fused, compile_pool, checks, cell, lock, view, buckets, overlap, runtime, values, error, abi
//! 3  fused      fused eager mode: recorded graphs, run fused   uses compile_pool, checks, cell, runtime, blocking, error
//! 2  checks     data-dependent checks (host, device)           uses cell, runtime, values, blocking, error, abi
//!    cell       storage cells, device buffers, pending work    uses lock, address, memory
//! 1  memory     device memory statistics                       uses runtime, error
//!    runtime    the PJRT client, compiling                     uses disk_cache, error
//!    compile_pool  compiling on worker threads                 uses error
//!    overlap    writes that alias themselves or their inputs  uses error
//! 0  error, values, lock, address, view, buckets, disk_cache, blocking: import nothing of the engine (abi is a crate)
//! ```
//!
//! The crate root only declares modules, re-exports and asks `runtime` for the device count.
pub use ::abi;
pub mod address;
pub mod blocking;
pub mod cell;
pub mod checks;
pub mod compile_pool;
pub mod dispatch;
pub mod disk_cache;
pub mod error;
pub mod fused;
pub mod host;
pub mod lock;
pub mod memory;
pub mod overlap;
pub mod runtime;
pub mod trace;
pub mod buckets;
pub mod values;
pub mod view;

pub use error::Error;
pub use host::{copy_cell_bytes, resize_cell};

pub fn device_count() -> i32 {
    if let Some(n) = runtime::started_device_count() {
        return n as i32;
    }
    match runtime::runtime() {
        Ok(rt) => rt.devices.len() as i32,
        Err(_) => 0,
    }
}
