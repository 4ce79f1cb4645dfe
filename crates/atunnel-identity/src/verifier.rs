//! rustls certificate verifiers that check a peer's chain with webpki and
//! then its identity: an actor (gateway side) or an exact SPIFFE ID; and the
//! validity check a server repeats after resuming a session.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{WebPkiServerVerifier, verify_server_cert_signed_by_trust_anchor};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, OtherError, RootCertStore,
    SignatureScheme,
};
use x509_parser::certificate::X509Certificate;
use x509_parser::prelude::FromDer;

use crate::identity::verify_actor_leaf;

/// Why a verifier could not be built.
#[derive(Debug, thiserror::Error)]
pub enum VerifierError {
    #[error("no trust anchors given")]
    NoRoots,
    #[error("trust anchor #{index} is unusable: {source}")]
    BadRoot { index: usize, source: rustls::Error },
    #[error("building the webpki verifier failed: {0}")]
    Build(#[from] rustls::client::VerifierBuilderError),
}

/// Why a peer's leaf, whose chain verified, is still refused.
#[derive(Debug, thiserror::Error)]
enum PeerIdentityError {
    #[error("peer certificate could not be parsed: {0}")]
    Parse(String),
    #[error("peer certificate has a malformed subjectAltName: {0}")]
    MalformedSan(String),
    #[error("peer certificate URI SANs {found:?} are not exactly {allowed:?}")]
    SpiffeIdNotAllowed { allowed: String, found: Vec<String> },
}

/// The identity a peer's leaf must prove once its chain verifies.
#[derive(Clone, Debug)]
enum IdentityRule {
    Actor,
    SpiffeId(String),
}

impl IdentityRule {
    /// Refusals become `CertificateError::Other` so the reason reaches the
    /// local handshake error (and logs); the peer gets a certificate_unknown alert.
    fn check(&self, leaf: &CertificateDer<'_>) -> Result<(), rustls::Error> {
        let refused = |e: Arc<dyn std::error::Error + Send + Sync>| {
            rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(e)))
        };
        match self {
            IdentityRule::Actor => verify_actor_leaf(leaf)
                .map(|_| ())
                .map_err(|e| refused(Arc::new(e))),
            IdentityRule::SpiffeId(allowed) => {
                check_spiffe_id(leaf, allowed).map_err(|e| refused(Arc::new(e)))
            }
        }
    }
}

fn check_spiffe_id(leaf: &CertificateDer<'_>, allowed: &str) -> Result<(), PeerIdentityError> {
    let (_, cert) =
        X509Certificate::from_der(leaf).map_err(|e| PeerIdentityError::Parse(e.to_string()))?;
    let uris = crate::identity::uri_sans(&cert)
        .map_err(|e| PeerIdentityError::MalformedSan(e.to_string()))?;
    // A SPIFFE SVID carries exactly one URI SAN: a leaf naming the allowed
    // ID beside another is not that workload's.
    if uris == [allowed] {
        Ok(())
    } else {
        Err(PeerIdentityError::SpiffeIdNotAllowed {
            allowed: allowed.to_owned(),
            found: uris.into_iter().map(str::to_owned).collect(),
        })
    }
}

/// Why a peer's leaf is outside its validity period.
#[derive(Debug, thiserror::Error)]
pub enum LeafValidityError {
    #[error("peer certificate could not be parsed: {0}")]
    Parse(String),
    #[error("peer certificate is not valid yet: not_before {not_before}, now {now} (Unix seconds)")]
    NotYetValid { not_before: i64, now: u64 },
    #[error("peer certificate has expired: not_after {not_after}, now {now} (Unix seconds)")]
    Expired { not_after: i64, now: u64 },
}

