//! The control API's calls over a [`Tunnel`], and the lifecycle rules the
//! proto states: what each call needs, what it answers when that is
//! missing, and that a refused call changes nothing.
//!
//! The registry here is the API's view of each actor (phase, prepared
//! egress, sandbox); every change to an actor goes through it, one call per
//! actor at a time (an async lock per actor, so a slow mint or drain of one
//! actor never holds up another's calls). Each operation runs in a task of
//! its own: a caller that gives up (the call timeout, a dropped connection)
//! cannot cancel it halfway, which would leave the registry and the tunnel
//! telling different stories.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use atunnel_identity::credential::ActorCredential;
use atunnel_identity::identity::{ActorRef, IdentityError};
use tokio::sync::OwnedMutexGuard;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status};

use super::proto;
use super::proto::control_server::Control;
use crate::egress::{ActorEgress, ActorEgressStats, EgressError};
use crate::tunnel::{GatewaySpec, Tunnel, TunnelError};

/// The longest namespace name (a file under /run/netns: NAME_MAX).
const MAX_NETNS_NAME: usize = 255;

/// What the API knows of one actor. Exists while the actor has a prepared
/// egress or a sandbox; `gone` once removed from the registry, so a call
/// that waited for its lock looks again.
struct Entry {
    actor: ActorRef,
    prepared: Option<ActorEgress>,
    /// The gateway of the prepared or the active egress.
    gateway: Option<String>,
    /// The prepared or the active certificate, for its expiry.
    credential: Option<Arc<ActorCredential>>,
    /// Whether the tunnel serves its sandbox (whose record, with the
    /// namespace names, is the tunnel's: not copied here).
    sandboxed: bool,
    active: bool,
    gone: bool,
}

impl Entry {
    fn new(actor: ActorRef) -> Self {
        Self {
            actor,
            prepared: None,
            gateway: None,
            credential: None,
            sandboxed: false,
            active: false,
            gone: false,
        }
    }

    fn is_empty(&self) -> bool {
        self.prepared.is_none() && !self.sandboxed && !self.active
    }
}

type Slot = Arc<tokio::sync::Mutex<Entry>>;

struct Inner {
    tunnel: Arc<Tunnel>,
    netns_prefix: String,
    call_timeout: Duration,
    actors: Mutex<BTreeMap<String, Slot>>,
    /// Active actors by (atespace, name): one uid each, as ingress routes.
    active_names: Mutex<HashMap<(String, String), String>>,
    /// The operations, so shutdown can wait for them.
    tasks: TaskTracker,
}

/// The `atunnel.control.v1.Control` service over one tunnel.
#[derive(Clone)]
pub struct ControlService(Arc<Inner>);

impl ControlService {
    /// `netns_prefix` is the tunnel's (`TunnelConfig::netns_prefix`): a uid
    /// is refused if its namespace names would not fit.
    pub fn new(tunnel: Arc<Tunnel>, netns_prefix: &str, call_timeout: Duration) -> Self {
        Self(Arc::new(Inner {
            tunnel,
            netns_prefix: netns_prefix.to_string(),
            call_timeout,
            actors: Mutex::new(BTreeMap::new()),
            active_names: Mutex::new(HashMap::new()),
            tasks: TaskTracker::new(),
        }))
    }

    pub fn tunnel(&self) -> &Arc<Tunnel> {
        &self.0.tunnel
    }

    /// Waits for every operation started to end (each is bounded by the
    /// tunnel's own timeouts); no new ones start once this is called.
    pub async fn wait(&self) {
        self.0.tasks.close();
        self.0.tasks.wait().await;
    }

