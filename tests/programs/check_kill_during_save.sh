#!/usr/bin/env bash
# A kill -9 at random moments during checkpoint saves never leaves a checkpoint that does not
# load: each round starts `STRESS write DIR` (saving steps 1, 2, ... over one file), waits for
# its first save, kills it 0-40 ms later and runs `STRESS check DIR`, which must load the file
# and find every element as the step it names wrote it. The folder is kept from round to round,
# so every load runs beside the temporary file a killed save left behind, and every writer's
# first save must remove it.
#   check_kill_during_save.sh STRESS_PROGRAM [ROUNDS=200]
set -euo pipefail
program="$1" rounds="${2:-200}"
work="$(mktemp -d)"
writer=""
cleanup() {
  if [[ -n "$writer" ]]; then kill -9 "$writer" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
dir="$work/checkpoints"
mkdir "$dir"
fifo="$work/stdout"
mkfifo "$fifo"

failures=0 mid_save=0 highest=0
declare -A steps=()
for ((round = 1; round <= rounds; ++round)); do
  "$program" write "$dir" >"$fifo" 2>&1 &
  writer=$!
  exec 3<"$fifo"
  line=""
  read -r -t 10 -u 3 line || true
  if [[ "$line" != saved ]]; then
    echo "FAIL: round $round: the writer did not print \"saved\" (it ended, or took over 10 s): $line"
    kill -9 "$writer" 2>/dev/null || true
    wait "$writer" 2>/dev/null || true
    writer=""
    exec 3<&-
    failures=$((failures + 1))
    continue
  fi
  sleep "0.0$(printf '%02d' $((RANDOM % 41)))"
  kill -9 "$writer"
  wait "$writer" 2>/dev/null || true
  pid=$writer writer=""
  exec 3<&-

  # save_checkpoint writes DIR/.checkpoint.safetensors.tmp<pid>.<n> and renames it into place,
  # so a temporary file of this writer's means the kill landed between its open and its rename.
  # Each save first removes those whose process is gone, so the killed writer's first save
  # removed the one the writer before it left: only this writer's may remain, one at most.
  shopt -s nullglob dotglob
  temporaries=("$dir"/.checkpoint.safetensors.tmp*)
  shopt -u nullglob dotglob
  ours=0
  for t in "${temporaries[@]}"; do
    if [[ "$t" == "$dir/.checkpoint.safetensors.tmp$pid."* ]]; then
      ours=$((ours + 1))
    else
      echo "FAIL: round $round: $(basename "$t") was left by an earlier writer"
      failures=$((failures + 1))
    fi
  done
  if ((ours > 1)); then
    echo "FAIL: round $round: the killed writer left $ours temporary files"
    failures=$((failures + 1))
  fi
  mid_save=$((mid_save + ours))

  if output="$("$program" check "$dir" 2>&1)"; then
    step="${output#ok step }"
    steps[$step]=1
    if ((step > highest)); then highest=$step; fi
  else
    echo "FAIL: round $round: $output"
    failures=$((failures + 1))
  fi
done

if ((failures > 0)); then
  echo "FAIL: $failures of $rounds rounds failed ($mid_save kills landed inside a save)"
  exit 1
fi
echo "ok: $rounds kills during saves, every checkpoint loaded (steps up to $highest," \
  "${#steps[@]} distinct; $mid_save kills left a temporary file, so landed inside a save)"
