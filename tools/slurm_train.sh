#!/usr/bin/env bash
# Training on a SLURM cluster: one task per GPU, or per CPU process on nodes without GPUs (set GRES= to request none).
#   [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [GRES=gpu:8] [SRUN_ARGS=...] \
#       bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG [WORK_DIR] [tools/train.py options]
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG [WORK_DIR] [tools/train.py options]" >&2
  exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
shift 3
WORK_DIR_ARGS=()
if [ $# -gt 0 ] && [[ $1 != -* ]]; then
  WORK_DIR_ARGS=(--work-dir "$1")
  shift
fi
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
GRES=${GRES-gpu:$GPUS_PER_NODE}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# SRUN_ARGS is split into words on purpose (e.g. SRUN_ARGS="--quotatype=auto --exclude=node1")
# shellcheck disable=SC2086
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" srun -p "$PARTITION" --job-name="$JOB_NAME" \
  ${GRES:+--gres="$GRES"} --ntasks="$GPUS" --ntasks-per-node="$GPUS_PER_NODE" \
  --cpus-per-task="$CPUS_PER_TASK" --kill-on-bad-exit=1 ${SRUN_ARGS:-} \
  "${PYTHON:-python}" -u "$ROOT/tools/train.py" "$CONFIG" "${WORK_DIR_ARGS[@]}" --launcher slurm "$@"
