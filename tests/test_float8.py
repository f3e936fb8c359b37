"""float8 on tpu against PyTorch on CPU: the five float8 dtypes through casts (special values,
rounding ties, views, 0-d and empty tensors) and the ops CPU runs on them, bit for bit; and
torch._scaled_mm (tensor-wise and row-wise scales, bias, out_dtype, scale_result, layouts,
mixed formats, compiled) with PyTorch's errors."""
import pytest
import torch

from helpers import TPU, check_error

FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
          torch.float8_e8m0fnu]

# Values that exercise each format's edges: zeros, ties, subnormals, the largest finite values
# and just past them, inf and nan, negatives (E8M0 has no sign).
SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.3, 1.5, 2.9, 3.0, 3.5, 5.0, 6.0, 2.0 ** -7, 2.0 ** -9, 2.0 ** -17, 1e-40, -1e-40, -2.0 ** -10,
           2.0 ** -127, 240.0, 245.0, 250.0, 448.0, 464.0, 480.0, 57344.0, 61440.0, 1e6, -1e6, 1e38, 3e38,
           float("inf"), float("-inf"), float("nan")]


def bits(t):
    """A float8 tensor's bytes (NaN payloads included), else the tensor itself."""
    return t.view(torch.uint8) if t.dtype in FLOAT8 else t


def assert_same(got, ref):
    """Bit for bit, except the payload of a nan (XLA and c10 pick different nan bytes)."""
    got = got.cpu()
    assert got.dtype == ref.dtype and got.shape == ref.shape
    if ref.dtype.is_floating_point:
        nan = ref.isnan()
        assert torch.equal(got.isnan(), nan), f"{got} != {ref}"
        got, ref = got[~nan], ref[~nan]
    assert torch.equal(bits(got), bits(ref)), f"{got} != {ref}"


def near_ties(dtype):
    """The midpoints between neighbouring finite values of a format, and the float32 values
    just beside them: where rounding twice (through float16) goes wrong."""
    if dtype == torch.float8_e8m0fnu:
        return torch.tensor([], dtype=torch.float64)
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).float()
    values = values[values.isfinite()].unique()
    mids = (values[1:] + values[:-1]) / 2
    up, down = torch.full_like(mids, 1e9), torch.full_like(mids, -1e9)
    return torch.cat([mids, torch.nextafter(mids, up), torch.nextafter(mids, down)]).double()


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
@pytest.mark.parametrize("source", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_casts_round_like_cpu(dtype, source):
    x = torch.cat([torch.tensor(SPECIAL, dtype=torch.float64), near_ties(dtype), torch.randn(500, dtype=torch.float64) * 50])
    x = x.to(source)
    ref = x.to(dtype)
    got = x.to(TPU).to(dtype)
    assert_same(got, ref)
    # And back: every float8 byte widens exactly.
    assert_same(got.to(source), ref.to(source))


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_every_byte_widens_like_cpu(dtype):
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype)
    for target in (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.bool):
        ref = every.to(target)
        got = every.to(TPU).to(target)
        if target.is_floating_point:
            torch.testing.assert_close(got.cpu(), ref, equal_nan=True, rtol=0, atol=0)
        else:
            # nan, inf and values past int32 are undefined in C++ (and differ on XLA).
            fits = every.double().abs() < 2 ** 31
            assert torch.equal(got.cpu()[fits], ref[fits])


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_between_float8_formats(dtype):
    x = (torch.randn(64) * 20).to(torch.float8_e4m3fn)
    assert_same(x.to(TPU).to(dtype), x.to(dtype))


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (0, 3), (5, 7)], ids=str)
def test_zero_d_empty_and_views(dtype, shape):
    x = (torch.rand(shape) * 8 + 0.01).to(dtype)
    assert_same(x.to(TPU), x)
    assert_same(x.to(TPU).float(), x.float())
    if len(shape) == 2:
        for view in (lambda t: t.t(), lambda t: t[::2, 1:], lambda t: t[:, :1].expand(-1, 3)):
            assert_same(view(x.to(TPU)).contiguous(), view(x).contiguous())
            assert_same(view(x.to(TPU)).float(), view(x).float())


