//! A full disk under the run folder (a real tmpfs, so this runs as root and
//! fails, not skips, otherwise): writing a report fails with an error that
//! names the file and "no space", and leaves the previous complete file in
//! place, never a truncated one.

use std::io::Write;
use std::path::Path;
use std::process::Command;

use atunnel_bench::load::results::{Results, ScenarioResult, write_results_json};
use atunnel_bench::scenario::Scenario;

/// A 64 KiB tmpfs mounted for the test's life.
struct SmallDisk(tempfile::TempDir);

impl SmallDisk {
    fn mount() -> Self {
        assert!(
            nix::unistd::geteuid().is_root(),
            "the full-disk test mounts a tmpfs and must run as root"
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "atunnel-bench-test"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(status.success(), "mount tmpfs: {status}");
        Self(dir)
    }

    fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

fn results(notes: usize) -> Results {
    Results {
        scenarios: vec![ScenarioResult::without_summary(
            Scenario::EgressIdle,
            (0..notes).map(|i| format!("note {i:06}")).collect(),
        )],
        ..Results::default()
    }
}

#[test]
fn a_full_disk_keeps_the_last_complete_results_and_names_the_file() {
    let disk = SmallDisk::mount();
    let first = results(10);
    write_results_json(disk.path(), &first).expect("room for the first results");

    // Fill the disk to the last block.
    let mut filler = std::fs::File::create(disk.path().join("filler")).expect("filler");
    let block = [0u8; 4096];
    while filler.write_all(&block).is_ok() {}
    drop(filler);

    let err = write_results_json(disk.path(), &results(10_000)).expect_err("the disk is full");
    assert_eq!(err.kind(), std::io::ErrorKind::StorageFull, "{err}");
    assert!(err.to_string().contains("results.json"), "{err}");

    let kept = std::fs::read_to_string(disk.path().join("results.json")).expect("read");
    let kept: Results = serde_json::from_str(&kept).expect("the kept file is whole");
    assert_eq!(kept, first, "the previous results were replaced");
    // Whatever the partial file is called, none is left behind.
    let mut left: Vec<String> = std::fs::read_dir(disk.path())
        .expect("list the disk")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        ["filler", "results.json"],
        "a partial file was left behind"
    );
}