/// Checks that `leaf` is within its validity period at `now`, bounds
/// included and in whole seconds, as webpki does. Resuming a TLS session
/// restores the peer's chain without running the verifier again, so a
/// server must check this itself after a resumed handshake.
pub fn check_leaf_validity(
    leaf: &CertificateDer<'_>,
    now: UnixTime,
) -> Result<(), LeafValidityError> {
    let (_, cert) =
        X509Certificate::from_der(leaf).map_err(|e| LeafValidityError::Parse(e.to_string()))?;
    let validity = cert.validity();
    let (not_before, not_after) = (
        validity.not_before.timestamp(),
        validity.not_after.timestamp(),
    );
    let now = now.as_secs();
    // Saturates only for a clock past the year 292 billion.
    let now_signed = i64::try_from(now).unwrap_or(i64::MAX);
    if now_signed < not_before {
        return Err(LeafValidityError::NotYetValid { not_before, now });
    }
    if now_signed > not_after {
        return Err(LeafValidityError::Expired { not_after, now });
    }
    Ok(())
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn root_store(roots: &[CertificateDer<'static>]) -> Result<Arc<RootCertStore>, VerifierError> {
    if roots.is_empty() {
        return Err(VerifierError::NoRoots);
    }
    let mut store = RootCertStore::empty();
    for (index, root) in roots.iter().enumerate() {
        store
            .add(root.clone())
            .map_err(|source| VerifierError::BadRoot { index, source })?;
    }
    Ok(Arc::new(store))
}

/// Client verifier: webpki chain checks, then an identity rule on the leaf.
#[derive(Debug)]
struct IdentityClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    rule: IdentityRule,
}

impl ClientCertVerifier for IdentityClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    // Mandatory whatever the inner verifier says: no certificate, no identity.
    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        self.rule.check(end_entity)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }

    fn requires_raw_public_keys(&self) -> bool {
        self.inner.requires_raw_public_keys()
    }
}

