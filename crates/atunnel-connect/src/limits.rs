//! Every HTTP/2 window, stream limit, frame size and timeout of atunnel's
//! tunnels and proxies, in one place, each with the reason for its value.
//! The client to the gateway, the CONNECT server (the gateway and ingress
//! CONNECT), ingress HTTPS (hyper, toward the router and toward actors) all
//! take theirs from here; what is settable says which flag sets it.

use std::time::Duration;

// ---- HTTP/2 toward the gateway (the egress client, and the gateway) ----

/// Receive window per stream of a tunnel to the gateway, on both ends: what
/// the far end may send on one tunnel before the near end reads it. It
/// bounds the heap one stalled tunnel can pin (this much in h2's receive
/// queue) and the throughput of one tunnel (window / round trip: 256 KiB
/// over a 0.25 ms in-datacentre round trip is about 1 GB/s, above what one
/// core relays).
pub const TUNNEL_STREAM_WINDOW: u32 = 256 * 1024;

/// Receive window per connection between atunnel and the gateway, on both
/// ends (the tunnel's `--gateway-connection-window`, the gateway's
/// `--connection-window`). Such a connection carries one actor's tunnels
/// only (it is authenticated with that actor's certificate), so this is the
/// most one actor can leave unread per connection: without it an actor's
/// stalled tunnels could each pin a [`TUNNEL_STREAM_WINDOW`] (4,096 tunnels,
/// 1 GiB). 16 MiB is 64 stalled windows; past that the actor's own tunnels
/// on the connection share what is left, while each stalled one is ended by
/// the stalled-write bound. One tunnel's throughput is set by its stream
/// window, not this.
pub const TUNNEL_CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;

/// Receive window per connection of ingress CONNECT, whose router
/// connections multiplex tunnels to many actors: one actor's stalled
/// tunnels must never exhaust it and block another's on the same
/// connection, so it is larger than [`MAX_CONCURRENT_STREAMS`] stream
/// windows (1 GiB); it is not memory unless used, and each stream's part
/// is capped by its stream window.
pub const ROUTER_CONNECT_CONNECTION_WINDOW: u32 = 1 << 30;

/// Streams the client opens on a new connection before the gateway's
/// SETTINGS say how many it allows (h2's own default is unlimited). RFC
/// 9113 §6.5.2 recommends servers allow at least 100, so up to 100 is not
/// refused by a gateway that follows it. The pool asks for less still: one
/// stream until the SETTINGS are in.
pub const INITIAL_MAX_SEND_STREAMS: usize = 100;

/// Streams one HTTP/2 connection may carry at once on a CONNECT server (the
/// gateway's `--max-concurrent-streams`, and ingress CONNECT). Tunnels are
/// long-lived, so the limit is high; each stream's cost is capped by its
/// window.
pub const MAX_CONCURRENT_STREAMS: u32 = 1000;

/// Most header bytes (HPACK-decoded, RFC 9113 §6.5.2) one CONNECT stream
/// may carry, on the CONNECT servers and the gateway client: a CONNECT or
/// its answer is a handful of short fields, and h2's own default is 16 MiB
/// a stream, which a peer could make the server buffer.
pub const TUNNEL_MAX_HEADER_LIST: u32 = 16 * 1024;

/// Streams a peer may open and reset before they are accepted, and streams
/// this side may reset for the peer's errors, before the connection is
/// closed with GOAWAY (ENHANCE_YOUR_CALM): the rapid-reset (CVE-2023-44487)
/// and error-flood bounds, h2's defaults made explicit on every HTTP/2
/// server and client.
pub const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 20;
pub const MAX_LOCAL_ERROR_RESET_STREAMS: usize = 1024;

/// Control frames (SETTINGS, PING, WINDOW_UPDATE, PRIORITY, RST_STREAM,
/// GOAWAY, empty DATA, HEADERS on a stream already seen, unknown types) a
/// peer may send on one HTTP/2 connection before they must be paid for,
/// on every HTTP/2 server and client ([`crate::flood`]). A client's
/// handshake, its keepalive PINGs and the WINDOW_UPDATEs of a transfer
/// are a few a second; 1,000 is Envoy's `max_outbound_control_frames`
/// (10,000) scaled to atunnel's 200 streams a connection. A flood is cut
/// within twice this, with GOAWAY ENHANCE_YOUR_CALM.
pub const CONTROL_FRAME_BUDGET: u32 = 1000;

/// Control frames put back by each useful frame: a request opening a
/// stream, a non-empty DATA read or written, a HEADERS written. Envoy's
/// `max_inbound_window_update_frames_per_data_frame_sent` (10).
pub const REFILL_PER_USEFUL: u32 = 10;

/// Control frames a second an emptied budget earns back with time alone:
/// a PING a second for ever is 1 % of it.
pub const CONTROL_FRAMES_PER_SECOND: u32 = 100;

/// Streams reset by this side whose late frames are still tolerated (h2's
/// default, explicit): more are forgotten, not buffered.
pub const MAX_CONCURRENT_RESET_STREAMS: usize = 50;

