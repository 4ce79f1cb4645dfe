//! The units the scenario counts: what each is, how its connections are
//! prepared before the windows, and the work of N of them.

use super::*;

/// `--cost-units`' parser: a unit's name.
pub fn parse_unit(name: &str) -> Result<String, String> {
    match Unit::by_name(name) {
        Some(u) => Ok(u.name().to_string()),
        None => Err(format!(
            "no cost unit {name:?}; the units: {}",
            Unit::ALL.map(Unit::name).join(", ")
        )),
    }
}

/// A unit of work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    IngressHttps,
    IngressConnect,
    EgressOpen,
    EgressUpload,
    EgressDownload,
    EgressHttp,
    IngressIdle,
}

impl Unit {
    pub const ALL: [Unit; 7] = [
        Unit::IngressHttps,
        Unit::IngressConnect,
        Unit::EgressOpen,
        Unit::EgressUpload,
        Unit::EgressDownload,
        Unit::EgressHttp,
        Unit::IngressIdle,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Unit::IngressHttps => "ingress-https",
            Unit::IngressConnect => "ingress-connect",
            Unit::EgressOpen => "egress-open",
            Unit::EgressUpload => "egress-upload",
            Unit::EgressDownload => "egress-download",
            Unit::EgressHttp => "egress-http",
            Unit::IngressIdle => "ingress-idle",
        }
    }

    pub fn by_name(name: &str) -> Option<Unit> {
        Unit::ALL.into_iter().find(|u| u.name() == name)
    }

    /// What one unit is.
    pub fn per(self) -> &'static str {
        match self {
            Unit::IngressHttps => "request (router h2 -> actor h1, 64 B answer)",
            Unit::IngressConnect => "CONNECT tunnel with one request inside",
            Unit::EgressOpen => "egress tunnel opened and closed",
            Unit::EgressUpload => "MiB up (sandbox -> far end)",
            Unit::EgressDownload => "MiB down (far end -> sandbox)",
            Unit::EgressHttp => "HTTP/1.1 request on a kept egress tunnel",
            Unit::IngressIdle => "idle router connection hibernated and woken",
        }
    }

    /// N: units in the smaller window (the larger has 2N), in `pass`.
    pub(super) fn count(self, pass: Pass, quick: bool) -> u64 {
        // Large enough that what runs in proportion to the window's length
        // (the contender's timers, ~50x longer under callgrind) stays small
        // beside the units: 16 opens moved their instructions by 8-10 %
        // between two quiet runs, 200 requests by 0.02 %.
        let n = match self {
            Unit::IngressHttps | Unit::EgressHttp => 200,
            Unit::IngressConnect | Unit::EgressOpen => 64,
            // Under perf 64 in the quick run too: what moves with wall
            // time (the trim task's 1 s tick, how many of the idle checks'
            // 125 ms grid ticks the connections' last requests spread
            // over) is a wake-up or two per window, which over 32
            // connections made 0.13 of 2 switches per connection between
            // two runs. Under callgrind 32: the set-up serves each
            // connection once, one after the other, ~50x slower, and with
            // 128 the first ones hibernated before their window opened
            // (105,157 instructions per connection against 128,156).
            Unit::IngressIdle => {
                return match pass {
                    Pass::Perf if quick => 64,
                    Pass::Perf => 160,
                    Pass::Callgrind => 32,
                };
            }
            // 64 under callgrind: HAProxy's choice between copying a
            // buffer and forwarding it, which follows where its buffers
            // stood, moved its instructions per MiB down by 6 % between
            // pairs of 32 and 64 MiB windows (its 64 MiB windows agreed
            // within 0.3 %); a 2N window of 128 MiB takes ~30 s there.
            // 256 under perf, where it takes a second: a switch more or
            // less in a window is then 1/256 per MiB, and HAProxy makes
            // about a third of one per MiB (up, 0.33 and 0.38 in two runs
            // with N = 64: three switches a window).
            Unit::EgressUpload | Unit::EgressDownload => {
                return match pass {
                    Pass::Perf => 256,
                    Pass::Callgrind => 64,
                };
            }
        };
        if quick { n } else { 5 * n }
    }

    /// Whether `contender` can do this unit at all.
    pub(super) fn done_by(self, contender: Contender) -> bool {
        match contender {
            Contender::Atunnel => true,
            // nginx serves the router's HTTPS only: no CONNECT listener,
            // no sandboxes, no hibernation.
            Contender::Nginx => self == Unit::IngressHttps,
            // HAProxy also relays the sandboxes' egress bytes, TCP -> TLS
            // (no HTTP/2, so no HTTP request on a kept tunnel to compare:
            // that is the far end's work).
            Contender::Haproxy => matches!(
                self,
                Unit::IngressHttps | Unit::EgressOpen | Unit::EgressUpload | Unit::EgressDownload
            ),
        }
    }
}

