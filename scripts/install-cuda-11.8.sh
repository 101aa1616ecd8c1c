#!/usr/bin/env bash
# Installs Debian's CUDA 11.8 toolkit (package nvidia-cuda-toolkit, component
# non-free), the last toolkit line that can still target the Tesla M40 (sm_52).
# Idempotent and non-interactive; adds non-free to the apt sources when missing.
#
# Also installs g++-11: Debian's nvcc calls its own g++ wrapper, which accepts
# g++ 6 to 11 only (CUDA 11.8 does not support the system's g++ 12), so without
# g++-11 every nvcc call fails unless it is given -ccbin.
set -euo pipefail

if [ -x /usr/bin/nvcc ] && /usr/bin/nvcc --version | grep -q "release 11" &&
   command -v g++-11 >/dev/null 2>&1; then
  echo "install-cuda-11.8: $(/usr/bin/nvcc --version | grep release), host compiler $(g++-11 --version | head -n 1)"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

has_non_free() {
  grep -rhsE '^(Components:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/ | grep -q 'non-free'
}

if ! has_non_free; then
  echo "install-cuda-11.8: adding the non-free component to the apt sources"
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    # deb822 format: extend every "Components: main" line.
    $SUDO sed -i -E 's/^(Components:.*\bmain\b)(.*)$/\1\2 contrib non-free/' \
      /etc/apt/sources.list.d/debian.sources
  else
    echo "deb http://deb.debian.org/debian bookworm main contrib non-free" |
      $SUDO tee /etc/apt/sources.list.d/m40-llm-non-free.list >/dev/null
  fi
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends nvidia-cuda-toolkit g++-11
/usr/bin/nvcc --version | grep release
