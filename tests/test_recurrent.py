"""Recurrent modules on tpu (nn.LSTM, nn.GRU, nn.RNN and their cells) against PyTorch on CPU:
outputs, final states, and gradients of the inputs, initial states and every parameter. On
tpu PyTorch's RNN composites run the fused cells `_thnn_fused_lstm_cell` /
`_thnn_fused_gru_cell` once per step, and autograd their backward ops."""
import copy

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from helpers import TPU, check_error

F32 = dict(atol=2e-5, rtol=2e-5)
aten = torch.ops.aten


def both(module):
    """Exact copies of a module on CPU and on tpu."""
    return copy.deepcopy(module), copy.deepcopy(module).to(TPU)


def flat(out):
    """Tensors of a module's result: output, then hidden states (LSTM's (h, c) unpacked)."""
    if isinstance(out, torch.Tensor):
        return [out]
    res = []
    for o in out:
        res.extend(flat(o))
    return res


def compare_run(module, x, hx=None, tol=F32, grads=True):
    """Forward on CPU and tpu from the same inputs; then backward of a random projection of
    every output; compares outputs, input/state gradients and parameter gradients."""
    cpu, dev = both(module)
    xs = [x] + ([] if hx is None else flat(hx))
    xc = [t.detach().clone().requires_grad_(grads) for t in xs]
    xd = [t.detach().to(TPU).requires_grad_(grads) for t in xs]

    def call(m, ins):
        if hx is None:
            return m(ins[0])
        h = ins[1:] if isinstance(hx, tuple) else ins[1]
        return m(ins[0], tuple(h) if isinstance(hx, tuple) else h)

    oc, od = flat(call(cpu, xc)), flat(call(dev, xd))
    assert len(oc) == len(od)
    for a, b in zip(od, oc):
        assert a.device.type == "tpu" and a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a.cpu(), b, **tol)
    if not grads:
        return
    ws = [torch.randn(o.shape) for o in oc]
    sum((o * w).sum() for o, w in zip(oc, ws)).backward()
    sum((o * w.to(TPU)).sum() for o, w in zip(od, ws)).backward()
    for a, b in zip(xd, xc):
        torch.testing.assert_close(a.grad.cpu(), b.grad, **tol)
    for (name, p), q in zip(cpu.named_parameters(), dev.parameters()):
        assert q.grad is not None, name
        torch.testing.assert_close(q.grad.cpu(), p.grad, **tol, msg=lambda m: f"{name}: {m}")


# ---- full-sequence modules ----------------------------------------------------------------

KINDS = ["lstm", "gru", "rnn_tanh", "rnn_relu"]


def make(kind, *args, **kw):
    if kind == "lstm":
        return torch.nn.LSTM(*args, **kw)
    if kind == "gru":
        return torch.nn.GRU(*args, **kw)
    return torch.nn.RNN(*args, nonlinearity=kind[4:], **kw)


def initial_state(kind, layers, batch, hidden, proj=0):
    h = torch.randn(layers, batch, proj or hidden) if batch else torch.randn(layers, proj or hidden)
    if kind != "lstm":
        return h
    c = torch.randn(layers, batch, hidden) if batch else torch.randn(layers, hidden)
    return (h, c)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
def test_one_layer(kind, batch_first, with_state):
    m = make(kind, 4, 8, batch_first=batch_first)
    x = torch.randn(2, 5, 4) if batch_first else torch.randn(5, 2, 4)
    compare_run(m, x, initial_state(kind, 1, 2, 8) if with_state else None)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
def test_two_layers(kind, bidirectional, with_state):
    m = make(kind, 3, 6, num_layers=2, bidirectional=bidirectional, batch_first=True)
    x = torch.randn(3, 4, 3)
    layers = 2 * (2 if bidirectional else 1)
    compare_run(m, x, initial_state(kind, layers, 3, 6) if with_state else None)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sizes", [(1, 1, 1, 1), (5, 16, 7, 3), (2, 3, 1, 9)])
