#!/usr/bin/env bash
# Distributed training with torchrun on one or more nodes; GPUs when visible, otherwise CPU processes with gloo.
#   bash tools/dist_train.sh CONFIG NUM_PROCS [tools/train.py options]
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 bash tools/dist_train.sh CONFIG 8   # on each node, NODE_RANK 0..N-1
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: bash tools/dist_train.sh CONFIG NUM_PROCS [tools/train.py options]" >&2
  exit 2
fi
CONFIG=$1
NUM_PROCS=$2
shift 2
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python}" -m torch.distributed.run \
  --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" --master_addr="${MASTER_ADDR:-127.0.0.1}" \
  --master_port="${PORT:-29500}" --nproc_per_node="$NUM_PROCS" \
  "$ROOT/tools/train.py" "$CONFIG" --launcher pytorch "$@"
