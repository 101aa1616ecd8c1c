#!/usr/bin/env bash
# The sm_52 gate: builds m40-llm the way a Tesla M40 build is made — CUDA
# 11.8 (Debian's nvidia-cuda-toolkit in /usr/bin), real sm_52 machine code
# plus compute_52 PTX, machine code for the newer GPUs compiled from that
# PTX (sm_60 to sm_90, so that they start without the driver compiling it),
# the CUDA runtime linked statically — and checks it:
#
#   1. every .cu is compiled with arch=compute_52,code=[compute_52,sm_52]
#      and arch=compute_52,code=[sm_60,...,sm_90], and from no other PTX;
#   2. the build succeeds; ptxas' report (-Xptxas -v) on sm_52 is printed as
#      a table, one row per kernel: registers, stack frame, spill stores and
#      loads, shared and constant memory (see docs/building.md, "The sm_52
#      gate"); the other architectures get a line each;
#   3. the binary links no CUDA shared library (no libcudart.so, libcublas,
#      libcuda.so: the runtime is static and loads the driver itself);
#   4. cuobjdump finds sm_52 ELF code and sm_52 (compute_52) PTX in it, as
#      many ELF images for each newer architecture, and no other PTX;
#   5. the binary starts on a machine without a GPU (`m40-llm --version`).
#
# Exits non-zero when any of these fails. Build folder: build-sm52/ (or
# $M40_SM52_BUILD_DIR). $M40_CUDA_HOST_COMPILER overrides nvcc's host
# compiler (default: g++-11, else clang++-14). Set M40_GATE_MAX_SPILL=N to
# also fail when a kernel spills more than N bytes on sm_52 (default: report
# only).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$M40_ROOT"

build_dir=$(m40_abs "${M40_SM52_BUILD_DIR:-build-sm52}")
report="$build_dir/sm52-kernels.txt"
# The newer GPUs that get machine code from the compute_52 PTX.
extra_sass=(60 61 70 75 80 86 89 90)
extra_codes=$(printf 'sm_%s,' "${extra_sass[@]}")
extra_codes=${extra_codes%,}
extra_alternatives=$(printf 'sm_%s|' "${extra_sass[@]}")  # sm_60|sm_61|...|sm_90
extra_alternatives=${extra_alternatives%|}

m40_log "sm52-gate: installing the build dependencies and CUDA 11.8"
bash scripts/install-deps.sh
bash scripts/install-cuda-11.8.sh

# CUDA 11.8's tools (nvcc, ptxas, cuobjdump, cu++filt) live in /usr/bin; the
# newer toolkit in /usr/local/cuda/bin must not shadow them.
export PATH="/usr/bin:$PATH"
unset CUDACXX CUDAHOSTCXX
nvcc=/usr/bin/nvcc
cuobjdump=/usr/bin/cuobjdump
demangler=$(command -v cu++filt || command -v c++filt)

host_cxx=${M40_CUDA_HOST_COMPILER:-}
if [ -z "$host_cxx" ]; then
  host_cxx=$(command -v g++-11 || command -v clang++-14 || true)
fi
[ -n "$host_cxx" ] || m40_die "no host compiler that CUDA 11.8 supports (g++-11 or clang++-14)"
echo "sm52-gate: $($nvcc --version | grep release), host compiler $host_cxx"

mapfile -t common_args < <(m40_cmake_common_args "$build_dir")
m40_log "sm52-gate: configuring $build_dir"
cmake -S "$M40_ROOT" -B "$build_dir" "${common_args[@]}" \
  -DCMAKE_BUILD_TYPE=Release \
  -DM40_CUDA=ON \
  -DCMAKE_CUDA_COMPILER="$nvcc" \
  -DCMAKE_CUDA_HOST_COMPILER="$host_cxx" \
  -DCMAKE_CUDA_ARCHITECTURES=52 \
  -DM40_CUDA_EXTRA_SASS="$(IFS=';'; echo "${extra_sass[*]}")" \
  -DCMAKE_CUDA_FLAGS="-Xptxas -v" \
  -DM40_BUILD_TESTS=OFF -DM40_BUILD_BENCH=OFF -DM40_FUZZ=OFF -DM40_SANITIZE=OFF

