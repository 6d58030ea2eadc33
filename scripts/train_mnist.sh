#!/usr/bin/env bash
# The README's first command: installs what is missing, fetches MNIST, builds, and trains the
# default CNN with examples/mnist_train. Extra arguments go to mnist_train, e.g.
#   scripts/train_mnist.sh --epochs 3 --threads 2
#   scripts/train_mnist.sh --data /usr/share/datasets/fashion-mnist
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
extra=()
[[ " $* " == *fashion-mnist* ]] && extra+=(dataset-fashion-mnist)
scripts/install_deps.sh "${extra[@]}"
scripts/fetch_mnist.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build build --target mnist_train -j "$(nproc)"
exec build/examples/mnist_train "$@"
