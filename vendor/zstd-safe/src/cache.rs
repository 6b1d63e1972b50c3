//! Contexts kept for reuse on the thread that dropped them.
//!
//! Creating a context asks the CPU whether it has BMI2 (`ZSTD_cpuSupportsBmi2`, three `cpuid`
//! instructions). On a virtual machine each `cpuid` exits to the hypervisor: about 5 µs on the
//! 2-core machines this project runs on, so 30 µs for a compressor and a decompressor. parquet
//! creates both for every column chunk it reads, which made context creation several percent
//! of a query over many small files. A dropped context is reset (session and parameters, which
//! also drops any dictionary it referenced) and kept here, up to `KEEP` of each kind per
//! thread; `CCtx::try_create` and `DCtx::try_create` take one from here before creating one.
//! The contexts left when the thread ends are freed.

use core::cell::RefCell;
use core::ptr::NonNull;

/// How many contexts of each kind a thread keeps. A parquet reader holds one of each per
/// column it reads, and drops them together when its row group is done.
const KEEP: usize = 16;

struct Kept {
    cctx: std::vec::Vec<NonNull<zstd_sys::ZSTD_CCtx>>,
    dctx: std::vec::Vec<NonNull<zstd_sys::ZSTD_DCtx>>,
}

impl Drop for Kept {
    fn drop(&mut self) {
        for cctx in self.cctx.drain(..) {
            // Safety: a context is kept by one owner, and freed once.
            unsafe { zstd_sys::ZSTD_freeCCtx(cctx.as_ptr()) };
        }
        for dctx in self.dctx.drain(..) {
            // Safety: as above.
            unsafe { zstd_sys::ZSTD_freeDCtx(dctx.as_ptr()) };
        }
    }
}

std::thread_local! {
    static KEPT: RefCell<Kept> = const {
        RefCell::new(Kept { cctx: std::vec::Vec::new(), dctx: std::vec::Vec::new() })
    };
}

/// Runs `f` on this thread's kept contexts; `None` while the thread is ending.
fn with<T>(f: impl FnOnce(&mut Kept) -> T) -> Option<T> {
    KEPT.try_with(|kept| kept.try_borrow_mut().ok().map(|mut kept| f(&mut kept)))
        .ok()
        .flatten()
}

/// A kept compression context, reset, if there is one.
pub(crate) fn take_cctx() -> Option<NonNull<zstd_sys::ZSTD_CCtx>> {
    with(|kept| kept.cctx.pop()).flatten()
}

/// A kept decompression context, reset, if there is one.
pub(crate) fn take_dctx() -> Option<NonNull<zstd_sys::ZSTD_DCtx>> {
    with(|kept| kept.dctx.pop()).flatten()
}

/// Puts `ctx` in the list `of` picks, if it has room; `false` when it has none or the
/// thread is ending.
fn keep<T>(
    ctx: NonNull<T>,
    of: impl FnOnce(&mut Kept) -> &mut std::vec::Vec<NonNull<T>>,
) -> bool {
    with(|kept| {
        let list = of(kept);
        let room = list.len() < KEEP;
        if room {
            list.push(ctx);
        }
        room
    }) == Some(true)
}

/// Keeps `cctx`, which must be reset and own nothing borrowed; frees it when `KEEP` are
/// already kept or the thread is ending.
pub(crate) fn keep_cctx(cctx: NonNull<zstd_sys::ZSTD_CCtx>) {
    if !keep(cctx, |kept| &mut kept.cctx) {
        // Safety: the caller gave up the context.
        unsafe { zstd_sys::ZSTD_freeCCtx(cctx.as_ptr()) };
    }
}

/// Keeps `dctx`, which must be reset and own nothing borrowed; frees it when `KEEP` are
/// already kept or the thread is ending.
pub(crate) fn keep_dctx(dctx: NonNull<zstd_sys::ZSTD_DCtx>) {
    if !keep(dctx, |kept| &mut kept.dctx) {
        // Safety: the caller gave up the context.
        unsafe { zstd_sys::ZSTD_freeDCtx(dctx.as_ptr()) };
    }
}

/// How many compression and decompression contexts this thread keeps.
#[cfg(test)]
pub(crate) fn kept() -> (usize, usize) {
    with(|kept| (kept.cctx.len(), kept.dctx.len())).unwrap_or((0, 0))
}
