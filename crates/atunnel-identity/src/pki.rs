//! A throwaway PKI shaped like the cluster's: a P-256 CA that issues pod
//! (workload) certificates and signs actor CSRs the way ateapi does.
//!
//! Used by tests, the bench and local runs; production certificates come
//! from the cluster's signers.

use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, CustomExtension, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
    PublicKeyData, SanType, SerialNumber,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use time::OffsetDateTime;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::FromDer;

use crate::identity::{ACTOR_IDENTITY_OID, ActorIdentity, ActorRef};

/// SPIFFE ID of the atenet router, the only caller allowed on a worker's ingress.
pub const ROUTER_SPIFFE_ID: &str = "spiffe://cluster.local/ns/ate-system/sa/atenet-router";
/// SPIFFE ID of atelet, the node agent that brokers actor certificates.
pub const ATELET_SPIFFE_ID: &str = "spiffe://cluster.local/ns/ate-system/sa/atelet";
/// SPIFFE ID of a worker pod (where atunnel runs).
pub const WORKER_SPIFFE_ID: &str = "spiffe://cluster.local/ns/ate-system/sa/ateworker";
/// SPIFFE ID of the egress gateway.
pub const GATEWAY_SPIFFE_ID: &str = "spiffe://cluster.local/ns/ate-system/sa/atenet-egress";

/// Leaves start this far in the past so a peer with a slightly slow clock
/// accepts them at once (ateapi uses the same 5 minutes for actor certificates).
const LEAF_BACKDATE: Duration = Duration::from_secs(5 * 60);
/// The CA starts an hour in the past for the same reason, with more margin.
const CA_BACKDATE: Duration = Duration::from_secs(60 * 60);
/// Ten years: a test CA must outlive every test run.
const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 60 * 60);

