#!/usr/bin/env bash
# The checks of the CUDA backend that need a GPU, in one go, for the GPU machine (which has no
# compiler: build here, carry the programs). Runs the CUDA test suite, the no-device case,
# compute-sanitizer's memcheck and racecheck over the CUDA tests, mnist_train on the GPU and on
# the CPU, and fusion_bench on the GPU; writes every log and JSON file under $OUT and ends with
# a summary.
#   scripts/device_check.sh --pack DIR    (here) copies the programs and the two shared
#                                          libraries they need from build/ into DIR
#   scripts/device_check.sh DIR [EPOCHS] [quick]
#                                          (on the GPU machine) runs the checks on DIR's programs;
#                                          quick leaves out the CPU run and the sanitizers
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [[ "${1:-}" == "--pack" ]]; then
  dir="${2:?--pack needs a directory}"
  mkdir -p "$dir/lib"
  for program in tests/kiln_cuda_tests examples/mnist_train benchmarks/fusion_bench; do
    cp "$repo/build/$program" "$dir/"
  done
  for lib in libhwy.so.1 libtbb.so.12; do
    cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l { print $NF; exit }')" "$dir/lib/$lib"
  done
  strip "$dir"/kiln_cuda_tests "$dir"/mnist_train "$dir"/fusion_bench
  du -sh "$dir"
  exit 0
fi

dir="$(cd "${1:?usage: scripts/device_check.sh DIR [EPOCHS] (or --pack DIR)}" && pwd)"
epochs="${2:-3}"
quick="${3:-}"
out="${OUT:-$repo/device-check}"
mkdir -p "$out"
export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
data="$repo/data/mnist"
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
# step NAME COMMAND...: runs it with its output in $out/NAME.log; notes its exit status and time.
step() {
  local name="$1"
  shift
  local t0=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  note "$(printf '%-28s rc %-3s %4ss' "$name" "$rc" $((SECONDS - t0)))"
  return $rc
}

note "device check, $(date -u '+%Y-%m-%d %H:%M UTC')"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$summary"
# Whether cuBLAS, cuDNN and NVRTC could be used here at all (GPU.md asks).
ldconfig -p | grep -E 'libcublas|libcudnn|libnvrtc' >"$out/cuda_libraries.txt" || true
note "CUDA libraries on the library path: $(wc -l <"$out/cuda_libraries.txt")"

step cuda_tests timeout 200 "$dir/kiln_cuda_tests" --duration=true
grep -E 'test cases:|skipped' "$out/cuda_tests.log" | tee -a "$summary"
CUDA_VISIBLE_DEVICES= step no_device "$dir/kiln_cuda_tests" '--test-case=no device:*'
step mnist_cuda timeout 200 "$dir/mnist_train" --device cuda --epochs "$epochs" --data "$data" \
  --json "$out/mnist_cuda.json"
grep -E '^epoch' "$out/mnist_cuda.log" | tee -a "$summary"
if [[ -z "$quick" ]]; then
  step mnist_cpu timeout 300 "$dir/mnist_train" --device cpu --epochs "$epochs" --threads 16 \
    --data "$data" --json "$out/mnist_cpu.json"
  grep -E '^epoch' "$out/mnist_cpu.log" | tee -a "$summary"
  # The GPU's accuracy after every epoch against the CPU's, same seed and batches.
  python3 - "$out/mnist_cuda.json" "$out/mnist_cpu.json" <<'COMPARE' | tee -a "$summary"
import json, sys
gpu, cpu = (json.load(open(f))["history"] for f in sys.argv[1:3])
for g, c in zip(gpu, cpu):
    d = g["test_accuracy_percent"] - c["test_accuracy_percent"]
    print(f"epoch {g['epoch']}: cuda {g['test_accuracy_percent']:.2f}% cpu "
          f"{c['test_accuracy_percent']:.2f}% difference {d:+.2f} points "
          f"({'within' if abs(d) <= 0.5 else 'OUTSIDE'} 0.5)")
COMPARE
fi
step mnist_cuda_profile "$dir/mnist_train" --device cuda --smoke --profile --data "$data"
step fusion_bench "$dir/fusion_bench" --device cuda --threads 1 --rounds 5 --steps 20 \
  --json "$out/fusion_bench.json"
grep -E 'training step on|^all passes|^fusion off|^all off' "$out/fusion_bench.log" | tee -a "$summary"
[[ -n "$quick" ]] && exit 0
step memcheck timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 \
  "$dir/kiln_cuda_tests" '--test-case=cuda: every op harness*,cuda: a step replayed*,cuda: dropout*'
grep -E 'ERROR SUMMARY' "$out/memcheck.log" | tail -1 | tee -a "$summary"
step racecheck timeout 240 compute-sanitizer --tool racecheck --error-exitcode 9 \
  "$dir/kiln_cuda_tests" '--test-case=cuda: every op harness*'
grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$out/racecheck.log" | tail -1 | tee -a "$summary"
