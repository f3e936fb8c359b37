"""What a user sees when things go wrong around the device (README "Failure semantics"): a
failed program leaves the device usable and leaks nothing; exiting with work in flight
neither hangs nor crashes; a child forked after the device started gets CUDA's error; Ctrl-C
during a long program raises KeyboardInterrupt once it finishes; threads share the device;
long training keeps memory flat. Each risky case runs in a subprocess."""
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
from helpers import TPU


def _run(code, timeout=300, **kw):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, **kw)


def test_failed_program_leaves_the_device_usable_and_leaks_nothing():
    torch.tpu.synchronize()
    buffers, allocated = torch.tpu.live_buffers(), torch.tpu.memory_allocated()
    for _ in range(3):
        with pytest.raises(torch.OutOfMemoryError):
            torch.ones(2**42, device=TPU).sum().item()
    assert torch.tpu.live_buffers() == buffers and torch.tpu.memory_allocated() == allocated
    assert torch.arange(4.0, device=TPU).sum().item() == 6.0


def test_exit_with_work_in_flight_neither_hangs_nor_crashes():
    out = _run("""
        import torch
        x = torch.randn(256, 256, device="tpu")
        for _ in range(200):
            x = (x @ x).tanh()  # queued, never waited for
        print("queued", flush=True)
    """, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["queued"]


def test_exit_with_compiles_in_flight_neither_hangs_nor_crashes():
    # Forty graphs, each run until fused eager mode queues its fused program to compile ahead
    # of need on a worker thread; the script ends while those compile. A compile left running
    # into the process's teardown crashed it (LLVM errors, heap corruption; the engine's
    # compile_pool test wait_all_returns_only_after_every_submitted_compile has the race).
    out = _run("""
        import torch
        for n in range(1, 41):
            x = torch.randn(n, 33, device="tpu")
            for _ in range(3):
                ((x * 2 + 1).tanh() @ x.T).softmax(-1).sum().item()
        print("queued", flush=True)
    """, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["queued"]


def test_accelerator_host_allocator_calls_do_not_crash():
    # torch.accelerator's host-memory calls (vLLM makes them) go to tpu's host allocator; there
    # was none, and empty_host_cache() dereferenced a null allocator (a segfault).
    out = _run("""
        import torch
        x = torch.ones(4, device="tpu")
        torch.accelerator.empty_host_cache()
        p = torch.ones(8).pin_memory()
        print(p.is_pinned(), (p.to("tpu", non_blocking=True) + x.sum()).sum().item(), flush=True)
    """, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "40.0"]


def test_generator_state_under_fake_tensor_mode_does_not_crash():
    # torch.compile and export trace generators under FakeTensorMode, where a state tensor made
    # through the dispatcher has no data; writing the state into it killed the process.
    out = _run("""
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode
        g = torch.Generator(device="tpu")
        g.manual_seed(7)
        with FakeTensorMode():
            state = g.get_state()
        plain = g.get_state()
        print(type(state).__name__, state.dtype, state.device, bool(torch.equal(state, plain)))
    """)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["Tensor", "torch.uint8", "cpu", "True"]


def test_a_composite_that_reads_a_shape_tensor_does_not_crash():
    # PyTorch's _reshape_from_tensor reads its shape tensor's elements on the host.
    out = _run("""
        import torch
        x = torch.arange(24.0, device="tpu")
        y = torch._reshape_from_tensor(x, torch.tensor([4, 6], device="tpu"))
        print(tuple(y.shape), bool(torch.equal(y.cpu(), torch.arange(24.0).reshape(4, 6))))
        try:
            torch._reshape_from_tensor(x, torch.tensor([4.0, 6.0], device="tpu"))
        except RuntimeError as e:
            print(str(e).replace(" ", "_"))
    """)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["(4,", "6)", "True", "expected_scalar_type_Long_but_found_Float"]


def test_child_forked_after_start_gets_cudas_error():
    out = _run("""
        import os, torch
        x = torch.arange(3.0, device="tpu") + 1
        pid = os.fork()
        if pid == 0:
            ok = torch.tpu._is_in_bad_fork() and torch.tpu.device_count() == 1
            try:
                torch.ones(2, device="tpu").sum().item()
                ok = False
            except RuntimeError as e:
                ok = ok and "Cannot re-initialize tpu in forked subprocess" in str(e) and "spawn" in str(e)
            del x  # an inherited tensor is dropped without touching the plugin
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
        print("parent", (x * 2).cpu().tolist(), torch.tpu._is_in_bad_fork())
    """)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["child 0", "parent [2.0, 4.0, 6.0] False"]


def test_fork_before_start_and_dataloader_workers_are_fine():
    out = _run("""
        import os, torch
        pid = os.fork()  # nothing started yet: the child starts its own client
        if pid == 0:
            os._exit(0 if torch.ones(2, device="tpu").sum().item() == 2.0 else 1)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
        # DataLoader workers (forked) read host data while the parent trains on tpu
        w = torch.ones(4, device="tpu")
        data = torch.utils.data.TensorDataset(torch.arange(16.0).view(8, 2))
        loader = torch.utils.data.DataLoader(data, batch_size=2, num_workers=2)
        print("sum", sum((b.to("tpu").sum() * w[0]).item() for (b,) in loader))
    """)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["child 0", "sum 120.0"]


def test_ctrl_c_during_a_long_program_raises_keyboard_interrupt_and_the_device_stays_usable():
    # The child installs Python's own SIGINT handler: a test runner's worker may hand its
    # children an ignored SIGINT, which Python then keeps.
    code = """
        import signal
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import torch
        x = torch.randn(512, 512, device="tpu") / 23
        print("ready", flush=True)
        try:
            while True:
                for _ in range(20):
                    x = (x @ x).tanh()
                x.sum().item()
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        print(torch.arange(4.0, device="tpu").sum().item(), flush=True)
    """
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    threading.Event().wait(1.0)
    p.send_signal(signal.SIGINT)
    try:
        out, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 0, err[-2000:]
    assert out.split() == ["interrupted", "6.0"]


def test_threads_share_the_device():
    def work(seed, results):
        g = torch.Generator().manual_seed(seed)
        a = torch.randn(8 + seed, 16, generator=g)
        b = torch.randn(16, 4, generator=g)
        ref = (a @ b).relu().sum(0)
        for _ in range(50):
            got = (a.to(TPU) @ b.to(TPU)).relu().sum(0).cpu()
            if not torch.allclose(got, ref, atol=1e-5):
                results[seed] = False
                return
        results[seed] = True

    results = {}
    threads = [threading.Thread(target=work, args=(s, results)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {0: True, 1: True, 2: True, 3: True}


def _rss_bytes():
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_three_thousand_training_steps_keep_memory_flat():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(TPU)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    x, y = torch.randn(64, 16, device=TPU), torch.randn(64, 1, device=TPU)

    def steps(n):
        for _ in range(n):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        return loss.item()

    steps(300)  # compiles, optimizer state, caches warm
    buffers, allocated, rss = torch.tpu.live_buffers(), torch.tpu.memory_allocated(), _rss_bytes()
    steps(2700)
    assert torch.tpu.live_buffers() == buffers
    assert torch.tpu.memory_allocated() == allocated
    assert _rss_bytes() - rss < 16 * 2**20, (_rss_bytes() - rss) / 2**20


def test_an_out_on_the_host_for_tpu_inputs_raises():
    # 0-d tpu inputs pass the dispatcher's device check, so a CPU out= reached the engine,
    # which wrote it as a tpu tensor (SIGSEGV); found by the conformance run's out= check.
    proc = _run("""
        import torch
        a, b = torch.randn(()).to("tpu"), torch.randn(3, device="tpu")
        for name, call in [("add", lambda: torch.add(a, a, out=torch.empty(()))),
                           ("mul", lambda: torch.mul(a, a, out=torch.empty(3))),
                           ("exp", lambda: torch.exp(b, out=torch.empty(3))),
                           ("sum", lambda: torch.sum(b, 0, out=torch.empty(())))]:
            try:
                call()
                print(name, "ran")
            except RuntimeError as e:
                print(name, str(e))
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 4, proc.stdout
    assert all(line.endswith("Expected out tensor to have device tpu:0, but got cpu instead") for line in lines), lines