# The ops PyTorch's CPU kernels accept float8 in (others raise there; tpu computes them in float32
# and rounds, as it does for bfloat16).
CPU_OPS = {
    "mul": lambda x: x * x,
    "abs": lambda x: x.abs(),
    "eq": lambda x: x == x.flip(0),
    "ne": lambda x: x != 0,
    "isnan": lambda x: x.isnan(),
    "where": lambda x: torch.where(x.float() > 1, x, x.flip(0)),
    "clone": lambda x: x.clone(),
    "copy_": lambda x: torch.empty_like(x).copy_(x),
    "cat": lambda x: torch.cat([x, x.flip(0)]),
    "stack": lambda x: torch.stack([x, x]),
    "flip": lambda x: x.flip(1),
    "roll": lambda x: x.roll(1, 0),
    "repeat": lambda x: x.repeat(2, 1),
    "index_select": lambda x: x.index_select(0, torch.tensor([2, 0], device=x.device)),
    "index": lambda x: x[torch.tensor([1, 1, 0], device=x.device)],
    "index_put": lambda x: x.clone().index_put_((torch.tensor([0], device=x.device),), x[1]),
    "fill": lambda x: x.clone().fill_(2.0),
    "zero": lambda x: x.clone().zero_(),
    "zeros_like": lambda x: torch.zeros_like(x),
    "ones_like": lambda x: torch.ones_like(x),
    "full": lambda x: torch.full((2, 3), 0.5, dtype=x.dtype, device=x.device),
    "mm": lambda x: x @ x.t(),
    "pad": lambda x: torch.nn.functional.pad(x, (1, 1)),
    "to_bf16": lambda x: x.to(torch.bfloat16),
}


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
@pytest.mark.parametrize("name", sorted(CPU_OPS))
def test_ops_cpu_runs(dtype, name):
    f = CPU_OPS[name]
    x = (torch.rand(4, 6) * 6 + 0.05).to(dtype)
    try:
        ref = f(x)
    except (NotImplementedError, RuntimeError):
        pytest.skip(f"CPU has no {name} for {dtype}")
    assert_same(f(x.to(TPU)), ref)
    # The same through a non-contiguous view.
    xt = x.t()
    try:
        ref = f(xt)
    except (NotImplementedError, RuntimeError):
        return
    assert_same(f(x.to(TPU).t()), ref)


# ---- torch._scaled_mm -------------------------------------------------------------------------

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def operands(m, k, n, a_dtype=E4M3, b_dtype=E4M3, b_col_major=True):
    a = (torch.randn(m, k) * 4).to(a_dtype)
    b = (torch.randn(n, k) * 4).to(b_dtype).t() if b_col_major else (torch.randn(k, n) * 4).to(b_dtype)
    return a, b


def emulated(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, **_):
    """What PyTorch's CPU kernel computes (torch 2.14): scaled operands multiplied in float32."""
    out = (a.float() * scale_a) @ (b.float() * scale_b)
    if bias is not None:
        out = out + bias.float()
    if scale_result is not None and out_dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        out = out * (1 / scale_result)
    return out.to(out_dtype or a.dtype)


# On hosts with AMX, PyTorch's CPU _scaled_mm hands calls to oneDNN, which differs from its
# portable kernel (other messages, checks and dtypes, an uninitialized output when k is 0). The
# references here are the portable kernel's, the same on every host.
# The flags() context, not an assignment: importing torch.testing._internal.common_utils (the
# conformance tests do) freezes the global flags, and assigning one then raises.
@pytest.fixture(autouse=True)
def _portable_cpu_kernels():
    with torch.backends.mkldnn.flags(enabled=False):
        yield


def _cpu_has_rowwise():
    a = torch.ones(2, 2).to(E4M3)
    with torch.backends.mkldnn.flags(enabled=False):
        try:
            torch._scaled_mm(a, a.t(), torch.ones(2, 1), torch.ones(1, 2), out_dtype=torch.float32)
            return True
        except RuntimeError:
            return False


