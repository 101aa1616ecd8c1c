#!/usr/bin/env bash
# How long a fresh process takes to answer its first request on this GPU:
# `m40-llm run MODEL` for a few tokens, timed from start to exit, with the
# binary's machine code for this GPU and with CUDA_FORCE_PTX_JIT=1 (the
# driver compiles the PTX first, as it must for a GPU the binary has no
# machine code for). CUDA_CACHE_DISABLE=1 keeps the driver's compile cache
# out of both, so each run is a first start.
#
#   bash scripts/first-request-time.sh [--bin M40_LLM] [--runs N] MODEL
set -euo pipefail
bin=m40-llm runs=3 model=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    -h | --help) sed -n '2,9p' "$0"; exit 0 ;;
    *) model=$1; shift ;;
  esac
done
[ -n "$model" ] || { echo "usage: $0 [--bin M40_LLM] [--runs N] MODEL" >&2; exit 2; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
echo "| code | run | seconds | exit |"
echo "| --- | ---: | ---: | ---: |"
for ((i = 1; i <= runs; i++)); do
  for mode in machine-code ptx-jit; do
    env_args=(CUDA_CACHE_DISABLE=1)
    [ "$mode" = ptx-jit ] && env_args+=(CUDA_FORCE_PTX_JIT=1)
    start=$(date +%s.%N)
    rc=0
    env "${env_args[@]}" "$bin" run "$model" "Once upon a time" --raw -n 8 --temperature 0 >/dev/null 2>&1 || rc=$?
    end=$(date +%s.%N)
    echo "| $mode | $i | $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }') | $rc |"
  done
done
