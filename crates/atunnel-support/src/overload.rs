//! A memory cgroup's files as the overload guard reads them (cgroup v2:
//! `memory.current`, `memory.max` of 1,000 bytes, `memory.stat`), in a
//! temporary folder, so a test sets the guard's memory pressure by hand.

use std::path::Path;

use atunnel_process::overload::{OverloadConfig, OverloadGuard};

pub struct FakeMemoryCgroup {
    dir: tempfile::TempDir,
}

impl FakeMemoryCgroup {
    /// `used` of 1,000 bytes.
    pub fn new(used: u64) -> Self {
        let cgroup = Self {
            dir: tempfile::tempdir().expect("tempdir"),
        };
        cgroup.set(used);
        cgroup
    }

    /// Now `used` of 1,000 bytes (no reclaimable page cache).
    pub fn set(&self, used: u64) {
        let write = |name: &str, text: String| {
            std::fs::write(self.dir.path().join(name), text).expect("write cgroup file")
        };
        write("memory.current", format!("{used}\n"));
        write("memory.max", "1000\n".into());
        write("memory.stat", "anon 0\ninactive_file 0\n".into());
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A guard reading this cgroup, the rest of `config` as given.
    pub fn guard(&self, config: OverloadConfig) -> std::sync::Arc<OverloadGuard> {
        OverloadGuard::new(OverloadConfig {
            memory_cgroup: Some(self.path().to_path_buf()),
            ..config
        })
        .expect("guard")
    }
}
