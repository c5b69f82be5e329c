#!/usr/bin/env bash
# Distributed testing with torchrun; GPUs when visible, otherwise CPU processes with gloo.
#   bash tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS [tools/test.py options]
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: bash tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS [tools/test.py options]" >&2
  exit 2
fi
CONFIG=$1
CHECKPOINT=$2
NUM_PROCS=$3
shift 3
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python}" -m torch.distributed.run \
  --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" --master_addr="${MASTER_ADDR:-127.0.0.1}" \
  --master_port="${PORT:-29500}" --nproc_per_node="$NUM_PROCS" \
  "$ROOT/tools/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "$@"