# torch 2.11's CPU _scaled_mm is tensor-wise only, with older messages (its CUDA kernel has
# row-wise scales): tpu follows the newer CPU kernel, and the CUDA one. Where CPU cannot run a
# call, the reference is its arithmetic, emulated here.
CPU_ROWWISE = _cpu_has_rowwise()
NEW_CPU_KERNEL = pytest.mark.skipif(not CPU_ROWWISE, reason="this torch's CPU _scaled_mm predates row-wise scales")


def scaled_mm(*args, **kwargs):
    """_scaled_mm on CPU and on tpu (tensors moved, non-contiguous layouts kept)."""
    try:
        ref = torch._scaled_mm(*args, **kwargs)
    except RuntimeError:
        if CPU_ROWWISE:
            raise
        ref = emulated(*args, **kwargs)
    move = lambda v: v.to(TPU) if isinstance(v, torch.Tensor) else v  # noqa: E731
    got = torch._scaled_mm(*map(move, args), **{k: move(v) for k, v in kwargs.items()})
    return got.cpu(), ref


def close(got, ref):
    """Equal to float32 rounding; float8 outputs to one step of their format."""
    assert got.dtype == ref.dtype and got.shape == ref.shape
    if ref.dtype in FLOAT8:
        step = 0.125 if ref.dtype == E4M3 else 0.25
        torch.testing.assert_close(got.float(), ref.float(), rtol=step, atol=1e-3, equal_nan=True)
    else:
        tol = dict(rtol=1e-5, atol=1e-4) if ref.dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(got, ref, **tol)


@pytest.mark.parametrize("out_dtype", [None, torch.float32, torch.bfloat16, torch.float16, E5M2], ids=str)
@pytest.mark.parametrize("shape", [(16, 32, 24), (1, 16, 8), (33, 7, 5)], ids=str)
def test_scaled_mm_tensorwise(out_dtype, shape):
    a, b = operands(*shape)
    sa, sb = torch.tensor(0.05), torch.tensor(0.02)
    close(*scaled_mm(a, b, sa, sb, out_dtype=out_dtype))


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_scaled_mm_rowwise(out_dtype):
    a, b = operands(16, 32, 24)
    sa, sb = torch.rand(16, 1) + 0.1, torch.rand(1, 24) + 0.1
    close(*scaled_mm(a, b, sa, sb, out_dtype=out_dtype))