cuda_version=$(sed -n 's/^CMAKE_CUDA_COMPILER_VERSION:[A-Z]*=//p' "$build_dir/CMakeCache.txt" 2>/dev/null || true)
if [ -z "$cuda_version" ]; then
  cuda_version=$(grep -s 'set(CMAKE_CUDA_COMPILER_VERSION' "$build_dir"/CMakeFiles/*/CMakeCUDACompiler.cmake |
    sed -E 's/.*"([^"]*)".*/\1/' | head -n 1 || true)
fi
case "$cuda_version" in
  11.8*) ;;
  *) m40_die "the CUDA backend was not enabled with CUDA 11.8 (found '${cuda_version:-none}')" ;;
esac

# ptxas reports only what it compiles: recompile every CUDA object (ccache,
# when present, replays the report of an unchanged file).
find "$build_dir" -name '*.cu.o' -delete
m40_log "sm52-gate: building m40-llm for sm_52 (and ${extra_codes//,/, } from its PTX)"
log="$build_dir/sm52-build.log"
build_start=$SECONDS
if ! cmake --build "$build_dir" --target m40-llm -j "$M40_JOBS" 2>&1 | tee "$log"; then
  m40_die "the sm_52 build failed (log: $log)"
fi
build_seconds=$((SECONDS - build_start))
bin=$(m40_binary "$build_dir")

failures=()
warning=""
fail() { failures+=("$*"); echo "FAIL: $*"; }

m40_log "sm52-gate: compile commands"
cdb="$build_dir/compile_commands.json"
n_cu=$(grep -c '"file": *".*\.cu"' "$cdb" || true)
# One "command" per entry; pick those that compile a .cu file.
cu_commands=$(grep -E '"command": .*\.cu( |")' "$cdb" || true)
n_arch=$(grep -c -- 'arch=compute_52,code=\[compute_52,sm_52\]' <<<"$cu_commands" || true)
n_extra=$(grep -cF -- "arch=compute_52,code=[$extra_codes]" <<<"$cu_commands" || true)
other=$(grep -oE -- 'arch=compute_[0-9]+' <<<"$cu_commands" | grep -v 'compute_52$' | sort -u || true)
echo "$n_cu CUDA source(s); $n_arch compiled with arch=compute_52,code=[compute_52,sm_52]," \
  "$n_extra with arch=compute_52,code=[$extra_codes]"
if [ "$n_cu" = 0 ]; then
  fail "no CUDA source in the build (src/backends/cuda has no .cu file?)"
elif [ "$n_arch" != "$n_cu" ]; then
  fail "not every .cu is compiled with arch=compute_52,code=[compute_52,sm_52]"
elif [ "$n_extra" != "$n_cu" ]; then
  fail "not every .cu is compiled with arch=compute_52,code=[$extra_codes]"
fi
[ -z "$other" ] || fail "PTX of other architectures in the compile commands: $other"

