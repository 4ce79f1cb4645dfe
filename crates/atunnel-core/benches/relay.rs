//! The relay's steady state: a long-lived relay moving data between loopback
//! sockets, timed per 32 KiB chunk, with the heap allocations it makes per
//! chunk printed beside criterion's figures.
//!
//! The relay (and, for the HTTP/2 cases, the client connection task) runs on
//! its own thread with a current-thread runtime, as a tunnel does; the bench
//! thread drives the outer ends (and the HTTP/2 peer) on another. So the time
//! per chunk is the pipeline's, and "tunnel thread CPU" is what the relay
//! thread itself spent per chunk.
//!
//! Allocations are counted process-wide, so the HTTP/2 cases include the
//! peer's h2 too: h2's receive path (tokio-util's length-delimited codec)
//! allocates three times per DATA frame, six per 32 KiB at the default 16 KiB
//! frame size, on whichever side receives. `h2_no_relay/static_to_h2` is the
//! same connection fed static `Bytes` without a relay, so the difference to
//! `relay_tcp_h2/tcp_to_h2` is the relay's own share (the `Bytes::from_owner`
//! that hands a pooled buffer to h2).
//!
//! Run: `cargo bench -p atunnel-core --bench relay` (append a name, e.g.
//! `-- relay_tcp_tcp`, for some cases only).

use std::alloc::System;
use std::net::{TcpListener as StdListener, TcpStream as StdStream};
use std::os::unix::thread::JoinHandleExt;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use atunnel_core::alloc::{self, CountingAlloc, CountingWith};
use atunnel_core::endpoint::{read_chunk, write_chunk};
use atunnel_core::sockopt::SocketOptions;
use atunnel_core::{BufferPool, Chunk, Endpoint, H2Stream, relay};
use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::runtime::Runtime;

#[global_allocator]
static ALLOC: CountingAlloc = CountingWith(System);

const CHUNK: usize = 32 * 1024;
/// Bytes per outer socket write or read: large, so the driver thread is not
/// what limits the pipeline.
const IO: usize = 256 * 1024;
static ZEROS: [u8; IO] = [0; IO];
/// Moved before criterion starts, so pool, queues and windows are warm.
const WARM_UP_CHUNKS: u64 = 256;
/// HTTP/2 windows as the gateway client sets them (`TUNNEL_STREAM_WINDOW`
/// and `TUNNEL_CONNECTION_WINDOW` in atunnel-connect's `limits`, copied:
/// this crate does not depend on atunnel-connect).
const STREAM_WINDOW: u32 = 256 * 1024;
const CONNECTION_WINDOW: u32 = 1 << 30;

fn current_thread() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A connected loopback pair, non-blocking so either runtime can adopt it.
fn std_pair() -> (StdStream, StdStream) {
    let listener = StdListener::bind("127.0.0.1:0").expect("bind");
    let client = StdStream::connect(listener.local_addr().expect("addr")).expect("connect");
    let (server, _) = listener.accept().expect("accept");
    for s in [&client, &server] {
        s.set_nonblocking(true).expect("nonblocking");
    }
    (client, server)
}

/// A relay-side socket, with the options a tunnel gives every socket.
fn tunnel_socket(s: StdStream) -> TcpStream {
    let s = TcpStream::from_std(s).expect("adopt");
    SocketOptions::default().apply(&s).expect("socket options");
    s
}

/// Where the driver puts bytes in.
enum Source {
    Tcp(OwnedWriteHalf),
    /// The HTTP/2 peer sending on its side of the CONNECT stream, written as
    /// the tunnel writes one.
    H2(H2Stream),
}

impl Source {
    async fn send(&mut self, mut n: usize) {
        while n > 0 {
            let k = n.min(IO);
            match self {
                Source::Tcp(w) => w.write_all(&ZEROS[..k]).await.expect("write"),
                Source::H2(s) => write_chunk(s, Chunk::Shared(Bytes::from_static(&ZEROS[..k])))
                    .await
                    .expect("send"),
            }
            n -= k;
        }
    }
}

/// Where the driver takes bytes out.
enum Sink {
    Tcp(OwnedReadHalf, Vec<u8>),
    /// The HTTP/2 peer draining its side of the CONNECT stream, read as the
    /// tunnel reads one (`pool` goes unused: an `H2Stream` reads h2's own
    /// `Bytes`); `surplus` is what a DATA frame brought beyond the last
    /// request.
    H2 {
        stream: H2Stream,
        pool: BufferPool,
        surplus: usize,
    },
}

impl Sink {
    async fn receive(&mut self, mut n: usize) {
        match self {
            Sink::Tcp(r, buf) => {
                while n > 0 {
                    let want = n.min(buf.len());
                    let got = r.read(&mut buf[..want]).await.expect("read");
                    assert!(got > 0, "early EOF");
                    n -= got;
                }
            }
            Sink::H2 {
                stream,
                pool,
                surplus,
            } => {
                while n > *surplus {
                    n -= *surplus;
                    let data = read_chunk(stream, pool).await.expect("open").expect("data");
                    stream.consumed(data.len());
                    *surplus = data.len();
                }
                *surplus -= n;
            }
        }
    }
}

