"""One rank of the torch.distributed tests, run by a real torchrun (tests/test_distributed.py).

    torchrun --nproc-per-node 2 tests/distributed_worker.py INIT OUT_DIR CHECK...

INIT is how the process group starts: "none" (no backend named), "device_id" (the rank's tpu
device named), "string" ("cpu:gloo,tpu:tccl"). Each CHECK runs on every rank and compares the
distributed result with the same computation done on one process (every rank can rebuild every
rank's inputs: they are seeded by rank). Each rank writes OUT_DIR/rank<r>.json: check -> "ok" or
the error.
"""
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
LOCAL_RANK = int(os.environ["LOCAL_RANK"])
DEV = torch.device("tpu", LOCAL_RANK)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "int32": torch.int32, "int64": torch.int64}
OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN, "product": dist.ReduceOp.PRODUCT}


def data(rank, shape, dtype, salt=0):
    """The input rank `rank` contributes (the same on every process that asks)."""
    g = torch.Generator().manual_seed(1000 * salt + rank)
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=g) * 2 + 0.5).to(dtype)
    return torch.randint(-5, 6, shape, generator=g).to(dtype)


def reduce_all(xs, op):
    stacked = torch.stack([x.double() if x.is_floating_point() else x for x in xs])
    if op == "sum":
        r = stacked.sum(0)
    elif op == "avg":
        r = stacked.sum(0) / len(xs) if xs[0].is_floating_point() else torch.div(stacked.sum(0), len(xs), rounding_mode="trunc")
    elif op == "max":
        r = stacked.max(0).values
    elif op == "min":
        r = stacked.min(0).values
    else:
        r = stacked.prod(0)
    return r.to(xs[0].dtype)


def close(got, want, what, tol=None):
    got = got.cpu()
    if tol is None:
        tol = {torch.bfloat16: 2e-2, torch.float16: 2e-3}.get(want.dtype, 1e-6)
    if want.is_floating_point():
        ok = torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)
    else:
        ok = torch.equal(got, want)
    assert ok and got.dtype == want.dtype and got.shape == want.shape, f"{what}: got {got} want {want}"


# ---- collectives --------------------------------------------------------------------------------


def check_all_reduce():
    for dname, dtype in DTYPES.items():
        for oname, op in OPS.items():
            # A view inside a larger tensor: the reduction lands in the view, the rest is kept.
            base = torch.full((3, 8), -7, dtype=dtype, device=DEV)
            x = data(RANK, (2, 4), dtype)
            view = base[1:, 2:6]
            view.copy_(x.to(DEV))
            dist.all_reduce(view, op=op)
            want = base.cpu().clone()
            want[1:, 2:6] = reduce_all([data(r, (2, 4), dtype) for r in range(WORLD)], oname)
            close(base, want, f"all_reduce {oname} {dname}")


def check_premul_sum():
    # FSDP2 reduces with PREMUL_SUM when a gradient divide factor is set.
    for dtype in (torch.float32, torch.bfloat16):
        x = data(RANK, (6,), dtype).to(DEV)
        dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.25))
        close(x, (reduce_all([data(r, (6,), dtype) for r in range(WORLD)], "sum").double() * 0.25).to(dtype), "premul_sum all_reduce")
        out = torch.empty(3, dtype=dtype, device=DEV)
        full = [data(r, (WORLD * 3,), dtype, salt=2) for r in range(WORLD)]
        dist.reduce_scatter_tensor(out, full[RANK].to(DEV), op=dist._make_nccl_premul_sum(2.0))
        close(out, (reduce_all(full, "sum").double() * 2.0).to(dtype).chunk(WORLD)[RANK], "premul_sum reduce_scatter")


def check_async_and_zero_d():
    x = torch.tensor(float(RANK + 1), device=DEV)
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    close(x, torch.tensor(float(sum(range(1, WORLD + 1)))), "async 0-d all_reduce")
    e = torch.empty(0, device=DEV)
    dist.all_reduce(e)
    assert e.numel() == 0


