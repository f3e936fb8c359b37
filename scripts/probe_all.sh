#!/usr/bin/env bash
# Probes every aten op overload the dispatcher knows on "tpu" (python -m torchtpu.tools.probe; about
# 20 minutes on 2 cores, one worker process): writes probe.json (or $1) and prints the
# overloads that raise NotImplementedError on tpu while CPU runs them, then the summary line.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-probe.json}"
PY="${PYTHON:-.venv/bin/python}"
"$PY" -m torchtpu.tools.probe --out "$OUT" --list unsupported