    /// Runs `op` to its end in a task of its own; the caller waits up to the
    /// call timeout.
    async fn run<T, F>(&self, call: &'static str, op: F) -> Result<Response<T>, Status>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, Status>> + Send + 'static,
    {
        if self.0.tasks.is_closed() {
            return Err(Status::unavailable("atunnel is shutting down"));
        }
        let task = self.0.tasks.spawn(op);
        match tokio::time::timeout(self.0.call_timeout, task).await {
            Ok(Ok(result)) => result.map(Response::new),
            Ok(Err(e)) => Err(Status::internal(format!("{call} failed: {e}"))),
            Err(_) => Err(Status::deadline_exceeded(format!(
                "{call} took longer than {:?}; it goes on, and its effect shows in Status",
                self.0.call_timeout
            ))),
        }
    }
}

impl Inner {
    /// The actor's entry, locked; with `create`, a new empty one if none.
    async fn lock(&self, uid: &str, create: Option<&ActorRef>) -> Option<OwnedMutexGuard<Entry>> {
        loop {
            let slot = {
                let mut actors = self.actors.lock().expect("actors lock poisoned");
                match (actors.get(uid), create) {
                    (Some(slot), _) => slot.clone(),
                    (None, Some(actor)) => actors
                        .entry(uid.to_string())
                        .or_insert_with(|| {
                            Arc::new(tokio::sync::Mutex::new(Entry::new(actor.clone())))
                        })
                        .clone(),
                    (None, None) => return None,
                }
            };
            let entry = slot.lock_owned().await;
            if !entry.gone {
                return Some(entry);
            }
        }
    }

    /// Removes the entry from the registry if it holds nothing (a failed
    /// first call, a close).
    fn forget_if_empty(&self, entry: &mut Entry) {
        if entry.is_empty() {
            entry.gone = true;
            self.actors
                .lock()
                .expect("actors lock poisoned")
                .remove(&entry.actor.uid);
        }
    }

    fn status(&self, entry: &Entry) -> proto::ActorStatus {
        let stats = self.tunnel.egress().actor_stat(&entry.actor.uid);
        status_of(&self.tunnel, entry, stats.as_ref())
    }

    fn release_name(&self, actor: &ActorRef) {
        let mut names = self.active_names.lock().expect("names lock poisoned");
        let key = (actor.atespace.clone(), actor.name.clone());
        if names.get(&key) == Some(&actor.uid) {
            names.remove(&key);
        }
    }

    async fn prepare_egress(
        &self,
        actor: ActorRef,
        gateway: GatewaySpec,
    ) -> Result<proto::PrepareEgressResponse, Status> {
        let mut entry = self
            .lock(&actor.uid, Some(&actor))
            .await
            .expect("created when missing");
        same_actor(&entry, &actor)?;
        if entry.active {
            return Err(Status::failed_precondition(format!(
                "actor {actor} (uid {}) is active; deactivate it before preparing its next egress",
                actor.uid
            )));
        }
        let prepared = match self.tunnel.prepare_egress(&actor, &gateway).await {
            Ok(p) => p,
            Err(e) => {
                self.forget_if_empty(&mut entry);
                return Err(prepare_status(e));
            }
        };
        entry.credential = Some(prepared.credential().clone());
        entry.gateway = Some(gateway.address);
        let replaced = entry.prepared.replace(prepared).is_some();
        Ok(proto::PrepareEgressResponse {
            replaced,
            status: Some(self.status(&entry)),
        })
    }

    async fn serve_sandbox(&self, actor: ActorRef) -> Result<proto::ServeSandboxResponse, Status> {
        let mut entry = self
            .lock(&actor.uid, Some(&actor))
            .await
            .expect("created when missing");
        same_actor(&entry, &actor)?;
        let created = !entry.sandboxed;
        let sandbox = if created {
            match self.tunnel.serve_sandbox(&actor).await {
                Ok(sandbox) => {
                    entry.sandboxed = true;
                    Some(sandbox)
                }
                Err(e) => {
                    self.forget_if_empty(&mut entry);
                    return Err(Status::internal(e.to_string()));
                }
            }
        } else {
            self.tunnel.sandbox(&actor)
        };
        let runtime_netns = sandbox
            .as_ref()
            .map(|s| s.name().to_string())
            .unwrap_or_default();
        let resolv_conf = sandbox
            .as_ref()
            .filter(|_| self.tunnel.serves_dns())
            .map(|s| s.resolv_conf())
            .unwrap_or_default();
        Ok(proto::ServeSandboxResponse {
            runtime_netns,
            created,
            status: Some(self.status(&entry)),
            resolv_conf,
        })
    }