/// Why a certificate could not be created, loaded or signed.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("generating a P-256 key failed: {0}")]
    KeyGeneration(#[source] rcgen::Error),
    #[error("signing the {what} certificate failed: {source}")]
    Sign {
        what: &'static str,
        source: rcgen::Error,
    },
    #[error("serializing the CSR failed: {0}")]
    CsrSerialize(#[source] rcgen::Error),
    #[error("invalid {kind} SAN {value:?}: {source}")]
    InvalidSan {
        kind: &'static str,
        value: String,
        source: rcgen::Error,
    },
    #[error("validity {not_before:?} .. {not_after:?} is empty or not representable")]
    InvalidValidity {
        not_before: SystemTime,
        not_after: SystemTime,
    },
    #[error("certificate lifetime {0:?} does not fit the clock")]
    LifetimeOverflow(Duration),
    #[error("drawing a random serial number failed")]
    Random,
    #[error("CSR could not be parsed: {0}")]
    CsrParse(String),
    #[error("CSR self-signature does not verify: {0}")]
    CsrSignature(String),
    #[error("CSR public key is not usable: {0}")]
    CsrKey(#[source] rcgen::Error),
    #[error("actor-identity JSON could not be built: {0}")]
    IdentityJson(#[source] serde_json::Error),
    #[error("CA certificate PEM is unusable: {0}")]
    CaCertPem(String),
    #[error("CA key PEM is unusable: {0}")]
    CaKeyPem(String),
    #[error("CA key does not match the CA certificate's public key")]
    CaKeyMismatch,
    #[error("CA certificate is not a CA (basicConstraints CA absent or false)")]
    NotACa,
}

/// A CA able to issue workload certificates and sign actor CSRs.
pub struct CertificateAuthority {
    issuer: Issuer<'static, KeyPair>,
    cert_der: CertificateDer<'static>,
    cert_pem: String,
    key_pem: String,
}

impl fmt::Debug for CertificateAuthority {
    // The key stays out of logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

/// What an issued certificate may be used for (its extended key usage).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    Server,
    Client,
    ServerAndClient,
}

/// A leaf certificate with its chain and private key, in the forms rustls and
/// files want.
pub struct IssuedCert {
    /// Leaf first, then the issuing CA.
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    /// The leaf then the rest of the chain, PEM.
    pub cert_pem: String,
    /// PKCS#8 private key, PEM.
    pub key_pem: String,
}

impl IssuedCert {
    /// A copy of the private key (`PrivateKeyDer` is not `Clone`).
    pub fn key(&self) -> PrivateKeyDer<'static> {
        self.key.clone_key()
    }
}

impl fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuedCert")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

/// Shape of an actor certificate; [`Default`] is the correct shape, the other
/// settings exist to test the gateway's refusals.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActorCertOptions {
    /// Add the actor-identity extension (default true).
    pub include_identity_extension: bool,
    /// Add it twice (default false).
    pub duplicate_identity_extension: bool,
    /// The extension's `Purpose` (default `"atunnel"`).
    pub purpose: String,
    /// A second URI SAN after the actor's SPIFFE ID (default none).
    pub extra_uri_san: Option<String>,
    /// When false the leaf carries ServerAuth instead, so the EKU extension is
    /// present but lacks ClientAuth.
    pub client_auth_eku: bool,
    /// Mark the leaf as a CA (default false).
    pub is_ca: bool,
}

impl Default for ActorCertOptions {
    fn default() -> Self {
        Self {
            include_identity_extension: true,
            duplicate_identity_extension: false,
            purpose: crate::identity::PURPOSE_ATUNNEL.to_owned(),
            extra_uri_san: None,
            client_auth_eku: true,
            is_ca: false,
        }
    }
}

impl CertificateAuthority {
    /// A fresh self-signed P-256 CA valid from an hour ago for ten years.
    pub fn new(common_name: &str) -> Result<Self, PkiError> {
        let key = generate_p256()?;
        let now = SystemTime::now();
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let not_after = now
            .checked_add(CA_LIFETIME)
            .ok_or(PkiError::LifetimeOverflow(CA_LIFETIME))?;
        set_validity(&mut params, now - CA_BACKDATE, not_after)?;
        params.serial_number = Some(random_serial()?);
        let cert = params
            .self_signed(&key)
            .map_err(|source| PkiError::Sign { what: "CA", source })?;
        let cert_der = cert.der().clone();
        Ok(Self {
            cert_pem: encode_pem("CERTIFICATE", &cert_der),
            key_pem: key.serialize_pem(),
            cert_der,
            issuer: Issuer::new(params, key),
        })
    }

    /// Loads a CA written out by [`cert_pem`](Self::cert_pem) and
    /// [`key_pem`](Self::key_pem), possibly by another process.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, PkiError> {
        let certs: Vec<_> = pem::parse_many(cert_pem)
            .map_err(|e| PkiError::CaCertPem(e.to_string()))?
            .into_iter()
            .filter(|p| p.tag() == "CERTIFICATE")
            .collect();
        let [cert] = certs.as_slice() else {
            return Err(PkiError::CaCertPem(format!(
                "want exactly one CERTIFICATE block, found {}",
                certs.len()
            )));
        };
        let cert_der = CertificateDer::from(cert.contents().to_vec());
        let key = KeyPair::from_pem(key_pem).map_err(|e| PkiError::CaKeyPem(e.to_string()))?;

        let (_, parsed) = x509_parser::parse_x509_certificate(&cert_der)
            .map_err(|e| PkiError::CaCertPem(e.to_string()))?;
        if parsed.public_key().raw != key.subject_public_key_info().as_slice() {
            return Err(PkiError::CaKeyMismatch);
        }
        let is_ca = parsed
            .basic_constraints()
            .map_err(|e| PkiError::CaCertPem(e.to_string()))?
            .is_some_and(|bc| bc.value.ca);
        if !is_ca {
            return Err(PkiError::NotACa);
        }

        let key_pem = key.serialize_pem();
        let issuer = Issuer::from_ca_cert_der(&cert_der, key)
            .map_err(|e| PkiError::CaCertPem(e.to_string()))?;
        Ok(Self {
            issuer,
            cert_pem: encode_pem("CERTIFICATE", &cert_der),
            cert_der,
            key_pem,
        })
    }

    /// The CA certificate, DER (a trust anchor for peers).
    pub fn cert_der(&self) -> CertificateDer<'static> {
        self.cert_der.clone()
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> String {
        self.cert_pem.clone()
    }

    /// The CA private key, PKCS#8 PEM.
    pub fn key_pem(&self) -> String {
        self.key_pem.clone()
    }

    /// Issues a workload leaf with a fresh P-256 key, valid from five minutes
    /// ago for `lifetime`.
    pub fn issue(
        &self,
        spiffe_id: Option<&str>,
        dns_names: &[&str],
        ips: &[IpAddr],
        usage: Usage,
        lifetime: Duration,
    ) -> Result<IssuedCert, PkiError> {
        let key = generate_p256()?;
        let mut params = leaf_params()?;
        if let Some(id) = spiffe_id.or(dns_names.first().copied()) {
            params.distinguished_name.push(DnType::CommonName, id);
        }
        if let Some(id) = spiffe_id {
            params.subject_alt_names.push(uri_san(id)?);
        }
        for name in dns_names {
            let ia5 = (*name).try_into().map_err(|source| PkiError::InvalidSan {
                kind: "DNS",
                value: (*name).to_owned(),
                source,
            })?;
            params.subject_alt_names.push(SanType::DnsName(ia5));
        }
        params
            .subject_alt_names
            .extend(ips.iter().copied().map(SanType::IpAddress));
        params.extended_key_usages = match usage {
            Usage::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
            Usage::ServerAndClient => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        };
        let now = SystemTime::now();
        let not_after = now
            .checked_add(lifetime)
            .ok_or(PkiError::LifetimeOverflow(lifetime))?;
        set_validity(&mut params, now - LEAF_BACKDATE, not_after)?;

        let leaf = params
            .signed_by(&key, &self.issuer)
            .map_err(|source| PkiError::Sign {
                what: "leaf",
                source,
            })?;
        let chain = vec![leaf.der().clone(), self.cert_der()];
        Ok(IssuedCert {
            cert_pem: chain_pem(&chain),
            key: PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
            key_pem: key.serialize_pem(),
            chain,
        })
    }

    /// Signs an actor CSR the way ateapi does; returns `[leaf, ca]`.
    pub fn sign_actor_csr(
        &self,
        actor: &ActorRef,
        csr_der: &[u8],
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<Vec<CertificateDer<'static>>, PkiError> {
        self.sign_actor_csr_with(
            actor,
            csr_der,
            not_before,
            not_after,
            &ActorCertOptions::default(),
        )
    }

    /// [`sign_actor_csr`](Self::sign_actor_csr) with a chosen (possibly wrong)
    /// certificate shape.
    ///
    /// Only the CSR's public key is used: the requested subject and extensions
    /// are ignored, because identity comes from `actor`, never from the requester.
    pub fn sign_actor_csr_with(
        &self,
        actor: &ActorRef,
        csr_der: &[u8],
        not_before: SystemTime,
        not_after: SystemTime,
        options: &ActorCertOptions,
    ) -> Result<Vec<CertificateDer<'static>>, PkiError> {
        let public_key = csr_public_key(csr_der)?;

        let mut params = leaf_params()?;
        params.subject_alt_names.push(uri_san(&actor.spiffe_id())?);
        if let Some(extra) = &options.extra_uri_san {
            params.subject_alt_names.push(uri_san(extra)?);
        }
        params.extended_key_usages = vec![if options.client_auth_eku {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        }];
        if options.is_ca {
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        }
        let identity = ActorIdentity {
            purpose: options.purpose.clone(),
            ..ActorIdentity::for_atunnel(actor)
        };
        let json = serde_json::to_vec(&identity).map_err(PkiError::IdentityJson)?;
        let copies = match (
            options.include_identity_extension,
            options.duplicate_identity_extension,
        ) {
            (false, _) => 0,
            (true, false) => 1,
            (true, true) => 2,
        };
        for _ in 0..copies {
            // Not critical, as in Go: a verifier that does not know the OID
            // must still accept the chain.
            params
                .custom_extensions
                .push(CustomExtension::from_oid_content(
                    ACTOR_IDENTITY_OID,
                    json.clone(),
                ));
        }
        set_validity(&mut params, not_before, not_after)?;

        let leaf = params
            .signed_by(&public_key, &self.issuer)
            .map_err(|source| PkiError::Sign {
                what: "actor",
                source,
            })?;
        Ok(vec![leaf.der().clone(), self.cert_der()])
    }
}

/// A fresh ECDSA P-256 key for one actor activation.
pub fn new_actor_key() -> Result<KeyPair, PkiError> {
    generate_p256()
}

/// A DER CSR for `key` with an empty subject: the signer decides the identity.
pub fn actor_csr(key: &KeyPair) -> Result<Vec<u8>, PkiError> {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    let csr = params
        .serialize_request(key)
        .map_err(PkiError::CsrSerialize)?;
    Ok(csr.der().to_vec())
}

fn generate_p256() -> Result<KeyPair, PkiError> {
    KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(PkiError::KeyGeneration)
}

/// Parameters shared by every leaf: not a CA, signing only, random serial,
/// and an AKI so chains build unambiguously.
fn leaf_params() -> Result<CertificateParams, PkiError> {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(random_serial()?);
    Ok(params)
}

/// The CSR's public key once its self-signature verifies (proof of possession).
fn csr_public_key(csr_der: &[u8]) -> Result<rcgen::SubjectPublicKeyInfo, PkiError> {
    // Parsed with x509-parser rather than rcgen's CertificateSigningRequestParams,
    // which refuses CSRs requesting extensions it does not model; we ignore
    // requested extensions anyway.
    let (rest, csr) = X509CertificationRequest::from_der(csr_der)
        .map_err(|e| PkiError::CsrParse(e.to_string()))?;
    if !rest.is_empty() {
        return Err(PkiError::CsrParse(format!(
            "{} trailing bytes after the CSR",
            rest.len()
        )));
    }
    csr.verify_signature()
        .map_err(|e| PkiError::CsrSignature(e.to_string()))?;
    rcgen::SubjectPublicKeyInfo::from_der(csr.certification_request_info.subject_pki.raw)
        .map_err(PkiError::CsrKey)
}

fn uri_san(uri: &str) -> Result<SanType, PkiError> {
    let ia5 = uri.try_into().map_err(|source| PkiError::InvalidSan {
        kind: "URI",
        value: uri.to_owned(),
        source,
    })?;
    Ok(SanType::URI(ia5))
}

/// Sets the validity, truncated to whole seconds (what X.509 time can hold),
/// so callers can compare the certificate's times with what they asked for.
fn set_validity(
    params: &mut CertificateParams,
    not_before: SystemTime,
    not_after: SystemTime,
) -> Result<(), PkiError> {
    let invalid = || PkiError::InvalidValidity {
        not_before,
        not_after,
    };
    let before = to_x509_time(not_before).ok_or_else(invalid)?;
    let after = to_x509_time(not_after).ok_or_else(invalid)?;
    if before >= after {
        return Err(invalid());
    }
    params.not_before = before;
    params.not_after = after;
    Ok(())
}

fn to_x509_time(t: SystemTime) -> Option<OffsetDateTime> {
    let secs = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).ok()?,
        // Before the epoch: round towards the past, like truncation after it.
        Err(e) => {
            let d = e.duration();
            let whole = i64::try_from(d.as_secs()).ok()?;
            -whole - i64::from(d.subsec_nanos() > 0)
        }
    };
    OffsetDateTime::from_unix_timestamp(secs).ok()
}

