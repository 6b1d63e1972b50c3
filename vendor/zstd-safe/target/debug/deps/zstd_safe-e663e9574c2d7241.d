/work/main/vendor/zstd-safe/target/debug/deps/zstd_safe-e663e9574c2d7241.d: src/lib.rs src/cache.rs src/constants.rs

/work/main/vendor/zstd-safe/target/debug/deps/libzstd_safe-e663e9574c2d7241.rlib: src/lib.rs src/cache.rs src/constants.rs

/work/main/vendor/zstd-safe/target/debug/deps/libzstd_safe-e663e9574c2d7241.rmeta: src/lib.rs src/cache.rs src/constants.rs

src/lib.rs:
src/cache.rs:
src/constants.rs:
