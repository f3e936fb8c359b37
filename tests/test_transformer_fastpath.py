"""PyTorch's transformer inference fast path on tpu (eval mode, no autograd):
`_native_multi_head_attention` (nn.MultiheadAttention self-attention) and
`_transformer_encoder_layer_fwd` (nn.TransformerEncoderLayer), against PyTorch on CPU, and
nn.TransformerEncoder's nested-tensor path (padding masks), which tpu runs densely."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import TPU, check_error

F32 = dict(atol=2e-5, rtol=2e-5)
BF16 = dict(atol=6e-2, rtol=6e-2)
aten = torch.ops.aten


class OpLog(TorchDispatchMode):
    """Records the aten ops that run."""

    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def to_dev(x):
    if isinstance(x, torch.Tensor):
        return x.to(TPU)
    if isinstance(x, (tuple, list)):
        return type(x)(to_dev(v) for v in x)
    if isinstance(x, dict):
        return {k: to_dev(v) for k, v in x.items()}
    return x


def compare(got, ref, tol=F32):
    if ref is None:
        assert got is None
        return
    if isinstance(ref, (tuple, list)):
        assert len(got) == len(ref)
        for g, r in zip(got, ref):
            compare(g, r, tol)
        return
    assert got.device.type == "tpu" and got.dtype == ref.dtype and got.shape == ref.shape
    torch.testing.assert_close(got.cpu(), ref, equal_nan=True, **tol)


def run_module(module, args, kwargs=None, tol=F32, expect_op=None):
    """module(*args) in eval mode without grad on CPU and on tpu (a copy): same results; on
    tpu the fast-path op `expect_op` ran."""
    kwargs = kwargs or {}
    module = module.eval()
    dev = copy.deepcopy(module).to(TPU)
    with torch.no_grad():
        ref = module(*args, **kwargs)
        # Self-attention takes the fast path only when query, key and value are one tensor.
        dargs = to_dev(args)
        if len(args) == 3 and args[0] is args[1] is args[2]:
            dargs = (dargs[0],) * 3
        log = OpLog()
        with log:
            got = dev(*dargs, **to_dev(kwargs))
    compare(got, ref, tol)
    if expect_op is not None:
        assert expect_op in log.names, sorted(log.names)
    return got, ref


# ---- _native_multi_head_attention ---------------------------------------------------------------


def mha_args(b, t, d, dtype=torch.float32, same=True):
    x = torch.randn(b, t, d).to(dtype)
    q, k, v = (x, x, x) if same else (x, torch.randn(b, t, d).to(dtype), torch.randn(b, t, d).to(dtype))
    w = (torch.randn(3 * d, d) / d ** 0.5).to(dtype)
    bias = torch.randn(3 * d).to(dtype)
    pw = (torch.randn(d, d) / d ** 0.5).to(dtype)
    pb = torch.randn(d).to(dtype)
    return q, k, v, w, bias, pw, pb


def mha_both(b, t, d, h, mask=None, mask_type=None, need_weights=True, average=True, same=True, dtype=torch.float32, tol=F32):
    q, k, v, w, bias, pw, pb = mha_args(b, t, d, dtype, same)

    def call(q, k, v, w, bias, pw, pb, mask):
        return aten._native_multi_head_attention(q, k, v, d, h, w, bias, pw, pb, mask, need_weights, average, mask_type)

    ref = call(q, k, v, w, bias, pw, pb, mask)
    got = call(*to_dev([q, k, v, w, bias, pw, pb, mask]))
    compare(got[0], ref[0], tol)
    if ref[1] is None:
        assert got[1] is None
    else:
        compare(got[1], ref[1], tol)
    return got, ref


@pytest.mark.parametrize("shape", [(2, 5, 16, 2), (1, 1, 8, 4), (3, 7, 12, 3), (2, 4, 32, 8)])
@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)])
def test_mha_op(shape, need_weights, average):
    mha_both(*shape, need_weights=need_weights, average=average)


def test_mha_op_cross_attention_inputs():
    # Different query, key and value tensors (same shapes).
    mha_both(2, 5, 16, 4, same=False)
    mha_both(2, 5, 16, 4, same=False, need_weights=False)


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
def test_mha_op_padding_mask(dtype):
    pad = torch.tensor([[0, 0, 0, 0, 0], [0, 0, 0, 1, 1], [0, 1, 0, 1, 0]], dtype=torch.bool)
    mask = pad if dtype == torch.bool else torch.zeros(3, 5).masked_fill(pad, float("-inf"))
    mha_both(3, 5, 16, 2, mask=mask, mask_type=1)
    mha_both(3, 5, 16, 2, mask=mask, mask_type=1, average=False)


def test_mha_op_attention_mask_types():
    causal = torch.ones(6, 6, dtype=torch.bool).triu(1)
    mha_both(2, 6, 16, 4, mask=causal, mask_type=0)
    full = torch.rand(2, 4, 6, 6) > 0.6
    full[..., 0] = False  # no fully masked row
    mha_both(2, 6, 16, 4, mask=full, mask_type=2, average=False)
    # A 4-d mask with type 1 or 0 is used as a full mask, as on CPU.
    mha_both(2, 6, 16, 4, mask=full, mask_type=1)


def test_mha_op_float_mask_nonzero_means_masked():
    # PyTorch converts the mask to bool: any nonzero value excludes the key (not additive).
    mask = torch.zeros(2, 5)
    mask[1, 2] = 0.5
    got, ref = mha_both(2, 5, 8, 2, mask=mask, mask_type=1)
    assert (ref[1][1, :, 2] == 0).all()


def test_mha_op_fully_masked_rows_are_nan():
    mask = torch.zeros(2, 4, dtype=torch.bool)
    mask[1] = True
    got, ref = mha_both(2, 4, 8, 2, mask=mask, mask_type=1)
    assert torch.isnan(ref[0][1]).all() and torch.isnan(got[0][1].cpu()).all()
    assert not torch.isnan(got[0][0].cpu()).any()


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_mha_op_dtypes(dtype):
    tol = dict(atol=1e-10, rtol=1e-10) if dtype == torch.float64 else BF16
    pad = torch.tensor([[0, 0, 0, 1], [0, 0, 0, 0]], dtype=torch.bool)
    mha_both(2, 4, 16, 2, mask=pad, mask_type=1, dtype=dtype, tol=tol)


def test_mha_op_empty():
    for b, t in [(0, 4), (2, 0)]:
        got, ref = mha_both(b, t, 8, 2)
        assert got[0].shape == ref[0].shape == (b, t, 8)


def test_mha_op_errors():
    q, k, v, w, b, pw, pb = mha_args(2, 4, 8)

    def call(q, k, v, w, b, pw, pb, mask, d, h, mask_type):
        return aten._native_multi_head_attention(q, k, v, d, h, w, b, pw, pb, mask, True, True, mask_type)

    bool_mask = lambda *s: torch.zeros(*s, dtype=torch.bool)  # noqa: E731
    cases = [
        (q[0], k[0], v[0], w, b, pw, pb, None, 8, 2, None),  # 2-d query
        (q, k, v, w, b, pw, pb, None, 6, 2, None),  # embed_dim mismatch
        (q, k[:, :3], v[:, :3], w, b, pw, pb, None, 8, 2, None),  # shapes differ
        (q, k, v, w[:16], b, pw, pb, None, 8, 2, None),  # qkv_weight rows
        (q, k, v, w, b[:16], pw, pb, None, 8, 2, None),  # qkv_bias size
        (q, k, v, w, b, pw, pb, None, 8, 3, None),  # heads do not divide
        (q, k, v, w, b, pw, pb, bool_mask(2, 4), 8, 2, None),  # no mask type
        (q, k, v, w, b, pw, pb, bool_mask(2, 4), 8, 2, 3),
        (q, k, v, w, b, pw, pb, bool_mask(3, 4), 8, 2, 1),
        (q, k, v, w, b, pw, pb, bool_mask(2, 4), 8, 2, 0),
        (q, k, v, w, b, pw, pb, bool_mask(1, 1, 4, 4), 8, 2, 2),
    ]
    for args in cases:
        e = check_error(call, *args)
        try:
            call(*args)
        except Exception as cpu_e:  # noqa: BLE001
            assert str(e) == str(cpu_e)


# ---- nn.MultiheadAttention --------------------------------------------------------------------


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("average", [True, False])
def test_multihead_attention_module(need_weights, average):
    m = torch.nn.MultiheadAttention(16, 4, batch_first=True)
    x = torch.randn(3, 5, 16)
    got, ref = run_module(m, (x, x, x), dict(need_weights=need_weights, average_attn_weights=average),
                          expect_op="_native_multi_head_attention")


def test_multihead_attention_module_masks():
    m = torch.nn.MultiheadAttention(16, 2, batch_first=True)
    x = torch.randn(3, 5, 16)
    pad = torch.tensor([[0, 0, 0, 0, 0], [0, 0, 0, 1, 1], [0, 0, 1, 1, 1]], dtype=torch.bool)
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)
    for kw in [dict(key_padding_mask=pad), dict(attn_mask=causal), dict(attn_mask=causal, key_padding_mask=pad),
               dict(attn_mask=causal.expand(6, 5, 5).clone(), need_weights=False)]:
        run_module(m, (x, x, x), kw, expect_op="_native_multi_head_attention")


def test_multihead_attention_bfloat16():
    # The CPU kernels' rounding points are kept: bfloat16 results match CPU's bfloat16 ones.
    m = torch.nn.MultiheadAttention(16, 2, batch_first=True).to(torch.bfloat16)
    x = torch.randn(2, 6, 16).to(torch.bfloat16)
    pad = torch.tensor([[0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1]], dtype=torch.bool)
    run_module(m, (x, x, x), dict(key_padding_mask=pad), tol={}, expect_op="_native_multi_head_attention")
    run_module(m, (x, x, x), dict(average_attn_weights=False), tol={}, expect_op="_native_multi_head_attention")


# ---- nn.TransformerEncoderLayer ---------------------------------------------------------------

ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "F.gelu": F.gelu, "nn.GELU": torch.nn.GELU(), "nn.ReLU": torch.nn.ReLU()}


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_encoder_layer(norm_first, activation):
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, norm_first=norm_first,
                                             activation=ACTIVATIONS[activation])
    run_module(layer, (torch.randn(2, 5, 16),), expect_op="_transformer_encoder_layer_fwd")


@pytest.mark.parametrize("sizes", [(1, 1, 8, 2, 8), (3, 7, 32, 8, 64), (2, 4, 12, 4, 20)])
def test_encoder_layer_sizes(sizes):
    b, t, d, h, ff = sizes
    layer = torch.nn.TransformerEncoderLayer(d, h, ff, batch_first=True, layer_norm_eps=1e-4)
    run_module(layer, (torch.randn(b, t, d),), expect_op="_transformer_encoder_layer_fwd")


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_masks(norm_first):
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, norm_first=norm_first)
    x = torch.randn(3, 5, 16)
    pad = torch.tensor([[0, 0, 0, 0, 0], [0, 0, 0, 1, 1], [0, 1, 1, 1, 1]], dtype=torch.bool)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(5)
    for kw in [dict(src_key_padding_mask=pad), dict(src_mask=causal), dict(src_mask=causal.isinf()),
               dict(src_mask=causal, src_key_padding_mask=pad.float().masked_fill(pad, float("-inf"))),
               dict(src_mask=causal, is_causal=True),
               dict(src_key_padding_mask=pad.float().masked_fill(pad, float("-inf")))]:
        run_module(layer, (x,), kw, expect_op="_transformer_encoder_layer_fwd")


def test_encoder_layer_per_head_mask():
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)
    x = torch.randn(2, 5, 16)
    mask = torch.rand(8, 5, 5) > 0.7
    mask[..., 0] = False
    run_module(layer, (x,), dict(src_mask=mask), expect_op="_transformer_encoder_layer_fwd")


def test_encoder_layer_empty_and_float64():
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    run_module(layer, (torch.randn(0, 3, 8),), expect_op="_transformer_encoder_layer_fwd")
    run_module(layer.double(), (torch.randn(2, 3, 8, dtype=torch.float64),),
               tol=dict(atol=1e-10, rtol=1e-10), expect_op="_transformer_encoder_layer_fwd")


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_encoder_layer_16bit(norm_first, activation, dtype):
    # 16-bit results match CPU's 16-bit ones (same rounding points).
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, norm_first=norm_first,
                                             activation=activation).to(dtype)
    x = torch.randn(3, 9, 32).to(dtype)
    pad = torch.tensor([[0] * 9, [0] * 6 + [1] * 3, [0] * 2 + [1] * 7], dtype=torch.bool)
    tol = {}
    if dtype == torch.float16 and not norm_first and tuple(map(int, torch.__version__.split(".")[:2])) >= (2, 14):
        # torch 2.14's CPU kernel rounds the float16 post-norm layer at other points (a few
        # float16 ulps apart, not yet followed here): compare at 16-bit precision there.
        tol = dict(atol=1e-2, rtol=1e-2)
    run_module(layer, (x,), tol=tol, expect_op="_transformer_encoder_layer_fwd")
    run_module(layer, (x,), dict(src_key_padding_mask=pad), tol=tol, expect_op="_transformer_encoder_layer_fwd")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_encoder_16bit_against_float32(dtype):
    # And they stay close to float32 arithmetic on the same rounded weights and inputs.
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, activation="gelu")
    ref_m = copy.deepcopy(layer).to(dtype).float().eval()
    dev = copy.deepcopy(layer).to(TPU, dtype).eval()
    x = torch.randn(2, 6, 16).to(dtype)
    with torch.no_grad():
        ref = ref_m(x.float())
        got = dev(x.to(TPU))
    assert got.dtype == dtype
    torch.testing.assert_close(got.cpu().float(), ref, **BF16)


def test_encoder_layer_op_errors():
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval()
    names = ["self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight", "self_attn.out_proj.bias",
             "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias", "linear1.weight", "linear1.bias",
             "linear2.weight", "linear2.bias"]
    p = dict(layer.named_parameters())
    on_cpu = [p[n].detach() for n in names]
    on_tpu = [t.to(TPU) for t in on_cpu]

    def call(ps, src, d, h):
        return torch._transformer_encoder_layer_fwd(src, d, h, *ps[:4], False, False, 1e-5, *ps[4:])

    for src, d, h in [(torch.randn(3, 8), 8, 2), (torch.randn(2, 3, 8), 6, 2), (torch.randn(2, 3, 8), 8, 3)]:
        with pytest.raises(RuntimeError) as cpu_e:
            call(on_cpu, src, d, h)
        with pytest.raises(RuntimeError) as tpu_e:
            call(on_tpu, src.to(TPU), d, h)
        assert str(tpu_e.value) == str(cpu_e.value)


# ---- nn.TransformerEncoder, decoder, nn.Transformer ---------------------------------------------


def encoder(layers=3, nested=True, norm=False, d=16, h=2):
    layer = torch.nn.TransformerEncoderLayer(d, h, 32, batch_first=True)
    return torch.nn.TransformerEncoder(layer, layers, norm=torch.nn.LayerNorm(d) if norm else None,
                                       enable_nested_tensor=nested)


PAD = torch.tensor([[0, 0, 0, 0, 0], [0, 0, 0, 1, 1], [0, 1, 1, 1, 1]], dtype=torch.bool)


@pytest.mark.parametrize("nested", [True, False])
@pytest.mark.parametrize("norm", [False, True])
def test_encoder(nested, norm):
    enc = encoder(nested=nested, norm=norm)
    x = torch.randn(3, 5, 16)
    run_module(enc, (x,), expect_op="_transformer_encoder_layer_fwd")
    got, ref = run_module(enc, (x,), dict(src_key_padding_mask=PAD), expect_op="_transformer_encoder_layer_fwd")
    if nested and not norm:
        # CPU's nested path pads its result with zeros; tpu gives the same.
        assert (ref[PAD] == 0).all() and (got.cpu()[PAD] == 0).all()
    causal = torch.nn.Transformer.generate_square_subsequent_mask(5)
    run_module(enc, (x,), dict(mask=causal), expect_op="_transformer_encoder_layer_fwd")
    run_module(enc, (x,), dict(mask=causal, is_causal=True), expect_op="_transformer_encoder_layer_fwd")


def test_encoder_nested_path_corner_cases():
    enc = encoder(layers=2)
    x = torch.randn(4, 5, 16)
    # A fully padded sequence, and every sequence shorter than the batch.
    pad = torch.tensor([[0, 0, 0, 1, 1], [1, 1, 1, 1, 1], [0, 0, 1, 1, 1], [0, 1, 1, 1, 1]], dtype=torch.bool)
    run_module(enc, (x,), dict(src_key_padding_mask=pad))
    # A float padding mask.
    run_module(enc, (x,), dict(src_key_padding_mask=torch.zeros(4, 5).masked_fill(pad, float("-inf"))))
    # Not left aligned: PyTorch's check sends it down the regular path.
    run_module(enc, (x,), dict(src_key_padding_mask=pad.flip(1)))
    # mask_check=False packs the first tokens of each row whatever the mask says.
    enc.mask_check = False
    run_module(enc, (x,), dict(src_key_padding_mask=pad.flip(1)))


def test_encoder_training_mode_still_regular():
    # With autograd, PyTorch's regular path runs (no fast-path op); gradients match CPU.
    enc = encoder(layers=2)
    enc.eval()
    dev = copy.deepcopy(enc).to(TPU)
    x = torch.randn(2, 5, 16)
    xc, xd = x.clone().requires_grad_(), x.to(TPU).requires_grad_()
    pad = PAD[:2]
    enc(xc, src_key_padding_mask=pad).sum().backward()
    dev(xd, src_key_padding_mask=pad.to(TPU)).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, atol=1e-4, rtol=1e-4)


def test_decoder_layer():
    layer = torch.nn.TransformerDecoderLayer(16, 2, 32, batch_first=True)
    tgt, mem = torch.randn(3, 5, 16), torch.randn(3, 6, 16)
    run_module(layer, (tgt, mem), expect_op="_native_multi_head_attention")
    causal = torch.nn.Transformer.generate_square_subsequent_mask(5)
    mem_pad = torch.tensor([[0] * 6, [0] * 4 + [1] * 2, [0] * 2 + [1] * 4], dtype=torch.bool)
    run_module(layer, (tgt, mem), dict(tgt_mask=causal, tgt_key_padding_mask=PAD, memory_key_padding_mask=mem_pad))
    run_module(layer, (tgt, mem), dict(tgt_mask=causal, tgt_is_causal=True))
    norm_first = torch.nn.TransformerDecoderLayer(16, 2, 32, batch_first=True, norm_first=True, activation="gelu")
    run_module(norm_first, (tgt, mem), dict(tgt_mask=causal))


@pytest.mark.parametrize("masks", [False, True])
def test_transformer(masks):
    t = torch.nn.Transformer(16, 2, 2, 2, 32, batch_first=True)
    src, tgt = torch.randn(3, 5, 16), torch.randn(3, 4, 16)
    kw = {}
    if masks:
        tgt_pad = torch.tensor([[0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 1]], dtype=torch.bool)
        kw = dict(tgt_mask=torch.nn.Transformer.generate_square_subsequent_mask(4), src_key_padding_mask=PAD,
                  memory_key_padding_mask=PAD, tgt_key_padding_mask=tgt_pad)
    run_module(t, (src, tgt), kw, expect_op="_transformer_encoder_layer_fwd")


# ---- _nested_tensor_from_mask_left_aligned ----------------------------------------------------


def test_left_aligned_op():
    t = torch.randn(3, 4, 2)
    f = torch._nested_tensor_from_mask_left_aligned
    for rows in [[[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]], [[1, 0, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]],
                 [[0, 0, 0, 0]] * 3, [[1, 1, 1, 1]] * 3, [[0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]]]:
        m = torch.tensor(rows, dtype=torch.bool)
        assert f(t.to(TPU), m.to(TPU)) is f(t, m)
    assert f(torch.randn(0, 4, 2, device=TPU), torch.zeros(0, 4, dtype=torch.bool, device=TPU)) is True
    for args in [(t, torch.zeros(3, 4)), (t, torch.zeros(4, dtype=torch.bool)), (t[0], torch.zeros(3, 4, dtype=torch.bool)),
                 (t, torch.zeros(3, 3, dtype=torch.bool))]:
        e = check_error(f, *args)
        try:
            f(*args)
        except Exception as cpu_e:  # noqa: BLE001
            assert str(e) == str(cpu_e)


def test_encoder_still_scriptable():
    # torchtpu's tpu handling of the nested path leaves what TorchScript compiles unchanged.
    import io

    enc = encoder(layers=2, norm=True).eval()
    x = torch.randn(3, 5, 16)
    scripted = torch.jit.script(enc)
    with torch.no_grad():
        torch.testing.assert_close(scripted(x, src_key_padding_mask=PAD), enc(x, src_key_padding_mask=PAD))
    buf = io.BytesIO()
    torch.jit.save(scripted, buf)
    buf.seek(0)
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.load(buf)(x), enc(x))
    torch.jit.script(torch.nn.Transformer(16, 2, 1, 1, 32, batch_first=True))
