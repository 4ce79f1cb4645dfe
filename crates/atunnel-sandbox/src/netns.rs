//! Named network namespaces, and a dedicated thread that enters one only to
//! create something there (a socket, a netlink connection, a child process).
//!
//! A socket belongs to the namespace it was created in for its whole life, so
//! entering a namespace is needed only at creation. The async runtime's
//! threads never change namespace: every `setns` happens on the executor's own
//! thread, which returns to its home namespace after each job.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;

use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;
use tokio::sync::oneshot;

/// Where named namespaces live, as `ip netns` keeps them.
pub const NETNS_DIR: &str = "/run/netns";

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("network namespace {name}: {op}: {source}")]
    Sys {
        name: String,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("network namespace {0} already exists")]
    Exists(String),
    #[error(
        "{0:?} cannot name a network namespace: one path component of 1 to 255 bytes, not . or .."
    )]
    BadName(String),
    #[error("the namespace executor thread is gone")]
    ExecutorGone,
}

fn sys<'a>(name: &'a str, op: &'static str) -> impl FnOnce(nix::Error) -> NetnsError + 'a {
    move |e| NetnsError::Sys {
        name: name.to_string(),
        op,
        source: std::io::Error::from(e),
    }
}

fn io<'a>(name: &'a str, op: &'static str) -> impl FnOnce(std::io::Error) -> NetnsError + 'a {
    move |source| NetnsError::Sys {
        name: name.to_string(),
        op,
        source,
    }
}

/// An open network namespace. Cheap to clone; the descriptor stays open
/// while any clone lives.
#[derive(Clone, Debug)]
pub struct NetNs {
    name: String,
    fd: Arc<OwnedFd>,
}

impl NetNs {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> PathBuf {
        Path::new(NETNS_DIR).join(&self.name)
    }

    /// The calling thread's own namespace (the host's, for a thread that
    /// never entered another), so links can be made between it and a named
    /// one. Its name is only for messages.
    pub fn current() -> Result<Self, NetnsError> {
        let file = File::open("/proc/thread-self/ns/net").map_err(io("self", "open"))?;
        Ok(Self {
            name: "self".to_string(),
            fd: Arc::new(file.into()),
        })
    }

