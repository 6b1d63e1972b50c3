/work/main/vendor/zstd-safe/target/debug/deps/zstd_safe-0e62f0d63041a7f3.d: src/lib.rs src/tests.rs src/cache.rs src/constants.rs

/work/main/vendor/zstd-safe/target/debug/deps/zstd_safe-0e62f0d63041a7f3: src/lib.rs src/tests.rs src/cache.rs src/constants.rs

src/lib.rs:
src/tests.rs:
src/cache.rs:
src/constants.rs:
