//! The HTTP/2 client preface, read within a bound before an HTTP/2 server
//! (h2's or hyper's) takes the connection: neither bounds that wait.

use std::io;
use std::time::Duration;

use atunnel_tls::ActivityIo;
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::limits::MAX_FIRST_FRAME;

/// What an HTTP/2 client's connection preface begins with (RFC 9113, 3.4);
/// a SETTINGS frame follows.
const H2_MAGIC: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// A frame header: length (3 bytes), type, flags, stream id (4 bytes).
const H2_FRAME_HEADER: usize = 9;
const H2_SETTINGS: u8 = 0x4;

/// Reads an HTTP/2 client's preface (the magic, then its SETTINGS frame)
/// within `timeout`, and leaves it in `io` for the HTTP/2 server to read.
/// Neither h2 nor hyper bounds that wait, so a client that finished TLS
/// and said nothing held its connection for ever. Later waits, for a first
/// request or between requests, stay unbounded: an idle connection is kept
/// (and hibernates).
pub async fn read_h2_preface(io: &mut ActivityIo, timeout: Duration) -> io::Result<()> {
    let preface = tokio::time::timeout(timeout, read_preface(io))
        .await
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no HTTP/2 preface within {timeout:?}"),
            )
        })??;
    io.set_replay(Bytes::from(preface));
    Ok(())
}

/// The magic and the whole first frame, which must be SETTINGS. The frame's
/// claimed length is checked against [`MAX_FIRST_FRAME`] before anything is
/// sized by it, so a peer cannot make us hold more than that.
pub(crate) async fn read_preface<R: AsyncRead + Unpin>(io: &mut R) -> io::Result<Vec<u8>> {
    let mut preface = vec![0u8; H2_MAGIC.len() + H2_FRAME_HEADER];
    io.read_exact(&mut preface).await?;
    let header = &preface[H2_MAGIC.len()..];
    let length =
        usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
    if !preface.starts_with(H2_MAGIC) || header[3] != H2_SETTINGS || length > MAX_FIRST_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not an HTTP/2 client preface",
        ));
    }
    let start = preface.len();
    preface.resize(start + length, 0);
    io.read_exact(&mut preface[start..]).await?;
    Ok(preface)
}

#[cfg(test)]
mod fuzz {
    //! The preface reader against arbitrary and near-valid prefaces, in
    //! arbitrary chunks.

    use proptest::prelude::*;

    use super::*;

    use atunnel_core::test_util::{Chunked, run_bounded};

    const GUARD: Duration = Duration::from_secs(10);
    const PREFIX: usize = H2_MAGIC.len() + H2_FRAME_HEADER;

    /// What `read_preface` must return for `input` then end of file: the
    /// preface's length, or `Err(kind)`. Written from RFC 9113 3.4 and
    /// 4.1, independently of the reader.
    fn expected(input: &[u8]) -> Result<usize, io::ErrorKind> {
        if input.len() < PREFIX {
            return Err(io::ErrorKind::UnexpectedEof);
        }
        let header = &input[H2_MAGIC.len()..PREFIX];
        let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        if &input[..H2_MAGIC.len()] != H2_MAGIC || header[3] != 4 || length > 16 * 1024 {
            return Err(io::ErrorKind::InvalidData);
        }
        if input.len() < PREFIX + length {
            return Err(io::ErrorKind::UnexpectedEof);
        }
        Ok(PREFIX + length)
    }

    fn check(input: Vec<u8>, sizes: Vec<usize>) -> Result<(), TestCaseError> {
        let mut peer = Chunked::new(input.clone(), sizes);
        let got = run_bounded(GUARD, read_preface(&mut peer));
        match expected(&input) {
            Ok(len) => {
                let preface = got.map_err(|e| TestCaseError::fail(format!("refused: {e}")))?;
                prop_assert_eq!(&preface[..], &input[..len]);
                // What follows is the HTTP/2 server's to read.
                prop_assert_eq!(peer.consumed(), len);
            }
            Err(kind) => {
                let e = got.err().ok_or_else(|| TestCaseError::fail("accepted"))?;
                prop_assert_eq!(e.kind(), kind);
            }
        }
        // The claimed length never sizes a buffer past the limit.
        prop_assert!(peer.largest_offer() <= MAX_FIRST_FRAME.max(PREFIX));
        Ok(())
    }

    /// A client preface whose SETTINGS payload is `payload`, claiming
    /// `claimed` bytes (its real length unless set), then `tail`.
    fn preface(payload: &[u8], claimed: Option<usize>, kind: u8, tail: &[u8]) -> Vec<u8> {
        let len = claimed.unwrap_or(payload.len()) as u32;
        let mut out = H2_MAGIC.to_vec();
        out.extend_from_slice(&len.to_be_bytes()[1..]);
        out.extend_from_slice(&[kind, 0, 0, 0, 0, 0]);
        out.extend_from_slice(payload);
        out.extend_from_slice(tail);
        out
    }

    fn sizes() -> impl Strategy<Value = Vec<usize>> {
        prop::collection::vec(1usize..64, 0..8)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_bytes_are_refused_or_read_exactly(
            input in prop::collection::vec(any::<u8>(), 0..80),
            sizes in sizes(),
        ) {
            check(input, sizes)?;
        }

        #[test]
        fn a_valid_preface_is_read_the_same_in_any_chunks_and_nothing_after_it(
            payload in prop::collection::vec(any::<u8>(), 0..300),
            tail in prop::collection::vec(any::<u8>(), 0..40),
            sizes in sizes(),
        ) {
            let input = preface(&payload, None, 4, &tail);
            let whole = run_bounded(GUARD, read_preface(&mut &input[..])).expect("whole");
            prop_assert_eq!(&whole[..], &input[..PREFIX + payload.len()]);
            check(input, sizes)?;
        }

        #[test]
        fn a_mutated_preface_is_refused_unless_still_valid(
            payload in prop::collection::vec(any::<u8>(), 0..64),
            at in 0usize..PREFIX + 64,
            byte in any::<u8>(),
            cut in prop::option::of(0usize..PREFIX + 64),
            sizes in sizes(),
        ) {
            let mut input = preface(&payload, None, 4, b"after");
            let at = at % input.len();
            input[at] = byte;
            if let Some(cut) = cut {
                input.truncate(cut);
            }
            check(input, sizes)?;
        }

        #[test]
        fn a_claimed_length_past_the_limit_is_refused_before_anything_is_sized_by_it(
            claimed in (MAX_FIRST_FRAME + 1)..(1 << 24),
            kind in prop_oneof![Just(4u8), any::<u8>()],
            sizes in sizes(),
        ) {
            let input = preface(&[0; 32], Some(claimed), kind, b"");
            check(input, sizes)?;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

        #[test]
        fn a_preface_at_the_limit_is_read_and_one_byte_more_is_refused(
            extra in 0usize..2,
            claimed_delta in 0usize..2,
            sizes in prop::collection::vec(1usize..8192, 1..4),
        ) {
            let payload = vec![0u8; MAX_FIRST_FRAME - 1 + extra];
            let claimed = MAX_FIRST_FRAME - 1 + extra + claimed_delta;
            check(preface(&payload, Some(claimed), 4, &[0; 8]), sizes)?;
        }
    }
}
