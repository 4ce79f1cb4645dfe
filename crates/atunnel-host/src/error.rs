//! What can go wrong reading the host: each error names the file.

use std::io;
use std::path::{Path, PathBuf};

/// A reading that failed; the message names the file and what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A cgroupfs or procfs file could not be read.
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A file did not hold what its format says.
    #[error("parse {}: {detail}", path.display())]
    Parse { path: PathBuf, detail: String },
    /// No hierarchy with both a CPU and a memory controller was found.
    #[error("no usable cgroup hierarchy (from /proc/mounts and /proc/self/cgroup): {0}")]
    Unsupported(String),
    /// The files are there but say nothing usable.
    #[error("{0}")]
    Unavailable(String),
}

impl HostError {
    pub(crate) fn parse(path: impl Into<PathBuf>, detail: impl Into<String>) -> Self {
        Self::Parse {
            path: path.into(),
            detail: detail.into(),
        }
    }

    /// Parse errors from the pure parsers name the bare file; this puts it
    /// where it was read (`dir` maps the bare name to its path).
    pub fn located(self, dir: impl Fn(&Path) -> PathBuf) -> Self {
        match self {
            Self::Parse { path, detail } if path.is_relative() => Self::Parse {
                path: dir(&path),
                detail,
            },
            other => other,
        }
    }
}

/// Reads `path` whole.
pub fn read(path: &Path) -> Result<String, HostError> {
    std::fs::read_to_string(path).map_err(|source| HostError::Io {
        op: "read",
        path: path.to_path_buf(),
        source,
    })
}

/// Reads `path`, `None` if it does not exist.
pub fn read_optional(path: &Path) -> Result<Option<String>, HostError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(HostError::Io {
            op: "read",
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_file_and_the_operation() {
        let err = read(Path::new("/nonexistent-dir/memory.stat")).expect_err("no such file");
        assert!(
            err.to_string()
                .starts_with("read /nonexistent-dir/memory.stat: "),
            "{err}"
        );
        assert!(
            read_optional(Path::new("/nonexistent-dir/memory.stat"))
                .expect("absent is not an error")
                .is_none()
        );
    }
}