/// What a unit reuses, set up (and used once) before the windows.
pub(super) enum Prepared {
    Https(hyper::client::conn::http2::SendRequest<Empty<Bytes>>),
    Connect(h2::client::SendRequest<Bytes>),
    Egress,
    KeptTunnel(tokio::net::TcpStream),
    /// An egress tunnel for bytes, opened before the window.
    Tunnel(tokio::net::TcpStream),
    Idle(Vec<hyper::client::conn::http1::SendRequest<Empty<Bytes>>>),
}

pub(super) fn err(e: impl std::fmt::Display) -> atunnel_process::BoxError {
    e.to_string().into()
}

/// Sets up what `unit` reuses; for ingress-idle, the `n` connections.
pub(super) async fn prepare(
    bench: &Bench,
    unit: Unit,
    n: u64,
) -> Result<Prepared, atunnel_process::BoxError> {
    let actors = crate::run::dial::Actors::of(bench);
    Ok(match unit {
        Unit::IngressHttps => {
            let send = hyper_h2(bench.router_tls(443, Alpn::H2).await?).await?;
            routed_request(send.clone(), 0).await?;
            Prepared::Https(send)
        }
        Unit::IngressConnect => {
            let send = h2_client(bench.router_tls(8443, Alpn::H2).await?).await?;
            connect_exchange(send.clone(), 0).await?;
            Prepared::Connect(send)
        }
        Unit::EgressOpen => {
            // actor-0's pooled gateway connection exists before either
            // window (shared by all its tunnels).
            open_and_close(&actors).await?;
            Prepared::Egress
        }
        Unit::EgressUpload | Unit::EgressDownload => {
            open_and_close(&actors).await?;
            // The tunnel is opened before the window, so that the window
            // holds bytes only: a TLS relay's handshake per tunnel
            // (HAProxy's, resumed or in full as the far end's tickets
            // allow) moved its instructions per MiB by 10 % between
            // windows otherwise.
            // The writer's send buffer is fixed, as the download's reader's
            // receive buffer is: autotuned, how much of the window's bytes
            // a relay found waiting per wake-up moved with it (HAProxy's
            // switches per MiB up spread 0.44..0.70 over five pairs; fixed,
            // 1.98..2.02). The source streams without end: a window moves n
            // MiB plus however much more the buffers behind the contender
            // hold at its end than at its start. With the kernel's
            // autotuning, the reader's buffer grew between windows (one
            // window of 32 MiB carried 15 % more than another); fixed, it
            // is full at both ends.
            let (dest, buffers) = if unit == Unit::EgressUpload {
                let send = Some(UPLOAD_SEND_BUFFER);
                (
                    DISCARD,
                    FixedBuffers {
                        send,
                        receive: None,
                    },
                )
            } else {
                let receive = Some(DOWNLOAD_RECEIVE_BUFFER);
                (
                    SOURCE,
                    FixedBuffers {
                        receive,
                        send: None,
                    },
                )
            };
            let mut s = actors.dial_with_buffers(0, dest, buffers).await?;
            if unit == Unit::EgressDownload {
                // The source is streaming once a byte arrives.
                let mut first = [0u8; 1];
                s.read_exact(&mut first).await?;
            }
            Prepared::Tunnel(s)
        }
        Unit::EgressHttp => {
            let mut s = actors.dial(0, HTTP).await?;
            http_exchange(&mut s).await?;
            Prepared::KeptTunnel(s)
        }
        Unit::IngressIdle => {
            let mut conns = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let tls = bench.router_tls(443, Alpn::Http1).await?;
                let (mut send, conn) =
                    hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                        .await?;
                tokio::spawn(conn);
                h1_request(&mut send).await?;
                conns.push(send);
            }
            Prepared::Idle(conns)
        }
    })
}

