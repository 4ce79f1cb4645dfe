//! The bench's global allocator, chosen at build time so the allocator
//! comparison in docs/memory.md runs the same code on each: jemalloc (the
//! default, as in the `atunnel` binary), the system allocator
//! (`--no-default-features`) or mimalloc (`--no-default-features
//! --features mimalloc`).
//! Each is wrapped in the counting allocator /stats reads, and each brings
//! its own way to hand free memory back to the system.

#[cfg(all(feature = "jemalloc", feature = "mimalloc"))]
compile_error!("choose one allocator: mimalloc needs --no-default-features");

#[cfg(not(any(feature = "jemalloc", feature = "mimalloc")))]
#[global_allocator]
static ALLOC: atunnel_core::alloc::CountingAlloc =
    atunnel_core::alloc::CountingWith(std::alloc::System);

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOC: atunnel_core::alloc::CountingJemalloc = atunnel_core::alloc::COUNTING_JEMALLOC;

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
    atunnel_core::alloc::release_with_jemalloc();
    #[cfg(feature = "mimalloc")]
    atunnel_core::alloc::set_release(|| {
        // SAFETY: mi_collect has no preconditions; `force` collects all.
        unsafe { libmimalloc_sys::mi_collect(true) }
    });
}
