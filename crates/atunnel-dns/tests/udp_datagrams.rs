//! DNS over UDP from an untrusted sandbox: arbitrary datagrams against the
//! relay on real loopback sockets, with an upstream that echoes each query
//! back as its answer. A datagram shorter than a DNS header or longer than
//! the relay takes is dropped and counted, never forwarded cut short; every
//! other one is answered with exactly what the upstream sent.

use std::collections::HashMap;
use std::time::Duration;

use atunnel_dns::{DnsRelay, RelayConfig};
use proptest::prelude::*;
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

/// Turns a hang into a failure; nothing waits for it.
const GUARD: Duration = Duration::from_secs(10);
/// The longest query the relay forwards (its `MAX_QUERY_LEN`).
const MAX_QUERY: usize = 4096;

fn echo(query: &[u8]) -> Vec<u8> {
    let mut answer = query.to_vec();
    answer[2] |= 0x80;
    answer
}

/// Sends `datagrams` (the first two bytes of each forwardable one replaced
/// by a unique ID) and a final valid one; returns the answers by ID and the
/// relay's dropped count once every forwardable one has been answered.
async fn exchange(datagrams: Vec<Vec<u8>>) -> (Vec<Vec<u8>>, HashMap<u16, Vec<u8>>, u64) {
    let upstream = UdpSocket::bind("127.0.0.1:0").await.expect("bind upstream");
    let upstream_addr = upstream.local_addr().expect("upstream address");
    let echoer = tokio::spawn(async move {
        let mut buf = vec![0u8; 65_535];
        loop {
            let Ok((n, from)) = upstream.recv_from(&mut buf).await else {
                return;
            };
            if n >= 3 {
                let _ = upstream.send_to(&echo(&buf[..n]), from).await;
            }
        }
    });
    let relay = DnsRelay::new(RelayConfig::new(vec![upstream_addr])).expect("relay");
    let socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind relay");
    let relay_addr = socket.local_addr().expect("relay address");
    let cancel = CancellationToken::new();
    let serve = tokio::spawn({
        let (relay, cancel) = (relay.clone(), cancel.clone());
        async move { relay.serve_udp(socket, cancel).await }
    });

    let client = UdpSocket::bind("127.0.0.1:0").await.expect("bind client");
    let mut sent = Vec::new();
    let mut datagrams = datagrams;
    datagrams.push(vec![0u8; 12]);
    for (id, mut datagram) in datagrams.into_iter().enumerate() {
        if (12..=MAX_QUERY).contains(&datagram.len()) {
            datagram[..2].copy_from_slice(&(id as u16).to_be_bytes());
            sent.push(datagram.clone());
        }
        client.send_to(&datagram, relay_addr).await.expect("send");
    }
    let mut answers = HashMap::new();
    let mut buf = vec![0u8; 65_535];
    while answers.len() < sent.len() {
        let (n, _) = tokio::time::timeout(GUARD, client.recv_from(&mut buf))
            .await
            .expect("every forwardable query is answered")
            .expect("recv");
        answers.insert(u16::from_be_bytes([buf[0], buf[1]]), buf[..n].to_vec());
    }
    // The relay reads datagrams in order and counts a drop before reading
    // the next, so once the last one is answered every drop is counted.
    let dropped = relay.stats().dropped;
    cancel.cancel();
    tokio::time::timeout(GUARD, serve)
        .await
        .expect("serve_udp returned")
        .expect("join");
    echoer.abort();
    (sent, answers, dropped)
}

fn datagram() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..12),
        prop::collection::vec(any::<u8>(), 12..600),
        (MAX_QUERY - 2..MAX_QUERY + 3).prop_map(|n| vec![0x11; n]),
        (MAX_QUERY + 1..9000).prop_map(|n| vec![0x22; n]),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn each_datagram_is_answered_whole_or_dropped_and_counted(
        datagrams in prop::collection::vec(datagram(), 0..6),
    ) {
        let unfit = datagrams
            .iter()
            .filter(|d| !(12..=MAX_QUERY).contains(&d.len()))
            .count() as u64;
        let (sent, answers, dropped) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(exchange(datagrams));
        for query in &sent {
            let id = u16::from_be_bytes([query[0], query[1]]);
            prop_assert_eq!(answers.get(&id), Some(&echo(query)));
        }
        prop_assert_eq!(answers.len(), sent.len());
        prop_assert_eq!(dropped, unfit);
    }
}

/// The minimal case the property found: a datagram one byte longer than
/// the relay reads used to be cut to 4096 bytes and forwarded.
#[test]
fn a_datagram_one_byte_over_the_limit_is_dropped_not_forwarded_cut_short() {
    let (sent, answers, dropped) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(exchange(vec![vec![0x22; MAX_QUERY + 1]]));
    assert_eq!(dropped, 1);
    assert_eq!(sent.len(), 1, "only the final valid query is forwarded");
    assert_eq!(answers.len(), 1, "{:?}", answers.keys().collect::<Vec<_>>());
}

/// The receive buffer is a stack array inside the relay's loop, not held
/// across its wait: kept across it, the array would be part of every idle
/// relay's task (4 KiB each). That the relay allocates no buffer while idle
/// is tcp_frame_memory.rs's `an_idle_udp_relay_allocates_no_receive_buffer`.
#[tokio::test]
async fn the_udp_relays_receive_buffer_is_not_kept_across_its_wait() {
    let relay = DnsRelay::new(RelayConfig::new(vec![
        "127.0.0.1:53".parse().expect("addr"),
    ]))
    .expect("valid config");
    let socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
    let serving = relay.serve_udp(socket, CancellationToken::new());
    let bytes = std::mem::size_of_val(&serving);
    assert!(
        bytes < 1024,
        "the UDP relay's future is {bytes} B: its receive buffer is kept across the wait"
    );
}
