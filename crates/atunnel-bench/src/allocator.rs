//! The bench's global allocator, chosen at build time so the allocator
//! comparison in docs/memory.md runs the same code on each: the system
//! allocator (default), `--features jemalloc` or `--features mimalloc`.
//! Each is wrapped in the counting allocator /stats reads, and each brings
//! its own way to hand free memory back to the system.

#[cfg(all(feature = "jemalloc", feature = "mimalloc"))]
compile_error!("choose one allocator feature: jemalloc or mimalloc");

#[cfg(not(any(feature = "jemalloc", feature = "mimalloc")))]
#[global_allocator]
static ALLOC: atunnel_core::alloc::CountingAlloc =
    atunnel_core::alloc::CountingWith(std::alloc::System);

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOC: atunnel_core::alloc::CountingWith<tikv_jemallocator::Jemalloc> =
    atunnel_core::alloc::CountingWith(tikv_jemallocator::Jemalloc);

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOC: atunnel_core::alloc::CountingWith<mimalloc::MiMalloc> =
    atunnel_core::alloc::CountingWith(mimalloc::MiMalloc);

/// The allocator this binary was built with, for reports.
pub const NAME: &str = if cfg!(feature = "jemalloc") {
    "jemalloc"
} else if cfg!(feature = "mimalloc") {
    "mimalloc"
} else {
    "system"
};

/// Points `release_free_memory` at this allocator's purge.
pub fn install() {
    #[cfg(feature = "jemalloc")]
    atunnel_core::alloc::set_release(|| {
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
    #[cfg(feature = "mimalloc")]
    atunnel_core::alloc::set_release(|| {
        // SAFETY: mi_collect has no preconditions; `force` collects all.
        unsafe { libmimalloc_sys::mi_collect(true) }
    });
}
