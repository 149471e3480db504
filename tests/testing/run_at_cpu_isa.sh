#!/bin/sh
# run_at_cpu_isa.sh PROGRAM [ARGS...]
#
# Runs PROGRAM at the instruction-set level GRAPHRUN_CPU_ISA names (ctest
# sets it; see graphrun_add_isa_runs in cmake/GraphrunHelpers.cmake), or
# exits 77, which those tests take as "skipped", when this CPU lacks the
# level: the program would fail in Session::create instead of testing
# anything. The flags are the ones api/src/cpu_isa.cc asks cpuid for.
set -u
level=${GRAPHRUN_CPU_ISA:-}
case $level in
  baseline) needs="" ;;
  avx2) needs="avx2 fma" ;;
  avx512) needs="avx512f avx512bw avx512dq avx512vl avx2 fma" ;;
  *)
    echo "run_at_cpu_isa.sh: GRAPHRUN_CPU_ISA='$level' is not baseline, avx2 or avx512" >&2
    exit 2
    ;;
esac
if [ -n "$needs" ]; then
  flags=$(grep -m 1 '^flags' /proc/cpuinfo 2>/dev/null || true)
  if [ -z "$flags" ]; then
    echo "skipped: no CPU flags in /proc/cpuinfo to tell whether this CPU has $level"
    exit 77
  fi
  for flag in $needs; do
    case " $flags " in
      *" $flag "*) ;;
      *)
        echo "skipped: GRAPHRUN_CPU_ISA=$level needs $flag, which this CPU lacks"
        exit 77
        ;;
    esac
  done
fi
exec "$@"