def test_sizes(kind, sizes):
    inp, hidden, seq, batch = sizes
    compare_run(make(kind, inp, hidden), torch.randn(seq, batch, inp))


@pytest.mark.parametrize("kind", KINDS)
def test_no_bias(kind):
    compare_run(make(kind, 4, 5, bias=False, num_layers=2), torch.randn(3, 2, 4))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("with_state", [False, True])
def test_unbatched(kind, with_state):
    # A 2-d input is one sequence without a batch dim (and so are the states).
    m = make(kind, 4, 6, num_layers=2, bidirectional=True)
    compare_run(m, torch.randn(5, 4), initial_state(kind, 4, 0, 6) if with_state else None)


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
def test_lstm_projections(bidirectional, with_state):
    m = torch.nn.LSTM(4, 8, num_layers=2, proj_size=3, bidirectional=bidirectional, batch_first=True)
    layers = 2 * (2 if bidirectional else 1)
    compare_run(m, torch.randn(2, 5, 4), initial_state("lstm", layers, 2, 8, proj=3) if with_state else None)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("enforce_sorted", [False, True])
def test_packed_sequences(kind, bidirectional, enforce_sorted):
    m = make(kind, 3, 5, num_layers=2, bidirectional=bidirectional, batch_first=True)
    cpu, dev = both(m)
    lengths = torch.tensor([6, 4, 4, 1]) if enforce_sorted else torch.tensor([4, 6, 1, 4])
    x = torch.randn(4, 6, 3)
    xc = x.clone().requires_grad_()
    xd = x.to(TPU).requires_grad_()

    def run(mod, inp):
        packed = pack_padded_sequence(inp, lengths, batch_first=True, enforce_sorted=enforce_sorted)
        out, h = mod(packed)
        padded, lens = pad_packed_sequence(out, batch_first=True)
        return [padded] + flat(h), lens

    oc, lc = run(cpu, xc)
    od, ld = run(dev, xd)
    assert torch.equal(ld, lc)
    for a, b in zip(od, oc):
        torch.testing.assert_close(a.cpu(), b, **F32)
    ws = [torch.randn(o.shape) for o in oc]
    sum((o * w).sum() for o, w in zip(oc, ws)).backward()
    sum((o * w.to(TPU)).sum() for o, w in zip(od, ws)).backward()
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, **F32)
    for p, q in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, **F32)


def test_packed_lstm_with_projection_and_state():
    m = torch.nn.LSTM(3, 6, proj_size=2, batch_first=True)
    cpu, dev = both(m)
    x = torch.randn(3, 4, 3)
    h0 = (torch.randn(1, 3, 2), torch.randn(1, 3, 6))
    lengths = torch.tensor([4, 2, 3])

    def run(mod, inp, h):
        out, (h, c) = mod(pack_padded_sequence(inp, lengths, batch_first=True, enforce_sorted=False), h)
        return pad_packed_sequence(out, batch_first=True)[0], h, c

    for a, b in zip(run(dev, x.to(TPU), tuple(t.to(TPU) for t in h0)), run(cpu, x, h0)):
        torch.testing.assert_close(a.cpu(), b, **F32)


@pytest.mark.parametrize("kind", KINDS)
def test_bfloat16_forward(kind):
    # tpu computes the cells in float32 and rounds each result; compare with float32 on CPU
    # from the same bfloat16 weights and inputs.
    m = make(kind, 4, 8, num_layers=2, batch_first=True)
    ref = copy.deepcopy(m).to(torch.bfloat16).float()
    dev = copy.deepcopy(m).to(TPU, torch.bfloat16)
    x = torch.randn(2, 6, 4).to(torch.bfloat16)
    out_ref, h_ref = ref(x.float())
    out, h = dev(x.to(TPU))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu().float(), out_ref, atol=4e-2, rtol=4e-2)
    for a, b in zip(flat(h), flat(h_ref)):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(a.cpu().float(), b, atol=4e-2, rtol=4e-2)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_bfloat16_backward_runs(kind):
    m = make(kind, 4, 8, batch_first=True).to(TPU, torch.bfloat16)
    x = torch.randn(2, 3, 4, device=TPU, dtype=torch.bfloat16, requires_grad=True)
    out, _ = m(x)
    out.float().sum().backward()
    assert x.grad.dtype == torch.bfloat16 and torch.isfinite(x.grad.cpu().float()).all()
    ref = make(kind, 4, 8, batch_first=True)
    ref.load_state_dict({k: v.cpu().float() for k, v in m.state_dict().items()})
    xr = x.detach().cpu().float().requires_grad_()
    ref(xr)[0].sum().backward()
    torch.testing.assert_close(x.grad.cpu().float(), xr.grad, atol=5e-2, rtol=5e-2)


