"""Device "tpu": the device module, transfers, views, in-place writes, errors, buffers."""
import subprocess
import sys

import pytest
import torch
from helpers import TPU, check, check_error, make

import torchtpu


def test_device_module():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() >= 1
    assert torch.tpu.get_device_name() == "XLA CPU"
    assert torch.tpu.current_device() == 0
    x = torch.ones(2, device="tpu")
    assert x.is_tpu and x.device == torch.device("tpu", 0)
    assert torch.randn(2).tpu().is_tpu
    assert torch.nn.Linear(2, 2).tpu().weight.is_tpu
    assert torch.accelerator.current_accelerator().type == "tpu"
    assert torch.accelerator.device_count() >= 1
    torch.tpu.synchronize()
    torch.accelerator.synchronize()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16,
                                   torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool])
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3), (2, 0, 4), (4, 5, 6)])
def test_roundtrip(dtype, shape):
    x = make(shape, dtype)
    y = x.to("tpu")
    assert y.shape == x.shape and y.dtype == x.dtype
    torch.testing.assert_close(y.cpu(), x)


def test_roundtrip_views():
    x = make((6, 8))
    y = x.to("tpu")
    for view in (lambda t: t.t(), lambda t: t[::2, 1::3], lambda t: t[1:4], lambda t: t[:, 2],
                 lambda t: t[:1].expand(5, 8), lambda t: t.unsqueeze(1).expand(6, 3, 8), lambda t: t[2, 3]):
        torch.testing.assert_close(view(y).cpu(), view(x))
        torch.testing.assert_close(view(y).contiguous().cpu(), view(x).contiguous())


def test_copy_into_views():
    x = make((5, 6))
    y = x.to("tpu")
    src = make((3, 6))
    x[1:4] = src
    y[1:4] = src.to("tpu")
    torch.testing.assert_close(y.cpu(), x)
    x.t()[2] = 7.0
    y.t()[2] = 7.0
    torch.testing.assert_close(y.cpu(), x)
    x[::2, ::3] = make((3, 2))[0]
    y[::2, ::3] = x[::2, ::3].clone().to("tpu")
    torch.testing.assert_close(y.cpu(), x)


def test_item_tolist_print():
    x = torch.tensor([[1.5, -2.0], [3.0, 4.25]])
    y = x.to("tpu")
    assert y[1, 1].item() == 4.25
    assert y.tolist() == x.tolist()
    assert "tpu:0" in repr(y)
    assert str(x.numpy().round(2)[0][0]) in str(y)


def test_inplace_and_aliasing():
    x = make((4, 4))
    y = x.to("tpu")
    v = y[1:3]
    v.add_(1.0)
    x[1:3].add_(1.0)
    torch.testing.assert_close(y.cpu(), x)
    y.mul_(y)
    x.mul_(x)
    torch.testing.assert_close(y.cpu(), x)
    y.t().sub_(torch.ones(4, device="tpu"))
    x.t().sub_(torch.ones(4))
    torch.testing.assert_close(y.cpu(), x)


def test_out_argument_resizes():
    a, b = make((3, 4)), make((3, 4))
    out = torch.empty(0, device="tpu")
    torch.add(a.to("tpu"), b.to("tpu"), out=out)
    torch.testing.assert_close(out.cpu(), a + b)


def test_resize_output_as_meta_tensors_do():
    # PyTorch has torch._resize_output_ for meta tensors only; tpu's follows it.
    for device in ("meta", "tpu"):
        x = torch.empty(2, device=device)
        with pytest.raises(RuntimeError, match="out Tensor doesn't have the correct device set"):
            torch._resize_output_(x, [3], torch.device("cpu"))
        with pytest.warns(UserWarning, match="was resized since it had shape"):
            assert torch._resize_output_(x, [3, 4], torch.device(device)) is x
        assert x.shape == (3, 4)
        e = torch.empty(0, device=device)
        torch._resize_output_(e, [5], device)
        assert e.shape == (5,)


def test_errors_match_cpu():
    check_error(lambda a, b: a + b, make((2, 3)), make((3, 2)))
    check_error(lambda a: a.view(5), make((2, 3)))
    check_error(lambda a: a.sum(dim=3), make((2, 3)))
    check_error(lambda a, b: a.add_(b), make((2, 3), torch.int64), make((2, 3)))
    check_error(lambda a, b: a - b, make((2,), torch.bool), make((2,), torch.bool))


# An op with a CPU kernel and no tpu lowering yet (change it when it gets one).
def test_missing_lowering_names_the_op():
    x, c = torch.ones(3, 2, device="tpu"), torch.ones(1, 3, device="tpu")
    with pytest.raises(NotImplementedError, match="aten::_compute_linear_combination"):
        torch._compute_linear_combination(x, c)


