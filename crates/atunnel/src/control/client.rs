//! `atunnel ctl`: the control API's command-line client. One subcommand per
//! call; the answer is printed as one JSON object on stdout. A refused call
//! prints `{"code":"NOT_FOUND","message":"..."}` and exits 1.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use atunnel_process::FlagDuration;
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use super::proto;
use super::proto::control_client::ControlClient;

/// The client's own wait for an answer: a little over the server's default
/// call timeout, so the server's DEADLINE_EXCEEDED (which says more) comes
/// first.
pub const DEFAULT_CTL_TIMEOUT: Duration = Duration::from_secs(65);

#[derive(clap::Args, Clone, Debug)]
pub struct CtlArgs {
    /// The control API's Unix socket.
    #[arg(long, default_value = super::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// How long to wait for the answer ("65s").
    #[arg(long, default_value_t = FlagDuration(DEFAULT_CTL_TIMEOUT))]
    pub timeout: FlagDuration,
    #[command(subcommand)]
    pub call: Call,
}

/// An actor, as every lifecycle call names it.
#[derive(clap::Args, Clone, Debug)]
pub struct ActorArgs {
    #[arg(long)]
    pub atespace: String,
    #[arg(long)]
    pub name: String,
    #[arg(long)]
    pub uid: String,
}

impl From<ActorArgs> for proto::Actor {
    fn from(a: ActorArgs) -> Self {
        proto::Actor {
            atespace: a.atespace,
            name: a.name,
            uid: a.uid,
        }
    }
}

#[derive(clap::Subcommand, Clone, Debug)]
pub enum Call {
    /// Mint the actor's certificate and build its gateway client.
    PrepareEgress {
        #[command(flatten)]
        actor: ActorArgs,
        /// The egress gateway, host:port.
        #[arg(long)]
        gateway: String,
        /// The name its certificate must carry (default: the host of --gateway).
        #[arg(long)]
        gateway_name: Option<String>,
    },
    /// Build the actor's sandbox; prints the runtime namespace to start it in.
    ServeSandbox {
        #[command(flatten)]
        actor: ActorArgs,
    },
    /// Arm the actor's ingress and egress.
    Activate {
        #[command(flatten)]
        actor: ActorArgs,
    },
    /// Disarm the actor (idempotent).
    Deactivate {
        #[command(flatten)]
        actor: ActorArgs,
    },
    /// Remove the actor's sandbox and forget it (idempotent).
    CloseSandbox {
        #[command(flatten)]
        actor: ActorArgs,
    },
    /// One actor's status.
    Status {
        #[arg(long)]
        uid: String,
    },
    /// Every actor's status.
    List,
}

/// A client of the control API at `socket`. Connects on the first call.
pub fn connect(socket: &Path) -> ControlClient<Channel> {
    let socket = socket.to_path_buf();
    let dial = tower::service_fn(move |_: tonic::transport::Uri| {
        let socket = socket.clone();
        async move {
            let stream = tokio::net::UnixStream::connect(&socket)
                .await
                .map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("connecting to {}: {e}", socket.display()),
                    )
                })?;
            Ok::<_, std::io::Error>(TokioIo::new(stream))
        }
    });
    // The URI only fills :authority; the connector ignores it.
    let channel = Endpoint::from_static("http://atunnel").connect_with_connector_lazy(dial);
    ControlClient::new(channel)
}

/// Makes the call and prints its answer; the exit code says how it went.
pub async fn run(args: CtlArgs) -> ExitCode {
    let mut client = connect(&args.socket);
    let call = call(&mut client, args.call);
    let answer = match tokio::time::timeout(args.timeout.0, call).await {
        Ok(answer) => answer.map_err(closed_by_server),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "no answer within {}",
            args.timeout
        ))),
    };
    match answer {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(status) => {
            let error = serde_json::json!({
                "code": code_name(status.code()),
                "message": status.message(),
            });
            println!("{error}");
            ExitCode::from(1)
        }
    }
}

async fn call(client: &mut ControlClient<Channel>, call: Call) -> Result<String, Status> {
    fn json<T: serde::Serialize>(r: tonic::Response<T>) -> Result<String, Status> {
        serde_json::to_string(r.get_ref()).map_err(|e| Status::internal(e.to_string()))
    }
    match call {
        Call::PrepareEgress {
            actor,
            gateway,
            gateway_name,
        } => json(
            client
                .prepare_egress(proto::PrepareEgressRequest {
                    actor: Some(actor.into()),
                    gateway: Some(proto::Gateway {
                        address: gateway,
                        server_name: gateway_name.unwrap_or_default(),
                    }),
                })
                .await?,
        ),
        Call::ServeSandbox { actor } => json(
            client
                .serve_sandbox(proto::ServeSandboxRequest {
                    actor: Some(actor.into()),
                })
                .await?,
        ),
        Call::Activate { actor } => json(
            client
                .activate(proto::ActivateRequest {
                    actor: Some(actor.into()),
                })
                .await?,
        ),
        Call::Deactivate { actor } => json(
            client
                .deactivate(proto::DeactivateRequest {
                    actor: Some(actor.into()),
                })
                .await?,
        ),
        Call::CloseSandbox { actor } => json(
            client
                .close_sandbox(proto::CloseSandboxRequest {
                    actor: Some(actor.into()),
                })
                .await?,
        ),
        Call::Status { uid } => json(client.status(proto::StatusRequest { uid }).await?),
        Call::List => json(client.list(proto::ListRequest {}).await?),
    }
}

/// A call whose connection failed says why it may have: the daemon closes
/// a peer whose uid is not allowed at accept, before any answer, so the
/// client sees only a transport error (UNKNOWN, UNAVAILABLE or CANCELLED,
/// by when it saw the close).
fn closed_by_server(status: Status) -> Status {
    use std::error::Error;
    let transport = std::iter::successors(status.source(), |e| (*e).source())
        .any(|e| e.is::<tonic::transport::Error>());
    if !transport {
        return status;
    }
    let uid = nix::unistd::geteuid();
    Status::unavailable(format!(
        "{}: the connection failed or was closed; atunnel closes a peer whose uid ({uid}) is not in its --control-allowed-uid",
        status.message()
    ))
}

/// The phase by its proto name (`"PHASE_ACTIVE"`), not its number.
pub(crate) fn phase_name<S: serde::Serializer>(phase: &i32, s: S) -> Result<S::Ok, S::Error> {
    match proto::Phase::try_from(*phase) {
        Ok(p) => s.serialize_str(p.as_str_name()),
        Err(_) => s.serialize_i32(*phase),
    }
}

/// A status code's canonical name, as the gRPC spec spells it.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}
