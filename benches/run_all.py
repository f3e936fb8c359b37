"""Runs the benchmarks and writes benches/RESULTS.md: one section per benchmark, each with its
date, machine and command, and the table the benchmark printed.

    python benches/run_all.py                    # every benchmark this machine can run
    python benches/run_all.py --only eager_add tiny_llama
    python benches/run_all.py --list

A benchmark that is not run this time (not selected, its environment missing, or it needs a
GPU this machine lacks) keeps its section from the file as it was. The history of earlier runs
is in git. On the GPU machine (benches/gpu_check.sh) run it with `--gpu` and copy RESULTS.md
back.
"""
import argparse
import datetime
import os
import platform
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "RESULTS.md")
MAIN = ".venv/bin/python"


class Bench:
    def __init__(self, name, title, args, python=MAIN, gpu=False, timeout=1800):
        self.name, self.title, self.args, self.python, self.gpu, self.timeout = name, title, args, python, gpu, timeout

    def command(self):
        return " ".join([self.python, f"benches/{self.name}.py", *self.args])

    def runnable(self, gpu):
        if self.gpu != gpu:
            return False
        return os.path.exists(os.path.join(ROOT, self.python)) or not self.python.startswith(".venv")


# In the order of the file. Each prints its own table, with ratios against a baseline measured
# in the same run.
BENCHES = [
    Bench("eager_add", "Eager dispatch cost per op", []),
    Bench("low_precision", "Custom kernels and float8 matmuls", []),
    Bench("tiny_llama", "Tiny Llama training step", []),
    Bench("compiled_inplace", "Compiled optimizer steps that write their inputs in place", []),
    Bench("eager_compile", "What new shapes cost in eager mode", []),
    Bench("transfers", "Copies between host memory and the device", []),
    Bench("all_reduce", "all_reduce bandwidth and a DDP step", []),
    Bench("flex_attention", "Compiled flex attention", []),
    Bench("serving", "vLLM serving throughput", [], python=".venv-serve/bin/python"),
    Bench("sglang_serving", "SGLang serving throughput", [], python=".venv-sglang/bin/python"),
    Bench("h200_llama", "Llama-shaped training step on one NVIDIA GPU", [], python="python3", gpu=True),
]

BEGIN = "<!-- bench: {} -->"
END = "<!-- end: {} -->"


def machine(python):
    """One line: CPU model and cores, or the GPU; torch; the platform torchtpu runs on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    probe = ("import torch, torchtpu; print(torch.__version__, torch.tpu.get_device_name(), sep='|')")
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300, cwd=ROOT)
        torch_version, device = out.stdout.strip().splitlines()[-1].split("|")
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        torch_version, device = "?", "?"
    return f"{cpu}, {os.cpu_count()} cores; torch {torch_version}; device {device}"


def previous_sections(text):
    """{name: section text} of the sections in an existing RESULTS.md."""
    found = {}
    for m in re.finditer(r"<!-- bench: (\w+) -->\n(.*?)<!-- end: \1 -->\n", text, re.S):
        found[m.group(1)] = m.group(0)
    return found


def run(bench, machine_line):
    print(f"== {bench.command()}", file=sys.stderr, flush=True)
    cmd = [bench.python, os.path.join("benches", f"{bench.name}.py"), *bench.args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=bench.timeout, cwd=ROOT)
        body, failed = proc.stdout.rstrip(), proc.returncode != 0
        if failed:
            body += f"\n(exit code {proc.returncode}; last error lines:)\n" + "\n".join(proc.stderr.splitlines()[-8:])
    except subprocess.TimeoutExpired as e:
        body = (e.stdout or b"").decode(errors="replace").rstrip() + f"\n(stopped after {bench.timeout} s)"
    print(body, file=sys.stderr, flush=True)
    date = datetime.date.today().isoformat()
    return (f"{BEGIN.format(bench.name)}\n## {bench.title}\n\n{date}, {machine_line}:\n`{bench.command()}`\n\n"
            f"```text\n{body}\n```\n{END.format(bench.name)}\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="*", help="run these benchmarks only")
    p.add_argument("--gpu", action="store_true", help="run the GPU benchmarks (on the GPU machine)")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    a = p.parse_args(argv)
    if a.list:
        for b in BENCHES:
            print(f"{b.name:18} {b.command()}{'  (GPU)' if b.gpu else ''}")
        return 0
    old = open(RESULTS).read() if os.path.exists(RESULTS) else ""
    sections = previous_sections(old)
    machines = {}
    for b in BENCHES:
        if a.only and b.name not in a.only or not b.runnable(a.gpu):
            continue
        if b.python not in machines:
            machines[b.python] = machine(os.path.join(ROOT, b.python) if b.python.startswith(".") else b.python)
        sections[b.name] = run(b, machines[b.python])
    head = ("# Measured results\n\nWritten by `python benches/run_all.py`: one section per benchmark, with its date,\n"
            "machine and command, and what the benchmark printed (its ratios are against baselines\n"
            "measured in the same run). Sections not rerun keep their last run; earlier runs are in git.\n\n")
    missing = "(not measured yet: run `python benches/run_all.py --only {}`)\n"
    body = "\n".join(sections.get(b.name) or f"{BEGIN.format(b.name)}\n## {b.title}\n\n{missing.format(b.name)}"
                     f"{END.format(b.name)}\n" for b in BENCHES)
    with open(RESULTS, "w") as f:
        f.write(head + body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
