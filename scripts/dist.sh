#!/usr/bin/env bash
# Builds the `verdict` binary a user installs: the `dist` profile (release with fat LTO and
# one codegen unit, optimised for size: 65 MB where opt-level 3 made 114 MB), then its debug information split
# into `verdict.debug` beside it, linked by a `.gnu_debuglink` section. The binary keeps no
# debug sections or symbols of its own; a backtrace (and `addr2line -e verdict`) names the
# functions, files and lines when `verdict.debug` is installed next to the binary or under
# /usr/lib/debug; without it, only addresses. Ship the two together.
#
# Usage: scripts/dist.sh [output folder, default target/dist-out]
#   A build takes 23 to 41 minutes on two cores (the fat LTO link runs in one thread).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

out=${1:-target/dist-out}
target=${CARGO_TARGET_DIR:-target}
command -v objcopy >/dev/null || { echo "dist: objcopy is needed (Debian's binutils)" >&2; exit 1; }

cargo build --locked --profile dist -p verdict --bin verdict
mkdir -p "$out"
cp "$target/dist/verdict" "$out/verdict"
(
  cd "$out"
  objcopy --only-keep-debug verdict verdict.debug
  objcopy --strip-all --add-gnu-debuglink=verdict.debug verdict
)
ls -l "$out/verdict" "$out/verdict.debug" | awk '{ printf "%s %.1f MB\n", $NF, $5 / 1e6 }'
