//! torchtpu._C: the Rust side of the extension. Its register_device registers the C++ shim's
//! kernels with PyTorch's dispatcher (tt_register_device, csrc/register.cpp).
mod ffi;
mod host_matmul;
mod memory_history;
mod schemas;

use pyo3::prelude::*;
use lowerings::graph::{GArg, Graph, Node};
use pyo3::types::PyDict;

extern "C" {
    fn tt_register_device();
    fn tt_generator_set(device: i32, seed: u64, offset: u64);
    fn tt_generator_get(device: i32, seed: *mut u64, offset: *mut u64);
}

/// A client-create option's value as Python gives it (bool before int: a bool is an int there).
#[derive(FromPyObject)]
enum OptionValue {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

/// Chooses the PJRT plugin and its client-create options; the client starts at first use.
#[pyfunction]
#[pyo3(signature = (plugin_path, options=None))]
fn configure(plugin_path: String, options: Option<Vec<(String, OptionValue)>>) {
    let options = options
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                OptionValue::Bool(b) => pjrt::NamedValue::Bool(b),
                OptionValue::Int(i) => pjrt::NamedValue::I64(i),
                OptionValue::Float(f) => pjrt::NamedValue::F32(f as f32),
                OptionValue::Str(s) => pjrt::NamedValue::Str(s),
            };
            (k, v)
        })
        .collect();
    let host_matmul = Some(host_matmul::handler as pjrt::xla_ffi::Handler);
    engine::runtime::configure(engine::runtime::Config { plugin_path, options, host_matmul });
}

#[pyfunction]
fn is_initialized() -> bool {
    engine::runtime::is_initialized()
}

/// Whether this process was forked after the device started (and so cannot use it).
#[pyfunction]
fn in_bad_fork() -> bool {
    pjrt::forked()
}

/// Starts the client now; raises RuntimeError with the plugin's message when it cannot.
#[pyfunction]
fn init() -> PyResult<()> {
    engine::runtime::runtime().map(|_| ()).map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))
}

/// Waits for every queued computation (torch.tpu.synchronize).
#[pyfunction]
fn synchronize() -> PyResult<()> {
    flush_recorded("synchronize")?;
    engine::cell::synchronize().map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(format!("torchtpu: {}", e.message)))
}

/// At interpreter exit: waits for the computations still running (without running what fused
/// eager mode recorded: their errors would have no reader left), for the compiles on worker
/// threads, which then take no more, and for the persistent cache's queued writes. The
/// plugin must not be torn down under a running program or compile: both crashed the process.
#[pyfunction]
fn wait_before_exit(py: Python<'_>) {
    if !engine::runtime::is_initialized() {
        return;
    }
    py.allow_threads(|| {
        let _ = engine::cell::synchronize();
        engine::compile_pool::close();
        engine::runtime::flush_stores();
    });
}

/// Runs what fused eager mode recorded.
fn flush_recorded(why: &str) -> PyResult<()> {
    engine::dispatch::flush_recorded(why).map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))
}

fn pjrt_error(e: pjrt::Error) -> PyErr {
    pyo3::exceptions::PyRuntimeError::new_err(format!("torchtpu: {}", e.message))
}

type StatTuple = (i64, i64, i64, i64);

fn stat_tuple(s: engine::memory::Stat) -> StatTuple {
    (s.current, s.peak, s.allocated, s.freed)
}

/// A device's memory statistics: (buffers, bytes, reserved bytes), each as (current, peak,
/// allocated, freed).
#[pyfunction]
fn memory_stats(device: i32) -> PyResult<(StatTuple, StatTuple, StatTuple)> {
    // What fused eager mode recorded runs first, so that its buffers count.
    flush_recorded("memory statistics")?;
    let (buffers, bytes) = engine::memory::stats(device);
    Ok((stat_tuple(buffers), stat_tuple(bytes), stat_tuple(engine::memory::reserved(device))))
}

/// Starts, changes or stops the memory history (memory_history.rs; levels as there).
#[pyfunction]
fn memory_history_record(enabled: i32, context: i32, cpp_frames: bool, max_entries: u64) {
    memory_history::record(enabled, context, cpp_frames, max_entries)
}

