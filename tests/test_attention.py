"""F.scaled_dot_product_attention on tpu: the fused kernel (4-d float inputs, no dropout) and
PyTorch's math path otherwise, against PyTorch on CPU, values and gradients."""
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from helpers import TPU, check_error

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
       torch.float16: dict(atol=3e-3, rtol=3e-3), torch.float64: dict(atol=1e-10, rtol=1e-10)}


def run_both(q, k, v, mask=None, grads=True, **kw):
    """Runs attention on CPU (in float32 for the reference) and on tpu; returns both outputs
    and the gradients of q, k, v (and a floating mask) for the same upstream gradient."""
    ins = [q, k, v] + ([mask] if mask is not None else [])
    diff = [grads and x.is_floating_point() for x in ins]
    cpu = [x.detach().clone().requires_grad_(d) for x, d in zip(ins, diff)]
    tpu = [x.detach().to(TPU).requires_grad_(d) for x, d in zip(ins, diff)]
    ref = F.scaled_dot_product_attention(*cpu[:3], attn_mask=cpu[3] if mask is not None else None, **kw)
    got = F.scaled_dot_product_attention(*tpu[:3], attn_mask=tpu[3] if mask is not None else None, **kw)
    assert got.device.type == "tpu" and got.dtype == ref.dtype and got.shape == ref.shape
    if not grads:
        return ref, got.cpu(), [], []
    g = torch.randn(ref.shape).to(ref.dtype)
    ref.backward(g)
    got.backward(g.to(TPU))
    return ref, got.cpu(), [x.grad for x, d in zip(cpu, diff) if d], [x.grad.cpu() for x, d in zip(tpu, diff) if d]


def assert_close(got, ref, dtype):
    if dtype != torch.float64:
        got, ref = got.float(), ref.float()
    torch.testing.assert_close(got, ref, **TOL[dtype])


def uses_fused(q, k, v, **kw):
    """The tpu kernel that attention picked, read from the autograd graph."""
    out = F.scaled_dot_product_attention(q.to(TPU).requires_grad_(), k.to(TPU), v.to(TPU), **kw)
    return "Overrideable" in type(out.grad_fn).__name__


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_values_and_grads(dtype, causal):
    torch.manual_seed(0)
    q, k, v = (x.to(dtype) for x in (torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 4)))
    # The reference runs in float32 on CPU on the same (rounded) inputs and upstream gradient.
    torch.manual_seed(1)
    ref, _, rg, _ = run_both(q.float(), k.float(), v.float(), is_causal=causal)
    torch.manual_seed(1)
    _, got, _, gg = run_both(q, k, v, is_causal=causal)
    assert got.dtype == dtype
    assert_close(got, ref, dtype)
    for a, b in zip(gg, rg):
        assert a.dtype == dtype
        assert_close(a, b, dtype)
    assert uses_fused(q, k, v, is_causal=causal)


def test_grouped_query_heads():
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 6, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    ref, got, rg, gg = run_both(q, k, v, is_causal=True, enable_gqa=True)
    assert_close(got, ref, torch.float32)
    for a, b in zip(gg, rg):
        assert_close(a, b, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,lq,lk", [((4, 4), 128, 128), ((4, 2), 200, 200), ((2, 2), 130, 80), ((2, 1), 140, 300)])
def test_causal_attention_in_blocks_of_rows(dtype, heads, lq, lk):
    # Causal attention over 128 rows or more runs in blocks of rows, each reading only the keys
    # before its last row: equal, sizes that do not divide evenly, grouped heads, more queries
    # than keys (rows past the last key see every key) and fewer.
    torch.manual_seed(7)
    hq, hk = heads
    q, k, v = (x.to(dtype) for x in (torch.randn(2, hq, lq, 16), torch.randn(2, hk, lk, 16), torch.randn(2, hk, lk, 8)))
    torch.manual_seed(8)
    ref, _, rg, _ = run_both(q.float(), k.float(), v.float(), is_causal=True, enable_gqa=hq != hk)
    torch.manual_seed(8)
    _, got, _, gg = run_both(q, k, v, is_causal=True, enable_gqa=hq != hk)
    assert_close(got, ref, dtype)
    for a, b in zip(gg, rg):
        assert a.dtype == dtype
        assert_close(a, b, dtype)


@pytest.mark.parametrize("mask_shape", [(5, 7), (2, 1, 5, 7), (2, 3, 5, 7)])
def test_float_mask_and_its_gradient(mask_shape):
    torch.manual_seed(2)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)
    mask = torch.randn(mask_shape)
    ref, got, rg, gg = run_both(q, k, v, mask)
    assert_close(got, ref, torch.float32)
    assert len(gg) == 4
    for a, b in zip(gg, rg):
        assert a.shape == b.shape
        assert_close(a, b, torch.float32)