def test_float64():
    for kind in KINDS:
        m = make(kind, 3, 4, batch_first=True).double()
        compare_run(m, torch.randn(2, 3, 3, dtype=torch.float64), tol=dict(atol=1e-10, rtol=1e-10))


def final_state_grads(kind, which):
    cpu, dev = both(make(kind, 3, 4))
    x = torch.randn(4, 2, 3)
    xc, xd = x.clone().requires_grad_(), x.to(TPU).requires_grad_()
    flat(cpu(xc)[1])[which].sum().backward()
    flat(dev(xd)[1])[which].sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, **F32)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_only_final_hidden_state_used(kind):
    # Only the final hidden state carries a gradient: the last step's cell state gets none.
    final_state_grads(kind, 0)


def test_only_final_cell_state_used():
    # Only c_n carries a gradient: autograd passes an undefined grad_hy for the last step.
    final_state_grads("lstm", 1)


def test_double_backward():
    # create_graph=True takes the differentiable backward (_thnn_differentiable_*_backward).
    for cls in [torch.nn.LSTMCell, torch.nn.GRUCell]:
        cpu, dev = both(cls(3, 4))
        x = torch.randn(2, 3)
        grads = []
        for m, xx in [(cpu, x.clone().requires_grad_()), (dev, x.to(TPU).requires_grad_())]:
            out = flat(m(xx))[0]
            (g,) = torch.autograd.grad(out.pow(2).sum(), xx, create_graph=True)
            (gg,) = torch.autograd.grad(g.pow(2).sum(), xx)
            grads.append((g.detach().cpu(), gg.cpu()))
        for a, b in zip(grads[1], grads[0]):
            torch.testing.assert_close(a, b, **F32)


def test_long_sequence_matches():
    compare_run(torch.nn.LSTM(2, 3), torch.randn(40, 2, 2))


# ---- cells ----------------------------------------------------------------------------------

CELLS = ["lstm", "gru", "rnn_tanh", "rnn_relu"]


def make_cell(kind, *args, **kw):
    if kind == "lstm":
        return torch.nn.LSTMCell(*args, **kw)
    if kind == "gru":
        return torch.nn.GRUCell(*args, **kw)
    return torch.nn.RNNCell(*args, nonlinearity=kind[4:], **kw)


@pytest.mark.parametrize("kind", CELLS)
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_cells(kind, with_state, bias):
    m = make_cell(kind, 5, 7, bias=bias)
    hx = None
    if with_state:
        hx = (torch.randn(3, 7), torch.randn(3, 7)) if kind == "lstm" else torch.randn(3, 7)
    compare_run(m, torch.randn(3, 5), hx)


@pytest.mark.parametrize("kind", CELLS)
def test_cells_unbatched(kind):
    m = make_cell(kind, 4, 3)
    hx = (torch.randn(3), torch.randn(3)) if kind == "lstm" else torch.randn(3)
    compare_run(m, torch.randn(4), hx)
    compare_run(m, torch.randn(4))


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_cell_stepping(kind):
    # A hand-written loop over a cell, as in seq2seq decoders.
    cpu, dev = both(make_cell(kind, 3, 4))
    x = torch.randn(5, 2, 3)
    outs = []
    for m, xx in [(cpu, x.clone().requires_grad_()), (dev, x.to(TPU).requires_grad_())]:
        h = None
        total = 0
        for t in range(5):
            h = m(xx[t], h)
            total = total + flat(h)[0].pow(2).sum()
        total.backward()
        outs.append([flat(h)[0].detach().cpu(), xx.grad.cpu()] + [p.grad.cpu() for p in m.parameters()])
    for a, b in zip(outs[1], outs[0]):
        torch.testing.assert_close(a, b, **F32)