/// The memory history's frames, live storages and events (memory_history.rs).
#[pyfunction]
fn memory_history_snapshot(
    py: Python<'_>,
) -> (Vec<memory_history::Frame>, Vec<memory_history::LiveBlock>, Vec<memory_history::TraceEvent>) {
    py.allow_threads(memory_history::snapshot)
}

/// Starts new peaks and/or zeroes the allocated and freed totals of a device.
#[pyfunction]
fn memory_reset(device: i32, peak: bool, accumulated: bool) -> PyResult<()> {
    flush_recorded("memory statistics")?;
    if peak {
        engine::memory::reset_peak(device);
    }
    if accumulated {
        engine::memory::reset_accumulated(device);
    }
    Ok(())
}

/// The plugin's named facts about a device ("core_count", "compute_capability", ...).
#[pyfunction]
fn device_attributes(py: Python<'_>, device: i32) -> PyResult<Bound<'_, PyDict>> {
    let rt = engine::runtime::runtime().map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
    let d = rt.device(device).map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
    let out = PyDict::new(py);
    for (name, value) in d.attributes() {
        match value {
            pjrt::NamedValue::Str(s) => out.set_item(name, s)?,
            pjrt::NamedValue::I64(i) => out.set_item(name, i)?,
            pjrt::NamedValue::I64List(v) => out.set_item(name, v.clone())?,
            pjrt::NamedValue::F32(f) => out.set_item(name, f)?,
            pjrt::NamedValue::Bool(b) => out.set_item(name, b)?,
        }
    }
    Ok(out)
}

/// (free bytes, total bytes) of a device's memory.
#[pyfunction]
fn memory_info(device: i32) -> PyResult<(i64, i64)> {
    flush_recorded("memory statistics")?;
    engine::memory::info(device).map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))
}

/// A recorded point in the device's work, for torch.tpu.Event.
#[pyclass(frozen)]
struct Marker(engine::cell::Marker);

#[pymethods]
impl Marker {
    #[new]
    fn new(timing: bool) -> PyResult<Marker> {
        engine::cell::Marker::record(timing).map(Marker).map_err(pjrt_error)
    }

    fn query(&self) -> bool {
        self.0.is_done()
    }

    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        py.allow_threads(|| self.0.wait()).map_err(pjrt_error)
    }

    /// Milliseconds from this marker's completion to `end`'s, like CUDA's event timing.
    fn elapsed_ms(&self, end: &Marker) -> PyResult<f64> {
        if !self.0.timed() || !end.0.timed() {
            return Err(pyo3::exceptions::PyRuntimeError::new_err("Both events must be created with argument 'enable_timing=True'."));
        }
        match (self.0.done_at(), end.0.done_at()) {
            (Some(a), Some(b)) => Ok(if b >= a { (b - a).as_secs_f64() * 1e3 } else { -((a - b).as_secs_f64() * 1e3) }),
            _ => Err(pyo3::exceptions::PyRuntimeError::new_err("Both events must be completed before calculating elapsed time.")),
        }
    }
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

/// The host address of the device memory behind the tpu storage whose data pointer is
/// `storage_address`, for torch.distributed to use in place (engine::host::host_alias), or
/// None.
#[pyfunction]
fn host_alias(storage_address: usize, dtype_code: i8, numel: i64) -> PyResult<Option<usize>> {
    // An earlier op's failure (fused eager mode, a device check) raises here with its class.
    let err = |e: engine::Error| {
        use pyo3::exceptions::*;
        let message = e.to_string();
        match e.kind() {
            lowerings::ErrorKind::Runtime => PyRuntimeError::new_err(message),
            lowerings::ErrorKind::Value => PyValueError::new_err(message),
            lowerings::ErrorKind::Type => PyTypeError::new_err(message),
            lowerings::ErrorKind::Index => PyIndexError::new_err(message),
            lowerings::ErrorKind::NotImplemented => PyNotImplementedError::new_err(message),
        }
    };
    let Some(dtype) = lowerings::DType::from_code(dtype_code) else { return Ok(None) };
    let Some(cell) = engine::address::cell_at(storage_address) else { return Ok(None) };
    // SAFETY: the caller holds the tensor, so its storage's cell stays alive for this call.
    let cell = unsafe { &*(cell as *const engine::cell::Cell) };
    engine::host::host_alias(cell, dtype, numel).map_err(err)
}

