//! Memory counted where it is allocated. DataFusion's pool counts what an operator reserves,
//! not what a function returns, what planning builds or what an aggregate's state grows to;
//! so, as ClickHouse's memory tracker does in its allocator, every allocation made on behalf
//! of a query counts against the query and against the service:
//!
//! - [`Counted`] is the process's allocator (the `verdict` binary declares it). Each block
//!   carries, in the 8 bytes before it, the query it was allocated for; freeing the block
//!   gives its bytes back to that query whichever thread frees it (a batch made by a query
//!   and freed by the connection writing it out).
//! - A thread works for a query while it polls the query's planning or execution
//!   ([`QueryMemory::enter`]), and DataFusion's own tasks inherit the query of the thread that
//!   spawned them ([`install_tracer`]), so every thread that runs its work counts.
//! - Past its limit (or when the queries together pass the service's), a query is marked;
//!   its stream ends with `memory_limit` at its next batch, and its tasks stop being polled,
//!   so it allocates at most what one step of one operator makes after the mark. A single
//!   call that builds a huge value is refused before it allocates ([`crate::bounded_fns`]).
//!
//! The cost is 8 bytes a block (more for blocks aligned past 8) and, for the blocks of a
//! query, an addition to what the thread holds back for it, with two atomic additions to
//! the shared counts once every 256 KiB; `verdict-bench query` measures it against
//! `VERDICT_COUNT_MEMORY=off`, which the allocator reads once, at the process's first
//! allocation, and which then leaves every block as the inner allocator made it.

use std::alloc::{GlobalAlloc, Layout};
use std::any::Any;
use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU32, Ordering};
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use futures::task::AtomicWaker;

/// Queries counted at once; past this a query runs uncounted (and the service logs it).
const SLOTS: usize = 256;

/// The environment variable that turns counting off (`off`), read once.
pub const SWITCH: &str = "VERDICT_COUNT_MEMORY";

/// One query's count.
struct Slot {
    busy: AtomicBool,
    generation: AtomicU32,
    used: AtomicI64,
    /// The most `used` has been since the query claimed the slot.
    peak: AtomicI64,
    limit: AtomicI64,
    exceeded: AtomicBool,
    /// Set when the queries together passed the service's budget (not the query's own).
    service: AtomicBool,
    waker: AtomicWaker,
}

impl Slot {
    const fn new() -> Self {
        Self {
            busy: AtomicBool::new(false),
            generation: AtomicU32::new(0),
            used: AtomicI64::new(0),
            peak: AtomicI64::new(0),
            limit: AtomicI64::new(i64::MAX),
            exceeded: AtomicBool::new(false),
            service: AtomicBool::new(false),
            waker: AtomicWaker::new(),
        }
    }
}

static TABLE: [Slot; SLOTS] = [const { Slot::new() }; SLOTS];

/// Bytes counted to running queries, together.
static TOTAL: AtomicI64 = AtomicI64::new(0);

/// The service's budget for all queries together.
static SERVICE_LIMIT: AtomicI64 = AtomicI64::new(i64::MAX);

/// 0 not decided yet, 1 counting, 2 off.
static MODE: AtomicU8 = AtomicU8::new(0);

thread_local! {
    /// The query this thread works for now: `(slot + 1) << 32 | generation`, 0 for none.
    static CURRENT: Cell<u64> = const { Cell::new(0) };
}

fn current() -> u64 {
    CURRENT.try_with(Cell::get).unwrap_or(0)
}

fn swap_current(tag: u64) -> u64 {
    CURRENT.try_with(|c| c.replace(tag)).unwrap_or(0)
}

/// The slot of a live tag.
fn slot_of(tag: u64) -> Option<&'static Slot> {
    let index = (tag >> 32) as usize;
    if index == 0 || index > SLOTS {
        return None;
    }
    let slot = &TABLE[index - 1];
    (slot.generation.load(Ordering::Relaxed) == tag as u32).then_some(slot)
}

/// Bytes a thread counts to a query before it adds them to the query's shared count (as
/// ClickHouse's tracker holds back "untracked memory"): the shared counters are then
/// written once per 256 KiB rather than once per block, and a query passes its limit by at
/// most this much per thread before it is marked.
const HELD_BACK: i64 = 256 << 10;

thread_local! {
    /// Bytes this thread counted to a query and has not added to its count yet.
    static HELD: Cell<(u64, i64)> = const { Cell::new((0, 0)) };
}

