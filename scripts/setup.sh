#!/usr/bin/env bash
# Installs the dependencies (Debian packages), then configures and builds
# m40-llm in Release with Ninja into build/ (or $M40_BUILD_DIR).
#
#   bash scripts/setup.sh [extra cmake configure arguments...]
#
# Extra arguments (and $M40_CMAKE_ARGS) go to the configure step, e.g.
#   bash scripts/setup.sh -DM40_CUDA=OFF
#   bash scripts/setup.sh -DCMAKE_CUDA_ARCHITECTURES=90
# The CUDA backend is built when a CUDA toolkit is found; /usr/local/cuda
# (the newest toolkit, sm_75 and up) is preferred over Debian's CUDA 11.8 in
# /usr/bin, which scripts/sm52-gate.sh uses for the Tesla M40 build.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$M40_ROOT"

m40_log "installing dependencies"
bash scripts/install-deps.sh

if [ -z "${CUDACXX:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi

build_dir=$(m40_abs "$M40_BUILD_DIR")
mapfile -t common_args < <(m40_cmake_common_args "$build_dir")
# shellcheck disable=SC2206  # M40_CMAKE_ARGS is split on spaces on purpose
extra_args=(${M40_CMAKE_ARGS:-})

m40_log "configuring $build_dir"
cmake -S "$M40_ROOT" -B "$build_dir" "${common_args[@]}" \
  -DCMAKE_BUILD_TYPE=Release "${extra_args[@]}" "$@"

m40_log "building $build_dir with $M40_JOBS jobs"
start=$SECONDS
cmake --build "$build_dir" -j "$M40_JOBS"
echo "setup: build finished in $((SECONDS - start)) s"