def test_cells_bfloat16():
    for kind in CELLS:
        m = make_cell(kind, 4, 6)
        ref = copy.deepcopy(m).to(torch.bfloat16).float()
        dev = copy.deepcopy(m).to(TPU, torch.bfloat16)
        x = torch.randn(3, 4).to(torch.bfloat16)
        for a, b in zip(flat(dev(x.to(TPU))), flat(ref(x.float()))):
            assert a.dtype == torch.bfloat16
            torch.testing.assert_close(a.cpu().float(), b, atol=3e-2, rtol=3e-2)


# ---- the fused ops themselves ----------------------------------------------------------------


def lstm_reference(ig, hg, cx, ib=None, hb=None):
    g = ig + hg + (0 if ib is None else ib + hb)
    i, f, c, o = g.chunk(4, 1)
    i, f, c, o = i.sigmoid(), f.sigmoid(), c.tanh(), o.sigmoid()
    cy = f * cx + i * c
    return o * cy.tanh(), cy, torch.cat([i, f, c, o], 1)


def gru_reference(ig, hg, hx, ib=None, hb=None):
    if ib is not None:
        ig, hg = ig + ib, hg + hb
    ir, ii, inn = ig.chunk(3, 1)
    hr, hi, hn = hg.chunk(3, 1)
    r, z = (ir + hr).sigmoid(), (ii + hi).sigmoid()
    n = (inn + r * hn).tanh()
    return n + z * (hx - n), torch.cat([r, z, n, hx, hn], 1)


@pytest.mark.parametrize("bias", [True, False])
def test_fused_lstm_cell_op(bias):
    b, h = 3, 5
    ig, hg, cx = torch.randn(b, 4 * h), torch.randn(b, 4 * h), torch.randn(b, h)
    biases = [torch.randn(4 * h), torch.randn(4 * h)] if bias else []
    ref = lstm_reference(ig, hg, cx, *biases)
    got = aten._thnn_fused_lstm_cell(*(t.to(TPU) for t in [ig, hg, cx] + biases))
    for a, e in zip(got, ref):
        torch.testing.assert_close(a.cpu(), e, **F32)


@pytest.mark.parametrize("which", ["both", "hy", "cy"])
def test_fused_lstm_cell_backward_op(which):
    b, h = 4, 3
    ig, hg, cx = torch.randn(b, 4 * h), torch.randn(b, 4 * h), torch.randn(b, h)
    _, cy, ws = lstm_reference(ig, hg, cx)
    ghy = torch.randn(b, h) if which != "cy" else None
    gcy = torch.randn(b, h) if which != "hy" else None
    # The gradient of the forward by autograd on CPU.
    g = ig.clone().requires_grad_()
    c = cx.clone().requires_grad_()
    hy_r, cy_r, _ = lstm_reference(g, hg, c)
    loss = (hy_r * ghy).sum() if ghy is not None else 0
    loss = loss + ((cy_r * gcy).sum() if gcy is not None else 0)
    loss.backward()
    dev = [None if t is None else t.to(TPU) for t in (ghy, gcy, cx, cy, ws)]
    gg, gcx, gb = aten._thnn_fused_lstm_cell_backward_impl(*dev, True)
    torch.testing.assert_close(gg.cpu(), g.grad, **F32)
    torch.testing.assert_close(gcx.cpu(), c.grad, **F32)
    torch.testing.assert_close(gb.cpu(), g.grad.sum(0), **F32)
    # Without bias PyTorch returns no bias gradient (an empty tensor here).
    assert aten._thnn_fused_lstm_cell_backward_impl(*dev, False)[2].numel() == 0
    # The composite that autograd calls (without grad mode) returns the gate gradient twice.
    with torch.no_grad():
        five = aten._thnn_fused_lstm_cell_backward(*dev, True)
    torch.testing.assert_close(five[1].cpu(), g.grad, **F32)
    torch.testing.assert_close(five[4].cpu(), g.grad.sum(0), **F32)