def check_broadcast():
    for dname, dtype in DTYPES.items():
        x = data(RANK, (5,), dtype).to(DEV)
        dist.broadcast(x, src=WORLD - 1)
        close(x, data(WORLD - 1, (5,), dtype), f"broadcast {dname}")


def check_all_gather():
    for dname, dtype in DTYPES.items():
        outs = [torch.empty(3, dtype=dtype, device=DEV) for _ in range(WORLD)]
        dist.all_gather(outs, data(RANK, (3,), dtype).to(DEV))
        for r in range(WORLD):
            close(outs[r], data(r, (3,), dtype), f"all_gather {dname} from {r}")
        out = torch.empty(WORLD * 2, 3, dtype=dtype, device=DEV)
        dist.all_gather_into_tensor(out, data(RANK, (2, 3), dtype).to(DEV))
        close(out, torch.cat([data(r, (2, 3), dtype) for r in range(WORLD)]), f"all_gather_into_tensor {dname}")


def check_reduce_scatter():
    for dname, dtype in DTYPES.items():
        for oname, op in [("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG), ("max", dist.ReduceOp.MAX)]:
            full = [data(r, (WORLD * 2, 3), dtype, salt=1) for r in range(WORLD)]
            want = reduce_all(full, oname).chunk(WORLD)[RANK]
            out = torch.empty(2, 3, dtype=dtype, device=DEV)
            dist.reduce_scatter_tensor(out, full[RANK].to(DEV), op=op)
            close(out, want, f"reduce_scatter_tensor {oname} {dname}")
            out = torch.empty(2, 3, dtype=dtype, device=DEV)
            dist.reduce_scatter(out, [c.to(DEV) for c in full[RANK].chunk(WORLD)], op=op)
            close(out, want, f"reduce_scatter {oname} {dname}")


def check_reduce_gather_scatter():
    # Collectives with a root: reduce (MAX), gather and scatter to and from the last rank.
    root = WORLD - 1
    x = data(RANK, (4,), torch.float32).to(DEV)
    dist.reduce(x, dst=root, op=dist.ReduceOp.MAX)
    if RANK == root:
        close(x, reduce_all([data(r, (4,), torch.float32) for r in range(WORLD)], "max"), "reduce to the root")
    outs = [torch.empty(3, dtype=torch.int64, device=DEV) for _ in range(WORLD)] if RANK == root else None
    dist.gather(data(RANK, (3,), torch.int64).to(DEV), gather_list=outs, dst=root)
    if RANK == root:
        for r in range(WORLD):
            close(outs[r], data(r, (3,), torch.int64), f"gather from {r}")
    got = torch.empty(2, device=DEV)
    chunks = [data(root, (WORLD, 2), torch.float32)[r].to(DEV) for r in range(WORLD)] if RANK == root else None
    dist.scatter(got, scatter_list=chunks, src=root)
    close(got, data(root, (WORLD, 2), torch.float32)[RANK], "scatter")


def check_all_to_all():
    # Uneven splits: rank r sends r + 1 + j rows to rank j.
    send = [RANK + 1 + j for j in range(WORLD)]
    recv = [r + 1 + RANK for r in range(WORLD)]
    inp = data(RANK, (sum(send), 2), torch.float32)
    out = torch.empty(sum(recv), 2, device=DEV)
    dist.all_to_all_single(out, inp.to(DEV), output_split_sizes=recv, input_split_sizes=send)
    want = torch.cat([data(r, (sum(r + 1 + j for j in range(WORLD)), 2), torch.float32).split([r + 1 + j for j in range(WORLD)])[RANK] for r in range(WORLD)])
    close(out, want, "all_to_all_single")
    outs = [torch.empty(2, device=DEV) for _ in range(WORLD)]
    dist.all_to_all(outs, [data(RANK, (WORLD, 2), torch.float32)[j].to(DEV) for j in range(WORLD)])
    for r in range(WORLD):
        close(outs[r], data(r, (WORLD, 2), torch.float32)[RANK], f"all_to_all from {r}")


def check_send_recv_and_barrier():
    x = torch.zeros(4, dtype=torch.int64, device=DEV)
    if RANK == 0:
        dist.send(data(0, (4,), torch.int64).to(DEV), dst=1)
    elif RANK == 1:
        dist.recv(x, src=0)
        close(x, data(0, (4,), torch.int64), "recv")
    dist.barrier()


def check_objects():
    objs = [None] * WORLD
    dist.all_gather_object(objs, {"rank": RANK, "tensor": torch.arange(RANK + 1)})
    assert [o["rank"] for o in objs] == list(range(WORLD))
    lst = [RANK * 10, "x"]
    dist.broadcast_object_list(lst, src=1)
    assert lst == [10, "x"]


def check_subgroup():
    # A group of the odd ranks, and one of every rank in reverse order.
    odd = dist.new_group([r for r in range(WORLD) if r % 2 == 1])
    rev = dist.new_group(list(reversed(range(WORLD))))
    x = torch.tensor([float(RANK + 1)], device=DEV)
    if RANK % 2 == 1:
        dist.all_reduce(x, group=odd)
        close(x, torch.tensor([float(sum(r + 1 for r in range(WORLD) if r % 2 == 1))]), "odd subgroup")
    y = torch.tensor([float(RANK)], device=DEV)
    dist.all_reduce(y, group=rev, op=dist.ReduceOp.MAX)
    close(y, torch.tensor([float(WORLD - 1)]), "reversed group")


def check_gloo_subgroup():
    # new_group(backend="gloo") (CPU-side groups, as checkpointing makes them): its CPU tensors
    # go through gloo, and under a default group bound to a tpu device its tpu tensors through
    # tccl (on CUDA gloo covers the device itself).
    group = dist.new_group(list(range(WORLD)), backend="gloo")
    x = data(RANK, (6,), torch.float32)
    dist.all_reduce(x, group=group)
    close(x, reduce_all([data(r, (6,), torch.float32) for r in range(WORLD)], "sum"), "gloo group, CPU tensor", tol=1e-5)
    y = data(RANK, (6,), torch.float32).to(DEV)
    dist.all_reduce(y, group=group)
    close(y, reduce_all([data(r, (6,), torch.float32) for r in range(WORLD)], "sum"), "gloo group, tpu tensor", tol=1e-5)


def check_staging_reuse():
    # The backend stages each collective's copies in host memory it reuses from call to call:
    # sizes that grow and shrink (empty included), dtypes that change, a collective whose inputs
    # and outputs share that memory, and outputs that are views, each against the one-process
    # result.
    for i, n in enumerate([1000, 7, 0, 5000, 3, 1000]):
        dtype = [torch.float32, torch.int64, torch.bfloat16][i % 3]
        x = data(RANK, (n,), dtype, salt=i).to(DEV)
        dist.all_reduce(x)
        close(x, reduce_all([data(r, (n,), dtype, salt=i) for r in range(WORLD)], "sum"), f"all_reduce {n} {dtype}")
        outs = [torch.zeros(2 * n + 1, dtype=dtype, device=DEV)[1::2] for _ in range(WORLD)]
        dist.all_gather(outs, data(RANK, (n,), dtype, salt=i).to(DEV))
        for r in range(WORLD):
            close(outs[r], data(r, (n,), dtype, salt=i), f"all_gather {n} {dtype} from {r}")


def check_in_place_device_memory():
    # On the CPU plugin a whole computed storage goes to gloo as device memory, written in
    # place: the results must match, and nothing that shares or still reads the old value may
    # see the write.
    import torchtpu.distributed as td

    handed_out = []
    real = td._device_memory

    def counting(t):
        host = real(t)
        handed_out.append(host is not None)
        return host

    td._device_memory = counting
    try:
        want = reduce_all([data(r, (64, 3), torch.float32) for r in range(WORLD)], "sum")
        x = data(RANK, (64, 3), torch.float32).to(DEV) * 1  # computed by a program (fused eager: recorded)
        later = x * 2  # queued before the collective: reads the old value
        alias = x.detach()  # the same storage: sees the result
        dist.all_reduce(x)
        close(x, want, "all_reduce into device memory", tol=1e-5)
        close(alias, want, "a tensor of the same storage", tol=1e-5)
        close(later, data(RANK, (64, 3), torch.float32) * 2, "a computation queued before the collective", tol=1e-6)
        if torch.tpu.get_device_name() == "XLA CPU":
            assert handed_out and handed_out[-1], f"the computed storage was staged, not used in place: {handed_out}"
        # A buffer two storages share (a whole-tensor copy may share it) is staged: the source
        # keeps its value.
        src = data(RANK, (64, 3), torch.float32).to(DEV) + 0
        dst = torch.empty_like(src)
        dst.copy_(src)
        dist.all_reduce(dst)
        close(dst, want, "all_reduce of a copy", tol=1e-5)
        close(src, data(RANK, (64, 3), torch.float32), "the copy's source", tol=1e-6)
        # Outputs in device memory: all_gather_into_tensor and broadcast.
        out = torch.zeros(WORLD * 5, device=DEV) + 0
        dist.all_gather_into_tensor(out, data(RANK, (5,), torch.float32).to(DEV) + 0)
        close(out, torch.cat([data(r, (5,), torch.float32) for r in range(WORLD)]), "all_gather_into_tensor", tol=1e-6)
        b = data(RANK, (7,), torch.bfloat16).to(DEV) + 0
        dist.broadcast(b, src=0)
        close(b, data(0, (7,), torch.bfloat16), "broadcast")
        # An earlier op's failure raises at the collective, with its own class, on every rank.
        y = data(RANK, (4,), torch.float32).to(DEV) * 1
        y[torch.tensor([7], device=DEV)]
        try:
            dist.all_reduce(y)
        except IndexError:
            pass
        else:
            raise AssertionError("an out-of-range index before all_reduce did not raise IndexError")
        dist.all_reduce(y)
        close(y, reduce_all([data(r, (4,), torch.float32) for r in range(WORLD)], "sum"), "all_reduce after a failure", tol=1e-6)
    finally:
        td._device_memory = real


def check_mismatched_sizes_raise():
    # Ranks that disagree on the size must get an error, not corrupted memory.
    x = torch.ones(4 + RANK, device=DEV)
    try:
        dist.all_reduce(x)
    except (RuntimeError, ValueError):
        return
    raise AssertionError("all_reduce of mismatched sizes did not raise")


def check_functional():
    import torch.distributed._functional_collectives as funcol

    x = data(RANK, (4,), torch.float32).to(DEV)
    got = funcol.all_reduce(x, "sum", dist.group.WORLD)
    close(got, reduce_all([data(r, (4,), torch.float32) for r in range(WORLD)], "sum"), "funcol all_reduce")
    got = funcol.all_gather_tensor(x, 0, dist.group.WORLD)
    close(got, torch.cat([data(r, (4,), torch.float32) for r in range(WORLD)]), "funcol all_gather_tensor")


# ---- the PyTorch stack ----------------------------------------------------------------------------


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


def batch(n=8):
    g = torch.Generator().manual_seed(7)
    return torch.randn(n * WORLD, 8, generator=g), torch.randn(n * WORLD, 4, generator=g)


def train_step(model, opt, x, y):
    """One MSE training step of `model` on the batch (x, y)."""
    opt.zero_grad()
    nn.functional.mse_loss(model(x.to(DEV)), y.to(DEV)).backward()
    opt.step()


def check_ddp():
    from torch.nn.parallel import DistributedDataParallel as DDP

    x, y = batch()
    ref = mlp().to(DEV)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    model = DDP(mlp().to(DEV), device_ids=None, bucket_cap_mb=0.001, gradient_as_bucket_view=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mine = slice(RANK * 8, (RANK + 1) * 8)
    for step in range(5):
        # One process on the full batch...
        train_step(ref, ref_opt, x, y)
        # ...and DDP on this rank's slice, with one no_sync accumulation step on the way.
        opt.zero_grad()
        if step == 2:
            with model.no_sync():
                (nn.functional.mse_loss(model(x[mine][:4].to(DEV)), y[mine][:4].to(DEV)) * 0.5).backward()
            (nn.functional.mse_loss(model(x[mine][4:].to(DEV)), y[mine][4:].to(DEV)) * 0.5).backward()
        else:
            nn.functional.mse_loss(model(x[mine].to(DEV)), y[mine].to(DEV)).backward()
        opt.step()
    for p, q in zip(model.module.parameters(), ref.parameters()):
        close(p, q.detach().cpu(), "DDP parameters vs one process", tol=1e-5)


def check_sync_batch_norm():
    # nn.SyncBatchNorm in training: each rank normalizes its slice with the whole batch's
    # statistics; outputs, input gradients, weight gradients (summed over ranks) and running
    # statistics equal BatchNorm's on the whole batch in one process.
    g = torch.Generator().manual_seed(3)
    x, dy = torch.randn(4 * WORLD, 3, 5, generator=g), torch.randn(4 * WORLD, 3, 5, generator=g)
    ref = nn.BatchNorm1d(3)
    nn.init.uniform_(ref.weight, 0.5, 1.5, generator=g)
    sync = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.BatchNorm1d(3)))[0].to(DEV)
    sync.load_state_dict(ref.state_dict())
    xr = x.clone().requires_grad_()
    ref(xr).backward(dy)
    mine = slice(RANK * 4, (RANK + 1) * 4)
    xs = x[mine].to(DEV).requires_grad_()
    out = sync(xs)
    out.backward(dy[mine].to(DEV))
    close(out, _bn_out(ref, x)[mine], "SyncBatchNorm output", tol=1e-5)
    close(xs.grad, xr.grad[mine], "SyncBatchNorm input gradient", tol=1e-5)
    for name in ("weight", "bias"):
        grad = getattr(sync, name).grad.clone()
        dist.all_reduce(grad)
        close(grad, getattr(ref, name).grad, f"SyncBatchNorm {name} gradient", tol=1e-5)
    close(sync.running_mean, ref.running_mean, "SyncBatchNorm running_mean", tol=1e-5)
    close(sync.running_var, ref.running_var, "SyncBatchNorm running_var", tol=1e-5)


def _bn_out(ref, x):
    """BatchNorm's training output on x without touching its running statistics."""
    return nn.functional.batch_norm(x, None, None, ref.weight.detach(), ref.bias.detach(), training=True, eps=ref.eps)


def check_ddp_unused_parameters():
    from torch.nn.parallel import DistributedDataParallel as DDP

    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.used, self.unused = nn.Linear(4, 4), nn.Linear(4, 2), nn.Linear(4, 2)

        def forward(self, x):
            return self.used(self.body(x))

    torch.manual_seed(0)
    model = DDP(TwoHeads().to(DEV), find_unused_parameters=True)
    x = data(RANK, (3, 4), torch.float32).to(DEV)
    model(x).sum().backward()
    assert model.module.unused.weight.grad is None
    torch.manual_seed(0)
    ref = TwoHeads()
    sum(ref(data(r, (3, 4), torch.float32)).sum() for r in range(WORLD)).backward()
    close(model.module.body.weight.grad, ref.body.weight.grad / WORLD, "DDP find_unused_parameters grads", tol=1e-5)


def check_fsdp2():
    from torch.distributed.fsdp import fully_shard

    torch.tpu.set_device(LOCAL_RANK)
    x, y = batch()
    ref = mlp().to(DEV)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    model = mlp().to(DEV)
    for i, layer in enumerate(model):
        if isinstance(layer, nn.Linear):
            fully_shard(layer, reshard_after_forward=i % 2 == 0)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    mine = slice(RANK * 8, (RANK + 1) * 8)
    for _ in range(10):
        train_step(ref, ref_opt, x, y)
        train_step(model, opt, x[mine], y[mine])
    for p, q in zip(model.parameters(), ref.parameters()):
        close(p.full_tensor(), q.detach().cpu(), "FSDP2 parameters vs one process", tol=1e-4)


def check_dtensor_and_tp():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.tpu.set_device(LOCAL_RANK)
    mesh = init_device_mesh("tpu", (WORLD,))
    a = torch.arange(24.0).reshape(4 * WORLD // 2, -1) if WORLD == 2 else torch.arange(4.0 * WORLD * 3).reshape(4 * WORLD, 3)
    da = distribute_tensor(a.to(DEV), mesh, [Shard(0)])
    close(da.to_local(), a.chunk(WORLD)[RANK], "distribute_tensor shard")
    close(da.redistribute(mesh, [Replicate()]).to_local(), a, "redistribute to replicate")
    close(da.full_tensor(), a, "full_tensor")
    b = torch.arange(a.shape[1] * 5.0).reshape(a.shape[1], 5)
    db = distribute_tensor(b.to(DEV), mesh, [Replicate()])
    close((da @ db).full_tensor(), a @ b, "sharded matmul")
    # Tensor parallel MLP: column-wise then row-wise, against the unsharded module.
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    tp = parallelize_module(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8)).to(DEV), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    with torch.no_grad():
        for p, q in zip(tp.parameters(), ref.parameters()):
            p.copy_(distribute_tensor(q.detach().to(DEV), mesh, p.placements))
    x = data(0, (3, 8), torch.float32)
    out = tp(x.to(DEV))
    close(out, ref(x).detach(), "TP MLP output", tol=1e-5)
    out.sum().backward()
    ref(x).sum().backward()
    for p, q in zip(tp.parameters(), ref.parameters()):
        close(p.grad.full_tensor(), q.grad, "TP MLP gradient", tol=1e-5)


def check_fsdp2_mixed_precision_uneven():
    # bf16 parameters with float32 gradient reduction, and dim-0 sizes that do not divide by
    # the world size; against one process doing the same rounding.
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.tpu.set_device(LOCAL_RANK)

    def model():
        torch.manual_seed(1)
        return nn.Sequential(nn.Linear(8, 7), nn.Tanh(), nn.Linear(7, 5))

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    sharded = model().to(DEV)
    for layer in (sharded[0], sharded[2]):
        fully_shard(layer, mp_policy=policy)
    fully_shard(sharded, mp_policy=policy)
    x, _ = batch()
    mine = slice(RANK * 8, (RANK + 1) * 8)
    sharded(x[mine].to(DEV)).float().pow(2).mean().backward()
    ref = model().to(torch.bfloat16)
    grads = []
    for r in range(WORLD):
        ref.zero_grad()
        ref(x[r * 8:(r + 1) * 8].to(torch.bfloat16)).float().pow(2).mean().backward()
        grads.append([p.grad.float() for p in ref.parameters()])
    for p, *gs in zip(sharded.parameters(), *grads):
        assert p.grad.dtype == torch.float32
        close(p.grad.full_tensor(), sum(gs) / WORLD, "FSDP2 bf16/f32 gradient", tol=2e-2)


def check_sequence_parallel():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module

    torch.tpu.set_device(LOCAL_RANK)
    mesh = init_device_mesh("tpu", (WORLD,))
    torch.manual_seed(0)
    ref = nn.LayerNorm(6)
    sp = parallelize_module(nn.LayerNorm(6).to(DEV), mesh, SequenceParallel())
    x = data(3, (2, 4 * WORLD, 6), torch.float32)
    out = sp(x[:, RANK * 4:(RANK + 1) * 4].to(DEV))
    close(out.to_local() if hasattr(out, "to_local") else out, ref(x)[:, RANK * 4:(RANK + 1) * 4].detach(), "SequenceParallel LayerNorm", tol=1e-5)
    del Shard


def check_mesh_2d():
    # A 2 x (WORLD / 2) DeviceMesh ("dp", "tp"): each dimension's subgroup reduces over its own
    # ranks only, and a DTensor sharded over both dimensions gathers back whole.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    torch.tpu.set_device(LOCAL_RANK)
    width = WORLD // 2
    mesh = init_device_mesh("tpu", (2, width), mesh_dim_names=("dp", "tp"))
    dp, tp = divmod(RANK, width)
    members = {"dp": [d * width + tp for d in range(2)], "tp": [dp * width + t for t in range(width)]}
    for dim, ranks in members.items():
        y = data(RANK, (5,), torch.float32).to(DEV)
        dist.all_reduce(y, group=mesh.get_group(dim))
        close(y, reduce_all([data(r, (5,), torch.float32) for r in ranks], "sum"), f"all_reduce over {dim}", tol=1e-5)
    a = data(7, (4, 2 * width), torch.float32)
    da = distribute_tensor(a.to(DEV), mesh, [Shard(0), Shard(1)])
    assert tuple(da.to_local().shape) == (2, 2), da.to_local().shape
    close(da.full_tensor(), a, "DTensor sharded over both mesh dimensions")


def check_checkpoint():
    # A sharded state dict saved with torch.distributed.checkpoint and loaded into a fresh model.
    import tempfile

    import torch.distributed.checkpoint as dcp
    from torch.distributed.fsdp import fully_shard

    torch.tpu.set_device(LOCAL_RANK)
    model = mlp(seed=3).to(DEV)
    fully_shard(model)
    path = [tempfile.mkdtemp(prefix="tt-dcp-") if RANK == 0 else None]
    dist.broadcast_object_list(path, src=0)
    dcp.save(model.state_dict(), checkpoint_id=path[0])
    fresh = mlp(seed=4).to(DEV)
    fully_shard(fresh)
    state = fresh.state_dict()
    dcp.load(state, checkpoint_id=path[0])
    fresh.load_state_dict(state)
    for p, q in zip(fresh.parameters(), mlp(seed=3).parameters()):
        close(p.full_tensor(), q.detach(), "checkpoint round trip")


def check_compiled_functional():
    # A functional collective inside a torch.compile'd function.
    import torch.distributed._functional_collectives as funcol

    @torch.compile(backend="tpu")
    def f(x):
        return funcol.all_reduce(x * 2, "sum", dist.group.WORLD) + 1

    got = f(data(RANK, (4,), torch.float32).to(DEV))
    close(got, reduce_all([data(r, (4,), torch.float32) * 2 for r in range(WORLD)], "sum") + 1, "compiled funcol all_reduce", tol=1e-5)


def main():
    init, out_dir, checks = sys.argv[1], sys.argv[2], sys.argv[3:]
    torch.tpu.set_device(LOCAL_RANK)  # as a script would do for cuda
    if init == "none":
        dist.init_process_group()
    elif init == "device_id":
        dist.init_process_group(device_id=DEV)
    else:
        dist.init_process_group("cpu:gloo,tpu:tccl")
    results = {"backend": str(dist.get_backend_config())}
    for name in checks:
        try:
            globals()["check_" + name]()
            results[name] = "ok"
        except Exception:
            results[name] = traceback.format_exc()
    with open(os.path.join(out_dir, f"rank{RANK}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
