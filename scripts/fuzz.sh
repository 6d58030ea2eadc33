#!/usr/bin/env bash
# Builds kiln's libFuzzer harnesses (fuzz/: the IDX reader and the checkpoint reader) with
# clang, AddressSanitizer and UndefinedBehaviorSanitizer, and runs each for SECONDS (default
# 600), both at once. The corpus grows in BUILD/corpus from the seeds fuzz/write_seeds.cpp
# writes; a crash, leak, hang or sanitizer report is kept in BUILD/findings and fails the run.
#   scripts/fuzz.sh [SECONDS] [BUILD]        BUILD defaults to build-fuzz
# Exits 77 (a skip under ctest) when clang++ is missing.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-600}"
build="${2:-$repo/build-fuzz}"
harnesses=(idx_reader checkpoint_reader)
if ! command -v clang++ >/dev/null; then
  echo "skipped: clang++ is not installed (Debian package clang), so the fuzzers cannot be built"
  exit 77
fi
mkdir -p "$build/findings"
flags=(-std=c++20 -O1 -g -I"$repo/include" -I"$repo/fuzz")
sources=("$repo"/fuzz/* "$repo"/include/kiln/data/*.hpp "$repo"/include/kiln/train/*.hpp
  "$repo"/include/kiln/core/*.hpp)
# Rebuilt only when a source is newer than what was built.
stale() { [[ ! -x "$1" ]] || [[ -n "$(find "${sources[@]}" -newer "$1" -print -quit)" ]]; }
for h in "${harnesses[@]}"; do
  if stale "$build/$h"; then
    clang++ "${flags[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
      "$repo/fuzz/$h.cpp" -lz -o "$build/$h"
  fi
done
if stale "$build/write_seeds"; then
  clang++ "${flags[@]}" "$repo/fuzz/write_seeds.cpp" -lz -o "$build/write_seeds"
fi
rm -rf "$build/seeds"
"$build/write_seeds" "$build/seeds"

declare -A seeds=([idx_reader]=idx [checkpoint_reader]=checkpoint)
pids=()
for h in "${harnesses[@]}"; do
  mkdir -p "$build/corpus/$h"
  # -timeout: an input that takes a second is a hang; -rss_limit_mb: a reader must not need
  # more than its caps allow.
  "$build/$h" -max_total_time="$seconds" -timeout=1 -rss_limit_mb=1024 -print_final_stats=1 \
    -artifact_prefix="$build/findings/$h-" "$build/corpus/$h" "$build/seeds/${seeds[$h]}" \
    >"$build/$h.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!harnesses[@]}"; do
  h="${harnesses[$i]}"
  if wait "${pids[$i]}"; then
    runs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$build/$h.log")
    corpus=$(find "$build/corpus/$h" -type f | wc -l)
    echo "ok: $h: ${runs} inputs in ${seconds} s without a finding (corpus: ${corpus} files)"
  else
    echo "FAIL: $h found a bug; its input is in $build/findings, its log ends:"
    tail -30 "$build/$h.log"
    status=1
  fi
done
exit "$status"
