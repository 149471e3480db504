#!/bin/sh
# isa_objects_test.sh OBJDUMP [--linked PROGRAM] LEVEL OBJECT [LEVEL OBJECT ...]
#
# Each level's isolated kernel object (ops/graphrun_ops_isa_<level>.o, see
# cmake/GraphrunCpuIsa.cmake) holds no instruction of a higher level:
#   baseline  no VEX or EVEX encoding (first byte c4/c5 or 62), no ymm/zmm
#             register, no SSE3..SSE4.2 instruction (x86-64's SSE2 only);
#   avx2      no EVEX encoding, no zmm, mask (%k) or x/ymm16..31 register;
#   avx512    anything.
# And each level does use its own width (ymm for avx2, zmm for avx512), so
# that a check that sees nothing cannot pass.
#
# With --linked, the same rules hold in PROGRAM, a binary linked with
# graphrun_ops, for every function a level's name marks (the suffix
# .graphrun_<level>, or the namespace graphrun::cpu::<level>), and no such
# function calls or jumps into another level's: the final link kept each
# level's copies of Eigen apart.
set -u
objdump=$1
shift
linked=""
if [ "${1:-}" = "--linked" ]; then
  linked=$2
  shift 2
fi
status=0

fail() {
  echo "FAIL: $*"
  status=1
}

# The instructions of OBJECT, one per line: "<first byte>\t<mnemonic>\t<operands>"
# (objdump's continuation lines, which carry only bytes, dropped).
instructions() {
  "$objdump" -d --no-addresses "$1" 2>/dev/null | awk -F'\t' '
    NF >= 3 && $2 ~ /^[0-9a-f][0-9a-f] / {
      split($2, bytes, " ")
      mnemonic = $3; operands = $3
      sub(/ .*/, "", mnemonic); sub(/^[^ ]* */, "", operands)
      print bytes[1] "\t" mnemonic "\t" operands
    }'
}

# Prints the count and the first offending lines of a grep over the listing.
check_none() {
  level=$1 what=$2 pattern=$3 listing=$4
  count=$(grep -cE "$pattern" "$listing")
  if [ "$count" -ne 0 ]; then
    fail "$level object: $count instructions with $what, for example:"
    grep -E "$pattern" "$listing" | head -5 | sed 's/^/    /'
  else
    echo "ok: $level object: no instruction with $what"
  fi
}
check_some() {
  level=$1 what=$2 pattern=$3 listing=$4
  count=$(grep -cE "$pattern" "$listing")
  if [ "$count" -eq 0 ]; then
    fail "$level object: no instruction with $what (was it compiled for $level?)"
  else
    echo "ok: $level object: $count instructions with $what"
  fi
}

listing=$(mktemp)
trap 'rm -f "$listing"' EXIT
tab=$(printf '\t')
sse3_up='(pshufb|palignr|phaddw|phaddd|phsubw|phsubd|pabsb|pabsw|pabsd|pmaddubsw|pmulhrsw|psignb|psignw|psignd|pmulld|pmuldq|pminsb|pminsd|pminuw|pminud|pmaxsb|pmaxsd|pmaxuw|pmaxud|ptest|pblendvb|pblendw|blendps|blendpd|blendvps|blendvpd|roundps|roundpd|roundss|roundsd|insertps|extractps|pextrb|pextrd|pextrq|pinsrb|pinsrd|pinsrq|dpps|dppd|mpsadbw|phminposuw|pmovsx[a-z]*|pmovzx[a-z]*|packusdw|pcmpeqq|pcmpgtq|movntdqa|pcmpestri|pcmpestrm|pcmpistri|pcmpistrm|haddps|haddpd|hsubps|hsubpd|addsubps|addsubpd|movddup|movshdup|movsldup|lddqu|popcnt|crc32[bwlq]?)'
levels_seen=""
while [ $# -ge 2 ]; do
  level=$1 object=$2
  shift 2
  levels_seen="$levels_seen $level"
  if [ ! -f "$object" ]; then
    fail "$level object $object is missing (build graphrun_ops first)"
    continue
  fi
  instructions "$object" >"$listing"
  total=$(wc -l <"$listing")
  if [ "$total" -lt 100 ]; then
    fail "$level object: objdump shows only $total instructions in $object"
    continue
  fi
  echo "$level: $total instructions in $object"
  case $level in
    baseline)
      check_none baseline "VEX or EVEX encoding" "^(c4|c5|62)$tab" "$listing"
      check_none baseline "ymm or zmm register" '%[yz]mm' "$listing"
      check_none baseline "SSE3..SSE4.2 mnemonic" "^..$tab$sse3_up$tab" "$listing"
      ;;
    avx2)
      check_none avx2 "EVEX encoding" "^62$tab" "$listing"
      check_none avx2 "zmm, mask or 16..31 vector register" \
        '%zmm|%k[0-7]|%[xy]mm(1[6-9]|2[0-9]|3[01])' "$listing"
      check_some avx2 "ymm register" '%ymm' "$listing"
      check_some avx2 "FMA mnemonic" "${tab}vf(n)?m(add|sub)" "$listing"
      ;;
    avx512)
      check_some avx512 "zmm register" '%zmm' "$listing"
      check_some avx512 "EVEX encoding" "^62$tab" "$listing"
      ;;
    *)
      fail "unknown level '$level'"
      ;;
  esac