@pytest.mark.parametrize("bias_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_scaled_mm_bias(bias_dtype):
    a, b = operands(8, 16, 12)
    bias = torch.randn(12).to(bias_dtype)
    close(*scaled_mm(a, b, torch.tensor(0.1), torch.tensor(0.3), bias=bias, out_dtype=bias_dtype))


def test_scaled_mm_scale_result_applies_to_float8_out_dtype_only():
    a, b = operands(8, 16, 12)
    s = torch.tensor(0.1)
    close(*scaled_mm(a, b, s, s, scale_result=torch.tensor(4.0), out_dtype=E4M3))
    close(*scaled_mm(a, b, s, s, scale_result=torch.tensor(4.0)))  # not given: ignored, as on CPU
    close(*scaled_mm(a, b, s, s, scale_result=torch.tensor(4.0), out_dtype=torch.float32))


@pytest.mark.parametrize("layout", ["b_row_major", "a_transposed", "both_sliced"])
def test_scaled_mm_layouts(layout):
    if layout == "b_row_major":
        a, b = operands(8, 16, 12, b_col_major=False)
    elif layout == "a_transposed":
        _, b = operands(8, 16, 12)
        a = (torch.randn(16, 8) * 4).to(E4M3).t()  # (8, 16) stored column-major
    else:
        a, b = operands(16, 32, 24)
        a, b = a[::2, 1:17], b[1:17, ::2]
    close(*scaled_mm(a, b, torch.tensor(0.2), torch.tensor(0.5), out_dtype=torch.float32))


@pytest.mark.parametrize("formats", [(E4M3, E5M2), (E5M2, E5M2), (torch.float8_e4m3fnuz, torch.float8_e4m3fnuz)], ids=str)
def test_scaled_mm_formats(formats):
    a, b = operands(8, 16, 12, *formats)
    close(*scaled_mm(a, b, torch.tensor(0.2), torch.tensor(0.5), out_dtype=torch.float32))


@pytest.mark.parametrize("shape", [(0, 16, 8), (8, 0, 8), (8, 16, 0)], ids=str)
def test_scaled_mm_empty(shape):
    a, b = operands(*shape)
    close(*scaled_mm(a, b, torch.tensor(0.2), torch.tensor(0.5), out_dtype=torch.float32))


def test_scaled_mm_out_variant():
    a, b = operands(8, 16, 12)
    s = torch.tensor(0.25)
    ref = torch.empty(8, 12)
    torch._scaled_mm(a, b, s, s, out_dtype=torch.float32, out=ref)
    got = torch.empty(8, 12, device=TPU)
    torch._scaled_mm(a.to(TPU), b.to(TPU), s.to(TPU), s.to(TPU), out_dtype=torch.float32, out=got)
    close(got.cpu(), ref)


def test_scaled_mm_compiled():
    a, b = operands(16, 32, 24)
    sa, sb = torch.rand(16, 1) + 0.1, torch.rand(1, 24) + 0.1

    def f(a, b, sa, sb):
        return torch.relu(torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)) * 2

    ref = f(a, b, sa, sb) if CPU_ROWWISE else torch.relu(emulated(a, b, sa, sb, out_dtype=torch.bfloat16)) * 2
    got = torch.compile(f, backend="tpu")(a.to(TPU), b.to(TPU), sa.to(TPU), sb.to(TPU))
    close(got.cpu(), ref)


BAD_CALLS = {
    "3-d a": lambda a, b, s: torch._scaled_mm(a[None], b, s, s),
    "1-d b": lambda a, b, s: torch._scaled_mm(a, b[0], s, s),
    "float a": lambda a, b, s: torch._scaled_mm(a.float(), b, s, s),
    "half scale": lambda a, b, s: torch._scaled_mm(a, b, s.half(), s),
    "two-element scale": lambda a, b, s: torch._scaled_mm(a, b, torch.ones(2, device=a.device), s),
    "row-wise b scale as a column": lambda a, b, s: torch._scaled_mm(
        a, b, torch.ones(8, 1, device=a.device), torch.ones(12, 1, device=a.device), out_dtype=torch.bfloat16),
    "row-wise mixed with tensor-wise": lambda a, b, s: torch._scaled_mm(
        a, b, torch.ones(8, 1, device=a.device), s, out_dtype=torch.bfloat16),
    "shapes": lambda a, b, s: torch._scaled_mm(a, a, s, s),
    "scale_result half": lambda a, b, s: torch._scaled_mm(a, b, s, s, scale_result=s.half()),
    "scale_result two elements": lambda a, b, s: torch._scaled_mm(
        a, b, s, s, scale_result=torch.ones(2, device=a.device)),
    "bias size": lambda a, b, s: torch._scaled_mm(
        a, b, s, s, bias=torch.ones(5, device=a.device), out_dtype=torch.float32),
    "out dtype": lambda a, b, s: torch._scaled_mm(
        a, b, s, s, out_dtype=torch.bfloat16, out=torch.empty(8, 12, device=a.device)),
    # Row-wise scales must be contiguous, and read with unit stride along dim 1.
    "row-wise b scale strided": lambda a, b, s: torch._scaled_mm(
        a, b, torch.ones(8, 1, device=a.device), torch.ones(1, 24, device=a.device)[:, ::2], out_dtype=torch.float32),
    "row-wise b scale expanded": lambda a, b, s: torch._scaled_mm(
        a, b, torch.ones(8, 1, device=a.device), torch.ones(1, 1, device=a.device).expand(1, 12), out_dtype=torch.float32),
    "row-wise a scale a column view": lambda a, b, s: torch._scaled_mm(
        a, b, torch.ones(8, 2, device=a.device)[:, :1], torch.ones(1, 12, device=a.device), out_dtype=torch.float32),
    "row-wise a scale stride(1) 5": lambda a, b, s: torch._scaled_mm(
        a, b, torch.ones(8, 1, device=a.device).as_strided((8, 1), (1, 5)), torch.ones(1, 12, device=a.device),
        out_dtype=torch.float32),
}


