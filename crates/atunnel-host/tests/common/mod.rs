//! What the host's parser tests share: files captured from real hosts.

/// The text of `tests/fixtures/cgroup/<path>`.
macro_rules! fixture {
    ($path:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/cgroup/",
            $path
        ))
    };
}
