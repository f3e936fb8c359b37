"""torch.float4_e2m1fn_x2 on tpu: two float4 e2m1 values per byte, moved and compared as
bytes by the ops PyTorch's CPU kernels run on it (with CPU's bytes exactly), refused with
NotImplementedError by the others (their arithmetic on bytes would be wrong numbers)."""
import pytest
import torch

from helpers import FLOAT4_VALUES, TPU, decoded, packed, tiny_llama

F4 = torch.float4_e2m1fn_x2
NOT_IMPLEMENTED = r"not implemented for 'Float4_e2m1fn_x2'"


def same_bytes(got, ref):
    assert got.device.type == "tpu" and got.dtype == ref.dtype and got.shape == ref.shape
    assert torch.equal(got.cpu().view(torch.uint8), ref.view(torch.uint8))


@pytest.mark.parametrize("shape", [(4, 6), (5, 3), (7,), (), (0, 4), (3, 0, 2)], ids=str)
def test_copies_both_ways_keep_the_bytes(shape):
    x = packed(*shape)
    d = x.to(TPU)
    assert d.dtype == F4 and d.shape == x.shape
    same_bytes(d, x)
    same_bytes(d.clone(), x)
    # Into an existing tensor on either side.
    back = torch.empty_like(x)
    back.copy_(d)
    assert torch.equal(back.view(torch.uint8), x.view(torch.uint8))
    into = torch.empty(shape, dtype=F4, device=TPU)
    into.copy_(x)
    same_bytes(into, x)


def test_non_contiguous_copies_of_the_outer_dims():
    x = packed(6, 5, 4)
    d = x.to(TPU)
    views = {
        "transposed": lambda t: t.transpose(0, 2),
        "stepped": lambda t: t[::2, 1:],
        "expanded": lambda t: t[:1].expand(3, 5, 4),
        "permuted": lambda t: t.permute(1, 2, 0),
        "diagonal": lambda t: t[:, :4].diagonal(dim1=1, dim2=2),
        "unfolded": lambda t: t.unfold(0, 2, 1),
    }
    for name, view in views.items():
        same_bytes(view(d).contiguous(), view(x).contiguous())
        # A non-contiguous CPU source uploads the same.
        same_bytes(view(x).to(TPU), view(x).contiguous())
        if name in ("expanded", "unfolded"):
            continue  # overlapping elements: no destination
        # A non-contiguous tpu destination takes them.
        dest, ref = torch.zeros(6, 5, 4, dtype=F4, device=TPU), torch.zeros(6, 5, 4, dtype=F4)
        view(dest).copy_(view(x))
        view(ref).copy_(view(x))
        same_bytes(dest, ref)


def test_views_to_bytes_and_back():
    x = packed(4, 6)
    d = x.to(TPU)
    u = d.view(torch.uint8)
    assert u.dtype == torch.uint8
    assert torch.equal(u.cpu(), x.view(torch.uint8))
    # Arithmetic on the bytes view, then back to float4.
    flipped = (u ^ 0x88).view(F4)
    same_bytes(flipped, (x.view(torch.uint8) ^ 0x88).view(F4))
    # Reshapes keep the packing (whole bytes).
    same_bytes(d.reshape(3, 8), x.reshape(3, 8))
    same_bytes(d.t().reshape(-1), x.t().reshape(-1))
    same_bytes(d.view(torch.int8).view(F4), x)


CPU_OPS = {
    "cat": lambda a, b: torch.cat([a, b, a]),
    "cat dim 1": lambda a, b: torch.cat([a[:, :3], b], dim=1),
    "stack": lambda a, b: torch.stack([a, b]),
    "vstack": lambda a, b: torch.vstack([a, b]),
    "index_select": lambda a, b: a.index_select(0, torch.tensor([3, 0, 0, 2], device=a.device)),
    "index_select dim 1": lambda a, b: a.index_select(1, torch.tensor([1, 5], device=a.device)),
    "where": lambda a, b: torch.where(torch.tensor([[True], [False], [True], [False], [True]], device=a.device), a, b),
    "roll": lambda a, b: a.roll(2, 0),
    "roll flat": lambda a, b: a.roll(3),
    "roll dim 1": lambda a, b: a.roll(1, 1),
    "flip": lambda a, b: a.flip(0),
    "repeat": lambda a, b: a.repeat(2, 3),
    "tile": lambda a, b: a.tile((2,)),
    "repeat_interleave": lambda a, b: a.repeat_interleave(2, dim=0),
    "narrow_copy": lambda a, b: a.narrow_copy(0, 1, 3),
    "eq": lambda a, b: a == b,
    "eq self": lambda a, b: a == a,
    "ne": lambda a, b: a != b,
    "isnan": lambda a, b: a.isnan(),
    "zero_": lambda a, b: a.clone().zero_(),
    "zeros_like": lambda a, b: torch.zeros_like(a),
    "new_zeros": lambda a, b: a.new_zeros(2, 3),
    "zeros": lambda a, b: torch.zeros(3, 2, dtype=F4, device=a.device),
    "diag": lambda a, b: a.diag(1),
    "diag_embed": lambda a, b: a[0].diag_embed(),
    "block_diag": lambda a, b: torch.block_diag(a, b[:2]),
    "unbind": lambda a, b: torch.unbind(a, 1)[2].clone(),
    "chunk": lambda a, b: a.chunk(2, 1)[1].contiguous(),
    "select": lambda a, b: a[2].clone(),
    "0-d": lambda a, b: a[1, 4].clone(),
    "empty slice": lambda a, b: a[:0].clone(),
}


