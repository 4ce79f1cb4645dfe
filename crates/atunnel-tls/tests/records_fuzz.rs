//! Fuzzes the record layer a hibernated connection reads with
//! (`records::Inbound`): streams of records sealed with the real keys (so
//! that inputs get past the AEAD) of every content type, length, padding,
//! alert and key update, mixed with altered records, bare headers and
//! garbage, cut short anywhere and fed in chunks split anywhere. For every
//! input: no panic, no hang (room to read is always offered until the
//! connection ends), at most one record's worth buffered and allocated,
//! errors that are final and name the alert owed, and, as far as a model
//! of RFC 8446 sections 5 and 6 can tell, exactly the plaintext and the end
//! it must produce.
//!
//! This binary installs a counting allocator; its one test holds the heap
//! to itself.

use atunnel_core::alloc::{CountingAlloc, CountingWith, live_bytes};
use atunnel_tls::records::{self, Direction, Inbound, MAX_RECORD, Read, Suite, TlsError};
use atunnel_tls::secrets::Secret;
use proptest::collection::vec;
use proptest::prelude::*;

#[global_allocator]
static ALLOC: CountingAlloc = CountingWith(std::alloc::System);

/// Heap the reader may hold on top of its buffer: the expanded key (a few
/// hundred bytes) and an error's message.
const SLACK: usize = 4096;

#[derive(Debug, Clone)]
enum Piece {
    /// Application data with padding.
    Data(Vec<u8>, usize),
    /// A record of any inner content type.
    Inner(u8, Vec<u8>, usize),
    /// A whole KeyUpdate with this request byte.
    KeyUpdate(u8),
    Alert(u8, u8),
    /// A data record with one bit flipped.
    Altered(Vec<u8>, usize),
    /// A bare record header: what follows becomes its body.
    Header(u8, u16),
    Garbage(Vec<u8>),
}

fn piece() -> impl Strategy<Value = Piece> {
    prop_oneof![
        5 => (vec(any::<u8>(), 0..200), 0..40usize).prop_map(|(c, p)| Piece::Data(c, p)),
        1 => (vec(any::<u8>(), 16_370..16_390), 0..4usize).prop_map(|(c, p)| Piece::Data(c, p)),
        1 => (0..300usize).prop_map(|p| Piece::Data(Vec::new(), p)),
        2 => (any::<u8>(), vec(any::<u8>(), 0..12), 0..20usize)
            .prop_map(|(t, c, p)| Piece::Inner(t, c, p)),
        2 => prop_oneof![Just(0u8), Just(1u8), any::<u8>()].prop_map(Piece::KeyUpdate),
        2 => (
            prop_oneof![Just(1u8), Just(2u8), any::<u8>()],
            prop_oneof![Just(0u8), Just(90u8), any::<u8>()]
        )
            .prop_map(|(l, d)| Piece::Alert(l, d)),
        1 => (vec(any::<u8>(), 0..60), any::<usize>()).prop_map(|(c, at)| Piece::Altered(c, at)),
        1 => (prop_oneof![Just(23u8), any::<u8>()], any::<u16>())
            .prop_map(|(t, l)| Piece::Header(t, l)),
        1 => vec(any::<u8>(), 0..64).prop_map(Piece::Garbage),
    ]
}

/// What RFC 8446 says one piece must do to a reader that is still open.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Data(Vec<u8>),
    Nothing,
    Closed,
    /// The connection ends; the alert owed (`None`: the peer's own alert).
    Error(Option<u8>),
    /// Beyond this model (fragments, garbage, headers whose body is what
    /// follows): only the invariants are checked from here on.
    Unknown,
}

/// The model's counters, as the RFC and rustls bound them.
#[derive(Default)]
struct Model {
    empty_in_row: u32,
    key_updates: u32,
    warnings: u32,
}

impl Model {
    fn data(&mut self, content: &[u8], padding: usize) -> Outcome {
        if content.len() + 1 + padding > records::MAX_PLAINTEXT + 1 {
            return Outcome::Error(Some(records::ALERT_RECORD_OVERFLOW));
        }
        if content.is_empty() {
            self.empty_in_row += 1;
            if self.empty_in_row > 32 {
                return Outcome::Error(Some(records::ALERT_UNEXPECTED_MESSAGE));
            }
            return Outcome::Nothing;
        }
        self.empty_in_row = 0;
        self.key_updates = 0;
        Outcome::Data(content.to_vec())
    }

