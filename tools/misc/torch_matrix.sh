#!/usr/bin/env bash
# The torch-only tests of soft_mm on every torch it supports, each in a cached venv of its own.
#
#   bash tools/misc/torch_matrix.sh [--build-only] [ENTRY ...]   (default: every entry; e.g. `floor gpu-image`)
#
# Entries (torch, torchvision, the numpy and triton pins that make each one what users have):
#   floor      torch 2.1.2, numpy < 2 (torch < 2.3 was built for numpy 1.x), triton 2.1 (too old for the kernels:
#              the Triton backend declines with its reason)
#   2.4        torch 2.4.1, the first with torch.library.custom_op
#   2.8        torch 2.8.0, one in between
#   gpu-image  torch 2.11.0, triton 3.6.0 and the newest numpy (the GPU machine's image: triton 3.6's interpreter
#              with numpy >= 2.4)
#   newest     torch 2.14.1 (the newest this index installs; the main environment of `bash tools/install.sh`)
#
# Each venv holds torch, torchvision, numpy, timm, pytest and pytest-xdist only (no mm* package: the op layer imports
# with torch alone). In each, the script prints the versions and runs tests/ops, tests/testing (the FlashAttention
# rule), the whole-model compile test (tests/models/test_compile.py), the Triton rule's test and the device check's
# `--smoke` (started from outside the repository, as on the GPU machine), and ends with one line per entry: versions,
# pytest's counts, the smoke run's exit status. Exit status 1 when any entry failed.
#
# Environment: SOFT_MM_CACHE (default ~/.cache/soft_mm) holds the venvs in venvs/torch-ENTRY; PYTHON the interpreter
# that creates them (default python3); SOFT_MM_MATRIX_WORKERS pytest workers per entry (default 2).
set -uo pipefail

main() {
  ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  CACHE=${SOFT_MM_CACHE:-$HOME/.cache/soft_mm}
  PY=${PYTHON:-python3}
  WORKERS=${SOFT_MM_MATRIX_WORKERS:-2}
  ALL=(floor 2.4 2.8 gpu-image newest)
  BUILD_ONLY=0
  [ "${1:-}" = "--build-only" ] && { BUILD_ONLY=1; shift; }
  ENTRIES=("$@")
  [ ${#ENTRIES[@]} -gt 0 ] || ENTRIES=("${ALL[@]}")
  SUMMARY=()
  FAILED=0
  for entry in "${ENTRIES[@]}"; do
    case "$entry" in
      floor) pins=("torch==2.1.2" "torchvision==0.16.2" "numpy<2") ;;
      2.4) pins=("torch==2.4.1" "torchvision==0.19.1" "numpy<2.3") ;;
      2.8) pins=("torch==2.8.0" "torchvision==0.23.0" "numpy") ;;
      gpu-image) pins=("torch==2.11.0" "torchvision==0.26.0" "triton==3.6.0" "numpy>=2.4") ;;
      newest) pins=("torch==2.14.1" "torchvision==0.29.1" "numpy") ;;
      *) echo "torch_matrix: unknown entry '$entry'; the entries are: ${ALL[*]}" >&2; return 2 ;;
    esac
    venv="$CACHE/venvs/torch-$entry"
    stamp="$venv/.soft_mm-$(printf '%s ' "${pins[@]}" | md5sum | cut -c1-12)"
    printf '\n== %s: %s (%s)\n' "$entry" "${pins[*]}" "$venv"
    if [ ! -f "$stamp" ]; then
      rm -rf "$venv"
      "$PY" -m venv "$venv" || { SUMMARY+=("$entry: venv creation failed"); FAILED=1; continue; }
      # the pins first and together, so that nothing installed later moves torch or numpy
      "$venv/bin/python" -m pip install -q --disable-pip-version-check "${pins[@]}" "timm==1.0.31" "pytest>=8" \
          "pytest-xdist>=3.5" "setuptools<82" \
        || { SUMMARY+=("$entry: pip install failed"); FAILED=1; continue; }
      touch "$stamp"
    fi
    [ "$BUILD_ONLY" = 1 ] && continue
    versions=$("$venv/bin/python" -c 'import importlib.util as u, numpy, timm, torch
triton = u.find_spec("triton") and __import__("triton")
print(f"torch {torch.__version__}, triton {triton.__version__ if triton else None}, numpy {numpy.__version__}, timm {timm.__version__}")')
    echo "$versions"
    log="$CACHE/logs/torch_matrix-$entry.log"
    mkdir -p "$(dirname "$log")"
    (cd "$ROOT" && "$venv/bin/python" -m pytest -p no:cacheprovider -n "$WORKERS" tests/ops tests/testing \
        tests/models/test_compile.py tests/benchmarks/test_triton_rule.py 2>&1) | tee "$log" | tail -n 15
    counts=$(grep -E '(passed|failed|error).* in [0-9.]+s' "$log" | tail -n 1 | sed 's/=//g; s/^ *//; s/ *$//')
    case "$counts" in *failed*|*error*) FAILED=1 ;; esac
    [ -n "$counts" ] || { counts='pytest printed no result'; FAILED=1; }
    # the device check as the GPU machine runs it: from outside the repository, the checkout on PYTHONPATH
    smoke_dir=$(mktemp -d)
    smoke_log="$CACHE/logs/torch_matrix-$entry-smoke.log"
    (cd "$smoke_dir" && PYTHONPATH="$ROOT" TRITON_INTERPRET=1 "$venv/bin/python" "$ROOT/benchmarks/device_check.py" \
        --smoke --out "$smoke_dir/out" >"$smoke_log" 2>&1)
    smoke=$?
    rm -rf "$smoke_dir"
    triton_ok=$(cd "$ROOT" && "$venv/bin/python" -c 'from soft_mm.ops.triton_route import triton_available
print(int(triton_available()))')
    if [ "$triton_ok" = 1 ]; then
      smoke_note="device_check --smoke exit $smoke"
      [ "$smoke" = 0 ] || { FAILED=1; tail -n 20 "$smoke_log"; }
    else  # a triton older than the kernels need: the check must decline in one sentence, naming the reason
      smoke_note="device_check --smoke declined (exit $smoke): $(tail -n 1 "$smoke_log")"
      { [ "$smoke" != 0 ] && grep -q 'needs triton >=' "$smoke_log"; } || { FAILED=1; tail -n 20 "$smoke_log"; }
    fi
    SUMMARY+=("$entry: $versions | $counts | $smoke_note")
  done
  printf '\n== torch matrix\n'
  printf '%s\n' "${SUMMARY[@]}"
  return "$FAILED"
}

main "$@"; exit
