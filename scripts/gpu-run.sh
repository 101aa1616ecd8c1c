#!/usr/bin/env bash
# One GPU run: builds m40-llm for a GPU architecture, runs the GPU tests and
# the benchmarks, and writes a short table (summary.md) plus the full logs to
# a folder.
#
#   bash scripts/gpu-run.sh --out DIR [--arch N] [--bin DIR] [--sanitize] [--quick]
#
#   --out DIR     where summary.md and the logs go (created)
#   --arch N      the CUDA architecture to build for (default: the GPU's own,
#                 from nvidia-smi). 52 builds sm_52 code and compute_52 PTX
#                 only (CUDA 11.8 from /usr/bin; the sm_52 gate's binary
#                 without its machine code for newer GPUs): on a newer GPU
#                 it runs through the driver's PTX compilation, the path
#                 a GPU newer than sm_90 takes.
#   --bin DIR     skip the build: DIR holds m40-llm, test_cuda and the
#                 bench_cuda_* programs built elsewhere (a machine without
#                 the build dependencies)
#   --sanitize    also run test_cuda under compute-sanitizer (memcheck and
#                 racecheck) on the kernel tests
#   --quick       skip the 7B-shaped end-to-end benchmarks (and, on two or
#                 more GPUs, the 70B-shaped Q4_K_M split by layers and by
#                 rows over GPUs 0 and 1 under --vram 24G each)
#
# The 7B-shaped models (Llama-2-7B shape, random weights: F16, Q8_0, Q4_K_M,
# Q4_0, and the Q3_K_M, Q2_K and IQ4_XS mixes that fit larger models on a
# 24 GB card) are written by `m40-llm gen-model` into $M40_GPU_MODELS (default
# /tmp/m40-gpu-models) once and reused. Shared test data: $M40_SHARED_DIR
# (default ../shared beside the checkout). Exits non-zero when a test fails.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$M40_ROOT"

out="" arch="" bin_dir="" sanitize=0 quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --arch) arch=$2; shift 2 ;;
    --bin) bin_dir=$2; shift 2 ;;
    --sanitize) sanitize=1; shift ;;
    --quick) quick=1; shift ;;
    -h | --help) sed -n '2,28p' "$0"; exit 0 ;;
    *) m40_die "unknown argument $1 (see --help)" ;;
  esac
done
[ -n "$out" ] || m40_die "--out DIR is required (see --help)"
command -v nvidia-smi >/dev/null || m40_die "no nvidia-smi: this script needs an NVIDIA GPU"
m40_require_shared
mkdir -p "$out"
out=$(cd "$out" && pwd)
summary="$out/summary.md"
failures=0

gpu_arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
arch=${arch:-$gpu_arch}
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv > "$out/gpu.txt"

# --- build --------------------------------------------------------------------
if [ -z "$bin_dir" ]; then
  build_dir="$M40_ROOT/build-gpu-$arch"
  mapfile -t common_args < <(m40_cmake_common_args "$build_dir")
  cuda_args=(-DCMAKE_CUDA_ARCHITECTURES="$arch")
  if [ "$arch" = 52 ]; then
    export PATH="/usr/bin:$PATH"
    cuda_args+=(-DCMAKE_CUDA_COMPILER=/usr/bin/nvcc
      -DCMAKE_CUDA_HOST_COMPILER="$(command -v g++-11 || command -v clang++-14)")
  elif [ -x /usr/local/cuda/bin/nvcc ]; then
    cuda_args+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
  fi
  # CUDA 11.8's nvcc leaves the header dependencies of .cu files empty here,
  # so an incremental build would keep objects compiled against old headers:
  # recompile them (ccache makes unchanged ones cheap).
  if [ "$arch" = 52 ]; then find "$build_dir" -name '*.cu.o' -delete 2>/dev/null || true; fi
  m40_log "gpu-run: building for sm_$arch in $build_dir"
  if ! { cmake -S "$M40_ROOT" -B "$build_dir" "${common_args[@]}" -DCMAKE_BUILD_TYPE=Release -DM40_CUDA=ON \
      "${cuda_args[@]}" -DM40_BUILD_TESTS=ON -DM40_BUILD_BENCH=ON &&
    cmake --build "$build_dir" -j "$M40_JOBS" --target m40-llm test_cuda bench_cuda_matmul bench_cuda_attention bench_cuda_layers \
      bench_cuda_sampling; } > "$out/build.log" 2>&1; then
    tail -n 30 "$out/build.log"
    m40_die "the build failed (log: $out/build.log)"
  fi
  bin_dir="$out/bin"
  mkdir -p "$bin_dir"
  cp "$(m40_binary "$build_dir")" "$bin_dir/m40-llm"
  for program in test_cuda bench_cuda_matmul bench_cuda_attention bench_cuda_layers bench_cuda_sampling; do
    cp "$(find "$build_dir" -name "$program" -type f -perm -u+x -not -path '*/CMakeFiles/*' | head -n 1)" "$bin_dir/"
  done
