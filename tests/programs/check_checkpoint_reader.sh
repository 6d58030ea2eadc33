#!/usr/bin/env bash
# A kiln checkpoint is readable without kiln: scripts/checkpoint_logits.py (Python's standard
# library only) parses the safetensors file and the IDX images itself and gives the same logits
# as kiln (checkpoint_logits), within |a-b| <= 1e-4 * max(1, |b|), for lenet5 after one epoch
# on 8 test images and for mnist_cnn after the smoke run's 100 steps on 2.
#   check_checkpoint_reader.sh MNIST_TRAIN CHECKPOINT_LOGITS DATA_DIR
set -euo pipefail
program="$1" kiln_reader="$2" data="$3"
python_reader="$(cd "$(dirname "$0")/../../scripts" && pwd)/checkpoint_logits.py"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
status=0

# compare MODEL COUNT KILN_FILE PYTHON_FILE: every logit, and the shape of both outputs.
compare() {
  python3 - "$@" <<'EOF' || status=1
import sys

model, count, kiln_file, python_file = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
tables = {}
for who, path in (("kiln", kiln_file), ("python", python_file)):
    lines = open(path).read().splitlines()
    if len(lines) != count:
        print(f"FAIL: {model}: the {who} reader printed {len(lines)} lines, expected {count}")
        sys.exit(1)
    rows = [line.split() for line in lines]
    for i, row in enumerate(rows):
        if len(row) != 10:
            print(f"FAIL: {model}: the {who} reader's line {i + 1} holds {len(row)} numbers, not 10")
            sys.exit(1)
    tables[who] = [[float(v) for v in row] for row in rows]
bad = worst = 0
for i in range(count):
    for c in range(10):
        a, b = tables["kiln"][i][c], tables["python"][i][c]
        worst = max(worst, abs(a - b))
        if not abs(a - b) <= 1e-4 * max(1.0, abs(b)):
            print(f"FAIL: {model}: image {i} class {c}: kiln {a:.9g}, python {b:.9g}")
            bad += 1
if bad:
    sys.exit(1)
print(f"ok: {model}: {count} images x 10 classes agree (max |kiln - python| {worst:.3g})")
EOF
}

# check MODEL COUNT TRAINING_FLAGS...: trains, then reads the checkpoint both ways.
check() {
  local model="$1" count="$2"
  shift 2
  "$program" --data "$data" --model "$model" --threads 2 --save "$work/$model" "$@" >/dev/null
  local found=("$work/$model"/step-*.safetensors)
  local checkpoint="${found[-1]}"
  "$kiln_reader" "$checkpoint" "$data" "$model" "$count" >"$work/$model.kiln" ||
    { echo "FAIL: $model: the kiln reader failed"; exit 1; }
  "$python_reader" "$checkpoint" "$data" "$model" "$count" >"$work/$model.python" ||
    { echo "FAIL: $model: the python reader failed"; exit 1; }
  compare "$model" "$count" "$work/$model.kiln" "$work/$model.python"
}

check lenet5 8 --epochs 1 --lr 0.05
check mnist_cnn 2 --smoke
exit "$status"
