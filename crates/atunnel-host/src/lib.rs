//! Reads the host: which cgroup version and where this process's cgroups
//! are ([`location`]), the memory it is charged against its limit and the
//! kernel's own ([`memory`]), a cgroup's counters for a measurer ([`counters`]), its
//! descriptor limit and count ([`descriptors`]), and the processes or
//! descriptors listed in a proc directory ([`proc_dir`]). The overload guard, the
//! tunnel's per-actor budgets and the bench read cgroup files through it
//! alone; the bench's and tests' readers of /proc mostly list through
//! [`proc_dir`], while a few that read one file or one descriptor table
//! read it where they use it.
//!
//! The cgroup files are parsed by hand: cgroups-rs (MIT OR Apache-2.0,
//! v1 and v2) brings zbus and a second nix into every binary and reads a
//! dozen files per memory figure where the guard reads three, and no
//! smaller crate reads v1. The CPU quota is not read here: std's
//! `available_parallelism` reads it (v1 and v2), and tokio sizes its
//! runtime from that.
//!
//! Reads only (creating and limiting cgroups is the bench's); depends on no
//! other atunnel crate, and every one may depend on it.

pub mod counters;
pub mod descriptors;
mod error;
pub mod location;
pub mod memory;
pub mod parse;
pub mod proc_dir;

pub use counters::{CgroupDirs, CgroupSample};
pub use descriptors::{nofile_soft_limit, open_descriptors};
pub use error::{HostError, read, read_optional};
pub use location::{CgroupVersion, Layout, detect_layout};
pub use memory::{MemoryCharge, MemorySource};
pub use proc_dir::numbered_entries;
