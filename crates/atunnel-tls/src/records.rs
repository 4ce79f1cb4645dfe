//! The TLS 1.3 record layer (RFC 8446 sections 5 and 6, and the key update
//! of 4.6.3 and 7.2) for a connection whose handshake rustls finished: what
//! a hibernated connection keeps instead of a whole rustls session is one
//! traffic secret and sequence number per direction.
//!
//! Written by hand because no crate resumes a TLS session from its traffic
//! secrets in user space: rustls hands its keys out (`dangerous_extract_secrets`,
//! meant for kernel TLS) but cannot take them back, its kernel-connection API
//! that follows key updates exists only for its unbuffered connection (which
//! tokio-rustls does not use), and kernel TLS is not on every worker. This
//! is the part kernel TLS does, framing and the per-record nonce, plus the
//! post-handshake messages a server receives: alerts and KeyUpdate. The AEAD
//! and HKDF are ring's, the code rustls itself runs.
//!
//! [`Framing`], which finds record boundaries in what a socket read, serves
//! the sockets under rustls too, during and after the handshake.
//!
//! Sans I/O: [`Inbound`] takes bytes and yields plaintext, an end or an
//! error carrying the alert owed to the peer; [`Outbound`] seals records.
//! Where rustls and the RFC disagree on an alert, the RFC is followed (each
//! place says so).

use std::fmt;
use std::io;
use std::ops::Range;

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::hkdf;

use crate::secrets::{MAX_SECRET_LEN, Secret};

pub const HEADER_LEN: usize = 5;
/// Most plaintext one record carries (2^14).
pub const MAX_PLAINTEXT: usize = 16 * 1024;
/// Largest record a peer may send: the plaintext, its content type, padding
/// and tag may add up to 256 bytes (RFC 8446 section 5.2).
pub const MAX_RECORD: usize = HEADER_LEN + MAX_PLAINTEXT + 256;
const TAG_LEN: usize = 16;
/// What sealing adds to a record's plaintext: header, content type, tag.
pub const SEAL_OVERHEAD: usize = HEADER_LEN + 1 + TAG_LEN;
const NONCE_LEN: usize = 12;

/// Where a byte stream stands among TLS records, fed what was read: the
/// socket under rustls on either side watches it (to hand rustls one
/// record at a time, to see where the first protected record begins, to
/// hibernate only between records). Eight bytes: every idle connection
/// holds one.
#[derive(Clone, Copy, Debug, Default)]
pub struct Framing {
    /// The next record's header, as far as it has been seen.
    header: [u8; HEADER_LEN],
    /// How much of it: 0-4 (at 5 the header is complete and reset to 0).
    header_seen: u8,
    /// Bytes of the current record's body still to come.
    body_left: u16,
}

impl Framing {
    /// Between records: no header or body partly read.
    pub fn at_boundary(&self) -> bool {
        self.header_seen == 0 && self.body_left == 0
    }

    /// Bytes to the end of the current record's header or body.
    pub fn to_boundary(&self) -> usize {
        if self.body_left > 0 {
            usize::from(self.body_left)
        } else {
            HEADER_LEN - usize::from(self.header_seen)
        }
    }

    /// Takes in `bytes`, calling `header` with each record header they
    /// complete.
    pub fn track(&mut self, mut bytes: &[u8], mut header: impl FnMut(&[u8; HEADER_LEN])) {
        while !bytes.is_empty() {
            if self.body_left > 0 {
                let n = usize::from(self.body_left).min(bytes.len());
                // `n` is at most `body_left`, a u16.
                self.body_left -= n as u16;
                bytes = &bytes[n..];
            } else {
                self.header[usize::from(self.header_seen)] = bytes[0];
                self.header_seen += 1;
                bytes = &bytes[1..];
                if usize::from(self.header_seen) == HEADER_LEN {
                    self.header_seen = 0;
                    self.body_left = u16::from_be_bytes([self.header[3], self.header[4]]);
                    header(&self.header);
                }
            }
        }
    }
}

pub const CONTENT_CHANGE_CIPHER_SPEC: u8 = 20;
pub const CONTENT_ALERT: u8 = 21;
pub const CONTENT_HANDSHAKE: u8 = 22;
pub const CONTENT_APPLICATION_DATA: u8 = 23;
/// The outer type of every protected TLS 1.3 record.
const OUTER_TYPE: u8 = CONTENT_APPLICATION_DATA;

/// Alert levels and the descriptions this layer sends or reads (RFC 8446
/// section 6).
pub const LEVEL_WARNING: u8 = 1;
pub const LEVEL_FATAL: u8 = 2;
pub const ALERT_CLOSE_NOTIFY: u8 = 0;
pub const ALERT_UNEXPECTED_MESSAGE: u8 = 10;
pub const ALERT_BAD_RECORD_MAC: u8 = 20;
pub const ALERT_RECORD_OVERFLOW: u8 = 22;
pub const ALERT_ILLEGAL_PARAMETER: u8 = 47;
pub const ALERT_DECODE_ERROR: u8 = 50;
pub const ALERT_INTERNAL_ERROR: u8 = 80;
pub const ALERT_USER_CANCELED: u8 = 90;
/// The alert that ends a direction cleanly.
pub const CLOSE_NOTIFY: [u8; 2] = [LEVEL_WARNING, ALERT_CLOSE_NOTIFY];

const HANDSHAKE_KEY_UPDATE: u8 = 24;
const UPDATE_NOT_REQUESTED: u8 = 0;
const UPDATE_REQUESTED: u8 = 1;

/// rustls's bounds on records that carry nothing (`TemperCounters` and
/// `ALLOWED_CONSECUTIVE_EMPTY_FRAGMENTS_MAX` in rustls 0.23), kept so that
/// a peer cannot spin this side on them either: empty application data
/// records in a row, key updates between two records of data, and
/// user_canceled warnings in a connection's life.
const MAX_EMPTY_IN_ROW: u8 = 32;
const MAX_KEY_UPDATES_BETWEEN_DATA: u8 = 32;
const MAX_WARNINGS: u8 = 4;
/// rustls's write limit below the sequence number's end (`SEQ_SOFT_LIMIT`).
const SEQ_SOFT_LIMIT: u64 = 0xffff_ffff_ffff_0000;

/// How many key updates rustls may have made on a connection before it
/// first hibernates that a resumed [`Direction`] looks through, at its
/// first key update, to find the secret of the keys rustls handed over. A
/// peer's key updates are rare (rustls and Go clients update at their AEAD
/// limits, 2^23 records and more), and each step is two HMACs.
pub const MAX_GENERATIONS: u32 = 64;

