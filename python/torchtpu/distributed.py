"""torch.distributed on "tpu": the c10d backend "tccl".

Registered when torchtpu loads, for devices "tpu" and "cpu", so that under torchrun
`init_process_group()`, `init_process_group("tccl")`, `init_process_group(device_id=
torch.device("tpu", local_rank))` and `init_process_group("cpu:gloo,tpu:tccl")` all work, and
DDP, FSDP2, DTensor and functional collectives reach it through PyTorch's own c10d ops.

Transport: the CPU plugin has no collectives across processes, so each call runs with a gloo
group of the same ranks, over the same store. Its device memory is host memory: a whole tpu
storage that the engine can hand out (computed, held by that tensor alone) goes to gloo as it
is, read and written in place with no copy; any other tpu tensor (a view, a shared buffer,
another plugin's) is staged through host memory (one host copy of its data) and the result
written back in place. Calls are synchronous: the returned Work is already complete, so
`async_op=True` works and `wait()` returns at once.
"""
import ctypes
import functools
import inspect
import logging
import math
import threading
import zlib

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend
from torch._C._distributed_c10d import _create_work_from_future

NAME = "tccl"
log = logging.getLogger(__name__)


def _done(result):
    fut = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


# Host memory a backend keeps for staging, at most (a collective past it allocates its own).
_SPARE_MAX = 1 << 30
# The collective this thread is running, with its staging memory (`_staged`).
_CURRENT = threading.local()


