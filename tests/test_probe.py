"""No call crashes the process: the probe's fixed CI subset of aten overloads (python -m
torchtpu.tools.probe --subset ci; scripts/probe_all.sh runs them all) on "tpu", each in a worker
process, and a direct regression test for a known crash."""
import json
import subprocess
import sys
import textwrap

import pytest
import torch

# Overloads of the CI subset (probe.CI_EXTRA holds them all) that crash the process today: the
# test fails on a crash of any other overload. A crash that reads device addresses as host
# memory is not certain to happen on every run, so one of these not crashing is only reported;
# delete the entry when the op is fixed.
KNOWN_CRASHES = set()


def test_probe_ci_subset(tmp_path):
    out = tmp_path / "probe.json"
    proc = subprocess.run([sys.executable, "-m", "torchtpu.tools.probe", "--subset", "ci", "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    print(proc.stdout.strip().splitlines()[-1])
    assert len(results) > 250
    crashed = {n: next(s for s in r["sets"] if s["outcome"] == "crash")
               for n, r in results.items() if r["outcome"] == "crash"}
    new = {n: (c["set"], c["how"], c["stderr"][-3:]) for n, c in crashed.items() if n not in KNOWN_CRASHES}
    assert not new, f"new crashes: {new}"
    fixed = (KNOWN_CRASHES & set(results)) - set(crashed)
    if fixed:
        print(f"known crashes that did not crash this time (fixed? then remove them): {sorted(fixed)}")
    # The probe reaches the device: most overloads run or raise what CPU raises.
    ran = sum(r["outcome"] in ("pass", "error-like-cpu") for r in results.values())
    assert ran > len(results) // 2


def test_grid_sampler_cpu_fallback_raises_not_implemented():
    # Its device-generic kernel reads tensor data as host memory: on tpu it is routed to the
    # fallback (ops/host_memory.rs) and raises NotImplementedError naming the op; the process lives.
    code = textwrap.dedent("""
        import torch
        x = torch.randn(2, 3, 5, 6)
        g = torch.rand(2, 3, 3, 2) * 2 - 1
        torch._grid_sampler_2d_cpu_fallback(x, g, 2, 1, True)
        try:
            torch._grid_sampler_2d_cpu_fallback(x.to("tpu"), g.to("tpu"), 2, 1, True).cpu()
        except NotImplementedError as e:
            assert "_grid_sampler_2d_cpu_fallback" in str(e), e
            print("raised NotImplementedError")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-1000:]}"
    assert "raised NotImplementedError" in proc.stdout


def _run(code):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    return proc.stdout


@pytest.mark.parametrize("name,k,message", [
    # f32-4d (2, 2, 2, 2): the GRU cell chunks the gates' dimension 1 (2) into 3.
    ("_thnn_differentiable_gru_cell_backward.default", 5,
     "expected the input gates' size at dimension 1 to be a multiple of 3 (3 * hidden_size), got 2"),
    # f32-opt (2, 3): the LSTM cell chunks the gates' dimension 1 (3) into 4.
    ("_thnn_differentiable_lstm_cell_backward.default", 6,
     "expected the gates' size at dimension 1 to be a multiple of 4 (4 * hidden_size), got 3"),
])
def test_rnn_cell_backward_malformed_gates_raise(name, k, message):
    # PyTorch's composites index past the chunks of malformed gates (SIGSEGV, on CPU too); on
    # tpu a check raises first, with autograd and in inference mode (no autograd key).
    out = _run(f"""
        import torch
        from torchtpu.tools import probe
        args, kwargs = probe.build({name!r}, {k})
        args = [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args]
        op = probe._overload({name!r})
        for mode in (torch.enable_grad, torch.inference_mode):
            with mode():
                try:
                    op(*args, **kwargs)
                except RuntimeError as e:
                    assert {name.split(".")[0] + ": " + message!r} in str(e), e
                    print("raised", mode.__name__)
    """)
    assert out.split() == ["raised", "enable_grad", "raised", "inference_mode"], out


def test_rnn_cell_backward_matches_cpu():
    # Well-formed calls run PyTorch's composite as before: values, and gradients through it.
    out = _run("""
        import torch
        B, H = 3, 4
        lstm_op = torch.ops.aten._thnn_differentiable_lstm_cell_backward
        gru_op = torch.ops.aten._thnn_differentiable_gru_cell_backward
        def lstm(grad_hy=True):  # grad_hy, grad_cy, input_gates, hidden_gates, biases, cx, cy
            return [torch.randn(B, H) if grad_hy else None, torch.randn(B, H), torch.randn(B, 4 * H),
                    torch.randn(B, 4 * H), torch.randn(4 * H), torch.randn(4 * H), torch.randn(B, H),
                    torch.randn(B, H)], lstm_op
        def gru():  # grad_hy, input_gates, hidden_gates, hx, biases
            return [torch.randn(B, H), torch.randn(B, 3 * H), torch.randn(B, 3 * H), torch.randn(B, H),
                    torch.randn(3 * H), torch.randn(3 * H)], gru_op
        def run(make, dev, **kw):
            torch.manual_seed(0)
            args, op = make(**kw)
            args = [a.to(dev).requires_grad_() if a is not None else None for a in args]
            outs = op(*args)
            inputs = [a for a in args if a is not None]
            loss = sum((o * torch.linspace(-1, 1, o.numel()).view(o.shape).to(dev)).sum()
                       for o in outs if o is not None)
            grads = torch.autograd.grad(loss, inputs, create_graph=True, allow_unused=True)
            # Double backward: a gradient of the gradients.
            grads2 = torch.autograd.grad(sum(g.sum() for g in grads if g is not None), inputs, allow_unused=True)
            return [t.detach().cpu() if t is not None else None for t in (*outs, *grads, *grads2)]
        for make, kw in ((lstm, {}), (lstm, {"grad_hy": False}), (gru, {})):
            cpu, tpu = run(make, "cpu", **kw), run(make, "tpu", **kw)
            assert [t is None for t in cpu] == [t is None for t in tpu], (make.__name__, kw)
            for c, t in zip(cpu, tpu):
                if c is not None:
                    torch.testing.assert_close(t, c, rtol=1e-4, atol=1e-5)
        # As on CPU: without gradients the LSTM composite returns before it chunks the gates (so
        # malformed ones pass), and under 2 dims unsafe_chunk raises PyTorch's own IndexError.
        g = torch.randn(2, 3, device="tpu")
        assert all(o is None for o in lstm_op(None, None, g, g, None, None, g, g))
        for dev in ("cpu", "tpu"):
            v = torch.randn(8, device=dev)
            try:
                lstm_op(v[:2], None, v, v, None, None, v[:2], v[:2])
            except IndexError as e:
                print(dev, "IndexError")
        print("matched")
    """)
    assert out.split() == ["cpu", "IndexError", "tpu", "IndexError", "matched"], out



def test_host_read_set_is_for_pytorch_composites_with_int64_sizes():
    # The set that reaches composites reading tensor elements on the host: chosen from the
    # dispatcher's table (what serves the tpu key), with size-like tensors as int64 [1, 2].
    from torchtpu.tools import probe

    k = [s[0] for s in probe.SETS].index(probe.HOST_READ)
    assert probe.served_by_composite("tensor_split.tensor_indices_or_sections")
    assert not probe.served_by_composite("add.Tensor")  # the boxed fallback, into Rust
    assert not probe.served_by_composite("_reshape_from_tensor.default")  # a tpu kernel of ours
    with pytest.raises(probe.Unbuildable):
        probe.build("add.Tensor", k)
    args, _ = probe.build("tensor_split.tensor_indices_or_sections", k)
    assert args[0].dtype == torch.float32 and args[0].shape == (4,)
    assert args[1].tolist() == [1, 2] and args[1].dtype == torch.int64