fn client_verifier(
    roots: &[CertificateDer<'static>],
    rule: IdentityRule,
) -> Result<Arc<dyn ClientCertVerifier>, VerifierError> {
    let inner =
        WebPkiClientVerifier::builder_with_provider(root_store(roots)?, provider()).build()?;
    Ok(Arc::new(IdentityClientVerifier { inner, rule }))
}

/// The egress gateway's client verifier: the chain must verify against the
/// actor CA and the leaf must pass [`verify_actor_leaf`].
pub fn actor_client_verifier(
    actor_ca_roots: &[CertificateDer<'static>],
) -> Result<Arc<dyn ClientCertVerifier>, VerifierError> {
    client_verifier(actor_ca_roots, IdentityRule::Actor)
}

/// A client verifier admitting only the workload whose one URI SAN is
/// `allowed_spiffe_id` (the router on ingress, atunnel on atelet's socket).
pub fn spiffe_client_verifier(
    roots: &[CertificateDer<'static>],
    allowed_spiffe_id: &str,
) -> Result<Arc<dyn ClientCertVerifier>, VerifierError> {
    client_verifier(roots, IdentityRule::SpiffeId(allowed_spiffe_id.to_owned()))
}

/// Server verifier: the webpki chain check without the DNS-name check, then
/// an exact SPIFFE ID.
#[derive(Debug)]
struct SpiffeServerVerifier {
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
    // Kept for the handshake-signature checks, which are name-independent.
    signatures: Arc<WebPkiServerVerifier>,
    rule: IdentityRule,
}

impl ServerCertVerifier for SpiffeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // The server name is deliberately not checked: SPIFFE identities are
        // URI SANs, and workload certificates need carry no DNS name matching
        // how they were dialled (a Unix socket, a pod IP).
        let cert = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        self.rule.check(end_entity)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signatures.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signatures.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.signatures.supported_verify_schemes()
    }
}

/// The client side's check of a workload server (atelet, a peer atunnel):
/// chain against `roots`, then its one URI SAN is `allowed_spiffe_id`.
pub fn spiffe_server_verifier(
    roots: &[CertificateDer<'static>],
    allowed_spiffe_id: &str,
) -> Result<Arc<dyn ServerCertVerifier>, VerifierError> {
    let roots = root_store(roots)?;
    let provider = provider();
    let signatures =
        WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone()).build()?;
    Ok(Arc::new(SpiffeServerVerifier {
        roots,
        provider,
        signatures,
        rule: IdentityRule::SpiffeId(allowed_spiffe_id.to_owned()),
    }))
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::{Duration, SystemTime};

    use rustls::pki_types::PrivateKeyDer;
    use rustls::{AlertDescription, ClientConfig, ServerConfig, SupportedProtocolVersion};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::{TlsAcceptor, TlsConnector};

    use super::*;
    use crate::identity::{ActorRef, IdentityError};
    use crate::pki::{
        ATELET_SPIFFE_ID, ActorCertOptions, CertificateAuthority, IssuedCert, ROUTER_SPIFFE_ID,
        Usage, WORKER_SPIFFE_ID, actor_csr, new_actor_key,
    };

    const HOUR: Duration = Duration::from_secs(3600);
    const TLS13: &[&SupportedProtocolVersion] = &[&rustls::version::TLS13];
    const TLS12: &[&SupportedProtocolVersion] = &[&rustls::version::TLS12];
    const GATEWAY_HOST: &str = "gateway.test";

    /// A client's certificate chain and key.
    struct ClientIdentity {
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    }

    impl From<&IssuedCert> for ClientIdentity {
        fn from(cert: &IssuedCert) -> Self {
            Self {
                chain: cert.chain.clone(),
                key: cert.key(),
            }
        }
    }

    fn actor_identity(ca: &CertificateAuthority, options: &ActorCertOptions) -> ClientIdentity {
        let actor = ActorRef::new("team-a", "agent-1", "uid-1").expect("actor");
        let key = new_actor_key().expect("key");
        let csr = actor_csr(&key).expect("csr");
        let now = SystemTime::now();
        let chain = ca
            .sign_actor_csr_with(&actor, &csr, now - HOUR, now + HOUR, options)
            .expect("signed");
        ClientIdentity {
            chain,
            key: rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
        }
    }

    fn server_config(
        verifier: Arc<dyn ClientCertVerifier>,
        cert: &IssuedCert,
        versions: &[&'static SupportedProtocolVersion],
    ) -> Arc<ServerConfig> {
        let config = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(versions)
            .expect("versions")
            .with_client_cert_verifier(verifier)
            .with_single_cert(cert.chain.clone(), cert.key())
            .expect("server cert");
        Arc::new(config)
    }

    fn client_config(
        server_verifier: Arc<dyn ServerCertVerifier>,
        identity: Option<ClientIdentity>,
        versions: &[&'static SupportedProtocolVersion],
    ) -> Arc<ClientConfig> {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(versions)
            .expect("versions")
            .dangerous()
            .with_custom_certificate_verifier(server_verifier);
        let config = match identity {
            Some(id) => builder
                .with_client_auth_cert(id.chain, id.key)
                .expect("client cert"),
            None => builder.with_no_client_auth(),
        };
        Arc::new(config)
    }

    /// The ordinary webpki check a client makes of the gateway.
    fn gateway_verifier(ca: &CertificateAuthority) -> Arc<dyn ServerCertVerifier> {
        let roots = root_store(&[ca.cert_der()]).expect("roots");
        WebPkiServerVerifier::builder_with_provider(roots, provider())
            .build()
            .expect("verifier")
    }

    /// How one handshake went, from both ends.
    struct Outcome {
        /// The client finished its side of the handshake.
        client_connected: bool,
        /// Connect, then read the server's greeting.
        client: io::Result<()>,
        /// Accept, then greet.
        server: io::Result<()>,
    }

    /// Runs one handshake over an in-memory pipe; the server speaks first so
    /// a refused client (TLS 1.3) learns of it on its first read.
    async fn handshake(
        server: Arc<ServerConfig>,
        client: Arc<ClientConfig>,
        server_name: ServerName<'static>,
    ) -> Outcome {
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        let serve = async move {
            let mut tls = TlsAcceptor::from(server).accept(server_io).await?;
            tls.write_all(b"pong").await?;
            tls.shutdown().await
        };
        let dial = async move {
            let mut tls = match TlsConnector::from(client)
                .connect(server_name, client_io)
                .await
            {
                Ok(tls) => tls,
                Err(e) => return (false, Err(e)),
            };
            let mut greeting = [0u8; 4];
            let read = tls.read_exact(&mut greeting).await.and_then(|_| {
                if &greeting == b"pong" {
                    Ok(())
                } else {
                    Err(io::Error::other(format!(
                        "unexpected greeting {greeting:?}"
                    )))
                }
            });
            (true, read)
        };
        let (server, (client_connected, client)) = tokio::join!(serve, dial);
        Outcome {
            client_connected,
            client,
            server,
        }
    }

    fn gateway_name() -> ServerName<'static> {
        ServerName::try_from(GATEWAY_HOST).expect("dns name")
    }

    fn rustls_error(e: &io::Error) -> &rustls::Error {
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .unwrap_or_else(|| panic!("not a rustls error: {e:?}"))
    }

    fn identity_refusal(e: &io::Error) -> &(dyn std::error::Error + Send + Sync + 'static) {
        match rustls_error(e) {
            rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(inner))) => {
                inner.as_ref()
            }
            other => panic!("not an identity refusal: {other:?}"),
        }
    }

    fn assert_alert(e: &io::Error, want: AlertDescription) {
        match rustls_error(e) {
            rustls::Error::AlertReceived(got) => assert_eq!(*got, want),
            other => panic!("expected alert {want:?}, got {other:?}"),
        }
    }

    /// The gateway's PKI: a pod CA for its serving certificate, an actor CA
    /// for clients.
    struct GatewayPki {
        pod_ca: CertificateAuthority,
        actor_ca: CertificateAuthority,
        gateway: IssuedCert,
    }

    fn gateway_pki() -> GatewayPki {
        let pod_ca = CertificateAuthority::new("pod ca").expect("pod ca");
        let actor_ca = CertificateAuthority::new("actor ca").expect("actor ca");
        let gateway = pod_ca
            .issue(None, &[GATEWAY_HOST], &[], Usage::Server, HOUR)
            .expect("gateway cert");
        GatewayPki {
            pod_ca,
            actor_ca,
            gateway,
        }
    }

    async fn gateway_handshake(
        pki: &GatewayPki,
        client: Option<ClientIdentity>,
        versions: &[&'static SupportedProtocolVersion],
    ) -> Outcome {
        let verifier = actor_client_verifier(&[pki.actor_ca.cert_der()]).expect("verifier");
        handshake(
            server_config(verifier, &pki.gateway, versions),
            client_config(gateway_verifier(&pki.pod_ca), client, versions),
            gateway_name(),
        )
        .await
    }

    #[tokio::test]
    async fn gateway_accepts_actor_certificate_over_tls13_and_tls12() {
        let pki = gateway_pki();
        for versions in [TLS13, TLS12] {
            let client = actor_identity(&pki.actor_ca, &ActorCertOptions::default());
            let outcome = gateway_handshake(&pki, Some(client), versions).await;
            outcome.server.expect("server accepted");
            outcome.client.expect("client read the greeting");
        }
    }

    /// The client learns of the server's refusal as `alert`. Over TLS 1.3
    /// its handshake completes before the server has judged its
    /// certificate, and the alert arrives on the next read; over TLS 1.2 the
    /// server's Finished never comes, so connect itself fails.
    fn assert_client_refused(
        outcome: &Outcome,
        versions: &[&'static SupportedProtocolVersion],
        alert: AlertDescription,
    ) {
        assert_eq!(outcome.client_connected, versions == TLS13);
        assert_alert(outcome.client.as_ref().expect_err("client refused"), alert);
    }

    #[tokio::test]
    async fn gateway_refuses_actor_certificate_from_another_ca() {
        let pki = gateway_pki();
        let stranger = CertificateAuthority::new("other actor ca").expect("ca");
        for versions in [TLS13, TLS12] {
            let client = actor_identity(&stranger, &ActorCertOptions::default());
            let outcome = gateway_handshake(&pki, Some(client), versions).await;
            assert!(matches!(
                rustls_error(outcome.server.as_ref().expect_err("server refused")),
                rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer)
            ));
            assert_client_refused(&outcome, versions, AlertDescription::UnknownCA);
        }
    }

    #[tokio::test]
    async fn gateway_refuses_leaf_without_identity_extension() {
        let pki = gateway_pki();
        let options = ActorCertOptions {
            include_identity_extension: false,
            ..Default::default()
        };
        for versions in [TLS13, TLS12] {
            let client = actor_identity(&pki.actor_ca, &options);
            let outcome = gateway_handshake(&pki, Some(client), versions).await;
            assert!(matches!(
                identity_refusal(outcome.server.as_ref().expect_err("server refused"))
                    .downcast_ref::<IdentityError>(),
                Some(IdentityError::MissingIdentityExtension)
            ));
            assert_client_refused(&outcome, versions, AlertDescription::CertificateUnknown);
        }
    }

    #[tokio::test]
    async fn gateway_refuses_client_without_certificate() {
        let pki = gateway_pki();
        let outcome = gateway_handshake(&pki, None, TLS13).await;
        let server_err = outcome.server.expect_err("server refused");
        assert!(matches!(
            rustls_error(&server_err),
            rustls::Error::NoCertificatesPresented
        ));
        assert!(outcome.client.is_err());
    }

    /// A TLS 1.3 handshake between workloads of `pod_ca`'s pod: the server
    /// presents `server` and admits only the client `admits`; the client
    /// presents `client`, dials `name` and accepts only the server `expects`.
    async fn pod_handshake(
        pod_ca: &CertificateAuthority,
        server: &IssuedCert,
        admits: &str,
        client: &IssuedCert,
        expects: &str,
        name: ServerName<'static>,
    ) -> Outcome {
        let verifier = spiffe_client_verifier(&[pod_ca.cert_der()], admits).expect("verifier");
        let server_check = spiffe_server_verifier(&[pod_ca.cert_der()], expects).expect("verifier");
        handshake(
            server_config(verifier, server, TLS13),
            client_config(server_check, Some(client.into()), TLS13),
            name,
        )
        .await
    }

    /// A worker's ingress: serves its pod certificate, admits only `allowed`.
    async fn ingress_handshake(allowed: &str, client_spiffe_id: &str) -> Outcome {
        let pod_ca = CertificateAuthority::new("pod ca").expect("ca");
        let worker = pod_ca
            .issue(
                Some(WORKER_SPIFFE_ID),
                &[],
                &[IpAddr::V4(Ipv4Addr::new(10, 0, 0, 7))],
                Usage::ServerAndClient,
                HOUR,
            )
            .expect("worker");
        let caller = pod_ca
            .issue(Some(client_spiffe_id), &[], &[], Usage::Client, HOUR)
            .expect("caller");
        pod_handshake(
            &pod_ca,
            &worker,
            allowed,
            &caller,
            WORKER_SPIFFE_ID,
            ServerName::from(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 7))),
        )
        .await
    }

    #[tokio::test]
    async fn spiffe_client_verifier_accepts_the_allowed_id() {
        let outcome = ingress_handshake(ROUTER_SPIFFE_ID, ROUTER_SPIFFE_ID).await;
        outcome.server.expect("router admitted");
        outcome.client.expect("router read the greeting");
    }

    #[tokio::test]
    async fn spiffe_client_verifier_refuses_another_id() {
        let outcome = ingress_handshake(ROUTER_SPIFFE_ID, ATELET_SPIFFE_ID).await;
        let server_err = outcome.server.expect_err("atelet refused on ingress");
        let refusal = identity_refusal(&server_err).to_string();
        assert!(
            refusal.contains(ROUTER_SPIFFE_ID) && refusal.contains(ATELET_SPIFFE_ID),
            "{refusal}"
        );
        assert!(outcome.client.is_err());
    }

    /// A router leaf from the pod CA whose URI SANs are `uris`, made with
    /// rcgen directly: `CertificateAuthority::issue` writes at most one.
    fn leaf_with_uris(ca: &CertificateAuthority, uris: &[&str]) -> IssuedCert {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let ca_key = rcgen::KeyPair::from_pem(&ca.key_pem()).expect("ca key");
        let issuer = rcgen::Issuer::from_ca_cert_pem(&ca.cert_pem(), ca_key).expect("issuer");
        let mut params = rcgen::CertificateParams::default();
        params.subject_alt_names = uris
            .iter()
            .map(|u| rcgen::SanType::URI((*u).try_into().expect("ia5")))
            .collect();
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let now = SystemTime::now();
        params.not_before = (now - HOUR).into();
        params.not_after = (now + HOUR).into();
        let leaf = params.signed_by(&key, &issuer).expect("signed");
        IssuedCert {
            chain: vec![leaf.der().clone(), ca.cert_der()],
            key: rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
            cert_pem: leaf.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// Ingress's handshake with a router presenting a leaf whose URI SANs
    /// are `uris`.
    async fn router_handshake(uris: &[&str]) -> Outcome {
        let pod_ca = CertificateAuthority::new("pod ca").expect("ca");
        let worker = pod_ca
            .issue(Some(WORKER_SPIFFE_ID), &[], &[], Usage::Server, HOUR)
            .expect("worker");
        let router = leaf_with_uris(&pod_ca, uris);
        pod_handshake(
            &pod_ca,
            &worker,
            ROUTER_SPIFFE_ID,
            &router,
            WORKER_SPIFFE_ID,
            ServerName::try_from("worker.invalid").expect("name"),
        )
        .await
    }

    #[tokio::test]
    async fn a_router_leaf_with_an_extra_uri_san_or_none_is_refused_at_the_handshake() {
        // The control: the same leaf shape with the one ID passes.
        let outcome = router_handshake(&[ROUTER_SPIFFE_ID]).await;
        outcome.server.expect("router admitted");
        outcome.client.expect("router read the greeting");
        for uris in [
            &[ROUTER_SPIFFE_ID, ATELET_SPIFFE_ID][..],
            &[ATELET_SPIFFE_ID, ROUTER_SPIFFE_ID][..],
            &[ROUTER_SPIFFE_ID, ROUTER_SPIFFE_ID][..],
            &[][..],
        ] {
            let outcome = router_handshake(uris).await;
            let server_err = outcome.server.expect_err("refused");
            let refusal = identity_refusal(&server_err).to_string();
            assert!(refusal.contains("not exactly"), "{uris:?}: {refusal}");
            assert!(outcome.client.is_err(), "{uris:?}: the router was served");
        }
    }

    /// A client dialling atelet by a name its certificate does not carry.
    async fn atelet_handshake(server_spiffe_id: &str) -> Outcome {
        let pod_ca = CertificateAuthority::new("pod ca").expect("ca");
        let server = pod_ca
            .issue(Some(server_spiffe_id), &[], &[], Usage::Server, HOUR)
            .expect("server");
        let worker = pod_ca
            .issue(
                Some(WORKER_SPIFFE_ID),
                &[],
                &[],
                Usage::ServerAndClient,
                HOUR,
            )
            .expect("worker");
        pod_handshake(
            &pod_ca,
            &server,
            WORKER_SPIFFE_ID,
            &worker,
            ATELET_SPIFFE_ID,
            ServerName::try_from("atelet.invalid").expect("name"),
        )
        .await
    }

    #[tokio::test]
    async fn spiffe_server_verifier_accepts_the_allowed_id_whatever_the_name() {
        let outcome = atelet_handshake(ATELET_SPIFFE_ID).await;
        assert!(outcome.client_connected);
        outcome.client.expect("client read the greeting");
        outcome.server.expect("server accepted");
    }

    #[tokio::test]
    async fn spiffe_server_verifier_refuses_another_id() {
        let outcome = atelet_handshake(ROUTER_SPIFFE_ID).await;
        assert!(!outcome.client_connected);
        let client_err = outcome.client.expect_err("client refused the server");
        assert!(
            identity_refusal(&client_err)
                .to_string()
                .contains(ATELET_SPIFFE_ID)
        );
        assert!(outcome.server.is_err());
    }

    #[tokio::test]
    async fn spiffe_server_verifier_refuses_a_server_from_another_ca() {
        let pod_ca = CertificateAuthority::new("pod ca").expect("ca");
        let stranger = CertificateAuthority::new("other ca").expect("ca");
        let server = stranger
            .issue(Some(ATELET_SPIFFE_ID), &[], &[], Usage::Server, HOUR)
            .expect("server");
        let worker = pod_ca
            .issue(Some(WORKER_SPIFFE_ID), &[], &[], Usage::Client, HOUR)
            .expect("worker");
        // Both sides trust the pod CA alone: the stranger's server is not
        // in it.
        let outcome = pod_handshake(
            &pod_ca,
            &server,
            WORKER_SPIFFE_ID,
            &worker,
            ATELET_SPIFFE_ID,
            ServerName::try_from("atelet.invalid").expect("name"),
        )
        .await;
        let client_err = outcome.client.expect_err("client refused the server");
        assert!(matches!(
            rustls_error(&client_err),
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer)
        ));
    }

    #[test]
    fn verifiers_need_a_usable_root() {
        assert!(matches!(
            actor_client_verifier(&[]),
            Err(VerifierError::NoRoots)
        ));
        assert!(matches!(
            spiffe_server_verifier(&[CertificateDer::from(vec![1, 2, 3])], ATELET_SPIFFE_ID),
            Err(VerifierError::BadRoot { index: 0, .. })
        ));
    }

    #[test]
    fn leaf_validity_includes_both_bounds_in_whole_seconds() {
        let ca = CertificateAuthority::new("actor ca").expect("ca");
        let actor = ActorRef::new("team-a", "agent-1", "uid-1").expect("actor");
        let csr = actor_csr(&new_actor_key().expect("key")).expect("csr");
        let not_before = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let not_after = not_before + HOUR;
        let chain = ca
            .sign_actor_csr(&actor, &csr, not_before, not_after)
            .expect("signed");
        let at = |t: SystemTime| {
            check_leaf_validity(
                &chain[0],
                UnixTime::since_unix_epoch(
                    t.duration_since(SystemTime::UNIX_EPOCH)
                        .expect("after the epoch"),
                ),
            )
        };
        let second = Duration::from_secs(1);

        assert!(matches!(
            at(not_before - second),
            Err(LeafValidityError::NotYetValid { .. })
        ));
        at(not_before).expect("valid from not_before");
        at(not_after + Duration::from_millis(999)).expect("valid through not_after's second");
        let expired = at(not_after + second).expect_err("expired a second later");
        assert!(matches!(expired, LeafValidityError::Expired { .. }));
        assert!(expired.to_string().contains("1800003600"), "{expired}");
        assert!(matches!(
            check_leaf_validity(&CertificateDer::from(vec![1, 2, 3]), UnixTime::now()),
            Err(LeafValidityError::Parse(_))
        ));
    }
}

