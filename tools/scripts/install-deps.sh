#!/usr/bin/env bash
# Installs the Debian 12 packages graphrun needs to build, test and bench.
# Idempotent: packages already present are left alone, and apt is only
# touched when something is missing. Used by both README commands and .ci/run.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libtbb-dev libeigen3-dev libfmt-dev
  libprotobuf-dev protobuf-compiler
  libgrpc++-dev protobuf-compiler-grpc
  libcli11-dev  # the graphrun and graphrun-server command lines
  openssl       # tests/service: a TLS certificate made at test time
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-serial-dev  # bench/ops/gemm_bench.cc: the GEMM baseline (bench only)
  python3-numpy  # tests/tools: cross-checks graphrun's .npy files with NumPy
  graphviz       # tests/tools: graphrun dot --svg renders with its dot (about 5 MB)
  doxygen        # the API reference: cmake --build <dir> --target docs (docs/Doxyfile.in)
  clang-format clang-tidy
  # The Python client test (tests/service/python), run by Debian's /usr/bin/python3.
  python3-grpcio python3-protobuf
  # The MPI component (GRAPHRUN_MPI): Open MPI, Debian's default MPI, and mpirun.
  libopenmpi-dev openmpi-bin
)
if [[ "${GRAPHRUN_WITH_TSAN_DEPS:-0}" == 1 ]]; then
  packages+=(dpkg-dev)
fi
# The fuzz preset (tools/scripts/fuzz.sh): clang-19 (clang-14 cannot compile
# libstdc++ 12's ranges), its compiler-rt (libclang_rt.fuzzer and the
# sanitizer runtimes) and llvm-19 for llvm-symbolizer (readable reports).
if [[ "${GRAPHRUN_WITH_FUZZ_DEPS:-0}" == 1 ]]; then
  packages+=(clang-19 libclang-rt-19-dev llvm-19)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "graphrun: installing missing Debian packages: ${missing[*]}" >&2
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
