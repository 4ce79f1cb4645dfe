//! gRPC through ingress into a real sandbox (root): a tonic server listens
//! on the actor's address inside the sandbox's runtime namespace, and a tonic
//! client with the router's identity reaches it through atunnel's HTTPS
//! listener, routed by `ate-target-actor` and `x-ate-target-port`.

use atunnel_support::prelude::*;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use atunnel::tunnel::Tunnel;
use atunnel_identity::identity::ActorRef;
use atunnel_sandbox::require_root;
use atunnel_sandbox::sandbox::ACTOR_ADDR;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataMap;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity, Server};
use tonic::{Code, Status};
use tonic_health::ServingStatus;
use tonic_health::pb::health_check_response::ServingStatus as WireStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::{HealthReporter, HealthService};

/// The service whose health the actor reports.
const SERVICE: &str = "atunnel.test.Echo";
/// How long any single step may take before the test fails instead of hanging.
const STEP: Duration = Duration::from_secs(20);

/// What the actor's gRPC server saw of one call.
#[derive(Debug)]
struct Seen {
    local: Option<SocketAddr>,
    remote: Option<SocketAddr>,
    metadata: MetadataMap,
}

struct Fixture {
    pki: IngressPki,
    tunnel: Arc<Tunnel>,
    actor: ActorRef,
    https: SocketAddr,
    reporter: HealthReporter,
    seen: mpsc::UnboundedReceiver<Seen>,
    server_stop: CancellationToken,
}

/// A tunnel serving ingress on loopback with a sandboxed actor `team-a/alpha`
/// whose program is a tonic health server on 169.254.17.2, port
/// [`GRPC_PORT`]; the actor is active (ingress routes to its sandbox; no
/// egress).
async fn fixture(test: &str) -> Fixture {
    require_root("gRPC through ingress into a sandbox");
    let pki = IngressPki::new();
    // A long drain, so a deactivation that returns promptly shows that the
    // in-flight streams were cancelled rather than waited out.
    let mut cfg = tunnel_with_ingress(&pki, &Pki::new(), Duration::from_secs(60));
    cfg.netns_prefix = format!("atnt-{}-{test}-", std::process::id());
    let tunnel = Tunnel::start(cfg).await.expect("tunnel starts");
    let (_, https, _) = tunnel.ingress().expect("tunnel serves ingress");
    let actor = actor("alpha");
    let sandbox = tunnel.serve_sandbox(&actor).await.expect("sandbox");

    // The actor's program: its listening socket is made inside the
    // sandbox's runtime namespace and keeps it while served from here.
    let listener = tunnel
        .executor()
        .run_in(&sandbox.runtime, || {
            let l = std::net::TcpListener::bind((ACTOR_ADDR, GRPC_PORT))?;
            l.set_nonblocking(true)?;
            Ok::<_, std::io::Error>(l)
        })
        .await
        .expect("namespace executor")
        .expect("bind inside the sandbox");
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");

    let (reporter, _) = tonic_health::server::health_reporter();
    reporter
        .set_service_status(SERVICE, ServingStatus::Serving)
        .await;
    let (tx, seen) = mpsc::unbounded_channel();
    let health = HealthServer::with_interceptor(
        HealthService::from_health_reporter(reporter.clone()),
        move |req: tonic::Request<()>| {
            let _ = tx.send(Seen {
                local: req.local_addr(),
                remote: req.remote_addr(),
                metadata: req.metadata().clone(),
            });
            Ok(req)
        },
    );
    let server_stop = CancellationToken::new();
    let stop = server_stop.clone();
    tokio::spawn(async move {
        Server::builder()
            .add_service(health)
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), stop.cancelled_owned())
            .await
            .expect("actor's gRPC server");
    });

    tunnel.activate(&actor, None).await.expect("activate");
    Fixture {
        pki,
        tunnel,
        actor,
        https,
        reporter,
        seen,
        server_stop,
    }
}

impl Fixture {
    async fn finish(self) {
        self.server_stop.cancel();
        self.tunnel
            .close_sandbox(&self.actor)
            .await
            .expect("close sandbox");
        assert!(
            self.tunnel.sandbox(&self.actor).is_none(),
            "sandbox still registered after close"
        );
        self.tunnel.shutdown().await;
    }
}

type Routed =
    InterceptedService<Channel, fn(tonic::Request<()>) -> Result<tonic::Request<()>, Status>>;