@NEW_CPU_KERNEL
@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_scaled_mm_errors(name):
    a, b = operands(8, 16, 12)
    e = check_error(BAD_CALLS[name], a, b, torch.tensor(1.0))
    try:
        BAD_CALLS[name](a, b, torch.tensor(1.0))
    except Exception as ref:  # noqa: BLE001
        assert str(e) == str(ref)


# ---- F.scaled_mm (torch._scaled_mm_v2) --------------------------------------------------------

F = torch.nn.functional


def f_scaled_mm(a, b, sa, ra, sb, rb, bias=None, output_dtype=torch.bfloat16):
    try:
        ref = F.scaled_mm(a, b, sa, ra, sb, rb, bias=bias, output_dtype=output_dtype)
    except NotImplementedError:  # torch 2.11 has no CPU kernel for it
        ref = emulated(a, b, sa, sb, bias, out_dtype=output_dtype)
    args, kwargs = (a, b, sa, ra, sb, rb), dict(bias=bias, output_dtype=output_dtype)
    move = lambda v: v.to(TPU) if isinstance(v, torch.Tensor) else v  # noqa: E731
    got = F.scaled_mm(*map(move, args), **{k: move(v) for k, v in kwargs.items()})
    return got.cpu(), ref


@pytest.mark.skipif(not hasattr(F, "scaled_mm"), reason="F.scaled_mm is newer than this torch")
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("output_dtype", [torch.bfloat16, torch.float32, None], ids=str)
def test_functional_scaled_mm(recipe, output_dtype):
    a, b = operands(16, 32, 24)
    if recipe == "tensorwise":
        sa, sb, r = torch.tensor(0.2), torch.tensor(0.4), F.ScalingType.TensorWise
    else:
        sa, sb, r = torch.rand(16, 1) + 0.1, torch.rand(1, 24) + 0.1, F.ScalingType.RowWise
    close(*f_scaled_mm(a, b, sa, r, sb, r, output_dtype=output_dtype))
    close(*f_scaled_mm(a, b, sa, r, sb, r, bias=torch.randn(24).to(output_dtype or torch.bfloat16),
                       output_dtype=output_dtype or torch.bfloat16))


@NEW_CPU_KERNEL
@pytest.mark.skipif(not hasattr(F, "scaled_mm"), reason="F.scaled_mm is newer than this torch")
def test_functional_scaled_mm_errors():
    a, b = operands(8, 16, 12)
    one, TW, RW = torch.tensor(1.0), F.ScalingType.TensorWise, F.ScalingType.RowWise
    bad = {
        "3-d": lambda a, b, s: F.scaled_mm(a[None], b, s, TW, s, TW),
        "float a": lambda a, b, s: F.scaled_mm(a.float(), b, s, TW, s, TW),
        "shapes": lambda a, b, s: F.scaled_mm(a, a, s, TW, s, TW),
        "bias dtype": lambda a, b, s: F.scaled_mm(a, b, s, TW, s, TW, bias=torch.ones(12, dtype=torch.int32, device=a.device)),
        "bias size": lambda a, b, s: F.scaled_mm(a, b, s, TW, s, TW, bias=torch.ones(5, device=a.device)),
        "mixed recipes": lambda a, b, s: F.scaled_mm(a, b, s, TW, torch.ones(1, 12, device=a.device), F.ScalingType.RowWise),
        # Row-wise scales are read with unit stride along dim 1 (a column view of scale_a is fine).
        "row-wise b scale strided": lambda a, b, s: F.scaled_mm(
            a, b, torch.ones(8, 1, device=a.device), RW, torch.ones(1, 24, device=a.device)[:, ::2], RW),
        "row-wise b scale expanded": lambda a, b, s: F.scaled_mm(
            a, b, torch.ones(8, 1, device=a.device), RW, torch.ones(1, 1, device=a.device).expand(1, 12), RW),
        "row-wise a scale stride(1) 5": lambda a, b, s: F.scaled_mm(
            a, b, torch.ones(8, 1, device=a.device).as_strided((8, 1), (1, 5)), RW, torch.ones(1, 12, device=a.device), RW),
    }
    for name, fn in bad.items():
        e = check_error(fn, a, b, one)
        try:
            fn(a, b, one)
        except Exception as ref:  # noqa: BLE001
            assert str(e) == str(ref), name
    # A column view of a wider tensor is a good scale_a: it has unit stride along dim 1.
    sa, sb = torch.rand(8, 2) + 0.1, torch.rand(1, 12) + 0.1
    got = F.scaled_mm(a.to(TPU), b.to(TPU), sa.to(TPU)[:, :1], RW, sb.to(TPU), RW, output_dtype=torch.float32)
    close(got.cpu(), F.scaled_mm(a, b, sa[:, :1], RW, sb, RW, output_dtype=torch.float32))