/// A positive 128-bit serial; random so renewals for the same key differ
/// (rcgen's default derives the serial from the public key).
fn random_serial() -> Result<SerialNumber, PkiError> {
    let mut bytes = [0u8; 16];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| PkiError::Random)?;
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01 << 6;
    Ok(SerialNumber::from(bytes.to_vec()))
}

fn encode_pem(tag: &str, der: &[u8]) -> String {
    let config = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
    pem::encode_config(&pem::Pem::new(tag, der), config)
}

fn chain_pem(chain: &[CertificateDer<'_>]) -> String {
    chain
        .iter()
        .map(|der| encode_pem("CERTIFICATE", der))
        .collect()
}

#[cfg(test)]
mod tests {
    use x509_parser::certificate::X509Certificate;
    use x509_parser::extensions::GeneralName;
    use x509_parser::oid_registry::Oid;

    use super::*;
    use crate::identity::verify_actor_leaf;

    const HOUR: Duration = Duration::from_secs(3600);

    fn actor() -> ActorRef {
        ActorRef::new("team-a", "agent-1", "uid-1").expect("actor")
    }

    fn parse(der: &[u8]) -> X509Certificate<'_> {
        X509Certificate::from_der(der).expect("certificate").1
    }

    fn uri_sans(cert: &X509Certificate<'_>) -> Vec<String> {
        cert.subject_alternative_name()
            .expect("san")
            .map(|san| {
                san.value
                    .general_names
                    .iter()
                    .filter_map(|n| match n {
                        GeneralName::URI(u) => Some((*u).to_owned()),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn actor_certificate_has_the_ateapi_shape() {
        let ca = CertificateAuthority::new("actor ca").expect("ca");
        let key = new_actor_key().expect("key");
        let csr = actor_csr(&key).expect("csr");
        let now = SystemTime::now();
        let chain = ca
            .sign_actor_csr(&actor(), &csr, now, now + HOUR)
            .expect("signed");
        assert_eq!(chain.len(), 2);
        assert_eq!(chain[1], ca.cert_der());
        verify_actor_leaf(&chain[0]).expect("gateway accepts it");

        let leaf = parse(&chain[0]);
        assert_eq!(uri_sans(&leaf), vec![actor().spiffe_id()]);
        let eku = leaf.extended_key_usage().expect("eku").expect("present");
        assert!(eku.value.client_auth && !eku.value.server_auth && !eku.value.any);
        let bc = leaf.basic_constraints().expect("bc").expect("present");
        assert!(!bc.value.ca);
        let ku = leaf.key_usage().expect("ku").expect("present");
        assert!(ku.value.digital_signature() && !ku.value.key_cert_sign());
        assert_eq!(leaf.public_key().raw, key.subject_public_key_info());

        let oid = Oid::from(ACTOR_IDENTITY_OID).expect("oid");
        let ext = leaf
            .get_extension_unique(&oid)
            .expect("unique")
            .expect("present");
        assert!(!ext.critical);
        // The extnValue OCTET STRING holds the bare JSON, as Go's pkix.Extension does.
        assert_eq!(
            std::str::from_utf8(ext.value).expect("utf-8"),
            r#"{"Atespace":"team-a","ActorName":"agent-1","ActorUid":"uid-1","Purpose":"atunnel"}"#
        );
    }

    #[test]
    fn actor_signing_ignores_the_requested_subject_and_names() {
        let ca = CertificateAuthority::new("actor ca").expect("ca");
        let key = new_actor_key().expect("key");
        let mut requested =
            CertificateParams::new(vec!["evil.example".to_owned()]).expect("params");
        requested
            .subject_alt_names
            .push(uri_san("spiffe://substrate-actor.local/atespace/x/actor/y").expect("uri"));
        requested.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        requested.distinguished_name = DistinguishedName::new();
        requested
            .distinguished_name
            .push(DnType::CommonName, "evil");
        let csr = requested.serialize_request(&key).expect("csr");
        let now = SystemTime::now();
        let chain = ca
            .sign_actor_csr(&actor(), csr.der(), now, now + HOUR)
            .expect("signed");
        let leaf = parse(&chain[0]);
        assert_eq!(leaf.subject().iter_attributes().count(), 0);
        assert_eq!(
            leaf.subject_alternative_name()
                .expect("san")
                .expect("present")
                .value
                .general_names
                .len(),
            1
        );
        assert_eq!(uri_sans(&leaf), vec![actor().spiffe_id()]);
        assert!(!leaf.is_ca());
    }

    #[test]
    fn actor_signing_refuses_a_csr_whose_signature_does_not_verify() {
        let ca = CertificateAuthority::new("actor ca").expect("ca");
        let key = new_actor_key().expect("key");
        let mut csr = actor_csr(&key).expect("csr");
        let last = csr.len() - 1;
        csr[last] ^= 0x01;
        let now = SystemTime::now();
        assert!(matches!(
            ca.sign_actor_csr(&actor(), &csr, now, now + HOUR),
            Err(PkiError::CsrSignature(_))
        ));
        assert!(matches!(
            ca.sign_actor_csr(&actor(), b"not a csr", now, now + HOUR),
            Err(PkiError::CsrParse(_))
        ));
    }

    #[test]
    fn actor_signing_refuses_an_empty_validity() {
        let ca = CertificateAuthority::new("actor ca").expect("ca");
        let key = new_actor_key().expect("key");
        let csr = actor_csr(&key).expect("csr");
        let now = SystemTime::now();
        assert!(matches!(
            ca.sign_actor_csr(&actor(), &csr, now, now),
            Err(PkiError::InvalidValidity { .. })
        ));
    }

    #[test]
    fn actor_key_is_ecdsa_p256() {
        let key = new_actor_key().expect("key");
        assert_eq!(key.algorithm(), &PKCS_ECDSA_P256_SHA256);
    }

    #[test]
    fn renewals_for_the_same_key_get_distinct_serials() {
        let ca = CertificateAuthority::new("actor ca").expect("ca");
        let key = new_actor_key().expect("key");
        let csr = actor_csr(&key).expect("csr");
        let now = SystemTime::now();
        let a = ca
            .sign_actor_csr(&actor(), &csr, now, now + HOUR)
            .expect("a");
        let b = ca
            .sign_actor_csr(&actor(), &csr, now, now + HOUR)
            .expect("b");
        assert_ne!(parse(&a[0]).raw_serial(), parse(&b[0]).raw_serial());
    }

    #[test]
    fn issued_workload_certificate_carries_names_and_usage() {
        let ca = CertificateAuthority::new("pod ca").expect("ca");
        let ip: IpAddr = "10.1.2.3".parse().expect("ip");
        let cert = ca
            .issue(
                Some(WORKER_SPIFFE_ID),
                &["worker.test"],
                &[ip],
                Usage::ServerAndClient,
                HOUR,
            )
            .expect("issued");
        assert_eq!(cert.chain.len(), 2);
        assert_eq!(cert.chain[1], ca.cert_der());
        assert!(cert.cert_pem.matches("BEGIN CERTIFICATE").count() == 2);
        assert!(cert.key_pem.contains("BEGIN PRIVATE KEY"));
        assert!(matches!(cert.key(), PrivateKeyDer::Pkcs8(_)));

        let leaf = parse(&cert.chain[0]);
        assert_eq!(uri_sans(&leaf), vec![WORKER_SPIFFE_ID.to_owned()]);
        let names = &leaf
            .subject_alternative_name()
            .expect("san")
            .expect("present")
            .value
            .general_names;
        assert!(names.contains(&GeneralName::DNSName("worker.test")));
        assert!(names.contains(&GeneralName::IPAddress(&[10, 1, 2, 3])));
        let eku = leaf.extended_key_usage().expect("eku").expect("present");
        assert!(eku.value.client_auth && eku.value.server_auth);
        assert!(!leaf.is_ca());
        let remaining = leaf.validity().time_to_expiration().expect("valid now");
        assert!(remaining <= time::Duration::hours(1) && remaining > time::Duration::minutes(59));

        let server_only = ca
            .issue(None, &["gw.test"], &[], Usage::Server, HOUR)
            .expect("issued");
        let server_leaf = parse(&server_only.chain[0]);
        let eku = server_leaf
            .extended_key_usage()
            .expect("eku")
            .expect("present");
        assert!(eku.value.server_auth && !eku.value.client_auth);
    }

    #[test]
    fn issue_refuses_an_unencodable_name() {
        let ca = CertificateAuthority::new("pod ca").expect("ca");
        assert!(matches!(
            ca.issue(None, &["bücher.test"], &[], Usage::Server, HOUR),
            Err(PkiError::InvalidSan { kind: "DNS", .. })
        ));
    }

    #[test]
    fn ca_is_a_p256_signing_ca() {
        let ca = CertificateAuthority::new("pod ca").expect("ca");
        let der = ca.cert_der();
        let cert = parse(&der);
        assert!(cert.is_ca());
        let ku = cert.key_usage().expect("ku").expect("present");
        assert!(ku.value.key_cert_sign() && ku.value.crl_sign());
        assert!(cert.subject().to_string().contains("pod ca"));
        match cert.public_key().parsed().expect("public key") {
            x509_parser::public_key::PublicKey::EC(point) => assert_eq!(point.key_size(), 256),
            other => panic!("not an EC key: {other:?}"),
        }
        let remaining = cert.validity().time_to_expiration().expect("valid now");
        assert!(remaining > time::Duration::days(3649));
    }

    #[test]
    fn ca_survives_a_pem_round_trip() {
        let original = CertificateAuthority::new("actor ca").expect("ca");
        let loaded = CertificateAuthority::from_pem(&original.cert_pem(), &original.key_pem())
            .expect("load");
        assert_eq!(loaded.cert_der(), original.cert_der());
        assert_eq!(loaded.cert_pem(), original.cert_pem());

        // What the loaded CA signs verifies under the original certificate.
        let key = new_actor_key().expect("key");
        let csr = actor_csr(&key).expect("csr");
        let now = SystemTime::now();
        let chain = loaded
            .sign_actor_csr(&actor(), &csr, now, now + HOUR)
            .expect("signed");
        let original_der = original.cert_der();
        let ca_cert = parse(&original_der);
        let leaf = parse(&chain[0]);
        leaf.verify_signature(Some(ca_cert.public_key()))
            .expect("signed by the original key");
        assert_eq!(leaf.issuer(), ca_cert.subject());
    }

    #[test]
    fn ca_pem_with_a_foreign_key_is_refused() {
        let a = CertificateAuthority::new("a").expect("ca");
        let b = CertificateAuthority::new("b").expect("ca");
        assert!(matches!(
            CertificateAuthority::from_pem(&a.cert_pem(), &b.key_pem()),
            Err(PkiError::CaKeyMismatch)
        ));
    }

    #[test]
    fn leaf_pem_is_refused_as_a_ca() {
        let ca = CertificateAuthority::new("pod ca").expect("ca");
        let leaf = ca
            .issue(None, &["x.test"], &[], Usage::Server, HOUR)
            .expect("leaf");
        let leaf_only = encode_pem("CERTIFICATE", &leaf.chain[0]);
        assert!(matches!(
            CertificateAuthority::from_pem(&leaf_only, &leaf.key_pem),
            Err(PkiError::NotACa)
        ));
        // The full chain is two certificates: ambiguous, refused.
        assert!(matches!(
            CertificateAuthority::from_pem(&leaf.cert_pem, &leaf.key_pem),
            Err(PkiError::CaCertPem(_))
        ));
    }
}