def test_bool_mask_and_fully_masked_rows():
    torch.manual_seed(3)
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    mask = torch.rand(1, 2, 4, 6) > 0.4
    mask[0, 1, 2] = False  # a row that sees no key: PyTorch gives zeros there
    ref, got, rg, gg = run_both(q, k, v, mask)
    assert_close(got, ref, torch.float32)
    assert torch.equal(got[0, 1, 2], torch.zeros(8))
    for a, b in zip(gg, rg):
        assert_close(a, b, torch.float32)


def test_non_contiguous_inputs_and_empty_batch():
    torch.manual_seed(4)
    base = torch.randn(2, 5, 3, 8)  # (batch, seq, heads, dim) viewed as (batch, heads, seq, dim)
    q, k, v = base.transpose(1, 2), base.transpose(1, 2) * 0.5, base.transpose(1, 2).flip(-1)
    ref, got, rg, gg = run_both(q, k, v, is_causal=True)
    assert_close(got, ref, torch.float32)
    for a, b in zip(gg, rg):
        assert_close(a, b, torch.float32)
    e = torch.randn(0, 3, 5, 8)
    ref, got, _, _ = run_both(e, e, e, grads=False)
    assert got.shape == ref.shape == (0, 3, 5, 8)


def test_explicit_scale_and_other_sequence_lengths():
    torch.manual_seed(5)
    q, k, v = torch.randn(1, 2, 9, 16), torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16)
    for causal in (False, True):
        ref, got, rg, gg = run_both(q, k, v, is_causal=causal, scale=0.3)
        assert_close(got, ref, torch.float32)
        for a, b in zip(gg, rg):
            assert_close(a, b, torch.float32)


def test_math_path_for_dropout_float64_and_3d_and_when_chosen():
    torch.manual_seed(6)
    q = torch.randn(2, 3, 5, 8)
    assert not uses_fused(q, q, q, dropout_p=0.5)
    assert not uses_fused(q.double(), q.double(), q.double())
    ref, got, rg, gg = run_both(q.double(), q.double(), q.double())
    torch.testing.assert_close(got, ref)
    q3 = torch.randn(3, 5, 8)
    ref, got, rg, gg = run_both(q3, q3, q3, is_causal=True)
    assert_close(got, ref, torch.float32)
    with sdpa_kernel(SDPBackend.MATH):
        assert not uses_fused(q, q, q)
    # Dropout keeps the expected scale: with p=0.5 every kept weight doubles.
    out = F.scaled_dot_product_attention(q.to(TPU), q.to(TPU), torch.ones(2, 3, 5, 8, device=TPU), dropout_p=0.5)
    assert out.shape == (2, 3, 5, 8)


def test_errors_match_cpu():
    q = torch.randn(1, 2, 4, 8)
    check_error(lambda d: F.scaled_dot_product_attention(q.to(d), q.to(d).half(), q.to(d)))
    check_error(lambda d: F.scaled_dot_product_attention(q.to(d), torch.randn(1, 2, 4, 6, device=d), q.to(d)))
    with pytest.raises(NotImplementedError, match="dropout"):
        t = q.to(TPU)
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable(t, t, t, None, 0.5)


def test_compiled_attention_matches_cpu():
    torch.manual_seed(7)

    def f(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m).sum(-1)

    q, k, v, m = torch.randn(2, 4, 6, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8), torch.randn(6, 6)
    g = torch.compile(lambda *a: F.scaled_dot_product_attention(*a[:3], attn_mask=a[3], enable_gqa=True),
                      backend="tpu")
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)
    qt = q.to(TPU).requires_grad_()
    out = g(qt, k.to(TPU), v.to(TPU), m.to(TPU))
    assert_close(out.cpu(), ref, torch.float32)
    out.sum().backward()
    qc = q.clone().requires_grad_()
    F.scaled_dot_product_attention(qc, k, v, attn_mask=m, enable_gqa=True).sum().backward()
    assert_close(qt.grad.cpu(), qc.grad, torch.float32)


