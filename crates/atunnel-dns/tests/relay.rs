//! The relay against fake upstream resolvers, over real loopback sockets.
//!
//! Tests wait on events (a query reaching an upstream, an answer or EOF
//! reaching a client, a `serve_*` call returning); the only timers are the
//! relay's own timeouts and a guard that turns a hang into a failure.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use atunnel_dns::{DnsError, DnsRelay, RelayConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Turns a hang into a test failure; never used to let something happen.
const GUARD: Duration = Duration::from_secs(10);
/// Per-exchange timeout for tests that exercise it.
const SHORT: Duration = Duration::from_millis(200);
/// A timeout no test waits for.
const LONG: Duration = Duration::from_secs(3600);

async fn guard<F: Future>(what: &str, future: F) -> F::Output {
    tokio::time::timeout(GUARD, future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

// ---------------------------------------------------------------------------
// DNS messages, as far as the tests need them.

/// A query for `example. IN A` with the given ID.
fn query(id: u16) -> Vec<u8> {
    let mut q = Vec::new();
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]); // RD; one question
    q.extend_from_slice(b"\x07example\x00\x00\x01\x00\x01");
    q
}

/// What the fake upstream answers: the query with QR set and `marker`
/// appended, so a test can tell which upstream (and which reply) it got.
fn answer(query: &[u8], marker: u8) -> Vec<u8> {
    let mut a = query.to_vec();
    a[2] |= 0x80;
    a.push(marker);
    a
}

/// The same, but with the ID changed.
fn wrong_id_answer(query: &[u8], marker: u8) -> Vec<u8> {
    let mut a = answer(query, marker);
    a[0] ^= 0xff;
    a[1] ^= 0xff;
    a
}

// ---------------------------------------------------------------------------
// A fake upstream resolver, UDP and TCP on the same port.

#[derive(Clone)]
enum Mode {
    /// Answers at once.
    Echo(u8),
    /// Reads queries and never answers.
    Silent,
    /// Sends an answer with the wrong ID, then the right one.
    WrongIdThenEcho { wrong: u8, right: u8 },
    /// UDP only: an answer with the right ID from another port first, then
    /// the real answer.
    SpoofThenEcho { spoof: u8, right: u8 },
    /// Answers once the test adds a permit to `release` (one per query).
    Hold { marker: u8, release: Arc<Semaphore> },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    Udp,
    Tcp,
}

struct FakeUpstream {
    addr: SocketAddr,
    /// Every query received, in order of arrival.
    queries: mpsc::UnboundedReceiver<(Transport, Vec<u8>)>,
}

impl FakeUpstream {
    async fn start(mode: Mode) -> Self {
        // The relay reaches an upstream at one address over both transports,
        // so both must share a port; retry if the UDP port happens to be
        // taken.
        for _ in 0..50 {
            let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind tcp");
            let addr = tcp.local_addr().expect("tcp addr");
            let Ok(udp) = UdpSocket::bind(addr).await else {
                continue;
            };
            let (tx, queries) = mpsc::unbounded_channel();
            tokio::spawn(serve_fake_udp(udp, mode.clone(), tx.clone()));
            tokio::spawn(serve_fake_tcp(tcp, mode, tx));
            return Self { addr, queries };
        }
        panic!("no port free for both UDP and TCP");
    }

    async fn next_query(&mut self) -> (Transport, Vec<u8>) {
        guard("a query at the upstream", self.queries.recv())
            .await
            .expect("fake upstream stopped")
    }

    /// Whether a query has arrived that the test has not taken yet.
    fn has_unseen_query(&mut self) -> bool {
        self.queries.try_recv().is_ok()
    }
}

async fn serve_fake_udp(
    socket: UdpSocket,
    mode: Mode,
    queries: mpsc::UnboundedSender<(Transport, Vec<u8>)>,
) {
    let socket = Arc::new(socket);
    let mut buf = vec![0u8; 65_535];
    loop {
        let Ok((len, from)) = socket.recv_from(&mut buf).await else {
            return;
        };
        let q = buf[..len].to_vec();
        let _ = queries.send((Transport::Udp, q.clone()));
        let socket = Arc::clone(&socket);
        let mode = mode.clone();
        tokio::spawn(async move {
            match mode {
                Mode::Echo(marker) => {
                    let _ = socket.send_to(&answer(&q, marker), from).await;
                }
                Mode::Silent => {}
                Mode::WrongIdThenEcho { wrong, right } => {
                    let _ = socket.send_to(&wrong_id_answer(&q, wrong), from).await;
                    let _ = socket.send_to(&answer(&q, right), from).await;
                }
                Mode::SpoofThenEcho { spoof, right } => {
                    let other = UdpSocket::bind("127.0.0.1:0").await.expect("bind spoof");
                    let _ = other.send_to(&answer(&q, spoof), from).await;
                    let _ = socket.send_to(&answer(&q, right), from).await;
                }
                Mode::Hold { marker, release } => {
                    if let Ok(permit) = release.acquire().await {
                        permit.forget();
                        let _ = socket.send_to(&answer(&q, marker), from).await;
                    }
                }
            }
        });
    }
}

async fn serve_fake_tcp(
    listener: TcpListener,
    mode: Mode,
    queries: mpsc::UnboundedSender<(Transport, Vec<u8>)>,
) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        let mode = mode.clone();
        let queries = queries.clone();
        tokio::spawn(async move {
            while let Ok(q) = read_frame(&mut stream).await {
                let _ = queries.send((Transport::Tcp, q.clone()));
                let replies = match &mode {
                    Mode::Echo(marker) => vec![answer(&q, *marker)],
                    // Keep reading (and holding the connection open).
                    Mode::Silent => vec![],
                    Mode::WrongIdThenEcho { wrong, right } => {
                        vec![wrong_id_answer(&q, *wrong), answer(&q, *right)]
                    }
                    Mode::SpoofThenEcho { right, .. } => vec![answer(&q, *right)],
                    Mode::Hold { marker, release } => match release.acquire().await {
                        Ok(permit) => {
                            permit.forget();
                            vec![answer(&q, *marker)]
                        }
                        Err(_) => return,
                    },
                };
                for reply in replies {
                    if write_frame(&mut stream, &reply).await.is_err() {
                        return;
                    }
                }
            }
        });
    }
}

async fn read_frame(stream: &mut TcpStream) -> io::Result<Vec<u8>> {
    let len = stream.read_u16().await?;
    let mut message = vec![0u8; usize::from(len)];
    stream.read_exact(&mut message).await?;
    Ok(message)
}

async fn write_frame(stream: &mut TcpStream, message: &[u8]) -> io::Result<()> {
    let mut frame = u16::try_from(message.len())
        .expect("test message fits")
        .to_be_bytes()
        .to_vec();
    frame.extend_from_slice(message);
    stream.write_all(&frame).await
}

// ---------------------------------------------------------------------------
// The relay under test, serving UDP and TCP on loopback.

struct Relay {
    relay: DnsRelay,
    udp: SocketAddr,
    tcp: SocketAddr,
    cancel: CancellationToken,
    udp_task: JoinHandle<()>,
    tcp_task: JoinHandle<()>,
}

fn config(upstreams: &[&FakeUpstream], timeout: Duration) -> RelayConfig {
    RelayConfig {
        timeout,
        ..RelayConfig::new(upstreams.iter().map(|u| u.addr).collect())
    }
}

async fn start_relay(cfg: RelayConfig) -> Relay {
    let relay = DnsRelay::new(cfg).expect("valid config");
    let udp_socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind udp");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind tcp");
    let udp = udp_socket.local_addr().expect("udp addr");
    let tcp = listener.local_addr().expect("tcp addr");
    let cancel = CancellationToken::new();
    let udp_task = tokio::spawn({
        let (relay, cancel) = (relay.clone(), cancel.clone());
        async move { relay.serve_udp(udp_socket, cancel).await }
    });
    let tcp_task = tokio::spawn({
        let (relay, cancel) = (relay.clone(), cancel.clone());
        async move { relay.serve_tcp(listener, cancel).await }
    });
    Relay {
        relay,
        udp,
        tcp,
        cancel,
        udp_task,
        tcp_task,
    }
}

async fn udp_client(relay: &Relay) -> UdpSocket {
    let socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind client");
    // Connected, so only the relay's datagrams arrive and a closed relay
    // port shows up as ConnectionRefused.
    socket.connect(relay.udp).await.expect("connect client");
    socket
}