/// Counts `bytes` (negative: given back) to the query of `tag`, through what this thread
/// holds back.
fn count(tag: u64, bytes: i64) {
    let due = HELD.try_with(|held| {
        let (held_tag, held_bytes) = held.get();
        if held_tag == tag {
            let sum = held_bytes + bytes;
            if sum.abs() < HELD_BACK {
                held.set((tag, sum));
                return None;
            }
            held.set((tag, 0));
            Some((tag, sum))
        } else if bytes.abs() < HELD_BACK {
            // Another query's block: what was held for the last one is added to its count.
            held.set((tag, bytes));
            Some((held_tag, held_bytes))
        } else {
            Some((tag, bytes))
        }
    });
    match due {
        Ok(None) => {}
        Ok(Some((tag, bytes))) => add(tag, bytes),
        Err(_) => add(tag, bytes),
    }
}

/// Adds `bytes` to the shared count of the query of `tag` (and the service's), marking the
/// query when it passes its limit or the queries together the service's budget.
fn add(tag: u64, bytes: i64) {
    if bytes == 0 {
        return;
    }
    let Some(slot) = slot_of(tag) else { return };
    let used = slot.used.fetch_add(bytes, Ordering::Relaxed) + bytes;
    let total = TOTAL.fetch_add(bytes, Ordering::Relaxed) + bytes;
    if bytes > 0 {
        slot.peak.fetch_max(used, Ordering::Relaxed);
    }
    if bytes > 0 && !slot.exceeded.load(Ordering::Relaxed) {
        if used > slot.limit.load(Ordering::Relaxed) {
            slot.exceeded.store(true, Ordering::Relaxed);
        } else if total > SERVICE_LIMIT.load(Ordering::Relaxed) {
            slot.service.store(true, Ordering::Relaxed);
            slot.exceeded.store(true, Ordering::Relaxed);
        }
    }
}

fn counting() -> bool {
    match MODE.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            // SAFETY: getenv reads the environment without allocating; the name is a C
            // string literal.
            let value = unsafe { libc::getenv(c"VERDICT_COUNT_MEMORY".as_ptr()) };
            // SAFETY: a non-null result of getenv is a NUL-terminated string.
            let off = !value.is_null() && unsafe { std::ffi::CStr::from_ptr(value) } == c"off";
            let mode = if off { 2 } else { 1 };
            // The first decision stands: blocks already made must be freed as they were made.
            match MODE.compare_exchange(0, mode, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => mode == 1,
                Err(decided) => decided == 1,
            }
        }
    }
}

/// Whether the process's allocator counts memory per query ([`Counted`] declared as the
/// global allocator, and not switched off).
pub fn is_counting() -> bool {
    MODE.load(Ordering::Relaxed) == 1
}

/// Why the query this thread works for must stop, if it must: `Some(false)` past its own
/// limit, `Some(true)` past the service's budget (see [`QueryMemory::state`]).
pub fn current_state() -> Option<bool> {
    let slot = slot_of(current())?;
    slot.exceeded
        .load(Ordering::Relaxed)
        .then(|| slot.service.load(Ordering::Relaxed))
}

/// The allocator that counts each block against the query it was made for; `A` makes the
/// blocks.
#[derive(Debug, Default)]
pub struct Counted<A> {
    inner: A,
}

impl<A> Counted<A> {
    /// Counting over `inner`.
    pub const fn new(inner: A) -> Self {
        Self { inner }
    }
}

impl<A: GlobalAlloc> Counted<A> {
    /// A block for `layout` from `make` (the inner allocator's alloc or alloc_zeroed), with
    /// the tag of the query this thread works for before it.
    ///
    /// # Safety
    /// `layout` has a non-zero size; `make` returns a block of the layout it is given, or
    /// null.
    unsafe fn made(&self, layout: Layout, make: impl FnOnce(Layout) -> *mut u8) -> *mut u8 {
        if !counting() {
            return make(layout);
        }
        let Some(wide) = widened(layout) else {
            return std::ptr::null_mut();
        };
        let base = make(wide);
        if base.is_null() {
            return base;
        }
        let tag = current();
        // SAFETY: the block holds header + size bytes; the tag goes in the 8 before the
        // returned pointer, which is aligned to at least 8.
        unsafe {
            let ptr = base.add(header(layout));
            (ptr.sub(8) as *mut u64).write(tag);
            if tag != 0 {
                count(tag, layout.size() as i64);
            }
            ptr
        }
    }
}

/// The bytes before a block: 8 for the tag, or the block's alignment when larger.
fn header(layout: Layout) -> usize {
    layout.align().max(8)
}

