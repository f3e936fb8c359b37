"""Copies between host memory and "tpu": how long a 256 MB copy takes to return and to finish,
blocking and non-blocking (pinned memory), against a torch CPU copy of the same bytes in the same
run; and a training loop fed by a DataLoader with pin_memory=True, its batches copied with and
without non_blocking, against the same loop in torch on CPU."""
import statistics
import time

import torch
import torchtpu  # noqa: F401

MB = 256
REPS = 7


def timed(copy):
    """Median seconds for `copy()` to return, and to finish (through torch.tpu.synchronize)."""
    returned, finished = [], []
    for _ in range(REPS):
        torch.tpu.synchronize()
        t0 = time.perf_counter()
        result = copy()  # held: freeing the last result's memory is not the copy's time
        t1 = time.perf_counter()
        torch.tpu.synchronize()
        t2 = time.perf_counter()
        del result
        returned.append(t1 - t0)
        finished.append(t2 - t0)
    return statistics.median(returned), statistics.median(finished)


def copies():
    n = MB * 1024 * 1024 // 4
    src_cpu, dst_cpu = torch.randint(0, 100, (n,), dtype=torch.int32), torch.empty(n, dtype=torch.int32)
    cpu, _ = timed(lambda: dst_cpu.copy_(src_cpu))
    a = torch.randint(0, 100, (n,), dtype=torch.int32, device="tpu")
    b = torch.randint(0, 100, (n,), dtype=torch.int32, device="tpu")
    pinned_out = torch.empty(n, dtype=torch.int32).pin_memory()
    pinned_in = src_cpu.pin_memory()
    print(f"{MB} MB int32; torch CPU copy_ between two CPU tensors: {cpu * 1e3:7.1f} ms")
    rows = [
        ("tpu -> pinned, result of a + b not yet run, blocking", lambda: pinned_out.copy_(a + b)),
        ("tpu -> pinned, result of a + b not yet run, non_blocking", lambda: pinned_out.copy_(a + b, non_blocking=True)),
        ("pinned -> tpu, blocking", lambda: pinned_in.to("tpu")),
        ("pinned -> tpu, non_blocking", lambda: pinned_in.to("tpu", non_blocking=True)),
        ("pageable -> tpu, non_blocking (a synchronous copy)", lambda: src_cpu.to("tpu", non_blocking=True)),
    ]
    for name, copy in rows:
        ret, fin = timed(copy)
        print(f"  {name:58s} returns {ret * 1e3:7.1f} ms, done {fin * 1e3:7.1f} ms ({fin / cpu:5.2f}x the CPU copy)")
    torch.tpu.synchronize()
    assert torch.equal(pinned_out, (a + b).cpu()) and torch.equal(pinned_in.to("tpu", non_blocking=True).cpu(), src_cpu)


def trainer(device, steps=40, batch=512, width=2048):
    """One epoch of a training loop as a function of non_blocking: (steps/s, last loss)."""
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(steps * batch, width), torch.randn(steps * batch, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=batch, pin_memory=device != "cpu")
    model = torch.nn.Sequential(torch.nn.Linear(width, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def epoch(non_blocking):
        t0 = time.perf_counter()
        for x, y in loader:
            x, y = x.to(device, non_blocking=non_blocking), y.to(device, non_blocking=non_blocking)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            last = loss.item()  # logged every step: the next batch's copy follows a read
        return steps / (time.perf_counter() - t0), last

    return epoch


def training():
    print("training loop, DataLoader(pin_memory=True), batch 512 x 2048 float32 (4 MB), MLP 2048-512-1, SGD,")
    print("the loss read every step; steps/s, median of 5 epochs of 40 steps (tpu: alternating):")
    cpu = trainer("cpu")
    cpu_first = cpu(False)[1]
    cpu_rate = statistics.median(cpu(False)[0] for _ in range(5))
    tpu = trainer("tpu")
    tpu_first = tpu(False)[1]  # compiles, fuses
    rates = {False: [], True: []}
    for _ in range(5):
        for nb in (False, True):
            rates[nb].append(tpu(nb)[0])
    print(f"  torch CPU                   {cpu_rate:7.1f} steps/s; first epoch's last loss {cpu_first:.5f}")
    for nb in (False, True):
        rate = statistics.median(rates[nb])
        print(f"  tpu, non_blocking={str(nb):5s}    {rate:7.1f} steps/s ({rate / cpu_rate:4.2f}x torch CPU)")
    print(f"  tpu first epoch's last loss {tpu_first:.5f}")


def main():
    print(f"platform: {torch.tpu.get_device_name()}")
    copies()
    training()


if __name__ == "__main__":
    main()