/// Adds the router's routing headers to every call.
fn route_to_alpha(mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
    let md = req.metadata_mut();
    md.insert("ate-target-actor", "team-a/alpha".parse().expect("value"));
    md.insert(
        "x-ate-target-port",
        GRPC_PORT.to_string().parse().expect("value"),
    );
    Ok(req)
}

/// A tonic client to atunnel's HTTPS listener as the router: trusts the pod
/// CA for `worker.test` and presents the router's certificate.
async fn router_client(pki: &IngressPki, https: SocketAddr) -> HealthClient<Routed> {
    let identity = Identity::from_pem(
        std::fs::read(pki.path("router.pem")).expect("router cert"),
        std::fs::read(pki.path("router.key")).expect("router key"),
    );
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(pki.pod_ca.cert_pem()))
        .domain_name(WORKER_NAME)
        .identity(identity);
    let channel = Channel::from_shared(format!("https://{https}"))
        .expect("uri")
        .tls_config(tls)
        .expect("tls config")
        .connect_timeout(STEP)
        .connect()
        .await
        .expect("TLS to ingress as the router");
    HealthClient::with_interceptor(channel, route_to_alpha as _)
}

fn check_request(service: &str) -> HealthCheckRequest {
    HealthCheckRequest {
        service: service.to_string(),
    }
}

async fn step<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(STEP, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {STEP:?}"))
}

fn status_of(resp: &HealthCheckResponse) -> WireStatus {
    WireStatus::try_from(resp.status).expect("known serving status")
}