/// Largest HTTP/2 frame a tunnel's peer may send (SETTINGS_MAX_FRAME_SIZE),
/// between atunnel and the gateway and on ingress CONNECT, on both ends
/// (the tunnel's `--gateway-max-frame-size`, the gateway's
/// `--max-frame-size`). It is also what one connection's read buffer may
/// grow to: h2 reads a whole frame before handing it on. h2 writes one DATA
/// frame per write to TLS, so at 16 KiB a 32 KiB relay buffer takes two
/// writes and two syscalls; 64 KiB frames take one, but measured no faster
/// (`atunnel-bench run --quick --scenarios egress-tcp`, 16 KiB on both
/// ends against 64 KiB, five rounds alternated: MB per tunnel CPU second
/// 0.92-1.29x round by round, 1.06x overall, inside this host's noise), so
/// RFC 9113's default stays.
pub const TUNNEL_MAX_FRAME_SIZE: u32 = 16 * 1024;

/// Largest HTTP/2 frame the gateway takes from atunnel (the gateway's
/// `--max-frame-size`): the upload direction's DATA frames. At 32 KiB a
/// relay chunk (one 32 KiB pooled buffer) goes out as one DATA frame,
/// sealed as two records and written with one call (rustls and
/// tokio-rustls when this was measured; `atunnel_tls::client` since), where
/// 16 KiB frames took a `writev` each. Per MiB up
/// (`atunnel-bench run --quick --scenarios cost`, unit egress-upload):
/// 3.96 M instructions and 121 system calls (65 `writev`) at 16 KiB, 3.76 M
/// and 94 (39 `writev`) at 32 KiB, 3.85 M and 94 at 64 KiB. The download
/// direction keeps [`TUNNEL_MAX_FRAME_SIZE`]: larger frames there cut its
/// system calls but raised its instruction count 10 % (docs/design.md,
/// "Where egress throughput goes"). What a gateway connection's read
/// buffer may grow to, per actor connection.
pub const GATEWAY_MAX_FRAME_SIZE: u32 = 32 * 1024;

/// Bytes h2 may queue to send on one tunnel stream, on the CONNECT servers
/// and the gateway client (h2's default, explicit). The relay sends only
/// what flow control granted (`H2Stream` waits for capacity, and h2 grants
/// at most the peer's window and this), so a peer that stops reading, or
/// advertises a zero window, makes a tunnel hold no more than this in h2.
pub const TUNNEL_MAX_SEND_BUF: usize = 400 * 1024;

/// The first frame an HTTP/2 client sends after the magic is SETTINGS, and
/// before the server's SETTINGS it may be no larger than the initial
/// SETTINGS_MAX_FRAME_SIZE (RFC 9113 §4.2): the preface reader refuses a
/// longer one rather than buffer it.
pub const MAX_FIRST_FRAME: usize = 16 * 1024;

// ---- HTTP/2 of ingress HTTPS (hyper) ----

/// Receive window per stream on both sides of the ingress proxy (the
/// router's connections and the h2c ones to actors): the most a peer that
/// stops reading can make atunnel hold of one stream (hyper's default is
/// 2 MiB).
pub const PROXY_STREAM_WINDOW: u32 = 256 * 1024;

/// Requests one router connection may carry at once (hyper's default,
/// 200, made explicit because [`PROXY_ROUTER_CONNECTION_WINDOW`] is sized
/// from it; RFC 9113 §6.5.2 recommends at least 100). Past it the router
/// waits for a stream to end or opens another connection.
pub const PROXY_ROUTER_MAX_CONCURRENT_STREAMS: u32 = 200;

/// Receive window per router connection: every stream's window, 200 x
/// 256 KiB = 50 MiB. A router multiplexes requests to many actors over one
/// connection, and a body an actor does not read keeps its bytes counted
/// against the connection's window as well as its stream's until they are
/// forwarded. A smaller window (1 MiB, four stalled bodies) let one actor's
/// unread bodies stop every other actor's on the connection
/// (`unread_bodies_of_one_actor_do_not_stall_another_on_the_same_connection`
/// in `crates/atunnel/tests/timing/ingress_isolation.rs`); at this size stalled
/// streams can never exhaust it, so each open stream always has its own
/// window. Unread bodies hold at most [`PROXY_STREAM_WINDOW`] per stream
/// and this per connection; a window is not memory unless used.
pub const PROXY_ROUTER_CONNECTION_WINDOW: u32 =
    PROXY_ROUTER_MAX_CONCURRENT_STREAMS * PROXY_STREAM_WINDOW;

/// Receive window per h2c connection to an actor (hyper's default is
/// 5 MiB): what the actor's answers may hold while routers do not read
/// them. Such a connection carries one actor's streams only (one client per
/// activation and port), so when stalled streams exhaust it they slow that
/// actor alone, and it stays small.
pub const PROXY_ACTOR_CONNECTION_WINDOW: u32 = 1024 * 1024;

/// Most header bytes one request or response of ingress HTTPS may carry,
/// from the router and from actors: 64 KiB, room for cookies and tokens
/// (nginx allows 4 x 8 KiB lines, hyper's client 16 KiB); h2's own default
/// is 16 MiB.
pub const PROXY_MAX_HEADER_LIST: u32 = 64 * 1024;