    fn alert(&mut self, content: &[u8]) -> Outcome {
        self.empty_in_row = 0;
        match content {
            [] => Outcome::Error(Some(records::ALERT_UNEXPECTED_MESSAGE)),
            &[level, description] => match (level, description) {
                (l, _) if l != 1 && l != 2 => {
                    Outcome::Error(Some(records::ALERT_ILLEGAL_PARAMETER))
                }
                (_, 0) => Outcome::Closed,
                (1, 90) => {
                    self.warnings += 1;
                    if self.warnings > 4 {
                        Outcome::Error(Some(records::ALERT_UNEXPECTED_MESSAGE))
                    } else {
                        Outcome::Nothing
                    }
                }
                _ => Outcome::Error(None),
            },
            _ => Outcome::Error(Some(records::ALERT_DECODE_ERROR)),
        }
    }
}

fn secret() -> Secret {
    Secret::new(&[5u8; 32]).expect("length")
}

/// Seals `pieces` (the sender following its own key updates) into one
/// stream, with each piece's end offset and outcome.
fn encode(pieces: &[Piece]) -> (Vec<u8>, Vec<(usize, Outcome)>) {
    let mut tx = Direction::new(Suite::Aes128Gcm, &secret(), 3).expect("suite");
    let mut model = Model::default();
    let mut bytes = Vec::new();
    let mut outcomes = Vec::new();
    for p in pieces {
        let outcome = match p {
            Piece::Data(c, pad) => {
                tx.seal_padded(records::CONTENT_APPLICATION_DATA, c, *pad, &mut bytes)
                    .expect("seal");
                model.data(c, *pad)
            }
            Piece::Inner(t, c, pad) => {
                tx.seal_padded(*t, c, *pad, &mut bytes).expect("seal");
                match *t {
                    records::CONTENT_APPLICATION_DATA => model.data(c, *pad),
                    records::CONTENT_ALERT => model.alert(c),
                    0 => Outcome::Unknown,
                    records::CONTENT_HANDSHAKE if !c.is_empty() => Outcome::Unknown,
                    _ => Outcome::Error(Some(records::ALERT_UNEXPECTED_MESSAGE)),
                }
            }
            Piece::KeyUpdate(request) => {
                tx.seal(
                    records::CONTENT_HANDSHAKE,
                    &[24, 0, 0, 1, *request],
                    &mut bytes,
                )
                .expect("seal");
                model.empty_in_row = 0;
                if *request > 1 {
                    Outcome::Error(Some(records::ALERT_ILLEGAL_PARAMETER))
                } else {
                    model.key_updates += 1;
                    tx.next_generation()
                        .expect("a direction made from its secret");
                    if model.key_updates > 32 {
                        Outcome::Error(Some(records::ALERT_UNEXPECTED_MESSAGE))
                    } else {
                        Outcome::Nothing
                    }
                }
            }
            Piece::Alert(level, description) => {
                tx.seal(records::CONTENT_ALERT, &[*level, *description], &mut bytes)
                    .expect("seal");
                model.alert(&[*level, *description])
            }
            Piece::Altered(c, at) => {
                let start = bytes.len();
                tx.seal(records::CONTENT_APPLICATION_DATA, c, &mut bytes)
                    .expect("seal");
                let body = bytes.len() - start - records::HEADER_LEN;
                bytes[start + records::HEADER_LEN + at % body] ^= 1 << (at % 8);
                Outcome::Error(Some(records::ALERT_BAD_RECORD_MAC))
            }
            Piece::Header(t, len) => {
                bytes.extend_from_slice(&[*t, 3, 3]);
                bytes.extend_from_slice(&len.to_be_bytes());
                let total = records::HEADER_LEN + usize::from(*len);
                if *t != records::CONTENT_APPLICATION_DATA {
                    Outcome::Error(Some(records::ALERT_UNEXPECTED_MESSAGE))
                } else if total > MAX_RECORD {
                    Outcome::Error(Some(records::ALERT_RECORD_OVERFLOW))
                } else if *len < 16 {
                    Outcome::Error(Some(records::ALERT_BAD_RECORD_MAC))
                } else {
                    Outcome::Unknown
                }
            }
            Piece::Garbage(g) => {
                bytes.extend_from_slice(g);
                if g.is_empty() {
                    Outcome::Nothing
                } else {
                    Outcome::Unknown
                }
            }
        };
        outcomes.push((bytes.len(), outcome));
    }
    (bytes, outcomes)
}

/// How a run of the reader ended.
#[derive(Debug)]
enum End {
    Open,
    Closed,
    Failed(TlsError),
}