/// A gRPC `grpc.health.v1.Health/Check` request as raw HTTP/2, for looking
/// at what the router itself would see.
fn raw_check(service: &str) -> http::Request<Full<Bytes>> {
    // HealthCheckRequest{service}: field 1, length-delimited.
    let mut msg = vec![0x0a, service.len() as u8];
    msg.extend_from_slice(service.as_bytes());
    // gRPC framing: uncompressed, 4-byte big-endian length.
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    frame.extend_from_slice(&msg);
    grpc_to_alpha(&format!(
        "https://{WORKER_NAME}/grpc.health.v1.Health/Check"
    ))
    .body(Full::new(Bytes::from(frame)))
    .expect("request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_unary_and_streaming_reach_a_tonic_server_inside_the_sandbox() {
    let mut f = fixture("grpc").await;
    let mut client = router_client(&f.pki, f.https).await;

    // Unary.
    let resp = step("check", client.check(check_request(SERVICE)))
        .await
        .expect("check through the tunnel");
    assert_eq!(status_of(resp.get_ref()), WireStatus::Serving);

    // The call reached the program inside the sandbox, dialed from the
    // sandbox's gateway side, with the routing headers consumed by atunnel.
    let seen = f.seen.recv().await.expect("the actor saw the call");
    assert_eq!(
        seen.local,
        Some(SocketAddr::from((ACTOR_ADDR, GRPC_PORT))),
        "{seen:?}"
    );
    assert_eq!(
        seen.remote.map(|a| a.ip()),
        Some(atunnel_sandbox::sandbox::GATEWAY_ADDR.into()),
        "{seen:?}"
    );
    assert!(seen.metadata.get("ate-target-actor").is_none(), "{seen:?}");
    assert!(seen.metadata.get("x-ate-target-port").is_none(), "{seen:?}");
    assert_eq!(
        seen.metadata
            .get("x-forwarded-proto")
            .map(|v| v.to_str().ok()),
        Some(Some("https")),
        "{seen:?}"
    );

    // An error status: tonic answers an unknown service with NOT_FOUND in
    // grpc-status, which must cross the proxy intact.
    let err = step(
        "check unknown",
        client.check(check_request("no.such.Service")),
    )
    .await
    .expect_err("unknown service");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert_eq!(err.message(), "service not registered");

    // A success's grpc-status travels in a trailers frame after the data
    // (tonic also fails a 200 without it); look at the raw h2 response.
    let mut conn = RouterConn::open(&f.pki, f.https, true).await;
    let resp = step("raw check", conn.send(raw_check(SERVICE)))
        .await
        .expect("raw response");
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers().get("grpc-status").is_none(),
        "a message response carries its status in trailers: {:?}",
        resp.headers()
    );
    let body = step("raw body", resp.into_body().collect())
        .await
        .expect("body");
    let trailers = body
        .trailers()
        .cloned()
        .expect("trailers reached the router");
    assert_eq!(trailers["grpc-status"], "0", "{trailers:?}");
    // HealthCheckResponse{status: SERVING (1)}, framed.
    assert_eq!(body.to_bytes().as_ref(), &[0, 0, 0, 0, 2, 0x08, 0x01]);

    // Server streaming: the current status, then a change made on the
    // server arrives through the tunnel on the open stream.
    let mut stream = step("watch", client.watch(check_request(SERVICE)))
        .await
        .expect("watch through the tunnel")
        .into_inner();
    let first = step("first watch message", stream.message())
        .await
        .expect("first status")
        .expect("stream open");
    assert_eq!(status_of(&first), WireStatus::Serving);
    f.reporter
        .set_service_status(SERVICE, ServingStatus::NotServing)
        .await;
    let update = step("watch update", stream.message())
        .await
        .expect("updated status")
        .expect("stream open");
    assert_eq!(status_of(&update), WireStatus::NotServing);
    f.reporter
        .set_service_status(SERVICE, ServingStatus::Serving)
        .await;
    let back = step("second watch update", stream.message())
        .await
        .expect("updated status")
        .expect("stream open");
    assert_eq!(status_of(&back), WireStatus::Serving);

    drop(stream);
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_to_an_inactive_actor_is_refused_with_421() {
    let f = fixture("stale").await;
    let mut client = router_client(&f.pki, f.https).await;
    let resp = step("check", client.check(check_request(SERVICE)))
        .await
        .expect("check while active");
    assert_eq!(status_of(resp.get_ref()), WireStatus::Serving);

    // A stream open across deactivation is cut, not left hanging, and
    // deactivation does not wait out the (60 s) drain for it.
    let mut stream = step("watch", client.watch(check_request(SERVICE)))
        .await
        .expect("watch while active")
        .into_inner();
    step("first watch message", stream.message())
        .await
        .expect("first status")
        .expect("stream open");
    step("deactivate", f.tunnel.deactivate(&f.actor))
        .await
        .expect("deactivate");
    let cut = step("watch after deactivation", stream.message())
        .await
        .expect_err("a stream to a deactivated actor must end with an error");
    // Cut by ingress resetting the stream (RST_STREAM INTERNAL_ERROR), not
    // ended with a status or by closing the connection.
    assert_eq!(cut.code(), Code::Internal, "{cut:?}");
    let mut source = std::error::Error::source(&cut);
    let h2_error = std::iter::from_fn(|| {
        let s = source?;
        source = s.source();
        Some(s)
    })
    .find_map(|s| s.downcast_ref::<h2::Error>());
    assert!(
        h2_error.is_some_and(|e| e.is_reset() && e.is_remote()),
        "{cut:?}"
    );

    // The same call on the same connection is now refused.
    let err = step(
        "check after deactivation",
        client.check(check_request(SERVICE)),
    )
    .await
    .expect_err("an inactive actor must not answer");
    // A gRPC status the client understands: UNAVAILABLE (retryable).
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert_eq!(err.message(), "Misdirected Request");
    assert_eq!(
        err.metadata()
            .get("x-ate-assignment-stale")
            .map(|v| v.to_str().ok()),
        Some(Some("true")),
        "the stale-assignment signal reaches the gRPC client: {err:?}"
    );

    // What the router sees: 421 and the stale-assignment signal.
    let mut conn = RouterConn::open(&f.pki, f.https, true).await;
    let resp = step("raw check", conn.send(raw_check(SERVICE)))
        .await
        .expect("raw response");
    assert_eq!(resp.status(), http::StatusCode::MISDIRECTED_REQUEST);
    assert_eq!(resp.headers()["x-ate-assignment-stale"], "true");
    assert_eq!(
        resp.headers()["grpc-status"],
        "14",
        "atunnel's refusal carries a gRPC status: {:?}",
        resp.headers()
    );

    // Activating again routes to the sandbox again.
    f.tunnel
        .activate(&f.actor, None)
        .await
        .expect("activate again");
    let resp = step(
        "check after reactivation",
        client.check(check_request(SERVICE)),
    )
    .await
    .expect("check after reactivation");
    assert_eq!(status_of(resp.get_ref()), WireStatus::Serving);

    f.finish().await;
}
