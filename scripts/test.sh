#!/usr/bin/env bash
# The project's test command: starts the real services the tests use (installing what is
# missing, see scripts/services.sh), then runs every test of the workspace against them.
# Extra arguments go to `cargo test` (for example a test name filter).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/services.sh up
cargo test --workspace --locked --exclude verdict-tests "$@"
# The tests of the real services, one at a time (tests/tests/services/main.rs says why).
RUST_TEST_THREADS=1 cargo test -p verdict-tests --locked "$@"
# The patched zstd-safe (vendor/README.md) is not a workspace member: its own tests, here.
cargo test --locked --manifest-path vendor/zstd-safe/Cargo.toml --features std
