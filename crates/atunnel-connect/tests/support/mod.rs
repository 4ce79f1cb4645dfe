//! Test fixtures shared by this crate's test binaries.

pub mod chunked;
