"""all_reduce bus bandwidth by message size for the "tpu" backend (tccl, tpu tensors) against
gloo on CPU tensors, in the same run, and a DDP training step with 1 and 2 processes.

Each process is pinned to one core of its own (where the machine has enough), the process
without DDP too: the DDP step then differs from the single step by what the gradients'
all_reduce costs, not by the cores each process's computations get.

    python benches/all_reduce.py            # starts torchrun itself (2 processes on loopback)
"""
import os
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def timed(fn, iters):
    fn()  # the first call compiles (tpu) and connects
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.tpu.synchronize()
    return (time.perf_counter() - t0) / iters


def bandwidth(rank, world):
    if rank == 0:
        print(f"all_reduce (sum, float32), {world} processes; bus bandwidth = bytes * 2(n-1)/n / time")
        print(f"{'size':>10}{'tccl (tpu) GB/s':>18}{'gloo (cpu) GB/s':>18}{'ratio':>8}")
    cpu_group = dist.new_group(backend="gloo")
    size = 1024
    while size <= 256 << 20:
        n = size // 4
        iters = max(3, min(200, (64 << 20) // size))
        x_tpu = torch.ones(n, device="tpu")
        x_cpu = torch.ones(n)
        t_tpu = timed(lambda: dist.all_reduce(x_tpu), iters)
        t_cpu = timed(lambda: dist.all_reduce(x_cpu, group=cpu_group), iters)
        bus = size * 2 * (world - 1) / world / 1e9
        if rank == 0:
            label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
            print(f"{label:>10}{bus / t_tpu:>18.3f}{bus / t_cpu:>18.3f}{t_cpu / t_tpu:>7.2f}x")
        size *= 4


def ddp_step_time(world):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(512, 512) for _ in range(8)]).to("tpu")
    if world > 1:
        model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 512, device="tpu")

    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    # DDP rebuilds its buckets after the first step (new programs), and fused eager mode runs a
    # repeated step as one program from its 8th run on: the timed steps come after both.
    for _ in range(12):
        step()
    return timed(step, 10)


def pin_to_one_core(index):
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[index % len(cores)]})
    torch.set_num_threads(1)


def worker():
    pin_to_one_core(int(os.environ["LOCAL_RANK"]))
    torch.tpu.set_device(int(os.environ["LOCAL_RANK"]))
    # (Not device_id=: torch then asks every new group, the gloo one too, for a tpu backend.)
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    bandwidth(rank, world)
    t = ddp_step_time(world)
    if rank == 0:
        print(f"DDP step (8 x Linear(512), batch 64 per process), {world} processes: {t * 1e3:.1f} ms")
    dist.destroy_process_group()


def single():
    pin_to_one_core(0)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group()
    t = ddp_step_time(1)
    print(f"the same step, 1 process without DDP: {t * 1e3:.1f} ms")
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    if "LOCAL_RANK" in os.environ:
        worker()
    elif sys.argv[1:] == ["--single"]:
        single()
    else:
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        subprocess.run([torchrun, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()), __file__], check=True)
        subprocess.run([sys.executable, __file__, "--single"], check=True)