fn check(pieces: &[Piece], chunks: &[usize], cut_permille: usize) -> Result<(), TestCaseError> {
    let (bytes, outcomes) = encode(pieces);
    let fed = bytes.len() * cut_permille / 1000;
    let mut got = Vec::with_capacity(bytes.len());
    let mut inbound = Inbound::new(Direction::new(Suite::Aes128Gcm, &secret(), 3).expect("suite"));
    let baseline = live_bytes();
    let mut at = 0;
    let mut end = End::Open;
    'feed: for chunk in chunks.iter().cycle() {
        if at >= fed {
            break;
        }
        let space = inbound.space();
        // No hang: an open reader always has room for more.
        prop_assert!(!space.is_empty(), "no room while open");
        let n = (*chunk).min(space.len()).min(fed - at);
        space[..n].copy_from_slice(&bytes[at..at + n]);
        inbound.filled(n);
        at += n;
        loop {
            prop_assert!(inbound.buffered() <= MAX_RECORD);
            prop_assert!(
                live_bytes() <= baseline + MAX_RECORD + SLACK,
                "heap grew past one record"
            );
            match inbound.read() {
                Ok(Read::Data) => {
                    let plain = inbound.plaintext();
                    prop_assert!(!plain.is_empty());
                    got.extend_from_slice(plain);
                    let n = plain.len();
                    inbound.consume(n);
                }
                Ok(Read::KeyUpdate { .. }) => {}
                Ok(Read::More) => break,
                Ok(Read::Closed) => {
                    end = End::Closed;
                    break 'feed;
                }
                Err(e) => {
                    prop_assert!(
                        e.alert.is_some() || e.kind == std::io::ErrorKind::ConnectionAborted,
                        "an error owes an alert unless the peer sent one: {e}"
                    );
                    end = End::Failed(e);
                    break 'feed;
                }
            }
        }
    }
    // Ends are final, and hold nothing.
    match &end {
        End::Closed => {
            prop_assert_eq!(inbound.read().expect("still closed"), Read::Closed);
            prop_assert!(
                !inbound.holds_buffer(),
                "data after close_notify is dropped"
            );
            prop_assert!(inbound.space().is_empty());
        }
        End::Failed(_) => {
            prop_assert!(inbound.read().is_err(), "errors are final");
            prop_assert!(!inbound.holds_buffer());
            prop_assert!(inbound.space().is_empty());
        }
        End::Open => {}
    }

    // What the model expects of the pieces fed whole.
    let mut expected = Vec::new();
    for (piece_end, outcome) in &outcomes {
        let whole = *piece_end <= fed;
        match outcome {
            Outcome::Data(d) if whole => expected.extend_from_slice(d),
            Outcome::Nothing | Outcome::Data(_) if whole => {}
            Outcome::Closed if whole => {
                prop_assert!(
                    matches!(end, End::Closed),
                    "expected close_notify, got {end:?}"
                );
                prop_assert_eq!(&got, &expected);
                return Ok(());
            }
            Outcome::Error(alert) if whole => {
                match &end {
                    End::Failed(e) => prop_assert_eq!(e.alert, *alert, "{}", e),
                    other => prop_assert!(false, "expected alert {alert:?}, got {other:?}"),
                }
                prop_assert_eq!(&got, &expected);
                return Ok(());
            }
            Outcome::Unknown if whole => {
                prop_assert!(got.starts_with(&expected), "data before the unknown piece");
                return Ok(());
            }
            // The piece that was cut short: it may have ended the reader
            // from its header already, or left it waiting.
            partial => {
                prop_assert_eq!(&got, &expected);
                match (&end, partial) {
                    (End::Open, _) => {}
                    (End::Failed(e), Outcome::Error(alert)) => prop_assert_eq!(e.alert, *alert),
                    (End::Failed(_), Outcome::Unknown) => {}
                    (other, _) => prop_assert!(false, "a cut piece ended the reader: {other:?}"),
                }
                return Ok(());
            }
        }
    }
    prop_assert!(matches!(end, End::Open), "nothing ended it, got {end:?}");
    prop_assert_eq!(got, expected);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    #[test]
    fn any_record_stream_is_read_as_the_rfc_says_within_one_record_of_memory(
        pieces in vec(piece(), 0..14),
        chunks in vec(prop_oneof![1..8usize, 1..20_000usize], 1..6),
        cut_permille in prop_oneof![Just(1000usize), 0..1000usize],
    ) {
        check(&pieces, &chunks, cut_permille)?;
    }
}