@pytest.mark.parametrize("name", list(CPU_OPS))
def test_ops_cpu_runs_give_its_bytes(name):
    a, b = packed(5, 6, seed=1), packed(5, 6, seed=2)
    b[1] = a[1]  # some equal bytes for eq/ne
    try:
        ref = CPU_OPS[name](a, b)
    except NotImplementedError:
        # An older torch's CPU kernel lacks the case (where, in torch 2.11): the bytes' result.
        ref = CPU_OPS[name](a.view(torch.uint8), b.view(torch.uint8)).view(F4)
    got = CPU_OPS[name](a.to(TPU), b.to(TPU))
    if ref.dtype == F4:
        same_bytes(got, ref)
    else:
        assert got.dtype == ref.dtype
        assert torch.equal(got.cpu(), ref)


# Where CPU's kernel happens to have no float4 case (flipping or concatenating along the
# innermost dim), tpu moves the bytes all the same: checked against the uint8 view's result.
BYTE_OPS = {
    "flip dim 1": lambda t: t.flip(1),
    "stack dim 1": lambda t: torch.stack([t, t], dim=1),
    "hstack": lambda t: torch.hstack([t, t]),
    "fliplr": lambda t: t.fliplr(),
}


@pytest.mark.parametrize("name", list(BYTE_OPS))
def test_byte_moves_cpu_lacks_move_the_bytes(name):
    a = packed(4, 6)
    ref = BYTE_OPS[name](a.view(torch.uint8)).view(F4)
    same_bytes(BYTE_OPS[name](a.to(TPU)), ref)


