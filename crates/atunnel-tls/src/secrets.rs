//! The TLS 1.3 traffic secrets a hibernated connection needs to follow key
//! updates (RFC 8446 section 7.2), taken from rustls as it derives them.
//!
//! rustls hands out a connection's traffic keys (`dangerous_extract_secrets`)
//! but not the secrets they come from, and only the secrets lead to the next
//! keys. Its one way to give them out is the config's [`rustls::KeyLog`],
//! called with `CLIENT_TRAFFIC_SECRET_0` and `SERVER_TRAFFIC_SECRET_0` while
//! it processes the ClientHello that completes the key exchange. The log is
//! shared by every connection of a config, so each secret must be tied to
//! its connection:
//!
//! - rustls derives them inside `process_new_packets`, which tokio-rustls
//!   calls right after `read_tls` read from [`crate::stream::RecordTracking`]
//!   on the same thread, with no other connection's code in between. So the
//!   socket notes its connection id in a thread-local before each read of
//!   its handshake, and the log files what it is given under that id.
//! - The connection takes its secrets out on its next I/O (the server's
//!   flight is written just after), microseconds later, and keeps them
//!   itself. What is left here belongs to connections that died in between;
//!   a connection dropped while waiting removes its own, and the store keeps
//!   at most [`PENDING_CAP`] entries, oldest out first, so connections that
//!   never finish their handshake cannot grow it.
//! - A hibernated connection goes on with the keys rustls hands over and
//!   needs its secrets only at a key update, where they are first checked
//!   against those keys (`records::Direction::next_generation`): a secret
//!   filed under the wrong connection can never be used, only fail that
//!   check, which ends the connection.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Most secrets waiting to be taken. Entries live from rustls deriving them
/// to the same connection's next write, within one poll of its handshake,
/// so at any moment there are about as many as runtime threads; the rest
/// are leftovers of connections that failed in between.
pub const PENDING_CAP: usize = 64;

/// The longest hash of a TLS 1.3 suite (SHA-384), the size of its secrets.
pub const MAX_SECRET_LEN: usize = 48;

const CLIENT_LABEL: &str = "CLIENT_TRAFFIC_SECRET_0";
const SERVER_LABEL: &str = "SERVER_TRAFFIC_SECRET_0";

/// One traffic secret, zeroed when dropped.
#[derive(Clone)]
pub struct Secret {
    len: u8,
    bytes: [u8; MAX_SECRET_LEN],
}

impl Secret {
    /// `None` unless `bytes` has the length of a TLS 1.3 hash (32 or 48).
    pub fn new(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != 32 && bytes.len() != MAX_SECRET_LEN {
            return None;
        }
        let mut s = Self {
            len: bytes.len() as u8,
            bytes: [0; MAX_SECRET_LEN],
        };
        s.bytes[..bytes.len()].copy_from_slice(bytes);
        Some(s)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        self.bytes.fill(0);
        // Keeps the zeroing from being elided as a dead store.
        std::hint::black_box(&mut self.bytes);
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.len)
    }
}

/// A connection's two application traffic secrets, generation 0.
#[derive(Debug)]
pub struct TrafficSecrets {
    pub client: Secret,
    pub server: Secret,
}

/// The [`rustls::KeyLog`] a server config sets (`cfg.key_log =
/// atunnel_tls::secrets::key_log()`) so that its connections can hibernate:
/// without it they stay with rustls. It logs nothing anywhere; it keeps the
/// two application traffic secrets until their connection takes them.
#[derive(Debug, Default)]
pub struct TrafficSecretLog;

pub fn key_log() -> Arc<dyn rustls::KeyLog> {
    Arc::new(TrafficSecretLog)
}

impl rustls::KeyLog for TrafficSecretLog {
    fn will_log(&self, label: &str) -> bool {
        label == CLIENT_LABEL || label == SERVER_LABEL
    }

    fn log(&self, label: &str, _client_random: &[u8], secret: &[u8]) {
        let id = READING.with(Cell::get);
        // 0: the handshake's socket is not a RecordTracking; nothing would
        // ever take it.
        if id == 0 || !self.will_log(label) {
            return;
        }
        let Some(secret) = Secret::new(secret) else {
            return;
        };
        let mut pending = lock();
        let slot = match pending.iter_mut().position(|p| p.id == id) {
            Some(i) => &mut pending[i],
            None => {
                if pending.len() == PENDING_CAP {
                    pending.pop_front();
                }
                pending.push_back(Pending {
                    id,
                    client: None,
                    server: None,
                });
                pending.back_mut().expect("just pushed")
            }
        };
        if label == CLIENT_LABEL {
            slot.client = Some(secret);
        } else {
            slot.server = Some(secret);
        }
        PENDING_LEN.store(pending.len(), Ordering::Relaxed);
    }
}

