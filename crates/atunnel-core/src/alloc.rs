//! A counting global allocator: live heap bytes and allocations, read by
//! /stats and by the idle-memory measurements. It wraps the system allocator
//! and adds two relaxed atomic updates per call.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, AtomicU64, Ordering};

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// Counts allocations made through another global allocator (the system
/// allocator, jemalloc or mimalloc, say). Install with
/// `#[global_allocator] static A: CountingAlloc = CountingWith(System);`.
pub struct CountingWith<A>(pub A);

/// The counting allocator over the system allocator.
pub type CountingAlloc = CountingWith<System>;

// SAFETY: every method forwards to the inner allocator with the caller's
// arguments unchanged and only updates counters besides.
unsafe impl<A: GlobalAlloc> GlobalAlloc for CountingWith<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        let p = unsafe { self.0.alloc(layout) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let p = unsafe { self.0.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged; `ptr` came from this allocator.
        unsafe { self.0.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let p = unsafe { self.0.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        p
    }
}

/// Heap bytes currently allocated through [`CountingWith`] (0 when it is
/// not the global allocator).
pub fn live_bytes() -> usize {
    LIVE_BYTES.load(Ordering::Relaxed).max(0) as usize
}

/// Allocations made through [`CountingWith`] since start.
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// jemalloc under the counting allocator: the binaries' global allocator.
/// Against glibc's malloc in the same runs it holds less per idle
/// connection, above all per hibernated one, whose freed session memory
/// glibc leaves in fragmented pages (docs/memory.md, "The allocator").
#[cfg(feature = "jemalloc")]
pub type CountingJemalloc = CountingWith<tikv_jemallocator::Jemalloc>;

/// The value to install: `#[global_allocator] static A: CountingJemalloc = COUNTING_JEMALLOC;`,
/// then [`release_with_jemalloc`] at start.
#[cfg(feature = "jemalloc")]
pub const COUNTING_JEMALLOC: CountingJemalloc = CountingWith(tikv_jemallocator::Jemalloc);

/// Points [`release_free_memory`] at jemalloc's purge, for a process whose
/// global allocator is [`CountingJemalloc`].
#[cfg(feature = "jemalloc")]
pub fn release_with_jemalloc() {
    set_release(|| {
        // "arena.<MALLCTL_ARENAS_ALL>.purge": return every arena's dirty pages.
        let name = b"arena.4096.purge\0";
        // SAFETY: a NUL-terminated mallctl name with no old or new value,
        // as this control takes none.
        unsafe {
            tikv_jemalloc_sys::mallctl(
                name.as_ptr().cast(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            );
        }
    });
}

static RELEASE: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Makes [`release_free_memory`] call `release` instead of glibc's
/// malloc_trim: a process built on another allocator installs its purge here.
pub fn set_release(release: fn()) {
    let _ = RELEASE.set(release);
}

/// Asks the allocator to return free heap to the system, as the memory
/// figures are taken "after the allocator has been asked to release free
/// memory".
pub fn release_free_memory() {
    if let Some(release) = RELEASE.get() {
        return release();
    }
    // SAFETY: malloc_trim has no preconditions; it only walks glibc's arenas.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
}