/// A TLS error that ends the connection: what failed, and the alert this
/// side owes the peer (`None` when the peer ended it with an alert of its
/// own, which is not answered). Carried inside the `io::Error`s of
/// [`crate::stream::RecordStream`]; `TlsError::of` finds it there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsError {
    pub alert: Option<u8>,
    pub kind: io::ErrorKind,
    pub message: String,
}

impl TlsError {
    fn alert(alert: u8, message: impl Into<String>) -> Self {
        Self {
            alert: Some(alert),
            kind: io::ErrorKind::InvalidData,
            message: message.into(),
        }
    }

    fn unexpected(message: impl Into<String>) -> Self {
        Self::alert(ALERT_UNEXPECTED_MESSAGE, message)
    }

    /// The TLS error inside an `io::Error` from this layer.
    pub fn of(e: &io::Error) -> Option<&TlsError> {
        e.get_ref()?.downcast_ref()
    }
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.alert {
            Some(a) => write!(f, "{} (alert {} sent)", self.message, alert_name(a)),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for TlsError {}

impl From<TlsError> for io::Error {
    fn from(e: TlsError) -> Self {
        io::Error::new(e.kind, e)
    }
}

fn alert_name(a: u8) -> &'static str {
    match a {
        ALERT_CLOSE_NOTIFY => "close_notify",
        ALERT_UNEXPECTED_MESSAGE => "unexpected_message",
        ALERT_BAD_RECORD_MAC => "bad_record_mac",
        ALERT_RECORD_OVERFLOW => "record_overflow",
        ALERT_ILLEGAL_PARAMETER => "illegal_parameter",
        ALERT_DECODE_ERROR => "decode_error",
        ALERT_INTERNAL_ERROR => "internal_error",
        // What a gateway may end a client's connection with just after the
        // handshake, when it refuses the client's certificate (6.2).
        40 => "handshake_failure",
        42 => "bad_certificate",
        43 => "unsupported_certificate",
        44 => "certificate_revoked",
        45 => "certificate_expired",
        46 => "certificate_unknown",
        48 => "unknown_ca",
        49 => "access_denied",
        51 => "decrypt_error",
        116 => "certificate_required",
        _ => "other",
    }
}

/// The TLS 1.3 suites this layer carries, each with its AEAD and hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suite {
    Aes128Gcm,
    Aes256Gcm,
    Chacha20Poly1305,
}

impl Suite {
    fn aead(self) -> &'static aead::Algorithm {
        match self {
            Self::Aes128Gcm => &aead::AES_128_GCM,
            Self::Aes256Gcm => &aead::AES_256_GCM,
            Self::Chacha20Poly1305 => &aead::CHACHA20_POLY1305,
        }
    }

    fn hkdf(self) -> hkdf::Algorithm {
        match self {
            Self::Aes256Gcm => hkdf::HKDF_SHA384,
            Self::Aes128Gcm | Self::Chacha20Poly1305 => hkdf::HKDF_SHA256,
        }
    }

    fn hash_len(self) -> usize {
        match self {
            Self::Aes256Gcm => 48,
            Self::Aes128Gcm | Self::Chacha20Poly1305 => 32,
        }
    }

    /// The suite of a rustls-negotiated TLS 1.3 connection and its
    /// confidentiality limit (records one key may protect), when this
    /// module can carry it (TLS 1.2 records differ and stay with rustls).
    pub fn of(suite: rustls::SupportedCipherSuite) -> Option<(Self, u64)> {
        let rustls::SupportedCipherSuite::Tls13(s) = suite else {
            return None;
        };
        use rustls::CipherSuite::*;
        let ours = match s.common.suite {
            TLS13_AES_128_GCM_SHA256 => Self::Aes128Gcm,
            TLS13_AES_256_GCM_SHA384 => Self::Aes256Gcm,
            TLS13_CHACHA20_POLY1305_SHA256 => Self::Chacha20Poly1305,
            _ => return None,
        };
        Some((ours, s.common.confidentiality_limit))
    }
}

struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// HKDF-Expand-Label(secret, label, "", out.len()) (RFC 8446 section 7.1).
fn expand_label(suite: Suite, secret: &[u8], label: &[u8], out: &mut [u8]) {
    let prk = hkdf::Prk::new_less_safe(suite.hkdf(), secret);
    let length = (out.len() as u16).to_be_bytes();
    let label_len = [(b"tls13 ".len() + label.len()) as u8];
    let info: [&[u8]; 5] = [&length, &label_len, b"tls13 ", label, &[0]];
    prk.expand(&info, Len(out.len()))
        .and_then(|okm| okm.fill(out))
        .expect("TLS 1.3 labels and lengths are within HKDF's limits");
}

/// A secret's traffic key and IV (RFC 8446 section 7.3).
fn traffic_keys(suite: Suite, secret: &[u8]) -> ([u8; 32], [u8; NONCE_LEN]) {
    let mut key = [0u8; 32];
    let mut iv = [0u8; NONCE_LEN];
    expand_label(suite, secret, b"key", &mut key[..suite.aead().key_len()]);
    expand_label(suite, secret, b"iv", &mut iv);
    (key, iv)
}

/// The key ring expanded, and the IV, while the connection is awake.
struct Awake {
    key: LessSafeKey,
    iv: [u8; NONCE_LEN],
}

/// One direction of a connection: its traffic secret and the next record's
/// sequence number. ring's expanded key is built when a record moves and
/// dropped by [`Direction::sleep`] (half a kilobyte); the key and IV it is
/// built from are kept (45 B), so waking derives nothing: two HKDF
/// expansions per direction cost about 5 us with SHA-384, more than the
/// rest of a wake.
pub struct Direction {
    suite: Suite,
    secret: [u8; MAX_SECRET_LEN],
    seq: u64,
    /// The current secret's key and IV, once known.
    keys: Option<([u8; 32], [u8; NONCE_LEN])>,
    /// `secret` is known to be the secret of `keys`. A resumed direction
    /// holds the key log's generation-0 secret beside the keys rustls
    /// handed over, and finds which generation they are only when it
    /// needs the next one: at a key update, which is rare.
    secret_is_current: bool,
    awake: Option<Box<Awake>>,
}

impl Direction {
    /// A direction at generation 0 of `secret`, from sequence number `seq`.
    pub fn new(suite: Suite, secret: &Secret, seq: u64) -> Option<Self> {
        if secret.as_bytes().len() != suite.hash_len() {
            return None;
        }
        let mut s = [0u8; MAX_SECRET_LEN];
        s[..suite.hash_len()].copy_from_slice(secret.as_bytes());
        Some(Self {
            suite,
            secret: s,
            seq,
            keys: None,
            secret_is_current: true,
            awake: None,
        })
    }

