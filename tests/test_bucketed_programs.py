"""Bucketed programs (crates/engine/src/buckets.rs): an op meeting new shapes of a family it has
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


def run(code, tmp_path, on=True, strict=False):
    env = dict(os.environ, TORCHTPU_BUCKET_PROGRAMS="1" if on else "0", TORCHTPU_CACHE_DIR=str(tmp_path))
    if strict:  # strict eager's promotion by calls (fused eager, the default, promotes by graphs)
        env["TORCHTPU_FUSED_EAGER"] = "0"
    p = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_growing_slice_compiles_once_per_bucket(tmp_path):
    got = run("""
        base = torch.randn(50, 7)
        d = base.to("tpu")
        m0, s0 = stats()["misses"], stats()["bucket_shapes"]
        for n in range(1, 41):
            same(d[:n] + 1, base[:n] + 1, f"add {n}")
        s = stats()
        print(json.dumps({"bad": bad, "misses": s["misses"] - m0, "bucket_shapes": s["bucket_shapes"] - s0}))
    """, tmp_path)
    assert got["bad"] == []
    # n = 1 and 2 exactly, then one program per bucket of rows (4, 8, 16, 32, 64) and of
    # result elements (a buffer holds less than twice its tensor).
    def bucket(n):
        return 1 << (n - 1).bit_length()
    assert got["misses"] == 2 + len({(bucket(n), bucket(7 * n)) for n in range(3, 41)}) == 10
    assert got["bucket_shapes"] == 38


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
        print(json.dumps({"bad": bad, "bucketed": stats()["bucket_shapes"]}))
    """, tmp_path)
    assert got["bad"] == []
    assert got["bucketed"] > 100


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
        print(json.dumps({"bad": bad, "bucketed": stats()["bucket_shapes"]}))
    """, tmp_path)
    assert got["bad"] == []
    assert got["bucketed"] > 100


def test_errors_stay_pytorchs(tmp_path):
    got = run("""
        d = torch.randn(50, 7, device="tpu")
        errors = []
        for n in range(3, 20):
            (d[:n] + d[:n]).sum()  # the family goes bucketed
            try:
                d[:n] + d[:n + 1]
            except RuntimeError as e:
                errors.append(str(e))
            try:
                d[:n, :1].add_(d[:n])
            except RuntimeError as e:
                errors.append(str(e))
        print(json.dumps({"errors": errors, "bucketed": stats()["bucket_shapes"]}))
    """, tmp_path)
    assert len(got["errors"]) == 34
    assert all("must match the size of tensor b" in e or "doesn't match the broadcast shape" in e for e in got["errors"]), got["errors"][:4]
    assert got["bucketed"] > 10


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
        print(json.dumps({"bad": bad, "promoted": s["bucket_promoted"], "misses": s["misses"] - m0}))
    """, tmp_path, strict=True)
    assert got["bad"] == []
    assert got["promoted"] == 1 and got["misses"] == 1


def test_fused_eager_promotes_shapes_that_repeat_across_graphs(tmp_path):
    got = run("""
        torch.tpu.set_fused_eager(True)
        base = torch.randn(50, 7)
        d = base.to("tpu")
        for n in (1, 2):  # the add and sub families' exact shapes: later ones are bucketed
            (d[:n] + 1).cpu(), (d[:n] - 1).cpu()
        p0 = stats()["bucket_promoted"]
        promoted = []
        for step in range(16):
            fixed = (d[:3] + 1) * 2       # the same shape in every graph
            growing = d[:step + 17] - 1   # a new shape in each (one bucket: 17 to 32 rows)
            same(fixed, (base[:3] + 1) * 2, f"fixed {step}")
            same(growing, base[:step + 17] - 1, f"growing {step}")
            promoted.append(stats()["bucket_promoted"] - p0)
        print(json.dumps({"bad": bad, "promoted": promoted, "fused_runs": stats()["fused"]["fused_runs"]}))
    """, tmp_path)
    assert got["bad"] == []
    # The fixed shape compiles its own program in its second graph in a row (it takes over in
    # the third); the growing shapes, each in one graph, never do.
    assert got["promoted"][:2] == [0, 1] and got["promoted"][-1] == 1, got["promoted"]
    # Settled from the fourth graph on, the graph's structure is fused.
    assert got["fused_runs"] >= 4, got


