"""torch.tpu: the device module, shaped like torch.cuda."""
import contextlib

import torch

from . import _C


def _check_platform():
    import torchtpu

    if torchtpu._platform_error is not None:
        raise torchtpu._platform_error


def _lazy_init():
    _check_platform()
    if _C.in_bad_fork():
        raise RuntimeError(
            "Cannot re-initialize tpu in forked subprocess. To use tpu with multiprocessing, "
            "you must use the 'spawn' start method"
        )
    _C.init()


def _is_in_bad_fork():
    """Whether this process was forked after the device started: it cannot use the device."""
    return _C.in_bad_fork()


def init():
    """Starts the device now (torch.cuda.init); raises RuntimeError saying why when it cannot."""
    _lazy_init()


def is_initialized():
    return _C.is_initialized()


def __getattr__(name):
    # torch.cuda's `_initialized` flag, which torch.utils.checkpoint reads to decide whether to
    # save and restore the device's RNG state around a recomputation.
    if name == "_initialized":
        return _C.is_initialized()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_available():
    return device_count() > 0


def device_count():
    # A started client's count needs no new start (and a forked child cannot start one).
    if not _C.is_initialized():
        try:
            _lazy_init()
        except RuntimeError:
            return 0
    return _C.device_count()


def current_device():
    return torch._C._accelerator_hooks_get_current_device() if hasattr(
        torch._C, "_accelerator_hooks_get_current_device"
    ) else torch.accelerator.current_device_index()


def _index(device):
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "tpu":
        raise ValueError(f"Expected a tpu device, but got: {device}")
    return device.index if device.index is not None else current_device()


def set_device(device):
    idx = _index(device)
    if idx >= 0:
        torch.accelerator.set_device_index(idx)


@contextlib.contextmanager
def device(device):
    idx = _index(device)
    prev = current_device()
    set_device(idx)
    try:
        yield
    finally:
        set_device(prev)


def synchronize(device=None):
    """Waits for all work queued on the device (reads already wait for their producers), and
    raises the error of an earlier op that failed on the device (an out-of-range index), as
    torch.cuda.synchronize does."""
    _lazy_init()
    _C.synchronize()
    # Every read from the device raises pending device-side errors with PyTorch's exception
    # class; reading a never-written one-element tensor runs nothing on the device.
    torch.empty((), device="tpu").item()


def _memory_is_host():
    """Whether tpu is the CPU plugin, whose device memory is the host's (servers then size
    their KV caches by a fixed budget rather than a fraction of the device)."""
    _lazy_init()
    return _C.platform()[0].lower() == "cpu"


def get_device_name(device=None):
    _lazy_init()
    platform, _, kind, _ = _C.platform()
    if platform.lower() == "cpu":
        return "XLA CPU"
    if platform.lower() in ("cuda", "gpu"):
        return f"{kind} (XLA)"
    return kind or platform


def manual_seed(seed):
    _C.set_rng(_index(None), int(seed) & 0xFFFF_FFFF_FFFF_FFFF, 0)


def manual_seed_all(seed):
    for i in range(max(device_count(), 1)):
        _C.set_rng(i, int(seed) & 0xFFFF_FFFF_FFFF_FFFF, 0)


def seed():
    s = torch.seed()  # also reseeds the CPU generator, as torch.cuda.seed draws from it
    manual_seed(s)


def seed_all():
    s = torch.seed()
    manual_seed_all(s)


def initial_seed():
    return _C.get_rng(_index(None))[0]


def get_rng_state(device="tpu"):
    seed, offset = _C.get_rng(_index(device))
    state = torch.tensor([seed, offset], dtype=torch.uint64)
    return state.view(torch.uint8)


def set_rng_state(new_state, device="tpu"):
    if new_state.dtype != torch.uint8 or new_state.numel() != 16:
        raise RuntimeError("RNG state must be a torch.ByteTensor of 16 bytes")
    seed, offset = new_state.contiguous().view(torch.uint64).tolist()
    _C.set_rng(_index(device), seed, offset)


def get_rng_state_all():
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(states):
    for i, s in enumerate(states):
        set_rng_state(s, i)


# ---- streams and events -------------------------------------------------------------------------