    /// The direction whose current keys rustls handed over (`keys`, with
    /// `seq`), taken as rustls gave them, beside the generation-0 secret
    /// its key log gave. Which generation the keys are (rustls may have
    /// updated them since the handshake) is found at the next key update
    /// ([`Direction::next_generation`]), not here: hibernating a
    /// connection derives nothing. `None` if the keys are not the suite's.
    pub fn resume(
        suite: Suite,
        secret: &Secret,
        seq: u64,
        keys: &rustls::ConnectionTrafficSecrets,
    ) -> Option<Self> {
        use rustls::ConnectionTrafficSecrets as K;
        let (key, iv) = match (suite, keys) {
            (Suite::Aes128Gcm, K::Aes128Gcm { key, iv })
            | (Suite::Aes256Gcm, K::Aes256Gcm { key, iv })
            | (Suite::Chacha20Poly1305, K::Chacha20Poly1305 { key, iv }) => (key, iv),
            _ => return None,
        };
        let len = suite.aead().key_len();
        if key.as_ref().len() != len || iv.as_ref().len() != NONCE_LEN {
            return None;
        }
        let mut d = Self::new(suite, secret, seq)?;
        let mut k = [0u8; 32];
        k[..len].copy_from_slice(key.as_ref());
        let mut v = [0u8; NONCE_LEN];
        v.copy_from_slice(iv.as_ref());
        d.keys = Some((k, v));
        d.secret_is_current = false;
        Some(d)
    }

    /// Makes `secret` the secret of the keys in use: a resumed direction
    /// follows its generation-0 secret through up to [`MAX_GENERATIONS`]
    /// key updates until it yields their IV (96 bits of HKDF output: the
    /// key, from the same secret, is not derived again to compare). An
    /// error if it never does: the secret is not this connection's, or
    /// rustls updated more often.
    fn find_current_secret(&mut self) -> Result<(), TlsError> {
        // Keys absent are derived from the secret, so it is theirs.
        let Some((_, iv)) = self.keys.filter(|_| !self.secret_is_current) else {
            self.secret_is_current = true;
            return Ok(());
        };
        for _ in 0..=MAX_GENERATIONS {
            let mut v = [0u8; NONCE_LEN];
            expand_label(self.suite, self.secret(), b"iv", &mut v);
            if v == iv {
                self.secret_is_current = true;
                return Ok(());
            }
            self.step_secret();
        }
        Err(TlsError::alert(
            ALERT_INTERNAL_ERROR,
            "the key log's TLS secret does not lead to the connection's keys",
        ))
    }

    fn secret(&self) -> &[u8] {
        &self.secret[..self.suite.hash_len()]
    }

    /// The next record's sequence number.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Drops the derived key; the next record derives it again.
    pub fn sleep(&mut self) {
        self.awake = None;
    }

    /// Moves to the next traffic secret, HKDF-Expand-Label(secret,
    /// "traffic upd", "", Hash.length), from sequence number 0 (RFC 8446
    /// section 7.2). A resumed direction first finds its current secret,
    /// and fails if its secret does not lead to its keys.
    pub fn next_generation(&mut self) -> Result<(), TlsError> {
        self.find_current_secret()?;
        self.step_secret();
        self.seq = 0;
        self.keys = None;
        self.awake = None;
        Ok(())
    }

    /// `secret` becomes HKDF-Expand-Label(secret, "traffic upd", "",
    /// Hash.length).
    fn step_secret(&mut self) {
        let len = self.suite.hash_len();
        let mut next = [0u8; MAX_SECRET_LEN];
        expand_label(self.suite, self.secret(), b"traffic upd", &mut next[..len]);
        self.secret = next;
    }

    fn awake(&mut self) -> &Awake {
        let (suite, secret) = (self.suite, &self.secret[..self.suite.hash_len()]);
        let keys = &mut self.keys;
        self.awake.get_or_insert_with(|| {
            let (key, iv) = *keys.get_or_insert_with(|| traffic_keys(suite, secret));
            let unbound = UnboundKey::new(suite.aead(), &key[..suite.aead().key_len()])
                .expect("key length is the suite's");
            Box::new(Awake {
                key: LessSafeKey::new(unbound),
                iv,
            })
        })
    }

    /// The per-record nonce: the IV XORed with the sequence number, left
    /// padded (RFC 8446 section 5.3). Each sequence number is used once;
    /// it may not wrap (5.3), and [`Outbound`] updates keys long before.
    fn next_nonce(&mut self) -> Result<Nonce, TlsError> {
        let seq = self.seq;
        self.seq = seq.checked_add(1).ok_or_else(|| {
            TlsError::alert(ALERT_INTERNAL_ERROR, "TLS sequence number exhausted")
        })?;
        let mut nonce = self.awake().iv;
        for (n, s) in nonce[NONCE_LEN - 8..].iter_mut().zip(seq.to_be_bytes()) {
            *n ^= s;
        }
        Ok(Nonce::assume_unique_for_key(nonce))
    }

    /// Appends one protected record of `content_type` carrying `plaintext`
    /// and `padding` zeros to `out`. [`Outbound`] keeps within the limits
    /// (at most [`MAX_PLAINTEXT`] bytes, no padding); tests seal past them
    /// to see a peer refuse the record.
    pub fn seal_padded(
        &mut self,
        content_type: u8,
        plaintext: &[u8],
        padding: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), TlsError> {
        self.seal_with(content_type, plaintext.len(), padding, out, |out| {
            out.extend_from_slice(plaintext)
        })
    }

    /// Appends one protected record of `content_type` whose `len` bytes of
    /// plaintext `fill` appends to `out` (so they are copied once, from
    /// wherever they are, into the record they are sealed in), followed by
    /// `padding` zeros.
    fn seal_with(
        &mut self,
        content_type: u8,
        len: usize,
        padding: usize,
        out: &mut Vec<u8>,
        fill: impl FnOnce(&mut Vec<u8>),
    ) -> Result<(), TlsError> {
        let body_len = len + 1 + padding + TAG_LEN;
        assert!(
            body_len <= usize::from(u16::MAX),
            "a record's length is 16 bits"
        );
        let nonce = self.next_nonce()?;
        let header = aad(body_len);
        let start = out.len();
        out.reserve(HEADER_LEN + body_len);
        out.extend_from_slice(&header);
        fill(out);
        debug_assert_eq!(
            out.len(),
            start + HEADER_LEN + len,
            "fill appends len bytes"
        );
        out.push(content_type);
        out.resize(out.len() + padding, 0);
        let tag = self
            .awake()
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(header), &mut out[start + HEADER_LEN..])
            .map_err(|_| TlsError::alert(ALERT_INTERNAL_ERROR, "TLS record encryption failed"))?;
        out.extend_from_slice(tag.as_ref());
        Ok(())
    }

    pub fn seal(
        &mut self,
        content_type: u8,
        plaintext: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), TlsError> {
        self.seal_padded(content_type, plaintext, 0, out)
    }

    /// Opens, in place, the whole record at the start of `record` (its
    /// header checked by [`record_len`]): its inner content type and the
    /// content's range in `record`.
    pub fn open(&mut self, record: &mut [u8]) -> Result<(u8, Range<usize>), TlsError> {
        let body_len = record.len() - HEADER_LEN;
        // rustls authenticates the header it expects rather than the one
        // received (the same for a well-formed record).
        let header = aad(body_len);
        let nonce = self.next_nonce()?;
        let inner = self
            .awake()
            .key
            .open_in_place(nonce, Aad::from(header), &mut record[HEADER_LEN..])
            .map_err(|_| TlsError::alert(ALERT_BAD_RECORD_MAC, "TLS record failed to decrypt"))?;
        // The inner plaintext is content, content type, then zero padding,
        // 2^14 + 1 bytes at most (5.4).
        if inner.len() > MAX_PLAINTEXT + 1 {
            return Err(TlsError::alert(
                ALERT_RECORD_OVERFLOW,
                "TLS inner plaintext over 2^14 + 1 bytes",
            ));
        }
        let Some(type_at) = inner.iter().rposition(|b| *b != 0) else {
            return Err(TlsError::unexpected("TLS record without a content type"));
        };
        Ok((inner[type_at], HEADER_LEN..HEADER_LEN + type_at))
    }
}

impl Drop for Direction {
    fn drop(&mut self) {
        self.secret.fill(0);
        // Keeps the zeroing from being elided as a dead store.
        std::hint::black_box(&mut self.secret);
    }
}

/// The header of a protected record of `body_len` bytes, its AAD.
fn aad(body_len: usize) -> [u8; HEADER_LEN] {
    [OUTER_TYPE, 3, 3, (body_len >> 8) as u8, body_len as u8]
}

/// Length of the whole record (header included) at the start of `buf` once
/// all of it is there; `None` while more bytes are needed. The header is
/// checked as soon as it is in.
pub fn record_len(buf: &[u8]) -> Result<Option<usize>, TlsError> {
    let Some(header) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    // After the handshake every record is protected: any other outer type
    // is unexpected (section 5), change_cipher_spec included (it may only
    // come before the peer's Finished). rustls answers unknown types with
    // decode_error and tries to decrypt known ones (bad_record_mac).
    if header[0] != OUTER_TYPE {
        return Err(TlsError::unexpected(format!(
            "unexpected TLS record type {} after the handshake",
            header[0]
        )));
    }
    // As rustls: any 3.x legacy version (5.1: it is not checked).
    if header[1] != 3 {
        return Err(TlsError::alert(
            ALERT_DECODE_ERROR,
            "TLS record with a version other than 3.x",
        ));
    }
    let len = HEADER_LEN + usize::from(u16::from_be_bytes([header[3], header[4]]));
    if len > MAX_RECORD {
        // rustls decrypts up to 2^14 + 2048 and then fails; 5.2 asks for
        // record_overflow.
        return Err(TlsError::alert(
            ALERT_RECORD_OVERFLOW,
            "TLS record over 2^14 + 256 bytes",
        ));
    }
    if len < HEADER_LEN + TAG_LEN {
        return Err(TlsError::alert(
            ALERT_BAD_RECORD_MAC,
            "TLS record too short to be protected",
        ));
    }
    Ok((buf.len() >= len).then_some(len))
}

/// What [`Inbound::read`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// Plaintext is ready ([`Inbound::plaintext`]).
    Data,
    /// The peer's close_notify: no more data will come this way.
    Closed,
    /// The peer updated its keys; if it asked, this side must update its
    /// own before its next record ([`Outbound::owe_key_update`]).
    KeyUpdate { requested: bool },
    /// More bytes are needed ([`Inbound::space`]).
    More,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Open,
    Closed,
    Failed,
}

/// What one record opened by [`RecordReader::open`] carried.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// Application data, at this range of the record.
    Data(Range<usize>),
    /// The peer's close_notify.
    Closed,
    /// The peer updated its keys (see [`Read::KeyUpdate`]).
    KeyUpdate { requested: bool },
    /// Nothing for the application: an empty record, a warning, part of a
    /// handshake message, a session ticket skipped.
    Nothing,
}

/// Opens whole records one at a time, wherever the caller buffers them, and
/// handles what is not application data: alerts, key updates and (on a
/// client) session tickets. Holds no buffer.
pub struct RecordReader {
    rx: Direction,
    /// The first bytes of a handshake message that continues in the next
    /// record (handshake messages may be fragmented, 5.1): its type and
    /// length, four bytes at most.
    hs: [u8; 4],
    hs_len: u8,
    /// Accept NewSessionTicket messages and skip them (a client; a server
    /// never receives one).
    tickets: bool,
    /// Bytes of a skipped NewSessionTicket still to come.
    skip: u16,
    empty_in_row: u8,
    key_updates: u8,
    warnings: u8,
}

/// Largest handshake message rustls accepts (its `MAX_HANDSHAKE_SIZE`); a
/// session ticket is far smaller.
const MAX_TICKET_MESSAGE: usize = 0xffff;
const HANDSHAKE_NEW_SESSION_TICKET: u8 = 4;

impl RecordReader {
    /// A server's reader: key updates and alerts only.
    pub fn new(rx: Direction) -> Self {
        Self {
            rx,
            hs: [0; 4],
            hs_len: 0,
            tickets: false,
            skip: 0,
            empty_in_row: 0,
            key_updates: 0,
            warnings: 0,
        }
    }

    /// A client's reader: also skips the session tickets a server may send
    /// at any time after the handshake (4.6.1), which a client that never
    /// resumes does not keep (rustls drops them too).
    pub fn for_client(rx: Direction) -> Self {
        Self {
            tickets: true,
            ..Self::new(rx)
        }
    }

    /// Drops the derived key.
    pub fn sleep(&mut self) {
        self.rx.sleep();
    }

    /// Opens, in place, the whole record `record` (its length found by
    /// [`record_len`]) and says what it carried.
    pub fn open(&mut self, record: &mut [u8]) -> Result<Opened, TlsError> {
        let (content_type, content) = self.rx.open(record)?;
        if (self.hs_len > 0 || self.skip > 0) && content_type != CONTENT_HANDSHAKE {
            return Err(TlsError::unexpected(
                "TLS record interleaved with a fragmented handshake message",
            ));
        }
        if content_type != CONTENT_APPLICATION_DATA && content.is_empty() {
            // 5.4: only application data may be empty.
            return Err(TlsError::unexpected(format!(
                "empty TLS record of content type {content_type}"
            )));
        }
        match content_type {
            CONTENT_APPLICATION_DATA if content.is_empty() => {
                // Legal (5.4); bounded as rustls does.
                self.empty_in_row += 1;
                if self.empty_in_row > MAX_EMPTY_IN_ROW {
                    return Err(TlsError::unexpected("too many empty TLS records in a row"));
                }
                Ok(Opened::Nothing)
            }
            CONTENT_APPLICATION_DATA => {
                self.empty_in_row = 0;
                self.key_updates = 0;
                Ok(Opened::Data(content))
            }
            CONTENT_ALERT => {
                self.empty_in_row = 0;
                let alert = <[u8; 2]>::try_from(&record[content]).ok();
                self.alert(alert)
            }
            CONTENT_HANDSHAKE => {
                self.empty_in_row = 0;
                self.handshake(&record[content])
            }
            // A protected change_cipher_spec is unexpected (5, like
            // rustls), and so is every other type.
            other => Err(TlsError::unexpected(format!(
                "unexpected TLS content type {other}"
            ))),
        }
    }

    fn alert(&mut self, alert: Option<[u8; 2]>) -> Result<Opened, TlsError> {
        let Some([level, description]) = alert else {
            return Err(TlsError::alert(ALERT_DECODE_ERROR, "malformed TLS alert"));
        };
        if level != LEVEL_WARNING && level != LEVEL_FATAL {
            // An invalid enum (6, as rustls).
            return Err(TlsError::alert(
                ALERT_ILLEGAL_PARAMETER,
                format!("TLS alert of unknown level {level}"),
            ));
        }
        match (level, description) {
            (_, ALERT_CLOSE_NOTIFY) => Ok(Opened::Closed),
            // A closure alert that precedes a close_notify (6.1); rustls
            // ignores it at warning level, four times at most.
            (LEVEL_WARNING, ALERT_USER_CANCELED) => {
                self.warnings += 1;
                if self.warnings > MAX_WARNINGS {
                    return Err(TlsError::unexpected("too many TLS warning alerts"));
                }
                Ok(Opened::Nothing)
            }
            // Every other alert is an error alert whatever its level (6);
            // it is not answered. (rustls answers a warning-level one with
            // decode_error.)
            (_, description) => Err(TlsError {
                alert: None,
                kind: io::ErrorKind::ConnectionAborted,
                message: format!(
                    "peer sent TLS alert {description} ({})",
                    alert_name(description)
                ),
            }),
        }
    }

    /// Post-handshake messages: KeyUpdate, and NewSessionTicket on a
    /// client, skipped (this side never asks for a certificate after the
    /// handshake, and a server is never sent a ticket). `content` is one
    /// record's content: several messages, or part of one.
    fn handshake(&mut self, mut rest: &[u8]) -> Result<Opened, TlsError> {
        loop {
            if self.skip > 0 {
                let n = usize::from(self.skip).min(rest.len());
                self.skip -= n as u16;
                rest = &rest[n..];
            }
            if rest.is_empty() {
                return Ok(Opened::Nothing);
            }
            let take = (4 - usize::from(self.hs_len)).min(rest.len());
            let hs_len = usize::from(self.hs_len);
            self.hs[hs_len..hs_len + take].copy_from_slice(&rest[..take]);
            self.hs_len += take as u8;
            rest = &rest[take..];
            match self.hs[0] {
                HANDSHAKE_NEW_SESSION_TICKET if self.tickets => {
                    if self.hs_len < 4 {
                        return Ok(Opened::Nothing);
                    }
                    let len = usize::from(self.hs[1]) << 16
                        | usize::from(self.hs[2]) << 8
                        | usize::from(self.hs[3]);
                    if len > MAX_TICKET_MESSAGE {
                        return Err(TlsError::alert(
                            ALERT_DECODE_ERROR,
                            "TLS NewSessionTicket too large",
                        ));
                    }
                    self.hs_len = 0;
                    self.skip = len as u16;
                }
                HANDSHAKE_KEY_UPDATE => return self.key_update(rest),
                other => {
                    return Err(TlsError::unexpected(format!(
                        "unexpected TLS handshake message {other} after the handshake"
                    )));
                }
            }
        }
    }

    /// A KeyUpdate whose header is in `hs` (once all four bytes are) and
    /// whose body starts `rest`.
    fn key_update(&mut self, rest: &[u8]) -> Result<Opened, TlsError> {
        if self.hs_len < 4 {
            return Ok(Opened::Nothing);
        }
        if self.hs[1..4] != [0, 0, 1] {
            return Err(TlsError::alert(
                ALERT_DECODE_ERROR,
                "malformed TLS KeyUpdate",
            ));
        }
        let Some((&request, after)) = rest.split_first() else {
            return Ok(Opened::Nothing);
        };
        self.hs_len = 0;
        // "Handshake messages MUST NOT span key changes" (5.1): the
        // key update must end its record.
        if !after.is_empty() {
            return Err(TlsError::unexpected(
                "TLS KeyUpdate not at the end of its record",
            ));
        }
        let requested = match request {
            UPDATE_NOT_REQUESTED => false,
            UPDATE_REQUESTED => true,
            other => {
                return Err(TlsError::alert(
                    ALERT_ILLEGAL_PARAMETER,
                    format!("TLS KeyUpdate with request {other}"),
                ));
            }
        };
        self.key_updates += 1;
        if self.key_updates > MAX_KEY_UPDATES_BETWEEN_DATA {
            return Err(TlsError::unexpected("too many TLS key updates"));
        }
        self.rx.next_generation()?;
        Ok(Opened::KeyUpdate { requested })
    }
}

/// The receiving side: bytes from the socket in, plaintext out. Holds a
/// buffer of one record's size ([`MAX_RECORD`]) only while bytes of a
/// record or plaintext are in it.
pub struct Inbound {
    reader: RecordReader,
    /// `buf[..filled]` was read; records not yet opened start at `start`;
    /// plaintext not yet handed out is `buf[plain]`.
    buf: Option<Box<[u8; MAX_RECORD]>>,
    filled: u16,
    start: u16,
    plain: (u16, u16),
    state: State,
}

impl Inbound {
    pub fn new(rx: Direction) -> Self {
        Self {
            reader: RecordReader::new(rx),
            buf: None,
            filled: 0,
            start: 0,
            plain: (0, 0),
            state: State::Open,
        }
    }

    /// Plaintext opened and not yet consumed.
    pub fn plaintext(&self) -> &[u8] {
        match &self.buf {
            Some(buf) => &buf[usize::from(self.plain.0)..usize::from(self.plain.1)],
            None => &[],
        }
    }

    /// Marks `n` bytes of [`Inbound::plaintext`] as handed out.
    pub fn consume(&mut self, n: usize) {
        let left = usize::from(self.plain.1 - self.plain.0);
        self.plain.0 += n.min(left) as u16;
        self.release_if_idle();
    }

    /// Whether a buffer is held (a record or plaintext is in flight).
    pub fn holds_buffer(&self) -> bool {
        self.buf.is_some()
    }

    /// Bytes buffered: read and not yet opened, or plaintext not yet
    /// handed out. Never over [`MAX_RECORD`].
    pub fn buffered(&self) -> usize {
        usize::from(self.filled - self.start) + usize::from(self.plain.1 - self.plain.0)
    }

    /// Whether [`Inbound::read`] would make progress without more bytes.
    pub fn has_pending(&self) -> bool {
        self.state != State::Open
            || !self.plaintext().is_empty()
            || self.buf.as_ref().is_some_and(|b| {
                !matches!(
                    record_len(&b[usize::from(self.start)..usize::from(self.filled)]),
                    Ok(None)
                )
            })
    }

    pub fn is_failed(&self) -> bool {
        self.state == State::Failed
    }

    /// Drops the derived key and, if nothing is in it, the buffer.
    pub fn sleep(&mut self) {
        self.reader.sleep();
        self.release_if_idle();
    }

    /// Drops the buffer if nothing is in it.
    pub fn release_if_idle(&mut self) {
        if self.plain.0 == self.plain.1 && self.start == self.filled {
            self.buf = None;
            (self.filled, self.start, self.plain) = (0, 0, (0, 0));
        }
    }

    /// Room to read into, after what is buffered: at most one record's
    /// worth in all. Empty once the peer closed or the connection failed.
    pub fn space(&mut self) -> &mut [u8] {
        if self.state != State::Open {
            return &mut [];
        }
        let buf = self.buf.get_or_insert_with(|| {
            vec![0u8; MAX_RECORD]
                .into_boxed_slice()
                .try_into()
                .expect("length is MAX_RECORD")
        });
        // `space` is asked for when no whole record is buffered: move the
        // partial one to the front (plaintext was handed out first).
        if self.start > 0 && self.plain.0 == self.plain.1 {
            buf.copy_within(usize::from(self.start)..usize::from(self.filled), 0);
            self.filled -= self.start;
            self.start = 0;
            self.plain = (0, 0);
        }
        &mut buf[usize::from(self.filled)..]
    }

    /// Records that `n` bytes were read into [`Inbound::space`].
    pub fn filled(&mut self, n: usize) {
        let room = MAX_RECORD - usize::from(self.filled);
        self.filled += n.min(room) as u16;
    }

    /// Opens the next record(s) until one yields something.
    pub fn read(&mut self) -> Result<Read, TlsError> {
        match self.state {
            State::Failed => {
                return Err(TlsError {
                    alert: None,
                    kind: io::ErrorKind::BrokenPipe,
                    message: "TLS connection failed earlier".into(),
                });
            }
            State::Closed => return Ok(Read::Closed),
            State::Open => {}
        }
        if !self.plaintext().is_empty() {
            return Ok(Read::Data);
        }
        match self.next_record() {
            Ok(Read::Closed) => {
                // "Any data received after a closure alert has been
                // received MUST be ignored" (6.1).
                self.state = State::Closed;
                self.buf = None;
                (self.filled, self.start, self.plain) = (0, 0, (0, 0));
                Ok(Read::Closed)
            }
            Ok(Read::More) => {
                self.release_if_idle();
                Ok(Read::More)
            }
            Ok(r) => Ok(r),
            Err(e) => {
                self.state = State::Failed;
                self.buf = None;
                (self.filled, self.start, self.plain) = (0, 0, (0, 0));
                Err(e)
            }
        }
    }

    fn next_record(&mut self) -> Result<Read, TlsError> {
        loop {
            let Some(buf) = self.buf.as_mut() else {
                return Ok(Read::More);
            };
            let at = usize::from(self.start);
            let Some(len) = record_len(&buf[at..usize::from(self.filled)])? else {
                return Ok(Read::More);
            };
            self.start += len as u16;
            match self.reader.open(&mut buf[at..at + len])? {
                Opened::Data(content) => {
                    self.plain = ((at + content.start) as u16, (at + content.end) as u16);
                    return Ok(Read::Data);
                }
                Opened::Closed => return Ok(Read::Closed),
                Opened::KeyUpdate { requested } => return Ok(Read::KeyUpdate { requested }),
                Opened::Nothing => {}
            }
        }
    }
}

/// The sending side: seals records, updating its keys when the peer asked
/// and before the suite's confidentiality limit, as rustls does.
pub struct Outbound {
    tx: Direction,
    /// Records one key may protect (the suite's confidentiality limit).
    limit: u64,
    key_update_owed: bool,
}

impl Outbound {
    pub fn new(tx: Direction, limit: u64) -> Self {
        Self {
            tx,
            limit: limit.min(SEQ_SOFT_LIMIT),
            key_update_owed: false,
        }
    }

    /// The peer asked for a key update: one is sent, and the keys change,
    /// before the next record (4.6.3; several requests get one update).
    pub fn owe_key_update(&mut self) {
        self.key_update_owed = true;
    }

    pub fn sleep(&mut self) {
        self.tx.sleep();
    }

    pub fn seq(&self) -> u64 {
        self.tx.seq
    }

    fn key_update(&mut self, request: u8, out: &mut Vec<u8>) -> Result<(), TlsError> {
        // Before the KeyUpdate is sealed: failing after it, this side would
        // seal its alert under keys the peer has been told are gone.
        self.tx.find_current_secret()?;
        self.tx.seal(
            CONTENT_HANDSHAKE,
            &[HANDSHAKE_KEY_UPDATE, 0, 0, 1, request],
            out,
        )?;
        self.tx.next_generation()
    }

    fn owed(&mut self, out: &mut Vec<u8>) -> Result<(), TlsError> {
        if std::mem::take(&mut self.key_update_owed) {
            self.key_update(UPDATE_NOT_REQUESTED, out)?;
        }
        Ok(())
    }

    /// Appends records carrying `data` (at most [`MAX_PLAINTEXT`] bytes).
    pub fn seal_data(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), TlsError> {
        self.owed(out)?;
        // As rustls: the key update takes the last sequence number the key
        // may protect, unless the key is unused.
        if self.tx.seq > 0 && self.tx.seq.saturating_add(1) >= self.limit {
            self.key_update(UPDATE_REQUESTED, out)?;
        }
        self.tx.seal(CONTENT_APPLICATION_DATA, data, out)
    }

