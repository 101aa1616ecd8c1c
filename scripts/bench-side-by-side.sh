#!/usr/bin/env bash
# Decode and prompt speed of m40-llm and llama.cpp on the same GGUF files, in
# one run on one GPU: writes real-shaped models with `m40-llm gen-model`
# (random weights), runs `m40-llm bench` and `llama-bench` on each, and
# prints one markdown table (also DIR/side-by-side.md).
#
#   bash scripts/bench-side-by-side.sh --m40 BIN --out DIR [--llama-bench BIN | --llama-tar TAR]
#        [--models DIR] [--case SHAPE:TYPE:TOKENIZER]... [-n 128] [-p 512] [-r 3] [-b "8 32"]
#        [-d "4096 8192"] [--kv-type f16|q8_0]
#
#   --m40 BIN          the m40-llm binary to measure
#   --llama-bench BIN  llama.cpp's llama-bench; or
#   --llama-tar TAR    llama.cpp's source tarball (../shared/peers), built here
#                      for this GPU's architecture (about 4 minutes on 16 cores)
#   --models DIR       where the generated models go (default /tmp/m40-side-models),
#                      reused when present
#   --case S:T:V       gen-model shape S, type T, tokenizer GGUF V (a vocabulary
#                      file: the models' vocabulary and output head size);
#                      default: the Llama-2-7B Q4_K_M baseline only
#   -b "B..."          also decode B sequences at once: `m40-llm bench -b B`
#                      against llama-batched-bench's S_TG (-npp 128 -ntg N,
#                      built beside llama-bench; needs --llama-tar or
#                      --llama-batched-bench BIN)
#   --llama-batched-bench BIN  llama.cpp's llama-batched-bench
#   -d "D..."          also decode at these depths (positions already cached):
#                      `m40-llm bench -d 0 D...` against `llama-bench -d 0,D...`,
#                      a tg column and ratio per depth
#   --kv-type T        KV cache type of both (f16 default, q8_0): m40-llm's
#                      --kv-type, llama.cpp's -ctk T -ctv T
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$M40_ROOT"

m40="" llama_bench="" llama_batched="" llama_tar="" out="" models=/tmp/m40-side-models n=128 p=512 r=3 batches=""
depths="" kv_type=f16
cases=()
while [ $# -gt 0 ]; do
  case "$1" in
    --m40) m40=$2; shift 2 ;;
    --llama-bench) llama_bench=$2; shift 2 ;;
    --llama-batched-bench) llama_batched=$2; shift 2 ;;
    -b) batches=$2; shift 2 ;;
    -d) depths=$2; shift 2 ;;
    --kv-type) kv_type=$2; shift 2 ;;
    --llama-tar) llama_tar=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --case) cases+=("$2"); shift 2 ;;
    -n) n=$2; shift 2 ;;
    -p) p=$2; shift 2 ;;
    -r) r=$2; shift 2 ;;
    -h | --help) sed -n '2,32p' "$0"; exit 0 ;;
    *) m40_die "unknown argument $1 (see --help)" ;;
  esac