@pytest.mark.parametrize("compiled", [False, True])
def test_flex_attention(compiled, caplog):
    # FlexAttention with a score function and a causal block mask, forward and backward, against
    # the same attention written densely on CPU. Compiled, flex attention's higher-order op is
    # traced into the graph's program (no graph runs eagerly).
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch.manual_seed(0)
    n, d = 16, 8
    q, k, v = (torch.randn(1, 2, n, d) for _ in range(3))

    def causal(b, h, qi, ki):
        return qi >= ki

    def tilt(s, b, h, qi, ki):
        return s + (qi - ki) * 0.1

    i = torch.arange(n)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    s = qr @ kr.transpose(-1, -2) / d**0.5 + (i[:, None] - i[None, :]) * 0.1
    want = s.masked_fill(i[:, None] < i[None, :], float("-inf")).softmax(-1) @ vr
    want.sum().backward()
    qt, kt, vt = (t.to(TPU).requires_grad_() for t in (q, k, v))
    mask = create_block_mask(causal, 1, 2, n, n, device=TPU)
    f = torch.compile(flex_attention, backend="tpu") if compiled else flex_attention
    out = f(qt, kt, vt, score_mod=tilt, block_mask=mask)
    out.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), want.detach(), atol=1e-5, rtol=1e-5)
    for t, r in ((qt, qr), (kt, kr), (vt, vr)):
        torch.testing.assert_close(t.grad.cpu(), r.grad, atol=1e-5, rtol=1e-5)
    assert "runs eagerly" not in caplog.text


def _document_ids(n):
    return torch.tensor([0] * (n // 4) + [1] * (n // 2) + [2] * (n - n // 4 - n // 2))


# name: (mask_mod, the same mask as a dense [q, kv] boolean tensor)
FLEX_MASKS = {
    "causal": (lambda b, h, q, k: q >= k, lambda n: torch.ones(n, n).tril().bool()),
    "sliding_window": (lambda b, h, q, k: (q >= k) & (q - k < 5),
                       lambda n: torch.ones(n, n).tril().bool() & ~torch.ones(n, n).tril(-5).bool()),
    "document": (None, lambda n: (_document_ids(n)[:, None] == _document_ids(n)[None, :])
                 & torch.ones(n, n).tril().bool()),
}


def _check_compiled_flex(f, reference, q, k, v, caplog, loss=lambda out: out.sum()):
    """Runs `f` (compiled) on tpu and `reference` on CPU on copies of q, k, v: the outputs and the
    gradients of q, k and v for `loss` match, and no graph ran eagerly."""
    cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    want = reference(*cpu)
    loss(want).backward()
    dev = [t.to(TPU).requires_grad_() for t in (q, k, v)]
    out = f(*dev)
    loss(out).backward()
    assert "runs eagerly" not in caplog.text, caplog.text
    torch.testing.assert_close(out.detach().cpu(), want.detach(), atol=2e-5, rtol=2e-5)
    for t, r in zip(dev, cpu):
        torch.testing.assert_close(t.grad.cpu(), r.grad, atol=5e-5, rtol=5e-5)


@pytest.mark.parametrize("block", [128, 2])
@pytest.mark.parametrize("mask_name", FLEX_MASKS)
@pytest.mark.parametrize("gqa", [False, True])
def test_compiled_flex_attention_matches_sdpa(mask_name, gqa, block, caplog):
    # Compiled flex attention with a block mask vs eager SDPA with the same dense mask on CPU,
    # outputs and the gradients of q, k and v. Blocks of 128 cover the sequence (one key block,
    # nothing to skip); blocks of 2 make the compiled program loop over only the key blocks
    # the BlockMask lists for each group of query rows, with a running softmax across them.
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch._dynamo.reset()
    n, d, hq = 24, 8, 4
    hkv = 2 if gqa else hq
    docs = _document_ids(n).to(TPU)
    mask_mod, dense = FLEX_MASKS[mask_name]
    if mask_name == "document":
        def mask_mod(b, h, q, k):
            return (docs[q] == docs[k]) & (q >= k)
    q = torch.randn(2, hq, n, d)
    k, v = torch.randn(2, hkv, n, d), torch.randn(2, hkv, n, d)
    block_mask = create_block_mask(mask_mod, None, None, n, n, device=TPU, BLOCK_SIZE=block)
    f = torch.compile(lambda q, k, v: flex_attention(q, k, v, block_mask=block_mask, enable_gqa=gqa), backend="tpu")
    _check_compiled_flex(f, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=dense(n), enable_gqa=gqa),
                         q, k, v, caplog, loss=lambda out: out.square().sum())


def test_compiled_flex_attention_reads_the_block_lists(caplog):
    # A BlockMask made from its lists alone (its mask function keeps every key) whose lists name
    # only the diagonal blocks: as in compiled flex attention, a key block that a query block's
    # lists do not name is masked for it, so the result is block-diagonal attention. Keys and
    # values of one batch, broadcast over the query's two.
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    torch._dynamo.reset()
    n, d, blk = 32, 8, 8
    nb = n // blk
    # The query a transposed view, as attention layers make it from [batch, tokens, heads, dim].
    q, k, v = torch.randn(2, n, 2, d).transpose(1, 2), torch.randn(1, 2, n, d), torch.randn(1, 2, n, d)
    diagonal = torch.block_diag(*[torch.ones(blk, blk)] * nb).bool()
    counts = torch.ones(2, 1, nb, dtype=torch.int32, device=TPU)
    # Row i lists i, i + 1, ... (mod nb), of which its count (1) keeps the first. (torch 2.11's
    # from_kv_blocks needs a slot per key block, on CPU too.)
    ring = (torch.arange(nb)[:, None] + torch.arange(nb)[None, :]) % nb
    indices = ring.to(torch.int32).expand(2, 1, nb, nb).contiguous().to(TPU)
    block_mask = BlockMask.from_kv_blocks(counts, indices, BLOCK_SIZE=blk, seq_lengths=(n, n))
    f = torch.compile(lambda q, k, v: flex_attention(q, k, v, block_mask=block_mask), backend="tpu")
    _check_compiled_flex(f, lambda q, k, v: F.scaled_dot_product_attention(
        q, k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1), attn_mask=diagonal), q, k, v, caplog)