REFUSED = {
    "add": lambda t: t + t,
    "mul scalar": lambda t: t * 2,
    "abs": lambda t: t.abs(),
    "fill_": lambda t: t.fill_(1.0),
    "ones": lambda t: torch.ones(3, dtype=F4, device=t.device),
    "full": lambda t: torch.full((2,), 0.5, dtype=F4, device=t.device),
    "masked_fill": lambda t: t.masked_fill(torch.ones_like(t, dtype=torch.bool), 0),
    "tril": lambda t: t.tril(),
    "sort": lambda t: t.sort(),
    "lt": lambda t: t < t,
    "sum": lambda t: t.sum(),
    "to float32": lambda t: t.float(),
    "to uint8": lambda t: t.to(torch.uint8),
    "from float32": lambda t: torch.ones(2, 3, device=t.device).to(F4),
    "copy_ from uint8": lambda t: t.copy_(torch.zeros(4, 6, dtype=torch.uint8, device=t.device)),
    "copy_ into float32": lambda t: torch.zeros(4, 6, device=t.device).copy_(t),
    "index": lambda t: t[torch.tensor([1, 0], device=t.device)],
    "index_put_": lambda t: t.index_put_((torch.tensor([0], device=t.device),), t[1:2].clone()),
    "isinf": lambda t: t.isinf(),
    "maximum": lambda t: torch.maximum(t, t),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_ops_cpu_refuses_raise_not_implemented(name):
    for device in ("cpu", TPU):
        with pytest.raises(NotImplementedError, match=NOT_IMPLEMENTED):
            REFUSED[name](packed(4, 6).to(device))


def test_mixing_float4_with_other_data_raises():
    a = packed(4, 6).to(TPU)
    u = torch.zeros(4, 6, dtype=torch.uint8, device=TPU)
    # CPU raises an internal assert (RuntimeError) for these promotions.
    for fn in (lambda: torch.cat([a, u]), lambda: a == u, lambda: torch.where(u > 0, a, u)):
        with pytest.raises(RuntimeError, match="Promotion for Float4 types is not supported"):
            fn()


def test_compiled_graph_moves_float4_bytes():
    def f(a, b, idx):
        return torch.cat([a, b]).index_select(0, idx).flip(0), a[:2] == b

    a, b, idx = packed(3, 4, seed=3), packed(2, 4, seed=4), torch.tensor([4, 0, 2])
    ref_bytes, ref_eq = f(a, b, idx)
    got_bytes, got_eq = torch.compile(f, backend="tpu", fullgraph=True)(a.to(TPU), b.to(TPU), idx.to(TPU))
    same_bytes(got_bytes, ref_bytes)
    assert torch.equal(got_eq.cpu(), ref_eq)
    # An op that does not take float4 refuses it in a graph too.
    with pytest.raises(NotImplementedError, match=NOT_IMPLEMENTED):
        torch.compile(lambda t: t.abs(), backend="tpu")(a.to(TPU))


# Scaled products of float4 operands: MXFP4 (one float8_e8m0fnu scale per 32 values along K)
# and NVFP4 (one float8_e4m3fn scale per 16, and in its two-level form a float32 scale per
# operand), scales in cuBLAS's SWIZZLE_32_4_4 layout, through F.scaled_mm and torch._scaled_mm
# as torchao calls them. PyTorch's CPU kernel runs none of these: checked against an emulation
# written here (each value decoded, times its scale, multiplied in float32).

F = torch.nn.functional
BLOCK_RECIPES = pytest.mark.skipif(not hasattr(F, "ScalingType"), reason="this torch has no block-wise F.scaled_mm")


def swizzle(scales):
    """One-byte block scales (rows, cols) in cuBLAS's SWIZZLE_32_4_4 layout, flat: 128x4 tiles
    (the matrix padded with ones) in row-major order, element (r, c) of a tile at
    (r % 32) * 16 + (r // 32) * 4 + c."""
    rows, cols = scales.shape
    tiles_r, tiles_c = -(-rows // 128), -(-cols // 4)
    padded = torch.ones(tiles_r * 128, tiles_c * 4).to(scales.dtype).view(torch.uint8)
    padded[:rows, :cols] = scales.view(torch.uint8)
    tiles = padded.view(tiles_r, 4, 32, tiles_c, 4).permute(0, 3, 2, 1, 4)
    return tiles.reshape(-1).view(scales.dtype)


def per_element(scales, block, k):
    return scales.float().repeat_interleave(block, 1)[:, :k]


class Operands:
    """a (m, k/2) and b (k/2, n) on CPU and on tpu: b as torchao passes a weight, the transpose
    of (n, k/2) (transposed on the device: CPU's copy has no kernel for float4's transposes)."""

    def __init__(self, m, k, n, seed=0):
        self.a, w = packed(m, k // 2, seed=seed), packed(n, k // 2, seed=seed + 1)
        self.b = w.t()
        self.dev = (self.a.to(TPU), w.to(TPU).t())


def block_scales_for(recipe, rows, k, seed):
    g = torch.Generator().manual_seed(seed)
    block = 16 if recipe == "nvfp4" else 32
    kb = -(-k // block)
    if recipe == "nvfp4":
        return (torch.rand(rows, kb, generator=g) * 2 + 0.25).to(torch.float8_e4m3fn), block
    return (2.0 ** torch.randint(-4, 5, (rows, kb), generator=g)).to(torch.float8_e8m0fnu), block


def emulated_product(a, b, sa, sb, block, global_scale=None, bias=None, out_dtype=torch.bfloat16):
    k = a.shape[1] * 2
    out = (decoded(a, 1) * per_element(sa, block, k)) @ (decoded(b, 0) * per_element(sb, block, k).t())
    if global_scale is not None:
        out = out * global_scale
    return (out if bias is None else out + bias.float()).to(out_dtype)


def close(got, ref):
    assert got.dtype == ref.dtype and got.shape == ref.shape
    tol = dict(rtol=1e-5, atol=1e-4) if ref.dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(got.cpu(), ref, **tol)


def test_decoding_table_is_float4_e2m1():
    # Every code once: the emulation's table against the format's definition (sign, 2-bit
    # exponent with bias 1, 1-bit mantissa).
    for code in range(16):
        sign, exponent, mantissa = code >> 3, (code >> 1) & 3, code & 1
        value = mantissa * 0.5 if exponent == 0 else 2.0 ** (exponent - 1) * (1 + mantissa / 2)
        assert FLOAT4_VALUES[code].item() == (-value if sign else value)


@BLOCK_RECIPES
@pytest.mark.parametrize("recipe", ["mxfp4", "nvfp4", "nvfp4-two-level"])
@pytest.mark.parametrize("shape", [(128, 64, 32), (40, 96, 24), (130, 160, 136)], ids=str)
@pytest.mark.parametrize("output_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_functional_scaled_mm_float4(recipe, shape, output_dtype):
    m, k, n = shape
    ops = Operands(m, k, n)
    a, b = ops.a, ops.b
    (sa, block), (sb, _) = block_scales_for(recipe.split("-")[0], m, k, 2), block_scales_for(recipe.split("-")[0], n, k, 3)
    kind = F.ScalingType.BlockWise1x16 if block == 16 else F.ScalingType.BlockWise1x32
    swz = F.SwizzleType.SWIZZLE_32_4_4
    bias = torch.randn(n).to(output_dtype) if output_dtype != torch.float32 else None
    scale_a, scale_b = swizzle(sa).to(TPU), swizzle(sb).to(TPU)
    if recipe == "nvfp4-two-level":
        ga, gb = torch.tensor(0.75), torch.tensor(1.5)
        ref = emulated_product(a, b, sa, sb, block, ga * gb, bias, output_dtype)
        got = F.scaled_mm(*ops.dev, [scale_a, ga.to(TPU)], [kind, F.ScalingType.TensorWise],
                          [scale_b, gb.to(TPU)], [kind, F.ScalingType.TensorWise], swizzle_a=[swz, swz],
                          swizzle_b=[swz, swz], bias=None if bias is None else bias.to(TPU), output_dtype=output_dtype)
    else:
        ref = emulated_product(a, b, sa, sb, block, None, bias, output_dtype)
        got = F.scaled_mm(*ops.dev, scale_a, kind, scale_b, kind, swizzle_a=swz, swizzle_b=swz,
                          bias=None if bias is None else bias.to(TPU), output_dtype=output_dtype)
    close(got, ref)


@BLOCK_RECIPES
@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp4", "nvfp4"])
def test_scaled_mm_block_scales_as_torchao_calls_it(recipe):
    # torch._scaled_mm picks the block recipe from the operands' formats and the scales' dtype
    # and count (torchao's MXFP8 and NVFP4 linear layers call it so).
    m, k, n = 96, 128, 48
    sa, block = block_scales_for("mxfp4" if recipe == "mxfp8" else recipe, m, k, 4)
    sb, _ = block_scales_for("mxfp4" if recipe == "mxfp8" else recipe, n, k, 5)
    if recipe == "mxfp8":
        a = (torch.randn(m, k) * 4).to(torch.float8_e4m3fn)
        b = (torch.randn(n, k) * 4).to(torch.float8_e4m3fn).t()
        ref = ((a.float() * per_element(sa, 32, k)) @ (b.float() * per_element(sb, 32, k).t())).to(torch.bfloat16)
        dev = (a.to(TPU), b.to(TPU))
    else:
        ops = Operands(m, k, n, seed=6)
        ref = emulated_product(ops.a, ops.b, sa, sb, block)
        dev = ops.dev
    got = torch._scaled_mm(*dev, swizzle(sa).to(TPU), swizzle(sb).to(TPU), out_dtype=torch.bfloat16)
    close(got, ref)


@BLOCK_RECIPES
def test_scaled_mm_float4_errors():
    a, b = Operands(128, 64, 32).dev
    sa, _ = block_scales_for("nvfp4", 128, 64, 0)
    sb, _ = block_scales_for("nvfp4", 32, 64, 1)
    sa, sb = swizzle(sa), swizzle(sb)
    B16, TW = F.ScalingType.BlockWise1x16, F.ScalingType.TensorWise
    swz, none = F.SwizzleType.SWIZZLE_32_4_4, F.SwizzleType.NO_SWIZZLE
    one = torch.tensor(1.0)
    at = lambda *ts: [t.to(TPU) for t in ts]  # noqa: E731  (a and b are there already)
    # CUDA's checks, with its messages (PyTorch's CPU kernel does not run block scales).
    cases = {
        "For Blockwise scaling scale_a should have 512 elements, got: 256":
            lambda a, b, sa, sb, one: F.scaled_mm(a, b, sa[:256], B16, sb, B16, swizzle_a=swz, swizzle_b=swz),
        "scale_b must be swizzled to SWIZZLE_32_4_4 format":
            lambda a, b, sa, sb, one: F.scaled_mm(a, b, sa, B16, sb, B16, swizzle_a=swz, swizzle_b=none),
        "swizzle_a must have 2 values, got 1":
            lambda a, b, sa, sb, one: F.scaled_mm(a, b, [sa, one], [B16, TW], [sb, one], [B16, TW], swizzle_a=swz,
                                                  swizzle_b=[swz, swz]),
        "For Blockwise scaling scale_b should have 512 elements, got: 512":
            lambda a, b, sa, sb, one: F.scaled_mm(a, b, [sa, one], [B16, TW], [sb, one.double()], [B16, TW],
                                                  swizzle_a=[swz, swz], swizzle_b=[swz, swz]),
    }
    for message, fn in cases.items():
        with pytest.raises(ValueError) as e:
            fn(*at(a, b, sa, sb, one))
        assert str(e.value) == message
    # float4 against float8 operands: no recipe multiplies them.
    e4m3 = torch.zeros(32, 32, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="^Invalid scaling configuration"):
        F.scaled_mm(*at(a, e4m3, sa), B16, sb.to(TPU), B16, swizzle_a=swz, swizzle_b=swz)
    # A float4 result has no kernel.
    with pytest.raises(NotImplementedError, match="Float4_e2m1fn_x2 results"):
        torch._scaled_mm(*at(a, b, sa, sb), out_dtype=F4)


@BLOCK_RECIPES
@pytest.mark.parametrize("elem", ["float8_e4m3fn", "float4_e2m1fn_x2"])
def test_torchao_mx_inference_config(elem):
    # torchao's MX recipe as a user applies it to a model on tpu: weights quantized on the
    # device, activations at each call, products through torch._scaled_mm (MXFP8) or
    # F.scaled_mm (MXFP4). Against torchao's emulated kernel on CPU from the same weights.
    pytest.importorskip("torchao")
    import copy

    from torchao.prototype.mx_formats import MXDynamicActivationMXWeightConfig
    from torchao.quantization import quantize_
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    dtype = getattr(torch, elem)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 128, bias=False), torch.nn.ReLU(),
                                torch.nn.Linear(128, 64, bias=False)).to(torch.bfloat16)
    x = torch.randn(32, 256, dtype=torch.bfloat16)
    cpu = copy.deepcopy(model)
    quantize_(cpu, MXDynamicActivationMXWeightConfig(activation_dtype=dtype, weight_dtype=dtype,
                                                     kernel_preference=KernelPreference.EMULATED))
    dev = model.to(TPU)
    quantize_(dev, MXDynamicActivationMXWeightConfig(activation_dtype=dtype, weight_dtype=dtype))
    for i in (0, 2):
        # The same quantized bytes and scales as on CPU.
        w, ref_w = dev[i].weight, cpu[i].weight
        assert torch.equal(w.qdata.cpu().view(torch.uint8), ref_w.qdata.view(torch.uint8))
        assert torch.equal(w.scale.cpu().view(torch.uint8), ref_w.scale.view(torch.uint8))
    with torch.no_grad():
        got, ref = dev(x.to(TPU)), cpu(x)
    assert got.device.type == "tpu" and got.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(got.cpu(), ref, rtol=2e-2, atol=2e-2)


def test_torchao_nvfp4_weight_only_hugging_face_inference():
    # torchao's NVFP4 weight-only recipe on a tiny Llama, quantized on the device: the same
    # float4 bytes and scales as on CPU, its logits and greedy tokens the same recipe's on CPU.
    # (Its dynamic-activation recipe asserts an sm100 CUDA GPU when it is applied.)
    import copy

    from torchao.prototype.mx_formats import NVFP4WeightOnlyConfig
    from torchao.quantization import quantize_

    cpu = tiny_llama().eval()
    dev = copy.deepcopy(cpu).to(TPU)
    quantize_(cpu, NVFP4WeightOnlyConfig())
    quantize_(dev, NVFP4WeightOnlyConfig())
    w, ref_w = dev.model.layers[0].mlp.up_proj.weight, cpu.model.layers[0].mlp.up_proj.weight
    assert w.qdata.device.type == "tpu" and w.qdata.dtype == ref_w.qdata.dtype  # packed float4 pairs
    assert torch.equal(w.qdata.cpu().view(torch.uint8), ref_w.qdata.view(torch.uint8))
    assert torch.equal(w.scale.cpu().view(torch.uint8), ref_w.scale.view(torch.uint8))
    ids = torch.randint(0, 128, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(dev(ids.to(TPU)).logits.cpu().float(), cpu(ids).logits.float(), atol=2e-2, rtol=2e-2)
        got = dev.generate(ids.to(TPU), max_new_tokens=8, do_sample=False).cpu()
        assert torch.equal(got, cpu.generate(ids, max_new_tokens=8, do_sample=False))
