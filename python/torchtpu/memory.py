"""torch.tpu.memory: where the device memory goes, with torch.cuda.memory's tools.

`_record_memory_history` records each tpu storage's allocation and release with the Python
stack that made it; `_snapshot` returns them in the format of torch.cuda.memory._snapshot, so
that `python -m torch.cuda._memory_viz` and pytorch.org/memory_viz read a `_dump_snapshot` file
unchanged. torchtpu's allocator caches nothing: each storage is one block in a segment of its
own, and a snapshot lists the storages made while the history recorded."""
import pickle
import sys

from . import _C
from . import device as _device

__all__ = ["memory_summary"]

_ENABLED = {None: 0, False: 0, "state": 1, "all": 2, True: 2}
_CONTEXT = {None: 0, "state": 1, "alloc": 2, "all": 3}
_STACKS = ("python", "all")


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize, device=None,
                           clear_history=False):
    """Starts (or, with enabled=None, stops) recording tpu storages' allocations and releases.

    enabled: "all" keeps the events (the snapshot's device_traces) and the live storages,
    "state" only the live storages, None stops and forgets. context: which events carry a
    stack ("alloc": allocations; "all": releases too; "state": live storages only; None: none).
    stacks: "python", or "all" for C++ frames too (slow to symbolize). max_entries: the most
    events kept (the oldest go first). device is accepted for torch.cuda's signature: the
    history covers every tpu device."""
    if isinstance(enabled, str) and enabled not in _ENABLED or not isinstance(enabled, (str, bool, type(None))):
        raise RuntimeError(f"expected state to be 'state', 'all', or None, got {enabled!r}")
    if context not in _CONTEXT:
        raise RuntimeError(f"expected context to be 'state', 'alloc', 'all', or None, got {context!r}")
    if stacks not in _STACKS:
        raise RuntimeError(f"expected stacks to be 'python', or 'all', got {stacks!r}")
    if max_entries < 0:
        raise RuntimeError(f"max_entries must be non-negative, got {max_entries}")
    _device.init()  # a device that was never started starts now (or says why it cannot)
    level = _ENABLED[enabled]
    if clear_history:
        _C.memory_history_record(0, 0, False, 0)
    _C.memory_history_record(level, _CONTEXT[context], stacks == "all", min(max_entries, 2**64 - 1))


def _frames(table, stack):
    return [] if stack is None else [table[i] for i in stack]


def _snapshot(device=None):
    """The recorded history in torch.cuda.memory._snapshot's format: "segments" (one per live
    storage, each with one block), "device_traces" (one event list per device, oldest first) and
    "allocator_settings"."""
    frames, blocks, events = _C.memory_history_snapshot()
    table = [{"filename": f, "name": n, "line": line} for f, n, line in frames]
    segments = []
    for dev, address, size, stack in sorted(blocks, key=lambda b: (b[0], b[1])):
        frames = _frames(table, stack)
        block = {"address": address, "size": size, "requested_size": size, "state": "active_allocated", "frames": frames}
        segments.append({
            "device": dev, "address": address, "total_size": size, "allocated_size": size, "active_size": size,
            "requested_size": size, "stream": 0, "segment_type": "large" if size > 1 << 20 else "small",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": frames, "blocks": [block],
        })
    traces = [[] for _ in range(max(_device.device_count(), 1 + max((e[0] for e in events), default=-1)))]
    for dev, action, address, size, time_us, stack in events:
        traces[dev].append({"action": action, "addr": address, "size": size, "stream": 0, "time_us": time_us,
                            "frames": _frames(table, stack)})
    return {"segments": segments, "device_traces": traces,
            "allocator_settings": {"expandable_segments": False, "caching": False}}


def _dump_snapshot(filename="dump_snapshot.pickle"):
    """Pickles _snapshot() to filename, as torch.cuda.memory._dump_snapshot does."""
    snapshot = _snapshot()
    with open(filename, "wb") as f:
        pickle.dump(snapshot, f)


_ROWS = (("Allocated memory", "allocated_bytes"), ("Active memory", "active_bytes"),
         ("Requested memory", "requested_bytes"), ("Reserved memory", "reserved_bytes"),
         ("Allocations", "allocation"), ("Active allocs", "active"))


def _amount(n, is_bytes):
    if not is_bytes:
        return str(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 10 * 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.0f} TiB"


def memory_summary(device=None, abbreviated=False):
    """memory_stats as a table laid out as torch.cuda.memory_summary's: the current and peak
    values and the allocated and freed totals of bytes and buffers (abbreviated is accepted:
    torchtpu has no small and large pools to break them down by)."""
    index = _device._index(device)
    stats = _device.memory_stats(index)
    width = 75
    double, single = "|" + "=" * width + "|", "|" + "-" * width + "|"
    out = [double, "|" + f"PyTorch tpu memory summary, device ID {index}".center(width) + "|",
           "|" + _device.get_device_name(index).center(width) + "|", double,
           "|" + " Metric".ljust(23) + "| Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |", single]
    for title, key in _ROWS:
        values = [_amount(stats[f"{key}.all.{m}"], key.endswith("bytes")) for m in ("current", "peak", "allocated", "freed")]
        out.append("| " + title.ljust(22) + "|" + "|".join(v.rjust(11) + " " for v in values) + "|")
    out.append(double)
    return "\n".join(out) + "\n"