def test_a_shape_gets_the_same_bits_from_its_exact_and_its_bucketed_program(tmp_path):
    # Both programs of a shape compile at the tier of its size class (sizes rounded up to their
    # buckets): 40x100 is above the quick tier's 4096 elements as 64x128 whichever program runs
    # it, 7x9 below. (At the full tier XLA may still round exp and log1p one unit apart.)
    code = """
        import sys
        if sys.argv[-1] == "bucketed":
            for n in (3, 5):
                for op in (torch.tanh, torch.erf, torch.nn.functional.gelu, torch.sigmoid):
                    op(torch.randn(n, 100, device="tpu")); op(torch.randn(n, 3, device="tpu"))
        out = {}
        for shape in ((40, 100), (7, 9)):
            x = torch.randn(*shape, generator=torch.Generator().manual_seed(1)) * 3
            for op in (torch.tanh, torch.erf, torch.nn.functional.gelu, torch.sigmoid):
                out[f"{op.__name__} {shape}"] = op(x.to("tpu")).cpu().view(torch.int32).flatten().tolist()
        print(json.dumps({"bits": out, "bucketed": stats()["bucket_shapes"]}))
    """
    bits = {}
    for how in ("exact", "bucketed"):
        env = dict(os.environ, TORCHTPU_BUCKET_PROGRAMS="1", TORCHTPU_CACHE_DIR=str(tmp_path / how))
        p = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code), how], capture_output=True, text=True, env=env, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        bits[how] = json.loads(p.stdout.strip().splitlines()[-1])
    assert bits["exact"]["bucketed"] == 0 and bits["bucketed"]["bucketed"] >= 8
    for what, exact in bits["exact"]["bits"].items():
        assert bits["bucketed"]["bits"][what] == exact, what


def test_off_compiles_every_shape(tmp_path):
    got = run("""
        d = torch.randn(50, 7, device="tpu")
        m0 = stats()["misses"]
        for n in range(1, 11):
            d[:n] + 1
        s = stats()
        print(json.dumps({"misses": s["misses"] - m0, "bucketed": s["bucket_shapes"]}))
    """, tmp_path, on=False)
    assert got == {"misses": 10, "bucketed": 0}


def test_a_growing_kv_cache_stops_compiling(tmp_path):
    # A decoding loop's shape: K/V caches and token ids grow by one per step through cat, the
    # step attends over the whole cache, stop tokens are looked up with isin.
    got = run("""
        import torch.nn.functional as F
        kc, vc = torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16)
        kd, vd = kc.to("tpu"), vc.to("tpu")
        ids_c = torch.randint(0, 50, (1, 5)); ids_d = ids_c.to("tpu")
        stop_c = torch.tensor([3, 7]); stop_d = stop_c.to("tpu")
        misses = []
        for step in range(70):
            m0 = stats()["misses"]
            q, k, v = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 1, 16), torch.randn(1, 2, 1, 16)
            kc = torch.cat([kc, k], dim=2); kd = torch.cat([kd, k.to("tpu")], dim=2)
            vc = torch.cat([vc, v], dim=2); vd = torch.cat([vd, v.to("tpu")], dim=2)
            want = F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
            out = F.scaled_dot_product_attention(q.to("tpu"), kd, vd, enable_gqa=True)
            same(out, want, f"attention {step}")
            t = torch.randint(0, 50, (1, 1))
            ids_c = torch.cat([ids_c, t], dim=1); ids_d = torch.cat([ids_d, t.to("tpu")], dim=1)
            same(ids_d, ids_c, f"ids {step}")
            same(torch.isin(ids_d, stop_d), torch.isin(ids_c, stop_c), f"isin {step}")
            same(torch.cat([kd[:, :1], kd * 2], 1), torch.cat([kc[:, :1], kc * 2], 1), f"cat dim 1 {step}")
            misses.append(stats()["misses"] - m0)
        print(json.dumps({"bad": bad, "misses": misses}))
    """, tmp_path)
    assert got["bad"] == []
    # Past the first steps, programs compile only where a size crosses into a new bucket (the
    # cache's rows at 9, 17, 33 and 65, a buffer's elements), and for the step after, whose
    # inputs are the first buffers of that bucket; 66 to 75 rows share one bucket.
    late = got["misses"][4:]
    assert sum(1 for n in late if n) <= 12 and sum(late) <= 40 and got["misses"][-8:] == [0] * 8, got["misses"]


