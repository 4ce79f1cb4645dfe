//! The crypto provider of every TLS endpoint of atunnel: ring's, with TLS
//! 1.3's AES-128-GCM-SHA256 first, and the servers choosing by that order.
//!
//! TLS 1.3's three suites are all sound; they differ in what they cost.
//! Each key derivation (the handshake's, rustls handing a hibernating
//! connection's keys over, a key update) is HMACs of the suite's hash, and
//! SHA-256 runs on the CPU's SHA instructions (x86 SHA-NI, ARMv8) where
//! ring has none for SHA-384: a hibernation spent about 6 us of SHA-512
//! blocks in rustls's key hand-over alone (`docs/memory.md`). AES-128 also
//! takes 10 rounds per block to AES-256's 14. The order is the one Go's
//! crypto/tls and BoringSSL (so Envoy, the router) use on machines with AES
//! instructions.

use std::sync::{Arc, OnceLock};

use rustls::CipherSuite;
use rustls::crypto::CryptoProvider;

/// ring's provider with the suites in [`rank`] order: one for the process,
/// as a copy per actor's client would cost a worker with 1,000 actors
/// about 0.3 MB for nothing.
pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| {
            let mut p = rustls::crypto::ring::default_provider();
            // Stable: the TLS 1.2 suites keep ring's order behind these.
            p.cipher_suites.sort_by_key(|s| rank(s.suite()));
            Arc::new(p)
        })
        .clone()
}

/// Sets `cfg`, a server's config built on [`provider`], to choose the
/// suite by the provider's order rather than the client's: a rustls or
/// OpenSSL client offers AES-256-GCM-SHA384 first.
pub fn choose_suites_by_our_order(cfg: &mut rustls::ServerConfig) {
    cfg.ignore_client_order = true;
}

fn rank(suite: CipherSuite) -> u8 {
    match suite {
        CipherSuite::TLS13_AES_128_GCM_SHA256 => 0,
        CipherSuite::TLS13_AES_256_GCM_SHA384 => 1,
        CipherSuite::TLS13_CHACHA20_POLY1305_SHA256 => 2,
        _ => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server on [`provider`] and a client on ring's default order (AES-256
    /// first) complete a handshake in memory; the suite they agree on.
    fn negotiated(server_chooses: bool) -> CipherSuite {
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["server.test".into()])
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        let der = cert.der().clone();
        let mut server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![der.clone()],
                rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).expect("key der"),
            )
            .expect("server config");
        if server_chooses {
            choose_suites_by_our_order(&mut server);
        }
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der).expect("root");
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        let mut s = rustls::ServerConnection::new(Arc::new(server)).expect("server");
        let mut c = rustls::ClientConnection::new(
            Arc::new(client),
            "server.test".try_into().expect("name"),
        )
        .expect("client");
        while c.is_handshaking() || s.is_handshaking() {
            let mut buf = Vec::new();
            c.write_tls(&mut buf).expect("client flight");
            s.read_tls(&mut &buf[..]).expect("to server");
            s.process_new_packets().expect("server");
            buf.clear();
            s.write_tls(&mut buf).expect("server flight");
            c.read_tls(&mut &buf[..]).expect("to client");
            c.process_new_packets().expect("client");
        }
        s.negotiated_cipher_suite().expect("suite").suite()
    }

    #[test]
    fn servers_choose_aes_128_gcm_sha256_over_a_clients_aes_256_first_offer() {
        assert_eq!(negotiated(true), CipherSuite::TLS13_AES_128_GCM_SHA256);
        assert_eq!(
            negotiated(false),
            CipherSuite::TLS13_AES_256_GCM_SHA384,
            "the client's own order, when the server follows it"
        );
    }

    #[test]
    fn the_provider_offers_aes_128_gcm_sha256_first_and_every_default_suite() {
        let ours: Vec<_> = provider().cipher_suites.iter().map(|s| s.suite()).collect();
        assert_eq!(ours[0], CipherSuite::TLS13_AES_128_GCM_SHA256);
        let mut ring: Vec<_> = rustls::crypto::ring::default_provider()
            .cipher_suites
            .iter()
            .map(|s| s.suite())
            .collect();
        let mut sorted = ours.clone();
        sorted.sort_by_key(|s| u16::from(*s));
        ring.sort_by_key(|s| u16::from(*s));
        assert_eq!(sorted, ring, "the same suites, reordered");
    }
}
