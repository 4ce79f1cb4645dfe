//! Property tests ("fuzz targets" on stable) for the CONNECT heads and
//! destinations atunnel reads from untrusted peers: the router's and the
//! gateway's HTTP/1.1 heads (`read_head`, `parse_request`,
//! `parse_response`) and the tunnel destination (`parse_destination`).
//!
//! Each target feeds arbitrary bytes and mutations of valid input, and
//! checks against an independent statement of what the parser must do:
//! no panic, an error for bad input, never more than `MAX_HEAD` bytes read,
//! and the same answer whatever chunks the bytes arrive in.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use atunnel_connect::http1::{RequestHead, parse_request, parse_response, read_head};
use atunnel_connect::limits::{MAX_HEAD, MAX_HEADERS};
use atunnel_connect::parse_destination;
use atunnel_core::test_util::{Chunked, run_bounded};
use atunnel_fuzz::{Edit, Weights, apply, edits};
use proptest::prelude::*;

/// A hang becomes a failure after this; no case waits for it.
const GUARD: Duration = Duration::from_secs(10);

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

/// What `read_head` must do with `input` followed by end of file: the head
/// up to and including the first blank line if it fits in `MAX_HEAD`, or an
/// error once `MAX_HEAD` bytes came without one; never a byte more.
enum Expected {
    Head(usize),
    TooLong,
    Eof,
}

fn expected_head(input: &[u8]) -> Expected {
    match input.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(at) if at + 4 <= MAX_HEAD => Expected::Head(at + 4),
        _ if input.len() >= MAX_HEAD => Expected::TooLong,
        _ => Expected::Eof,
    }
}

fn check_read_head(input: Vec<u8>, sizes: Vec<usize>) -> Result<(), TestCaseError> {
    let mut peer = Chunked::new(input.clone(), sizes);
    let got = run_bounded(GUARD, read_head(&mut peer));
    match expected_head(&input) {
        Expected::Head(len) => {
            let head = got.map_err(|e| TestCaseError::fail(format!("want a head: {e}")))?;
            prop_assert_eq!(&head[..], &input[..len]);
            prop_assert_eq!(peer.consumed(), len, "read past the head");
        }
        Expected::TooLong => {
            let e = got
                .err()
                .ok_or_else(|| TestCaseError::fail("oversized head accepted"))?;
            prop_assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            prop_assert_eq!(peer.consumed(), MAX_HEAD, "read past MAX_HEAD");
        }
        Expected::Eof => {
            let e = got
                .err()
                .ok_or_else(|| TestCaseError::fail("truncated head accepted"))?;
            prop_assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
            prop_assert_eq!(peer.consumed(), input.len());
        }
    }
    prop_assert!(peer.consumed() <= MAX_HEAD);
    Ok(())
}

/// Bytes rich in CR and LF, so blank lines (and near misses) are common.
fn head_like_bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![
            4 => any::<u8>(),
            2 => Just(b'\r'),
            2 => Just(b'\n'),
            1 => Just(b':'),
        ],
        0..max,
    )
}

fn chunk_sizes() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..64, 0..8)
}

fn token() -> impl Strategy<Value = String> {
    "[A-Za-z0-9!#$%&'*+.^_`|~-]{1,12}"
}

fn header_value() -> impl Strategy<Value = String> {
    // Visible ASCII with inner spaces; no leading or trailing whitespace.
    "([!-~]([ !-~]{0,20}[!-~])?)?"
}

fn request_strategy(max_headers: usize) -> impl Strategy<Value = RequestHead> {
    (
        prop_oneof![Just("CONNECT".to_owned()), Just("GET".to_owned()), token()],
        "[!-~]{1,40}",
        prop::collection::vec((token(), header_value()), 0..max_headers),
    )
        .prop_map(|(method, target, headers)| RequestHead {
            method,
            target,
            headers,
        })
}

fn format_request(r: &RequestHead) -> Vec<u8> {
    let mut out = format!("{} {} HTTP/1.1\r\n", r.method, r.target);
    for (name, value) in &r.headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("\r\n");
    out.into_bytes()
}