def test_compiled_flex_attention_over_long_keys_in_chunks(caplog):
    # More keys than one step of the loop takes (512) and no block mask: the keys are attended
    # in chunks with a running softmax (the last one padded, its padding masked); grouped query
    # heads; a score function.
    from torch.nn.attention.flex_attention import flex_attention

    torch._dynamo.reset()
    m, n, d = 6, 1100, 8
    q = torch.randn(2, 4, m, d)
    k, v = torch.randn(2, 2, n, d), torch.randn(2, 2, n, d)
    tilt = ((torch.arange(m)[:, None] - torch.arange(n)[None, :]) * 0.01).float()
    f = torch.compile(lambda q, k, v: flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s + (i - j) * 0.01,
                                                     enable_gqa=True), backend="tpu")
    _check_compiled_flex(f, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=tilt, enable_gqa=True),
                         q, k, v, caplog, loss=lambda out: out.square().sum())


def test_compiled_flex_attention_gradient_through_the_logsumexp(caplog):
    # return_lse=True with a loss on the log-sum-exp too: the backward op's grad_logsumexp,
    # against the same attention written densely on CPU (CPU's flex attention has no backward).
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch._dynamo.reset()
    n, d = 20, 8
    q, k, v = (torch.randn(1, 2, n, d) for _ in range(3))

    def loss(out, lse):
        return out.sum() + lse.square().sum()

    def dense(q, k, v):
        s = (q @ k.transpose(-1, -2) / d**0.5).masked_fill(~torch.ones(n, n).tril().bool(), float("-inf"))
        return s.softmax(-1) @ v, s.logsumexp(-1)

    block_mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, n, n, device=TPU, BLOCK_SIZE=4)
    f = torch.compile(lambda q, k, v: flex_attention(q, k, v, block_mask=block_mask, return_lse=True), backend="tpu")
    cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    loss(*dense(*cpu)).backward()
    dev = [t.to(TPU).requires_grad_() for t in (q, k, v)]
    loss(*f(*dev)).backward()
    assert "runs eagerly" not in caplog.text, caplog.text
    for t, r in zip(dev, cpu):
        torch.testing.assert_close(t.grad.cpu(), r.grad, atol=5e-5, rtol=5e-5)