#[cfg(test)]
mod fuzz {
    use std::sync::OnceLock;
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::pki::{CertificateAuthority, ROUTER_SPIFFE_ID, Usage};

    /// A router leaf, made once.
    fn router_leaf() -> &'static [u8] {
        static LEAF: OnceLock<Vec<u8>> = OnceLock::new();
        LEAF.get_or_init(|| {
            let ca = CertificateAuthority::new("pod ca").expect("ca");
            let issued = ca
                .issue(
                    Some(ROUTER_SPIFFE_ID),
                    &[],
                    &[],
                    Usage::ServerAndClient,
                    Duration::from_secs(3600),
                )
                .expect("router cert");
            issued.chain[0].to_vec()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// A peer's leaf with bytes changed, inserted, removed or cut: the
        /// SPIFFE ID check never panics and passes only a leaf that still
        /// parses and carries the allowed URI SAN and no other.
        #[test]
        fn a_mutated_leaf_passes_the_spiffe_id_check_only_with_the_allowed_id(
            edits in atunnel_fuzz::edits(any::<u8>(), atunnel_fuzz::Weights::EVEN, 1..4),
            arbitrary in prop::option::of(prop::collection::vec(any::<u8>(), 0..400)),
        ) {
            let der = atunnel_fuzz::apply(router_leaf().to_vec(), &edits);
            let der = CertificateDer::from(arbitrary.unwrap_or(der));
            if check_spiffe_id(&der, ROUTER_SPIFFE_ID).is_ok() {
                let (_, cert) = X509Certificate::from_der(&der).expect("a passing leaf parses");
                // Read apart from `uri_sans`, which the check itself uses.
                let san = cert.subject_alternative_name().expect("its SAN parses").expect("it has one");
                let uris: Vec<&str> = san.value.general_names.iter().filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::URI(u) => Some(*u),
                    _ => None,
                }).collect();
                prop_assert_eq!(uris, [ROUTER_SPIFFE_ID]);
            }
            let _ = check_leaf_validity(&der, UnixTime::now());
        }
    }
}
