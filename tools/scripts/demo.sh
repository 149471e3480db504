#!/usr/bin/env bash
# The README's demo command: installs missing Debian packages, configures
# and builds the `release` preset (the demo target only) and runs
# build/release/tools/demo/graphrun-demo. Arguments go to the demo.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"

"$root/tools/scripts/install-deps.sh"
cmake --preset release >/dev/null
cmake --build --preset release -j "${GRAPHRUN_JOBS:-$(nproc)}" --target graphrun-demo
exec "$root/build/release/tools/demo/graphrun-demo" "$@"
