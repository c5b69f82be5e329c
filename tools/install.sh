#!/usr/bin/env bash
# Install soft_mm and the OpenMMLab stack into the active Python environment.
#
#   bash tools/install.sh
#
# Steps: check the toolchain -> pin setuptools -> torch (kept if present) -> mmengine -> mmcv 2.1.0 built from source
# with its compiled ops (cached as a wheel outside the checkout) -> mmdet, mmseg, mmpretrain, timm, test tools ->
# openmim -> soft_mm (editable).
#
# Environment switches:
#   SOFT_MM_CACHE   where the built mmcv wheel is kept (default: ~/.cache/soft_mm), keyed by Python, torch and the
#                   ops: CPU, CUDA and the architectures built for (a CUDA wheel is reused only where they cover
#                   the visible GPU), or ROCm; whether this environment already holds the cached wheel is read off
#                   its installed mmcv, not from the cache, which other environments share
#   FORCE_CUDA=1    build mmcv's CUDA ops too (needs nvcc of torch's CUDA major version; also chosen automatically
#                   when torch sees a GPU); TORCH_CUDA_ARCH_LIST picks the architectures (default: the visible GPUs'
#                   own, as torch's extension builder picks them; without a visible GPU "8.0;9.0")
#   ROCm torch      (torch.version.hip set: AMD GPUs) mmcv's ops built for ROCm where torch finds the ROCm toolkit
#                   (hipcc; ROCM_HOME), as mmcv 2.1.0's own setup.py does, for PYTORCH_ROCM_ARCH if set; without the
#                   toolkit its CPU ops, said so (then FORCE_CUDA=1 stops with one sentence)
#   MAX_JOBS        parallel compile jobs for mmcv (default: number of cores)
#   SOFT_MM_WITH_MIM=0  skip openmim (installed by default, then what its dependencies downgrade is re-pinned;
#                       tests/tools/test_mim.py needs it)
#   SOFT_MM_WITH_MMDEPLOY=0  skip mmdeploy 1.3.1 (whole-model ONNX export, tools/deployment/mmdeploy_onnx.py; installed
#                       by default, with --no-deps: it pins protobuf<=3.20.2, which onnx and tensorboard here outgrew;
#                       its other needs (aenum, multiprocess, dill) are added the same way, nothing installed is changed;
#                       tests/tools/test_mmdeploy_onnx.py needs it)
set -euo pipefail

