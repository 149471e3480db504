#!/usr/bin/env bash
# Builds a ThreadSanitizer-instrumented oneTBB for the `tsan` preset.
#
# Debian's libtbb is not instrumented, so TSan reports false races on every
# flow graph (the synchronisation happens inside libtbb.so, out of TSan's
# sight). This script fetches Debian's own source package of oneTBB (the
# version libtbb-dev has, with Debian's patches), builds it with
# -DTBB_SANITIZE=thread and installs it into a cache folder:
#
#   tools/scripts/build-tbb-tsan.sh [PREFIX]
#
# PREFIX defaults to $GRAPHRUN_TBB_TSAN_DIR, else ~/.cache/graphrun/tbb-tsan
# (the default GRAPHRUN_TBB_ROOT of the `tsan` preset; if you pick another
# folder, configure with `cmake --preset tsan -DGRAPHRUN_TBB_ROOT=PREFIX`).
#
# Idempotent: when PREFIX holds an install whose stamp matches (recipe, oneTBB
# version, compiler), it exits 0 at once. The machine's apt configuration is
# not changed: the deb-src lines, mirroring the machine's enabled apt sources,
# go into a private apt setup in a temporary folder. Needs dpkg-dev, cmake,
# ninja and the compiler ($CXX, default g++ — the same one the project uses,
# since TSan runtimes of different compilers do not mix). Takes ~1-3 minutes
# on 2 cores. Environment: GRAPHRUN_JOBS (default 2).
set -euo pipefail

recipe=3  # bump when the configure line below changes
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
prefix=${1:-${GRAPHRUN_TBB_TSAN_DIR:-${HOME:?HOME is unset; pass PREFIX}/.cache/graphrun/tbb-tsan}}
jobs=${GRAPHRUN_JOBS:-2}
export CC=${CC:-gcc} CXX=${CXX:-g++}
stamp=$prefix/.graphrun-tbb-tsan.stamp

now() { date +%s; }
log() { echo "build-tbb-tsan: $*" >&2; }
t_start=$(now)

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  sudo_cmd=(sudo)
fi

# The oneTBB source version to build: that of the installed libtbb-dev.
if ! dpkg-query -W -f='${Status}' libtbb-dev 2>/dev/null | grep -q 'install ok installed' ||
  ! command -v dpkg-source >/dev/null || ! command -v ninja >/dev/null ||
  ! command -v cmake >/dev/null; then
  GRAPHRUN_WITH_TSAN_DEPS=1 "$root_dir/tools/scripts/install-deps.sh"
fi
src_pkg=$(dpkg-query -W -f='${source:Package}' libtbb-dev)
src_ver=$(dpkg-query -W -f='${source:Version}' libtbb-dev)
cxx_ver=$("$CXX" --version | head -n1)
key="recipe=$recipe source=$src_pkg=$src_ver cxx=$cxx_ver"

if [[ -f "$stamp" && -f "$prefix/lib/cmake/TBB/TBBConfig.cmake" ]] &&
  [[ "$(cat "$stamp")" == "$key" ]]; then
  log "up to date in $prefix ($key)"
  exit 0
fi
log "building $src_pkg $src_ver with -fsanitize=thread ($cxx_ver) into $prefix"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/graphrun-tbb-tsan.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# --- 1. A private apt setup whose sources are deb-src twins of the machine's.
apt_dir=$tmp/apt
mkdir -p "$apt_dir/sources.list.d" "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
: >"$apt_dir/sources.list"
n_sources=0
# Classic one-line format: /etc/apt/sources.list and sources.list.d/*.list.
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
  [[ -f "$f" ]] || continue
  if grep -qE '^[[:space:]]*deb[[:space:]]' "$f"; then
    sed -nE 's/^[[:space:]]*deb[[:space:]]/deb-src /p' "$f" \
      >"$apt_dir/sources.list.d/$(basename "$f" .list)-src.list"
    n_sources=$((n_sources + 1))
  fi