@pytest.mark.parametrize("strict", [False, True], ids=["fused", "strict"])
def test_a_result_in_another_bucket_than_the_last_gets_its_own_program(tmp_path, strict):
    # cat of [13, k] and [13, 1]: the inputs of k = 7 and k = 8 share their buckets ([16, 8],
    # [16, 1]), their results do not ([16, 8], [16, 16]). A Hugging Face generation's position
    # ids grow this way; one program served both, and the last column came out as zeros.
    got = run("""
        base, col = torch.randint(0, 9, (13, 12)), torch.randint(0, 9, (13, 1))
        d, c = base.to("tpu"), col.to("tpu")
        for k in (5, 6, 7, 8, 3, 12, 7, 8):
            a, b = d[:, :k] * 1, c + 1
            same(torch.cat([a, b], -1), torch.cat([base[:, :k], col + 1], -1), f"cat {k}")
        print(json.dumps({"bad": bad}))
    """, tmp_path, strict=strict)
    assert got["bad"] == []


def test_attention_over_padded_heads_and_keys(tmp_path):
    # Head counts whose buckets lose the query/key-value ratio (12 and 4 pad to 16 and 4), head
    # sizes that pad (20 -> 32), masks, causal attention and an explicit scale.
    got = run("""
        import torch.nn.functional as F
        def close(got, want, what):
            got = got.cpu()
            if got.shape != want.shape or not torch.allclose(got, want, atol=1e-5, rtol=1e-5):
                bad.append(what)
        for hq, hk, e in [(12, 4, 20), (3, 3, 8)]:
            k_all, v_all = torch.randn(2, hk, 40, e), torch.randn(2, hk, 40, e + 3)
            kd_all, vd_all = k_all.to("tpu"), v_all.to("tpu")
            for s in range(1, 40, 3):
                q = torch.randn(2, hq, 1, e)
                k, v, kd, vd = k_all[:, :, :s], v_all[:, :, :s], kd_all[:, :, :s], vd_all[:, :, :s]
                close(F.scaled_dot_product_attention(q.to("tpu"), kd, vd, enable_gqa=True),
                      F.scaled_dot_product_attention(q, k, v, enable_gqa=True), f"{hq} {hk} {e} {s}")
                qs = torch.randn(2, hq, s, e)
                close(F.scaled_dot_product_attention(qs.to("tpu"), kd, vd, is_causal=True, enable_gqa=True),
                      F.scaled_dot_product_attention(qs, k, v, is_causal=True, enable_gqa=True), f"causal {s}")
                mask = torch.rand(2, 1, 1, s) > 0.3
                close(F.scaled_dot_product_attention(q.to("tpu"), kd, vd, attn_mask=mask.to("tpu"), enable_gqa=True, scale=0.3),
                      F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True, scale=0.3), f"mask {s}")
        print(json.dumps({"bad": bad, "bucketed": stats()["bucket_shapes"]}))
    """, tmp_path)
    assert got["bad"] == []
    assert got["bucketed"] > 50


