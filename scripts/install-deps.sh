#!/usr/bin/env bash
# Installs every build and test dependency of m40-llm from Debian's packages.
# libboost-dev: Boost.Beast and Boost.Asio (header-only), the HTTP transport
# of `serve` (docs/server.md); zlib1g-dev: the server tests' gzip probe.
# Idempotent and non-interactive: packages already present are skipped, and
# `apt-get update` runs at most once (only when something is missing).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git ccache
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libcpp-httplib-dev
  libboost-dev zlib1g-dev
  libcurl4-openssl-dev libpcre2-dev libedit-dev libssl-dev
  clang libclang-rt-dev
)
if [ "${M40_LLM_TEST_DEPS:-0}" = 1 ]; then
  # Test-only tools: a pty driver for interactive tests and Node for the
  # official OpenAI/Ollama client tests.
  packages+=(tmux python3 nodejs)
  # NodeSource's nodejs carries its own npm (and conflicts with Debian's).
  command -v npm >/dev/null 2>&1 || packages+=(npm)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