/// (major, minor) of the PJRT C API the plugin was built with (for `python -m torchtpu`).
#[pyfunction]
fn pjrt_api_version() -> PyResult<(i32, i32)> {
    let rt = engine::runtime::runtime().map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
    Ok(rt.client.plugin().api_version())
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
fn live_buffers() -> PyResult<i64> {
    flush_recorded("memory statistics")?;
    Ok(engine::memory::live_buffers())
}

#[pyfunction]
fn compile_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    // The counts include the programs compiling on worker threads and the writes still queued.
    if engine::runtime::is_initialized() {
        py.allow_threads(wait_for_background_work);
    }
    let s = engine::dispatch::stats();
    let d = PyDict::new(py);
    d.set_item("hits", s.hits)?;
    d.set_item("misses", s.misses)?;
    d.set_item("compile_seconds", s.compile_seconds)?;
    d.set_item("executions", s.executions)?;
    d.set_item("evictions", s.evictions)?;
    d.set_item("bucket_programs", s.bucket_programs)?;
    d.set_item("bucket_shapes", s.bucket_shapes)?;
    d.set_item("bucket_promoted", s.bucket_promoted)?;
    d.set_item("tier_ups", engine::compile_pool::tier_ups())?;
    use std::sync::atomic::Ordering::Relaxed;
    d.set_item("disk_hits", engine::disk_cache::DISK_HITS.load(Relaxed))?;
    d.set_item("disk_writes", engine::disk_cache::DISK_WRITES.load(Relaxed))?;
    d.set_item("disk_rejected", engine::disk_cache::DISK_REJECTED.load(Relaxed))?;
    // compile_seconds split: the rest of it is lowering and assembling the programs. (Cache
    // stores run on a thread of their own, outside compile_seconds.)
    let t = engine::runtime::compile_times();
    let phases = PyDict::new(py);
    phases.set_item("lower", (s.compile_seconds - t.xla_compile - t.cache_load).max(0.0))?;
    phases.set_item("xla_compile", t.xla_compile)?;
    phases.set_item("cache_load", t.cache_load)?;
    phases.set_item("cache_store", t.cache_store)?;
    d.set_item("phases", phases)?;
    let ops = PyDict::new(py);
    for (name, (programs, seconds)) in t.per_op {
        let op = PyDict::new(py);
        op.set_item("programs", programs)?;
        op.set_item("seconds", seconds)?;
        ops.set_item(name, op)?;
    }
    d.set_item("ops", ops)?;
    let f = engine::dispatch::fused_stats();
    let fused = PyDict::new(py);
    fused.set_item("graphs", f.graphs)?;
    fused.set_item("fused_runs", f.fused_runs)?;
    fused.set_item("ops", f.ops)?;
    fused.set_item("programs", f.programs)?;
    fused.set_item("fused_at_first_run", f.fused_at_first_run)?;
    let cuts = PyDict::new(py);
    for (why, n) in f.cuts {
        cuts.set_item(why, n)?;
    }
    fused.set_item("cuts", cuts)?;
    d.set_item("fused", fused)?;
    let programs = pyo3::types::PyList::empty(py);
    for p in engine::dispatch::program_stats() {
        let row = PyDict::new(py);
        row.set_item("op", p.op)?;
        row.set_item("ops", p.ops)?;
        row.set_item("signature", p.signature)?;
        row.set_item("compile_seconds", p.compile_seconds)?;
        row.set_item("calls", p.calls)?;
        row.set_item("calls_ago", p.calls_ago)?;
        row.set_item("bucketed", p.bucketed)?;
        row.set_item("tier", p.tier)?;
        programs.append(row)?;
    }
    d.set_item("programs", programs)?;
    Ok(d)
}

