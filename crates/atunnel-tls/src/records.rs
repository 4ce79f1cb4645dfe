//! The TLS 1.3 record layer (RFC 8446 section 5) for a connection whose
//! handshake rustls finished: what a hibernated connection keeps instead of
//! a whole rustls session is one traffic key, IV and sequence number per
//! direction, about a hundred bytes.
//!
//! Written by hand because no crate resumes a TLS session from its traffic
//! secrets in user space: rustls hands them out (`dangerous_extract_secrets`,
//! meant for kernel TLS) but cannot take them back, and kernel TLS is not on
//! every worker (this one's kernel offers no `tls` ULP). This is the part
//! kernel TLS does, framing and the per-record nonce; the AEAD is ring's, the
//! code rustls itself runs. Post-handshake messages are not followed: a key
//! update from the peer ends the connection (rustls would need the traffic
//! secret, which it does not hand out), and so does reaching the cipher
//! suite's confidentiality limit, which rustls would have answered with a
//! key update of its own.

use std::io;
use std::ops::Range;

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use rustls::ConnectionTrafficSecrets;

pub const HEADER_LEN: usize = 5;
/// Most plaintext one record carries (2^14).
pub const MAX_PLAINTEXT: usize = 16 * 1024;
/// Largest record a peer may send: the plaintext, its content type, padding
/// and tag may add up to 256 bytes (RFC 8446 section 5.2).
pub const MAX_RECORD: usize = HEADER_LEN + MAX_PLAINTEXT + 256;
const TAG_LEN: usize = 16;
const NONCE_LEN: usize = 12;

pub const CONTENT_ALERT: u8 = 21;
pub const CONTENT_HANDSHAKE: u8 = 22;
pub const CONTENT_APPLICATION_DATA: u8 = 23;
/// The outer type of every protected TLS 1.3 record, and the legacy version.
const OUTER_TYPE: u8 = CONTENT_APPLICATION_DATA;
const LEGACY_VERSION: [u8; 2] = [3, 3];

/// The alert that ends a direction cleanly: level warning, close_notify.
pub const CLOSE_NOTIFY: [u8; 2] = [1, 0];
const ALERT_CLOSE_NOTIFY: u8 = 0;
const ALERT_USER_CANCELED: u8 = 90;
const HANDSHAKE_KEY_UPDATE: u8 = 24;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Algorithm {
    Aes128Gcm,
    Aes256Gcm,
    Chacha20Poly1305,
}

impl Algorithm {
    fn ring(self) -> &'static aead::Algorithm {
        match self {
            Self::Aes128Gcm => &aead::AES_128_GCM,
            Self::Aes256Gcm => &aead::AES_256_GCM,
            Self::Chacha20Poly1305 => &aead::CHACHA20_POLY1305,
        }
    }
}

/// One direction of a connection: its traffic key and IV as rustls derived
/// them, the next record's sequence number, and ring's expanded key while
/// the connection is awake (dropped by [`Direction::sleep`]; half a kilobyte
/// that is cheap to expand again).
pub struct Direction {
    algorithm: Algorithm,
    key: [u8; 32],
    iv: [u8; NONCE_LEN],
    seq: u64,
    /// Records this key may protect before it must be replaced.
    limit: u64,
    expanded: Option<Box<LessSafeKey>>,
}

/// What an opened record carried.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// Application data, at this range of the buffer the record was in.
    Data(Range<usize>),
    /// The peer's close_notify: no more data will come in this direction.
    CloseNotify,
}

