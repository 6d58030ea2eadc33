#!/usr/bin/env bash
# mnist_train --distributed on 2 ranks: it prints each rank's rate and the total; a job stopped
# after epoch 1 and resumed from rank 0's checkpoint ends with the same bits as one that never
# stopped; a single-process run may not resume a 2-rank checkpoint.
#   check_distributed_training.sh MPIRUN MNIST_TRAIN DATA_DIR
set -uo pipefail
mpirun="$1" program="$2" data="$3"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
status=0
train() { # RANKS ARGS...
  local ranks="$1"
  shift
  timeout 300 "$mpirun" --allow-run-as-root --oversubscribe -np "$ranks" --mca btl self,tcp \
    "$program" --distributed --data "$data" --model lenet5 --batch 32 --lr 0.05 --threads 1 \
    --keep 100 "$@"
}
if ! out="$(train 2 --epochs 2 --save "$work/straight" 2>&1)"; then
  echo "$out"
  echo "FAIL: the 2-rank run failed"
  exit 1
fi
if grep -q "images/s per rank: 0: [0-9]* 1: [0-9]*; all ranks: [0-9]*" <<<"$out"; then
  echo "ok: the 2-rank run prints each rank's rate and the total"
else
  echo "$out"
  echo "FAIL: no per-rank rates"
  status=1
fi
train 2 --epochs 1 --save "$work/resumed" >/dev/null 2>&1 &&
  train 2 --epochs 2 --resume "$work/resumed" --save "$work/resumed" >/dev/null 2>&1 ||
  { echo "FAIL: the stopped or the resumed 2-rank run failed"; status=1; }
last="$(cd "$work/straight" && ls step-*.safetensors | tail -1)"
if [[ -n "$last" ]] && cmp -s "$work/straight/$last" "$work/resumed/$last"; then
  echo "ok: stopped after epoch 1 and resumed, the 2-rank job ends with the same $last"
else
  echo "FAIL: the resumed 2-rank job differs from the straight one at '$last'"
  status=1
fi
if out="$("$program" --data "$data" --model lenet5 --batch 32 --epochs 3 \
  --resume "$work/straight" 2>&1)"; then
  echo "FAIL: one process resumed a 2-rank checkpoint"
  status=1
elif [[ "$out" == *"ranks 2 in the checkpoint, 1 on this command line"* ]]; then
  echo "ok: one process may not resume a 2-rank checkpoint"
else
  echo "FAIL: resuming a 2-rank checkpoint alone said: $out"
  status=1
fi
exit "$status"