class Event:
    """torch.cuda.Event for tpu: marks the work queued when it is recorded. `elapsed_time`
    measures between the moments the marked work finished (seen by the plugin's completion
    callbacks), in milliseconds."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        if interprocess:
            raise NotImplementedError("torchtpu: interprocess events are not supported")
        self.enable_timing = enable_timing
        self.blocking = blocking
        self._marker = None

    def record(self, stream=None):
        self._marker = _C.Marker(self.enable_timing)

    def wait(self, stream=None):
        # Work queued later already waits for what it reads: one queue per device.
        pass

    def query(self):
        return self._marker is None or self._marker.query()

    def synchronize(self):
        if self._marker is not None:
            self._marker.synchronize()

    def elapsed_time(self, end_event):
        if self._marker is None or end_event._marker is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return self._marker.elapsed_ms(end_event._marker)


class Stream:
    """torch.cuda.Stream for tpu. A device runs its programs in dependency order on the
    plugin's own queues, so torchtpu has one stream per device and every Stream object names
    it: waits between streams are met by the data dependencies already."""

    def __init__(self, device=None, priority=0):
        self.device = torch.device("tpu", _index(device))
        self.priority = priority

    def wait_event(self, event):
        event.wait(self)

    def wait_stream(self, stream):
        pass

    def record_event(self, event=None):
        event = event if event is not None else Event()
        event.record(self)
        return event

    def query(self):
        return _C.Marker(False).query()

    def synchronize(self):
        synchronize(self.device)

    def __eq__(self, other):
        return isinstance(other, Stream) and other.device == self.device

    def __hash__(self):
        return hash(("tpu-stream", self.device))

    def __repr__(self):
        return f"<torch.tpu.Stream device={self.device}>"


def current_stream(device=None):
    return Stream(device)


def default_stream(device=None):
    return Stream(device)


def set_stream(stream):
    pass


class StreamContext:
    """torch.cuda.StreamContext for tpu: selects a stream for the work inside (the device's one
    stream, see Stream). Reusable: servers keep one and enter it for every batch."""

    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        return self.stream

    def __exit__(self, *exc):
        return False


def stream(stream):
    """Work inside runs on the device's one stream (see Stream)."""
    return StreamContext(stream)


def get_amp_supported_dtype():
    """The dtypes torch.autocast("tpu", dtype=...) accepts."""
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation=True):
    return True


def memory_stats(device=None):
    """torch.cuda.memory_stats for tpu, with CUDA's key names where they apply: "allocation"
    and "active" count live device buffers, "allocated_bytes", "active_bytes" and
    "requested_bytes" their bytes, "reserved_bytes" what the plugin's allocator holds (its pool
    on GPU and TPU; the live bytes on the CPU plugin, which allocates each buffer on its own).
    Each as .all.{current,peak,allocated,freed}; torchtpu has no small and large pools."""
    buffers, nbytes, reserved = _C.memory_stats(_index(device))
    stats = {}
    for name, values in (("allocation", buffers), ("active", buffers), ("allocated_bytes", nbytes),
                         ("active_bytes", nbytes), ("requested_bytes", nbytes), ("reserved_bytes", reserved)):
        for metric, value in zip(("current", "peak", "allocated", "freed"), values):
            stats[f"{name}.all.{metric}"] = value
    return dict(sorted(stats.items()))


def memory_allocated(device=None):
    """Bytes held by live tensors' device buffers on the device."""
    return _C.memory_stats(_index(device))[1][0]


def max_memory_allocated(device=None):
    """The most bytes held by live device buffers on the device since the start or the last
    reset_peak_memory_stats."""
    return _C.memory_stats(_index(device))[1][1]


def memory_reserved(device=None):
    """Bytes the plugin's allocator holds for the device, in use or not (see memory_stats)."""
    return _C.memory_stats(_index(device))[2][0]


def max_memory_reserved(device=None):
    return _C.memory_stats(_index(device))[2][1]


def reset_peak_memory_stats(device=None):
    _C.memory_reset(_index(device), True, False)


def reset_accumulated_memory_stats(device=None):
    _C.memory_reset(_index(device), False, True)


def reset_max_memory_allocated(device=None):
    reset_peak_memory_stats(device)


def mem_get_info(device=None):
    """(free bytes, total bytes) of the device's memory: from the plugin's allocator where it
    reports a limit (GPU, TPU); on the CPU plugin the device memory is the host's RAM."""
    _lazy_init()
    return _C.memory_info(_index(device))


def empty_cache():
    """Nothing to release: a device buffer is freed when its last tensor dies (the plugin's
    allocator may keep the memory pooled for reuse, as PJRT's GPU allocator does)."""