done
[ -n "$m40" ] && [ -n "$out" ] || m40_die "--m40 BIN and --out DIR are required (see --help)"
[ ${#cases[@]} -gt 0 ] || cases=("llama2-7b:q4_k_m:$M40_SHARED_DIR/models/llama-2-tiny-random.gguf")
mkdir -p "$out" "$models"
out=$(cd "$out" && pwd)

# llama.cpp builds in the background while the models are written.
build_pid=""
if [ -z "$llama_bench" ]; then
  [ -n "$llama_tar" ] || m40_die "give --llama-bench or --llama-tar"
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
  src=/tmp/llama-side && mkdir -p "$src" && tar xJf "$llama_tar" -C "$src"
  m40_log "building llama-bench for sm_$arch (log: $out/llama-build.log)"
  { cmake -S "$src/llama.cpp" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="$arch" -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF &&
    cmake --build "$src/build" -j "$(nproc)" --target llama-bench llama-batched-bench; } > "$out/llama-build.log" 2>&1 &
  build_pid=$!
fi

for c in "${cases[@]}"; do
  IFS=: read -r shape type vocab <<< "$c"
  file="$models/$shape-$type.gguf"
  [ -f "$file" ] && continue
  m40_log "gen-model $file"
  "$m40" gen-model "$file" --shape "$shape" --type "$type" --tokenizer-from "$vocab" >> "$out/gen-model.log" 2>&1 ||
    { rm -f "$file"; echo "gen-model $shape $type failed" >&2; }
done

if [ -n "$build_pid" ]; then
  wait "$build_pid" || m40_die "llama.cpp did not build ($out/llama-build.log)"
  llama_bench=$(find "$src/build" -name llama-bench -type f -perm -u+x | head -n 1)
  llama_batched=$(find "$src/build" -name llama-batched-bench -type f -perm -u+x | head -n 1)
fi
[ -z "$batches" ] || [ -n "$llama_batched" ] || m40_die "-b needs --llama-tar or --llama-batched-bench"

table="$out/side-by-side.md"
{
  echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)"
  echo
  header="| model | file | m40-llm pp$p | llama.cpp pp$p | m40-llm tg$n | llama.cpp tg$n | tg ratio |"
  rule="| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
  for b in $batches; do
    header="$header m40-llm tg$n@$b | llama.cpp tg$n@$b | ratio @$b |"
    rule="$rule ---: | ---: | ---: |"
  done
  for d in $depths; do
    header="$header m40-llm tg$n @ d$d | llama.cpp tg$n @ d$d | ratio @ d$d |"
    rule="$rule ---: | ---: | ---: |"
  done
  echo "KV cache: $kv_type"
  echo
  echo "$header"
  echo "$rule"
} > "$table"

# The t/s column of a markdown row whose test column is $2 (m40-llm's and
# llama-bench's tables both end with "| test | t/s |").
tps() { grep -E "\| *$2 *\|" "$1" | head -n 1 | awk -F'|' '{print $(NF-1)}' | sed 's/±.*//' | tr -d ' '; }
# llama-batched-bench's S_TG (generation t/s over all sequences) in the row of
# B = $2 ("|  PP |  TG |  B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | ...").
batched_tps() { awk -F'|' -v b="$2" 'NF > 9 && $4 + 0 == b && $2 ~ /[0-9]/ { gsub(/ /, "", $9); print $9; exit }' "$1"; }
ratio_of() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "?" }'; }

for c in "${cases[@]}"; do
  IFS=: read -r shape type vocab <<< "$c"
  file="$models/$shape-$type.gguf"
  [ -f "$file" ] || { echo "| $shape $type | gen-model failed | | | | | |" >> "$table"; continue; }
  m40_log "bench $shape $type"
  # shellcheck disable=SC2086 # $batches, $depths: lists of numbers
  "$m40" bench "$file" -p "$p" -n "$n" -b 1 $batches -r "$r" --kv-type "$kv_type" \
    ${depths:+-d 0 $depths} > "$out/m40-$shape-$type.md" 2>&1
  "$llama_bench" -m "$file" -ngl 99 -fa 1 -p "$p" -n "$n" -r "$r" -ctk "$kv_type" -ctv "$kv_type" \
    ${depths:+-d "0,$(echo "$depths" | tr ' ' ',')"} > "$out/llama-$shape-$type.md" 2>&1
  m_pp=$(tps "$out/m40-$shape-$type.md" "pp$p") m_tg=$(tps "$out/m40-$shape-$type.md" "tg$n")
  l_pp=$(tps "$out/llama-$shape-$type.md" "pp$p") l_tg=$(tps "$out/llama-$shape-$type.md" "tg$n")
  size=$(awk -v s="$(stat -c %s "$file")" 'BEGIN { printf "%.2f GiB", s / 1073741824 }')
  row="| $shape $type | $size | ${m_pp:-?} | ${l_pp:-?} | ${m_tg:-?} | ${l_tg:-?} | $(ratio_of "$m_tg" "$l_tg") |"
  if [ -n "$batches" ]; then
    "$llama_batched" -m "$file" -ngl 99 -fa on -c $(( (128 + n) * 64 )) -npp 128 -ntg "$n" \
      -npl "$(echo "$batches" | tr ' ' ',')" > "$out/llama-batched-$shape-$type.md" 2>&1
    for b in $batches; do
      m_b=$(tps "$out/m40-$shape-$type.md" "tg$n@$b") l_b=$(batched_tps "$out/llama-batched-$shape-$type.md" "$b")
      row="$row ${m_b:-?} | ${l_b:-?} | $(ratio_of "$m_b" "$l_b") |"
    done
  fi
  for d in $depths; do
    m_d=$(tps "$out/m40-$shape-$type.md" "tg$n @ d$d") l_d=$(tps "$out/llama-$shape-$type.md" "tg$n @ d$d")
    row="$row ${m_d:-?} | ${l_d:-?} | $(ratio_of "$m_d" "$l_d") |"
  done
  echo "$row" >> "$table"
done
cat "$table"