m40_log "sm52-gate: ptxas report (sm_52), one row per kernel"
# ninja prints "[i/n] Building CUDA object <dir>/<file>.cu.o" before each
# command's output; ptxas -v prints, per function:
#   ptxas info    : Compiling entry function '<mangled>' for 'sm_52'
#   ptxas info    : Function properties for <mangled>
#       S bytes stack frame, T bytes spill stores, L bytes spill loads
#   ptxas info    : Used R registers, M bytes smem, C bytes cmem[0]
raw=$(awk '
  /Building CUDA object/ { src = $NF; sub(/\.o$/, "", src); sub(/.*\//, "", src) }
  /ptxas info *: Compiling entry function/ {
    name = $0; sub(/.*function \047/, "", name); sub(/\047.*/, "", name)
    arch = $0; sub(/.* for \047/, "", arch); sub(/\047.*/, "", arch)
    # ptxas compiles a file once per architecture: a kernel is a name and
    # an architecture.
    cur = name SUBSEP arch; curarch = arch
    kname[cur] = name; file[cur] = src; archof[cur] = arch; order[++n] = cur
    regs[cur] = "?"; smem[cur] = 0; cmem[cur] = 0
  }
  /ptxas info *: Function properties for/ { prop = $NF SUBSEP curarch }
  /bytes stack frame/ {
    for (i = 1; i <= NF; i++) {
      if ($(i+1) == "bytes" && $(i+2) == "stack") st[prop] = $i
      if ($(i+1) == "bytes" && $(i+2) == "spill" && $(i+3) ~ /^stores/) ss[prop] = $i
      if ($(i+1) == "bytes" && $(i+2) == "spill" && $(i+3) ~ /^loads/) sl[prop] = $i
    }
  }
  /ptxas info *: Used [0-9]+ registers/ && cur != "" {
    for (i = 1; i <= NF; i++) {
      if ($(i+1) ~ /^registers/) regs[cur] = $i
      if ($(i+1) == "bytes" && $(i+2) ~ /^smem/) smem[cur] = $i
      if ($(i+1) == "bytes" && $(i+2) ~ /^cmem\[0\]/) cmem[cur] = $i
    }
  }
  END {
    for (k = 1; k <= n; k++) {
      f = order[k]
      if (done[f]++) continue
      printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", kname[f], regs[f], (f in st ? st[f] : 0),
        (f in ss ? ss[f] : 0), (f in sl ? sl[f] : 0), smem[f], cmem[f], archof[f], file[f]
    }
  }' "$log")

# The table and the spill rule are about the M40 (sm_52); the architectures
# compiled from its PTX get a line each.
raw_all=$raw
raw=$(awk -F'\t' '$8 == "sm_52"' <<<"$raw_all")
if [ -z "$raw" ]; then
  fail "ptxas reported no sm_52 kernel (is -Xptxas -v in the CUDA flags? are there kernels?)"
else
  demangled=$(cut -f1 <<<"$raw" | "$demangler")
  # M40 (sm_52): 64K registers per SM, at most 64 resident warps, registers
  # allocated per warp in units of 256: warps/SM that the registers allow.
  paste <(cut -f2- <<<"$raw") <(printf '%s\n' "$demangled") | sort -t$'\t' -k8,8 -k9 | awk -F'\t' '
    BEGIN {
      printf "%-5s %-6s %-7s %-6s %-6s %-7s %-6s %-5s  %-22s %s\n", "regs", "stack", "spill", "spill", "smem", "cmem0", "warps", "arch", "file", "kernel"
      printf "%-5s %-6s %-7s %-6s %-6s %-7s %-6s %-5s  %-22s %s\n", "", "bytes", "stores", "loads", "bytes", "bytes", "/SM", "", "", ""
    }
    {
      w = "?"
      if ($1 ~ /^[0-9]+$/) {
        per_warp = int(($1 * 32 + 255) / 256) * 256
        w = (per_warp == 0) ? 64 : int(65536 / per_warp); if (w > 64) w = 64
      }
      flag = ($3 + $4 > 0) ? "  <- spills" : ""
      printf "%-5s %-6s %-7s %-6s %-6s %-7s %-6s %-5s  %-22s %s%s\n", $1, $2, $3, $4, $5, $6, w, $7, $8, $9, flag
    }' | tee "$report"
  n_kernels=$(wc -l <<<"$raw")
  total_spill=$(awk -F'\t' '{ s += $4 + $5 } END { print s + 0 }' <<<"$raw")
  max_spill=$(awk -F'\t' '{ v = $4 + $5; if (v > m) m = v } END { print m + 0 }' <<<"$raw")
  echo "$n_kernels kernel(s); spilled bytes (stores + loads) in all: $total_spill; table saved to $report"
  if [ -n "${M40_GATE_MAX_SPILL:-}" ] && [ "$max_spill" -gt "$M40_GATE_MAX_SPILL" ]; then
    fail "a kernel spills $max_spill bytes, more than M40_GATE_MAX_SPILL=$M40_GATE_MAX_SPILL"
  fi
  for a in "${extra_sass[@]}"; do
    awk -F'\t' -v arch="sm_$a" -v n52="$n_kernels" '
      $8 == arch { n++; s += $4 + $5; if ($4 + $5 > 0) k++ }
      END { printf "%-6s %d kernel(s) (sm_52: %d), %d spilling, %d spilled bytes in all\n", arch, n, n52, k, s
            exit (n == n52 ? 0 : 1) }' <<<"$raw_all" || fail "ptxas compiled a different number of kernels for sm_$a"
  done
  bad_arch=$(cut -f8 <<<"$raw_all" | grep -vxE "sm_52|$extra_alternatives" | sort -u || true)
  [ -z "$bad_arch" ] || fail "ptxas compiled for other architectures: $bad_arch"
fi

m40_log "sm52-gate: shared libraries of $bin"
needed=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
printf '  NEEDED %s\n' $needed
cuda_libs=$(grep -E '^lib(cudart|cublas|cublasLt|cuda|nvrtc|nvToolsExt|cufft|curand|cusparse|cusolver)\.so' <<<"$needed" || true)
[ -z "$cuda_libs" ] || fail "links CUDA shared libraries: $(echo $cuda_libs)"
if ldd "$bin" | grep -E 'libcudart|libcublas'; then
  fail "ldd shows libcudart/libcublas"
else
  echo "no libcudart.so or libcublas: the CUDA runtime is linked statically"
fi

# check_device_code FILE: lists the device code of a binary or static
# library; sets n_elf52 and n_ptx52; records as failures an architecture
# with another number of ELF images than sm_52, and PTX or ELF code for an
# architecture that was not asked for.
check_device_code() {
  local file=$1 elf ptx other targets a n
  elf=$("$cuobjdump" --list-elf "$file" 2>&1 || true)
  ptx=$("$cuobjdump" --list-ptx "$file" 2>&1 || true)
  printf '%s\n' "$elf" | grep -v '^$' | grep 'sm_52\.' | sed 's/^/  /' || true
  printf '%s\n' "$ptx" | grep -v '^$' | sed 's/^/  /'
  n_elf52=$(grep -c 'sm_52\.cubin' <<<"$elf" || true)
  n_ptx52=$(grep -c 'sm_52\.ptx' <<<"$ptx" || true)
  for a in "${extra_sass[@]}"; do
    n=$(grep -c "sm_$a\.cubin" <<<"$elf" || true)
    echo "  sm_$a: $n ELF image(s)"
    [ "$n" = "$n_elf52" ] || fail "$file has $n sm_$a ELF image(s) and $n_elf52 for sm_52"
  done
  other=$( (grep -oE 'sm_[0-9]+\.cubin' <<<"$elf"; grep -oE 'sm_[0-9]+\.ptx' <<<"$ptx") |
    grep -vE "^sm_52\.|^($extra_alternatives)\.cubin" | sort -u || true)
  [ -z "$other" ] || fail "code for other architectures in $file: $(echo $other)"
  # The PTX's .target names its virtual architecture: sm_52 = compute_52.
  targets=$("$cuobjdump" --dump-ptx "$file" 2>/dev/null | grep -E '^\.target' | sort | uniq -c || true)
  if [ -n "$targets" ]; then
    echo "  PTX $(echo $targets)"
    if grep -v 'sm_52' <<<"$targets" | grep -q .; then fail "PTX for another target in $file: $(echo $targets)"; fi
  fi
}

m40_log "sm52-gate: device code in $bin (cuobjdump)"
check_device_code "$bin"
if [ "$n_elf52" = 0 ] && [ "$n_ptx52" = 0 ]; then
  # Static libraries only contribute the objects a binary uses: until
  # m40-llm calls into the CUDA backend, its kernels stay in the library.
  warning="m40-llm carries no device code yet (nothing in it calls the CUDA backend): checked the CUDA libraries instead"
  echo "WARNING: $warning"
  total_elf=0 total_ptx=0
  while IFS= read -r lib; do
    [ -n "$lib" ] || continue
    m40_log "sm52-gate: device code in ${lib#"$build_dir"/} (cuobjdump)"
    check_device_code "$lib"
    total_elf=$((total_elf + n_elf52)) total_ptx=$((total_ptx + n_ptx52))
  done < <(find "$build_dir" -name '*.a' -exec sh -c \
             'for f; do "$0" --list-elf "$f" 2>/dev/null | grep -q "\.cubin" && echo "$f"; done' \
             "$cuobjdump" {} + | sort)
  n_elf52=$total_elf n_ptx52=$total_ptx
fi
[ "$n_elf52" -gt 0 ] || fail "no sm_52 machine code (ELF)"
[ "$n_ptx52" -gt 0 ] || fail "no compute_52 PTX"
echo "$n_elf52 sm_52 ELF image(s) and $n_ptx52 compute_52 PTX image(s); ELF for ${extra_codes//,/, } too"
echo "$(basename "$bin"): $(stat -c %s "$bin") bytes; built in $build_seconds s with $M40_JOBS jobs"

m40_log "sm52-gate: the binary starts without a GPU"
if out=$("$bin" --version 2>&1); then
  echo "$out"
else
  fail "$bin --version failed: $out"
fi

if [ ${#failures[@]} -gt 0 ]; then
  m40_log "sm52-gate: FAILED (${#failures[@]})"
  printf '  - %s\n' "${failures[@]}"
  exit 1
fi
m40_log "sm52-gate: passed (CUDA $cuda_version, sm_52 + compute_52 PTX + ${extra_codes//,/, } from it, static runtime)"
if [ -n "$warning" ]; then echo "WARNING: $warning"; fi