def test_bucketed_attention_does_not_cut_a_fused_graph(tmp_path):
    # SDPA returns the query and key lengths as numbers, which PyTorch reads: from the exact
    # shape's program they are constants, and a bucketed call keeps them, so the read runs
    # nothing. (It once ran the recorded graph at each bucketed call: a decoding step was cut
    # between its layers, and each step's KV shapes, met in two graphs, were promoted.)
    got = run("""
        import torch.nn.functional as F
        torch.tpu.set_fused_eager(True)
        k_all, v_all = torch.randn(1, 2, 40, 8), torch.randn(1, 2, 40, 8)
        kd_all, vd_all = k_all.to("tpu"), v_all.to("tpu")
        q = torch.randn(1, 2, 1, 8)
        qd = q.to("tpu")
        f0, p0 = stats()["fused"], stats()["bucket_promoted"]
        for s in range(10, 30):
            x = qd
            for layer in range(2):  # two layers' attention in one step, then one read
                x = F.scaled_dot_product_attention(x, kd_all[:, :, :s], vd_all[:, :, :s]) * 2
            want = q
            for layer in range(2):
                want = F.scaled_dot_product_attention(want, k_all[:, :, :s], v_all[:, :, :s]) * 2
            same(x, want, f"step {s}")
        f = stats()["fused"]
        print(json.dumps({"bad": bad, "graphs": f["graphs"] - f0["graphs"], "reads": f["cuts"].get("read", 0) - f0["cuts"].get("read", 0),
                          "bucketed": stats()["bucket_shapes"], "promoted": stats()["bucket_promoted"] - p0}))
    """, tmp_path)
    assert got["bad"] == []
    assert got["bucketed"] > 10
    # One graph per step, and no step's shapes promoted (each is met in one graph).
    assert got["graphs"] == got["reads"] == 20, got
    assert got["promoted"] == 0, got


def test_copies_into_new_tensors_hold_a_bucket(tmp_path):
    got = run("""
        src_c = torch.randn(70, 3); src_d = src_c.to("tpu")
        m0 = stats()["misses"]
        for n in range(1, 60):
            dst = torch.empty(n, 3, device="tpu")
            dst.copy_(src_d[:n])
            same(dst, src_c[:n], f"copy {n}")
            same(dst + 1, src_c[:n] + 1, f"then add {n}")
            same(dst.clone(), src_c[:n], f"clone {n}")
        print(json.dumps({"bad": bad, "misses": stats()["misses"] - m0}))
    """, tmp_path)
    assert got["bad"] == []
    assert got["misses"] <= 45


@pytest.mark.parametrize("strict", [False, True])
def test_fills_of_new_storage_hold_its_own_size(tmp_path, strict):
    # Optimizer state (zeros_like: zero_ on new storage) and initializers (normal_ on empty)
    # for more shapes than the families compile exactly: each storage's buffer is its own size,
    # not its bucket's (a bucket would hold up to twice the memory for the tensor's life).
    got = run("""
        sizes, kept = [], []
        for n in range(300, 300 + 7 * 12, 7):
            p = torch.randn(n, 128, device="tpu")
            torch.tpu.synchronize()
            m0 = torch.tpu.memory_allocated()
            z = torch.zeros_like(p, memory_format=torch.preserve_format)
            w = torch.empty(n, 128, device="tpu").normal_()
            torch.tpu.synchronize()
            sizes.append([torch.tpu.memory_allocated() - m0, 2 * p.numel() * 4])
            kept += [p, z, w]  # alive, so that no free shows in the next size's count
            same(z, torch.zeros(n, 128), f"zeros {n}")
            if not (w.cpu().std() - 1).abs() < 0.1:
                bad.append(f"normal {n}")
        print(json.dumps({"bad": bad, "sizes": sizes}))
    """, tmp_path, strict=strict)
    assert got["bad"] == []
    assert all(used == exact for used, exact in got["sizes"]), got["sizes"]


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_a_chain_of_promoted_shapes_settles_together(tmp_path, mode):
    # A promoted shape's own program stores its result as the bucketed program did (flat, at
    # the bucket's capacity), so the next op's key, and its count, stay: the chain's shapes are
    # promoted together and nothing compiles once they have taken over.
    got = run(f"""
        fused = {mode == "fused"}
        torch.tpu.set_fused_eager(fused)
        base = torch.randn(50, 7)
        d = base.to("tpu")
        def chain(x):
            return ((x + 1) * 2).tanh()
        for n in (1, 2):  # each op family's exact shapes: later ones are bucketed
            chain(d[:n]).cpu()
        p0, m0 = stats()["bucket_promoted"], stats()["misses"]
        promoted, misses = [], []
        for step in range(40 if not fused else 16):
            r = chain(d[:3])
            if fused:
                r.cpu()  # one graph per step
            s = stats()
            promoted.append(s["bucket_promoted"] - p0)
            misses.append(s["misses"] - m0)
        same(r, chain(base[:3]), "chain")
        print(json.dumps({{"bad": bad, "promoted": promoted, "misses": misses, "fused_runs": stats()["fused"]["fused_runs"]}}))
    """, tmp_path)
    assert got["bad"] == []
    promoted, misses = got["promoted"], got["misses"]
    # The three shapes start on bucketed programs (three compiles) and are promoted together:
    # strict eager at their tenth call, fused eager in their second graph. Nothing compiles
    # after that: each op's own program reads its input as the bucketed program left it.
    # (Before, each takeover changed the next op's key, which started over on a bucketed
    # program: one op of the chain settled per promotion.)
    first = 9 if mode == "strict" else 1
    assert promoted == [0] * first + [3] * (len(promoted) - first), promoted
    assert misses == [3] * first + [6] * (len(misses) - first), misses
    if mode == "fused":
        # Settled from the third graph, fused from the structure's eighth run on.
        assert got["fused_runs"] == 7, got