fn invalid(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

impl Direction {
    /// Takes one direction of rustls's extracted secrets; `limit` is the
    /// cipher suite's confidentiality limit.
    pub fn new(seq: u64, secrets: ConnectionTrafficSecrets, limit: u64) -> io::Result<Self> {
        let (algorithm, key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (Algorithm::Aes128Gcm, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (Algorithm::Aes256Gcm, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (Algorithm::Chacha20Poly1305, key, iv)
            }
            // Non-exhaustive; `record_limit` refuses other suites before
            // secrets are extracted.
            _ => return Err(io::Error::other("unsupported TLS cipher suite")),
        };
        let mut k = [0u8; 32];
        k[..key.as_ref().len()].copy_from_slice(key.as_ref());
        let mut v = [0u8; NONCE_LEN];
        v.copy_from_slice(iv.as_ref());
        Ok(Self {
            algorithm,
            key: k,
            iv: v,
            seq,
            limit,
            expanded: None,
        })
    }

    /// Drops ring's expanded key; the next record expands it again.
    pub fn sleep(&mut self) {
        self.expanded = None;
    }

    fn key(&mut self) -> &LessSafeKey {
        let (algorithm, key) = (self.algorithm, &self.key);
        self.expanded.get_or_insert_with(|| {
            let len = algorithm.ring().key_len();
            let unbound =
                UnboundKey::new(algorithm.ring(), &key[..len]).expect("key length is the suite's");
            Box::new(LessSafeKey::new(unbound))
        })
    }

    /// The per-record nonce: the IV XORed with the sequence number, left
    /// padded (RFC 8446 section 5.3). Each sequence number is used once.
    fn next_nonce(&mut self) -> io::Result<Nonce> {
        if self.seq >= self.limit {
            return Err(io::Error::other(
                "TLS record limit of this key reached; the connection must be reopened",
            ));
        }
        let mut nonce = self.iv;
        for (n, s) in nonce[NONCE_LEN - 8..]
            .iter_mut()
            .zip(self.seq.to_be_bytes())
        {
            *n ^= s;
        }
        self.seq += 1;
        Ok(Nonce::assume_unique_for_key(nonce))
    }

    /// Appends one protected record carrying `plaintext` (at most
    /// [`MAX_PLAINTEXT`] bytes) of `content_type` to `out`.
    pub fn seal(
        &mut self,
        content_type: u8,
        plaintext: &[u8],
        out: &mut Vec<u8>,
    ) -> io::Result<()> {
        assert!(plaintext.len() <= MAX_PLAINTEXT, "caller splits records");
        let nonce = self.next_nonce()?;
        let body_len = plaintext.len() + 1 + TAG_LEN;
        let header = [
            OUTER_TYPE,
            LEGACY_VERSION[0],
            LEGACY_VERSION[1],
            (body_len >> 8) as u8,
            body_len as u8,
        ];
        let start = out.len();
        out.reserve(HEADER_LEN + body_len);
        out.extend_from_slice(&header);
        out.extend_from_slice(plaintext);
        out.push(content_type);
        let tag = self
            .key()
            .seal_in_place_separate_tag(nonce, Aad::from(header), &mut out[start + HEADER_LEN..])
            .map_err(|_| io::Error::other("TLS record encryption failed"))?;
        out.extend_from_slice(tag.as_ref());
        Ok(())
    }

    /// Opens, in place, the whole record at the start of `record` (as
    /// measured by [`record_len`]). Data ranges are relative to `record`.
    pub fn open(&mut self, record: &mut [u8]) -> io::Result<Opened> {
        let nonce = self.next_nonce()?;
        let (header, body) = record.split_at_mut(HEADER_LEN);
        let aad = Aad::from(<[u8; HEADER_LEN]>::try_from(&*header).expect("header length"));
        let inner = self
            .key()
            .open_in_place(nonce, aad, body)
            .map_err(|_| invalid("TLS record failed to decrypt (bad_record_mac)"))?;
        // The inner plaintext is content, content type, then zero padding.
        let Some(type_at) = inner.iter().rposition(|b| *b != 0) else {
            return Err(invalid("TLS record without a content type"));
        };
        let content_type = inner[type_at];
        if type_at > MAX_PLAINTEXT {
            return Err(invalid(
                "TLS record plaintext over 2^14 bytes (record_overflow)",
            ));
        }
        let content = HEADER_LEN..HEADER_LEN + type_at;
        match content_type {
            CONTENT_APPLICATION_DATA => Ok(Opened::Data(content)),
            CONTENT_ALERT => match &record[content] {
                [_, ALERT_CLOSE_NOTIFY] => Ok(Opened::CloseNotify),
                // A warning that precedes a close_notify; nothing to do.
                [_, ALERT_USER_CANCELED] => Ok(Opened::Data(0..0)),
                [_, description] => Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    format!("peer sent TLS alert {description}"),
                )),
                _ => Err(invalid("malformed TLS alert")),
            },
            CONTENT_HANDSHAKE if record.get(HEADER_LEN) == Some(&HANDSHAKE_KEY_UPDATE) => {
                Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "peer asked for a TLS key update, which a connection resumed from \
                     hibernation cannot follow",
                ))
            }
            CONTENT_HANDSHAKE => Err(invalid(
                "unexpected TLS handshake message after hibernation",
            )),
            other => Err(invalid(format!("unexpected TLS content type {other}"))),
        }
    }
}

