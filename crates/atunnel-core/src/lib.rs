//! The byte-moving core of atunnel.
//!
//! Nothing here knows about actors, sandboxes or certificates: it moves bytes
//! between two streams while holding as little memory as possible when they
//! are idle.
//!
//! Depends on no other atunnel crate; every other one may depend on it.

pub mod addr_text;
pub mod alloc;
pub mod endpoint;
pub mod listener;
pub mod original_dst;
pub mod pool;
pub mod relay;
pub mod sockopt;
#[cfg(feature = "test-util")]
pub mod test_util;

pub use endpoint::{Chunk, Endpoint, H2Stream};
pub use listener::{Listener, ListenerCounters, ListenerStats, RefusalPace};
pub use pool::{BufferPool, PoolStats, PooledBuf, ShareStats};
pub use relay::{RelayError, RelayStats, relay};