fn widened(layout: Layout) -> Option<Layout> {
    let h = header(layout);
    Layout::from_size_align(layout.size().checked_add(h)?, layout.align().max(8)).ok()
}

// SAFETY: every block handed out is the inner allocator's block of the widened layout,
// offset by the header; dealloc and realloc undo the same offset for the same layout.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counted<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.made(layout, |l| self.inner.alloc(l)) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.made(layout, |l| self.inner.alloc_zeroed(l)) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !counting() {
            // SAFETY: the caller's contract, passed on.
            return unsafe { self.inner.dealloc(ptr, layout) };
        }
        // SAFETY: `ptr` came from `alloc` with this layout: the tag is before it, the base
        // a header before it, and the inner block has the widened layout.
        unsafe {
            let tag = (ptr.sub(8) as *const u64).read();
            if tag != 0 {
                count(tag, -(layout.size() as i64));
            }
            let wide = widened(layout).unwrap_unchecked();
            self.inner.dealloc(ptr.sub(header(layout)), wide);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !counting() {
            // SAFETY: the caller's contract, passed on.
            return unsafe { self.inner.realloc(ptr, layout, new_size) };
        }
        let h = header(layout);
        let Some(new_wide) = new_size.checked_add(h) else {
            return std::ptr::null_mut();
        };
        // SAFETY: as in `dealloc`; the inner realloc keeps the header, the first bytes.
        unsafe {
            let tag = (ptr.sub(8) as *const u64).read();
            let wide = widened(layout).unwrap_unchecked();
            let base = self.inner.realloc(ptr.sub(h), wide, new_wide);
            if base.is_null() {
                return base;
            }
            if tag != 0 {
                count(tag, new_size as i64 - layout.size() as i64);
            }
            base.add(h)
        }
    }
}

/// One query's count: claimed when it is admitted, given back when it ends (blocks it made
/// and that live on, an answer kept in a cache, are no longer counted then).
#[derive(Debug)]
pub struct QueryMemory {
    tag: u64,
    limit: usize,
}

impl QueryMemory {
    /// A count for a query of at most `limit` bytes; uncounted (never marked) when every
    /// slot is taken or the allocator does not count.
    pub fn claim(limit: usize) -> Self {
        if !is_counting() {
            return Self { tag: 0, limit };
        }
        for (i, slot) in TABLE.iter().enumerate() {
            if slot
                .busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                slot.used.store(0, Ordering::Relaxed);
                slot.peak.store(0, Ordering::Relaxed);
                slot.exceeded.store(false, Ordering::Relaxed);
                slot.service.store(false, Ordering::Relaxed);
                slot.limit
                    .store(i64::try_from(limit).unwrap_or(i64::MAX), Ordering::Relaxed);
                let generation = slot.generation.fetch_add(1, Ordering::AcqRel) + 1;
                return Self {
                    tag: ((i as u64 + 1) << 32) | u64::from(generation),
                    limit,
                };
            }
        }
        tracing::warn!(
            slots = SLOTS,
            "every memory count is in use: a query runs uncounted"
        );
        Self { tag: 0, limit }
    }

    /// Sets the budget of all queries together.
    pub fn set_service_limit(bytes: usize) {
        SERVICE_LIMIT.store(i64::try_from(bytes).unwrap_or(i64::MAX), Ordering::Relaxed);
    }

    /// Bytes counted to all running queries now.
    pub fn service_used() -> usize {
        TOTAL.load(Ordering::Relaxed).max(0) as usize
    }

    /// The query's limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes the query holds now.
    pub fn used(&self) -> usize {
        slot_of(self.tag).map_or(0, |s| s.used.load(Ordering::Relaxed).max(0) as usize)
    }

    /// The most bytes the query has held at once so far (0 when it runs uncounted).
    pub fn peak(&self) -> usize {
        slot_of(self.tag).map_or(0, |s| s.peak.load(Ordering::Relaxed).max(0) as usize)
    }

    /// Why the query must stop: `Some(false)` past its own limit, `Some(true)` past the
    /// service's budget; `None` while it is within both.
    pub fn state(&self) -> Option<bool> {
        let slot = slot_of(self.tag)?;
        slot.exceeded
            .load(Ordering::Relaxed)
            .then(|| slot.service.load(Ordering::Relaxed))
    }

    /// [`Self::state`], and `cx`'s task is woken when a task of the query stops for the
    /// limit.
    pub fn check(&self, cx: &Context<'_>) -> Option<bool> {
        if let Some(slot) = slot_of(self.tag) {
            slot.waker.register(cx.waker());
        }
        self.state()
    }

    /// `f`, run while this thread works for the query.
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> T {
        let before = swap_current(self.tag);
        let out = f();
        swap_current(before);
        out
    }

    /// `fut`, polled while the polling thread works for the query.
    pub fn enter<F: Future>(&self, fut: F) -> Entered<F> {
        Entered {
            tag: self.tag,
            inner: fut,
            task: false,
        }
    }
}