fi
bin_dir=$(cd "$bin_dir" && pwd)
m40="$bin_dir/m40-llm"

{
  echo "# GPU run: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "GPU: $(sed -n 2p "$out/gpu.txt"); code built for sm_$arch"
  echo
  echo "| step | result |"
  echo "| --- | --- |"
} > "$summary"
row() { echo "| $1 | $2 |" >> "$summary"; }

# --- tests ------------------------------------------------------------------------
m40_log "gpu-run: test_cuda"
M40_SHARED_DIR="$M40_SHARED_DIR" "$bin_dir/test_cuda" > "$out/test_cuda.log" 2>&1
status=$?
passed=$(grep -Eo '\[  PASSED  \] [0-9]+' "$out/test_cuda.log" | grep -Eo '[0-9]+$' || echo 0)
failed=$(grep -c '^\[  FAILED  \] [A-Za-z]' "$out/test_cuda.log" || true)
skipped=$(grep -Eo '\[  SKIPPED \] [0-9]+ test' "$out/test_cuda.log" | grep -Eo '[0-9]+' || echo 0)
row "test_cuda" "exit $status: ${passed:-0} passed, ${failed:-0} failed, ${skipped:-0} skipped"
[ "$status" = 0 ] || failures=$((failures + 1))

if [ "$sanitize" = 1 ]; then
  if command -v compute-sanitizer >/dev/null; then
    # The kernel tests (the engine-level ones repeat the same kernels on
    # whole models and would take long under the sanitizer).
    filter='-*CudaVsCpu*:*CudaBackend*'
    for tool in memcheck racecheck; do
      m40_log "gpu-run: compute-sanitizer --tool $tool"
      compute-sanitizer --tool "$tool" --error-exitcode 86 "$bin_dir/test_cuda" --gtest_filter="$filter" \
        > "$out/sanitizer-$tool.log" 2>&1
      status=$?
      row "compute-sanitizer $tool" "exit $status; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' \
        "$out/sanitizer-$tool.log" | tail -n 1)"
      [ "$status" = 0 ] || failures=$((failures + 1))
    done
  else
    row "compute-sanitizer" "not installed"
  fi
fi

# --- GPU against CPU, end to end ---------------------------------------------------
tiny="$M40_SHARED_DIR/models/TinyStories-656K-Q8_0.gguf"
"$m40" run "$tiny" "Once upon a time" --temperature 0 -n 48 > "$out/run_gpu.txt" 2> "$out/run_gpu.err"
"$m40" run "$tiny" "Once upon a time" --temperature 0 -n 48 --cpu > "$out/run_cpu.txt" 2> "$out/run_cpu.err"
if cmp -s "$out/run_gpu.txt" "$out/run_cpu.txt"; then
  row "greedy run, GPU vs CPU (TinyStories Q8_0, 48 tokens)" "identical"
else
  row "greedy run, GPU vs CPU (TinyStories Q8_0, 48 tokens)" "DIFFERENT (run_gpu.txt, run_cpu.txt)"
  failures=$((failures + 1))
fi

# --- kernel benchmarks --------------------------------------------------------------
for program in bench_cuda_matmul bench_cuda_attention bench_cuda_layers bench_cuda_sampling; do
  m40_log "gpu-run: $program"
  "$bin_dir/$program" > "$out/$program.md" 2>&1
  row "$program" "exit $?; see $program.md"
done
# cuBLAS SGEMM at the same shapes, the FP32 ceiling of the tiles: built here
# against this machine's CUDA (the M40 build carries no cuBLAS).
if command -v nvcc >/dev/null; then
  m40_log "gpu-run: bench_cublas_sgemm"
  if nvcc -O3 -std=c++17 -arch="sm_$gpu_arch" -I"$M40_ROOT/src" "$M40_ROOT/bench/bench_cublas_sgemm.cu" -lcublas \
      -o "$out/bench_cublas_sgemm" > "$out/bench_cublas_sgemm.build.log" 2>&1; then
    "$out/bench_cublas_sgemm" > "$out/bench_cublas_sgemm.md" 2>&1
    row bench_cublas_sgemm "exit $?; see bench_cublas_sgemm.md"
  else
    row bench_cublas_sgemm "build failed; see bench_cublas_sgemm.build.log"
  fi
