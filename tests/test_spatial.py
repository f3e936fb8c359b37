"""Spatial ops against PyTorch on CPU: pooling (max, average, adaptive, lp, unpooling),
interpolation (nearest, nearest-exact, linear, bilinear, bicubic, trilinear, area, antialiased, lanczos),
reflection/replication/circular padding, unfold/fold (im2col/col2im) and grid_sample, with
gradients, non-contiguous (channels-last, transposed) inputs, 16-bit floats and bad input."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from helpers import TPU, check, check_error, make

F32_TOL = dict(atol=1e-5, rtol=1e-5)
# Gradients of 16-bit inputs: PyTorch accumulates some of them in the 16-bit dtype itself,
# torchtpu in float32.
GRAD16_TOL = dict(atol=3e-2, rtol=3e-2)


def run(fn, *inputs, tol=None, grad=True, grad_tol=None, first_only=False):
    """fn on CPU and on tpu: same outputs (values, dtypes, shapes) and input gradients."""
    floating = [isinstance(x, torch.Tensor) and x.is_floating_point() for x in inputs]
    cpu = [x.detach().clone().requires_grad_(grad and f) if isinstance(x, torch.Tensor) else x
           for x, f in zip(inputs, floating)]
    dev = [x.detach().to(TPU).requires_grad_(grad and f) if isinstance(x, torch.Tensor) else x
           for x, f in zip(inputs, floating)]
    yc, yd = fn(*cpu), fn(*dev)
    if not isinstance(yc, (tuple, list)):
        yc, yd = (yc,), (yd,)
    for c, d in zip(yc, yd):
        assert d.device.type == "tpu"
        assert d.dtype == c.dtype and d.shape == c.shape
        torch.testing.assert_close(d.detach().cpu(), c.detach(), equal_nan=True, **(tol or {}))
    if grad and any(floating):
        out = yc[0]
        g = make(out.shape, out.dtype, -1, 1)
        yc[0].backward(g)
        yd[0].backward(g.to(TPU))
        for c, d, f in zip(cpu, dev, floating):
            if f:
                assert d.grad is not None, "missing gradient"
                torch.testing.assert_close(d.grad.cpu(), c.grad, equal_nan=True, **(grad_tol or tol or {}))
    return yd


def channels_last(x):
    return x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)


# ---- max pooling --------------------------------------------------------------------------------

MAX2D = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(3, 2), stride=(2, 3), padding=1, dilation=(2, 1), ceil_mode=True),
    dict(kernel_size=3, stride=1, padding=1, ceil_mode=True),
    dict(kernel_size=(2, 4), stride=(3, 1), padding=(1, 2), dilation=2),
]


@pytest.mark.parametrize("kw", MAX2D, ids=str)
def test_max_pool2d(kw):
    x = make((2, 3, 9, 10))
    run(lambda x: F.max_pool2d(x, return_indices=True, **kw), x)
    run(lambda x: F.max_pool2d(x, **kw), x[0])  # no batch dim
    run(lambda x: F.max_pool2d(x, return_indices=True, **kw), channels_last(x))
    run(lambda x: F.max_pool2d(x.transpose(2, 3), return_indices=True, **kw), x)


@pytest.mark.parametrize("kw", [dict(kernel_size=3), dict(kernel_size=2, stride=1, padding=1, dilation=2),
                                dict(kernel_size=4, stride=3, padding=2, ceil_mode=True)], ids=str)
def test_max_pool1d(kw):
    x = make((2, 3, 17))
    run(lambda x: F.max_pool1d(x, return_indices=True, **kw), x)
    run(lambda x: F.max_pool1d(x, **kw), x[1])


@pytest.mark.parametrize("kw", [dict(kernel_size=2), dict(kernel_size=(2, 3, 2), stride=(1, 2, 2), padding=1),
                                dict(kernel_size=3, stride=2, padding=1, dilation=(1, 1, 2), ceil_mode=True)], ids=str)
def test_max_pool3d(kw):
    x = make((2, 3, 6, 7, 8))
    run(lambda x: F.max_pool3d(x, return_indices=True, **kw), x)
    run(lambda x: F.max_pool3d(x, return_indices=True, **kw), x[0])
    run(lambda x: F.max_pool3d(x, **kw), channels_last(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8])
def test_max_pool_dtypes(dtype):
    x = make((2, 3, 8, 9), dtype, low=0 if dtype == torch.uint8 else None)
    run(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), x, grad=False)
    run(lambda x: F.max_pool3d(x, 2, return_indices=True), x, grad=False)
    if dtype.is_floating_point:
        run(lambda x: F.max_pool2d(x, 3, 2, 1), x, grad_tol=GRAD16_TOL)


def test_max_pool_ties_nan_inf():
    # Ties: the first position wins. NaN wins (the last NaN of a window). All -inf: the first.
    x = torch.tensor([[[[1., 1, 2, 2], [2, 1, 2, 0], [0, 0, 0, 0]]]])
    run(lambda x: F.max_pool2d(x, 2, 1, return_indices=True), x)
    x = make((1, 2, 6, 6))
    x[0, 0, 1, 1] = float("nan")
    x[0, 0, 1, 2] = float("nan")
    x[0, 1, :3, :3] = float("-inf")
    run(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), x, grad=False)
    run(lambda x: F.adaptive_max_pool2d(x, 3, return_indices=True), x, grad=False)


def test_empty_batch():
    x = make((0, 3, 5, 6))
    run(lambda x: F.max_pool2d(x, 2, return_indices=True), x)
    run(lambda x: F.avg_pool2d(x, 2), x)
    run(lambda x: F.adaptive_avg_pool2d(x, 3), x)
    run(lambda x: F.adaptive_max_pool2d(x, 3), x)
    run(lambda x: F.max_pool3d(x, 2), make((0, 2, 4, 4, 4)))
    run(lambda x: F.avg_pool3d(x, 2), make((0, 2, 4, 4, 4)))
    run(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), x)
    run(lambda x: F.interpolate(x, scale_factor=2), x)
    run(lambda x: F.pad(x, (1, 1, 1, 1), mode="reflect"), x)
    run(lambda x: F.pad(x, (1, 1, 1, 1), mode="replicate"), x)
    run(lambda x: F.unfold(x, 2), x)
    run(lambda c: F.fold(c, (3, 3), 2), make((0, 12, 4)))
    run(lambda x, g: F.grid_sample(x, g, align_corners=False), x, make((0, 2, 2, 2)))


# ---- average pooling ----------------------------------------------------------------------------

AVG2D = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=(2, 3), stride=1, padding=(1, 0), divisor_override=5),
    dict(kernel_size=(4, 3), stride=(3, 2), padding=(2, 1), ceil_mode=True),
]


@pytest.mark.parametrize("kw", AVG2D, ids=str)
def test_avg_pool2d(kw):
    x = make((2, 3, 9, 10))
    run(lambda x: F.avg_pool2d(x, **kw), x)
    run(lambda x: F.avg_pool2d(x, **kw), x[0])
    run(lambda x: F.avg_pool2d(x, **kw), channels_last(x))
    run(lambda x: F.avg_pool2d(x, **kw), x.bfloat16(), tol=dict(atol=1e-5, rtol=1.6e-2), grad_tol=GRAD16_TOL)
    run(lambda x: F.avg_pool2d(x, **kw), make((2, 3, 9, 10), torch.int64), grad=False)


@pytest.mark.parametrize("kw", [dict(kernel_size=3), dict(kernel_size=4, stride=2, padding=2, ceil_mode=True),
                                dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)], ids=str)
def test_avg_pool1d(kw):
    x = make((2, 3, 13))
    run(lambda x: F.avg_pool1d(x, **kw), x)
    run(lambda x: F.avg_pool1d(x, **kw), x[0])


@pytest.mark.parametrize("kw", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
                                dict(kernel_size=(2, 3, 2), stride=1, padding=(1, 0, 1), count_include_pad=False),
                                dict(kernel_size=2, divisor_override=3)], ids=str)
def test_avg_pool3d(kw):
    x = make((2, 3, 6, 7, 5))
    run(lambda x: F.avg_pool3d(x, **kw), x)
    run(lambda x: F.avg_pool3d(x, **kw), x[1])
    run(lambda x: F.avg_pool3d(x, **kw), channels_last(x))


@pytest.mark.parametrize("p", [1.0, 2.0, 3.5])
def test_lp_pool(p):
    x = make((2, 3, 8, 9), low=0.1)
    run(lambda x: F.lp_pool2d(x, p, 3, 2), x)
    run(lambda x: F.lp_pool1d(x, p, 2), x[0])


# ---- adaptive pooling ---------------------------------------------------------------------------

@pytest.mark.parametrize("size", [(4, 3), (1, 1), (13, 17), (9, 5), (None, 3)], ids=str)
def test_adaptive_pool2d(size):
    x = make((2, 3, 9, 10))
    run(lambda x: F.adaptive_avg_pool2d(x, size), x)
    run(lambda x: F.adaptive_max_pool2d(x, size, return_indices=True), x)
    run(lambda x: F.adaptive_avg_pool2d(x, size), channels_last(x))
    run(lambda x: F.adaptive_max_pool2d(x, size), x[0])
    run(lambda x: F.adaptive_avg_pool2d(x, size), x.bfloat16(), tol=dict(atol=1e-5, rtol=1.6e-2), grad_tol=GRAD16_TOL)


@pytest.mark.parametrize("size", [(2, 4, 3), (5, 7, None), (1, 1, 1), (7, 9, 11)], ids=str)
def test_adaptive_pool3d(size):
    x = make((2, 3, 6, 8, 5))
    run(lambda x: F.adaptive_avg_pool3d(x, size), x)
    run(lambda x: F.adaptive_max_pool3d(x, size, return_indices=True), x)
    run(lambda x: F.adaptive_avg_pool3d(x, size), x[0])
    # 16-bit 3-d averages are summed in the 16-bit dtype, in window order, as on CPU: exact.
    run(lambda x: F.adaptive_avg_pool3d(x, size), x.bfloat16(), tol=dict(atol=0, rtol=0), grad=False)


@pytest.mark.parametrize("size", [4, 1, 11])
def test_adaptive_pool1d(size):
    x = make((2, 3, 7))
    run(lambda x: F.adaptive_avg_pool1d(x, size), x)
    run(lambda x: F.adaptive_max_pool1d(x, size, return_indices=True), x)


# ---- fractional max pooling ---------------------------------------------------------------------

@pytest.mark.parametrize("kernel,out", [(2, (5, 6)), ((3, 2), (4, 9)), (2, (1, 1)), (3, (9, 11))], ids=str)
def test_fractional_max_pool2d(kernel, out):
    # The random samples are given, so that CPU and tpu pool the same windows.
    x = make((2, 3, 11, 13))
    s = torch.rand(2, 3, 2)
    fn = lambda x: F.fractional_max_pool2d(x, kernel, output_size=out, return_indices=True,  # noqa: E731
                                           _random_samples=s.to(x.device, x.dtype))
    run(fn, x)
    run(fn, channels_last(x))
    run(fn, x.bfloat16(), tol=dict(atol=0, rtol=0), grad=False)
    run(lambda x: F.fractional_max_pool2d(x, kernel, output_size=out, _random_samples=s[:1].to(x.device)), x[0])


def test_fractional_max_pool3d():
    x = make((2, 3, 7, 8, 9))
    s = torch.rand(2, 3, 3)
    run(lambda x: F.fractional_max_pool3d(x, (2, 3, 2), output_size=(4, 5, 3), return_indices=True,
                                          _random_samples=s.to(x.device, x.dtype)), x)
    run(lambda x: F.fractional_max_pool3d(x, 2, output_ratio=0.5, _random_samples=s.to(x.device, x.dtype)), x)


# ---- max unpooling ------------------------------------------------------------------------------

def test_max_unpool():
    x = make((2, 3, 8, 9))
    y, i = F.max_pool2d(x, 2, return_indices=True)
    run(lambda y: F.max_unpool2d(y, i.to(y.device), 2, output_size=(8, 9)), y)
    run(lambda y: F.max_unpool2d(y, i[0].to(y.device), 2, output_size=(8, 9)), y[0])
    x = make((2, 3, 4, 6, 5))
    y, i = F.max_pool3d(x, 2, return_indices=True)
    run(lambda y: F.max_unpool3d(y, i.to(y.device), 2, output_size=(4, 6, 5)), y)
    x = make((2, 3, 10))
    y, i = F.max_pool1d(x, 3, 2, return_indices=True)
    run(lambda y: F.max_unpool1d(y, i.to(y.device), 3, 2), y)


# ---- interpolation ------------------------------------------------------------------------------

SIZES_2D = [dict(scale_factor=2), dict(scale_factor=1.7), dict(size=(5, 13)), dict(scale_factor=(0.6, 2.3)),
            dict(size=(9, 10)), dict(scale_factor=1.5, recompute_scale_factor=True)]


@pytest.mark.parametrize("kw", SIZES_2D, ids=str)
@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "bilinear", "bicubic", "area"])
def test_interpolate_2d(mode, kw):
    x = make((2, 3, 9, 10))
    aligns = [None] if mode in ("nearest", "nearest-exact", "area") else [False, True]
    for ac in aligns:
        extra = {} if ac is None else dict(align_corners=ac)
        fn = lambda x: F.interpolate(x, mode=mode, **kw, **extra)  # noqa: E731
        run(fn, x, tol=F32_TOL, grad_tol=dict(atol=1e-4, rtol=1e-4))
        run(fn, channels_last(x), tol=F32_TOL, grad_tol=dict(atol=1e-4, rtol=1e-4))
        run(fn, x.bfloat16(), tol=dict(atol=1e-5, rtol=1.6e-2), grad_tol=GRAD16_TOL)


@pytest.mark.parametrize("kw", [dict(scale_factor=0.4), dict(size=(4, 23)), dict(scale_factor=1.3), dict(size=(9, 4))], ids=str)
@pytest.mark.parametrize("mode", ["bilinear", "bicubic", "lanczos"])
@pytest.mark.parametrize("ac", [False, True])
def test_interpolate_antialias(mode, kw, ac):
    x = make((2, 3, 9, 10))
    run(lambda x: antialiased(x, mode, ac, kw), x, tol=F32_TOL, grad_tol=dict(atol=1e-4, rtol=1e-4))


def antialiased(x, mode, ac, kw):
    if mode == "lanczos" and ac:  # F.interpolate refuses it; the op takes it
        size, scale = kw.get("size"), kw.get("scale_factor")
        return torch.ops.aten._upsample_lanczos2d_aa.vec(x, size, True, None if scale is None else [scale] * 2)
    return F.interpolate(x, mode=mode, antialias=True, align_corners=ac, **kw)


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "linear", "area"])
@pytest.mark.parametrize("kw", [dict(scale_factor=2.5), dict(size=4), dict(size=11)], ids=str)
def test_interpolate_1d(mode, kw):
    x = make((2, 3, 11))
    run(lambda x: F.interpolate(x, mode=mode, **kw), x)
    run(lambda x: F.interpolate(x, mode=mode, **kw), x.bfloat16(), tol=dict(atol=0, rtol=0), grad_tol=GRAD16_TOL)


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "trilinear", "area"])
@pytest.mark.parametrize("kw", [dict(scale_factor=1.5), dict(size=(3, 7, 2))], ids=str)
def test_interpolate_3d(mode, kw):
    x = make((2, 3, 4, 5, 6))
    extra = dict(align_corners=True) if mode == "trilinear" else {}
    run(lambda x: F.interpolate(x, mode=mode, **kw), x, tol=F32_TOL, grad_tol=dict(atol=1e-4, rtol=1e-4))
    run(lambda x: F.interpolate(x, mode=mode, **kw, **extra), x, tol=F32_TOL, grad_tol=dict(atol=1e-4, rtol=1e-4))
    run(lambda x: F.interpolate(x, mode=mode, **kw), x.bfloat16(), tol=dict(atol=1e-5, rtol=1.6e-2), grad_tol=GRAD16_TOL)


def test_interpolate_16bit_rounding():
    # The weights are rounded the way each CPU kernel stores them: bf16 results match exactly at
    # full optimization, here at once (TORCHTPU_TIER_UP_ELEMENTS=0). A large program's first runs
    # take the quick tier, whose code forms no fused multiply-adds: a value next to zero may round
    # one unit apart there (docs/eager.md, compile tiers).
    code = f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import test_spatial; test_spatial.interpolate_16bit()"
    env = {**os.environ, "TORCHTPU_TIER_UP_ELEMENTS": "0"}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]


def interpolate_16bit():
    torch.manual_seed(1)
    for shape, size, mode in [((2, 3, 40, 50), (70, 90), "bilinear"), ((1, 2, 9, 7), (12, 20), "bilinear"),
                              ((2, 3, 9, 10), (5, 13), "bicubic"), ((2, 3, 11), (29,), "linear"),
                              ((1, 2, 4, 3, 5), (5, 4, 6), "trilinear")]:
        x = make(shape, torch.bfloat16)
        for ac in (False, True):
            run(lambda x: F.interpolate(x, size=size, mode=mode, align_corners=ac), x,
                tol=dict(atol=0, rtol=0), grad=False)


def test_interpolate_uint8_nearest():
    x = make((2, 3, 7, 9), torch.uint8, low=0, high=255)
    run(lambda x: F.interpolate(x, scale_factor=1.7), x, grad=False)
    run(lambda x: F.interpolate(x, size=(4, 13), mode="nearest-exact"), x, grad=False)


@pytest.mark.parametrize("mode,antialias", [("bilinear", False), ("bicubic", False), ("bilinear", True), ("bicubic", True),
                                            ("lanczos", True)])
@pytest.mark.parametrize("shape", [(2, 3, 9, 10), (1, 5, 13, 7)], ids=str)
def test_interpolate_uint8(mode, antialias, shape):
    # uint8 images: int16 fixed-point weights, one saturating pass per dim, bit-exact.
    x = make(shape, torch.uint8, low=0, high=256)
    for ac in (False, True):
        for kw in (dict(scale_factor=1.7), dict(size=(5, 13)), dict(scale_factor=0.45)):
            fn = (lambda x: antialiased(x, mode, ac, kw)) if antialias else \
                (lambda x: F.interpolate(x, mode=mode, align_corners=ac, **kw))
            run(fn, x, grad=False, tol=dict(atol=0, rtol=0))


def test_upsample_modules():
    x = make((2, 3, 5, 6))
    run(torch.nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False), x)
    run(torch.nn.UpsamplingNearest2d(scale_factor=3), x)
    run(torch.nn.UpsamplingBilinear2d(size=(7, 11)), x)


# ---- padding ------------------------------------------------------------------------------------

PADS = [
    ((2, 3, 11), (2, 3)),
    ((3, 11), (2, 1)),
    ((2, 3, 5, 6), (2, 3, 1, 4)),
    ((2, 3, 5, 6), (-1, 3, 1, -2)),
    ((3, 5, 6), (1, 1, 1, 1)),
    ((2, 2, 4, 5, 6), (1, 2, 0, 1, 3, 1)),
    ((2, 4, 5, 6), (1, 0, 2, 1, 1, 1)),
]


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("shape,pad", PADS, ids=str)
def test_pad(mode, shape, pad):
    x = make(shape)
    run(lambda x: F.pad(x, pad, mode=mode), x)
    run(lambda x: F.pad(x, pad, mode=mode), x.bfloat16(), grad_tol=GRAD16_TOL)
    run(lambda x: F.pad(x, pad, mode=mode), make(shape, torch.int64), grad=False)
    if x.dim() >= 4:
        run(lambda x: F.pad(x.transpose(-1, -2), pad, mode=mode), x)


def test_pad_modules():
    x = make((2, 3, 5, 6))
    run(torch.nn.ReflectionPad2d((1, 2, 3, 4)), x)
    run(torch.nn.ReplicationPad2d(2), channels_last(x))
    run(torch.nn.CircularPad2d(1), x)
    run(torch.nn.ZeroPad2d((1, 0, 2, 3)), x)


# ---- unfold / fold ------------------------------------------------------------------------------

UNFOLDS = [dict(kernel_size=2), dict(kernel_size=(2, 3), dilation=(1, 2), padding=1, stride=(2, 1)),
           dict(kernel_size=3, padding=2, stride=3), dict(kernel_size=(1, 4), stride=(1, 2))]


@pytest.mark.parametrize("kw", UNFOLDS, ids=str)
def test_unfold_fold(kw):
    x = make((2, 3, 5, 6))
    run(lambda x: F.unfold(x, **kw), x)
    run(lambda x: F.unfold(x, **kw), x[0])
    run(lambda x: F.unfold(x, **kw), channels_last(x))
    run(lambda x: F.unfold(x, **kw), x > 0, grad=False)
    run(lambda x: F.unfold(x, **kw), x.bfloat16(), grad_tol=GRAD16_TOL)
    cols = F.unfold(x, **kw)
    run(lambda c: F.fold(c, (5, 6), **kw), cols)
    run(lambda c: F.fold(c, (5, 6), **kw), cols[0])
    run(lambda c: F.fold(c, (5, 6), **kw), cols > 0, grad=False)
    run(lambda c: F.fold(c, (5, 6), **kw), cols.transpose(1, 2).contiguous().transpose(1, 2))


def test_unfold_module_conv_equivalence():
    # The classic im2col convolution: unfold, matmul, fold back.
    x = make((2, 3, 6, 7))
    w = make((4, 3, 3, 3))
    run(lambda x, w: (w.view(4, -1) @ F.unfold(x, 3, padding=1)).view(2, 4, 6, 7), x, w,
        tol=dict(atol=1e-4, rtol=1e-4))


# ---- grid sampling ------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample(mode, padding_mode, align_corners):
    x = make((2, 3, 5, 6))
    grid = make((2, 4, 7, 2), low=-1.2, high=1.2)
    fn = lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding_mode, align_corners=align_corners)  # noqa: E731
    run(fn, x, grid, tol=dict(atol=1e-4, rtol=1e-4))
    run(fn, channels_last(x), grid, tol=dict(atol=1e-4, rtol=1e-4))
    # bfloat16: computed in bfloat16 like the CPU kernel, so forward values match exactly.
    run(fn, x.bfloat16(), grid.bfloat16(), tol=dict(atol=0, rtol=0), grad=False)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_grid_sample_3d(mode, padding_mode):
    x = make((2, 3, 4, 5, 6))
    grid = make((2, 3, 4, 2, 3), low=-1.2, high=1.2)
    for align_corners in (False, True):
        fn = lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding_mode, align_corners=align_corners)  # noqa: E731
        run(fn, x, grid, tol=dict(atol=1e-4, rtol=1e-4))
        run(fn, x.bfloat16(), grid.bfloat16(), tol=dict(atol=0, rtol=0), grad=False)


def test_affine_grid_sample():
    x = make((2, 3, 8, 8))
    theta = torch.tensor([[[0.9, -0.2, 0.1], [0.3, 1.1, -0.2]], [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    run(lambda x, t: F.grid_sample(x, F.affine_grid(t, (2, 3, 6, 5), align_corners=False), align_corners=False),
        x, theta, tol=dict(atol=1e-4, rtol=1e-4))


# ---- modules, training step, compile ------------------------------------------------------------

def test_small_unet_training_step():
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = torch.nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect")
            self.c2 = torch.nn.Conv2d(4, 4, 3, padding=1)
            self.head = torch.nn.Conv2d(8, 2, 1)

        def forward(self, x):
            a = F.relu(self.c1(x))
            b = F.max_pool2d(a, 2)
            b = F.relu(self.c2(b))
            b = F.interpolate(b, scale_factor=2, mode="bilinear", align_corners=False)
            y = self.head(torch.cat([a, b], 1))
            return F.adaptive_avg_pool2d(y, 1).flatten(1)

    net = Net()
    dev = Net()
    dev.load_state_dict(net.state_dict())
    dev.to(TPU)
    x = make((2, 3, 8, 8))
    loss_c = net(x).square().sum()
    loss_d = dev(x.to(TPU)).square().sum()
    loss_c.backward()
    loss_d.backward()
    torch.testing.assert_close(loss_d.detach().cpu(), loss_c.detach(), atol=1e-4, rtol=1e-4)
    for (n, p), q in zip(net.named_parameters(), dev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, atol=1e-4, rtol=1e-4, msg=n)


def test_compiled_graph():
    def f(x):
        y = F.max_pool2d(x, 2)
        y = F.interpolate(y, scale_factor=2, mode="nearest")
        y = F.pad(y, (1, 1, 1, 1), mode="reflect")
        return F.avg_pool2d(y, 3, 1) + F.adaptive_avg_pool2d(x, (8, 8))

    x = make((2, 3, 8, 8))
    compiled = torch.compile(f, backend="tpu")
    torch.testing.assert_close(compiled(x.to(TPU)).cpu(), f(x), atol=1e-5, rtol=1e-5)


# ---- bad input ----------------------------------------------------------------------------------

def test_errors():
    x = make((2, 3, 6, 6))
    check_error(lambda x: F.max_pool2d(x, 2, padding=2), x)
    check_error(lambda x: F.max_pool2d(x, 8), x)
    check_error(lambda x: F.max_pool2d(x, 2), make((6, 6)))
    check_error(lambda x: F.max_pool2d(x, 2), x > 0)
    check_error(lambda x: F.max_pool3d(x, 2), x[0, 0])
    check_error(lambda x: F.avg_pool2d(x, 2, divisor_override=0), x)
    check_error(lambda x: F.avg_pool2d(x, 2), make((2, 3, 6, 6), torch.int32))
    check_error(lambda x: F.avg_pool3d(x, 2), make((1, 2, 4, 4, 4), torch.bfloat16))
    check_error(lambda x: F.adaptive_avg_pool2d(x, 3), make((2, 3, 6, 6), torch.int64))
    check_error(lambda x: F.adaptive_max_pool2d(x, 3), make((2, 0, 6, 6)))
    check_error(lambda x: F.interpolate(x, scale_factor=2), make((2, 3, 6, 6), torch.int64))
    check_error(lambda x: F.interpolate(x, size=(0, 3), mode="bilinear"), x)
    check_error(lambda x: F.interpolate(x, size=(3, 3), mode="bilinear", antialias=True), x.bfloat16())
    check_error(lambda x: F.interpolate(x, size=5, mode="linear"), make((1, 2, 6), torch.uint8, 0))
    check_error(lambda x: F.pad(x, (6, 1), mode="reflect"), make((2, 3, 6)))
    check_error(lambda x: F.pad(x, (1, 1), mode="replicate"), make((2, 3, 6), torch.bool))
    check_error(lambda x: F.unfold(x, 7), x)
    check_error(lambda x: F.unfold(x, 2), make((2, 3, 6, 6), torch.int64))
    check_error(lambda c: F.fold(c, (5, 6), 2), make((2, 12, 7)))
    check_error(lambda c: F.fold(c, (5, 6), 2), make((2, 10, 20)))
    check_error(lambda x, g: F.grid_sample(x, g, align_corners=False), x, make((2, 4, 4, 2), torch.float64))
    check_error(lambda x, g: F.grid_sample(x, g, align_corners=False), x, make((3, 4, 4, 2)))
    check_error(lambda x, g: F.grid_sample(x, g, mode="bicubic", align_corners=False), make((1, 2, 3, 3, 3)), make((1, 2, 2, 2, 3)))
    y, i = F.max_pool2d(x, 2, return_indices=True)
    check_error(lambda y, i: F.max_unpool2d(y, i, 2), y, i.int())
    check_error(lambda x, s: F.fractional_max_pool2d(x, 4, output_size=5, _random_samples=s), x, torch.rand(2, 3, 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_adaptive_avg_pool_out_forms(dtype):
    A = torch.ops.aten
    x2, x3 = make((2, 3, 7, 6), dtype), make((2, 3, 5, 7, 6), dtype)
    for v in (x2, x2.transpose(2, 3), x2[0]):
        check(lambda a: A.adaptive_avg_pool2d.out(a, [3, 2], out=torch.empty(0, dtype=dtype, device=a.device)), v)
    for v in (x3, x3.transpose(2, 4), x3[0]):
        check(lambda a: A.adaptive_avg_pool3d.out(a, [2, 3, 4], out=torch.empty(0, dtype=dtype, device=a.device)), v)
    g = make((2, 3, 2, 3, 4), dtype)
    check(lambda gg, a: A.adaptive_avg_pool3d_backward.grad_input(gg, a, grad_input=torch.empty(0, dtype=dtype, device=a.device)), g, x3)
    check_error(lambda a: A.adaptive_avg_pool2d.out(a, [2, 2], out=torch.empty(0, dtype=dtype, device=a.device)), make((2, 3), dtype))
    for bad in (make((2, 3), dtype), make((), dtype)):
        check_error(lambda gg, a: A.adaptive_avg_pool3d_backward.grad_input(gg, a, grad_input=torch.empty(0, dtype=dtype, device=a.device)), bad, bad)
        check_error(A._adaptive_avg_pool3d_backward, bad, bad)