@pytest.mark.parametrize("bias", [True, False])
def test_fused_gru_cell_ops(bias):
    b, h = 3, 4
    ig, hg, hx = torch.randn(b, 3 * h), torch.randn(b, 3 * h), torch.randn(b, h)
    biases = [torch.randn(3 * h), torch.randn(3 * h)] if bias else []
    hy_ref, ws_ref = gru_reference(ig, hg, hx, *biases)
    hy, ws = aten._thnn_fused_gru_cell(*(t.to(TPU) for t in [ig, hg, hx] + biases))
    torch.testing.assert_close(hy.cpu(), hy_ref, **F32)
    torch.testing.assert_close(ws.cpu(), ws_ref, **F32)
    # Backward against autograd on CPU.
    ins = [t.clone().requires_grad_() for t in [ig, hg, hx] + biases]
    grad = torch.randn(b, h)
    (gru_reference(*ins)[0] * grad).sum().backward()
    outs = aten._thnn_fused_gru_cell_backward(grad.to(TPU), ws, bias)
    for a, t in zip(outs[:3], ins[:3]):
        torch.testing.assert_close(a.cpu(), t.grad, **F32)
    if bias:
        torch.testing.assert_close(outs[3].cpu(), ins[3].grad, **F32)
        torch.testing.assert_close(outs[4].cpu(), ins[4].grad, **F32)
    else:
        assert outs[3].numel() == 0 and outs[4].numel() == 0


def test_fused_cells_empty_batch():
    hy, cy, ws = aten._thnn_fused_lstm_cell(torch.zeros(0, 8, device=TPU), torch.zeros(0, 8, device=TPU),
                                            torch.zeros(0, 2, device=TPU))
    assert hy.shape == (0, 2) and ws.shape == (0, 8)
    hy, ws = aten._thnn_fused_gru_cell(torch.zeros(0, 6, device=TPU), torch.zeros(0, 6, device=TPU),
                                       torch.zeros(0, 2, device=TPU))
    assert hy.shape == (0, 2) and ws.shape == (0, 10)


def test_fused_cell_errors():
    z = lambda *s: torch.zeros(*s, device=TPU)  # noqa: E731
    with pytest.raises(RuntimeError, match=r"Expected 2-dimensional tensor, but got 3-dimensional tensor for argument #1 'input_gates'"):
        aten._thnn_fused_lstm_cell(z(1, 2, 8), z(1, 2, 8), z(2, 2))
    with pytest.raises(RuntimeError, match=r"Expected tensor for argument #1 'input_gates' to have same size as tensor for argument #2 'hidden_gates'"):
        aten._thnn_fused_lstm_cell(z(2, 8), z(2, 4), z(2, 2))
    with pytest.raises(RuntimeError, match=r"Expected tensor for argument #3 'input_bias' to have 8 elements; but it actually has 4 elements"):
        aten._thnn_fused_lstm_cell(z(2, 8), z(2, 8), z(2, 2), z(4), z(4))
    with pytest.raises(RuntimeError, match=r"Expected tensor for argument #5 'prev_hidden' to have 6 elements"):
        aten._thnn_fused_gru_cell(z(2, 9), z(2, 9), z(2, 2))
    with pytest.raises(RuntimeError, match=r"Expected tensor of size \[2, 10\], but got tensor of size \[2, 8\] for argument #2 'workspace'"):
        aten._thnn_fused_gru_cell_backward(z(2, 2), z(2, 8), True)
    with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
        aten._thnn_fused_lstm_cell(*(torch.zeros(2, 8, dtype=torch.long, device=TPU),) * 2,
                                   torch.zeros(2, 2, dtype=torch.long, device=TPU))