async fn udp_recv(socket: &UdpSocket) -> Vec<u8> {
    let mut buf = vec![0u8; 65_535];
    let len = guard("a UDP answer", socket.recv(&mut buf))
        .await
        .expect("UDP answer");
    buf.truncate(len);
    buf
}

/// Sends `q` from `client` and returns the relay's answer.
async fn udp_ask(client: &UdpSocket, q: &[u8]) -> Vec<u8> {
    client.send(q).await.expect("send");
    udp_recv(client).await
}

async fn tcp_client(relay: &Relay) -> TcpStream {
    TcpStream::connect(relay.tcp)
        .await
        .expect("connect to relay")
}

/// Sends `q` on `stream` and returns the relay's answer.
async fn tcp_ask(stream: &mut TcpStream, q: &[u8]) -> Vec<u8> {
    write_frame(stream, q).await.expect("write query");
    guard("a TCP answer", read_frame(stream))
        .await
        .expect("answer")
}

/// Waits for the relay to close `stream` (EOF, or a reset if it closed with
/// bytes unread).
async fn assert_closed(stream: &mut TcpStream) {
    let mut buf = [0u8; 64];
    match guard("the relay to close the connection", stream.read(&mut buf)).await {
        Ok(0) => {}
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
        other => panic!("expected the connection to be closed, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------

#[tokio::test]
async fn udp_query_is_answered_by_the_first_upstream() {
    let mut first = FakeUpstream::start(Mode::Echo(0xa1)).await;
    let mut second = FakeUpstream::start(Mode::Echo(0xb2)).await;
    let relay = start_relay(config(&[&first, &second], SHORT)).await;

    let client = udp_client(&relay).await;
    let q = query(0x1234);
    assert_eq!(udp_ask(&client, &q).await, answer(&q, 0xa1));
    assert_eq!(first.next_query().await, (Transport::Udp, q));
    assert!(!second.has_unseen_query(), "second upstream was asked");
    let stats = relay.relay.stats();
    assert_eq!((stats.udp_queries, stats.answered), (1, 1), "{stats:?}");
    assert_eq!((stats.timed_out, stats.dropped), (0, 0), "{stats:?}");
}

#[tokio::test]
async fn tcp_query_is_answered_and_the_connection_stays_open_for_the_next() {
    let mut upstream = FakeUpstream::start(Mode::Echo(0xa1)).await;
    let relay = start_relay(config(&[&upstream], SHORT)).await;

    let mut stream = tcp_client(&relay).await;
    for id in [1, 2] {
        let q = query(id);
        assert_eq!(tcp_ask(&mut stream, &q).await, answer(&q, 0xa1));
        assert_eq!(upstream.next_query().await, (Transport::Tcp, q));
    }
    let stats = relay.relay.stats();
    assert_eq!((stats.tcp_queries, stats.answered), (2, 2), "{stats:?}");
}

#[tokio::test]
async fn silent_upstream_is_skipped_after_the_timeout() {
    let mut silent = FakeUpstream::start(Mode::Silent).await;
    let mut answering = FakeUpstream::start(Mode::Echo(0xb2)).await;
    let relay = start_relay(config(&[&silent, &answering], SHORT)).await;

    // UDP.
    let client = udp_client(&relay).await;
    let q = query(0x0101);
    let start = Instant::now();
    assert_eq!(udp_ask(&client, &q).await, answer(&q, 0xb2));
    assert!(
        start.elapsed() >= SHORT,
        "answered before the first upstream's timeout"
    );
    assert_eq!(silent.next_query().await, (Transport::Udp, q.clone()));
    assert_eq!(answering.next_query().await, (Transport::Udp, q));

    // TCP.
    let mut stream = tcp_client(&relay).await;
    let q = query(0x0202);
    let start = Instant::now();
    assert_eq!(tcp_ask(&mut stream, &q).await, answer(&q, 0xb2));
    assert!(
        start.elapsed() >= SHORT,
        "answered before the first upstream's timeout"
    );
    assert_eq!(silent.next_query().await, (Transport::Tcp, q.clone()));
    assert_eq!(answering.next_query().await, (Transport::Tcp, q));

    let stats = relay.relay.stats();
    assert_eq!((stats.answered, stats.timed_out), (2, 0), "{stats:?}");
}

#[tokio::test]
async fn no_answer_from_any_upstream_sends_nothing_over_udp_and_closes_tcp() {
    let mut first = FakeUpstream::start(Mode::Silent).await;
    let mut second = FakeUpstream::start(Mode::Silent).await;
    let relay = start_relay(config(&[&first, &second], SHORT)).await;

    // TCP: once both upstreams have had their turn, the relay closes.
    let mut stream = tcp_client(&relay).await;
    let q = query(0x0303);
    write_frame(&mut stream, &q).await.expect("write query");
    assert_closed(&mut stream).await;
    assert_eq!(first.next_query().await, (Transport::Tcp, q.clone()));
    assert_eq!(second.next_query().await, (Transport::Tcp, q));

    // UDP: once the relay has seen the query, cancel; serve_udp returns only
    // after the query's task has given up on both upstreams, so by then
    // anything it sent would already be queued at the client.
    let client = udp_client(&relay).await;
    let q = query(0x0404);
    client.send(&q).await.expect("send");
    assert_eq!(first.next_query().await, (Transport::Udp, q.clone()));
    relay.cancel.cancel();
    guard("serve_udp to return", relay.udp_task)
        .await
        .expect("serve_udp");
    assert_eq!(second.next_query().await, (Transport::Udp, q));
    let mut buf = [0u8; 512];
    let got = client.try_recv(&mut buf);
    assert!(
        matches!(&got, Err(e) if e.kind() == io::ErrorKind::WouldBlock),
        "client received {got:?}"
    );

    let stats = relay.relay.stats();
    assert_eq!((stats.answered, stats.timed_out), (0, 2), "{stats:?}");
}

#[tokio::test]
async fn answer_with_the_wrong_id_is_ignored() {
    let upstream = FakeUpstream::start(Mode::WrongIdThenEcho {
        wrong: 0xee,
        right: 0xa1,
    })
    .await;
    let relay = start_relay(config(&[&upstream], LONG)).await;

    // The wrong-ID answer arrives first; the client must get the right one.
    let client = udp_client(&relay).await;
    let q = query(0x0505);
    assert_eq!(udp_ask(&client, &q).await, answer(&q, 0xa1));

    let mut stream = tcp_client(&relay).await;
    let q = query(0x0606);
    assert_eq!(tcp_ask(&mut stream, &q).await, answer(&q, 0xa1));

    let stats = relay.relay.stats();
    assert_eq!(stats.answered, 2, "{stats:?}");
}

#[tokio::test]
async fn udp_answer_from_another_address_is_ignored() {
    let upstream = FakeUpstream::start(Mode::SpoofThenEcho {
        spoof: 0x55,
        right: 0xa1,
    })
    .await;
    let relay = start_relay(config(&[&upstream], LONG)).await;

    // The spoofed answer (right ID, wrong source port) arrives first.
    let client = udp_client(&relay).await;
    let q = query(0x0707);
    assert_eq!(udp_ask(&client, &q).await, answer(&q, 0xa1));
}

#[tokio::test]
async fn short_datagrams_are_dropped() {
    let mut upstream = FakeUpstream::start(Mode::Echo(0xa1)).await;
    let relay = start_relay(config(&[&upstream], SHORT)).await;

    let client = udp_client(&relay).await;
    let q = query(0x0808);
    client.send(&[]).await.expect("send empty");
    client.send(&q[..11]).await.expect("send 11 bytes");
    client.send(&q).await.expect("send query");

    // The relay reads datagrams in order, so by the time the full query is
    // answered the short ones have been dealt with.
    assert_eq!(udp_recv(&client).await, answer(&q, 0xa1));
    assert_eq!(upstream.next_query().await, (Transport::Udp, q));
    assert!(
        !upstream.has_unseen_query(),
        "a short datagram was forwarded"
    );
    let stats = relay.relay.stats();
    assert_eq!(
        (stats.udp_queries, stats.dropped, stats.answered),
        (3, 2, 1),
        "{stats:?}"
    );
}

#[tokio::test]
async fn queries_beyond_max_in_flight_are_dropped_and_counted() {
    let release = Arc::new(Semaphore::new(0));
    let mut upstream = FakeUpstream::start(Mode::Hold {
        marker: 0xa1,
        release: Arc::clone(&release),
    })
    .await;
    let relay = start_relay(RelayConfig {
        max_in_flight: 1,
        ..config(&[&upstream], LONG)
    })
    .await;

    let client = udp_client(&relay).await;
    let held = query(0x0901);
    let over = query(0x0902);
    let later = query(0x0903);
    client.send(&held).await.expect("send");
    assert_eq!(upstream.next_query().await, (Transport::Udp, held.clone()));
    assert_eq!(relay.relay.stats().in_flight, 1, "held counted in flight");
    // The budget is used up by `held`: this one is dropped.
    client.send(&over).await.expect("send");
    release.add_permits(1);
    assert_eq!(udp_recv(&client).await, answer(&held, 0xa1));

    // With the slot free again, the next query goes through. It was sent
    // after `over`, so `over` has been dealt with by the time it is answered.
    release.add_permits(1);
    client.send(&later).await.expect("send");
    assert_eq!(udp_recv(&client).await, answer(&later, 0xa1));
    assert_eq!(upstream.next_query().await, (Transport::Udp, later));
    let stats = relay.relay.stats();
    assert_eq!(
        (stats.udp_queries, stats.dropped, stats.answered),
        (3, 1, 2),
        "{stats:?}"
    );
}

#[tokio::test]
async fn tcp_bad_length_closes_the_connection() {
    let mut upstream = FakeUpstream::start(Mode::Echo(0xa1)).await;
    let relay = start_relay(config(&[&upstream], SHORT)).await;

    let mut stream = tcp_client(&relay).await;
    // Length 11: shorter than a DNS header.
    stream
        .write_all(&[0, 11, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
        .await
        .expect("write");
    assert_closed(&mut stream).await;
    assert!(!upstream.has_unseen_query(), "a bad message was forwarded");
    let stats = relay.relay.stats();
    assert_eq!((stats.tcp_queries, stats.dropped), (0, 1), "{stats:?}");
}

#[tokio::test]
async fn tcp_idle_connection_is_closed_after_the_idle_timeout() {
    let upstream = FakeUpstream::start(Mode::Echo(0xa1)).await;
    // The per-exchange timeout is LONG, so only the idle timeout can close.
    let relay = start_relay(RelayConfig {
        tcp_idle_timeout: SHORT,
        ..config(&[&upstream], LONG)
    })
    .await;

    let mut stream = tcp_client(&relay).await;
    let start = Instant::now();
    assert_closed(&mut stream).await;
    // The configured 200 ms, not the 10 s default: measured 201-202 ms.
    let took = start.elapsed();
    assert!(took >= SHORT && took < SHORT * 5, "closed after {took:?}");
}

#[tokio::test]
async fn cancel_stops_serving_and_waits_for_tasks() {
    let release = Arc::new(Semaphore::new(0));
    let mut upstream = FakeUpstream::start(Mode::Hold {
        marker: 0xa1,
        release: Arc::clone(&release),
    })
    .await;
    // Long timeouts: only the test's release ends the held exchanges, and
    // an idle connection would otherwise stay open for an hour.
    let relay = start_relay(RelayConfig {
        tcp_idle_timeout: LONG,
        ..config(&[&upstream], LONG)
    })
    .await;

    // An idle TCP connection the relay has accepted (it has answered a query
    // on it), then one UDP and one TCP query held at the upstream.
    let mut idle = tcp_client(&relay).await;
    let idle_q = query(0x0a00);
    write_frame(&mut idle, &idle_q).await.expect("write query");
    assert_eq!(
        upstream.next_query().await,
        (Transport::Tcp, idle_q.clone())
    );
    release.add_permits(1);
    let a = guard("a TCP answer", read_frame(&mut idle))
        .await
        .expect("answer");
    assert_eq!(a, answer(&idle_q, 0xa1));

    let client = udp_client(&relay).await;
    let udp_q = query(0x0a01);
    client.send(&udp_q).await.expect("send");
    assert_eq!(upstream.next_query().await, (Transport::Udp, udp_q.clone()));
    let mut busy = tcp_client(&relay).await;
    let tcp_q = query(0x0a02);
    write_frame(&mut busy, &tcp_q).await.expect("write query");
    assert_eq!(upstream.next_query().await, (Transport::Tcp, tcp_q.clone()));

    relay.cancel.cancel();
    // Let both serve loops see the cancel; they must still be waiting for the
    // held exchanges.
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(
        !relay.udp_task.is_finished(),
        "serve_udp returned with a query in flight"
    );
    assert!(
        !relay.tcp_task.is_finished(),
        "serve_tcp returned with a query in flight"
    );
    // The idle connection is closed now, not after the idle timeout.
    assert_closed(&mut idle).await;

    // Release the held exchanges: both are answered, then everything ends.
    release.add_permits(2);
    assert_eq!(udp_recv(&client).await, answer(&udp_q, 0xa1));
    let a = guard("a TCP answer", read_frame(&mut busy))
        .await
        .expect("held TCP query answered");
    assert_eq!(a, answer(&tcp_q, 0xa1));
    assert_closed(&mut busy).await;
    guard("serve_udp to return", relay.udp_task)
        .await
        .expect("serve_udp");
    guard("serve_tcp to return", relay.tcp_task)
        .await
        .expect("serve_tcp");
    let stats = relay.relay.stats();
    assert_eq!(stats.answered, 3, "{stats:?}");

    // Serving has stopped: both listening sockets are closed.
    let q = query(0x0a03);
    client.send(&q).await.expect("send");
    let mut buf = [0u8; 512];
    let got = guard("the closed UDP port to be reported", client.recv(&mut buf)).await;
    assert!(
        matches!(&got, Err(e) if e.kind() == io::ErrorKind::ConnectionRefused),
        "UDP after cancel: {got:?}"
    );
    let got = TcpStream::connect(relay.tcp).await;
    assert!(
        matches!(&got, Err(e) if e.kind() == io::ErrorKind::ConnectionRefused),
        "TCP after cancel: {got:?}"
    );
    assert!(
        !upstream.has_unseen_query(),
        "a query was forwarded after cancel"
    );
}

#[test]
fn new_rejects_unusable_configs() {
    let good: SocketAddr = "127.0.0.1:53".parse().expect("addr");
    assert!(matches!(
        DnsRelay::new(RelayConfig::new(vec![])),
        Err(DnsError::NoUpstreams)
    ));
    let unspecified: SocketAddr = "0.0.0.0:53".parse().expect("addr");
    let error = DnsRelay::new(RelayConfig::new(vec![good, unspecified])).expect_err("unspecified");
    assert!(error.to_string().contains("0.0.0.0:53"), "{error}");
    assert!(matches!(
        DnsRelay::new(RelayConfig {
            max_in_flight: 0,
            ..RelayConfig::new(vec![good])
        }),
        Err(DnsError::InvalidConfig(_))
    ));
    let cfg = RelayConfig::new(vec![good]);
    assert_eq!(cfg.timeout, Duration::from_secs(5));
    assert_eq!(cfg.max_in_flight, 256);
    assert_eq!(cfg.tcp_idle_timeout, Duration::from_secs(10));
    assert_eq!(cfg.tcp_notsent_lowat, Some(16 * 1024));
    assert!(DnsRelay::new(cfg).is_ok());
}

/// `TCP_NOTSENT_LOWAT` of each TCP socket of this process whose (local, peer)
/// addresses `matches`. The relay does not hand its sockets out, so they are
/// found through /proc/self/fd and read on a duplicate of the descriptor.
fn notsent_lowats(matches: impl Fn(SocketAddr, SocketAddr) -> bool) -> Vec<u32> {
    use std::os::fd::{BorrowedFd, RawFd};
    let mut found = Vec::new();
    for (fd, path) in
        atunnel_host::numbered_entries::<RawFd>("/proc/self/fd").expect("list /proc/self/fd")
    {
        let is_socket = std::fs::read_link(path)
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
        if !is_socket {
            continue;
        }
        // SAFETY: `fd` was listed as open just now and is only duplicated
        // (one fcntl); if another thread closed it since, the duplicate
        // fails with EBADF, and if the number was reused, the addresses
        // below do not match.
        let Ok(dup) = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned() else {
            continue;
        };
        let sock = socket2::Socket::from(dup);
        if !sock.r#type().is_ok_and(|t| t == socket2::Type::STREAM) {
            continue;
        }
        let addr = |a: io::Result<socket2::SockAddr>| a.ok().and_then(|a| a.as_socket());
        if let (Some(local), Some(peer)) = (addr(sock.local_addr()), addr(sock.peer_addr()))
            && matches(local, peer)
        {
            found.push(sock.tcp_notsent_lowat().expect("TCP_NOTSENT_LOWAT"));
        }
    }
    found
}

#[tokio::test]
async fn tcp_sockets_the_relay_accepts_and_dials_carry_the_notsent_lowat() {
    // 0 read back means "not set on the socket: net.ipv4.tcp_notsent_lowat
    // applies", the kernel default.
    for (lowat, expected) in [(Some(4096), 4096), (None, 0)] {
        let release = Arc::new(Semaphore::new(0));
        let mut upstream = FakeUpstream::start(Mode::Hold {
            marker: 0xa1,
            release: release.clone(),
        })
        .await;
        let relay = start_relay(RelayConfig {
            tcp_notsent_lowat: lowat,
            ..config(&[&upstream], LONG)
        })
        .await;
        let mut stream = tcp_client(&relay).await;
        let client = stream.local_addr().expect("client addr");
        let q = query(0x0707);
        write_frame(&mut stream, &q).await.expect("write query");
        // The query is held at the upstream: the relay has both sockets open.
        assert_eq!(upstream.next_query().await, (Transport::Tcp, q.clone()));
        let accepted = notsent_lowats(|local, peer| local == relay.tcp && peer == client);
        let dialed = notsent_lowats(|_, peer| peer == upstream.addr);
        assert_eq!(accepted, vec![expected], "accepted socket, lowat {lowat:?}");
        assert_eq!(dialed, vec![expected], "dialed socket, lowat {lowat:?}");

        release.add_permits(1);
        let a = guard("a TCP answer", read_frame(&mut stream))
            .await
            .expect("answer");
        assert_eq!(a, answer(&q, 0xa1));
    }
}

/// Thousands of TCP connections that never send a query, on one sandbox's
/// relay: it holds at most its in-flight limit of them (the rest are closed
/// at once and counted), the relay of another sandbox answers over both
/// transports meanwhile, and the flooded one answers again once the flood
/// lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_silent_tcp_connections_is_capped_and_other_relays_answer() {
    const FLOOD: usize = 3_000;
    let upstream = FakeUpstream::start(Mode::Echo(0xa1)).await;
    let cfg = RelayConfig {
        tcp_idle_timeout: LONG,
        ..config(&[&upstream], Duration::from_secs(5))
    };
    let limit = cfg.max_in_flight;
    let flooded = start_relay(cfg.clone()).await;
    let other = start_relay(cfg).await;
    let mut flood = Vec::with_capacity(FLOOD);
    for _ in 0..FLOOD {
        flood.push(tcp_client(&flooded).await);
    }
    // Each connection past the limit is closed at once: waiting for the
    // last one's EOF is waiting for all of them to have been accepted.
    assert_closed(flood.last_mut().expect("a flood")).await;
    let dropped = flooded.relay.stats().dropped;
    assert_eq!(
        dropped,
        (FLOOD - limit) as u64,
        "{:?}",
        flooded.relay.stats()
    );

    let client = udp_client(&other).await;
    client.send(&query(0x0a01)).await.expect("send");
    assert_eq!(udp_recv(&client).await, answer(&query(0x0a01), 0xa1));
    let mut tcp = tcp_client(&other).await;
    write_frame(&mut tcp, &query(0x0a02)).await.expect("write");
    let got = guard("a TCP answer", read_frame(&mut tcp))
        .await
        .expect("read");
    assert_eq!(got, answer(&query(0x0a02), 0xa1));

    drop(flood);
    // Its connections' ends are seen as their tasks end; a query is then
    // admitted again (retried: the releases are not events a test can await).
    let mut answered = false;
    for _ in 0..100 {
        let mut tcp = tcp_client(&flooded).await;
        write_frame(&mut tcp, &query(0x0a03)).await.expect("write");
        if let Ok(got) = guard("an answer or EOF", read_frame(&mut tcp)).await {
            assert_eq!(got, answer(&query(0x0a03), 0xa1));
            answered = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(answered, "the flooded relay answers once the flood is gone");
}