fn mutations() -> impl Strategy<Value = Vec<Edit<u8>>> {
    edits(any::<u8>(), Weights::EVEN, 1..4)
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn read_head_takes_exactly_one_head_from_arbitrary_bytes(
        input in head_like_bytes(600),
        sizes in chunk_sizes(),
    ) {
        check_read_head(input, sizes)?;
    }

    #[test]
    fn read_head_of_a_valid_head_is_the_same_in_any_chunks_and_leaves_the_tunnel_bytes(
        request in request_strategy(8),
        tunnel in prop::collection::vec(any::<u8>(), 0..64),
        sizes in chunk_sizes(),
    ) {
        let head = format_request(&request);
        let mut input = head.clone();
        input.extend_from_slice(&tunnel);
        let whole = run_bounded(GUARD, read_head(&mut &input[..])).expect("whole head");
        let mut peer = Chunked::new(input, sizes);
        let split = run_bounded(GUARD, read_head(&mut peer)).expect("split head");
        prop_assert_eq!(&whole, &head);
        prop_assert_eq!(&split, &head);
        prop_assert_eq!(peer.consumed(), head.len());
    }

    #[test]
    fn a_mutated_request_head_is_parsed_or_refused_and_reads_back_the_same(
        request in request_strategy(8),
        edits in mutations(),
        sizes in chunk_sizes(),
    ) {
        let input = apply(format_request(&request), &edits);
        check_read_head(input.clone(), sizes)?;
        // Whatever parses must format back to a head that parses the same:
        // nothing the parser returns is a half-understood input.
        if let Ok(parsed) = parse_request(&input) {
            let again = parse_request(&format_request(&parsed))
                .map_err(|e| TestCaseError::fail(format!("reformatted head refused: {e}")))?;
            prop_assert_eq!(again, parsed);
        }
        let _ = parse_response(&input);
    }

    #[test]
    fn a_valid_request_head_round_trips_and_too_many_headers_are_refused(
        request in request_strategy(MAX_HEADERS + 8),
    ) {
        let got = parse_request(&format_request(&request));
        if request.headers.len() <= MAX_HEADERS {
            prop_assert_eq!(got.expect("valid head"), request);
        } else {
            let e = got.expect_err("more than MAX_HEADERS headers");
            prop_assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_head_parsers(input in head_like_bytes(300)) {
        let errors = [parse_request(&input).err(), parse_response(&input).err()];
        for e in errors.into_iter().flatten() {
            prop_assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            prop_assert!(!e.to_string().is_empty());
        }
    }

    #[test]
    fn a_response_head_gives_its_status_and_only_a_numeric_content_length(
        status in 100u16..1000,
        reason in "[A-Za-z ]{0,20}",
        length in prop_oneof![
            Just(None),
            any::<usize>().prop_map(|n| Some(n.to_string())),
            "[0-9]{0,30}".prop_map(Some),
            "[ \t]?[-+0-9a-fx ]{0,8}[ \t]?".prop_map(Some),
        ],
        name in prop_oneof![Just("Content-Length"), Just("content-length"), Just("CONTENT-LENGTH")],
        edits in prop::option::of(mutations()),
    ) {
        let mut head = format!("HTTP/1.1 {status} {reason}\r\nServer: gw\r\n");
        if let Some(length) = &length {
            head.push_str(&format!("{name}: {length}\r\n"));
        }
        head.push_str("\r\n");
        match edits {
            None => {
                let parsed = parse_response(head.as_bytes()).expect("valid response head");
                prop_assert_eq!(parsed.status, status);
                // httparse trims the value; a number that does not fit is absent.
                let want = length.and_then(|l| l.trim().parse::<usize>().ok());
                prop_assert_eq!(parsed.content_length, want);
            }
            Some(edits) => {
                let input = apply(head.into_bytes(), &edits);
                if let Ok(parsed) = parse_response(&input) {
                    prop_assert!(parsed.status <= 999);
                }
            }
        }
    }

    #[test]
    fn parse_destination_accepts_exactly_ip_literals_with_a_port(
        input in prop_oneof![
            any::<SocketAddr>().prop_map(|a| a.to_string()),
            any::<std::net::IpAddr>().prop_map(|ip| SocketAddr::new(ip, 0).to_string()),
            (any::<SocketAddr>(), mutations()).prop_map(|(a, m)| {
                String::from_utf8_lossy(&apply(a.to_string().into_bytes(), &m)).into_owned()
            }),
            "[0-9a-fA-F:.\\[\\]%]{0,48}",
            ".{0,48}",
        ],
    ) {
        match parse_destination(&input) {
            Ok(addr) => {
                prop_assert_ne!(addr.port(), 0);
                // The authority sent on is what the caller gave, so it must
                // mean this address and nothing else.
                prop_assert_eq!(input.parse::<SocketAddr>().ok(), Some(addr));
                prop_assert_eq!(parse_destination(&addr.to_string()).ok(), Some(addr));
            }
            Err(e) => {
                let port = input.parse::<SocketAddr>().map(|a| a.port());
                prop_assert!(port.is_err() || port == Ok(0), "{:?} refused", input);
                let quoted = format!("{input:?}");
                prop_assert!(e.to_string().contains(&quoted));
            }
        }
    }
}

proptest! {
    #![proptest_config(config(24))]

    /// Around the limit: a head ending at `MAX_HEAD` is taken, one byte
    /// more is refused after reading exactly `MAX_HEAD` bytes.
    #[test]
    fn read_head_never_reads_past_max_head(
        padding in (MAX_HEAD - 64)..(MAX_HEAD + 64),
        sizes in prop::collection::vec(1usize..4096, 1..4),
    ) {
        let mut input = b"CONNECT 192.0.2.1:443 HTTP/1.1\r\nX-Pad: ".to_vec();
        input.resize(padding, b'a');
        input.extend_from_slice(b"\r\n\r\ntunnel");
        check_read_head(input, sizes)?;
    }
}