def test_compiled_flex_attention_score_mod_with_a_captured_bias():
    # A score_mod reading a captured tensor (a learned relative-position bias), with its gradient.
    from torch.nn.attention.flex_attention import flex_attention

    n, d = 16, 8
    bias = torch.randn(2, n, n)
    q, k, v = (torch.randn(1, 2, n, d) for _ in range(3))
    bt = bias.to(TPU).requires_grad_()
    br = bias.clone().requires_grad_()
    qr = q.clone().requires_grad_()
    want = F.scaled_dot_product_attention(qr, k, v, attn_mask=br)
    want.sum().backward()
    qt = q.to(TPU).requires_grad_()
    f = torch.compile(lambda q, k, v: flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s + bt[h, i, j]), backend="tpu")
    out = f(qt, k.to(TPU), v.to(TPU))
    out.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), want.detach(), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(qt.grad.cpu(), qr.grad, atol=5e-5, rtol=5e-5)
    torch.testing.assert_close(bt.grad.cpu(), br.grad, atol=5e-5, rtol=5e-5)


def test_compiled_flex_attention_in_blocks_matches_cpu_flex_attention():
    # Blocks of 2 (a loop over the listed key blocks of each group of query rows) against
    # PyTorch's flex attention on CPU: a score_mod reading a captured bias, rows whose every key
    # is masked (zeros, logsumexp -inf), the logsumexp, bfloat16 and float64.
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch._dynamo.reset()
    n, d = 20, 8
    g = torch.Generator().manual_seed(0)
    bias = torch.randn(2, n, n, generator=g)

    def mask(b, h, q, k):
        return (q >= k) & (q >= 3)  # queries 0-2 see no key

    for dtype, tol in ((torch.float32, 2e-5), (torch.bfloat16, 2e-2), (torch.float64, 1e-10)):
        q, k, v = (torch.randn(1, 2, n, d, generator=g).to(dtype) for _ in range(3))
        want, want_lse = flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s + bias[h, i, j],
                                        block_mask=create_block_mask(mask, None, None, n, n, device="cpu"),
                                        return_lse=True)
        bt = bias.to(TPU)
        block_mask = create_block_mask(mask, None, None, n, n, device=TPU, BLOCK_SIZE=2)
        f = torch.compile(lambda q, k, v: flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s + bt[h, i, j],
                                                         block_mask=block_mask, return_lse=True), backend="tpu")
        got, lse = f(q.to(TPU), k.to(TPU), v.to(TPU))
        torch.testing.assert_close(got.cpu(), want, atol=tol, rtol=tol)
        # The compiled op's log-sum-exp is float32 for every dtype (its traced output is); eager
        # PyTorch's is float64 for float64.
        assert lse.dtype == torch.float32
        torch.testing.assert_close(lse.cpu(), want_lse.float(), atol=max(tol, 1e-6), rtol=max(tol, 1e-6))
        assert got[:, :, :3].cpu().eq(0).all() and lse[:, :, :3].cpu().eq(float("-inf")).all()


