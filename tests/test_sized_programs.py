"""Sized programs (crates/engine/src/sized.rs): an op meeting new shapes of a family it has
compiled for twice runs one program per bucket of sizes. Each case runs in a subprocess with
them turned on and a fresh persistent cache, checks every result against PyTorch on CPU, and
reports the compile counts."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

PRELUDE = """
import json, torch, torchtpu
torch.manual_seed(0)
stats = torch.tpu.compile_stats
bad = []
def same(got, want, what):
    got = got.cpu()
    ok = got.shape == want.shape and got.dtype == want.dtype and (
        torch.equal(got, want) or (want.is_floating_point() and torch.allclose(got, want, atol=1e-6, rtol=1e-5, equal_nan=True)))
    if not ok:
        bad.append(what)
"""


def run(code, tmp_path, on=True):
    env = dict(os.environ, TORCHTPU_SIZED_PROGRAMS="1" if on else "0", TORCHTPU_CACHE_DIR=str(tmp_path))
    p = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_growing_slice_compiles_once_per_bucket(tmp_path):
    got = run("""
        base = torch.randn(50, 7)
        d = base.to("tpu")
        m0, s0 = stats()["misses"], stats()["sized_shapes"]
        for n in range(1, 41):
            same(d[:n] + 1, base[:n] + 1, f"add {n}")
        s = stats()
        print(json.dumps({"bad": bad, "misses": s["misses"] - m0, "sized_shapes": s["sized_shapes"] - s0}))
    """, tmp_path)
    assert got["bad"] == []
    # n = 1 and 2 exactly, then one program per bucket of rows (4, 8, 16, 32, 64) and of
    # result elements (a buffer holds less than twice its tensor).
    def bucket(n):
        return 1 << (n - 1).bit_length()
    assert got["misses"] == 2 + len({(bucket(n), bucket(7 * n)) for n in range(3, 41)}) == 10
    assert got["sized_shapes"] == 38


def test_pointwise_values_match_cpu_across_sizes_views_and_dtypes(tmp_path):
    got = run("""
        base = torch.randn(50, 7)
        d = base.to("tpu")
        for n in range(1, 41):
            same((d[:n] * d[:n]).relu(), (base[:n] * base[:n]).relu(), f"mul relu {n}")
            same(d[:n].t() * 2, base[:n].t() * 2, f"transposed {n}")
            same(d[:n, 1:5] - d[n:n + 1, 1:5], base[:n, 1:5] - base[n:n + 1, 1:5], f"broadcast {n}")
            same(d[1:n + 1:2, ::3].exp(), base[1:n + 1:2, ::3].exp(), f"strided {n}")
            same(torch.nn.functional.gelu(d[:n]), torch.nn.functional.gelu(base[:n]), f"gelu {n}")
            same(d[:n].to(torch.float16), base[:n].to(torch.float16), f"cast {n}")
            same(torch.where(d[:n] > 0, d[:n], 0.5), torch.where(base[:n] > 0, base[:n], 0.5), f"where {n}")
            same(d[:n] * torch.tensor(3.0), base[:n] * torch.tensor(3.0), f"cpu 0-d {n}")
            same(d[:n] / d[n, 0], base[:n] / base[n, 0], f"device 0-d {n}")
            same(d[:n].log(), base[:n].log(), f"nan {n}")
        for dt in [torch.int32, torch.int64, torch.bfloat16, torch.float64, torch.bool]:
            for n in range(1, 20):
                c = (torch.randn(n, 3) * 10).to(dt)
                t = c.to("tpu")
                if dt == torch.bool:
                    same(t ^ t[:1], c ^ c[:1], f"{dt} {n}")
                else:
                    same(t * 3 + t[:1], c * 3 + c[:1], f"{dt} {n}")
                    same(t.abs(), c.abs(), f"abs {dt} {n}")
        print(json.dumps({"bad": bad, "sized": stats()["sized_shapes"]}))
    """, tmp_path)
    assert got["bad"] == []
    assert got["sized"] > 100


def test_in_place_writes_touch_only_the_view(tmp_path):
    got = run("""
        c = torch.randn(100, 5)
        d = c.to("tpu")
        for n in range(1, 41):
            v = torch.randn(n, 5)
            c[n:2 * n].copy_(v); d[n:2 * n].copy_(v.to("tpu"))
            c[:n].add_(1.5); d[:n].add_(1.5)
            c[:, :n % 5 + 1].mul_(0.5); d[:, :n % 5 + 1].mul_(0.5)
            c[:n, 2].fill_(7); d[:n, 2].fill_(7)
            c[::3][:n % 30 + 1].masked_fill_(c[::3][:n % 30 + 1] > 1, -1.0)
            d[::3][:n % 30 + 1].masked_fill_(d[::3][:n % 30 + 1] > 1, -1.0)
            same(d, c, f"in place {n}")
        print(json.dumps({"bad": bad, "sized": stats()["sized_shapes"]}))
    """, tmp_path)
    assert got["bad"] == []
    assert got["sized"] > 100


def test_errors_stay_pytorchs(tmp_path):
    got = run("""
        d = torch.randn(50, 7, device="tpu")
        errors = []
        for n in range(3, 20):
            (d[:n] + d[:n]).sum()  # the family goes sized
            try:
                d[:n] + d[:n + 1]
            except RuntimeError as e:
                errors.append(str(e))
            try:
                d[:n, :1].add_(d[:n])
            except RuntimeError as e:
                errors.append(str(e))
        print(json.dumps({"errors": errors, "sized": stats()["sized_shapes"]}))
    """, tmp_path)
    assert len(got["errors"]) == 34
    assert all("must match the size of tensor b" in e or "doesn't match the broadcast shape" in e for e in got["errors"]), got["errors"][:4]
    assert got["sized"] > 10


def test_a_shape_served_often_gets_its_exact_program(tmp_path):
    got = run("""
        base = torch.randn(50, 7)
        d = base.to("tpu")
        for n in (1, 2, 3):
            d[:n] + 1
        m0 = stats()["misses"]
        for _ in range(1100):
            r = d[:3] + 1
        same(r, base[:3] + 1, "promoted")
        s = stats()
        print(json.dumps({"bad": bad, "promoted": s["sized_promoted"], "misses": s["misses"] - m0}))
    """, tmp_path)
    assert got["bad"] == []
    assert got["promoted"] == 1 and got["misses"] == 1


def test_off_compiles_every_shape(tmp_path):
    got = run("""
        d = torch.randn(50, 7, device="tpu")
        m0 = stats()["misses"]
        for n in range(1, 11):
            d[:n] + 1
        s = stats()
        print(json.dumps({"misses": s["misses"] - m0, "sized": s["sized_shapes"]}))
    """, tmp_path, on=False)
    assert got == {"misses": 10, "sized": 0}
