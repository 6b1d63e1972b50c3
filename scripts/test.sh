#!/usr/bin/env bash
# The project's test command: starts the real services the tests use (installing what is
# missing, see scripts/services.sh), then runs every test of the workspace against them.
# Extra arguments go to `cargo test` (for example a test name filter).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/services.sh up
cargo test --workspace --locked "$@"