def test_a_bucketed_programs_scope_serves_each_size_from_its_first_call(tmp_path):
    # A serving runner's input preparation (vLLM's): host values written into a prefix of a
    # device step buffer, a chain of ops on prefixes cut at each step's count, with bucketed
    # programs off outside the scope. Inside it every count of one bucket shares its programs.
    got = run("""
        buf = torch.zeros(64, dtype=torch.int64, device="tpu")
        out = torch.zeros(64, dtype=torch.int64, device="tpu")
        host = torch.zeros(64, dtype=torch.int64)
        ref = torch.zeros(64, dtype=torch.int64)
        misses = []
        for n in [17, 20, 23, 29, 31, 19]:  # counts in the bucket of 32, tails in that of 64
            m0 = stats()["misses"]
            with torch.tpu.bucketed_programs():
                host[:n] = torch.randint(0, 1000, (n,))
                buf[:n].copy_(host[:n])  # a host write into a part of a device buffer
                out[:n] = buf[:n] * 3 + 1
                out[n:].fill_(-1)
                out[n:n].fill_(5)  # an empty view at a new offset
            ref[:n] = host[:n] * 3 + 1
            ref[n:] = -1
            same(out, ref, f"step of {n}")
            misses.append(stats()["misses"] - m0)
        m0 = stats()["misses"]
        buf[:21].copy_(host[:21])  # outside the scope: this size's own program
        outside = stats()["misses"] - m0
        same(buf[:21], host[:21], "outside")
        print(json.dumps({"bad": bad, "misses": misses, "outside": outside}))
    """, tmp_path, on=False)
    assert got["bad"] == []
    assert got["misses"][0] > 0
    assert got["misses"][1:] == [0] * 5, got["misses"]
    assert got["outside"] == 1


def test_an_empty_view_at_a_new_offset_compiles_nothing(tmp_path):
    got = run("""
        d = torch.zeros(40, device="tpu")
        d[3:3].fill_(1.0)
        m0 = stats()["misses"]
        for i in range(4, 40):
            d[i:i].fill_(1.0)
            d[i:i].add_(d[0:0])
        same(d, torch.zeros(40), "untouched")
        print(json.dumps({"bad": bad, "misses": stats()["misses"] - m0}))
    """, tmp_path, on=False)
    assert got["bad"] == []
    assert got["misses"] <= 1  # add_ of two empty views: its first call


