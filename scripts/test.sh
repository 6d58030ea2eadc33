#!/usr/bin/env bash
# The README's second command: installs what is missing, fetches MNIST, builds everything
# and runs the whole test suite. Its last line reads "N passed, N failed", followed by
# ", N skipped" when a test's data or hardware was missing.
#   scripts/test.sh              Release build in build/
#   scripts/test.sh --sanitize   AddressSanitizer + UndefinedBehaviorSanitizer build in build-asan/
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
build=build
# Every switch is given, so that a build directory configured by another command (train_mnist.sh
# turns the tests off) runs the whole suite.
flags=(-DCMAKE_BUILD_TYPE=Release -DKILN_SANITIZE=OFF -DKILN_BUILD_TESTS=ON -DKILN_BUILD_EXAMPLES=ON
  -DKILN_BUILD_BENCHMARKS=ON -DKILN_CUDA=AUTO -DKILN_MPI=AUTO)
if [[ "${1:-}" == "--sanitize" ]]; then
  build=build-asan
  # The CUDA kernels are compiled and their tests run in the Release build; nvcc's host code is
  # not instrumented.
  # Open MPI's own allocations would drown LeakSanitizer's report; this build instead checks
  # that --distributed without MPI is a clear error.
  flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_SANITIZE=ON -DKILN_BUILD_TESTS=ON
    -DKILN_BUILD_EXAMPLES=ON -DKILN_BUILD_BENCHMARKS=OFF -DKILN_CUDA=OFF -DKILN_MPI=OFF)
fi
# clang and its runtime libraries build the fuzzers (scripts/fuzz.sh) that the suite runs; Open
# MPI runs the data-parallel tests across processes.
scripts/install_deps.sh dataset-fashion-mnist clang libclang-rt-14-dev libopenmpi-dev openmpi-bin
scripts/fetch_mnist.sh
cmake -S . -B "$build" "${flags[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)"
log="$build/ctest.log"
status=0
(cd "$build" && ctest --output-on-failure --timeout 900) 2>&1 | tee "$log" || status=$?
summary=$(grep -E '[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -1 || true)
if [[ -z "$summary" ]]; then
  echo "0 passed, 1 failed"
  exit 1
fi
failed=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/' <<<"$summary")
total=$(sed -E 's/.* failed out of ([0-9]+).*/\1/' <<<"$summary")
# ctest counts a skipped test among the passed ones.
skipped=$(grep -cE '^[[:space:]]+[0-9]+ - .* \(Skipped\)$' "$log" || true)
line="$((total - failed - skipped)) passed, ${failed} failed"
[[ "$skipped" -gt 0 ]] && line+=", ${skipped} skipped"
echo "$line"
exit "$status"