struct Pending {
    id: u64,
    client: Option<Secret>,
    server: Option<Secret>,
}

static PENDING: Mutex<VecDeque<Pending>> = Mutex::new(VecDeque::new());
/// `PENDING`'s length, read without the lock: connections poll for their
/// secrets on every write of their handshake, and the store is nearly
/// always empty.
static PENDING_LEN: AtomicUsize = AtomicUsize::new(0);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The connection whose handshake bytes this thread read last.
    static READING: Cell<u64> = const { Cell::new(0) };
}

fn lock() -> std::sync::MutexGuard<'static, VecDeque<Pending>> {
    // A panic while holding the lock leaves the store consistent (every
    // update is a single push, pop or field write).
    PENDING.lock().unwrap_or_else(|e| e.into_inner())
}

/// A new connection's id (never 0).
pub(crate) fn connection_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// A connection's place in the store while it waits for its secrets:
/// whatever is filed under it goes when it is dropped.
pub(crate) struct Filing(u64);

impl Filing {
    pub(crate) fn new() -> Self {
        Self(connection_id())
    }

    /// Notes that this connection's socket is being read on this thread.
    pub(crate) fn reading(&self) {
        reading(self.0);
    }

    pub(crate) fn take(&self) -> Option<Box<TrafficSecrets>> {
        take(self.0)
    }
}

impl Drop for Filing {
    fn drop(&mut self) {
        forget(self.0);
    }
}

/// Notes that `id`'s socket is being read on this thread.
fn reading(id: u64) {
    READING.with(|r| r.set(id));
}

/// `id`'s secrets, once rustls has derived both.
fn take(id: u64) -> Option<Box<TrafficSecrets>> {
    if PENDING_LEN.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let mut pending = lock();
    let i = pending
        .iter()
        .position(|p| p.id == id && p.client.is_some() && p.server.is_some())?;
    let p = pending.remove(i).expect("index found above");
    PENDING_LEN.store(pending.len(), Ordering::Relaxed);
    Some(Box::new(TrafficSecrets {
        client: p.client?,
        server: p.server?,
    }))
}

/// Drops whatever is filed under `id` (a connection that will not take it).
fn forget(id: u64) {
    if PENDING_LEN.load(Ordering::Relaxed) == 0 {
        return;
    }
    let mut pending = lock();
    pending.retain(|p| p.id != id);
    PENDING_LEN.store(pending.len(), Ordering::Relaxed);
}

/// Secrets waiting to be taken, process wide (for tests of the bound).
pub fn pending() -> usize {
    PENDING_LEN.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::KeyLog;

    /// The store is process wide; these tests fill and count it.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn secrets_are_filed_under_the_connection_reading_and_taken_once() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let (a, b) = (connection_id(), connection_id());
        reading(a);
        TrafficSecretLog.log(CLIENT_LABEL, &[0; 32], &[1; 32]);
        assert!(take(a).is_none(), "only one of the two yet");
        TrafficSecretLog.log(SERVER_LABEL, &[0; 32], &[2; 32]);
        reading(b);
        TrafficSecretLog.log("EXPORTER_SECRET", &[0; 32], &[3; 32]);
        assert!(take(b).is_none(), "other labels are not kept");
        let s = take(a).expect("both");
        assert_eq!(s.client.as_bytes(), &[1; 32]);
        assert_eq!(s.server.as_bytes(), &[2; 32]);
        assert!(take(a).is_none(), "taken once");
        reading(0);
        TrafficSecretLog.log(CLIENT_LABEL, &[0; 32], &[1; 32]);
        TrafficSecretLog.log(SERVER_LABEL, &[0; 32], &[2; 32]);
        assert!(
            take(0).is_none(),
            "a socket that is not tracked files nothing"
        );
    }

    #[test]
    fn the_store_is_bounded_and_a_connection_that_gives_up_leaves_nothing() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let first = connection_id();
        reading(first);
        TrafficSecretLog.log(CLIENT_LABEL, &[0; 32], &[1; 48]);
        let mut ids = Vec::new();
        for _ in 0..PENDING_CAP {
            let id = connection_id();
            ids.push(id);
            reading(id);
            TrafficSecretLog.log(CLIENT_LABEL, &[0; 32], &[1; 32]);
            assert!(pending() <= PENDING_CAP);
        }
        // The oldest went first: its client secret is gone.
        reading(first);
        TrafficSecretLog.log(SERVER_LABEL, &[0; 32], &[2; 48]);
        assert!(take(first).is_none());
        forget(first);
        for id in ids {
            forget(id);
        }
        assert_eq!(pending(), 0, "forgotten entries are gone");
        reading(0);
    }
}