    async fn activate(&self, actor: ActorRef) -> Result<proto::ActivateResponse, Status> {
        let Some(mut entry) = self.lock(&actor.uid, None).await else {
            return Err(Status::not_found(format!(
                "actor uid {} is not known: prepare its egress and serve its sandbox first",
                actor.uid
            )));
        };
        same_actor(&entry, &actor)?;
        if entry.active {
            return Err(Status::failed_precondition(format!(
                "actor {actor} (uid {}) is already active",
                actor.uid
            )));
        }
        if !entry.sandboxed {
            return Err(Status::failed_precondition(format!(
                "actor {actor} (uid {}) has no sandbox: serve its sandbox first",
                actor.uid
            )));
        }
        if entry.prepared.is_none() {
            return Err(Status::failed_precondition(format!(
                "actor {actor} (uid {}) has no prepared egress: every activation takes a freshly prepared one",
                actor.uid
            )));
        }
        {
            let mut names = self.active_names.lock().expect("names lock poisoned");
            let key = (actor.atespace.clone(), actor.name.clone());
            if let Some(other) = names.get(&key) {
                return Err(Status::failed_precondition(format!(
                    "actor {actor} is active with uid {other}; deactivate that one first"
                )));
            }
            names.insert(key, actor.uid.clone());
        }
        let egress = entry.prepared.take();
        if let Err(e) = self.tunnel.activate(&actor, egress).await {
            // The tunnel refused before arming anything, but the prepared
            // egress went with the call: the actor needs a new one.
            self.release_name(&actor);
            entry.credential = None;
            entry.gateway = None;
            return Err(Status::failed_precondition(format!(
                "{e} (its prepared egress is spent: prepare again)"
            )));
        }
        entry.active = true;
        Ok(proto::ActivateResponse {
            status: Some(self.status(&entry)),
        })
    }

    async fn deactivate(&self, actor: ActorRef) -> Result<proto::DeactivateResponse, Status> {
        let Some(mut entry) = self.lock(&actor.uid, None).await else {
            return Ok(proto::DeactivateResponse {
                was_active: false,
                drained: true,
                status: None,
            });
        };
        same_actor(&entry, &actor)?;
        let was_active = entry.active;
        let mut drained = true;
        if was_active {
            if let Err(e) = self.tunnel.deactivate(&actor).await {
                tracing::warn!(%actor, uid = actor.uid, error = %e, "deactivating");
                drained = false;
            }
            entry.active = false;
            entry.credential = None;
            entry.gateway = None;
            self.release_name(&actor);
        }
        Ok(proto::DeactivateResponse {
            was_active,
            drained,
            status: Some(self.status(&entry)),
        })
    }

    async fn close_sandbox(&self, actor: ActorRef) -> Result<proto::CloseSandboxResponse, Status> {
        let Some(mut entry) = self.lock(&actor.uid, None).await else {
            return Ok(proto::CloseSandboxResponse {
                existed: false,
                drained: true,
            });
        };
        same_actor(&entry, &actor)?;
        let mut result = Ok(true);
        if entry.sandboxed {
            result = match self.tunnel.close_sandbox(&actor).await {
                Ok(()) => Ok(true),
                Err(TunnelError::Egress(e @ EgressError::DrainTimeout { .. })) => {
                    tracing::warn!(%actor, uid = actor.uid, error = %e, "closing");
                    Ok(false)
                }
                Err(e) => Err(Status::internal(format!(
                    "{e} (the actor is forgotten even so)"
                ))),
            };
        }
        // The tunnel has forgotten the actor whatever the outcome; so do we.
        self.release_name(&actor);
        entry.sandboxed = false;
        entry.prepared = None;
        entry.active = false;
        self.forget_if_empty(&mut entry);
        result.map(|drained| proto::CloseSandboxResponse {
            existed: true,
            drained,
        })
    }

