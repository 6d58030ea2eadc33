#!/usr/bin/env bash
# Installs the Debian packages kiln needs that are missing (as root), or prints the exact
# apt-get line to run (otherwise). Usage: scripts/install_deps.sh [extra packages...]
set -euo pipefail

missing=()
# Tools count as present when their command exists, however they were installed (a Node.js
# from another source brings its own npm, which Debian's npm package would conflict with).
declare -A tool_package=([g++]=g++ [cmake]=cmake [make]=make [git]=git [node]=nodejs [npm]=npm
  [python3]=python3 [pkg-config]=pkg-config [dot]=graphviz [gnuplot]=gnuplot-nox [doxygen]=doxygen)
for tool in "${!tool_package[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("${tool_package[$tool]}")
done
for p in libhwy-dev libtbb-dev libeigen3-dev zlib1g-dev doctest-dev libbenchmark-dev libcli11-dev \
  nlohmann-json3-dev "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

line="apt-get install -y --no-install-recommends ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
  echo "kiln needs these Debian packages; run as root:" >&2
  echo "  apt-get update && ${line}" >&2
  exit 1
fi
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends ${missing[*]} >/dev/null
