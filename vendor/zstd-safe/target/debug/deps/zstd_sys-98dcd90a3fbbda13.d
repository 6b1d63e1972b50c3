/work/main/vendor/zstd-safe/target/debug/deps/zstd_sys-98dcd90a3fbbda13.d: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/zstd-sys-2.1.3+zstd.1.5.7/src/lib.rs /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/zstd-sys-2.1.3+zstd.1.5.7/src/bindings_zstd.rs /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/zstd-sys-2.1.3+zstd.1.5.7/src/bindings_zdict.rs

/work/main/vendor/zstd-safe/target/debug/deps/libzstd_sys-98dcd90a3fbbda13.rlib: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/zstd-sys-2.1.3+zstd.1.5.7/src/lib.rs /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/zstd-sys-2.1.3+zstd.1.5.7/src/bindings_zstd.rs /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/zstd-sys-2.1.3+zstd.1.5.7/src/bindings_zdict.rs

/work/main/vendor/zstd-safe/target/debug/deps/libzstd_sys-98dcd90a3fbbda13.rmeta: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/zstd-sys-2.1.3+zstd.1.5.7/src/lib.rs /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/zstd-sys-2.1.3+zstd.1.5.7/src/bindings_zstd.rs /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/zstd-sys-2.1.3+zstd.1.5.7/src/bindings_zdict.rs

/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/zstd-sys-2.1.3+zstd.1.5.7/src/lib.rs:
/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/zstd-sys-2.1.3+zstd.1.5.7/src/bindings_zstd.rs:
/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/zstd-sys-2.1.3+zstd.1.5.7/src/bindings_zdict.rs:
