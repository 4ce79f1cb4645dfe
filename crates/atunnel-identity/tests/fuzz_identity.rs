//! Property tests for what atunnel and the gateway parse of a peer's
//! identity: the `ate-target-actor` header (`parse_target`), an actor's
//! leaf certificate with its identity extension (`verify_actor_leaf`), a
//! leaf's validity (`check_leaf_validity`), a chain minted by the node
//! agent (`check_minted`), a CSR handed to a signer, and PEM files.
//!
//! Inputs are arbitrary bytes, mutations of a valid certificate, and
//! certificates built with arbitrary SANs and extension contents, checked
//! against an independent statement of the rules: no panic, and the error
//! the first broken rule calls for.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use atunnel_fuzz::{Edit, Weights, apply, edits};
use atunnel_identity::identity::{ACTOR_IDENTITY_OID, parse_target};
use atunnel_identity::pem_files::{load_certs, load_key, load_roots};
use atunnel_identity::pki::{actor_csr, new_actor_key};
use atunnel_identity::verifier::check_leaf_validity;
use atunnel_identity::{
    ActorIdentity, ActorRef, CertificateAuthority, IdentityError, IssuedCert, MintError, Usage,
    check_minted, verify_actor_leaf,
};
use proptest::prelude::*;
use rustls::pki_types::{CertificateDer, UnixTime};

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

/// One valid actor chain, its key and its CA, made once for the binary.
struct Fixture {
    ca: CertificateAuthority,
    key: rcgen::KeyPair,
    csr: Vec<u8>,
    chain: Vec<CertificateDer<'static>>,
    server: IssuedCert,
}

fn actor() -> ActorRef {
    ActorRef::new("team-a", "agent-1", "6f1c2a9e-uid").expect("valid actor")
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let ca = CertificateAuthority::new("actor ca").expect("ca");
        let key = new_actor_key().expect("key");
        let csr = actor_csr(&key).expect("csr");
        let now = SystemTime::now();
        let chain = ca
            .sign_actor_csr(
                &actor(),
                &csr,
                now - Duration::from_secs(60),
                now + Duration::from_secs(3600),
            )
            .expect("signed");
        let server = ca
            .issue(
                Some("spiffe://cluster.local/ns/ate-system/sa/atelet"),
                &["localhost"],
                &[],
                Usage::ServerAndClient,
                Duration::from_secs(3600),
            )
            .expect("server cert");
        Fixture {
            ca,
            key,
            csr,
            chain,
            server,
        }
    })
}

fn mutations() -> impl Strategy<Value = Vec<Edit<u8>>> {
    let weights = Weights {
        replace: 3,
        ..Weights::EVEN
    };
    edits(any::<u8>(), weights, 1..4)
}

/// The name rule, restated: 1 to 253 of lowercase letters, digits, '-', '.'.
fn valid_name(s: &str) -> bool {
    (1..=253).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// The uid rule, restated: 1 to 253 of ASCII letters, digits, '-', '_',
/// '.', and not "." or "..".
fn valid_uid(s: &str) -> bool {
    (1..=253).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && s != "."
        && s != ".."
}

/// Names, mostly valid, some one character off.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => "[a-z0-9.-]{1,12}",
        1 => "[a-zA-Z0-9._/ -]{0,12}",
        1 => "[a-z0-9._A-Z]{1,12}",
        1 => Just("a".repeat(253)),
        1 => Just("a".repeat(254)),
    ]
}

const PREFIX: &str = "spiffe://substrate-actor.local/atespace/";

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn parse_target_takes_exactly_two_valid_names(
        input in prop_oneof![
            (name(), name()).prop_map(|(a, n)| format!("{a}/{n}")),
            (name(), name(), name()).prop_map(|(a, n, x)| format!("{a}/{n}/{x}")),
            name(),
            "\\PC{0,40}",
        ],
    ) {
        let parts: Vec<&str> = input.split('/').collect();
        match parse_target(&input) {
            Ok((a, n)) => {
                prop_assert_eq!(format!("{a}/{n}"), input.clone());
                prop_assert!(parts.len() == 2 && valid_name(&a) && valid_name(&n));
            }
            Err(e) => {
                prop_assert!(
                    !(parts.len() == 2 && valid_name(parts[0]) && valid_name(parts[1])),
                    "valid target {:?} refused", input
                );
                prop_assert!(
                    matches!(&e, IdentityError::InvalidTarget { input: i, .. } if *i == input),
                    "{:?}", e
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn arbitrary_bytes_are_not_an_actor_certificate(
        bytes in prop::collection::vec(any::<u8>(), 0..600),
    ) {
        prop_assert!(matches!(verify_actor_leaf(&bytes), Err(IdentityError::CertificateParse(_))));
        let der = CertificateDer::from(bytes.clone());
        prop_assert!(check_leaf_validity(&der, UnixTime::now()).is_err());
        let minted = check_minted(&[der], &fixture().key, SystemTime::now());
        prop_assert!(matches!(minted, Err(MintError::BadCertificate(_))));
    }

    #[test]
    fn a_mutated_actor_leaf_is_refused_or_still_proves_the_same_actor(edits in mutations()) {
        let fx = fixture();
        let leaf = apply(fx.chain[0].to_vec(), &edits);
        if let Ok(identity) = verify_actor_leaf(&leaf) {
            // Only bytes the identity check does not read (the signature,
            // the key, the validity, the uid) can change and still pass.
            prop_assert_eq!(&identity.purpose, "atunnel");
            prop_assert!(identity.actor_ref().is_ok());
            prop_assert_eq!((&identity.atespace[..], &identity.actor_name[..]), ("team-a", "agent-1"));
        }
        let der = CertificateDer::from(leaf);
        let _ = check_leaf_validity(&der, UnixTime::now());
        let chain = [der, fx.chain[1].clone()];
        if let Ok(not_after) = check_minted(&chain, &fx.key, SystemTime::now()) {
            prop_assert!(not_after > SystemTime::now());
        }
    }

    #[test]
    fn a_mutated_csr_is_signed_only_as_the_actor_it_is_asked_for(edits in mutations()) {
        let fx = fixture();
        let csr = apply(fx.csr.clone(), &edits);
        let now = SystemTime::now();
        if let Ok(chain) = fx.ca.sign_actor_csr(&actor(), &csr, now, now + Duration::from_secs(60)) {
            let identity = verify_actor_leaf(&chain[0]).expect("what the CA signs is an actor leaf");
            prop_assert_eq!(identity, ActorIdentity::for_atunnel(&actor()));
        }
    }
}

/// What goes into the identity extension of a generated leaf.
#[derive(Clone, Debug)]
enum Content {
    Json {
        atespace: String,
        name: String,
        uid: String,
        purpose: String,
    },
    Bytes(Vec<u8>),
}

fn content() -> impl Strategy<Value = Content> {
    prop_oneof![
        6 => (
            prop_oneof![3 => Just("team-a".to_owned()), 1 => name()],
            prop_oneof![3 => Just("agent-1".to_owned()), 1 => name()],
            prop_oneof![3 => Just("uid-1".to_owned()), 1 => "\\PC{0,6}", 1 => Just("a b".to_owned()), 1 => Just(r#"u"\1"#.to_owned())],
            prop_oneof![4 => Just("atunnel".to_owned()), 1 => "[a-z]{0,8}"],
        )
            .prop_map(|(atespace, name, uid, purpose)| Content::Json { atespace, name, uid, purpose }),
        1 => prop::collection::vec(any::<u8>(), 0..80).prop_map(Content::Bytes),
        1 => Just(br#"{"Atespace":"team-a","ActorName":"agent-1","ActorUid":"u","Purpose":"atunnel","X":1}"#.to_vec())
            .prop_map(Content::Bytes),
        1 => Just(br#"{"Atespace":"team-a","ActorName":"agent-1","ActorUid":7,"Purpose":"atunnel"}"#.to_vec())
            .prop_map(Content::Bytes),
    ]
}

fn uris() -> impl Strategy<Value = Vec<String>> {
    let one = prop_oneof![
        6 => (prop_oneof![3 => Just("team-a".to_owned()), 1 => name()],
              prop_oneof![3 => Just("agent-1".to_owned()), 1 => name()])
            .prop_map(|(a, n)| format!("{PREFIX}{a}/actor/{n}")),
        1 => "[a-z]{1,4}".prop_map(|x| format!("{PREFIX}team-a/actor/agent-1/{x}")),
        1 => Just(format!("{PREFIX}team-a/worker/agent-1")),
        1 => Just("spiffe://other.local/atespace/team-a/actor/agent-1".to_owned()),
        1 => "[ -~]{1,30}",
    ];
    prop_oneof![
        8 => one.clone().prop_map(|u| vec![u]),
        1 => Just(vec![]),
        1 => prop::collection::vec(one, 2..4),
    ]
}

/// The actor-form SPIFFE ID rule, restated.
fn actor_of(uri: &str) -> Option<(String, String)> {
    let path = uri.strip_prefix(PREFIX)?;
    let parts: Vec<&str> = path.split('/').collect();
    match parts[..] {
        [a, "actor", n] if valid_name(a) && valid_name(n) => Some((a.to_owned(), n.to_owned())),
        _ => None,
    }
}

fn identity_json(content: &Content) -> Option<serde_json::Value> {
    match content {
        Content::Json {
            atespace,
            name,
            uid,
            purpose,
        } => Some(serde_json::json!({
            "Atespace": atespace, "ActorName": name, "ActorUid": uid, "Purpose": purpose,
        })),
        Content::Bytes(bytes) => {
            // The only JSON shape accepted: the four string fields, no more.
            let Ok(serde_json::Value::Object(map)) = serde_json::from_slice(bytes) else {
                return None;
            };
            let keys = ["Atespace", "ActorName", "ActorUid", "Purpose"];
            let shaped = map.len() == 4
                && keys
                    .iter()
                    .all(|k| map.get(*k).is_some_and(|v| v.is_string()));
            shaped.then_some(serde_json::Value::Object(map))
        }
    }
}

/// What `verify_actor_leaf` must say of a leaf with these URI SANs and
/// identity content (ClientAuth, not a CA, one identity extension).
fn verdict(uris: &[String], content: &Content) -> Result<(), &'static str> {
    let [uri] = uris else {
        return Err("UriSanCount");
    };
    let (atespace, name) = actor_of(uri).ok_or("NotActorSpiffeId")?;
    let json = identity_json(content).ok_or("IdentityExtensionJson")?;
    let field = |k: &str| json[k].as_str().unwrap_or_default().to_owned();
    if field("Purpose") != "atunnel" {
        return Err("WrongPurpose");
    }
    if !valid_name(&field("Atespace"))
        || !valid_name(&field("ActorName"))
        || !valid_uid(&field("ActorUid"))
    {
        return Err("IdentityExtensionField");
    }
    if (field("Atespace"), field("ActorName")) != (atespace, name) {
        return Err("IdentityMismatch");
    }
    Ok(())
}

fn leaf(uris: &[String], content: &Content) -> Vec<u8> {
    let bytes = match content {
        Content::Json { .. } => {
            serde_json::to_vec(&identity_json(content).expect("generated JSON")).expect("json")
        }
        Content::Bytes(bytes) => bytes.clone(),
    };
    let mut params = rcgen::CertificateParams::default();
    params.subject_alt_names = uris
        .iter()
        .map(|u| rcgen::SanType::URI(u.clone().try_into().expect("ASCII is IA5")))
        .collect();
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    params
        .custom_extensions
        .push(rcgen::CustomExtension::from_oid_content(
            ACTOR_IDENTITY_OID,
            bytes,
        ));
    params
        .self_signed(&fixture().key)
        .expect("self-signed")
        .der()
        .to_vec()
}

fn kind(e: &IdentityError) -> &'static str {
    match e {
        IdentityError::UriSanCount { .. } => "UriSanCount",
        IdentityError::NotActorSpiffeId { .. } => "NotActorSpiffeId",
        IdentityError::IdentityExtensionJson(_) => "IdentityExtensionJson",
        IdentityError::WrongPurpose { .. } => "WrongPurpose",
        IdentityError::IdentityExtensionField(_) => "IdentityExtensionField",
        IdentityError::IdentityMismatch { .. } => "IdentityMismatch",
        _ => "other",
    }
}

proptest! {
    #![proptest_config(config(96))]

    #[test]
    fn a_leaf_with_arbitrary_sans_and_identity_content_gets_the_verdict_the_rules_give(
        uris in uris(),
        content in content(),
    ) {
        let got = verify_actor_leaf(&leaf(&uris, &content));
        match (verdict(&uris, &content), got) {
            (Ok(()), Ok(identity)) => {
                let (a, n) = actor_of(&uris[0]).expect("actor uri");
                prop_assert_eq!((identity.atespace, identity.actor_name), (a, n));
            }
            (Err(want), Err(e)) => prop_assert_eq!(kind(&e), want, "{}", e),
            (want, got) => prop_assert!(false, "want {:?}, got {:?}", want, got),
        }
    }
}

// ---- PEM files ----

/// A file of its own for each case, removed when dropped.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn with(bytes: &[u8]) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "atunnel-identity-fuzz-{}-{}.pem",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, bytes).expect("write a temporary file");
        Self(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn pem_input() -> impl Strategy<Value = Vec<u8>> {
    let fx = fixture();
    let certs = fx.server.cert_pem.clone().into_bytes();
    let key = fx.server.key_pem.clone().into_bytes();
    let both = [certs.clone(), key.clone()].concat();
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..300),
        4 => (prop_oneof![Just(certs), Just(key), Just(both)], mutations())
            .prop_map(|(pem, edits)| apply(pem, &edits)),
    ]
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn a_pem_file_of_any_bytes_loads_or_is_refused_naming_the_file(input in pem_input()) {
        let file = TempFile::with(&input);
        let name = file.0.display().to_string();
        match load_certs(&file.0) {
            Ok(certs) => prop_assert!(!certs.is_empty()),
            Err(e) => prop_assert!(e.to_string().contains(&name), "{}", e),
        }
        if let Err(e) = load_key(&file.0) {
            prop_assert!(e.to_string().contains(&name), "{}", e);
        }
        if let Err(e) = load_roots(&file.0) {
            prop_assert!(e.to_string().contains(&name), "{}", e);
        }
    }
}

#[test]
fn a_valid_pem_chain_and_key_load_whole() {
    let fx = fixture();
    let file = TempFile::with(format!("{}{}", fx.server.cert_pem, fx.server.key_pem).as_bytes());
    assert_eq!(load_certs(&file.0).expect("chain"), fx.server.chain);
    assert!(load_key(&file.0).is_ok());
    assert_eq!(load_roots(&file.0).expect("roots").len(), 2);
}