/// Bytes hyper may queue to send on one stream, toward the router and
/// toward actors: hyper polls a body only for capacity h2 granted, which is
/// at most the peer's window and this, so a peer that stops reading (or
/// grants a zero window) makes one stream hold no more. hyper's server
/// default; its client's is 1 MiB, lowered to this toward actors (a veth
/// round trip is microseconds, so a stream needs far less queued).
pub const PROXY_MAX_SEND_BUF: usize = 400 * 1024;

// ---- HTTP/1.1 of ingress HTTPS (hyper) ----

/// Most bytes one HTTP/1.1 connection of the ingress proxy buffers while
/// reading, toward the router and toward actors (hyper grows its read
/// buffer to ~400 KiB by default; bodies stream in chunks this size at no
/// cost in throughput on loopback and veth; 100 MiB each way grows the
/// heap by ~213 KB).
pub const PROXY_H1_MAX_BUFFER: usize = 64 * 1024;

// ---- HTTP/1.1 heads ----

/// Longest CONNECT request or response head accepted: a CONNECT head is a
/// line and a Host header; 8 KiB is what common servers allow for a whole
/// request head.
pub const MAX_HEAD: usize = 8 * 1024;

/// Most headers parsed in a CONNECT head (ours carry one).
pub const MAX_HEADERS: usize = 32;

/// Most bytes of a CONNECT refusal's body kept for the error message.
pub const MAX_REFUSAL_BODY: usize = 4 * 1024;

// ---- Timeouts ----

/// How long opening an egress tunnel may take, dial and TLS included
/// (10 s, the bound required of an egress open; no flag sets it yet). The
/// gateway answers within its 5 s authorization timeout; waiting longer
/// means it queued us.
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// A pooled gateway connection with no tunnel for this long is closed
/// (GOAWAY), so an actor that went quiet holds no gateway connection, its
/// TLS session and h2 state, on either end (the tunnel's
/// `--gateway-idle-timeout`; 90 s, as Go's and hyper's HTTP clients keep
/// an idle connection). The next tunnel dials a fresh one.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// A pooled gateway connection is pinged (HTTP/2 PING) this often, and
/// retired, its socket closed, if a ping is not answered within
/// [`POOL_PING_TIMEOUT`]: a peer that vanished without a FIN (a node gone,
/// a NAT entry expired) is found within 25 s instead of making every new
/// tunnel of the actor wait out the open timeout until the kernel gives up.
/// 15 s, the reference tunnel's keepalive; the tunnel's
/// `--gateway-ping-interval` (0: never).
pub const POOL_PING_INTERVAL: Duration = Duration::from_secs(15);

/// See [`POOL_PING_INTERVAL`]; the tunnel's `--gateway-ping-timeout`. As
/// long as the open timeout: a gateway that answers at all answers a PING
/// within a round trip.
pub const POOL_PING_TIMEOUT: Duration = OPEN_TIMEOUT;

/// The router's HTTP/2 connections are pinged this often by ingress HTTPS
/// (hyper's keepalive), and closed if a ping is not answered within
/// [`ROUTER_PING_TIMEOUT`]; `--router-ping-interval` (0: never). Longer
/// than the default hibernation (15 s), since a ping wakes a hibernated
/// connection: an idle router connection sleeps three quarters of the time,
/// and TCP keepalive, which wakes nothing, already finds a vanished router
/// within about 30 s.
pub const ROUTER_PING_INTERVAL: Duration = Duration::from_secs(60);

/// See [`ROUTER_PING_INTERVAL`]; `--router-ping-timeout`.
pub const ROUTER_PING_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a retired pooled connection may take to say GOAWAY and close
/// before its socket is dropped.
pub const POOL_CLOSE_WAIT: Duration = Duration::from_secs(5);

/// How long a refusal's body may take to arrive after its status. A gateway
/// writes the two back to back; a body without an end (no Content-Length
/// on a kept-alive HTTP/1.1 connection, no END_STREAM over h2) would
/// otherwise hold the refusal until the open timeout and turn it into a
/// timeout.
pub const REFUSAL_BODY_WAIT: Duration = Duration::from_millis(250);

/// How long a client of a CONNECT server has to finish TLS, and then to
/// send its CONNECT head (HTTP/1.1) or preface (HTTP/2). Ingress sets the
/// head and preface part with `header_read_timeout`.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an ingress client may take to send a request head, from its
/// first byte, or its HTTP/2 preface once TLS is done. An idle keep-alive
/// connection is not timed by it: it hibernates instead.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long dialing an actor's program inside its sandbox may take (5 s,
/// the bound required of it; a veth round trip is microseconds, so a slow
/// dial is a program that does not listen).
pub const ACTOR_DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the gateway's dial to a tunnel's destination may take; within
/// the client's [`OPEN_TIMEOUT`], so a slow destination is a 502 the
/// client can read rather than its own timeout.
pub const DESTINATION_DIAL_TIMEOUT: Duration = Duration::from_secs(5);
