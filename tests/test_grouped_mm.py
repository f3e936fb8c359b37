"""torch._grouped_mm (mixture-of-experts matmuls) on tpu against PyTorch on CPU: the four
layouts, gradients, empty groups, rows past the last group, and PyTorch's errors. The float8 and
float4 forms (torch._scaled_grouped_mm, F.scaled_grouped_mm: row-wise, MXFP8, MXFP4, NVFP4),
which PyTorch runs on CUDA only, against an emulation written here, with CUDA's errors; block
scales laid out by torchao's reference helpers, as its MoE training lays them out."""
import re

import pytest
import torch

from helpers import TPU, decoded, packed

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def offsets(*ends):
    return torch.tensor(ends, dtype=torch.int32)


def run(a, b, offs, grad_rows=None):
    """Forward and input gradients on CPU and tpu for the same upstream gradient."""
    ac, bc = a.clone().requires_grad_(), b.clone().requires_grad_()
    at, bt = a.to(TPU).requires_grad_(), b.to(TPU).requires_grad_()
    ref = torch._grouped_mm(ac, bc, offs=offs)
    got = torch._grouped_mm(at, bt, offs=None if offs is None else offs.to(TPU))
    g = torch.randn(ref.shape).to(ref.dtype)
    if grad_rows is not None:
        g[grad_rows:] = 0  # CPU leaves rows past the last group uninitialized
    ref.backward(g)
    got.backward(g.to(TPU))
    return ref, got.cpu(), (ac.grad, bc.grad), (at.grad.cpu(), bt.grad.cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_grouped_by_expert(dtype):
    torch.manual_seed(0)
    a, b = torch.randn(10, 16).to(dtype), torch.randn(4, 16, 8).to(dtype)
    offs = offsets(2, 5, 5, 9)  # an empty group; row 9 is in none
    ref, got, rg, gg = run(a, b, offs, grad_rows=9)
    torch.testing.assert_close(got[:9].float(), ref[:9].float(), **TOL[dtype])
    assert torch.equal(got[9], torch.zeros(8, dtype=dtype))
    torch.testing.assert_close(gg[0][:9].float(), rg[0][:9].float(), **TOL[dtype])
    torch.testing.assert_close(gg[1].float(), rg[1].float(), **TOL[dtype])


def test_shared_dim_grouped_and_columns_grouped():
    torch.manual_seed(1)
    a, b = torch.randn(6, 12), torch.randn(12, 8)
    ref, got, rg, gg = run(a, b, offsets(4, 4, 12))
    torch.testing.assert_close(got, ref)
    for x, y in zip(gg, rg):
        torch.testing.assert_close(x, y)
    a3, b2 = torch.randn(3, 6, 16), torch.randn(16, 12)
    ref, got, rg, gg = run(a3, b2, offsets(4, 8, 12))
    torch.testing.assert_close(got, ref)
    for x, y in zip(gg, rg):
        torch.testing.assert_close(x, y)


def test_batched_and_non_contiguous():
    torch.manual_seed(2)
    ref, got, rg, gg = run(torch.randn(3, 8, 4), torch.randn(3, 4, 8), None)
    torch.testing.assert_close(got, ref)
    for x, y in zip(gg, rg):
        torch.testing.assert_close(x, y)
    w = torch.randn(4, 8, 16).transpose(1, 2)  # column-major experts, as MoE layers pass them
    x = torch.randn(12, 16)
    ref = torch._grouped_mm(x, w, offs=offsets(3, 6, 9, 12))
    got = torch._grouped_mm(x.to(TPU), w.to(TPU), offs=offsets(3, 6, 9, 12).to(TPU))
    torch.testing.assert_close(got.cpu(), ref)


def test_errors():
    a, b = torch.randn(8, 16), torch.randn(4, 16, 8)
    with pytest.raises(RuntimeError, match="Offsets tensor not provided"):
        torch._grouped_mm(a.to(TPU), b.to(TPU))
    with pytest.raises(RuntimeError, match=r"must be integer \(int32\)"):
        torch._grouped_mm(a.to(TPU), b.to(TPU), offs=torch.tensor([2, 4, 6, 8], device=TPU))
    with pytest.raises(RuntimeError, match="matrix batch sizes have to match"):
        torch._grouped_mm(a.to(TPU), b.to(TPU), offs=offsets(4, 8).to(TPU))
    with pytest.raises(RuntimeError, match="contraction dimension"):
        torch._grouped_mm(a.to(TPU), torch.randn(4, 12, 8, device=TPU), offs=offsets(2, 4, 6, 8).to(TPU))
    with pytest.raises(RuntimeError, match="2D or 3D"):
        torch._grouped_mm(torch.randn(8, device=TPU), b.to(TPU), offs=offsets(2, 4, 6, 8).to(TPU))


def test_compiled_with_float32_and_unaligned_shapes():
    # PyTorch's meta function admits only bf16 with 16-byte aligned strides (its CUDA kernel's
    # limits); graphs on tpu take float32 and any shape.
    torch.manual_seed(3)
    x, w, offs = torch.randn(10, 12), torch.randn(3, 12, 5), offsets(3, 6, 10)

    def f(x, w, offs):
        return torch._grouped_mm(x, w, offs=offs).sum(-1)

    ref = torch.cat([x[0:3] @ w[0], x[3:6] @ w[1], x[6:10] @ w[2]]).sum(-1)
    got = torch.compile(f, backend="tpu")(x.to(TPU), w.to(TPU), offs.to(TPU))
    torch.testing.assert_close(got.cpu(), ref)


# ---- torch._scaled_grouped_mm and F.scaled_grouped_mm: float8 e4m3 with row-wise scales ------

F = torch.nn.functional
E4M3 = torch.float8_e4m3fn
RW = F.ScalingType.RowWise


def fp8(*shape):
    return (torch.randn(*shape) * 2).to(E4M3)


def scaled_operands(layout, groups=4):
    """mat_a row-major and mat_b column-major (as CUDA's kernel takes them), float32 row-wise
    scales, and group ends with an empty group (and, for rows grouped, rows past the last)."""
    m, k, n = 48, 32, 16
    if layout == "2d-3d":
        a, b, offs = fp8(m, k), fp8(groups, n, k).transpose(-2, -1), offsets(8, 24, 24, 40)
        sa, sb = torch.rand(m) + 0.1, torch.rand(groups, n) + 0.1
    elif layout == "3d-2d":
        a, b, offs = fp8(groups, m, k), fp8(4 * n, k).t(), offsets(16, 16, 48, 64)
        sa, sb = torch.rand(groups, m) + 0.1, torch.rand(4 * n) + 0.1
    elif layout == "2d-2d":
        a, b, offs = fp8(m, 4 * k), fp8(n, 4 * k).t(), offsets(32, 64, 64, 128)
        sa, sb = torch.rand(groups * m) + 0.1, torch.rand(groups * n) + 0.1
    else:
        a, b, offs = fp8(groups, m, k), fp8(groups, n, k).transpose(-2, -1), None
        sa, sb = torch.rand(groups, m) + 0.1, torch.rand(groups, n) + 0.1
    return a, b, sa, sb, offs


def emulated(a, b, sa, sb, offs):
    """Each group's float32 product of the float8 values times its rows' and columns' scales."""
    a, b = a.float(), b.float()
    if offs is None:
        return (torch.bmm(a, b) * sa[:, :, None] * sb[:, None, :]).to(torch.bfloat16)
    bounds = list(zip([0] + offs.tolist()[:-1], offs.tolist()))
    if a.dim() == 2 and b.dim() == 3:
        out = torch.zeros(a.shape[0], b.shape[2])
        for g, (s, e) in enumerate(bounds):
            out[s:e] = a[s:e] @ b[g] * sa[s:e, None] * sb[g]
    elif a.dim() == 3:
        out = torch.zeros(a.shape[1], b.shape[1])
        for g, (s, e) in enumerate(bounds):
            out[:, s:e] = a[g] @ b[:, s:e] * sa[g][:, None] * sb[s:e]
    else:
        m, n = a.shape[0], b.shape[1]
        out = torch.zeros(len(bounds), m, n)
        for g, (s, e) in enumerate(bounds):
            out[g] = a[:, s:e] @ b[s:e] * sa[g * m:(g + 1) * m, None] * sb[g * n:(g + 1) * n]
    return out.to(torch.bfloat16)


def on_tpu(*values):
    return [None if v is None else v.to(TPU) for v in values]


def to_tpu_keeping_layout(t):
    """A copy on tpu with the same strides (a column-major matrix stays column-major)."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=TPU).copy_(t)


@pytest.mark.parametrize("layout", ["2d-3d", "3d-2d", "2d-2d", "3d-3d"])
def test_scaled_grouped_mm_row_wise(layout):
    torch.manual_seed(4)
    a, b, sa, sb, offs = scaled_operands(layout)
    ref = emulated(a, b, sa, sb, offs)
    at, bt = a.to(TPU), to_tpu_keeping_layout(b)
    st = on_tpu(sa, sb, offs)
    got = torch._scaled_grouped_mm(at, bt, st[0], st[1], offs=st[2]).cpu()
    v2 = F.scaled_grouped_mm(at, bt, st[0], RW, st[1], RW, offs=st[2]).cpu()
    assert got.dtype == v2.dtype == torch.bfloat16 and got.shape == ref.shape
    if layout == "2d-3d":  # rows past the last group: zeros (CUDA leaves them unwritten)
        assert torch.equal(got[40:], torch.zeros(8, 16, dtype=torch.bfloat16))
        got, v2, ref = got[:40], v2[:40], ref[:40]
    torch.testing.assert_close(got.float(), ref.float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(v2, got, atol=0, rtol=0)


def test_scaled_grouped_mm_compiled():
    torch.manual_seed(5)
    a, b, sa, sb, offs = scaled_operands("2d-3d")

    def f(a, b, sa, sb, offs):
        return torch._scaled_grouped_mm(a, b, sa, sb, offs=offs, out_dtype=torch.bfloat16).float().relu()

    got = torch.compile(f, backend="tpu")(a.to(TPU), to_tpu_keeping_layout(b), *on_tpu(sa, sb, offs))
    torch.testing.assert_close(got.cpu()[:40], emulated(a, b, sa, sb, offs).float().relu()[:40], atol=1e-2, rtol=1e-2)


def test_scaled_grouped_mm_errors():
    # CUDA's checks and messages (PyTorch has no CPU kernel to compare with).
    a, b, sa, sb, offs = scaled_operands("2d-3d")
    a, b, sa, sb, offs = a.to(TPU), to_tpu_keeping_layout(b), *on_tpu(sa, sb, offs)
    sgm = torch._scaled_grouped_mm
    bad = [
        (lambda: sgm(a.t(), b, sa, sb, offs=offs), ValueError, "Expected mat1 to not be transposed"),
        (lambda: sgm(a, b.contiguous(), sa, sb, offs=offs), ValueError, "Expected mat2 to be transposed"),
        (lambda: sgm(a[:, ::2], b, sa, sb, offs=offs), RuntimeError, "Invalid strides/sizes, got [32, 2] for strides and [48, 16] for sizes"),
        (lambda: sgm(a[0], b, sa, sb, offs=offs), ValueError, "mat_a has to be 2 or 3d"),
        (lambda: sgm(a[:, :16], b, sa, sb, offs=offs), ValueError, "contraction dimension of mat_a and mat_b must match"),
        (lambda: sgm(a, b, sa, sb, offs=offs, bias=torch.ones(16, device=TPU)), ValueError, "Bias not supported yet"),
        (lambda: sgm(a, b, sa, sb, offs=offs, scale_result=torch.ones(1, device=TPU)), ValueError, "Scale result not supported yet"),
        (lambda: sgm(a, b, sa, sb), ValueError, "Have to provide offsets if there is a 2d matrix"),
        (lambda: sgm(a, b, sa, sb, offs=offs.long()), ValueError, "Offsets have to be int32"),
        (lambda: sgm(a, b, sa, sb, offs=offs[:3]), RuntimeError, "matrix batch sizes have to match"),
        (lambda: sgm(a, b, sa.half(), sb, offs=offs), ValueError, "For FP8 tensorwise and rowwise, both scales must both be float32"),
        (lambda: sgm(a, b, sa[:40], sb, offs=offs), RuntimeError, "scale must have the same length as mat for arg 0"),
        (lambda: sgm(a, b, sa[None], sb, offs=offs), RuntimeError, "scale must be a 1D tensor, but got 2D, arg 0"),
        (lambda: sgm(a, b, sa, sb[:3], offs=offs), RuntimeError, "scale must have the same batch dimension as mat for arg 1"),
        (lambda: sgm(a, b, sa, sb.t().contiguous().t(), offs=offs), RuntimeError, "scale must be contiguous in the last dimension for arg 1"),
        (lambda: sgm(a, b, sa, sb, offs=offs, out_dtype=torch.float32), ValueError, "Only bf16 high precision output types"),
        (lambda: sgm(a.to(torch.float8_e5m2), b, sa, sb, offs=offs), ValueError, "Expected mat_a to be Float8_e4m3 matrix got Float8_e5m2"),
        (lambda: F.scaled_grouped_mm(a, b, sa, F.ScalingType.TensorWise, sb, RW, offs=offs), ValueError, "No gemm implementation was found"),
    ]
    for call, cls, message in bad:
        with pytest.raises(cls, match=re.escape(message)):
            call()


# ---- block-scaled grouped products: MXFP8, MXFP4, NVFP4 ---------------------------------------

F4 = torch.float4_e2m1fn_x2
B16, B32, TW = F.ScalingType.BlockWise1x16, F.ScalingType.BlockWise1x32, F.ScalingType.TensorWise
SWIZZLED = F.SwizzleType.SWIZZLE_32_4_4


def block_scales(*shape, recipe, seed):
    """Random scales: powers of two (e8m0) for MX, float8 e4m3 for NVFP4."""
    g = torch.Generator().manual_seed(seed)
    if recipe == "nvfp4":
        return (torch.rand(*shape, generator=g) * 2 + 0.25).to(E4M3)
    return (2.0 ** torch.randint(-3, 4, shape, generator=g)).to(torch.float8_e8m0fnu)


def elements(data, scales, block):
    """(rows, k) operand values (float4 pairs decoded along k) times their blocks' scales."""
    values = decoded(data, 1) if data.dtype == F4 else data.float()
    return values * scales.float().repeat_interleave(block, 1)


def block_data(recipe, *shape, seed):
    """Operand data with k (the last dim) given unpacked."""
    if recipe == "mxfp8":
        torch.manual_seed(seed)
        return fp8(*shape)
    return packed(*shape[:-1], shape[-1] // 2, seed=seed)


@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp4", "nvfp4"])
def test_block_scaled_rows_grouped_by_expert(recipe):
    from torchao.prototype.moe_training.kernels.mxfp8.quant import (
        torch_to_blocked_2d_M_groups, torch_to_blocked_per_group_3d)

    m, k, n, groups, block = 200, 128, 32, 4, 16 if recipe == "nvfp4" else 32
    offs = offsets(40, 40, 170, 190)  # an empty group; rows 190.. are in none
    a, w = block_data(recipe, m, k, seed=6), block_data(recipe, groups, n, k, seed=7)
    sa, sw = block_scales(m, k // block, recipe=recipe, seed=8), block_scales(groups, n, k // block, recipe=recipe, seed=9)
    ga, gw = torch.rand(groups) + 0.5, torch.rand(groups) + 0.5
    ref = torch.zeros(m, n)
    for g, (s, e) in enumerate(zip([0] + offs.tolist()[:-1], offs.tolist())):
        ref[s:e] = elements(a[s:e], sa[s:e], block) @ elements(w[g], sw[g], block).t()
        if recipe == "nvfp4":
            ref[s:e] *= ga[g] * gw[g]
    # CUDA's layouts: the activations' scales swizzled per group of rows, the weights' per expert.
    sa_blocked, sw_blocked = torch_to_blocked_2d_M_groups(sa, offs)[0], torch_to_blocked_per_group_3d(sw)
    at, bt = a.to(TPU), w.to(TPU).transpose(-2, -1)  # (G, k, n) column-major, as MoE layers pass it
    sat, swt, offt = sa_blocked.to(TPU), sw_blocked.to(TPU), offs.to(TPU)
    if recipe == "nvfp4":
        got = F.scaled_grouped_mm(at, bt, [sat, ga.to(TPU)], [B16, TW], [swt, gw.to(TPU)], [B16, TW], offs=offt)
    else:
        got = F.scaled_grouped_mm(at, bt, sat, B32, swt, B32, swizzle_a=SWIZZLED, swizzle_b=SWIZZLED, offs=offt)
    got = got.cpu()
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    assert torch.equal(got[190:], torch.zeros(10, n, dtype=torch.bfloat16))
    torch.testing.assert_close(got[:190].float(), ref[:190].to(torch.bfloat16).float(), atol=1e-2, rtol=1e-2)
    if recipe == "mxfp8":  # the same through torch._scaled_grouped_mm, eager and compiled
        def v1(*args):
            return torch._scaled_grouped_mm(*args, offs=offt, out_dtype=torch.bfloat16)

        torch.testing.assert_close(v1(at, bt, sat, swt).cpu(), got, atol=0, rtol=0)
        torch.testing.assert_close(torch.compile(v1, backend="tpu")(at, bt, sat, swt).cpu(), got, atol=0, rtol=0)


@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp4", "nvfp4"])
def test_block_scaled_k_grouped_weight_gradient(recipe):
    from torchao.prototype.moe_training.kernels.mxfp8.quant import torch_to_blocked_2d_K_groups

    m, n, k, groups, block = 48, 32, 256, 4, 16 if recipe == "nvfp4" else 32
    offs = offsets(64, 64, 192, 256)  # tokens by expert (values, not float4 bytes), an empty group
    a, bt = block_data(recipe, m, k, seed=10), block_data(recipe, n, k, seed=11)
    sa, sbt = (block_scales(rows, k // block, recipe=recipe, seed=12 + rows) for rows in (m, n))
    ga, gb = torch.rand(groups) + 0.5, torch.rand(groups) + 0.5
    ref = torch.zeros(groups, m, n)
    for g, (s, e) in enumerate(zip([0] + offs.tolist()[:-1], offs.tolist())):
        ev = elements(a, sa, block)[:, s:e] @ elements(bt, sbt, block)[:, s:e].t()
        ref[g] = ev * (ga[g] * gb[g] if recipe == "nvfp4" else 1)
    # CUDA's layout: each group's scales swizzled on their own, one group's tiles after another.
    blocked = [torch_to_blocked_2d_K_groups(x, offs // block)[0].to(TPU) for x in (sa, sbt)]
    at, bt_t, offt = a.to(TPU), bt.to(TPU).t(), offs.to(TPU)
    if recipe == "mxfp8":
        got = torch._scaled_grouped_mm(at, bt_t, *blocked, offs=offt, out_dtype=torch.bfloat16)
    elif recipe == "mxfp4":
        got = F.scaled_grouped_mm(at, bt_t, blocked[0], B32, blocked[1], B32, offs=offt)
    else:
        got = F.scaled_grouped_mm(at, bt_t, [blocked[0], ga.to(TPU)], [B16, TW], [blocked[1], gb.to(TPU)], [B16, TW],
                                  offs=offt)
    torch.testing.assert_close(got.cpu().float(), ref.to(torch.bfloat16).float(), atol=1e-2, rtol=1e-2)


def test_block_scaled_errors():
    from torchao.prototype.moe_training.kernels.mxfp8.quant import (
        torch_to_blocked_2d_M_groups, torch_to_blocked_per_group_3d)

    offs = offsets(40, 40, 170, 190)
    a, b = fp8(200, 128).to(TPU), fp8(4, 32, 128).to(TPU).transpose(-2, -1)
    sa = torch_to_blocked_2d_M_groups(block_scales(200, 4, recipe="mxfp8", seed=0), offs)[0].to(TPU)
    sb = torch_to_blocked_per_group_3d(block_scales(4, 32, 4, recipe="mxfp8", seed=1)).to(TPU)
    offs, sgm = offs.to(TPU), torch._scaled_grouped_mm
    none = F.SwizzleType.NO_SWIZZLE
    bad = [
        (lambda: F.scaled_grouped_mm(a, b, sa, B32, sb, B32, swizzle_a=none, swizzle_b=none, offs=offs), ValueError,
         "For CUDA MXFP8 grouped gemm, both scale swizzle types must be SWIZZLE_32_4_4"),
        (lambda: sgm(a, b, sa[:100], sb, offs=offs), RuntimeError,
         "for block-scaled, arg 0 tensor shape (200, 128) must have scale.shape[0] >= 200 but got scale.shape=(100, 4)"),
        (lambda: sgm(a, b, sa, sb[:, :-1], offs=offs), RuntimeError,
         "for block-scaled grouped GEMM, the tensor shape (4, 128, 32) must have scale shape (4,4,128) for arg 1, got: 4, 511"),
        (lambda: sgm(a, b, sa.flatten(), sb, offs=offs), RuntimeError,
         "for block-scaled, scale must have same number of dimensions as parent tensor, but got mat.dim() = 2 and scale.dim() = 1 for arg 0"),
        (lambda: F.scaled_grouped_mm(a, b, sa, B16, sb, B16, offs=offs), ValueError, "No gemm implementation was found"),
    ]
    for call, cls, message in bad:
        with pytest.raises(cls, match=re.escape(message)):
            call()
