#!/usr/bin/env bash
# soft_mm on its lowest supported stack, the one most mmdet users run: torch 2.1.2 + torchvision 0.16.2 + numpy 1.x,
# then the README's install (mmcv 2.1.0 built against that torch, mmdet 3.3, mmseg, mmpretrain, timm), the README's
# main job and the README's test command, from a fresh clone of this checkout.
#
#   bash tools/misc/floor_stack.sh [install] [job] [test]      (default: all three, in that order)
#
# The venv is $SOFT_MM_CACHE/venvs/floor-stack (default ~/.cache/soft_mm), kept between runs (the installer reuses
# its cached mmcv wheel); the clone is made afresh under $SOFT_MM_CACHE/floor-clone. Each step's output goes to
# $SOFT_MM_CACHE/logs/floor-STEP.log; the last lines say the versions, the main job's bbox mAP and pytest's counts.
set -euo pipefail

main() {
  ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  CACHE=${SOFT_MM_CACHE:-$HOME/.cache/soft_mm}
  VENV="$CACHE/venvs/floor-stack"
  CLONE="$CACHE/floor-clone"
  LOGS="$CACHE/logs"
  mkdir -p "$LOGS"
  # this checkout's files as they are now (committed or not) copied over the clone: the floor runs what is tested here
  sync() { (cd "$ROOT" && git ls-files -co --exclude-standard -z | xargs -0 tar cf -) | (cd "$CLONE" && tar xf -); }
  STEPS=("$@")
  [ ${#STEPS[@]} -gt 0 ] || STEPS=(install job test)
  for step in "${STEPS[@]}"; do
    case "$step" in
      install)
        start=$(date +%s)
        rm -rf "$CLONE"
        git clone -q "$ROOT" "$CLONE"
        sync
        if [ ! -x "$VENV/bin/python" ]; then
          "${PYTHON:-python3}" -m venv "$VENV"
          "$VENV/bin/python" -m pip install -q --disable-pip-version-check torch==2.1.2 torchvision==0.16.2 "numpy<2"
        fi
        (cd "$CLONE" && PATH="$VENV/bin:$PATH" PYTHON="$VENV/bin/python" bash tools/install.sh) 2>&1 \
          | tee "$LOGS/floor-install.log" | grep -E '^\[soft_mm install|failed|soft_mm [0-9]'
        echo "floor install: $(( $(date +%s) - start )) s"
        "$VENV/bin/python" -c 'import mmcv, mmdet, mmengine, mmpretrain, mmseg, numpy, timm, torch, torchvision
print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, numpy {numpy.__version__}, "
      f"mmengine {mmengine.__version__}, mmcv {mmcv.__version__}, mmdet {mmdet.__version__}, "
      f"mmseg {mmseg.__version__}, mmpretrain {mmpretrain.__version__}, timm {timm.__version__}")'
        ;;
      job)
        sync
        (cd "$CLONE" && PATH="$VENV/bin:$PATH" python tools/train.py configs/retinanet_soft_tiny_demo.py \
            --cfg-options work_dir=work_dirs/floor_main_job) >"$LOGS/floor-job.log" 2>&1
        grep -E 'coco/bbox_mAP:' "$LOGS/floor-job.log" | tail -n 1
        ;;
      test)
        sync
        (cd "$CLONE" && PATH="$VENV/bin:$PATH" python -m pytest -n 2 --dist loadgroup) >"$LOGS/floor-test.log" 2>&1 \
          || true
        tail -n 3 "$LOGS/floor-test.log"
        ;;
      *) echo "floor_stack: unknown step '$step' (install, job, test)" >&2; return 2 ;;
    esac
  done
}

main "$@"; exit
