#!/usr/bin/env bash
# Fuzzes the GGUF reader with libFuzzer (clang, ASan + UBSan) for a bounded
# time and fails if the fuzzer finds a crash, a sanitizer report, a timeout or
# an out-of-memory input:
#
#   bash scripts/fuzz.sh [SECONDS]     (default: $M40_FUZZ_SECONDS or 60)
#
# Build folder build-fuzz/ (or $M40_FUZZ_BUILD_DIR). Seeds: small valid
# copies, header-only cuts and the first MAX_LEN bytes of every .gguf under
# ../shared/models, plus fuzz/regressions/ (inputs that once crashed: add
# every fixed crash there). The corpus the fuzzer grows stays in
# build-fuzz/corpus/ for the next run; a crashing input is saved under
# build-fuzz/artifacts/ and reproduced with
#   build-fuzz/fuzz/fuzz_gguf_reader build-fuzz/artifacts/crash-...
#
#   M40_FUZZ_MAX_LEN   largest input in bytes (default 16384)
#   M40_FUZZ_FORK      parallel fuzzing processes (-fork=N; default: 1 process)
#   M40_FUZZ_ARGS      more libFuzzer flags
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$M40_ROOT"

seconds=${1:-${M40_FUZZ_SECONDS:-60}}
max_len=${M40_FUZZ_MAX_LEN:-16384}
build_dir=$(m40_abs "${M40_FUZZ_BUILD_DIR:-build-fuzz}")
m40_require_shared

m40_log "fuzz: installing dependencies (clang, libFuzzer)"
bash scripts/install-deps.sh

mapfile -t common_args < <(m40_cmake_common_args "$build_dir")
m40_log "fuzz: configuring $build_dir"
# RelWithDebInfo without -DNDEBUG: optimized, with symbols and assertions.
CC=clang CXX=clang++ cmake -S "$M40_ROOT" -B "$build_dir" "${common_args[@]}" \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g" \
  -DM40_FUZZ=ON -DM40_CUDA=OFF -DM40_BUILD_TESTS=OFF -DM40_BUILD_BENCH=OFF -DM40_SANITIZE=OFF

m40_log "fuzz: building"
cmake --build "$build_dir" --target fuzz_gguf_reader fuzz_make_seeds -j "$M40_JOBS"
fuzzer="$build_dir/fuzz/fuzz_gguf_reader"

m40_log "fuzz: seed corpus and dictionary from $M40_SHARED_DIR/models"
seeds="$build_dir/seeds"
rm -rf "$seeds"
mkdir -p "$seeds" "$build_dir/corpus" "$build_dir/artifacts"
dict="$build_dir/gguf.dict"
cp fuzz/gguf.dict "$dict"
mapfile -t models < <(find -L "$M40_SHARED_DIR/models" -name '*.gguf' -type f | sort)
[ ${#models[@]} -gt 0 ] || m40_die "no .gguf file under $M40_SHARED_DIR/models"
"$build_dir/fuzz/fuzz_make_seeds" "$seeds" "$max_len" "$dict" "${models[@]}"
for m in "${models[@]}"; do
  # The start of each real file: whole when small, cut to max_len otherwise.
  head -c "$max_len" "$m" >"$seeds/$(basename "$m" .gguf).head"
done
if [ -d fuzz/regressions ]; then
  find fuzz/regressions -type f ! -name '*.md' -exec cp {} "$seeds/" \;
fi
echo "fuzz: $(find "$seeds" -type f | wc -l) seeds, $(grep -c '^[^#]' "$dict") dictionary words"

fork_args=()
if [ "${M40_FUZZ_FORK:-1}" -gt 1 ]; then
  fork_args=(-fork="$M40_FUZZ_FORK" -ignore_crashes=0 -ignore_timeouts=0 -ignore_ooms=0)
fi
# shellcheck disable=SC2206
extra_args=(${M40_FUZZ_ARGS:-})

m40_log "fuzz: running fuzz_gguf_reader for $seconds s"
log="$build_dir/fuzz.log"
set +e
# The full log keeps every line; the screen is spared the "NEW"/"REDUCE" ones.
"$fuzzer" -max_total_time="$seconds" -max_len="$max_len" -timeout=10 -rss_limit_mb=2048 \
  -dict="$dict" -artifact_prefix="$build_dir/artifacts/" -print_final_stats=1 -print_funcs=0 \
  "${fork_args[@]}" "${extra_args[@]}" "$build_dir/corpus" "$seeds" 2>&1 |
  tee "$log" | grep --line-buffered -vE '^#[0-9]+[[:space:]]+(NEW|REDUCE) '
rc=${PIPESTATUS[0]}
set -e

stats=$(grep -E '^#[0-9]+\s+(DONE|pulse|NEW|REDUCE)' "$log" | tail -n 1 || true)
execs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}' | tail -n 1)
speed=$(grep -E '^stat::average_exec_per_sec' "$log" | awk '{print $2}' | tail -n 1)
echo "fuzz: last status: ${stats:-none}"
echo "fuzz: ${execs:-?} inputs run, ${speed:-?} per second, corpus $(find "$build_dir/corpus" -type f | wc -l) files"
if [ "$rc" != 0 ]; then
  echo "fuzz: FAILED (libFuzzer exit status $rc); reproducer(s):"
  find "$build_dir/artifacts" -type f -newer "$dict" -printf '  %p\n'
  echo "  reproduce: $fuzzer <file>; once fixed, copy the file into fuzz/regressions/"
  exit 1
fi
echo "fuzz: no crash in $seconds s"