impl Drop for QueryMemory {
    fn drop(&mut self) {
        let Some(slot) = slot_of(self.tag) else {
            return;
        };
        slot.generation.fetch_add(1, Ordering::AcqRel);
        let left = slot.used.swap(0, Ordering::Relaxed);
        TOTAL.fetch_sub(left, Ordering::Relaxed);
        slot.waker.take();
        slot.busy.store(false, Ordering::Release);
    }
}

pin_project_lite::pin_project! {
    /// A future polled for a query (see [`QueryMemory::enter`]).
    pub struct Entered<F> {
        tag: u64,
        #[pin]
        inner: F,
        task: bool,
    }
}

impl<F: Future> Future for Entered<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        if *this.task
            && let Some(slot) = slot_of(*this.tag)
            && slot.exceeded.load(Ordering::Relaxed)
        {
            // A task of a query past its limit is not polled again; the query's stream,
            // woken, ends it.
            slot.waker.wake();
            return Poll::Pending;
        }
        let before = swap_current(*this.tag);
        let out = this.inner.poll(cx);
        swap_current(before);
        out
    }
}

/// Carries the query of the spawning thread into the tasks DataFusion spawns.
struct Inherit;

impl datafusion::common::runtime::JoinSetTracer for Inherit {
    fn trace_future(
        &self,
        fut: BoxFuture<'static, Box<dyn Any + Send>>,
    ) -> BoxFuture<'static, Box<dyn Any + Send>> {
        match current() {
            0 => fut,
            tag => Box::pin(Entered {
                tag,
                inner: fut,
                task: true,
            }),
        }
    }

    fn trace_block(
        &self,
        f: Box<dyn FnOnce() -> Box<dyn Any + Send> + Send>,
    ) -> Box<dyn FnOnce() -> Box<dyn Any + Send> + Send> {
        match current() {
            0 => f,
            tag => Box::new(move || {
                let before = swap_current(tag);
                let out = f();
                swap_current(before);
                out
            }),
        }
    }
}

/// Makes DataFusion's tasks count against the query that spawned them (once per process;
/// later calls do nothing).
pub fn install_tracer() {
    static INHERIT: Inherit = Inherit;
    let _ = datafusion::common::runtime::set_join_set_tracer(&INHERIT);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_holds_back_a_little_of_a_querys_count_and_a_large_block_counts_at_once() {
        // The test binary's allocator is not `Counted`: counting is switched on for the
        // table alone.
        MODE.store(1, Ordering::Relaxed);
        let q = QueryMemory::claim(1 << 20);
        let kib = |n: i64| n << 10;
        count(q.tag, kib(100));
        count(q.tag, kib(100));
        assert_eq!(q.used(), 0, "200 KiB held back by this thread");
        count(q.tag, kib(100));
        assert_eq!(
            q.used(),
            300 << 10,
            "past 256 KiB, added to the shared count"
        );
        assert_eq!(q.state(), None);
        // Another query's block: what was held for the first is added to its count.
        let other = QueryMemory::claim(1 << 20);
        count(q.tag, kib(10));
        count(other.tag, kib(1));
        assert_eq!(q.used(), 310 << 10);
        // Freed: the count goes down, its peak stays.
        count(q.tag, -kib(300));
        assert_eq!((q.used(), q.peak()), (10 << 10, 310 << 10));
        // A block past the limit is counted at once and marks the query.
        count(q.tag, kib(1100));
        assert_eq!(q.state(), Some(false));
        assert_eq!(q.peak(), 1110 << 10);
    }

    #[test]
    fn a_header_keeps_the_blocks_alignment() {
        for align in [1, 2, 4, 8, 16, 64, 128] {
            let layout = Layout::from_size_align(24, align).unwrap();
            let h = header(layout);
            assert_eq!(h % align, 0, "{align}");
            assert!(h >= 8);
            assert_eq!(widened(layout).unwrap().size(), 24 + h);
        }
    }
}