# The whole script is one function, parsed before it runs, and the line that calls it also exits: editing this file
# during an install cannot break it (bash would otherwise read on at a stale offset after main returns).
main() {

  PY=${PYTHON:-python}
  ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  CACHE=${SOFT_MM_CACHE:-$HOME/.cache/soft_mm}
  LOG_DIR="$CACHE/logs"
  mkdir -p "$LOG_DIR"
  MMCV_VERSION=2.1.0
  TORCH_VERSION=2.14.1
  TORCHVISION_VERSION=0.29.1
  START=$(date +%s)

  step() { printf '\n[soft_mm install %4ss] %s\n' "$(( $(date +%s) - START ))" "$*"; }
  die() { printf '\nsoft_mm install failed: %s\n' "$*" >&2; exit 1; }
  # every pip call takes tools/constraints.txt and, once torch is there, the pins that keep it and its numpy
  PINS=$(mktemp)  # this run's own: installs into two environments at once must not share it
  trap 'rm -f "$PINS"' EXIT
  pip_q() { "$PY" -m pip install --disable-pip-version-check -q -c "$ROOT/tools/constraints.txt" -c "$PINS" "$@"; }

  # the cache key of a TORCH_CUDA_ARCH_LIST: its entries sorted, "8.6" -> sm86, "9.0a" -> sm90a, "8.6+PTX" -> sm86ptx
  # (a name such as "Ampere" kept as it is), joined by "-"
  arch_key() {
    echo "$1" | tr ' ;' '\n\n' | sed -e '/^$/d' -e 's/^\([0-9]*\)\.\([0-9]*[a-z]*\)/sm\1\2/' -e 's/+PTX$/ptx/' \
      | LC_ALL=C sort -u | paste -sd- -
  }
  # a cached CUDA wheel folder under the prefix $1 whose architectures cover every visible GPU ($2, as "7.5;8.6"):
  # code for the GPU's major version at or below its minor (sm80 runs on an sm_86), or PTX at or below its capability;
  # an arch-specific entry (sm90a) only on exactly that GPU. Prints the folder, or nothing.
  covering_wheel_dir() {
    "$PY" - "$1" "$2" <<'PYEOF'
import glob, os, re, sys
prefix = sys.argv[1]
gpus = [tuple(int(part) for part in g.split('.')) for g in sys.argv[2].split(';')]
def covers(entry, gpu):
    match = re.fullmatch(r'sm(\d+?)(\d)(a?)(ptx)?', entry)
    if match is None:
        return False
    arch = (int(match.group(1)), int(match.group(2)))
    if match.group(4):
        return arch <= gpu
    return arch == gpu if match.group(3) else (arch[0] == gpu[0] and arch[1] <= gpu[1])
for folder in sorted(glob.glob(glob.escape(prefix) + '-cuda-*')):
    entries = os.path.basename(folder)[len(os.path.basename(prefix)) + len('-cuda-'):].split('-')
    if glob.glob(os.path.join(folder, 'mmcv-*.whl')) and all(any(covers(e, g) for e in entries) for g in gpus):
        print(folder)
        break
PYEOF
  }

  step "checking the toolchain"
  command -v "$PY" >/dev/null 2>&1 || die "no Python interpreter '$PY' on PATH; activate an environment or set PYTHON=/path/to/python."
  "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)' \
    || die "soft_mm needs Python >= 3.9, but '$PY' is $("$PY" -c 'import platform; print(platform.python_version())')."
  "$PY" -m pip --version >/dev/null 2>&1 || die "pip is missing for '$PY'; install it with '$PY -m ensurepip'."
  CXX_BIN=${CXX:-g++}
  command -v "$CXX_BIN" >/dev/null 2>&1 || die "no C++ compiler ('$CXX_BIN') found; mmcv's ops must be compiled: install g++ (e.g. 'apt-get install g++')."
  command -v "${CC:-gcc}" >/dev/null 2>&1 || die "no C compiler ('${CC:-gcc}') found; install gcc (e.g. 'apt-get install gcc')."
  "$PY" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
    || die "the Python headers (Python.h) are missing; install them (e.g. 'apt-get install python3-dev') and rerun."
  echo '#include <concepts>
  int main() { return 0; }' > "$LOG_DIR/cxx20.cpp"
  "$CXX_BIN" -std=c++20 -o "$LOG_DIR/cxx20.out" "$LOG_DIR/cxx20.cpp" >/dev/null 2>&1 \
    || die "'$CXX_BIN' cannot compile C++20, which torch $TORCH_VERSION's headers need; install g++ >= 10."

  step "pinning setuptools (>=77.0.3 for torch, <82 for pkg_resources), wheel and ninja"
  pip_q "setuptools>=77.0.3,<82" wheel ninja

  step "torch"
  # one Python start reads everything the install needs of torch: its version, whether it is inside the supported
  # range (pyproject.toml's torch requirement, one home), whether a GPU is visible, its CUDA version, the CUDA
  # architectures of the visible GPUs, and the pins that keep it (written to $PINS); it prints nothing when torch or
  # torchvision is missing
  TORCH_RANGE=$(sed -n 's/^ *"torch\([<>=!,.0-9]*\)",*$/\1/p' "$ROOT/pyproject.toml" | head -n 1)
  probe_torch() {
    "$PY" - "$TORCH_RANGE" "$PINS" <<'PYEOF' 2>/dev/null
import operator, re, sys
from importlib.metadata import version
try:
    import torch, torchvision
except ImportError:
    sys.exit(0)
def release(text): return tuple(int(p) for p in re.match(r'[0-9]+(?:\.[0-9]+)*', text).group(0).split('.'))
def pad(v): return v + (0,) * (3 - len(v))
ops = {'>=': operator.ge, '>': operator.gt, '<=': operator.le, '<': operator.lt, '==': operator.eq}
have = pad(release(torch.__version__))
in_range = all(ops[op](have, pad(release(v))) for op, v in re.findall(r'(>=|<=|==|<|>)\s*([0-9.]+)', sys.argv[1]))
# nothing installed after this moves torch, torchvision or (torch < 2.3 being built for numpy 1.x) numpy to 2.x
# (the installed distributions' versions: torch.__version__ may carry a local tag, +cu121, that they lack)
pins = [f'torch=={version("torch")}', f'torchvision=={version("torchvision")}']
if have[:2] < (2, 3):
    pins.append('numpy<2')
with open(sys.argv[2], 'w') as f:
    f.write('\n'.join(pins) + '\n')
# (getattr: the installer's tests stand in a torch package that has nothing but its version)
cuda = getattr(torch, 'cuda', None)
gpu = int(bool(cuda is not None and cuda.is_available()))
cuda_version = getattr(getattr(torch, 'version', None), 'cuda', None) or '-'
# a ROCm build (AMD GPUs, torch.cuda the HIP device API): its HIP version, and the ROCm toolkit that torch's extension
# builder, and so mmcv's setup.py, finds (ROCM_HOME, ROCM_PATH, hipcc on PATH or /opt/rocm)
hip_version = getattr(getattr(torch, 'version', None), 'hip', None) or '-'
rocm_home = '-'
if hip_version != '-':
    try:
        from torch.utils.cpp_extension import ROCM_HOME
        rocm_home = ROCM_HOME or '-'
    except ImportError:
        pass
# the architectures torch's extension builder compiles for the visible GPUs when TORCH_CUDA_ARCH_LIST is unset: each
# GPU's capability, capped at the newest torch was built for, the newest also as PTX (ROCm's torch reports no CUDA)
# (and the GPUs' own capabilities, which a cached wheel must cover)
archs = caps = '-'
if gpu and cuda_version != '-':
    built = [int(a.split('_')[1]) for a in cuda.get_arch_list() if a.startswith('sm_')]
    top = divmod(max(built), 10) if built else (99, 9)
    found = sorted({tuple(cuda.get_device_capability(i)) for i in range(cuda.device_count())})
    caps = ';'.join(f'{major}.{minor}' for major, minor in found)
    archs = ';'.join(sorted({f'{major}.{minor}' for major, minor in (min(cap, top) for cap in found)})) + '+PTX'
print(torch.__version__, torchvision.__version__, int(in_range), gpu, cuda_version, archs, caps, hip_version,
      rocm_home)
PYEOF
  }
  TORCH_FOUND=$(probe_torch)
  if [ -n "$TORCH_FOUND" ]; then
    echo "keeping the installed torch $(echo "$TORCH_FOUND" | cut -d' ' -f1) / torchvision $(echo "$TORCH_FOUND" | cut -d' ' -f2)"
  else
    echo "installing torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION (large download when not cached locally)"
    pip_q "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
    TORCH_FOUND=$(probe_torch)
    [ -n "$TORCH_FOUND" ] || die "torch==$TORCH_VERSION and torchvision==$TORCHVISION_VERSION installed but 'import torch, torchvision' fails; run it in Python to see why."
  fi
  read -r TORCH_FULL _ TORCH_IN_RANGE GPU_VISIBLE TORCH_CUDA GPU_ARCHS GPU_CAPS TORCH_HIP TORCH_ROCM_HOME <<< "$TORCH_FOUND"
  TORCH_HIP=${TORCH_HIP:--}
  TORCH_ROCM_HOME=${TORCH_ROCM_HOME:--}
  [ "$TORCH_IN_RANGE" = 1 ] || die "the installed torch $TORCH_FULL is outside the range soft_mm supports (torch$TORCH_RANGE); install a torch in that range (e.g. pip install 'torch==$TORCH_VERSION' 'torchvision==$TORCHVISION_VERSION', or torch 2.1.2 with torchvision 0.16.2 for mmcv's prebuilt wheels) and rerun."
  TORCH_TAG=${TORCH_FULL//+/_}
  echo "pinned for the rest of the install: $(tr '\n' ' ' < "$PINS")"

  step "mmengine"
  pip_q "mmengine==0.10.7"

  step "mmcv $MMCV_VERSION with compiled ops"
  WITH_CUDA=0
  WITH_HIP=0
  HIDE_GPUS=0  # build mmcv's CPU ops on a machine whose torch sees a GPU: its setup.py would take the GPU branch
  # why GPU ops are asked for, and the way out that goes with it (FORCE_CUDA is only named when the user set it)
  if [ "${FORCE_CUDA:-0}" = "1" ]; then
    ASKED="FORCE_CUDA=1 asks for mmcv's CUDA ops"
    OR_CPU=" or unset FORCE_CUDA"
  else
    ASKED="torch sees a GPU, so mmcv's CUDA ops are built"
    OR_CPU=""
  fi
  if [ "$TORCH_HIP" != "-" ]; then
    # a ROCm build of torch (AMD GPUs): mmcv 2.1.0's setup.py builds its ops for ROCm (hipified CUDA sources,
    # MMCV_WITH_HIP) whenever torch's extension builder finds the ROCm toolkit; nvcc and FORCE_CUDA play no part
    HIP_MM=$(echo "$TORCH_HIP" | sed -n 's/^\([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p')
    if [ "$TORCH_ROCM_HOME" != "-" ]; then
      WITH_HIP=1
      echo "ROCm torch (HIP $TORCH_HIP): building mmcv's ops for ROCm with the toolkit in $TORCH_ROCM_HOME, for $([ -n "${PYTORCH_ROCM_ARCH:-}" ] && echo "PYTORCH_ROCM_ARCH=$PYTORCH_ROCM_ARCH" || echo "the architectures torch was built for (set PYTORCH_ROCM_ARCH, e.g. gfx90a, to choose)")"
    else
      [ "${FORCE_CUDA:-0}" != "1" ] || die "FORCE_CUDA=1 asks for mmcv's GPU ops, but the installed torch is a ROCm build (HIP $TORCH_HIP) and torch finds no ROCm toolkit (hipcc); install ROCm's HIP SDK (or set ROCM_HOME to where it is) and rerun, or unset FORCE_CUDA to build mmcv's CPU ops."
      [ "$GPU_VISIBLE" != 1 ] || HIDE_GPUS=1
      echo "ROCm torch (HIP $TORCH_HIP) without the ROCm toolkit (no hipcc; set ROCM_HOME if it is installed elsewhere): building mmcv's CPU ops. The backbones, segmentation and classification run on the AMD GPU with them; detection's nms and RoIAlign need mmcv's GPU ops: install ROCm's HIP SDK and rerun to build them."
    fi
  elif [ "${FORCE_CUDA:-0}" = "1" ] || [ "$GPU_VISIBLE" = 1 ]; then
    command -v nvcc >/dev/null 2>&1 || die "$ASKED but nvcc is not on PATH; install the CUDA toolkit$OR_CPU."
    if [ "$TORCH_CUDA" = "-" ]; then TORCH_CUDA=""; fi
    NVCC_CUDA=$(nvcc --version | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p')
    [ -n "$TORCH_CUDA" ] || die "$ASKED but the installed torch is a CPU build; install a CUDA build of torch $TORCH_VERSION$OR_CPU."
    [ "${TORCH_CUDA%%.*}" = "${NVCC_CUDA%%.*}" ] || die "torch was built with CUDA $TORCH_CUDA but nvcc is CUDA $NVCC_CUDA; put an nvcc of CUDA ${TORCH_CUDA%%.*} first on PATH (e.g. pip install 'nvidia-cuda-nvcc==${TORCH_CUDA%%.*}.*')$OR_CPU."
    if [ -z "${CUDA_HOME:-}" ]; then
      # the toolkit nvcc belongs to (torch would guess it from nvcc's folder, wrong for a wrapper in /usr/local/bin,
      # and then link against a libcudart that is not there)
      echo '' > "$LOG_DIR/probe.cu"
      TOP=$(nvcc --dryrun -c "$LOG_DIR/probe.cu" -o "$LOG_DIR/probe.o" 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n 1)
      CUDA_HOME=$([ -n "$TOP" ] && cd "$TOP" 2>/dev/null && pwd -P) || die "cannot tell which CUDA toolkit nvcc belongs to; set CUDA_HOME to its root (the folder holding bin/nvcc and lib64)."
      export CUDA_HOME
      echo "CUDA_HOME=$CUDA_HOME (nvcc's toolkit)"
    fi
    if [ ! -e "$CUDA_HOME/include/cusparse.h" ]; then
      # torch's CUDA headers include cusparse.h and cublas_v2.h; a toolkit without the math libraries lacks them, the
      # nvidia-* wheels that torch depends on ship them
      WHEEL_INCLUDES=$("$PY" -c 'import glob, os, nvidia; print(":".join(sorted({os.path.dirname(h) for root in nvidia.__path__ for h in glob.glob(os.path.join(root, "*", "include", "cusparse.h"))})))' 2>/dev/null || true)
      [ -n "$WHEEL_INCLUDES" ] || die "torch's CUDA headers need cusparse.h, which is neither in $CUDA_HOME/include nor in an nvidia-* wheel; install the CUDA toolkit's math libraries (cuSPARSE, cuBLAS) or pip install torch's nvidia-cusparse and nvidia-cublas wheels."
      export CPATH="$WHEEL_INCLUDES${CPATH:+:$CPATH}"
      echo "CUDA math headers from torch's nvidia wheels: CPATH=$CPATH"
    fi
    ARCHS_CHOSEN=user
    if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ] && [ "$GPU_VISIBLE" = 1 ] && [ "${GPU_ARCHS:--}" != "-" ]; then
      export TORCH_CUDA_ARCH_LIST="$GPU_ARCHS"  # what torch would pick for the visible GPUs, named for the cache key
      ARCHS_CHOSEN=gpu
      echo "building the CUDA ops for the visible GPU: TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST"
    elif [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
      export TORCH_CUDA_ARCH_LIST="8.0;9.0"  # no GPU to ask: Ampere and Hopper, not every architecture torch knows
      echo "no GPU visible: building the CUDA ops for TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST (set it to choose others)"
    fi
    WITH_CUDA=1
  fi
  PY_TAG=$("$PY" -c 'import sys; print(f"cp{sys.version_info.major}{sys.version_info.minor}")')
  WHEEL_PREFIX="$CACHE/wheels/mmcv-$MMCV_VERSION-$PY_TAG-torch$TORCH_TAG"
  if [ "$WITH_CUDA" = 1 ]; then
    # a CUDA wheel is keyed by the architectures it holds code for ("8.0;9.0" -> cuda-sm80-sm90; "8.6+PTX" ->
    # cuda-sm86ptx): a wheel built elsewhere (without a GPU: sm_80 and sm_90) is not taken for a T4 or a Blackwell GPU
    OPS_KIND=cuda-$(arch_key "$TORCH_CUDA_ARCH_LIST")
    WHEEL_DIR="$WHEEL_PREFIX-$OPS_KIND"
    if [ "$ARCHS_CHOSEN" = gpu ] && ! ls "$WHEEL_DIR"/mmcv-*.whl >/dev/null 2>&1; then
      COVERING=$(covering_wheel_dir "$WHEEL_PREFIX" "$GPU_CAPS")
      if [ -n "$COVERING" ]; then
        WHEEL_DIR=$COVERING
        OPS_KIND=${COVERING#"$WHEEL_PREFIX-"}
        echo "the cached wheel in $WHEEL_DIR holds code for this GPU (compute capability $GPU_CAPS)"
      fi
    fi
  elif [ "$WITH_HIP" = 1 ]; then
    # a ROCm wheel is keyed by the HIP version and the architectures asked for (none: torch's own, which its
    # version in the prefix fixes)
    OPS_KIND=rocm$HIP_MM
    if [ -n "${PYTORCH_ROCM_ARCH:-}" ]; then OPS_KIND="$OPS_KIND-$(arch_key "$PYTORCH_ROCM_ARCH")"; fi
    WHEEL_DIR="$WHEEL_PREFIX-$OPS_KIND"
  else
    OPS_KIND=cpu
    WHEEL_DIR="$WHEEL_PREFIX-cpu"
  fi
  mmcv_ok() {
    "$PY" -c "import mmcv, sys; from mmcv.ops import batched_nms, roi_align; sys.exit(0 if mmcv.__version__ == '$MMCV_VERSION' else 1)" >/dev/null 2>&1
  }
  # whether this environment's mmcv is the cached wheel's build: the lines of its compiled ops (file, sha256, size) in
  # the installed RECORD are the wheel's (a marker in the cache, which every environment on the machine shares, would
  # also skip an environment that holds another build of mmcv 2.1.0, or none)
  mmcv_from_cached_wheel() {
    ls "$WHEEL_DIR"/mmcv-*.whl >/dev/null 2>&1 || return 1
    "$PY" - "$(ls "$WHEEL_DIR"/mmcv-*.whl | head -n 1)" <<'PYEOF' >/dev/null 2>&1
import sys, zipfile
from importlib.metadata import distribution
def ops(record):
    return sorted(line for line in record.splitlines() if line.startswith('mmcv/_ext'))
with zipfile.ZipFile(sys.argv[1]) as wheel:
    built = ops(wheel.read(next(n for n in wheel.namelist() if n.endswith('.dist-info/RECORD'))).decode())
sys.exit(0 if built and built == ops(distribution('mmcv').read_text('RECORD') or '') else 1)
PYEOF
  }
  if mmcv_ok && mmcv_from_cached_wheel; then
    echo "mmcv $MMCV_VERSION with ops already installed (built for torch $TORCH_TAG, $OPS_KIND ops)"
  else
    if ! ls "$WHEEL_DIR"/mmcv-*.whl >/dev/null 2>&1; then
      BUILD_DIR=$(mktemp -d)
      trap 'rm -rf "$BUILD_DIR" "$PINS"' EXIT
      echo "no cached wheel in $WHEEL_DIR: building from source ($OPS_KIND ops; $([ "$WITH_CUDA" = 1 ] && echo 'about 70 minutes on 2 cores for two architectures' || { [ "$WITH_HIP" = 1 ] && echo 'longer than the CPU ops take'; } || echo '15-30 minutes on 2 cores'))"
      BUILD_LOG="$LOG_DIR/mmcv-build-$PY_TAG-torch$TORCH_TAG-$OPS_KIND.log"
      echo "compiler output goes to $BUILD_LOG"
      "$PY" -m pip download --disable-pip-version-check -q --no-deps --no-build-isolation --no-binary :all: "mmcv==$MMCV_VERSION" -d "$BUILD_DIR" \
        >"$LOG_DIR/mmcv-download.log" 2>&1 || die "could not download the mmcv $MMCV_VERSION source from the package index (see $LOG_DIR/mmcv-download.log)."
      tar -xzf "$BUILD_DIR"/mmcv-"$MMCV_VERSION".tar.gz -C "$BUILD_DIR"
      SRC="$BUILD_DIR/mmcv-$MMCV_VERSION"
      # torch >= 2.10 headers require C++20; mmcv's setup.py hard-codes C++17.
      sed -i 's/-std=c++17/-std=c++20/g' "$SRC/setup.py"
      (
        cd "$SRC"
        export MMCV_WITH_OPS=1 MAX_JOBS=${MAX_JOBS:-$(nproc)}
        [ "$WITH_CUDA" = 1 ] && export FORCE_CUDA=1
        # CPU ops under a ROCm torch that sees a GPU: the build sees none (the HIP runtime reads both variables)
        if [ "$HIDE_GPUS" = 1 ]; then export HIP_VISIBLE_DEVICES=-1 CUDA_VISIBLE_DEVICES=-1; fi
        "$PY" setup.py bdist_wheel -d "$BUILD_DIR/dist" >"$BUILD_LOG" 2>&1 &
        pid=$!
        waited=0
        while kill -0 "$pid" 2>/dev/null; do  # a line every 30 s; done within a second of the build
          sleep 1
          waited=$((waited + 1))
          [ $((waited % 30)) = 0 ] || continue
          n=$(grep -o -E '^\[[0-9]+/[0-9]+\]' "$BUILD_LOG" 2>/dev/null | tail -n 1 || true)
          printf '  ... compiling mmcv ops %s (%ss)\n' "${n:-[preparing]}" "$(( $(date +%s) - START ))"
        done
        wait "$pid"
      ) || die "the mmcv $MMCV_VERSION build failed; the last lines of $BUILD_LOG say why."
      mkdir -p "$WHEEL_DIR"
      cp "$BUILD_DIR"/dist/mmcv-*.whl "$WHEEL_DIR"/
      echo "cached $(ls "$WHEEL_DIR"/mmcv-*.whl)"
    else
      echo "reusing the cached wheel $(ls "$WHEEL_DIR"/mmcv-*.whl)"
    fi
    pip_q --force-reinstall --no-deps "$WHEEL_DIR"/mmcv-*.whl
    pip_q addict packaging Pillow pyyaml yapf opencv-python
    mmcv_ok || die "mmcv installed but 'from mmcv.ops import batched_nms, roi_align' fails; delete $WHEEL_DIR and rerun to rebuild."
  fi

  step "mmdet, mmsegmentation, mmpretrain, timm and the test tools (requirements.txt)"
  pip_q -r "$ROOT/requirements.txt"

  if [ "${SOFT_MM_WITH_MIM:-1}" != "0" ]; then
    step "openmim (and re-pinning what its dependencies downgrade)"
    pip_q openmim
    pip_q "setuptools>=77.0.3,<82" "requests>=2.31" "rich>=13.7"
  fi

  if [ "${SOFT_MM_WITH_MMDEPLOY:-1}" != "0" ]; then
    step "mmdeploy 1.3.1 (--no-deps: its protobuf<=3.20.2 pin would downgrade what onnx and tensorboard need)"
    pip_q --no-deps mmdeploy==1.3.1 aenum==3.1.17 multiprocess==0.70.19 dill==0.4.1
    "$PY" -c "import mmdeploy.apis, onnxruntime" >/dev/null 2>&1 \
      || die "mmdeploy installed but 'import mmdeploy.apis' fails; run it in Python to see why."
  fi

  step "soft_mm (editable)"
  pip_q --no-build-isolation --no-deps -e "$ROOT"

  step "checking the imports"
  "$PY" -c "import soft_mm, mmdet, mmseg, mmpretrain, mmpretrain.models, timm; from mmcv.ops import batched_nms, roi_align; import importlib.util as u; triton = u.find_spec('triton') and __import__('triton'); print('soft_mm', soft_mm.__version__, '| mmdet', mmdet.__version__, '| mmseg', mmseg.__version__, '| mmpretrain', mmpretrain.__version__, '| timm', timm.__version__, '| triton', triton.__version__ if triton else 'none (the Triton backend and its tests are skipped)')" \
    || die "the final import check failed; see the messages above."
  step "done"
}

main "$@"; exit