done
# deb822 format (Debian 12's default): sources.list.d/*.sources. Each enabled
# stanza whose Types include `deb` is copied with `Types: deb-src`.
for f in /etc/apt/sources.list.d/*.sources; do
  [[ -f "$f" ]] || continue
  out="$apt_dir/sources.list.d/$(basename "$f" .sources)-src.sources"
  awk '
    function flush() {
      if (n > 0 && has_deb && !disabled) {
        for (i = 1; i <= n; i++) print lines[i]
        print ""
      }
      n = 0; has_deb = 0; disabled = 0
    }
    /^[[:space:]]*$/ { flush(); next }
    /^#/ { next }
    tolower($1) == "types:" {
      for (i = 2; i <= NF; i++) if ($i == "deb") has_deb = 1
      lines[++n] = "Types: deb-src"; next
    }
    tolower($1) == "enabled:" && tolower($2) == "no" { disabled = 1 }
    { lines[++n] = $0 }
    END { flush() }
  ' "$f" >"$out"
  if [[ -s "$out" ]]; then n_sources=$((n_sources + 1)); else rm -f "$out"; fi
done
if ((n_sources == 0)); then
  log "error: found no enabled 'deb' apt source to mirror as deb-src"
  exit 1
fi

apt_opts=(
  -o "Dir::Etc::sourcelist=$apt_dir/sources.list"
  -o "Dir::Etc::sourceparts=$apt_dir/sources.list.d"
  -o "Dir::State::Lists=$apt_dir/lists"
  -o "Dir::Cache=$apt_dir/cache"
  -o "APT::Sandbox::User=$(id -un)"
  -o "Acquire::Retries=3"
  -o "Acquire::http::Timeout=60"
  -o "Debug::NoLocking=1"
)
t0=$(now)
# A third-party source without deb-src makes update fail; what matters is
# whether the source package can be fetched below.
if ! apt-get "${apt_opts[@]}" -qq update; then
  log "warning: 'apt-get update' of the deb-src lists reported errors; trying anyway"
fi
mkdir -p "$tmp/dl"
if ! (cd "$tmp/dl" && apt-get "${apt_opts[@]}" -qq source --download-only "$src_pkg=$src_ver"); then
  log "warning: $src_pkg=$src_ver not in the archive's Sources; taking the current $src_pkg"
  (cd "$tmp/dl" && apt-get "${apt_opts[@]}" -qq source --download-only "$src_pkg")
fi
dsc=$(ls "$tmp"/dl/*.dsc)
# apt checked the files against the signed Sources index; the .dsc signature
# itself needs a keyring dpkg-source may not have.
dpkg-source --no-check -x "$dsc" "$tmp/src" >/dev/null
t1=$(now)
log "source fetched and unpacked in $((t1 - t0)) s ($(basename "$dsc"))"

# --- 2. Configure, build, install. The stamp is written last, so an
# interrupted run leaves no stamp and the next run starts over.
cmake -S "$tmp/src" -B "$tmp/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_INSTALL_PREFIX="$prefix" \
  -DCMAKE_INSTALL_LIBDIR=lib \
  -DTBB_SANITIZE=thread \
  -DTBB_TEST=OFF \
  -DTBB_EXAMPLES=OFF \
  -DTBB_STRICT=OFF \
  -DTBBMALLOC_BUILD=OFF \
  -DTBB_DISABLE_HWLOC_AUTOMATIC_SEARCH=ON \
  >"$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log" >&2; exit 1; }
t2=$(now)
log "configured in $((t2 - t1)) s"
cmake --build "$tmp/build" -j "$jobs" >"$tmp/build.log" 2>&1 ||
  { tail -n 100 "$tmp/build.log" >&2; exit 1; }
t3=$(now)
log "built in $((t3 - t2)) s (-j$jobs)"
rm -rf "$prefix"
cmake --install "$tmp/build" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log" >&2; exit 1; }
echo "$key" >"$stamp"
t4=$(now)
log "installed into $prefix in $((t4 - t3)) s; total $((t4 - t_start)) s"