/// Length of the whole record (header included) at the start of `buf` once
/// all of it is there; `None` while more bytes are needed.
pub fn record_len(buf: &[u8]) -> io::Result<Option<usize>> {
    let Some(header) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    if header[0] != OUTER_TYPE {
        return Err(invalid(format!(
            "unexpected TLS record type {} after the handshake",
            header[0]
        )));
    }
    let len = HEADER_LEN + usize::from(u16::from_be_bytes([header[3], header[4]]));
    if len > MAX_RECORD {
        return Err(invalid("TLS record over the size limit (record_overflow)"));
    }
    if len < HEADER_LEN + 1 + TAG_LEN {
        return Err(invalid("TLS record too short to be protected"));
    }
    Ok((buf.len() >= len).then_some(len))
}

/// How many records one key may protect under `suite` (its confidentiality
/// limit), when this module can carry it: TLS 1.3 only (TLS 1.2 records
/// differ and stay with rustls).
pub fn record_limit(suite: rustls::SupportedCipherSuite) -> Option<u64> {
    match suite {
        rustls::SupportedCipherSuite::Tls13(s) => {
            use rustls::CipherSuite::*;
            matches!(
                s.common.suite,
                TLS13_AES_128_GCM_SHA256
                    | TLS13_AES_256_GCM_SHA384
                    | TLS13_CHACHA20_POLY1305_SHA256
            )
            .then_some(s.common.confidentiality_limit)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn direction(seq: u64, limit: u64) -> Direction {
        let secrets = ConnectionTrafficSecrets::Chacha20Poly1305 {
            key: rustls::crypto::cipher::AeadKey::from([7u8; 32]),
            iv: rustls::crypto::cipher::Iv::from([9u8; NONCE_LEN]),
        };
        Direction::new(seq, secrets, limit).expect("suite")
    }

    #[test]
    fn records_open_only_with_the_same_key_and_sequence_number() {
        let mut out = Vec::new();
        direction(5, u64::MAX)
            .seal(CONTENT_APPLICATION_DATA, b"hello", &mut out)
            .expect("seal");
        assert_eq!(record_len(&out).expect("header"), Some(out.len()));
        let mut same = out.clone();
        let opened = direction(5, u64::MAX).open(&mut same).expect("open");
        assert_eq!(opened, Opened::Data(HEADER_LEN..HEADER_LEN + 5));
        assert_eq!(&same[HEADER_LEN..HEADER_LEN + 5], b"hello");
        // Another sequence number is another nonce.
        let err = direction(6, u64::MAX)
            .open(&mut out)
            .expect_err("wrong nonce");
        assert!(err.to_string().contains("bad_record_mac"), "{err}");
    }

    #[test]
    fn close_notify_is_an_end_and_other_alerts_are_errors() {
        let mut tx = direction(0, u64::MAX);
        let mut rx = direction(0, u64::MAX);
        let mut out = Vec::new();
        tx.seal(CONTENT_ALERT, &CLOSE_NOTIFY, &mut out)
            .expect("seal");
        tx.seal(CONTENT_ALERT, &[2, 40], &mut out).expect("seal");
        let first = record_len(&out).expect("header").expect("whole");
        assert_eq!(
            rx.open(&mut out[..first]).expect("open"),
            Opened::CloseNotify
        );
        let err = rx.open(&mut out[first..]).expect_err("handshake_failure");
        assert_eq!(err.kind(), io::ErrorKind::ConnectionAborted);
    }

    #[test]
    fn a_key_stops_at_its_limit() {
        let mut tx = direction(0, 2);
        let mut out = Vec::new();
        tx.seal(CONTENT_APPLICATION_DATA, b"a", &mut out)
            .expect("first");
        tx.seal(CONTENT_APPLICATION_DATA, b"b", &mut out)
            .expect("second");
        assert!(tx.seal(CONTENT_APPLICATION_DATA, b"c", &mut out).is_err());
    }

    #[test]
    fn record_headers_are_checked_before_any_decryption() {
        assert_eq!(record_len(&[23, 3, 3]).expect("short"), None);
        assert_eq!(record_len(&[23, 3, 3, 0, 17]).expect("header"), None);
        assert!(record_len(&[22, 3, 3, 0, 17]).is_err(), "handshake type");
        assert!(
            record_len(&[23, 3, 3, 0, 16]).is_err(),
            "shorter than a tag"
        );
        assert!(
            record_len(&[23, 3, 3, 0x41, 0x01]).is_err(),
            "over 2^14 + 256"
        );
        assert!(record_len(&[23, 3, 3, 0x41, 0x00]).is_ok());
    }
}