    async fn get(&self, uid: String) -> Result<proto::StatusResponse, Status> {
        let Some(entry) = self.lock(&uid, None).await else {
            return Err(Status::not_found(format!("actor uid {uid} is not known")));
        };
        Ok(proto::StatusResponse {
            status: Some(self.status(&entry)),
        })
    }

    async fn list(&self) -> Result<proto::ListResponse, Status> {
        let slots: Vec<Slot> = self
            .actors
            .lock()
            .expect("actors lock poisoned")
            .values()
            .cloned()
            .collect();
        // By uid, so listing n actors is not n scans of n.
        let stats: std::collections::HashMap<String, _> = self
            .tunnel
            .egress()
            .actor_stats()
            .into_iter()
            .map(|s| (s.actor.clone(), s))
            .collect();
        let mut actors = Vec::with_capacity(slots.len());
        for slot in slots {
            let entry = slot.lock().await;
            if entry.gone {
                continue;
            }
            let s = stats.get(&entry.actor.uid);
            actors.push(status_of(&self.tunnel, &entry, s));
        }
        Ok(proto::ListResponse { actors })
    }
}

fn status_of(
    tunnel: &Tunnel,
    entry: &Entry,
    stats: Option<&ActorEgressStats>,
) -> proto::ActorStatus {
    let a = &entry.actor;
    let phase = if entry.active {
        proto::Phase::Active
    } else if entry.sandboxed {
        proto::Phase::Sandboxed
    } else {
        proto::Phase::Prepared
    };
    let sandbox = entry.sandboxed.then(|| tunnel.sandbox(a)).flatten();
    let expires = entry
        .credential
        .as_ref()
        .and_then(|c| c.expires_at())
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let ingress_routed = tunnel
        .ingress()
        .and_then(|(ingress, _, _)| ingress.route(&a.atespace, &a.name))
        .is_some_and(|route| route.uid() == a.uid);
    let egress = stats.map(|s| proto::EgressCounts {
        tunnels: s.tunnels as u64,
        opening: s.opening as u64,
        gateway_connections: s.gateway_connections as u64,
        refused_total: s.refused_tunnels_total + s.refused_opening_total + s.refused_overload_total,
    });
    proto::ActorStatus {
        actor: Some(proto::Actor {
            atespace: a.atespace.clone(),
            name: a.name.clone(),
            uid: a.uid.clone(),
        }),
        phase: phase as i32,
        egress_prepared: entry.prepared.is_some(),
        gateway_address: entry.gateway.clone().unwrap_or_default(),
        runtime_netns: sandbox
            .as_ref()
            .map(|s| s.runtime.name().to_string())
            .unwrap_or_default(),
        gateway_netns: sandbox
            .as_ref()
            .map(|s| s.gateway.name().to_string())
            .unwrap_or_default(),
        certificate_expires_unix_ms: expires,
        ingress_routed,
        egress: Some(egress.unwrap_or_default()),
    }
}

/// A uid names one actor: the same uid under another atespace/name is
/// refused rather than taken for a rename.
fn same_actor(entry: &Entry, actor: &ActorRef) -> Result<(), Status> {
    if entry.actor == *actor {
        return Ok(());
    }
    Err(Status::failed_precondition(format!(
        "actor uid {} belongs to {}, not {actor}",
        actor.uid, entry.actor
    )))
}

fn prepare_status(e: TunnelError) -> Status {
    match e {
        TunnelError::Gateway { .. } => Status::invalid_argument(format!("gateway.address: {e}")),
        TunnelError::Egress(EgressError::Credential { .. }) => Status::unavailable(e.to_string()),
        e => Status::internal(e.to_string()),
    }
}

/// The request's actor, validated; INVALID_ARGUMENT names the field.
fn actor_of(actor: Option<proto::Actor>, netns_prefix: &str) -> Result<ActorRef, Status> {
    let Some(a) = actor else {
        return Err(Status::invalid_argument("actor: required"));
    };
    let actor = ActorRef::new(a.atespace, a.name, a.uid).map_err(|e| {
        let field = match &e {
            IdentityError::InvalidName {
                field: "atespace", ..
            } => "actor.atespace",
            IdentityError::InvalidName { .. } => "actor.name",
            _ => "actor.uid",
        };
        Status::invalid_argument(format!("{field}: {e}"))
    })?;
    // The uid names the sandbox's namespaces, files under /run/netns;
    // `ActorRef` has kept it to characters a file name carries.
    let uid = &actor.uid;
    let longest = netns_prefix.len() + uid.len() + "-at".len();
    if longest > MAX_NETNS_NAME {
        return Err(Status::invalid_argument(format!(
            "actor.uid: invalid actor uid {uid:?}: too long: its namespace name would be {longest} bytes, over {MAX_NETNS_NAME}"
        )));
    }
    Ok(actor)
}

fn gateway_of(gateway: Option<proto::Gateway>) -> Result<GatewaySpec, Status> {
    let Some(g) = gateway else {
        return Err(Status::invalid_argument("gateway: required"));
    };
    if g.address.is_empty() {
        return Err(Status::invalid_argument("gateway.address: required"));
    }
    let server_name = if g.server_name.is_empty() {
        None
    } else {
        rustls::pki_types::ServerName::try_from(g.server_name.as_str()).map_err(|e| {
            Status::invalid_argument(format!(
                "gateway.server_name: {:?} is not a server name: {e}",
                g.server_name
            ))
        })?;
        Some(g.server_name)
    };
    Ok(GatewaySpec {
        address: g.address,
        server_name,
    })
}

#[tonic::async_trait]
impl Control for ControlService {
    async fn prepare_egress(
        &self,
        request: Request<proto::PrepareEgressRequest>,
    ) -> Result<Response<proto::PrepareEgressResponse>, Status> {
        let r = request.into_inner();
        let actor = actor_of(r.actor, &self.0.netns_prefix)?;
        let gateway = gateway_of(r.gateway)?;
        let inner = self.0.clone();
        self.run("PrepareEgress", async move {
            inner.prepare_egress(actor, gateway).await
        })
        .await
    }