/// Starts the counts compile_stats reports over from zero.
#[pyfunction]
fn compile_stats_reset(py: Python<'_>) {
    if engine::runtime::is_initialized() {
        py.allow_threads(wait_for_background_work);
    }
    engine::dispatch::reset_stats();
}

/// Turns launch-blocking mode on or off (engine blocking.rs).
#[pyfunction]
fn set_launch_blocking(on: bool) -> PyResult<()> {
    engine::dispatch::set_launch_blocking(on).map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))
}

#[pyfunction]
fn launch_blocking() -> bool {
    engine::blocking::enabled()
}

/// Turns fused eager mode on or off (off: what it recorded runs first).
#[pyfunction]
fn set_fused_eager(on: bool) -> PyResult<()> {
    engine::dispatch::set_fused_eager(on).map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))
}

/// Opens or closes this thread's bucketed-programs scope (engine buckets::enter_scope).
#[pyfunction]
fn bucket_scope(open: bool) {
    if open {
        engine::buckets::enter_scope()
    } else {
        engine::buckets::exit_scope()
    }
}

#[pyfunction]
fn fused_eager_enabled() -> bool {
    engine::fused::enabled()
}

fn wait_for_background_work() {
    // Compiles first: each queues its program's write.
    engine::compile_pool::wait_all();
    engine::runtime::flush_stores();
}

/// The base names of every natively lowered aten op.
#[pyfunction]
fn lowered_ops() -> Vec<&'static str> {
    lowerings::registry().names()
}

/// Every declared op overload the shim routes to the fallback or keeps composite, as
/// (base name, "routed" | "keep_composite", "name.overload").
#[pyfunction]
fn declared_overloads() -> Vec<(&'static str, &'static str, &'static str)> {
    let mut out = Vec::new();
    for d in lowerings::registry().declarations() {
        let base = d.names.iter().next().unwrap_or("");
        out.extend(d.routed.iter().map(|o| (base, "routed", *o)));
        out.extend(d.keep_composite.iter().map(|o| (base, "keep_composite", *o)));
    }
    out
}

/// Whether an aten op ("aten::add_") has a native lowering, by the engine's base-name rule.
#[pyfunction]
fn is_lowered(qualified: &str) -> bool {
    lowerings::registry().get(lowerings::base_name(qualified)).is_some()
}

/// The argument names the lowering of `op` (a base name) may read, when the check of argument
/// reads is on (TORCHTPU_CHECK_ARGS=1); None otherwise.
#[pyfunction]
fn lowering_arg_names(op: &str) -> Option<Vec<String>> {
    schemas::names_if_checked(op)
}

/// (c10::ScalarType code, `torch` attribute name) of every dtype the lowerings know.
#[pyfunction]
fn dtype_codes() -> Vec<(i8, &'static str)> {
    lowerings::DType::ALL.iter().map(|d| (*d as i8, d.python_name())).collect()
}

/// A graph argument from Python: a tagged tuple (see python/torchtpu/dynamo.py).
fn graph_arg(obj: &Bound<'_, PyAny>) -> PyResult<GArg> {
    let (tag, payload): (String, Bound<'_, PyAny>) = obj.extract()?;
    Ok(match tag.as_str() {
        "ref" => GArg::Ref(payload.extract()?),
        "item" => {
            let (i, j): (usize, usize) = payload.extract()?;
            GArg::Item(i, j)
        }
        "none" => GArg::None,
        "int" => GArg::Int(payload.extract()?),
        "float" => GArg::Float(payload.extract()?),
        "bool" => GArg::Bool(payload.extract()?),
        "ints" => GArg::IntList(payload.extract()?),
        "floats" => GArg::FloatList(payload.extract()?),
        "bools" => GArg::BoolList(payload.extract()?),
        "str" => GArg::Str(payload.extract()?),
        "generator" => GArg::Generator(payload.extract()?),
        "graph" => GArg::Graph(std::sync::Arc::new(subgraph(&payload)?)),
        "dtype" => {
            let code: i8 = payload.extract()?;
            GArg::DType(lowerings::DType::from_code(code).ok_or_else(|| {
                pyo3::exceptions::PyNotImplementedError::new_err(format!("torchtpu: dtype code {code} is not supported"))
            })?)
        }
        "list" => {
            let items: Vec<Bound<'_, PyAny>> = payload.extract()?;
            GArg::List(items.iter().map(graph_arg).collect::<PyResult<_>>()?)
        }
        other => return Err(pyo3::exceptions::PyValueError::new_err(format!("torchtpu: unknown graph argument tag {other}"))),
    })
}

type PyNode<'py> = (String, Vec<String>, Vec<Bound<'py, PyAny>>);