done
if [ -n "$linked" ]; then
  if [ ! -f "$linked" ]; then
    fail "linked program $linked is missing"
  else
    # One line per finding: "count <level> <n>" or "bad <what>\t<function>\t<instruction>".
    "$objdump" -d "$linked" | awk -F'\t' '
      function level_of(name) {
        if (name ~ /\.graphrun_baseline|3cpu8baseline/) return "baseline"
        if (name ~ /\.graphrun_avx2|3cpu4avx2/) return "avx2"
        if (name ~ /\.graphrun_avx512|3cpu6avx512/) return "avx512"
        return ""
      }
      /^[0-9a-f]+ <.*>:$/ { fn = $0; sub(/^[^<]*</, "", fn); sub(/>:$/, "", fn); level = level_of(fn); next }
      level == "" || NF < 3 { next }
      {
        count[level]++
        split($2, bytes, " ")
        insn = $3
        if (level == "baseline" && (bytes[1] ~ /^(c4|c5|62)$/ || insn ~ /%[yz]mm/)) {
          print "bad\tbaseline function with a VEX/EVEX instruction\t" fn "\t" insn
        }
        if (level == "avx2" && (bytes[1] == "62" || insn ~ /%zmm|%k[0-7]/)) {
          print "bad\tavx2 function with an AVX-512 instruction\t" fn "\t" insn
        }
        if (insn ~ /^(call|jmp|j[a-z]+) +[0-9a-f]+ </) {
          target = insn; sub(/^[^<]*</, "", target); sub(/(\+0x[0-9a-f]+)?>.*$/, "", target)
          to = level_of(target)
          if (to != "" && to != level) {
            print "bad\t" level " function reaching " to " code (" target ")\t" fn "\t" insn
          }
        }
      }
      END { for (l in count) print "count\t" l "\t" count[l] }' >"$listing"
    for level in $levels_seen; do
      n=$(awk -F'\t' -v l="$level" '$1 == "count" && $2 == l { print $3 }' "$listing")
      if [ -z "$n" ]; then
        fail "linked $linked: no function of the $level kernels found"
      else
        echo "linked: $n instructions in functions of the $level kernels"
      fi
    done
    bad=$(grep -c '^bad' "$listing")
    if [ "$bad" -ne 0 ]; then
      fail "linked $linked: $bad instructions break the level rules, for example:"
      grep '^bad' "$listing" | head -5 | cut -f2- | sed 's/^/    /'
    else
      echo "ok: linked $linked: each level's functions keep to the level and to its own calls"
    fi
  fi
fi
if [ $# -ne 0 ]; then
  fail "usage: isa_objects_test.sh OBJDUMP [--linked PROGRAM] LEVEL OBJECT [LEVEL OBJECT ...]"
fi
exit $status
