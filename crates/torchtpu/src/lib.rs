//! torchtpu._C: the Rust side of the extension. Loading it registers the C++ shim's kernels
//! (static initializers in csrc/shim.cpp) with PyTorch's dispatcher.
mod ffi;

use pyo3::prelude::*;
use pyo3::types::PyDict;

extern "C" {
    fn tt_generator_set(device: i32, seed: u64, offset: u64);
    fn tt_generator_get(device: i32, seed: *mut u64, offset: *mut u64);
}

/// Chooses the PJRT plugin; the client starts at first use.
#[pyfunction]
#[pyo3(signature = (plugin_path, options=None))]
fn configure(plugin_path: String, options: Option<Vec<(String, i64)>>) {
    engine::runtime::configure(engine::runtime::Config { plugin_path, options: options.unwrap_or_default() });
}

#[pyfunction]
fn is_initialized() -> bool {
    engine::runtime::is_initialized()
}

/// Starts the client now; raises RuntimeError with the plugin's message when it cannot.
#[pyfunction]
fn init() -> PyResult<()> {
    engine::runtime::runtime().map(|_| ()).map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))
}

#[pyfunction]
fn device_count() -> i32 {
    engine::device_count()
}

/// (platform name, platform version, device kind, plugin identity).
#[pyfunction]
fn platform() -> PyResult<(String, String, String, String)> {
    let rt = engine::runtime::runtime().map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
    let kind = rt.devices.first().map(|d| d.kind().to_string()).unwrap_or_default();
    Ok((rt.client.platform_name().to_string(), rt.client.platform_version().to_string(), kind, rt.identity.clone()))
}

/// Sets the default generator of `device` to (seed, offset).
#[pyfunction]
fn set_rng(device: i32, seed: u64, offset: u64) {
    unsafe { tt_generator_set(device, seed, offset) }
}

/// The default generator of `device` as (seed, offset).
#[pyfunction]
fn get_rng(device: i32) -> (u64, u64) {
    let (mut seed, mut offset) = (0, 0);
    unsafe { tt_generator_get(device, &mut seed, &mut offset) };
    (seed, offset)
}

#[pyfunction]
fn live_buffers() -> i64 {
    engine::cell::live_buffers()
}

#[pyfunction]
fn live_bytes() -> i64 {
    engine::cell::live_bytes()
}

#[pyfunction]
fn compile_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let s = engine::dispatch::stats();
    let d = PyDict::new(py);
    d.set_item("hits", s.hits)?;
    d.set_item("misses", s.misses)?;
    d.set_item("compile_seconds", s.compile_seconds)?;
    d.set_item("executions", s.executions)?;
    Ok(d)
}

/// The base names of every natively lowered aten op.
#[pyfunction]
fn lowered_ops() -> Vec<&'static str> {
    lowerings::registry().names()
}

#[pyfunction]
fn built_with_torch() -> &'static str {
    env!("TORCHTPU_BUILT_WITH_TORCH")
}

#[pymodule]
fn _C(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(configure, m)?)?;
    m.add_function(wrap_pyfunction!(is_initialized, m)?)?;
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(device_count, m)?)?;
    m.add_function(wrap_pyfunction!(platform, m)?)?;
    m.add_function(wrap_pyfunction!(set_rng, m)?)?;
    m.add_function(wrap_pyfunction!(get_rng, m)?)?;
    m.add_function(wrap_pyfunction!(live_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(live_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(compile_stats, m)?)?;
    m.add_function(wrap_pyfunction!(lowered_ops, m)?)?;
    m.add_function(wrap_pyfunction!(built_with_torch, m)?)?;
    Ok(())
}
