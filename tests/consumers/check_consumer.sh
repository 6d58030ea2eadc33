#!/usr/bin/env bash
# ctest entry: builds and runs tests/consumers/consumer.cpp in a project of its own that
# consumes kiln one way, and checks that kiln leaves the parent project alone.
#   check_consumer.sh find_package   SOURCE_DIR BUILD_DIR   (installs BUILD_DIR to a prefix)
#   check_consumer.sh add_subdirectory SOURCE_DIR
#   check_consumer.sh fetch_content  SOURCE_DIR            (clones SOURCE_DIR's HEAD commit)
#   check_consumer.sh pkg_config     SOURCE_DIR BUILD_DIR   (plain g++ with pkg-config's flags)
set -euo pipefail
way="$1"
source_dir="$2"
build_dir="${3:-}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
here="${source_dir}/tests/consumers"
jobs="$(nproc)"

install_kiln() {
  cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
  for f in lib/cmake/kiln/kilnConfig.cmake lib/cmake/kiln/kilnConfigVersion.cmake \
    lib/pkgconfig/kiln.pc lib/libkiln_cpu_kernels.a share/kiln/kiln_cpu_kernels.cpp \
    include/kiln/kiln.hpp; do
    [[ -f "$work/prefix/$f" ]] || { echo "install is missing $f"; exit 1; }
  done
}

configure_and_build() { # project dir, extra cmake arguments...
  local project="$1"
  shift
  cmake -S "$project" -B "$work/build" "$@" >"$work/configure.log" 2>&1 ||
    { cat "$work/configure.log"; exit 1; }
  cmake --build "$work/build" -j "$jobs" >"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }
}

parent_left_alone() {
  # No build type forced on the parent, and none of kiln's tests in the parent's ctest.
  grep -q '^CMAKE_BUILD_TYPE:STRING=$' "$work/build/CMakeCache.txt" ||
    { echo "kiln set the parent's CMAKE_BUILD_TYPE"; exit 1; }
  local tests
  tests="$(cd "$work/build" && ctest -N | sed -n 's/^Total Tests: //p')"
  [[ "$tests" == 0 ]] || { echo "kiln added $tests tests to the parent's ctest"; exit 1; }
  [[ ! -e "$work/build/kiln/tests" && ! -e "$work/build/_deps/kiln-build/tests" ]] ||
    { echo "kiln's tests were configured in the parent"; exit 1; }
}

case "$way" in
find_package)
  install_kiln
  configure_and_build "$here/find_package" -DCMAKE_PREFIX_PATH="$work/prefix"
  "$work/build/consumer"
  "$work/build/consumer_own_kernels"
  ;;
add_subdirectory)
  configure_and_build "$here/add_subdirectory" -DKILN_SOURCE_DIR="$source_dir"
  parent_left_alone
  "$work/build/consumer"
  ;;
fetch_content)
  tag="$(git -C "$source_dir" rev-parse HEAD)"
  if [[ -n "$(git -C "$source_dir" status --porcelain --untracked-files=no)" ]]; then
    echo "note: FetchContent builds the commit $tag, not the uncommitted changes"
  fi
  configure_and_build "$here/fetch_content" -DKILN_GIT_REPOSITORY="$source_dir" -DKILN_GIT_TAG="$tag"
  parent_left_alone
  "$work/build/consumer"
  ;;
pkg_config)
  install_kiln
  export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig"
  # shellcheck disable=SC2046
  g++ -O2 "$here/consumer.cpp" -o "$work/consumer" $(pkg-config --cflags --libs kiln)
  "$work/consumer"
  ;;
*)
  echo "unknown way '$way' (find_package, add_subdirectory, fetch_content or pkg_config)"
  exit 2
  ;;
esac