/// What the measured calls cost, for the figures printed after criterion's.
#[derive(Default)]
struct Tally {
    chunks: u64,
    allocations: u64,
    pool_borrows: u64,
    tunnel_cpu: Duration,
}

/// One long-lived relay and the driver of its outer ends.
struct Rig {
    driver: Runtime,
    /// A flow per direction moving data: the first gets the odd chunk.
    flows: Vec<(Option<Source>, Sink)>,
    pool: BufferPool,
    tunnel: JoinHandle<()>,
    tally: Tally,
}

impl Rig {
    /// A rig with a pool of its own: `tunnel`, given the pool, runs on the
    /// tunnel thread, and `flows` sets up the driver's side on its runtime.
    fn new<T>(
        tunnel: impl FnOnce(BufferPool) -> T + Send + 'static,
        flows: impl Future<Output = Vec<(Option<Source>, Sink)>>,
    ) -> Rig
    where
        T: Future<Output = ()>,
    {
        let pool = BufferPool::default();
        let relay_pool = pool.clone();
        let tunnel = spawn_tunnel(move || tunnel(relay_pool));
        let driver = current_thread();
        let flows = driver.block_on(flows);
        Rig {
            driver,
            flows,
            pool,
            tunnel,
            tally: Tally::default(),
        }
    }

    /// Moves `chunks` chunks of 32 KiB, split across the flows, and returns
    /// the wall time it took.
    fn run(&mut self, chunks: u64, tally: bool) -> Duration {
        let allocs = alloc::allocations();
        let borrows = self.pool.stats().acquired_total;
        let cpu = thread_cpu(&self.tunnel);
        let start = Instant::now();
        let share = |i: usize| {
            let n = self.flows.len() as u64;
            let k = chunks / n + u64::from((i as u64) < chunks % n);
            k as usize * CHUNK
        };
        let (first, second) = (share(0), share(1));
        let (f0, rest) = self.flows.split_first_mut().expect("a flow");
        self.driver.block_on(async {
            let other = async {
                if let Some(f1) = rest.first_mut() {
                    flow(f1, second).await
                }
            };
            tokio::join!(flow(f0, first), other);
        });
        let elapsed = start.elapsed();
        if tally {
            let t = &mut self.tally;
            t.chunks += chunks;
            t.allocations += alloc::allocations() - allocs;
            t.pool_borrows += self.pool.stats().acquired_total - borrows;
            t.tunnel_cpu += thread_cpu(&self.tunnel).saturating_sub(cpu);
        }
        elapsed
    }

    fn report(&self, name: &str) {
        let t = &self.tally;
        if t.chunks == 0 {
            // Filtered out on the command line.
            return;
        }
        let per = |x: f64| x / t.chunks as f64;
        println!(
            "{name}: {:.4} allocations per 32 KiB chunk ({} over {} chunks in steady state), \
             {:.2} pool borrows per chunk, tunnel thread CPU {:.0} ns per chunk",
            per(t.allocations as f64),
            t.allocations,
            t.chunks,
            per(t.pool_borrows as f64),
            per(t.tunnel_cpu.as_nanos() as f64),
        );
    }
}

/// Sends and receives `n` bytes of one direction at once.
async fn flow((src, sink): &mut (Option<Source>, Sink), n: usize) {
    let send = async {
        if let Some(src) = src {
            src.send(n).await
        }
    };
    tokio::join!(send, sink.receive(n));
}

