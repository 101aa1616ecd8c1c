#!/usr/bin/env bash
# Installs what is missing, builds m40-llm, and runs every check CI runs:
#
#   1. build      scripts/setup.sh (Release, Ninja, build/)
#      npm        the npm clients of tests/server/clients (npm ci)
#   2. ctest      the GoogleTest suite of build/ and the npm client tests
#   3. sm52-gate  scripts/sm52-gate.sh: the Tesla M40 build with CUDA 11.8
#   4. fuzz       scripts/fuzz.sh: the GGUF reader under libFuzzer (60 s)
#
# Every step runs even when an earlier one failed (but ctest needs the
# build); the exit status is non-zero when any step failed.
#
#   M40_SKIP_GATE=1   skip the sm_52 gate      M40_SKIP_FUZZ=1  skip the fuzz run
#   M40_FUZZ_SECONDS  length of the fuzz run   M40_CTEST_ARGS   extra ctest arguments
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$M40_ROOT" || exit 1

build_dir=$(m40_abs "$M40_BUILD_DIR")
log_dir="$build_dir/test-logs"
summary=()
checks_passed=0
checks_failed=0
total_start=$SECONDS

record() {  # name status seconds [note]
  summary+=("$(printf '%-10s %-5s %5s s  %s' "$1" "$2" "$3" "${4:-}")")
  case "$2" in
    PASS) checks_passed=$((checks_passed + 1)) ;;
    FAIL) checks_failed=$((checks_failed + 1)) ;;
  esac
}

# run_step NAME COMMAND...: runs a step, records PASS or FAIL and its time.
run_step() {
  local name=$1 start=$SECONDS
  shift
  m40_log "[$name] $*"
  if "$@"; then
    record "$name" PASS $((SECONDS - start))
    return 0
  fi
  record "$name" FAIL $((SECONDS - start))
  return 1
}

build_ok=0
run_step build bash scripts/setup.sh && build_ok=1

# The official OpenAI and Ollama npm clients that tests/server/clients runs
# against `m40-llm serve`: Node from Debian, the clients from the npm
# registry at exactly the lock file's versions.
run_step npm-clients bash -c 'M40_LLM_TEST_DEPS=1 bash scripts/install-deps.sh &&
  cd tests/server/clients && npm ci --no-audit --no-fund'

if [ "$build_ok" = 1 ]; then
  mkdir -p "$log_dir"
  m40_log "[ctest] ctest --test-dir $build_dir --output-on-failure -j$M40_JOBS"
  start=$SECONDS
  # shellcheck disable=SC2206
  ctest_args=(${M40_CTEST_ARGS:-})
  ctest --test-dir "$build_dir" --output-on-failure -j "$M40_JOBS" --no-tests=error \
    --timeout 900 "${ctest_args[@]}" 2>&1 | tee "$log_dir/ctest.log"
  ctest_rc=${PIPESTATUS[0]}
  # "100% tests passed, 0 tests failed out of 42": every test is a check.
  line=$(grep -E '^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log_dir/ctest.log" | tail -n 1)
  if [ -n "$line" ]; then
    failed=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/' <<<"$line")
    total=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\2/' <<<"$line")
    checks_passed=$((checks_passed + total - failed))
    checks_failed=$((checks_failed + failed))
  fi
  if [ "$ctest_rc" = 0 ]; then
    summary+=("$(printf '%-10s %-5s %5s s  %s' ctest PASS $((SECONDS - start)) "$line")")
  else
    # A failure that ctest did not count (no tests, a crash of ctest itself).
    if [ -z "$line" ] || [ "${failed:-0}" = 0 ]; then checks_failed=$((checks_failed + 1)); fi
    summary+=("$(printf '%-10s %-5s %5s s  %s' ctest FAIL $((SECONDS - start)) "${line:-ctest exited $ctest_rc}")")
  fi
else
  record ctest FAIL 0 "not run: the build failed"
fi

if [ "${M40_SKIP_GATE:-0}" = 1 ]; then
  record sm52-gate SKIP 0 "M40_SKIP_GATE=1"
else
  run_step sm52-gate bash scripts/sm52-gate.sh
fi

if [ "${M40_SKIP_FUZZ:-0}" = 1 ]; then
  record fuzz SKIP 0 "M40_SKIP_FUZZ=1"
else
  run_step fuzz bash scripts/fuzz.sh
fi

# The failed tests' names and the end of their output come last, where a
# log cut to its tail still shows them.
failed_list="$build_dir/Testing/Temporary/LastTestsFailed.log"
if [ "$build_ok" = 1 ] && [ "${ctest_rc:-0}" != 0 ] && [ -s "$failed_list" ]; then
  m40_log "failed tests (the last 40 lines of each one's output)"
  while IFS=: read -r _ name; do
    echo "--- $name"
    # ctest prints a failed test's output after its result line, up to the
    # next result line.
    awk -v name="$name" '
      /^ *[0-9]+\/[0-9]+ Test +#[0-9]+: / { on = (index($0, " " name " ") > 0); if (on) print; next }
      /^ +Start +[0-9]+: / || /^[0-9]+% tests passed/ { on = 0 }
      on { print }' "$log_dir/ctest.log" | tail -n 40
  done <"$failed_list"
fi

m40_log "summary (${#summary[@]} steps, $((SECONDS - total_start)) s in all)"
printf '%s\n' "${summary[@]}"
# Each ctest test counts as one check, and so do the gate and the fuzz run.
echo "run-tests: $checks_passed passed, $checks_failed failed"
[ "$checks_failed" = 0 ]