/// A subgraph argument: (number of inputs, nodes, outputs) as `register_graph` takes them.
fn subgraph(obj: &Bound<'_, PyAny>) -> PyResult<Graph> {
    let (num_inputs, nodes, outputs): (usize, Vec<PyNode<'_>>, Vec<Bound<'_, PyAny>>) = obj.extract()?;
    graph_from(num_inputs, nodes, outputs)
}

/// A graph from Python: nodes are (target, arg names, args), args and outputs tagged tuples.
fn graph_from(num_inputs: usize, nodes: Vec<PyNode<'_>>, outputs: Vec<Bound<'_, PyAny>>) -> PyResult<Graph> {
    let nodes = nodes
        .into_iter()
        .map(|(target, arg_names, args)| {
            Ok(Node { target, arg_names, args: args.iter().map(graph_arg).collect::<PyResult<_>>()? })
        })
        .collect::<PyResult<_>>()?;
    let outputs = outputs.iter().map(graph_arg).collect::<PyResult<_>>()?;
    Ok(Graph { num_inputs, nodes, outputs, mutated: Vec::new() })
}

/// Registers an aten graph for `torchtpu::run_graph`; nodes are (target, arg names, args);
/// `mutated`: the inputs its copy_ nodes write (run with `torchtpu::run_graph_`).
#[pyfunction]
fn register_graph(
    num_inputs: usize,
    nodes: Vec<PyNode<'_>>,
    outputs: Vec<Bound<'_, PyAny>>,
    mutated: Vec<usize>,
) -> PyResult<i64> {
    let g = graph_from(num_inputs, nodes, outputs)?;
    Ok(lowerings::graph::register_graph(Graph { mutated, ..g }))
}

/// A tensor type as (dims, torch dtype code).
type TypeSpec = (Vec<i64>, i8);

fn type_spec(t: &stablehlo::TensorType) -> TypeSpec {
    (t.dims.clone(), lowerings::DType::from_elem(t.elem) as i8)
}

fn tensor_type(spec: &TypeSpec) -> PyResult<stablehlo::TensorType> {
    let dtype = lowerings::DType::from_code(spec.1)
        .ok_or_else(|| pyo3::exceptions::PyValueError::new_err(format!("dtype code {} is not supported on tpu", spec.1)))?;
    Ok(stablehlo::TensorType { elem: dtype.elem(), dims: spec.0.clone() })
}

/// Registers StableHLO text as a kernel of `torchtpu::stablehlo_kernel`: (id, its @main's
/// parameter types, its result types).
#[pyfunction]
fn register_text_kernel(name: &str, text: &str) -> PyResult<(i64, Vec<TypeSpec>, Vec<TypeSpec>)> {
    let id = lowerings::register_text_kernel(name, text).map_err(|e| match e.kind {
        lowerings::ErrorKind::NotImplemented => pyo3::exceptions::PyNotImplementedError::new_err(e.message),
        _ => pyo3::exceptions::PyValueError::new_err(e.message),
    })?;
    let k = lowerings::ops_kernel(id).expect("just registered");
    Ok((id, k.params.iter().map(type_spec).collect(), k.results.iter().map(type_spec).collect()))
}