class _Staging:
    """The host memory of one collective's copies, carved from a buffer its backend reuses from
    call to call: a new allocation per call paid its page faults at every copy (a 256 MiB
    device-to-host copy took 177 ms into a new tensor, 25 ms into a reused one)."""

    def __init__(self, backend):
        self._backend = backend
        self._buf, backend._spare = backend._spare, None  # another thread's call allocates its own
        self._used = 0
        # Host tensors over device memory (`_device_memory`): nothing to write back.
        self.in_place = []

    def empty(self, shape, dtype):
        start = -(-self._used // 64) * 64  # aligned for any dtype's view
        self._used = start + math.prod(shape) * dtype.itemsize
        if self._buf is None or self._used > self._buf.numel():
            return torch.empty(shape, dtype=dtype)
        return self._buf[start:self._used].view(dtype).view(shape)

    def close(self):
        """Hands the buffer back, grown to this call's need (up to _SPARE_MAX) for the next."""
        if (self._buf is None or self._buf.numel() < self._used) and self._used <= _SPARE_MAX:
            self._buf = torch.empty(self._used, dtype=torch.uint8)
        self._backend._spare = self._buf


def _staged(method):
    """Runs a collective with staging memory of its backend's (`_on_host`, `_empty_on_host`)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        stage, outer = _Staging(self), getattr(_CURRENT, "stage", None)
        _CURRENT.stage = stage
        try:
            return method(self, *args, **kwargs)
        finally:
            _CURRENT.stage = outer
            stage.close()

    return run


def _host_like(t):
    stage = getattr(_CURRENT, "stage", None)
    return stage.empty(t.shape, t.dtype) if stage is not None else torch.empty(t.shape, dtype=t.dtype)


def _device_memory(t):
    """A CPU tensor over the device memory of the tpu tensor `t`, or None: only for a whole
    storage that the engine hands out (torchtpu._C.host_alias). Valid for this collective."""
    if t.device.type != "tpu" or not t.is_contiguous() or t.storage_offset() != 0:
        return None
    from . import _C
    from .compile.encoder import DTYPE_CODES
    storage = t.untyped_storage()
    address = _C.host_alias(storage.data_ptr(), DTYPE_CODES[t.dtype], t.numel())
    if address is None:
        return None
    memory = (ctypes.c_ubyte * storage.nbytes()).from_address(address)
    host = torch.frombuffer(memory, dtype=t.dtype).view(t.shape)
    _CURRENT.stage.in_place.append(host)
    return host


def _on_host(tensors, in_place=False):
    """Host tensors holding `tensors`' data: CPU tensors as they are; with `in_place` (the
    collective writes its results there), device memory itself where it can be had; else
    copies."""
    hosts = []
    for t in tensors:
        host = t if t.device.type == "cpu" else (_device_memory(t) if in_place else None)
        hosts.append(host if host is not None else _host_like(t).copy_(t.detach()))
    return hosts


def _empty_on_host(tensors):
    """Host tensors to receive into, shaped like `tensors`: device memory where it can be had."""
    hosts = []
    for t in tensors:
        host = _device_memory(t)
        hosts.append(host if host is not None else _host_like(t))
    return hosts


def _write_back(dsts, hosts):
    in_place = getattr(_CURRENT, "stage", None)
    in_place = in_place.in_place if in_place is not None else []
    with torch.no_grad():
        for d, h in zip(dsts, hosts):
            if d is not h and not any(h is m for m in in_place):
                d.copy_(h)


class HostStagedBackend(_C10dBackend):
    """The c10d backend of device "tpu" on plugins without cross-process collectives."""

    # PyTorch's Python trampoline asks for these properties; unanswered, it recurses.
    supports_splitting = property(lambda self: False)
    supports_coalescing = property(lambda self: False)
    supports_time_estimate = property(lambda self: False)
    supports_shrinking = property(lambda self: False)
    supports_reconfigure = property(lambda self: False)
    supports_window = property(lambda self: False)
    options = property(lambda self: self._options)

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("tccl-host/", store), rank, size, timeout=timeout)
        self._spare = None  # staging memory (_Staging)
        self._options = _C10dBackend.Options(NAME, timeout)
        if rank == 0:
            log.info("torchtpu: c10d backend %s: host staging over gloo (%d ranks)", NAME, size)

    def getBackendName(self):
        return NAME

    def _agree(self, kind, tensors, sizes=True):
        """Raises on every rank when the ranks disagree on the collective, its dtypes or (with
        `sizes`) its element counts: gloo would hang or mix up memory instead."""
        dtypes = zlib.crc32(",".join(str(t.dtype) for t in tensors).encode())
        numel = sum(t.numel() for t in tensors) if sizes else 0
        mine = torch.tensor([zlib.crc32(kind.encode()), len(tensors), dtypes, numel], dtype=torch.int64)
        every = [torch.empty_like(mine) for _ in range(self.size())]
        self._gloo.allgather([every], [mine]).wait()
        if any(not torch.equal(e, every[0]) for e in every):
            shapes = [f"{tuple(t.shape)} {t.dtype}" for t in tensors]
            raise ValueError(
                f"{NAME}: the ranks called {kind} with tensors that disagree in number, dtype or size "
                f"(this rank, {self.rank()}: {shapes}); every rank must pass matching tensors"
            )

    # ---- reductions -----------------------------------------------------------------------

    def _reduce_op(self, opts):
        """The op gloo runs for `opts.reduceOp`, and what to do to the result after (AVG)."""
        op = opts.reduceOp
        if op == dist.ReduceOp.AVG:
            return dist.ReduceOp.SUM, self._average
        if op == dist.ReduceOp.PREMUL_SUM:
            # sum(factor * x) as factor * sum(x): gloo has no PREMUL_SUM (FSDP2 uses it).
            factor = op.factor.item() if isinstance(op.factor, torch.Tensor) else float(op.factor)
            return dist.ReduceOp.SUM, lambda hosts: [h.mul_(factor) for h in hosts]
        return op, None

    def _average(self, hosts):
        for h in hosts:
            if h.is_floating_point() or h.is_complex():
                h.div_(self.size())
            else:
                h.copy_(torch.div(h, self.size(), rounding_mode="trunc"))

    @_staged
    def _reduced(self, kind, gloo_call, options, tensors, opts):
        """all_reduce, its coalesced form and reduce: gloo reduces the host copies with the op
        it has (`options`: a new options object of the gloo call's type)."""
        self._agree(kind, tensors)
        op, after = self._reduce_op(opts)
        o = options()
        o.reduceOp, o.timeout = op, opts.timeout
        if isinstance(o, dist.ReduceOptions):
            o.rootRank, o.rootTensor = opts.rootRank, opts.rootTensor
        hosts = _on_host(tensors, in_place=True)
        gloo_call(hosts, o).wait()
        if after:
            after(hosts)
        _write_back(tensors, hosts)
        return _done(list(tensors))

    def allreduce(self, tensors, opts):
        return self._reduced("all_reduce", self._gloo.allreduce, dist.AllreduceOptions, tensors, opts)

    def allreduce_coalesced(self, tensors, opts):
        return self._reduced("all_reduce_coalesced", self._gloo.allreduce_coalesced, dist.AllreduceCoalescedOptions,
                             tensors, opts)

    def reduce(self, tensors, opts):
        return self._reduced("reduce", self._gloo.reduce, dist.ReduceOptions, tensors, opts)

    @_staged
    def reduce_scatter(self, outputs, input_lists, opts):
        self._agree("reduce_scatter", [t for ins in input_lists for t in ins])
        op, after = self._reduce_op(opts)
        hosts_out = _on_host(outputs)
        hosts_in = [_on_host(ins) for ins in input_lists]
        o = dist.ReduceScatterOptions()
        o.reduceOp, o.timeout = op, opts.timeout
        self._gloo.reduce_scatter(hosts_out, hosts_in, o).wait()
        if after:
            after(hosts_out)
        _write_back(outputs, hosts_out)
        return _done(list(outputs))

    @_staged
    def reduce_scatter_single(self, output, input, opts):
        self._agree("reduce_scatter_tensor", [input, output])
        op, after = self._reduce_op(opts)
        (host_in,) = _on_host([input])
        (host_out,) = _empty_on_host([output])
        o = dist.ReduceScatterOptions()
        o.reduceOp, o.timeout = op, opts.timeout
        self._gloo.reduce_scatter_single(host_out, host_in.contiguous(), o).wait()
        if after:
            after([host_out])
        _write_back([output], [host_out])
        return _done([output])

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        for out, inp in zip(outputs, inputs):
            self.reduce_scatter_single(out, inp, opts)
        return _done(list(outputs))

    # ---- data movement --------------------------------------------------------------------

    @_staged
    def broadcast(self, tensors, opts):
        self._agree("broadcast", tensors)
        hosts = _on_host(tensors, in_place=True)
        self._gloo.broadcast(hosts, opts).wait()
        _write_back(tensors, hosts)
        return _done(list(tensors))

    @_staged
    def _into_lists(self, kind, gloo_call, output_lists, inputs, opts):
        """all_gather and gather: the ranks' inputs land in lists of outputs."""
        self._agree(kind, inputs)
        hosts_out = [_empty_on_host(outs) for outs in output_lists]
        gloo_call(hosts_out, _on_host(inputs), opts).wait()
        for outs, hosts in zip(output_lists, hosts_out):
            _write_back(outs, hosts)
        return _done([t for outs in output_lists for t in outs])

    @_staged
    def _single(self, kind, gloo_call, output, input, *args, sizes=True):
        """The one-tensor collectives (all_gather_into_tensor, all_to_all_single)."""
        self._agree(kind, [input, output], sizes=sizes)
        (host_in,) = _on_host([input])
        (host_out,) = _empty_on_host([output])
        gloo_call(host_out, host_in.contiguous(), *args).wait()
        _write_back([output], [host_out])
        return _done([output])

    def allgather(self, output_lists, inputs, opts):
        return self._into_lists("all_gather", self._gloo.allgather, output_lists, inputs, opts)

    def allgather_coalesced(self, output_lists, inputs, opts):
        return self.allgather(output_lists, inputs, opts)

    def gather(self, output_lists, inputs, opts):
        return self._into_lists("gather", self._gloo.gather, output_lists, inputs, opts)

    def all_gather_single(self, output, input, opts):
        return self._single("all_gather_into_tensor", self._gather_concatenated, output, input, opts)

    def _gather_concatenated(self, host_out, host_in, opts):
        """NCCL takes any output holding world_size inputs' elements (SyncBatchNorm's is
        [1, world_size * n], others stack them); gloo wants the inputs concatenated along
        dim 0: the output is viewed so."""
        if host_in.dim() > 0 and host_out.is_contiguous():
            host_out = host_out.view(-1, *host_in.shape[1:])
        return self._gloo.all_gather_single(host_out, host_in, opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts):
        for out, inp in zip(outputs, inputs):
            self.all_gather_single(out, inp, opts)
        return _done(list(outputs))

    def all_to_all_single(self, output, input, output_splits, input_splits, opts):
        return self._single("all_to_all_single", self._gloo.all_to_all_single, output, input, output_splits, input_splits,
                            opts, sizes=False)

    @_staged
    def alltoall(self, outputs, inputs, opts):
        self._agree("all_to_all", inputs, sizes=False)
        hosts_out = _empty_on_host(outputs)
        self._gloo.alltoall(hosts_out, [h.contiguous() for h in _on_host(inputs)], opts).wait()
        _write_back(outputs, hosts_out)
        return _done(list(outputs))

    @_staged
    def scatter(self, outputs, input_lists, opts):
        self._agree("scatter", outputs)
        hosts_out = _empty_on_host(outputs)
        self._gloo.scatter(hosts_out, [_on_host(ins) for ins in input_lists], opts).wait()
        _write_back(outputs, hosts_out)
        return _done(list(outputs))

    @_staged
    def send(self, tensors, dst, tag):
        self._gloo.send([h.contiguous() for h in _on_host(tensors)], dst, tag).wait()
        return _done(list(tensors))

    @_staged
    def recv(self, tensors, src, tag):
        hosts = _empty_on_host(tensors)
        self._gloo.recv(hosts, src, tag).wait()
        _write_back(tensors, hosts)
        return _done(list(tensors))

    @_staged
    def recv_anysource(self, tensors, tag):
        hosts = _empty_on_host(tensors)
        self._gloo.recv_anysource(hosts, tag).wait()
        _write_back(tensors, hosts)
        return _done(list(tensors))

    def barrier(self, opts):
        o = dist.BarrierOptions()
        o.timeout = opts.timeout
        self._gloo.barrier(o).wait()
        return _done([])


def _create(opts, backend_options):
    return HostStagedBackend(opts.store, opts.group_rank, opts.group_size, opts.timeout)


def _is_tccl_group(group):
    backend = str(dist.get_backend(group))
    return backend == NAME or f"tpu:{NAME}" in backend.split(",")


def _splitting_through_new_group(split_group):
    """torch's split_group, which DeviceMesh calls to make its subgroups once the default group
    is bound to a device (init_process_group(device_id=...)), asks the parent group's backend to
    split itself, which a backend written in Python cannot answer. For a tccl parent each rank
    makes the group of its split with new_group instead, synchronized among that split's members
    only (as a split is); the group keeps the split's rank order and the parent's device."""

    @functools.wraps(split_group)
    def split(parent_pg=None, split_ranks=None, timeout=None, pg_options=None, group_desc=None, backend=None):
        parent = parent_pg or dist.distributed_c10d._get_default_group()
        if not _is_tccl_group(parent):
            return split_group(parent_pg, split_ranks, timeout, pg_options, group_desc, backend)
        if not split_ranks:
            raise ValueError("split_ranks cannot be None or empty")
        for ranks in split_ranks:
            if len(ranks) == 0:
                raise ValueError("the split group cannot be empty")
            if len(ranks) != len(set(ranks)):
                raise ValueError("the split group cannot have duplicate ranks")
        me = dist.get_rank(parent)
        mine = next((ranks for ranks in split_ranks if me in ranks), None)
        if mine is None:
            return dist.GroupMember.NON_GROUP_MEMBER
        global_ranks = dist.get_process_group_ranks(parent)
        # (new_group sorts the ranks unless told not to, where it can be: torch 2.13 on.)
        keep_order = {"sort_ranks": False} if "sort_ranks" in inspect.signature(dist.new_group).parameters else {}
        group = dist.new_group([global_ranks[r] for r in mine], timeout=timeout, backend=backend, pg_options=pg_options,
                               use_local_synchronization=True, group_desc=group_desc, **keep_order)
        group.bound_device_id = parent.bound_device_id
        return group

    return split


def _groups_with_tpu_tensors(new_group):
    """torch's new_group makes a group on the device the default group is bound to
    (init_process_group(device_id=...)), and asks the new group's backend for it. A gloo group
    (new_group(backend="gloo"), as checkpointing and TorchTitan make for CPU-side work) has no
    tpu backend; on CUDA gloo itself covers the device. Here such a group gets tccl for its
    tpu tensors: "gloo" becomes "cpu:gloo,tpu:tccl"."""

    @functools.wraps(new_group)
    def make(ranks=None, timeout=None, backend=None, *args, **kwargs):
        bound = getattr(dist.distributed_c10d._get_default_group(), "bound_device_id", None) if dist.is_initialized() else None
        if backend is not None and bound is not None and bound.type == "tpu" and kwargs.get("device_id") is None:
            name = str(backend).lower()
            devices = dist.Backend.backend_capability.get(name) if ":" not in name else [
                part.split(":")[0] for part in name.split(",")]
            if devices is not None and "tpu" not in devices and "cpu" in devices:
                backend = (f"cpu:{name}" if ":" not in name else name) + f",tpu:{NAME}"
        return new_group(ranks, timeout, backend, *args, **kwargs)

    return make


def register():
    """Registers "tccl" as the c10d backend of device "tpu" (and of CPU tensors in its groups)."""
    if not dist.is_available() or NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu", "tpu"])
    # DeviceMesh imported split_group and new_group by name: every reference takes these.
    import torch.distributed.device_mesh as device_mesh

    c10d = dist.distributed_c10d
    split = _splitting_through_new_group(c10d.split_group) if hasattr(c10d, "split_group") else None
    make = _groups_with_tpu_tensors(c10d.new_group)
    for module in (c10d, dist, device_mesh):
        if split is not None and getattr(module, "split_group", None) is not None:
            module.split_group = split
        if getattr(module, "new_group", None) is not None:
            module.new_group = make
