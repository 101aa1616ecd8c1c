# shellcheck shell=bash
# Shared helpers for the scripts in this folder. Source it, don't run it.
#
# Environment read by the scripts (all optional):
#   M40_SHARED_DIR   the shared test data (default: ../shared beside the checkout)
#   M40_BUILD_DIR    the main build folder (default: build)
#   M40_CMAKE_ARGS   extra arguments for the main build's configure step
#   M40_JOBS         parallel build jobs (default: nproc)
#   M40_CCACHE=0     do not use ccache even when it is installed

M40_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
M40_SHARED_DIR=${M40_SHARED_DIR:-$M40_ROOT/../shared}
M40_BUILD_DIR=${M40_BUILD_DIR:-build}
M40_JOBS=${M40_JOBS:-$(nproc 2>/dev/null || echo 2)}

m40_log() { printf '\n==> %s\n' "$*"; }
m40_die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# A folder relative to the checkout, or absolute as given.
m40_abs() {
  case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$M40_ROOT/$1" ;; esac
}

# Prints the cmake arguments that every configure step shares: Ninja for a new
# build folder (an existing one keeps the generator it was made with) and
# ccache as the compiler launcher when it is installed. ccache also replays a
# compiler's messages, so the sm_52 gate sees ptxas' report on a cache hit.
m40_cmake_common_args() {
  local dir=$1
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    printf '%s\n' -G Ninja
  fi
  if [ "${M40_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null 2>&1; then
    printf '%s\n' -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
      -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache
  else
    # A cache made with ccache must forget it when ccache is switched off.
    printf '%s\n' -UCMAKE_C_COMPILER_LAUNCHER -UCMAKE_CXX_COMPILER_LAUNCHER \
      -UCMAKE_CUDA_COMPILER_LAUNCHER
  fi
}

# Paths in compiler command lines are hashed relative to the checkout, so
# build/, build-sm52/ and a fresh clone elsewhere share cache entries.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$M40_ROOT}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}

m40_require_shared() {
  [ -d "$M40_SHARED_DIR/models" ] ||
    m40_die "shared test data not found at $M40_SHARED_DIR (expected ../shared beside the checkout; set M40_SHARED_DIR)"
}

# The m40-llm binary of a build folder: build/m40-llm, or wherever the
# project's CMake put it (build/src/cli/m40-llm).
m40_binary() {
  local dir=$1 bin
  for bin in "$dir/m40-llm" "$dir/src/cli/m40-llm"; do
    if [ -x "$bin" ] && [ -f "$bin" ]; then printf '%s\n' "$bin"; return 0; fi
  done
  bin=$(find "$dir" -name m40-llm -type f -perm -u+x -not -path '*/CMakeFiles/*' 2>/dev/null | head -n 1)
  [ -n "$bin" ] || m40_die "no m40-llm binary under $dir"
  printf '%s\n' "$bin"
}
