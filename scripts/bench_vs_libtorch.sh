#!/usr/bin/env bash
# kiln against libtorch: installs libtorch-dev and OpenBLAS (as root; otherwise prints the
# apt-get line), builds benchmarks/vs_libtorch and accuracy_vs_libtorch in build/ and runs
# vs_libtorch. Extra arguments go to vs_libtorch, e.g. --threads 1. Without OpenBLAS, libtorch's matmuls run on the reference
# BLAS that libblas3 installs, several times slower than a libtorch user would see.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
scripts/install_deps.sh libtorch-dev libopenblas0-pthread
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target vs_libtorch accuracy_vs_libtorch
exec build/benchmarks/vs_libtorch "$@"