def test_gathers_and_scatters_match_cpu_from_one_program_per_bucket(tmp_path):
    # index (x[i], x[i, j], negative and 2-d index tensors, non-contiguous self), gather and
    # scatter/scatter_add (along dim 0 and 1: the index smaller than self, so the padding lanes
    # of the index must write nothing) on prefixes of fixed buffers, with index lists uploaded
    # from the host in the scope (each upload holds its bucket). A second pass over the same
    # sizes compiles nothing.
    got = run("""
        X = torch.randn(16, 12)
        Xd = X.to("tpu")
        Y = torch.randn(12, 16)
        Yt = Y.to("tpu").t()  # non-contiguous, 16 x 12
        I = torch.zeros(16, dtype=torch.int64, device="tpu")
        passes = []
        for _ in range(2):
            m0 = stats()["misses"]
            with torch.tpu.bucketed_programs():
                for rows in [3, 5, 6, 7, 9, 12, 16]:
                    for r in [1, 2, 3, 5, 7]:
                        idx = torch.randint(-rows, rows, (r,))
                        I[:r].copy_(idx)
                        same(Xd[:rows][I[:r]], X[:rows][idx], f"x[i] {rows} {r}")
                        same(Yt[:rows][I[:r]], Y.t()[:rows][idx], f"yt[i] {rows} {r}")
                        j = torch.randint(0, 12, (r,))
                        same(Xd[:rows][I[:r], j.to("tpu")], X[:rows][idx, j], f"x[i, j] {rows} {r}")
                        i2 = torch.randint(-rows, rows, (r, 2))
                        same(Xd[:rows, 1][i2.to("tpu")], X[:rows, 1][i2], f"x[i2] {rows} {r}")
                        g = torch.randint(0, 12, (rows, 3))
                        same(Xd[:rows].gather(1, g.to("tpu")), X[:rows].gather(1, g), f"gather {rows}")
                        n = min(r, rows)
                        pos = torch.stack([torch.randperm(rows)[:n] for _ in range(3)], 1)
                        src = torch.randn(n, 3)
                        d = torch.zeros(16, 12, device="tpu")
                        d[:rows].scatter_(0, pos.to("tpu"), src.to("tpu"))
                        same(d[:rows], torch.zeros(rows, 12).scatter(0, pos, src), f"scatter_ {rows} {r}")
                        cols = torch.randint(0, 12, (n, 5))
                        d = torch.zeros(16, 12, device="tpu")
                        d[:n].scatter_add_(1, cols.to("tpu"), src[:, :1].expand(n, 5).contiguous().to("tpu"))
                        same(d[:n], torch.zeros(n, 12).scatter_add(1, cols, src[:, :1].expand(n, 5).contiguous()), f"scatter_add_ {n}")
            passes.append(stats()["misses"] - m0)
        print(json.dumps({"bad": bad, "passes": passes, "programs": stats()["bucket_programs"]}))
    """, tmp_path, on=False)
    assert got["bad"] == []
    assert got["passes"][1] == 0, got
    # 35 sizes of each call, served by one program per bucket of their sizes.
    assert got["passes"][0] < 120, got


def test_a_bad_index_in_a_bucketed_program_raises_pytorchs_message(tmp_path):
    # The checks of a bucketed program read the real sizes, and report the call's own message
    # (its size, the failing value): a value past the real size but inside the bucket fails.
    got = run("""
        X = torch.randn(16, 3, device="tpu")
        I = torch.zeros(16, dtype=torch.int64, device="tpu")
        errors = []
        with torch.tpu.bucketed_programs():
            for rows, bad_value in [(5, 5), (6, -7), (7, 7), (5, 100), (3, -4)]:
                I[:4].copy_(torch.tensor([0, 1, bad_value, 2]))
                for call in (lambda: X[:rows][I[:4]],
                             lambda: X[:rows, 0][I[:4].view(2, 2)],
                             lambda: torch.zeros(rows, 3, device="tpu").scatter_(0, I[:4].abs().view(4, 1), 1.0)):
                    try:
                        call().cpu()
                        errors.append(None)
                    except (IndexError, RuntimeError) as e:
                        errors.append(type(e).__name__ + ": " + str(e).splitlines()[0])
                same(X[:rows][I[:2]], X.cpu()[:rows][:2], f"good after bad {rows}")
        print(json.dumps({"bad": bad, "errors": errors, "programs": stats()["bucket_programs"]}))
    """, tmp_path, on=False)
    assert got["bad"] == []
    want = []
    for rows, v in [(5, 5), (6, -7), (7, 7), (5, 100), (3, -4)]:
        want += [f"IndexError: index {v} is out of bounds for dimension 0 with size {rows}"] * 2
        want.append(f"RuntimeError: index {abs(v)} is out of bounds for dimension 0 with size {rows}")
    assert got["errors"] == want
    assert got["programs"] > 0