def test_cpu_fallback_warns_once():
    code = (
        "import warnings, torch, torchtpu\n"
        "x = torch.arange(6.0).reshape(3, 2).to('tpu'); c = torch.tensor([[1.0, 2.0, 3.0]], device='tpu')\n"
        "combine = torch._compute_linear_combination\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    a = combine(x, c); b = combine(x, c)\n"
        "assert a.device.type == 'tpu'\n"
        "torch.testing.assert_close(a.cpu(), combine(x.cpu(), c.cpu()))\n"
        "print(sum('no tpu lowering' in str(m.message) for m in w))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**__import__("os").environ, "TORCHTPU_CPU_FALLBACK": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "1"


def test_manual_seed_reproducible():
    torch.manual_seed(123)
    a = torch.rand(5, device="tpu").cpu()
    b = torch.randn(5, device="tpu").cpu()
    torch.manual_seed(123)
    assert torch.equal(torch.rand(5, device="tpu").cpu(), a)
    assert torch.equal(torch.randn(5, device="tpu").cpu(), b)
    assert not torch.equal(torch.rand(5, device="tpu").cpu(), a)
    state = torch.tpu.get_rng_state()
    c = torch.rand(3, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    assert torch.equal(torch.rand(3, device="tpu").cpu(), c)


def test_live_buffers_return_to_start():
    x = torch.randn(8, 8, device="tpu")
    start = torch.tpu.live_buffers()
    for _ in range(1000):
        y = x * 2 + 1
        x = y - 1 - x
        del y
    del x
    assert torch.tpu.live_buffers() < start


def test_platform_env_and_missing_plugin():
    code = "import torch, torchtpu; torch.ones(1, device='tpu')"
    env = {**__import__("os").environ, "TORCHTPU_PLATFORM": "tpu"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode != 0
    assert "pip install libtpu" in out.stderr


def test_autoload_with_plain_import_torch():
    code = "import torch; x = torch.ones(2, device='tpu'); print((x + x).cpu().tolist())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("[2.0, 2.0]")


def test_autoload_can_be_turned_off_and_explicit_import_still_works():
    import os
    name = "import torch; print(torch._C._get_privateuse1_backend_name())"
    env = {**os.environ, "TORCHTPU_AUTOLOAD": "0"}
    out = subprocess.run([sys.executable, "-c", name], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "privateuseone"
    explicit = "import torch, torchtpu; print(torch.ones(2, device='tpu').sum().item())"
    out = subprocess.run([sys.executable, "-c", explicit], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "2.0"


def test_second_cpu_plugin():
    import importlib.util, os
    spec = importlib.util.find_spec("lammps_jax_pjrt_cpu")
    assert spec is not None, "lammps-jax-pjrt-cpu is installed by scripts/setup.sh"
    path = os.path.join(spec.submodule_search_locations[0], "pjrt_c_api_cpu_plugin.so")
    code = "import torch; x = torch.arange(4.0, device='tpu'); print((x * x).sum().item())"
    env = {**os.environ, "TORCHTPU_PJRT_PLUGIN": path}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "14.0"


def test_two_devices():
    code = (
        "import torch\n"
        "assert torch.tpu.device_count() == 2\n"
        "a = torch.arange(3.0, device='tpu:1')\n"
        "b = (a * 2 + 1)\n"
        "assert b.device == torch.device('tpu', 1)\n"
        "assert b.cpu().tolist() == [1.0, 3.0, 5.0]\n"
        "with torch.tpu.device(1):\n"
        "    assert torch.zeros(2, device='tpu').device.index == 1\n"
        "try:\n"
        "    a + torch.ones(3, device='tpu:0')\n"
        "except RuntimeError as e:\n"
        "    assert 'same device' in str(e)\n"
        "else:\n"
        "    raise AssertionError('mixing devices must fail')\n"
        "print('ok')\n"
    )
    env = {**__import__("os").environ, "TORCHTPU_CPU_DEVICES": "2"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")


def test_conjugate_and_negative_views_copy():
    x = torch.randn(6, dtype=torch.complex64)
    y = x.to("tpu")
    torch.testing.assert_close(y.conj().cpu(), x.conj())
    torch.testing.assert_close(y.conj().clone().cpu(), x.conj())
    torch.testing.assert_close(torch._neg_view(y).cpu(), -x)
    z = torch.empty(6, dtype=torch.complex64, device="tpu")
    z.copy_(y.conj())
    torch.testing.assert_close(z.cpu(), x.conj())


def test_module_to_keeps_tied_parameters():
    lin, head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    head.weight = lin.weight
    m = torch.nn.ModuleDict({"a": lin, "b": head})
    w = lin.weight
    y = m["a"](torch.randn(2, 4))  # an autograd graph still holds the CPU weight
    m.to("tpu")
    assert m["a"].weight is m["b"].weight and m["a"].weight.device.type == "tpu"
    m["a"](torch.randn(2, 4, device="tpu")).sum().backward()
    assert m["b"].weight.grad is not None
    del y, w


def test_ops_read_conjugate_views_as_values():
    x = torch.randn(3, 3, dtype=torch.complex64)
    y = x.to("tpu")
    torch.testing.assert_close(torch.mm(y, y.mH).cpu(), torch.mm(x, x.mH))
    torch.testing.assert_close((torch._neg_view(y) * 2).cpu(), -x * 2)


def test_synchronize_waits_for_queued_work_and_reports_none_pending():
    # Executions are asynchronous; synchronize waits for all of them, then has nothing left.
    x = torch.randn(64, 64, device="tpu")
    for _ in range(50):
        x = torch.tanh(x @ x)
    torch.tpu.synchronize()
    torch.tpu.synchronize()
    ref = torch.randn(64, 64)
    assert torch.isfinite(x.cpu()).all()
    assert ref.shape == x.shape


def test_out_of_memory_raises_torch_out_of_memory_error():
    # Callers catch torch.OutOfMemoryError (torch.cuda.OutOfMemoryError) to retry smaller; the
    # device keeps working afterwards.
    with pytest.raises(torch.OutOfMemoryError, match="tpu out of memory"):
        torch.ones(2**42, device=TPU).sum().item()
    assert torch.ones(3, device=TPU).sum().item() == 3.0


def test_mem_get_info_reports_free_and_total():
    free, total = torch.tpu.mem_get_info()
    assert 0 < free <= total
    if torch.tpu.get_device_name() == "XLA CPU":  # the CPU plugin's memory is the host's RAM
        with open("/proc/meminfo") as f:
            total_kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
        assert total == total_kib * 1024
