#!/usr/bin/env bash
# The README's test command: builds graphrun and runs its test suites.
#
#   tools/scripts/test.sh                  format check, release, asan
#   GRAPHRUN_QUICK=1 tools/scripts/test.sh format check, release
#   tools/scripts/test.sh STAGE...         only those stages, in order:
#                                          format release asan tsan
#
# format:  clang-format check (tools/scripts/format.sh --check) and the
#          documentation link check (tools/scripts/check-links.sh).
# release: the `release` preset with -DGRAPHRUN_WERROR=ON, the API
#          reference (target docs: Doxygen, warnings are errors; skipped
#          without doxygen, except in CI), every test (all labels), then the
#          install test among them.
# asan:    the `asan` preset (ASan + UBSan), every test.
# tsan:    the `tsan` preset against a TSan-built oneTBB
#          (tools/scripts/build-tbb-tsan.sh, cached in ~/.cache/graphrun or
#          $GRAPHRUN_TBB_TSAN_DIR); every test but the install consumer.
# Build trees: build/<preset>. Installs missing Debian packages first.
# Environment: GRAPHRUN_JOBS (build and ctest parallelism, default nproc).
# A closing line "test.sh: N passed, N failed" sums the ctest runs; with
# GRAPHRUN_TEST_SUMMARY=FILE the two numbers are also appended to FILE.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"

jobs=${GRAPHRUN_JOBS:-$(nproc)}
if (($# > 0)); then
  stages=("$@")
elif [[ "${GRAPHRUN_QUICK:-0}" == 1 ]]; then
  stages=(format release)
else
  stages=(format release asan)
fi
for s in "${stages[@]}"; do
  case $s in
    format | release | asan | tsan) ;;
    *)
      echo "test.sh: unknown stage '$s' (format, release, asan, tsan)" >&2
      exit 2
      ;;
  esac
done

total_passed=0
total_failed=0
t_all=$(date +%s)
stage_start() {
  stage_t0=$(date +%s)
  echo "==== test.sh: stage $1 ===="
}
stage_end() {
  echo "==== test.sh: stage $1 done in $(($(date +%s) - stage_t0)) s ===="
}

# ctest with the preset's settings; adds its counts to the totals.
run_ctest() {
  local preset=$1 log
  log=$(mktemp)
  local rc=0
  ctest --preset "$preset" -j "$jobs" 2>&1 | tee "$log" || rc=$?
  # "100% tests passed, 0 tests failed out of 42"
  local line
  line=$(grep -E '[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n1 || true)
  if [[ -n "$line" ]]; then
    local failed total
    failed=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/' <<<"$line")
    total=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\2/' <<<"$line")
    total_failed=$((total_failed + failed))
    total_passed=$((total_passed + total - failed))
  fi
  rm -f "$log"
  return "$rc"
}

# The API reference of a configured build tree. The tree has a `docs`
# target only when configure found doxygen; CI (CI=true) requires it.
build_docs() {
  local preset=$1
  if grep -q '^GRAPHRUN_DOCS_TARGET:INTERNAL=ON$' "build/$preset/CMakeCache.txt"; then
    cmake --build --preset "$preset" --target docs
  elif [[ "${CI:-}" == true ]]; then
    echo "test.sh: doxygen was not found for build/$preset, and CI builds the API reference" >&2
    exit 1
  else
    echo "test.sh: doxygen not found: no API reference (tools/scripts/install-deps.sh installs it)"
  fi
}

configure_and_build() {
  local preset=$1
  shift
  local t0
  t0=$(date +%s)
  cmake --preset "$preset" "$@"
  cmake --build --preset "$preset" -j "$jobs"
  echo "test.sh: $preset configured and built in $(($(date +%s) - t0)) s"
}

deps_env=()
for s in "${stages[@]}"; do
  [[ $s == tsan ]] && deps_env=(GRAPHRUN_WITH_TSAN_DEPS=1)
done
env "${deps_env[@]}" "$root/tools/scripts/install-deps.sh"

for s in "${stages[@]}"; do
  stage_start "$s"
  case $s in
    format)
      tools/scripts/format.sh --check
      tools/scripts/check-links.sh
      ;;
    release)
      configure_and_build release -DGRAPHRUN_WERROR=ON
      build_docs release
      run_ctest release
      ;;
    asan)
      configure_and_build asan
      run_ctest asan
      ;;
    tsan)
      tbb_dir=${GRAPHRUN_TBB_TSAN_DIR:-$HOME/.cache/graphrun/tbb-tsan}
      GRAPHRUN_TBB_TSAN_DIR=$tbb_dir tools/scripts/build-tbb-tsan.sh
      configure_and_build tsan -DGRAPHRUN_TBB_ROOT="$tbb_dir"
      # An uninstrumented TBB would drown the run in false reports.
      if ! grep -q "^TBB_DIR:PATH=$tbb_dir/" build/tsan/CMakeCache.txt; then
        echo "test.sh: build/tsan did not pick the TSan oneTBB in $tbb_dir:" >&2
        grep '^TBB_DIR' build/tsan/CMakeCache.txt >&2 || true
        exit 1
      fi
      run_ctest tsan
      ;;
  esac
  stage_end "$s"
done

echo "test.sh: stages ${stages[*]} done in $(($(date +%s) - t_all)) s"
if ((total_passed + total_failed > 0)); then
  echo "test.sh: $total_passed passed, $total_failed failed"
fi
if [[ -n "${GRAPHRUN_TEST_SUMMARY:-}" ]]; then
  echo "$total_passed $total_failed" >>"$GRAPHRUN_TEST_SUMMARY"
fi