    async fn serve_sandbox(
        &self,
        request: Request<proto::ServeSandboxRequest>,
    ) -> Result<Response<proto::ServeSandboxResponse>, Status> {
        let actor = actor_of(request.into_inner().actor, &self.0.netns_prefix)?;
        let inner = self.0.clone();
        self.run(
            "ServeSandbox",
            async move { inner.serve_sandbox(actor).await },
        )
        .await
    }

    async fn activate(
        &self,
        request: Request<proto::ActivateRequest>,
    ) -> Result<Response<proto::ActivateResponse>, Status> {
        let actor = actor_of(request.into_inner().actor, &self.0.netns_prefix)?;
        let inner = self.0.clone();
        self.run("Activate", async move { inner.activate(actor).await })
            .await
    }

    async fn deactivate(
        &self,
        request: Request<proto::DeactivateRequest>,
    ) -> Result<Response<proto::DeactivateResponse>, Status> {
        let actor = actor_of(request.into_inner().actor, &self.0.netns_prefix)?;
        let inner = self.0.clone();
        self.run("Deactivate", async move { inner.deactivate(actor).await })
            .await
    }

    async fn close_sandbox(
        &self,
        request: Request<proto::CloseSandboxRequest>,
    ) -> Result<Response<proto::CloseSandboxResponse>, Status> {
        let actor = actor_of(request.into_inner().actor, &self.0.netns_prefix)?;
        let inner = self.0.clone();
        self.run(
            "CloseSandbox",
            async move { inner.close_sandbox(actor).await },
        )
        .await
    }

    async fn status(
        &self,
        request: Request<proto::StatusRequest>,
    ) -> Result<Response<proto::StatusResponse>, Status> {
        let uid = request.into_inner().uid;
        if uid.is_empty() {
            return Err(Status::invalid_argument("uid: required"));
        }
        let inner = self.0.clone();
        self.run("Status", async move { inner.get(uid).await })
            .await
    }

    async fn list(
        &self,
        _request: Request<proto::ListRequest>,
    ) -> Result<Response<proto::ListResponse>, Status> {
        let inner = self.0.clone();
        self.run("List", async move { inner.list().await }).await
    }
}