/// CPU time the tunnel thread has used (zero once it has exited).
fn thread_cpu(thread: &JoinHandle<()>) -> Duration {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: the handle's pthread_t names a thread that has not been joined
    // (the JoinHandle is alive), and `clock` is a valid out pointer.
    if unsafe { libc::pthread_getcpuclockid(thread.as_pthread_t(), &mut clock) } != 0 {
        return Duration::ZERO;
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock` came from pthread_getcpuclockid; `ts` is a valid out pointer.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Runs `tunnel` on its own thread with a current-thread runtime. The thread
/// ends when the rig's sockets close and the relay returns.
fn spawn_tunnel<F>(tunnel: impl FnOnce() -> F + Send + 'static) -> JoinHandle<()>
where
    F: Future<Output = ()>,
{
    std::thread::Builder::new()
        .name("tunnel".into())
        .spawn(move || current_thread().block_on(tunnel()))
        .expect("tunnel thread")
}

/// `outer_a <-> [relay a <-> b] <-> outer_b`, TCP both sides.
fn tcp_rig(both_ways: bool) -> Rig {
    let (outer_a, a) = std_pair();
    let (b, outer_b) = std_pair();
    let tunnel = move |relay_pool: BufferPool| async move {
        let (mut a, mut b) = (tunnel_socket(a), tunnel_socket(b));
        // A spawned task, as in the tunnel (its waker is the task's).
        let task = tokio::spawn(async move {
            let _ = relay(&mut a, &mut b, &relay_pool).await;
        });
        let _ = task.await;
    };
    Rig::new(tunnel, async move {
        let (a_r, a_w) = TcpStream::from_std(outer_a).expect("a").into_split();
        let (b_r, b_w) = TcpStream::from_std(outer_b).expect("b").into_split();
        let mut flows = vec![(Some(Source::Tcp(a_w)), Sink::Tcp(b_r, vec![0; IO]))];
        if both_ways {
            flows.push((Some(Source::Tcp(b_w)), Sink::Tcp(a_r, vec![0; IO])));
        }
        flows
    })
}

/// What runs on the tunnel side of the HTTP/2 rig.
#[derive(Clone, Copy, PartialEq, Eq)]
enum H2Case {
    /// Actor TCP -> relay -> HTTP/2 stream -> peer.
    TcpToH2,
    /// Peer -> HTTP/2 stream -> relay -> actor TCP.
    H2ToTcp,
    /// No relay: static `Bytes` written into the HTTP/2 stream, to tell h2's
    /// own per-chunk allocations from the relay's.
    StaticToH2,
}

/// `outer <-> [relay tcp <-> H2Stream] <-> h2 connection <-> peer`; the peer
/// is an h2 server on the driver thread.
fn h2_rig(case: H2Case) -> Rig {
    let (outer, inner) = std_pair();
    let (h2_client_io, h2_server_io) = std_pair();
    let tunnel = move |relay_pool: BufferPool| async move {
        let io = tunnel_socket(h2_client_io);
        let (mut send_request, conn) = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .enable_push(false)
            .handshake::<_, Bytes>(io)
            .await
            .expect("client handshake");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let request = http::Request::builder()
            .method(http::Method::CONNECT)
            .uri("192.0.2.10:443")
            .body(())
            .expect("request");
        let (response, send) = send_request.send_request(request, false).expect("send");
        let response = response.await.expect("response");
        let mut stream = H2Stream::new(send, response.into_body());
        let mut tcp = tunnel_socket(inner);
        let task = tokio::spawn(async move {
            if case == H2Case::StaticToH2 {
                let chunk = Bytes::from_static(&ZEROS[..CHUNK]);
                while write_chunk(&mut stream, Chunk::Shared(chunk.clone()))
                    .await
                    .is_ok()
                {}
            } else {
                let _ = relay(&mut tcp, &mut stream, &relay_pool).await;
            }
        });
        let _ = task.await;
    };
    Rig::new(tunnel, async move {
        let io = TcpStream::from_std(h2_server_io).expect("h2 server io");
        let mut conn = h2::server::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .handshake::<_, Bytes>(io)
            .await
            .expect("server handshake");
        let (request, mut respond) = conn.accept().await.expect("a stream").expect("stream");
        // Keeps the connection going whenever the driver runs.
        tokio::spawn(async move { while conn.accept().await.is_some() {} });
        let send = respond
            .send_response(http::Response::new(()), false)
            .expect("200");
        let peer = H2Stream::new(send, request.into_body());
        let (outer_r, outer_w) = TcpStream::from_std(outer).expect("outer").into_split();
        let peer_sink = |stream| Sink::H2 {
            stream,
            pool: BufferPool::default(),
            surplus: 0,
        };
        match case {
            H2Case::TcpToH2 => vec![(Some(Source::Tcp(outer_w)), peer_sink(peer))],
            H2Case::H2ToTcp => vec![(Some(Source::H2(peer)), Sink::Tcp(outer_r, vec![0; IO]))],
            H2Case::StaticToH2 => vec![(None, peer_sink(peer))],
        }
    })
}

fn bench_case(c: &mut Criterion, group: &str, name: &str, mut rig: Rig) {
    // A relay holds at most one buffer per direction; borrowing two now
    // makes the pool's working set part of the warm-up whatever the timing.
    let pool = rig.pool.clone();
    rig.driver
        .block_on(async { drop((pool.acquire().await, pool.acquire().await)) });
    rig.run(WARM_UP_CHUNKS, false);
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Bytes(CHUNK as u64));
    g.bench_function(name, |b| b.iter_custom(|chunks| rig.run(chunks, true)));
    g.finish();
    rig.report(&format!("{group}/{name}"));
}

fn relay_benches(c: &mut Criterion) {
    bench_case(c, "relay_tcp_tcp", "one_way", tcp_rig(false));
    bench_case(c, "relay_tcp_tcp", "both_ways", tcp_rig(true));
    bench_case(c, "relay_tcp_h2", "tcp_to_h2", h2_rig(H2Case::TcpToH2));
    bench_case(c, "relay_tcp_h2", "h2_to_tcp", h2_rig(H2Case::H2ToTcp));
    bench_case(c, "h2_no_relay", "static_to_h2", h2_rig(H2Case::StaticToH2));
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(5));
    targets = relay_benches
}
criterion_main!(benches);
