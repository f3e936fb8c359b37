"""A fast subset of the OpInfo conformance run (python -m torchtpu.tools.conformance runs them all):
every sample of these ops, forward and float32 gradients, must match PyTorch on CPU, and pass
PyTorch's out=, variant-consistency and noncontiguous-sample checks."""
from torchtpu.tools import conformance

OPS = [
    "add", "mul", "sub", "div", "pow", "exp", "log", "sigmoid", "tanh", "where", "clamp", "masked_fill", "abs",
    "sum", "mean", "amax", "argmax", "var", "std", "cumsum", "logsumexp",
    "matmul", "mm", "bmm", "addmm", "nn.functional.linear", "einsum",
    "cat", "stack", "index_select", "gather", "scatter_add", "index_put", "masked_select", "nonzero", "unique",
    "flip", "roll", "tril", "repeat", "permute", "reshape", "take_along_dim",
    "nn.functional.relu", "nn.functional.silu", "nn.functional.elu", "nn.functional.l1_loss", "nn.functional.rms_norm",
]
DTYPES = ["float32", "bfloat16", "int64"]


def test_conformance_subset(tmp_path):
    names = [n for n in conformance.all_op_names() if n in OPS or n.split(".")[0] in OPS]
    assert len(names) >= len(OPS)
    results = conformance.run(names, DTYPES, max_samples=6, grads=True, timeout=600, log=None)
    line = conformance.summarize(results, DTYPES)
    print(line)
    bad = {}
    for name, per in results.items():
        for dt, r in per.items():
            if r.get("failed") or r.get("errored") or r.get("grad_failed") or r.get("grad_errored") or r.get("crashed"):
                bad[f"{name}/{dt}"] = r.get("first_error") or r.get("grad_first_error")
    assert not bad, bad
    ran = sum(r.get("passed", 0) for per in results.values() for r in per.values())
    assert ran > 500, line


def test_out_variants_and_noncontiguous_checks_on_the_subset():
    names = [n for n in conformance.all_op_names() if n in OPS or n.split(".")[0] in OPS]
    checks = ("out", "variants", "noncontiguous")
    results = conformance.run(names, ["float32"], max_samples=4, grads=False, timeout=600, log=None, checks=checks)
    print(conformance.summarize(results, ["float32"]))
    counts = conformance.check_counts(results)
    for check in checks:
        passed, total = counts[check]
        assert total > 50, (check, counts)
        failed = {name: per["float32"][check]["first_error"] for name, per in results.items()
                  if "float32" in per and per["float32"].get(check, {}).get("failed")}
        assert passed == total, (check, failed)
    assert not any(r.get("crashed") for per in results.values() for r in per.values())