@pytest.mark.parametrize("how", ["_compile", "inductor"])
def test_block_masks_compiled_by_inductor_run_torchtpus_compiler(how):
    # create_block_mask(..., _compile=True), which transformers' flex masks call, is
    # torch.compile with inductor over a graph that takes only sizes and makes its tensors on
    # the device it is given; torch 2.14's inductor has a code generator of its own for a device
    # named "tpu" (Pallas, which imports JAX). Graphs that touch tpu go to torchtpu's backend.
    import torch._dynamo
    from torch.nn.attention.flex_attention import create_block_mask

    def sliding(b, h, q, k):
        return (q >= k) & (q - k < 100)

    torch._dynamo.reset()
    want = create_block_mask(sliding, 1, 2, 384, 256, device="cpu")
    graphs = len(torch.tpu.compile_stats()["graphs"])
    if how == "_compile":
        with pytest.warns(DeprecationWarning):
            got = create_block_mask(sliding, 1, 2, 384, 256, device=TPU, _compile=True)
    else:
        got = torch.compile(create_block_mask, backend="inductor")(sliding, 1, 2, 384, 256, device=TPU)
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks", "q_indices"):
        g, w = getattr(got, name), getattr(want, name)
        assert g.device.type == "tpu" and torch.equal(g.cpu(), w), name
    assert len(torch.tpu.compile_stats()["graphs"]) > graphs  # compiled by torchtpu, JAX or not


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_entry_points_called_by_name(causal, dtype):
    # Some libraries call CUDA's flash and memory-efficient kernels by name: on tpu they compute
    # F.scaled_dot_product_attention's math, with gradients through PyTorch's formulas for them.
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 4, 6, 8, generator=g).to(dtype) for _ in range(3))
    bias = torch.randn(2, 4, 6, 6, generator=g).to(dtype)
    dy = torch.randn(2, 4, 6, 8, generator=g).to(dtype)
    cases = {
        "flash": (lambda q, k, v, b: torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal), None),
        "efficient": (lambda q, k, v, b: torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, b, True, 0.0, causal), bias),
    }
    for name, (call, b) in cases.items():
        qr, kr, vr = (t.detach().float().requires_grad_() for t in (q, k, v))
        if b is None:
            want = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
        else:  # (CPU takes a bias or is_causal, not both: the causal mask joins the bias)
            hidden = torch.ones(6, 6).triu(1).bool() if causal else torch.zeros(6, 6).bool()
            want = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=b.float().masked_fill(hidden, float("-inf")))
        want.backward(dy.float())
        qt, kt, vt = (t.detach().to(TPU).requires_grad_() for t in (q, k, v))
        out = call(qt, kt, vt, None if b is None else b.to(TPU))
        assert out[0].dtype == dtype and out[0].shape == want.shape, name
        assert out[1].dtype == torch.float32 and out[1].shape == (2, 4, 6), name  # the log-sum-exp
        out[0].backward(dy.to(TPU))
        assert_close(out[0].detach().cpu(), want.detach(), dtype)
        for t, r in ((qt, qr), (kt, kr), (vt, vr)):
            assert_close(t.grad.cpu(), r.grad, dtype)
    with pytest.raises(NotImplementedError, match="dropout_p > 0"):
        torch.ops.aten._scaled_dot_product_flash_attention(q.to(TPU), k.to(TPU), v.to(TPU), 0.5, causal)


@pytest.mark.parametrize("mask", [None, "float", "opmath", "causal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_cpu_flash_entry_point_matches_cpu(mask, dtype):
    # PyTorch's CPU kernel entry point, which some code calls by name: values, log-sum-exp and
    # gradients as the CPU kernel gives them, for key/value views that are not contiguous.
    g = torch.Generator().manual_seed(7)
    # q [B, H, L, E]; k and v stored [B, S, H, E] and read through a transpose.
    q, k, v = (torch.randn(2, n, 3, 8, generator=g).to(dtype) for n in (5, 7, 7))
    dy = torch.randn(2, 3, 5, 8, generator=g).to(dtype)
    attn_mask = {"float": torch.randn(2, 1, 5, 7, generator=g).to(dtype), "opmath": torch.randn(5, 7, generator=g).to(torch.float64 if dtype == torch.float64 else torch.float32)}.get(mask)
    results = []
    for device in ("cpu", TPU):
        leaves = [t.detach().to(device).requires_grad_() for t in (q, k, v)]
        views = [t.transpose(1, 2) for t in leaves]
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            *views, 0.0, mask == "causal", attn_mask=None if attn_mask is None else attn_mask.to(device), scale=0.3)
        out.backward(dy.to(device))
        results.append((out, lse, *(t.grad for t in leaves)))
    for got, want in zip(results[1], results[0]):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert_close(got.detach().cpu(), want.detach(), dtype)


def test_cpu_flash_entry_point_refuses_masks_as_cpu():
    # A mask of another dtype than the query's (or float32 for a reduced-precision query):
    # CPU's error on both, boolean masks included.
    for q_dtype, mask_dtype in ((torch.float32, torch.bool), (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float64)):
        q = torch.randn(1, 1, 2, 4, dtype=q_dtype)
        mask = torch.zeros(2, 2, dtype=mask_dtype)
        for device in ("cpu", TPU):
            with pytest.raises(RuntimeError, match="Attention mask is the same data type as query"):
                qd = q.to(device)
                torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qd, qd, qd, 0.0, False, attn_mask=mask.to(device))
