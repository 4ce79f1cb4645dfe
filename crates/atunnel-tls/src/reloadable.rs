//! A server config that can be replaced while its listeners run (a trust
//! bundle re-read on SIGHUP): each new connection's handshake takes the
//! config current at its accept; connections already open keep theirs.

use std::sync::{Arc, RwLock};

use rustls::ServerConfig;

#[derive(Debug)]
pub struct ReloadableConfig(RwLock<Arc<ServerConfig>>);

impl ReloadableConfig {
    pub fn new(cfg: Arc<ServerConfig>) -> Arc<Self> {
        Arc::new(Self(RwLock::new(cfg)))
    }

    /// The config a connection accepted now handshakes with.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.0.read().expect("config lock poisoned").clone()
    }

    /// From now on, new connections handshake with `cfg`.
    pub fn replace(&self, cfg: Arc<ServerConfig>) {
        *self.0.write().expect("config lock poisoned") = cfg;
    }
}