    /// Appends one record carrying the first `len` bytes (at most
    /// [`MAX_PLAINTEXT`]) of `bufs` after skipping `skip` of them, copied
    /// straight from the slices into the record: a writer's frame header
    /// and payload travel in one record rather than one each.
    pub fn seal_data_gathered(
        &mut self,
        bufs: &[io::IoSlice<'_>],
        skip: usize,
        len: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), TlsError> {
        self.owed(out)?;
        if self.tx.seq > 0 && self.tx.seq.saturating_add(1) >= self.limit {
            self.key_update(UPDATE_REQUESTED, out)?;
        }
        self.tx
            .seal_with(CONTENT_APPLICATION_DATA, len, 0, out, |out| {
                let (mut skip, mut left) = (skip, len);
                for b in bufs {
                    if left == 0 {
                        break;
                    }
                    if skip >= b.len() {
                        skip -= b.len();
                        continue;
                    }
                    let part = &b[skip..];
                    skip = 0;
                    let n = part.len().min(left);
                    out.extend_from_slice(&part[..n]);
                    left -= n;
                }
            })
    }

    /// Appends an alert (close_notify at warning level, the rest fatal).
    /// Alerts are sent past the limit, as rustls does.
    pub fn seal_alert(&mut self, description: u8, out: &mut Vec<u8>) -> Result<(), TlsError> {
        self.owed(out)?;
        let level = if description == ALERT_CLOSE_NOTIFY {
            LEVEL_WARNING
        } else {
            LEVEL_FATAL
        };
        self.tx.seal(CONTENT_ALERT, &[level, description], out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(byte: u8) -> Secret {
        Secret::new(&[byte; 32]).expect("length")
    }

    fn pair() -> (Outbound, Inbound) {
        let tx = Direction::new(Suite::Chacha20Poly1305, &secret(7), 0).expect("suite");
        let rx = Direction::new(Suite::Chacha20Poly1305, &secret(7), 0).expect("suite");
        (Outbound::new(tx, u64::MAX), Inbound::new(rx))
    }

    #[test]
    fn framing_finds_each_record_however_the_reads_split_it() {
        // Three records: 3, 0 and 300 body bytes, of types 22, 23, 21.
        let mut wire = vec![22, 3, 3, 0, 3, 1, 2, 3, 23, 3, 3, 0, 0, 21, 3, 3, 1, 44];
        wire.extend_from_slice(&[0; 300]);
        for split in [1, 2, 4, 5, 7, 64, wire.len()] {
            let mut framing = Framing::default();
            let mut types = Vec::new();
            for piece in wire.chunks(split) {
                assert!(framing.to_boundary() >= 1);
                framing.track(piece, |h| types.push(h[0]));
            }
            assert_eq!(types, [22, 23, 21], "split into reads of {split}");
            assert!(framing.at_boundary());
        }
        let mut framing = Framing::default();
        framing.track(&wire[..7], |_| {});
        assert!(!framing.at_boundary());
        assert_eq!(framing.to_boundary(), 1, "one byte of the first body left");
        assert_eq!(std::mem::size_of::<Framing>(), 8);
    }

    fn feed(inbound: &mut Inbound, bytes: &[u8]) {
        let space = inbound.space();
        space[..bytes.len()].copy_from_slice(bytes);
        inbound.filled(bytes.len());
    }

    #[test]
    fn records_open_only_with_the_same_key_and_sequence_number() {
        let mut out = Vec::new();
        let mut tx = Direction::new(Suite::Aes128Gcm, &secret(1), 5).expect("suite");
        tx.seal(CONTENT_APPLICATION_DATA, b"hello", &mut out)
            .expect("seal");
        assert_eq!(record_len(&out).expect("header"), Some(out.len()));
        let mut same = out.clone();
        let mut rx = Direction::new(Suite::Aes128Gcm, &secret(1), 5).expect("suite");
        let (t, range) = rx.open(&mut same).expect("open");
        assert_eq!((t, &same[range]), (CONTENT_APPLICATION_DATA, &b"hello"[..]));
        // Another sequence number is another nonce.
        let mut other = Direction::new(Suite::Aes128Gcm, &secret(1), 6).expect("suite");
        let err = other.open(&mut out).expect_err("wrong nonce");
        assert_eq!(err.alert, Some(ALERT_BAD_RECORD_MAC), "{err}");
    }

    #[test]
    fn a_key_update_moves_both_sides_to_the_next_secret() {
        let (mut tx, mut rx) = pair();
        let mut out = Vec::new();
        tx.owe_key_update();
        tx.seal_data(b"after", &mut out).expect("seal");
        feed(&mut rx, &out);
        assert_eq!(
            rx.read().expect("key update"),
            Read::KeyUpdate { requested: false }
        );
        assert_eq!(rx.read().expect("data"), Read::Data);
        assert_eq!(rx.plaintext(), b"after");
        assert_eq!(tx.seq(), 1, "the data went out with the new key, at 0");
    }

    /// Seals a record with `tx` and opens it with `reader`.
    fn through(
        tx: &mut Direction,
        reader: &mut RecordReader,
        t: u8,
        content: &[u8],
    ) -> Result<Opened, TlsError> {
        let mut out = Vec::new();
        tx.seal(t, content, &mut out).expect("seal");
        reader.open(&mut out)
    }

    #[test]
    fn a_client_skips_session_tickets_however_they_are_split_and_a_server_refuses_them() {
        let mut tx = Direction::new(Suite::Aes128Gcm, &secret(9), 0).expect("suite");
        let rx = Direction::new(Suite::Aes128Gcm, &secret(9), 0).expect("suite");
        let mut client = RecordReader::for_client(rx);
        // Two tickets of 300 bytes in one record, then a third split over
        // three records (header cut in two), then data.
        let ticket = |n: u8| {
            let mut m = vec![HANDSHAKE_NEW_SESSION_TICKET, 0, 1, 44];
            m.extend(std::iter::repeat_n(n, 300));
            m
        };
        let mut two = ticket(1);
        two.extend(ticket(2));
        let third = ticket(3);
        assert_eq!(
            through(&mut tx, &mut client, CONTENT_HANDSHAKE, &two),
            Ok(Opened::Nothing)
        );
        for part in [&third[..2], &third[2..100], &third[100..]] {
            assert_eq!(
                through(&mut tx, &mut client, CONTENT_HANDSHAKE, part),
                Ok(Opened::Nothing)
            );
        }
        let mut out = Vec::new();
        tx.seal(CONTENT_APPLICATION_DATA, b"data", &mut out)
            .expect("seal");
        let Ok(Opened::Data(r)) = client.open(&mut out) else {
            panic!("data after the tickets");
        };
        assert_eq!(&out[r], b"data");
        // Data in the middle of a ticket is refused.
        assert_eq!(
            through(&mut tx, &mut client, CONTENT_HANDSHAKE, &third[..50]),
            Ok(Opened::Nothing)
        );
        let e =
            through(&mut tx, &mut client, CONTENT_APPLICATION_DATA, b"x").expect_err("interleaved");
        assert_eq!(e.alert, Some(ALERT_UNEXPECTED_MESSAGE));
        // A server is never sent a ticket.
        let mut tx = Direction::new(Suite::Aes128Gcm, &secret(9), 0).expect("suite");
        let rx = Direction::new(Suite::Aes128Gcm, &secret(9), 0).expect("suite");
        let mut server = RecordReader::new(rx);
        let e = through(&mut tx, &mut server, CONTENT_HANDSHAKE, &ticket(1)).expect_err("refused");
        assert_eq!(e.alert, Some(ALERT_UNEXPECTED_MESSAGE));
    }

    #[test]
    fn the_send_side_updates_its_keys_before_the_limit() {
        let tx = Direction::new(Suite::Chacha20Poly1305, &secret(7), 0).expect("suite");
        let rx = Direction::new(Suite::Chacha20Poly1305, &secret(7), 0).expect("suite");
        let (mut tx, mut rx) = (Outbound::new(tx, 3), Inbound::new(rx));
        let mut out = Vec::new();
        for i in 0..5u8 {
            tx.seal_data(&[i], &mut out).expect("seal");
        }
        feed(&mut rx, &out);
        let mut got = Vec::new();
        let mut updates = 0;
        loop {
            match rx.read().expect("read") {
                Read::Data => {
                    got.extend_from_slice(rx.plaintext());
                    let n = rx.plaintext().len();
                    rx.consume(n);
                }
                Read::KeyUpdate { requested } => {
                    assert!(requested, "the sender asks the peer to update too");
                    updates += 1;
                }
                Read::More => break,
                Read::Closed => unreachable!(),
            }
        }
        assert_eq!(got, [0, 1, 2, 3, 4]);
        assert_eq!(updates, 2, "records 0, 1 then an update at 2, twice");
    }

    #[test]
    fn a_resumed_direction_finds_its_generation_at_its_first_key_update_or_fails() {
        let suite = Suite::Aes256Gcm;
        let gen0 = Secret::new(&[3; 48]).expect("length");
        let mut d = Direction::new(suite, &gen0, 0).expect("suite");
        let keys_at = |d: &Direction| {
            let (k, iv) = traffic_keys(suite, d.secret());
            rustls::ConnectionTrafficSecrets::Aes256Gcm {
                key: rustls::crypto::cipher::AeadKey::from(k),
                iv: rustls::crypto::cipher::Iv::from(iv),
            }
        };
        for _ in 0..5 {
            d.next_generation()
                .expect("a direction made from its secret");
        }
        let mut resumed = Direction::resume(suite, &gen0, 9, &keys_at(&d)).expect("generation 5");
        assert_eq!(resumed.seq(), 9);
        // The keys handed over are used as they are and kept across sleeps,
        // so resuming and waking derive nothing; the generation is found
        // at the first key update, which derives the next keys.
        let handed_over = traffic_keys(suite, d.secret());
        resumed.awake();
        resumed.sleep();
        assert_eq!(resumed.keys, Some(handed_over), "kept across a sleep");
        assert_eq!(resumed.secret(), gen0.as_bytes(), "nothing derived yet");
        resumed.next_generation().expect("generation 5 found");
        d.next_generation().expect("generation 6");
        assert_eq!(resumed.secret(), d.secret(), "generation 6");
        assert_eq!(resumed.keys, None, "the old keys dropped at a key update");
        resumed.awake();
        assert_eq!(resumed.keys, Some(traffic_keys(suite, resumed.secret())));
        resumed.next_generation().expect("then as any direction");
        // A secret that is not this connection's, or too many updates
        // before hibernating: the keys in use still work, and the first
        // key update fails the connection.
        let other = Secret::new(&[4; 48]).expect("length");
        let mut misfiled = Direction::resume(suite, &other, 0, &keys_at(&d)).expect("resumed");
        let mut out = Vec::new();
        misfiled
            .seal(CONTENT_APPLICATION_DATA, b"x", &mut out)
            .expect("sealed with the keys handed over");
        let mut with_them = Direction::resume(suite, &gen0, 0, &keys_at(&d)).expect("resumed");
        assert_eq!(
            with_them.open(&mut out).expect("opened").0,
            CONTENT_APPLICATION_DATA
        );
        let e = misfiled.next_generation().expect_err("not its secret");
        assert_eq!(e.alert, Some(ALERT_INTERNAL_ERROR));
        // Sending, the failure comes before the KeyUpdate is sealed.
        let misfiled = Direction::resume(suite, &other, 0, &keys_at(&d)).expect("resumed");
        let mut tx = Outbound::new(misfiled, 2);
        let mut sent = Vec::new();
        tx.seal_data(b"one", &mut sent).expect("the first record");
        let before = sent.len();
        let e = tx
            .seal_data(b"two", &mut sent)
            .expect_err("its key update fails");
        assert_eq!(e.alert, Some(ALERT_INTERNAL_ERROR));
        assert_eq!(sent.len(), before, "no KeyUpdate sealed");
        for _ in 0..MAX_GENERATIONS {
            d.next_generation()
                .expect("a direction made from its secret");
        }
        let mut far = Direction::resume(suite, &gen0, 0, &keys_at(&d)).expect("resumed");
        assert!(far.next_generation().is_err(), "too far");
        assert!(
            Direction::resume(Suite::Aes128Gcm, &gen0, 0, &keys_at(&d)).is_none(),
            "another suite"
        );
    }

    #[test]
    fn record_headers_are_checked_before_any_decryption() {
        let alert = |b: &[u8]| record_len(b).expect_err("refused").alert;
        assert_eq!(record_len(&[23, 3, 3]).expect("short"), None);
        assert_eq!(record_len(&[23, 3, 3, 0, 17]).expect("header"), None);
        assert_eq!(alert(&[22, 3, 3, 0, 17]), Some(ALERT_UNEXPECTED_MESSAGE));
        assert_eq!(alert(&[20, 3, 3, 0, 1]), Some(ALERT_UNEXPECTED_MESSAGE));
        assert_eq!(alert(&[23, 4, 3, 0, 17]), Some(ALERT_DECODE_ERROR));
        assert_eq!(alert(&[23, 3, 3, 0, 15]), Some(ALERT_BAD_RECORD_MAC));
        assert_eq!(alert(&[23, 3, 3, 0x41, 0x01]), Some(ALERT_RECORD_OVERFLOW));
        assert!(record_len(&[23, 3, 3, 0x41, 0x00]).is_ok());
    }

    #[test]
    fn keys_derive_as_rfc_8448_says() {
        // RFC 8448 section 3, {server} application traffic secret and its
        // write key and IV (TLS_AES_128_GCM_SHA256).
        let secret = hex("a11af9f05531f856ad47116b45a950328204b4f44bfb6b3a4b4f1f3fcb631643");
        let (key, iv) = traffic_keys(Suite::Aes128Gcm, &secret);
        assert_eq!(key[..16], hex("9f02283b6c9c07efc26bb9f2ac92e356")[..]);
        assert_eq!(iv[..], hex("cf782b88dd83549aadf1e984")[..]);
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }
}