class _DeviceProperties:
    """What torch.tpu.get_device_properties returns, shaped like CUDA's device properties."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def __repr__(self):
        inner = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items())
        return f"_TpuDeviceProperties({inner})"


def get_device_properties(device=None):
    _lazy_init()
    index = _index(device)
    if not 0 <= index < device_count():
        raise AssertionError("Invalid device id")
    platform, version, kind, identity = _C.platform()
    attributes = _C.device_attributes(index)
    props = dict(
        name=get_device_name(index),
        type="tpu",
        index=index,
        total_memory=mem_get_info(index)[1],
        platform=platform,
        platform_version=version,
        device_kind=kind,
        plugin=identity,
        attributes=attributes,  # what the plugin says of the device, as it says it
    )
    # CUDA's names for what the plugin reports (the GPU plugin: core_count = SMs,
    # compute_capability "9.0"); a plugin that says nothing gets no such field.
    if "core_count" in attributes:
        props["multi_processor_count"] = attributes["core_count"]
    if isinstance(attributes.get("compute_capability"), str) and "." in attributes["compute_capability"]:
        props["major"], props["minor"] = (int(p) for p in attributes["compute_capability"].split(".")[:2])
    return _DeviceProperties(**props)


def live_buffers():
    """Number of live device buffers (for leak checks)."""
    return _C.live_buffers()


def compile_stats(reset=False):
    """Executable cache statistics (hits, misses, compile seconds, executions, persistent
    cache hits/writes/rejections, bucketed programs, tier_ups: large programs compiled at the
    quick tier first whose full-tier build started); under "phases" where compile_seconds went
    (lower: lowering and assembling programs; xla_compile; cache_load and cache_store: the
    persistent cache), under "ops" per op its programs (compiled or loaded) and seconds,
    under "programs" each program in the in-memory cache and each fused eager graph's program,
    most recently used first (op, "torchtpu::fused" for a graph's; ops: the ops it runs;
    signature, compile_seconds, calls served since it was cached, calls_ago: op calls since its
    last use, bucketed, tier: "quick" or "full", of the code that runs it now), under "graphs"
    one entry per torch.compile graph, and under "fused"
    fused eager mode's graphs run, runs as one fused program, ops recorded and fused programs
    compiled.
    reset=True returns the counts so far and starts them over from zero (the programs stay
    cached with their own counts, and each graph's "calls" start over)."""
    from .compile import diagnostics

    stats = dict(_C.compile_stats())
    stats["graphs"] = diagnostics.graph_stats()
    if reset:
        _C.compile_stats_reset()
        diagnostics.reset_graph_calls()
    return stats


def set_fused_eager(enabled=True):
    """Fused eager mode (the default) on, or off for strict eager, which runs each op's program
    at its call (also TORCHTPU_FUSED_EAGER=0 before the device starts). Ops are recorded
    instead of run, and run when a value is needed (a read to the host such as .item(),
    .cpu() or print, torch.tpu.synchronize, an op with device-side checks, a data-dependent
    size, 512 ops): the first times a graph of ops is met, op by op with each op's program as
    in strict eager; its third time starts compiling it as one program, which runs it from the
    run after its compile window (a fixed run, so reruns agree). Errors PyTorch raises
    from an op's arguments raise at the op; a failure while running raises at the read.
    Turning it off runs what was recorded."""
    _lazy_init()
    _C.set_fused_eager(bool(enabled))


@contextlib.contextmanager
def bucketed_programs():
    """Within it, this thread's eager ops whose sizes change from call to call (pointwise ops,
    copies, cat, indexing, gather, scatter) run one program per bucket of sizes (powers of two)
    from their first call, rather than compiling each new size, and tensors uploaded from the
    host hold their bucket: for code sized by data at every call, such as a serving runner's
    input preparation (the vLLM platform wraps vLLM's in it; `bucketed_programs()(f)` wraps a
    function)."""
    _lazy_init()
    _C.bucket_scope(True)
    try:
        yield
    finally:
        _C.bucket_scope(False)


def set_launch_blocking(enabled=True):
    """Launch-blocking mode on (also TORCHTPU_LAUNCH_BLOCKING=1), for debugging as
    CUDA_LAUNCH_BLOCKING=1: every op runs its own program at its call and waits for it, so an
    error found on the device (an index out of range, memory full) raises at the op that caused
    it, with your traceback, instead of at a later read. Fused eager recording is off while it
    is on (what was recorded runs first). Slow: for finding where an error comes from."""
    _lazy_init()
    _C.set_launch_blocking(bool(enabled))


def is_launch_blocking():
    _lazy_init()
    return _C.launch_blocking()


def is_fused_eager():
    """Whether fused eager mode is on."""
    return _C.fused_eager_enabled()


def lowered_ops():
    """The aten ops with a native lowering."""
    return list(_C.lowered_ops())


# torch.tpu.memory (memory history and snapshots) and torch.tpu.memory_summary, as torch.cuda's;
# imported last: it reads this module's functions.
from . import memory  # noqa: E402
from .memory import memory_summary  # noqa: E402,F401