# ---- bad inputs to the modules: PyTorch's messages --------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_wrong_input_size(kind):
    cpu, dev = both(make(kind, 4, 8, batch_first=True))
    e = check_error(lambda m, x: m(x), cpu, torch.randn(2, 5, 3))
    with pytest.raises(type(e), match="input.size\\(-1\\) must be equal to input_size. Expected 4, got 3"):
        dev(torch.randn(2, 5, 3, device=TPU))


@pytest.mark.parametrize("kind", KINDS)
def test_wrong_state_size(kind):
    cpu, dev = both(make(kind, 4, 8))
    x = torch.randn(5, 2, 4)
    bad = initial_state(kind, 1, 2, 7)
    for m, xx, h in [(cpu, x, bad), (dev, x.to(TPU), tuple(t.to(TPU) for t in flat(bad)) if kind == "lstm" else bad.to(TPU))]:
        with pytest.raises(RuntimeError, match=r"Expected hidden(\[0\])? size \(1, 2, 8\), got \[1, 2, 7\]"):
            m(xx, h)


def test_wrong_input_dims():
    cpu, dev = both(torch.nn.GRU(4, 8))
    for m, x in [(cpu, torch.randn(1, 2, 3, 4)), (dev, torch.randn(1, 2, 3, 4, device=TPU))]:
        with pytest.raises(ValueError, match="GRU: Expected input to be 2D or 3D, got 4D instead"):
            m(x)


@pytest.mark.parametrize("kind", CELLS)
def test_cell_errors(kind):
    cpu, dev = both(make_cell(kind, 4, 6))
    for m, dv in [(cpu, "cpu"), (dev, TPU)]:
        with pytest.raises(RuntimeError, match="input has inconsistent input_size: got 3 expected 4"):
            m(torch.randn(2, 3, device=dv))
        hx = torch.randn(2, 5, device=dv)
        with pytest.raises(RuntimeError, match="hidden(0)? has inconsistent hidden_size: got 5, expected 6"):
            m(torch.randn(2, 4, device=dv), (hx, hx) if kind == "lstm" else hx)
        with pytest.raises(ValueError, match="Expected input to be 1D or 2D, got 3D instead"):
            m(torch.randn(1, 2, 4, device=dv))


def test_module_error_messages_match_cpu():
    m = torch.nn.LSTMCell(4, 6)
    md = copy.deepcopy(m).to(TPU)
    for x, h in [(torch.randn(2, 3), None), (torch.randn(3, 4), (torch.randn(2, 6), torch.randn(2, 6)))]:
        msgs = []
        for mod, dv in [(m, "cpu"), (md, TPU)]:
            with pytest.raises(RuntimeError) as e:
                mod(x.to(dv), None if h is None else tuple(t.to(dv) for t in h))
            msgs.append(str(e.value))
        assert msgs[0] == msgs[1]


@pytest.mark.parametrize("kind", KINDS)
def test_non_contiguous_input(kind):
    # A transposed view as a batch_first input, and a stepped view of a longer sequence.
    m = make(kind, 4, 6, batch_first=True, num_layers=2)
    compare_run(m, torch.randn(5, 2, 4).transpose(0, 1))
    compare_run(m, torch.randn(2, 10, 4)[:, ::2])


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_dropout_between_layers(kind):
    # In eval mode inter-layer dropout is off and results match; in training it runs on tpu.
    m = make(kind, 3, 5, num_layers=3, dropout=0.5)
    compare_run(m.eval(), torch.randn(4, 2, 3))
    dev = copy.deepcopy(m).train().to(TPU)
    x = torch.randn(4, 2, 3, device=TPU, requires_grad=True)
    out, _ = dev(x)
    out.sum().backward()
    assert out.shape == (4, 2, 5) and x.grad.shape == x.shape
    assert torch.isfinite(x.grad.cpu()).all()