    /// Opens a named namespace left by an earlier process, if there is
    /// one: `None` when the name is missing or its file is not a namespace
    /// (a process that died between making the mount point and mounting
    /// it leaves an empty file, which `setns` would refuse).
    pub fn open_existing(name: &str) -> Result<Option<Self>, NetnsError> {
        check_name(name)?;
        let file = match File::open(Path::new(NETNS_DIR).join(name)) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(name, "open")(e)),
        };
        let fs = nix::sys::statfs::fstatfs(&file).map_err(sys(name, "statfs"))?;
        if fs.filesystem_type() != nix::sys::statfs::NSFS_MAGIC {
            return Ok(None);
        }
        Ok(Some(Self {
            name: name.to_string(),
            fd: Arc::new(file.into()),
        }))
    }

    /// Opens an existing named namespace.
    pub fn open(name: &str) -> Result<Self, NetnsError> {
        check_name(name)?;
        let file = File::open(Path::new(NETNS_DIR).join(name)).map_err(io(name, "open"))?;
        Ok(Self {
            name: name.to_string(),
            fd: Arc::new(file.into()),
        })
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// The thread that enters namespaces. One per process is enough: jobs are
/// short (create a socket and leave).
#[derive(Clone)]
pub struct NsExecutor {
    jobs: mpsc::Sender<Job>,
}

impl NsExecutor {
    /// Starts the executor thread in the caller's namespace, its home.
    pub fn start() -> Result<Self, NetnsError> {
        let home: OwnedFd = File::open("/proc/thread-self/ns/net")
            .map_err(io("self", "open own namespace"))?
            .into();
        let (jobs, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("atunnel-netns".into())
            .spawn(move || {
                // Each job enters its namespace and leaves it again (see
                // `run_in`); the home descriptor is kept for the thread's life.
                let _home = home;
                while let Ok(job) = rx.recv() {
                    job();
                }
            })
            .map_err(io("self", "spawn executor thread"))?;
        Ok(Self { jobs })
    }

    async fn submit<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, NetnsError> {
        let (tx, rx) = oneshot::channel();
        self.jobs
            .send(Box::new(move || {
                let _ = tx.send(f());
            }))
            .map_err(|_| NetnsError::ExecutorGone)?;
        rx.await.map_err(|_| NetnsError::ExecutorGone)
    }

    /// Runs `f` inside `ns` on the executor thread and returns its result.
    pub async fn run_in<T: Send + 'static>(
        &self,
        ns: &NetNs,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, NetnsError> {
        let ns = ns.clone();
        self.submit(move || -> Result<T, NetnsError> {
            let home: OwnedFd = File::open("/proc/thread-self/ns/net")
                .map_err(io(&ns.name, "open home namespace"))?
                .into();
            nix::sched::setns(ns.fd.as_fd(), CloneFlags::CLONE_NEWNET)
                .map_err(sys(&ns.name, "setns"))?;
            let out = f();
            // Returning to the namespace we just left cannot fail while its
            // descriptor is open; if it did, every later job would run in the
            // wrong namespace, so stop the process rather than continue.
            if let Err(e) = nix::sched::setns(home.as_fd(), CloneFlags::CLONE_NEWNET) {
                eprintln!("atunnel: cannot return the netns thread to its namespace: {e}");
                std::process::abort();
            }
            Ok(out)
        })
        .await?
    }

    /// Creates the named namespace `/run/netns/<name>` and opens it.
    pub async fn create(&self, name: &str) -> Result<NetNs, NetnsError> {
        let name = name.to_string();
        self.submit(move || create_named(&name)).await?
    }

    /// Opens the named namespace `name` if an earlier process left it
    /// (`true`), else creates it (`false`), replacing a mount point that is
    /// not a namespace.
    pub async fn open_or_create(&self, name: &str) -> Result<(NetNs, bool), NetnsError> {
        let name = name.to_string();
        self.submit(move || match NetNs::open_existing(&name)? {
            Some(ns) => Ok((ns, true)),
            None => {
                delete_named(&name)?;
                Ok((create_named(&name)?, false))
            }
        })
        .await?
    }

    /// Removes the named namespace `name` (the kernel frees it, and the
    /// interfaces in it, once nothing else holds it open). Missing is fine.
    pub async fn delete(&self, name: &str) -> Result<(), NetnsError> {
        let name = name.to_string();
        self.submit(move || delete_named(&name)).await?
    }
}

/// A name is one file in /run/netns: a name from an actor's uid must not
/// reach another directory (`../x`) or be refused by the filesystem late.
fn check_name(name: &str) -> Result<(), NetnsError> {
    let bad = name.is_empty()
        || name.len() > 255
        || name == "."
        || name == ".."
        || name.contains(['/', '\0']);
    if bad {
        return Err(NetnsError::BadName(name.to_string()));
    }
    Ok(())
}

fn create_named(name: &str) -> Result<NetNs, NetnsError> {
    check_name(name)?;
    std::fs::create_dir_all(NETNS_DIR).map_err(io(name, "create /run/netns"))?;
    let path = Path::new(NETNS_DIR).join(name);
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
    {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(NetnsError::Exists(name.into()));
        }
        Err(e) => return Err(io(name, "create mount point")(e)),
    }
    let home: OwnedFd = File::open("/proc/thread-self/ns/net")
        .map_err(io(name, "open home namespace"))?
        .into();
    let made = (|| {
        nix::sched::unshare(CloneFlags::CLONE_NEWNET).map_err(sys(name, "unshare"))?;
        nix::mount::mount(
            Some("/proc/thread-self/ns/net"),
            &path,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(sys(name, "bind mount"))
    })();
    if let Err(e) = nix::sched::setns(home.as_fd(), CloneFlags::CLONE_NEWNET) {
        eprintln!("atunnel: cannot return the netns thread to its namespace: {e}");
        std::process::abort();
    }
    if let Err(e) = made {
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    NetNs::open(name)
}

fn delete_named(name: &str) -> Result<(), NetnsError> {
    check_name(name)?;
    let path = Path::new(NETNS_DIR).join(name);
    match nix::mount::umount2(&path, MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::Error::ENOENT) | Err(nix::Error::EINVAL) => {}
        Err(e) => return Err(sys(name, "unmount")(e)),
    }
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(name, "remove mount point")(e)),
    }
}

/// The names in /run/netns that start with `prefix`, sorted (none if the
/// folder is missing).
pub fn list_prefixed(prefix: &str) -> std::io::Result<Vec<String>> {
    let entries = match std::fs::read_dir(NETNS_DIR) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for entry in entries {
        // A name that is not UTF-8 is not one atunnel made.
        if let Ok(name) = entry?.file_name().into_string()
            && name.starts_with(prefix)
        {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// Whether a named namespace exists.
pub fn exists(name: &str) -> bool {
    Path::new(NETNS_DIR).join(name).exists()
}

impl std::os::fd::AsRawFd for NetNs {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_would_leave_run_netns_are_refused() {
        for bad in ["", ".", "..", "../x", "a/b", "a\0b", &"x".repeat(256)] {
            assert!(
                matches!(check_name(bad), Err(NetnsError::BadName(_))),
                "{bad:?}"
            );
        }
        for good in ["atn-uid-1", "a.b", "..x", &"x".repeat(255)] {
            assert!(check_name(good).is_ok(), "{good:?}");
        }
    }
}