/// One egress tunnel from actor-0's sandbox: opened, a byte there and back,
/// closed, and the far end's close seen.
pub(super) async fn open_and_close(
    actors: &crate::run::dial::Actors,
) -> Result<(), atunnel_process::BoxError> {
    let mut s = actors.dial(0, ECHO).await?;
    crate::traffic::ping(&mut s).await?;
    s.shutdown().await?;
    let mut rest = [0u8; 16];
    while s.read(&mut rest).await? > 0 {}
    Ok(())
}

/// `bytes` written into the tunnel `s` (left open: the window ends once the
/// contender relayed them all and went quiet).
pub(super) async fn upload_on(s: &mut tokio::net::TcpStream, bytes: u64) -> std::io::Result<()> {
    let zeros = vec![0u8; 256 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        s.write_all(&zeros[..n]).await?;
        left -= n as u64;
    }
    Ok(())
}

/// A router HTTP/1.1 request to actor-0, its answer read.
pub(super) async fn h1_request(
    send: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
) -> Result<(), atunnel_process::BoxError> {
    send.ready().await?;
    let req = http::Request::builder()
        .uri("/")
        .header(http::header::HOST, "worker.bench")
        .header("ate-target-actor", "bench/actor-0")
        .body(Empty::<Bytes>::new())?;
    let resp = send.send_request(req).await?;
    if !resp.status().is_success() {
        return Err(format!("status {}", resp.status()).into());
    }
    resp.into_body().collect().await?;
    Ok(())
}

/// `n` units of `unit` on what `prepared` holds.
pub(super) async fn work(
    bench: &Bench,
    pass: Pass,
    unit: Unit,
    prepared: &mut Prepared,
    n: u64,
) -> Result<(), atunnel_process::BoxError> {
    let actors = crate::run::dial::Actors::of(bench);
    match (unit, prepared) {
        (Unit::IngressHttps, Prepared::Https(send)) => {
            for _ in 0..n {
                routed_request(send.clone(), 0).await?;
            }
        }
        (Unit::IngressConnect, Prepared::Connect(send)) => {
            for _ in 0..n {
                connect_exchange(send.clone(), 0).await?;
            }
        }
        (Unit::EgressOpen, Prepared::Egress) => {
            for _ in 0..n {
                open_and_close(&actors).await?;
            }
        }
        (Unit::EgressUpload, Prepared::Tunnel(s)) => {
            upload_on(s, n << 20).await?;
        }
        (Unit::EgressDownload, Prepared::Tunnel(s)) => {
            let mut buf = vec![0u8; 256 * 1024];
            let mut left = n << 20;
            while left > 0 {
                let want = buf.len().min(left as usize);
                let got = s.read(&mut buf[..want]).await?;
                if got == 0 {
                    return Err("the source closed early".into());
                }
                left -= got as u64;
            }
        }
        (Unit::EgressHttp, Prepared::KeptTunnel(s)) => {
            for _ in 0..n {
                http_exchange(s).await?;
            }
        }
        (Unit::IngressIdle, Prepared::Idle(conns)) => {
            tokio::time::sleep(idle_for(pass)).await;
            for send in conns.iter_mut() {
                h1_request(send).await?;
            }
        }
        _ => return Err(format!("{}: prepared for another unit", unit.name()).into()),
    }
    Ok(())
}