fi
copy=$(grep -m1 'copy bandwidth' "$out/bench_cuda_matmul.md" | sed 's/.*: //')
row "copy bandwidth" "${copy:-?}"
while IFS= read -r line; do
  row "matvec $(echo "$line" | cut -d'|' -f2-4 | tr -s ' ')" \
    "$(echo "$line" | cut -d'|' -f7 | tr -d ' ') of copy; in a graph $(echo "$line" | cut -d'|' -f8 | tr -s ' ')"
done < <(grep -E '^\| (4096x4096|11008x4096) \| (F16|Q8_0|Q4_K|Q6_K|Q3_K|Q2_K|IQ4_XS) \| 1 \|' "$out/bench_cuda_matmul.md")

# --- 7B-shaped models end to end ----------------------------------------------------
if [ "$quick" = 0 ]; then
  models=${M40_GPU_MODELS:-/tmp/m40-gpu-models}
  mkdir -p "$models"
  : > "$out/bench_7b.md"
  for type in q4_k_m q8_0 f16 q4_0 q3_k_m q2_k iq4_xs; do
    file="$models/llama2-7b-$type.gguf"
    if [ ! -f "$file" ]; then
      m40_log "gpu-run: gen-model $file"
      "$m40" gen-model "$file" --shape llama2-7b --type "$type" \
        --tokenizer-from "$M40_SHARED_DIR/models/llama-2-tiny-random.gguf" >> "$out/gen-model.log" 2>&1 ||
        { row "gen-model $type" "failed (gen-model.log)"; failures=$((failures + 1)); continue; }
    fi
    m40_log "gpu-run: bench 7B $type"
    "$m40" bench "$file" -p 512 -n 128 -b 1 8 16 32 -r 3 >> "$out/bench_7b.md" 2>&1
    status=$?
    while IFS= read -r line; do
      row "7B $type $(echo "$line" | cut -d'|' -f7 | tr -d ' ')" "$(echo "$line" | cut -d'|' -f8 | tr -s ' ') t/s"
    done < <(grep -E "^\| llama 7B $(echo "$type" | tr 'a-z' 'A-Z') " "$out/bench_7b.md")
    [ "$status" = 0 ] || { row "bench 7B $type" "exit $status"; failures=$((failures + 1)); }
  done
  "$m40" run "$models/llama2-7b-f16.gguf" "hi" -n 1 --vram 8G > /dev/null 2> "$out/vram_refusal.txt"
  row "7B F16 with --vram 8G" "exit $?: $(tail -n 1 "$out/vram_refusal.txt" | cut -c1-150)"
fi

# --- two GPUs: a 70B-shaped Q4_K_M split by layers and by rows ----------------------
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
if [ "$quick" = 0 ] && [ "$gpus" -ge 2 ]; then
  file="$models/llama2-70b-q4_k_m.gguf"  # 38.5 GiB: two 24 GB cards
  if [ ! -f "$file" ]; then
    m40_log "gpu-run: gen-model $file"
    "$m40" gen-model "$file" --shape llama2-7b --layers 80 --embd 8192 --ff 28672 --heads 64 --kv-heads 8 --type q4_k_m \
      --tokenizer-from "$M40_SHARED_DIR/models/llama-2-tiny-random.gguf" >> "$out/gen-model.log" 2>&1 ||
      { rm -f "$file"; row "gen-model 70B" "failed (gen-model.log)"; failures=$((failures + 1)); }
  fi
  : > "$out/bench_70b.md"
  for mode in layer row; do
    [ -f "$file" ] || break
    m40_log "gpu-run: bench 70B, split by $mode"
    "$m40" bench "$file" -p 512 -n 32 -b 1 8 -r 2 --gpus 0,1 --vram 24G --split-mode "$mode" >> "$out/bench_70b.md" 2>&1
    status=$?
    while IFS= read -r line; do
      row "70B Q4_K_M split by $mode $(echo "$line" | awk -F'|' '{print $7}' | tr -d ' ')" \
        "$(echo "$line" | awk -F'|' '{print $8}' | tr -s ' ') t/s"
    done < <(grep -E "^\| llama " "$out/bench_70b.md" | grep -E "$([ "$mode" = row ] && echo 'row split' || echo 'layers')")
    [ "$status" = 0 ] || { row "bench 70B split by $mode" "exit $status"; failures=$((failures + 1)); }
  done
fi

echo >> "$summary"
echo "failures: $failures (logs in $out)" >> "$summary"
cat "$summary"
[ "$failures" = 0 ]
