#!/usr/bin/env bash
# Same seed, same thread count, same bits, on 1 and on 2 threads: two runs of 3 epochs end with
# the same checkpoint, and so do runs that stop and resume from a checkpoint, after a whole
# epoch and in the middle of one.
#   check_resume.sh MNIST_TRAIN DATA_DIR
set -euo pipefail
program="$1" data="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
status=0
for threads in 1 2; do
  dir="$work/threads$threads"
  train() {
    "$program" --data "$data" --model lenet5 --lr 0.05 --threads "$threads" --keep 100 \
      "$@" >/dev/null
  }
  train --epochs 3 --save-every 50 --save "$dir/straight"
  train --epochs 3 --save "$dir/again"
  train --epochs 1 --save "$dir/stopped"
  train --epochs 3 --resume "$dir/stopped" --save "$dir/stopped"
  mkdir "$dir/mid"
  cp "$dir/straight/step-000000050.safetensors" "$dir/mid/"
  train --epochs 3 --resume "$dir/mid" --save "$dir/mid"

  last="$(cd "$dir/straight" && ls step-*.safetensors | tail -1)"
  for run in again stopped mid; do
    if cmp -s "$dir/straight/$last" "$dir/$run/$last"; then
      echo "ok: $threads thread(s): the $run run and the straight run end with the same $last"
    else
      echo "FAIL: $threads thread(s): the $run run and the straight run differ at $last"
      status=1
    fi
  done
done

# A checkpoint resumes only the run it came from: another model, batch or training set is
# refused before any weight is read; another learning rate is allowed and said.
saved="$work/threads1/stopped"
refused() { # EXPECTED-MESSAGE ARGS...
  local expected="$1" out
  shift
  if out="$("$program" --data "$data" --epochs 4 --resume "$saved" "$@" 2>&1 >/dev/null)"; then
    echo "FAIL: resuming with $* was accepted"
    status=1
  elif [[ "$out" != *"$expected"* ]]; then
    echo "FAIL: resuming with $* said: $out"
    status=1
  else
    echo "ok: resuming with $* is refused: $expected"
  fi
}
refused "model lenet5 in the checkpoint, mnist_cnn on this command line" --model mnist_cnn
refused "batch 64 in the checkpoint, 32 on this command line" --model lenet5 --batch 32
note="$("$program" --data "$data" --model lenet5 --lr 0.02 --epochs 4 --resume "$saved" \
  --threads 1 2>&1 >/dev/null)"
if [[ "$note" == *"note: resuming with lr 0.05 in the checkpoint, 0.02"* ]]; then
  echo "ok: resuming with another learning rate says so"
else
  echo "FAIL: resuming with another learning rate said: $note"
  status=1
fi
exit "$status"
