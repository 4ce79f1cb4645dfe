//! Actor identity: names, SPIFFE IDs, the actor-identity certificate
//! extension, and the gateway's check of an actor's leaf certificate.

use std::fmt;

use serde::{Deserialize, Serialize};
use x509_parser::certificate::X509Certificate;
use x509_parser::der_parser::oid::Oid;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::FromDer;

/// OID of the X.509 extension that carries an actor's [`ActorIdentity`] as JSON.
pub const ACTOR_IDENTITY_OID: &[u64] = &[1, 3, 6, 1, 4, 1, 11129, 2, 12, 2];

/// SPIFFE trust domain of actor certificates.
pub const ACTOR_TRUST_DOMAIN: &str = "substrate-actor.local";

/// The only purpose an actor certificate may carry to be accepted by the egress gateway.
pub const PURPOSE_ATUNNEL: &str = "atunnel";

/// Longest atespace or actor name accepted (a DNS name's limit).
const MAX_NAME_LEN: usize = 253;

/// Why an actor name, a target or an actor certificate was refused.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("invalid {field} {value:?}: {reason}")]
    InvalidName {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("invalid actor uid {value:?}: {reason}")]
    InvalidUid { value: String, reason: &'static str },
    #[error("invalid target actor {input:?}: {reason}")]
    InvalidTarget { input: String, reason: String },
    #[error("actor certificate could not be parsed: {0}")]
    CertificateParse(String),
    #[error("actor certificate has a malformed {extension} extension: {detail}")]
    MalformedExtension {
        extension: &'static str,
        detail: String,
    },
    #[error("actor certificate is a CA certificate")]
    IsCa,
    #[error("actor certificate lacks the ClientAuth extended key usage")]
    MissingClientAuth,
    #[error("actor certificate has {count} URI SANs, want exactly one")]
    UriSanCount { count: usize },
    #[error("actor certificate URI SAN {uri:?} is not an actor SPIFFE ID: {reason}")]
    NotActorSpiffeId { uri: String, reason: String },
    #[error("actor certificate lacks the actor-identity extension")]
    MissingIdentityExtension,
    #[error("actor certificate has {count} actor-identity extensions, want exactly one")]
    DuplicateIdentityExtension { count: usize },
    #[error("actor-identity extension is not valid JSON of the expected shape: {0}")]
    IdentityExtensionJson(String),
    #[error("actor-identity extension carries an invalid field: {0}")]
    IdentityExtensionField(Box<IdentityError>),
    #[error("actor-identity extension purpose is {purpose:?}, want {PURPOSE_ATUNNEL:?}")]
    WrongPurpose { purpose: String },
    #[error(
        "actor-identity extension names {ext_atespace}/{ext_name} but the URI SAN names {san_atespace}/{san_name}"
    )]
    IdentityMismatch {
        san_atespace: String,
        san_name: String,
        ext_atespace: String,
        ext_name: String,
    },
}

/// A validated reference to one actor: the unit that egress identity is issued to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ActorRef {
    pub atespace: String,
    pub name: String,
    pub uid: String,
}

impl ActorRef {
    /// Validates the parts; atespace and name must be lowercase DNS-ish names
    /// because they are embedded in a SPIFFE URI path.
    pub fn new(
        atespace: impl Into<String>,
        name: impl Into<String>,
        uid: impl Into<String>,
    ) -> Result<Self, IdentityError> {
        let atespace = atespace.into();
        let name = name.into();
        let uid = uid.into();
        validate_name("atespace", &atespace)?;
        validate_name("actor name", &name)?;
        validate_uid(&uid)?;
        Ok(Self {
            atespace,
            name,
            uid,
        })
    }

    /// The actor's SPIFFE ID, carried as the certificate's only URI SAN.
    pub fn spiffe_id(&self) -> String {
        actor_spiffe_id(&self.atespace, &self.name)
    }
}

impl fmt::Display for ActorRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.atespace, self.name)
    }
}