# ---- F.scaled_mm's block-wise recipes: MXFP8 and DeepSeek's 1x128 / 128x128 ------------------
# CUDA's recipes, which PyTorch's CPU kernel does not run: checked against an emulation written
# here (each operand times its scale per element, multiplied in float32).

B32, B128, B128x128 = (getattr(F.ScalingType, n, None) for n in ("BlockWise1x32", "BlockWise1x128", "BlockWise128x128"))
SWIZZLED = getattr(getattr(F, "SwizzleType", None), "SWIZZLE_32_4_4", None)
BLOCK_RECIPES = pytest.mark.skipif(B32 is None, reason="this torch has no block-wise F.scaled_mm")


def swizzled(scales):
    """float8_e8m0fnu scales (rows, cols) in cuBLAS's SWIZZLE_32_4_4 layout, flat: 128x4 tiles
    (the matrix padded with ones), one after another in row-major order, and within a tile
    element (r, c) at (r % 32) * 16 + (r // 32) * 4 + c."""
    rows, cols = scales.shape
    tiles_r, tiles_c = -(-rows // 128), -(-cols // 4)
    padded = torch.full((tiles_r * 128, tiles_c * 4), 127, dtype=torch.uint8)  # 127: 2^0
    padded[:rows, :cols] = scales.view(torch.uint8)
    tiles = padded.view(tiles_r, 4, 32, tiles_c, 4).permute(0, 3, 2, 1, 4)
    return tiles.reshape(-1).view(torch.float8_e8m0fnu)


def spread(scales, rows_per, cols_per, shape):
    """Block scales spread over each block's elements, cut to `shape`, float32."""
    return scales.float().repeat_interleave(rows_per, 0).repeat_interleave(cols_per, 1)[:shape[0], :shape[1]]


def block_scaled(a, b, ea, eb, bias, output_dtype):
    out = (a.float() * ea) @ (b.float() * eb)
    return (out if bias is None else out + bias.float()).to(output_dtype)


def powers_of_two(*shape):
    return (2.0 ** torch.randint(-4, 5, shape)).to(torch.float8_e8m0fnu)


@BLOCK_RECIPES
@pytest.mark.parametrize("shape", [(128, 64, 32), (40, 200, 24), (130, 96, 136)], ids=str)
@pytest.mark.parametrize("output_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_functional_scaled_mm_mxfp8(shape, output_dtype):
    m, k, n = shape
    a, b = operands(m, k, n)
    kb = -(-k // 32)
    sa, sb = powers_of_two(m, kb), powers_of_two(n, kb)
    bias = torch.randn(n).to(output_dtype)
    ref = block_scaled(a, b, spread(sa, 1, 32, (m, k)), spread(sb, 1, 32, (n, k)).t(), bias, output_dtype)
    # The layout cuBLAS reads, flat or as to_blocked's (32 x 16 per tile) rows.
    for scale_a in (swizzled(sa), swizzled(sa).view(-1, 16)):
        got = F.scaled_mm(a.to(TPU), b.to(TPU), scale_a.to(TPU), B32, swizzled(sb).to(TPU), B32,
                          swizzle_a=SWIZZLED, swizzle_b=SWIZZLED, bias=bias.to(TPU), output_dtype=output_dtype)
        close(got.cpu(), ref)


@BLOCK_RECIPES
@pytest.mark.parametrize("recipes", ["1x128,128x128", "128x128,1x128", "1x128,1x128"])
def test_functional_scaled_mm_deepseek_blocks(recipes):
    # CUDA's layouts: a 1x128 scale is (rows, K blocks); a 128x128 one (K blocks rounded up to
    # 4, row blocks), the rows past K's blocks unused.
    m, k, n = 200, 300, 136
    a, b = operands(m, k, n)
    kb = -(-k // 128)
    scales, per_element = [], []
    for recipe, rows in zip(recipes.split(","), (m, n)):
        if recipe == "1x128":
            s = torch.rand(rows, kb) + 0.5
            per_element.append(spread(s, 1, 128, (rows, k)))
        else:
            s = torch.rand(-(-kb // 4) * 4, -(-rows // 128)) + 0.5
            per_element.append(spread(s[:kb].t(), 128, 128, (rows, k)))
        scales.append(s)
    ra, rb = (B128 if r == "1x128" else B128x128 for r in recipes.split(","))
    ref = block_scaled(a, b, per_element[0], per_element[1].t(), None, torch.bfloat16)
    got = F.scaled_mm(a.to(TPU), b.to(TPU), scales[0].to(TPU), ra, scales[1].to(TPU), rb)
    close(got.cpu(), ref)


@BLOCK_RECIPES
def test_functional_scaled_mm_block_errors():
    a, b = operands(128, 64, 32)
    sa, sb = swizzled(powers_of_two(128, 2)), swizzled(powers_of_two(32, 2))
    none = F.SwizzleType.NO_SWIZZLE
    at = lambda *ts: [t.to(TPU) for t in ts]  # noqa: E731
    # Checked as PyTorch checks them: its CPU kernel raises these before refusing to run (torch
    # 2.11 has no CPU kernel for _scaled_mm_v2: there, the messages CUDA gives).
    same_as_cpu = {
        "For Blockwise scaling scale_a should have 512 elements, got: 256":
            lambda a, b, sa, sb: F.scaled_mm(a, b, sa[:256], B32, sb, B32, swizzle_a=SWIZZLED, swizzle_b=SWIZZLED),
        "scale_a must be swizzled to SWIZZLE_32_4_4 format":
            lambda a, b, sa, sb: F.scaled_mm(a, b, sa, B32, sb, B32, swizzle_a=none, swizzle_b=none),
    }
    for message, fn in same_as_cpu.items():
        try:
            fn(a, b, sa, sb)
        except NotImplementedError:
            with pytest.raises(ValueError, match=f"^{message}$"):
                fn(*at(a, b, sa, sb))
            continue
        except Exception as ref:  # noqa: BLE001
            e = check_error(fn, a, b, sa, sb)
            assert str(e) == str(ref) == message
        else:
            raise AssertionError("expected the CPU call to raise")
    # CUDA's messages where the CPU kernel has no such recipe.
    with pytest.raises(ValueError, match=r"^scale_a must have shape 128 x 1 Float elements, got \[128, 2\]$"):
        F.scaled_mm(*at(a, b), torch.ones(128, 2, device=TPU), B128, torch.ones(32, 1, device=TPU), B128)
    with pytest.raises(ValueError, match=r"^scale_b must have shape 4 x 1 Float elements, got \[1, 1\]$"):
        F.scaled_mm(*at(a, b), torch.ones(128, 1, device=TPU), B128, torch.ones(1, 1, device=TPU), B128x128)
