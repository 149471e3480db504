#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` preset: clang-19, ASan + UBSan)
# and runs them:
#
#   tools/scripts/fuzz.sh [SECONDS]   regression runs, then each target
#                                     fuzzed for SECONDS (default 60)
#   tools/scripts/fuzz.sh 0           regression runs only
#
# Regression runs (ctest --preset fuzz, label fuzz): each target executes
# its seed corpus (build/fuzz/tests/fuzz/seeds/<target>) and the inputs in
# tests/fuzz/regressions/<target>/ once (-runs=0). Then each target is
# fuzzed with -max_total_time=SECONDS; its growing corpus is kept in
# build/fuzz/corpus/<target>, so local runs build on earlier ones. A crash
# (ASan, UBSan, a violated round-trip invariant, a timeout or OOM) fails
# the script; the input is kept in build/fuzz/crashes/<target>/ and the
# script prints how to reproduce it.
# Environment: GRAPHRUN_JOBS (build and ctest parallelism, default nproc);
# GRAPHRUN_TEST_SUMMARY=FILE appends the regression runs' pass/fail counts.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"

seconds=${1:-60}
if ! [[ $seconds =~ ^[0-9]+$ ]]; then
  echo "usage: $0 [seconds-per-target]" >&2
  exit 2
fi
jobs=${GRAPHRUN_JOBS:-$(nproc)}
build=build/fuzz
targets=(graph_def_binary_fuzz graph_def_text_fuzz tensor_proto_fuzz service_fuzz cli_input_fuzz
  mpi_control_fuzz)

GRAPHRUN_WITH_FUZZ_DEPS=1 tools/scripts/install-deps.sh

t0=$(date +%s)
cmake --preset fuzz
cmake --build --preset fuzz -j "$jobs"
echo "fuzz.sh: fuzz preset configured and built in $(($(date +%s) - t0)) s"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
# Stack traces with file and line (llvm-19 from install-deps).
export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-/usr/lib/llvm-19/bin/llvm-symbolizer}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# Regression runs first: quick, and a known input that crashes again is
# the clearest failure.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
rc=0
ctest --preset fuzz -j "$jobs" 2>&1 | tee "$log" || rc=$?
line=$(grep -E '[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n1 || true)
if [[ -n "${GRAPHRUN_TEST_SUMMARY:-}" && -n "$line" ]]; then
  failed=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/' <<<"$line")
  total=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\2/' <<<"$line")
  echo "$((total - failed)) $failed" >>"$GRAPHRUN_TEST_SUMMARY"
fi
if ((rc != 0)); then
  echo "fuzz.sh: a seed or regression input crashes again (ctest output above)" >&2
  exit 1
fi
if ((seconds == 0)); then
  echo "fuzz.sh: regression runs passed; no time-boxed fuzzing (SECONDS = 0)"
  exit 0
fi

# Bounds: inputs up to 32 KiB for GraphDefs (the largest fixture is 18 KiB
# as text) and for service call sequences (the largest seed, the TF conv2d
# graph in a sequence, is 5 KiB), 4 KiB for TensorProtos and for the
# CLI's inputs (.npy files of a few elements, --feed values), 32 KiB for
# the MPI control payloads (a worker's part is a GraphDef); 10 s per
# input; libFuzzer's default 2 GiB RSS limit (the parser targets skip
# tensors over 16 MiB, fuzz_support.h; service_fuzz caps each tensor at
# 1 MiB, service_fuzz.cc). The service's sequences carry GraphDefs, so they
# get the GraphDef dictionary too.
declare -A max_len=([graph_def_binary_fuzz]=32768 [graph_def_text_fuzz]=32768
  [tensor_proto_fuzz]=4096 [service_fuzz]=32768 [cli_input_fuzz]=4096
  [mpi_control_fuzz]=32768)
declare -A dict=([graph_def_binary_fuzz]=$build/tests/fuzz/graph_def.dict
  [graph_def_text_fuzz]=$build/tests/fuzz/graph_def.dict
  [service_fuzz]=$build/tests/fuzz/graph_def.dict
  [mpi_control_fuzz]=$build/tests/fuzz/graph_def.dict)
crashed=()
for target in "${targets[@]}"; do
  corpus=$build/corpus/$target
  crashes=$build/crashes/$target
  target_log=$build/logs/$target.log
  mkdir -p "$corpus" "$crashes" "$(dirname "$target_log")"
  args=(-max_total_time="$seconds" -max_len="${max_len[$target]}" -timeout=10
    -rss_limit_mb=2048 -artifact_prefix="$crashes/" -print_final_stats=1)
  [[ -n "${dict[$target]:-}" ]] && args+=(-dict="${dict[$target]}")
  echo "fuzz.sh: $target for ${seconds} s (log: $target_log)"
  rc=0
  "$build/tests/fuzz/$target" "${args[@]}" "$corpus" "$build/tests/fuzz/seeds/$target" \
    "tests/fuzz/regressions/$target" >"$target_log" 2>&1 || rc=$?
  execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$target_log" | tail -n1)
  echo "fuzz.sh: $target: ${execs:-?} executions, corpus $(find "$corpus" -type f | wc -l) files," \
    "exit $rc"
  if ((rc != 0)); then
    crashed+=("$target")
    tail -n 60 "$target_log" >&2
    artifact=$(ls -t "$crashes"/* 2>/dev/null | head -n1 || true)
    echo "fuzz.sh: $target FAILED; the input is kept at ${artifact:-(none written; see $target_log)}" >&2
    if [[ -n "$artifact" ]]; then
      echo "fuzz.sh: reproduce: $build/tests/fuzz/$target $artifact" >&2
      echo "fuzz.sh: once fixed, add it to tests/fuzz/regressions/$target/" >&2
    fi
  fi
done
if ((${#crashed[@]} > 0)); then
  echo "fuzz.sh: crashes in ${crashed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: ${#targets[@]} targets fuzzed for ${seconds} s each without a crash"
