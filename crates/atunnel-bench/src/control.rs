//! atunnel's control API as the bench calls it: the worker bringing its
//! actors up and down, and scenarios that bring actors of their own. Each
//! call is bounded, and a refusal names the call, the actor and the status.

use std::path::Path;
use std::time::Duration;

use atunnel::control::proto;
use atunnel::control::proto::control_client::ControlClient;

type BoxError = atunnel_process::BoxError;

/// The longest the bench waits for one call: a little over atunnel's own
/// call timeout, whose DEADLINE_EXCEEDED says more.
const CALL_TIMEOUT: Duration = Duration::from_secs(65);

/// A client of atunnel's control API, with the gateway every actor's egress
/// is prepared for.
pub struct Control {
    client: ControlClient<tonic::transport::Channel>,
    gateway: proto::Gateway,
}

/// "`call` of `atespace/name`", for errors.
fn of(call: &str, actor: &proto::Actor) -> String {
    format!("{call} of {}/{}", actor.atespace, actor.name)
}

/// A call's answer, bounded by [`CALL_TIMEOUT`]; `who` names it in errors.
async fn call<T>(
    who: String,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, BoxError> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(answer)) => Ok(answer.into_inner()),
        Ok(Err(status)) => Err(format!(
            "atunnel refused {who}: {} {}",
            atunnel::control::client::code_name(status.code()),
            status.message()
        )
        .into()),
        Err(_) => Err(format!("atunnel did not answer {who} within {CALL_TIMEOUT:?}").into()),
    }
}

impl Control {
    /// Connects (on the first call) to the control socket at `socket`.
    pub fn connect(socket: &Path, gateway: proto::Gateway) -> Self {
        Self {
            client: atunnel::control::client::connect(socket),
            gateway,
        }
    }

    /// Prepares `actor`'s egress and activates it (its sandbox must be
    /// served).
    pub async fn activate(&mut self, actor: &proto::Actor) -> Result<(), BoxError> {
        let gateway = Some(self.gateway.clone());
        let request = proto::PrepareEgressRequest {
            actor: Some(actor.clone()),
            gateway,
        };
        call(
            of("PrepareEgress", actor),
            self.client.prepare_egress(request),
        )
        .await?;
        let request = proto::ActivateRequest {
            actor: Some(actor.clone()),
        };
        call(of("Activate", actor), self.client.activate(request)).await?;
        Ok(())
    }

    /// Brings `actor` up as a worker does: its sandbox, then its egress,
    /// then activation. Returns its runtime namespace.
    pub async fn bring_up(&mut self, actor: &proto::Actor) -> Result<String, BoxError> {
        let request = proto::ServeSandboxRequest {
            actor: Some(actor.clone()),
        };
        let served = call(
            of("ServeSandbox", actor),
            self.client.serve_sandbox(request),
        )
        .await?;
        self.activate(actor).await?;
        Ok(served.runtime_netns)
    }

    pub async fn deactivate(&mut self, actor: &proto::Actor) -> Result<(), BoxError> {
        let request = proto::DeactivateRequest {
            actor: Some(actor.clone()),
        };
        call(of("Deactivate", actor), self.client.deactivate(request)).await?;
        Ok(())
    }

    /// Removes `actor`'s sandbox and has atunnel forget it (idempotent).
    pub async fn close_sandbox(&mut self, actor: &proto::Actor) -> Result<(), BoxError> {
        let request = proto::CloseSandboxRequest {
            actor: Some(actor.clone()),
        };
        call(
            of("CloseSandbox", actor),
            self.client.close_sandbox(request),
        )
        .await?;
        Ok(())
    }

    /// Every actor atunnel knows.
    pub async fn list(&mut self) -> Result<Vec<proto::ActorStatus>, BoxError> {
        let listed = call("List".into(), self.client.list(proto::ListRequest {})).await?;
        Ok(listed.actors)
    }
}