fn actor_spiffe_id(atespace: &str, name: &str) -> String {
    format!("spiffe://{ACTOR_TRUST_DOMAIN}/atespace/{atespace}/actor/{name}")
}

fn validate_name(field: &'static str, value: &str) -> Result<(), IdentityError> {
    let reason = if value.is_empty() {
        Some("must not be empty")
    } else if value.len() > MAX_NAME_LEN {
        Some("longer than 253 characters")
    } else if !value
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    {
        Some("only lowercase letters, digits, '-' and '.' are allowed")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(IdentityError::InvalidName {
            field,
            value: value.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// A uid names the sandbox's namespaces (files under /run/netns) and is a
/// label value in /metrics, JSON and logs; what a Kubernetes UID carries
/// (a UUID) passes all of them unescaped.
fn validate_uid(value: &str) -> Result<(), IdentityError> {
    let reason = if value.is_empty() {
        Some("must not be empty")
    } else if value.len() > MAX_NAME_LEN {
        Some("longer than 253 characters")
    } else if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    {
        Some("only ASCII letters, digits, '-', '_' and '.' are allowed")
    } else if value == "." || value == ".." {
        Some("must not be \".\" or \"..\"")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(IdentityError::InvalidUid {
            value: value.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// Parses an `<atespace>/<actor>` target (the `ate-target-actor` header).
pub fn parse_target(s: &str) -> Result<(String, String), IdentityError> {
    let invalid = |reason: String| IdentityError::InvalidTarget {
        input: s.to_owned(),
        reason,
    };
    let mut parts = s.split('/');
    let (Some(atespace), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err(invalid("want exactly one '/' (<atespace>/<actor>)".into()));
    };
    validate_name("atespace", atespace).map_err(|e| invalid(e.to_string()))?;
    validate_name("actor name", name).map_err(|e| invalid(e.to_string()))?;
    Ok((atespace.to_owned(), name.to_owned()))
}

/// The JSON carried in the actor-identity extension. Field names and order
/// match the Go `json.Marshal` output the rest of the system produces.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ActorIdentity {
    #[serde(rename = "Atespace")]
    pub atespace: String,
    #[serde(rename = "ActorName")]
    pub actor_name: String,
    #[serde(rename = "ActorUid")]
    pub actor_uid: String,
    #[serde(rename = "Purpose")]
    pub purpose: String,
}

impl ActorIdentity {
    /// The identity an atunnel certificate for `actor` carries.
    pub fn for_atunnel(actor: &ActorRef) -> Self {
        Self {
            atespace: actor.atespace.clone(),
            actor_name: actor.name.clone(),
            actor_uid: actor.uid.clone(),
            purpose: PURPOSE_ATUNNEL.to_owned(),
        }
    }

    /// The actor this identity names, validated.
    pub fn actor_ref(&self) -> Result<ActorRef, IdentityError> {
        ActorRef::new(&self.atespace, &self.actor_name, &self.actor_uid)
    }
}

/// The gateway's identity check of a leaf whose chain has already been
/// verified: returns the actor it proves, or why it proves none.
pub fn verify_actor_leaf(leaf_der: &[u8]) -> Result<ActorIdentity, IdentityError> {
    let (rest, cert) = X509Certificate::from_der(leaf_der)
        .map_err(|e| IdentityError::CertificateParse(e.to_string()))?;
    if !rest.is_empty() {
        return Err(IdentityError::CertificateParse(format!(
            "{} trailing bytes after the certificate",
            rest.len()
        )));
    }

    let malformed = |extension: &'static str| {
        move |e: x509_parser::error::X509Error| IdentityError::MalformedExtension {
            extension,
            detail: e.to_string(),
        }
    };
    let basic_constraints = cert
        .basic_constraints()
        .map_err(malformed("basicConstraints"))?;
    if basic_constraints.is_some_and(|bc| bc.value.ca) {
        return Err(IdentityError::IsCa);
    }
    let eku = cert
        .extended_key_usage()
        .map_err(malformed("extendedKeyUsage"))?;
    if !eku.is_some_and(|eku| eku.value.client_auth) {
        return Err(IdentityError::MissingClientAuth);
    }

    let (san_atespace, san_name) = single_actor_uri_san(&cert)?;

    let identity_oid = Oid::from(ACTOR_IDENTITY_OID)
        .expect("ACTOR_IDENTITY_OID is a valid OID with more than two arcs");
    let identity_exts: Vec<_> = cert
        .extensions()
        .iter()
        .filter(|ext| ext.oid == identity_oid)
        .collect();
    let ext = match identity_exts.as_slice() {
        [] => return Err(IdentityError::MissingIdentityExtension),
        [one] => one,
        many => {
            return Err(IdentityError::DuplicateIdentityExtension { count: many.len() });
        }
    };
    let identity: ActorIdentity = serde_json::from_slice(ext.value)
        .map_err(|e| IdentityError::IdentityExtensionJson(e.to_string()))?;
    if identity.purpose != PURPOSE_ATUNNEL {
        return Err(IdentityError::WrongPurpose {
            purpose: identity.purpose,
        });
    }
    identity
        .actor_ref()
        .map_err(|e| IdentityError::IdentityExtensionField(Box::new(e)))?;
    if identity.atespace != san_atespace || identity.actor_name != san_name {
        return Err(IdentityError::IdentityMismatch {
            san_atespace,
            san_name,
            ext_atespace: identity.atespace,
            ext_name: identity.actor_name,
        });
    }
    Ok(identity)
}

/// The URIs among the certificate's subject alternative names, in order.
pub(crate) fn uri_sans<'a>(
    cert: &'a X509Certificate<'_>,
) -> Result<Vec<&'a str>, x509_parser::error::X509Error> {
    let san = cert.subject_alternative_name()?;
    Ok(san
        .iter()
        .flat_map(|san| san.value.general_names.iter())
        .filter_map(|name| match name {
            GeneralName::URI(uri) => Some(*uri),
            _ => None,
        })
        .collect())
}

/// The (atespace, name) named by the certificate's only URI SAN.
fn single_actor_uri_san(cert: &X509Certificate<'_>) -> Result<(String, String), IdentityError> {
    let uris = uri_sans(cert).map_err(|e| IdentityError::MalformedExtension {
        extension: "subjectAltName",
        detail: e.to_string(),
    })?;
    let [uri] = uris.as_slice() else {
        return Err(IdentityError::UriSanCount { count: uris.len() });
    };
    parse_actor_spiffe_id(uri)
}

/// Splits `spiffe://substrate-actor.local/atespace/<a>/actor/<n>` into (a, n).
fn parse_actor_spiffe_id(uri: &str) -> Result<(String, String), IdentityError> {
    let not_actor = |reason: String| IdentityError::NotActorSpiffeId {
        uri: uri.to_owned(),
        reason,
    };
    let prefix = format!("spiffe://{ACTOR_TRUST_DOMAIN}/atespace/");
    let path = uri.strip_prefix(&prefix).ok_or_else(|| {
        not_actor(format!(
            "want the form spiffe://{ACTOR_TRUST_DOMAIN}/atespace/<atespace>/actor/<name>"
        ))
    })?;
    let mut parts = path.split('/');
    let (Some(atespace), Some("actor"), Some(name), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(not_actor(
            "path must be /atespace/<atespace>/actor/<name>".into(),
        ));
    };
    validate_name("atespace", atespace).map_err(|e| not_actor(e.to_string()))?;
    validate_name("actor name", name).map_err(|e| not_actor(e.to_string()))?;
    Ok((atespace.to_owned(), name.to_owned()))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::pki::{
        ActorCertOptions, CertificateAuthority, Usage, WORKER_SPIFFE_ID, actor_csr, new_actor_key,
    };

    fn actor() -> ActorRef {
        ActorRef::new("team-a", "agent-1", "6f1c2a9e-uid").expect("valid actor")
    }

    fn leaf_with(options: &ActorCertOptions) -> Vec<u8> {
        let ca = CertificateAuthority::new("actor ca").expect("ca");
        let key = new_actor_key().expect("key");
        let csr = actor_csr(&key).expect("csr");
        let now = SystemTime::now();
        let chain = ca
            .sign_actor_csr_with(
                &actor(),
                &csr,
                now - Duration::from_secs(60),
                now + Duration::from_secs(3600),
                options,
            )
            .expect("signed");
        chain[0].to_vec()
    }

    #[test]
    fn actor_ref_builds_spiffe_id_and_display() {
        let a = actor();
        assert_eq!(
            a.spiffe_id(),
            "spiffe://substrate-actor.local/atespace/team-a/actor/agent-1"
        );
        assert_eq!(a.to_string(), "team-a/agent-1");
    }

    #[test]
    fn actor_ref_refuses_bad_names_and_uids() {
        for (atespace, name, uid) in [
            ("", "a", "u"),
            ("a", "", "u"),
            ("Team", "a", "u"),
            ("a/b", "a", "u"),
            ("a", "a_b", "u"),
            ("a", "a", ""),
            ("a", "a", "u u"),
            ("a", "a", "u\n"),
            ("a", "a", "u\"1"),
            ("a", "a", "u\\1"),
            ("a", "a", "u/1"),
            ("a", "a", ".."),
            ("a", "a", "u{1}"),
            ("a", "a", "\u{e9}"),
        ] {
            assert!(
                ActorRef::new(atespace, name, uid).is_err(),
                "{atespace:?} {name:?} {uid:?} accepted"
            );
        }
        let long = "a".repeat(254);
        assert!(matches!(
            ActorRef::new(long, "a", "u"),
            Err(IdentityError::InvalidName {
                field: "atespace",
                ..
            })
        ));
        assert!(ActorRef::new("a".repeat(253), "x.y-1", "u").is_ok());
        let uuid = "6F1C2A9E-0b1c-4d2e-9f3a-123456789abc";
        assert!(ActorRef::new("a", "a", uuid).is_ok());
        assert!(ActorRef::new("a", "a", "u_1.x").is_ok());
        assert!(ActorRef::new("a", "a", "u".repeat(253)).is_ok());
        match ActorRef::new("a", "a", "u\"1\\") {
            Err(e @ IdentityError::InvalidUid { .. }) => {
                let said = e.to_string();
                assert!(said.contains(r#""u\"1\\""#), "names the uid: {said}");
                assert!(said.contains("'-', '_' and '.'"), "names the set: {said}");
            }
            other => panic!("{other:?}"),
        }
        assert!(ActorRef::new("a", "a", "u".repeat(254)).is_err());
    }

    #[test]
    fn target_parses_exactly_one_slash() {
        assert_eq!(
            parse_target("team-a/agent-1").expect("valid"),
            ("team-a".to_owned(), "agent-1".to_owned())
        );
        for bad in [
            "team-a",
            "team-a/agent/1",
            "/agent",
            "team-a/",
            "Team/a",
            "",
        ] {
            assert!(
                matches!(parse_target(bad), Err(IdentityError::InvalidTarget { .. })),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn identity_json_has_go_field_names_in_order() {
        let json = serde_json::to_string(&ActorIdentity::for_atunnel(&actor())).expect("json");
        assert_eq!(
            json,
            r#"{"Atespace":"team-a","ActorName":"agent-1","ActorUid":"6f1c2a9e-uid","Purpose":"atunnel"}"#
        );
    }

    #[test]
    fn identity_json_with_unknown_field_is_refused() {
        let json = r#"{"Atespace":"a","ActorName":"b","ActorUid":"c","Purpose":"atunnel","X":1}"#;
        assert!(serde_json::from_str::<ActorIdentity>(json).is_err());
    }

    #[test]
    fn correct_actor_leaf_is_accepted() {
        let identity = verify_actor_leaf(&leaf_with(&ActorCertOptions::default())).expect("valid");
        assert_eq!(identity, ActorIdentity::for_atunnel(&actor()));
    }

    #[test]
    fn leaf_without_identity_extension_is_refused() {
        let leaf = leaf_with(&ActorCertOptions {
            include_identity_extension: false,
            ..Default::default()
        });
        assert!(matches!(
            verify_actor_leaf(&leaf),
            Err(IdentityError::MissingIdentityExtension)
        ));
    }

    #[test]
    fn leaf_with_duplicate_identity_extension_is_refused() {
        let leaf = leaf_with(&ActorCertOptions {
            duplicate_identity_extension: true,
            ..Default::default()
        });
        assert!(matches!(
            verify_actor_leaf(&leaf),
            Err(IdentityError::DuplicateIdentityExtension { count: 2 })
        ));
    }

    #[test]
    fn leaf_with_other_purpose_is_refused() {
        let leaf = leaf_with(&ActorCertOptions {
            purpose: "ssh".into(),
            ..Default::default()
        });
        assert!(matches!(
            verify_actor_leaf(&leaf),
            Err(IdentityError::WrongPurpose { purpose }) if purpose == "ssh"
        ));
    }

    #[test]
    fn leaf_with_extra_uri_san_is_refused() {
        let leaf = leaf_with(&ActorCertOptions {
            extra_uri_san: Some(actor_spiffe_id("team-a", "agent-2")),
            ..Default::default()
        });
        assert!(matches!(
            verify_actor_leaf(&leaf),
            Err(IdentityError::UriSanCount { count: 2 })
        ));
    }

    #[test]
    fn leaf_without_client_auth_is_refused() {
        let leaf = leaf_with(&ActorCertOptions {
            client_auth_eku: false,
            ..Default::default()
        });
        assert!(matches!(
            verify_actor_leaf(&leaf),
            Err(IdentityError::MissingClientAuth)
        ));
    }

    #[test]
    fn ca_certificate_is_refused_as_actor_leaf() {
        let leaf = leaf_with(&ActorCertOptions {
            is_ca: true,
            ..Default::default()
        });
        assert!(matches!(verify_actor_leaf(&leaf), Err(IdentityError::IsCa)));
    }

    #[test]
    fn worker_spiffe_id_is_refused_as_actor_leaf() {
        let ca = CertificateAuthority::new("pod ca").expect("ca");
        let worker = ca
            .issue(
                Some(WORKER_SPIFFE_ID),
                &[],
                &[],
                Usage::ServerAndClient,
                Duration::from_secs(3600),
            )
            .expect("worker cert");
        assert!(matches!(
            verify_actor_leaf(&worker.chain[0]),
            Err(IdentityError::NotActorSpiffeId { uri, .. }) if uri == WORKER_SPIFFE_ID
        ));
    }

    #[test]
    fn actor_spiffe_id_parses_only_the_actor_form() {
        assert_eq!(
            parse_actor_spiffe_id("spiffe://substrate-actor.local/atespace/a/actor/b")
                .expect("valid"),
            ("a".to_owned(), "b".to_owned())
        );
        for bad in [
            "spiffe://substrate-actor.local/actor/a/b",
            "spiffe://other.local/atespace/a/actor/b",
            "spiffe://substrate-actor.local/atespace/a/actor/b/c",
            "spiffe://substrate-actor.local/atespace/a/worker/b",
            "spiffe://substrate-actor.local/atespace/A/actor/b",
            "spiffe://substrate-actor.local/atespace//actor/b",
        ] {
            assert!(parse_actor_spiffe_id(bad).is_err(), "{bad:?} accepted");
        }
    }

    /// A self-signed leaf with the actor shape but arbitrary identity-extension bytes.
    fn leaf_with_extension_content(content: &[u8]) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::default();
        params.subject_alt_names = vec![rcgen::SanType::URI(
            actor().spiffe_id().try_into().expect("ia5"),
        )];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        params
            .custom_extensions
            .push(rcgen::CustomExtension::from_oid_content(
                ACTOR_IDENTITY_OID,
                content.to_vec(),
            ));
        let key = new_actor_key().expect("key");
        params
            .self_signed(&key)
            .expect("self-signed")
            .der()
            .to_vec()
    }

    #[test]
    fn extension_naming_another_actor_is_refused() {
        let json =
            r#"{"Atespace":"team-a","ActorName":"agent-2","ActorUid":"u","Purpose":"atunnel"}"#;
        assert!(matches!(
            verify_actor_leaf(&leaf_with_extension_content(json.as_bytes())),
            Err(IdentityError::IdentityMismatch { ext_name, .. }) if ext_name == "agent-2"
        ));
    }

    #[test]
    fn extension_that_is_not_identity_json_is_refused() {
        for content in [
            &b"not json"[..],
            br#"{"Atespace":"team-a","ActorName":"agent-1","ActorUid":"u"}"#,
            br#"{"Atespace":"team-a","ActorName":"agent-1","ActorUid":"u","Purpose":"atunnel","Extra":""}"#,
        ] {
            assert!(matches!(
                verify_actor_leaf(&leaf_with_extension_content(content)),
                Err(IdentityError::IdentityExtensionJson(_))
            ));
        }
    }

    #[test]
    fn extension_with_empty_uid_is_refused() {
        let json =
            r#"{"Atespace":"team-a","ActorName":"agent-1","ActorUid":"","Purpose":"atunnel"}"#;
        assert!(matches!(
            verify_actor_leaf(&leaf_with_extension_content(json.as_bytes())),
            Err(IdentityError::IdentityExtensionField(_))
        ));
    }

    #[test]
    fn garbage_is_refused_as_certificate() {
        assert!(matches!(
            verify_actor_leaf(b"not a certificate"),
            Err(IdentityError::CertificateParse(_))
        ));
    }
}

#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::*;

    fn valid_name(s: &str) -> bool {
        (1..=MAX_NAME_LEN).contains(&s.len())
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    }

    fn part() -> impl Strategy<Value = String> {
        prop_oneof![
            6 => "[a-z0-9.-]{1,10}",
            1 => "[a-zA-Z0-9/%_ -]{0,10}",
            1 => "[a-z0-9_.-]{1,10}",
            1 => Just("actor".to_owned()),
            1 => Just("b".repeat(254)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// A URI SAN parses as an actor exactly when it is the actor form
        /// with two valid names, and then formats back to itself.
        #[test]
        fn an_actor_spiffe_id_parses_exactly_when_it_is_the_actor_form(
            uri in prop_oneof![
                (part(), part()).prop_map(|(a, n)| actor_spiffe_id(&a, &n)),
                (part(), part(), part()).prop_map(|(a, k, n)| {
                    format!("spiffe://{ACTOR_TRUST_DOMAIN}/atespace/{a}/{k}/{n}")
                }),
                (part(), part()).prop_map(|(a, n)| format!("{}/x", actor_spiffe_id(&a, &n))),
                "\\PC{0,60}",
                "spiffe://[a-z.-]{0,24}/atespace/[a-z]{1,3}/actor/[a-z]{1,3}",
            ],
        ) {
            let parts: Option<Vec<&str>> = uri
                .strip_prefix("spiffe://substrate-actor.local/atespace/")
                .map(|p| p.split('/').collect());
            let want = match parts.as_deref() {
                Some([a, "actor", n]) if valid_name(a) && valid_name(n) => {
                    Some((a.to_string(), n.to_string()))
                }
                _ => None,
            };
            match parse_actor_spiffe_id(&uri) {
                Ok((a, n)) => {
                    prop_assert_eq!(actor_spiffe_id(&a, &n), uri.clone());
                    prop_assert_eq!(Some((a, n)), want);
                }
                Err(e) => {
                    prop_assert_eq!(want, None);
                    let is_named = matches!(&e, IdentityError::NotActorSpiffeId { uri: u, .. } if *u == uri);
                    prop_assert!(is_named, "{:?}", e);
                }
            }
        }
    }
}