/// Registers a serialized module (MLIR bytecode) taking `params` and returning `results` as a
/// kernel of `torchtpu::stablehlo_kernel`; returns its id.
#[pyfunction]
fn register_module_kernel(name: &str, module: Vec<u8>, params: Vec<TypeSpec>, results: Vec<TypeSpec>) -> PyResult<i64> {
    let params = params.iter().map(tensor_type).collect::<PyResult<Vec<_>>>()?;
    let results = results.iter().map(tensor_type).collect::<PyResult<Vec<_>>>()?;
    Ok(lowerings::register_module_kernel(name, module, params, results))
}

/// The torch this extension was built for, with a prefix that Python finds by scanning the
/// library file when the library cannot even load into the running torch (missing symbols).
#[used]
static BUILT_FOR_TORCH: &str = concat!("torchtpu-built-for-torch=", env!("TORCHTPU_BUILT_WITH_TORCH"), "\0");

#[pyfunction]
fn built_with_torch() -> &'static str {
    env!("TORCHTPU_BUILT_WITH_TORCH")
}

/// Records the running torch release for the behaviours that differ between releases
/// (lowerings::torch_version).
#[pyfunction]
fn set_torch_version(major: u32, minor: u32) {
    lowerings::torch_version::set(major, minor)
}

/// Registers the device with PyTorch (allocator, guard, hooks, kernels); called once Python
/// has checked that the running torch is the one this extension was built for.
#[pyfunction]
fn register_device() {
    unsafe { tt_register_device() }
    schemas::install_if_asked();
}

#[pymodule]
fn _C(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(configure, m)?)?;
    m.add_function(wrap_pyfunction!(is_initialized, m)?)?;
    m.add_function(wrap_pyfunction!(in_bad_fork, m)?)?;
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(device_count, m)?)?;
    m.add_function(wrap_pyfunction!(platform, m)?)?;
    m.add_function(wrap_pyfunction!(host_alias, m)?)?;
    m.add_function(wrap_pyfunction!(pjrt_api_version, m)?)?;
    m.add_function(wrap_pyfunction!(set_rng, m)?)?;
    m.add_function(wrap_pyfunction!(get_rng, m)?)?;
    m.add_function(wrap_pyfunction!(live_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(memory_reset, m)?)?;
    m.add_function(wrap_pyfunction!(memory_info, m)?)?;
    m.add_function(wrap_pyfunction!(device_attributes, m)?)?;
    m.add_function(wrap_pyfunction!(synchronize, m)?)?;
    m.add_function(wrap_pyfunction!(memory_history_record, m)?)?;
    m.add_function(wrap_pyfunction!(memory_history_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(wait_before_exit, m)?)?;
    m.add_function(wrap_pyfunction!(compile_stats, m)?)?;
    m.add_function(wrap_pyfunction!(compile_stats_reset, m)?)?;
    m.add_function(wrap_pyfunction!(set_fused_eager, m)?)?;
    m.add_function(wrap_pyfunction!(set_launch_blocking, m)?)?;
    m.add_function(wrap_pyfunction!(launch_blocking, m)?)?;
    m.add_function(wrap_pyfunction!(bucket_scope, m)?)?;
    m.add_function(wrap_pyfunction!(fused_eager_enabled, m)?)?;
    m.add_function(wrap_pyfunction!(lowered_ops, m)?)?;
    m.add_function(wrap_pyfunction!(is_lowered, m)?)?;
    m.add_function(wrap_pyfunction!(declared_overloads, m)?)?;
    m.add_function(wrap_pyfunction!(dtype_codes, m)?)?;
    m.add_function(wrap_pyfunction!(lowering_arg_names, m)?)?;
    m.add_function(wrap_pyfunction!(built_with_torch, m)?)?;
    m.add_function(wrap_pyfunction!(register_device, m)?)?;
    m.add_function(wrap_pyfunction!(set_torch_version, m)?)?;
    m.add_function(wrap_pyfunction!(register_graph, m)?)?;
    m.add_function(wrap_pyfunction!(register_text_kernel, m)?)?;
    m.add_function(wrap_pyfunction!(register_module_kernel, m)?)?;
    m.add_class::<Marker>()?;
    Ok(())
}
