//! The numbered entries of a procfs directory: the processes in /proc, the
//! descriptors in /proc/<pid>/fd.

use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The entries of `dir` whose names parse as `T`, each with its path. The
/// others (/proc/self, /proc/meminfo) are skipped, and so are entries that
/// fail to read: a process or descriptor may go while the directory is
/// listed.
pub fn numbered_entries<T: FromStr>(
    dir: impl AsRef<Path>,
) -> io::Result<impl Iterator<Item = (T, PathBuf)>> {
    Ok(std::fs::read_dir(dir)?.filter_map(|entry| {
        let entry = entry.ok()?;
        let number = entry.file_name().to_str()?.parse().ok()?;
        Some((number, entry.path()))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, RawFd};

    #[test]
    fn lists_this_process_among_the_processes() {
        let me = std::process::id();
        let (_, path) = numbered_entries::<u32>("/proc")
            .expect("list /proc")
            .find(|(pid, _)| *pid == me)
            .expect("this process is listed");
        assert_eq!(path, Path::new("/proc").join(me.to_string()));
    }

    #[test]
    fn lists_an_open_descriptor() {
        let file = std::fs::File::open("/proc/self/status").expect("open");
        let fds: Vec<RawFd> = numbered_entries("/proc/self/fd")
            .expect("list /proc/self/fd")
            .map(|(fd, _)| fd)
            .collect();
        assert!(fds.contains(&file.as_raw_fd()));
    }

    #[test]
    fn a_missing_directory_is_an_error() {
        assert!(numbered_entries::<u32>("/proc/no-such-directory").is_err());
    }
}
