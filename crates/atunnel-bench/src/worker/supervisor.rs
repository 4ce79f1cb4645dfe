//! The supervisor: atunnel (or a peer in its place) in its cgroup,
//! restarted when it dies, its actors and sandboxes, and what each request
//! asks of them.

use super::*;

/// A request that changes what runs, for the supervisor.
pub(super) struct Command {
    pub(super) request: Request,
    pub(super) reply: oneshot::Sender<Result<WorkerStatus, String>>,
}

/// Owns atunnel, the actors and the cgroup; the only writer of the status.
pub(super) struct Supervisor {
    pub(super) args: WorkerArgs,
    pub(super) pki: PkiFiles,
    pub(super) cgroup: Cgroup,
    pub(super) tunnel: Option<Role>,
    /// The running atunnel's control API.
    pub(super) control: Option<Control>,
    pub(super) actors: Option<Role>,
    /// Makes the peers' sandboxes (started on first use).
    pub(super) exec: Option<NsExecutor>,
    /// The sandboxes built for a peer (atunnel builds its own).
    pub(super) peer_sandboxes: Vec<SandboxNetwork>,
    pub(super) status: WorkerStatus,
    pub(super) publish: watch::Sender<WorkerStatus>,
}

/// What woke the supervisor.
pub(super) enum Wake {
    Stop,
    TunnelExited(std::io::Result<std::process::ExitStatus>),
    ActorsExited(std::io::Result<std::process::ExitStatus>),
    Command(Command),
}

/// Waits for `role` to exit; forever if there is none.
pub(super) async fn exited(role: &mut Option<Role>) -> std::io::Result<std::process::ExitStatus> {
    match role {
        Some(r) => r.child.wait().await,
        None => std::future::pending().await,
    }
}

impl Supervisor {
    pub(super) async fn supervise(
        &mut self,
        mut commands: mpsc::Receiver<Command>,
        cancel: &CancellationToken,
    ) {
        loop {
            let wake = tokio::select! {
                biased;
                _ = cancel.cancelled() => Wake::Stop,
                s = exited(&mut self.tunnel) => Wake::TunnelExited(s),
                s = exited(&mut self.actors) => Wake::ActorsExited(s),
                Some(c) = commands.recv() => Wake::Command(c),
            };
            let restart = match wake {
                Wake::Stop => return,
                Wake::TunnelExited(status) => {
                    self.tunnel = None;
                    let ooms = match self.cgroup.sample() {
                        Ok(s) => s.oom_kills.to_string(),
                        Err(e) => format!("unknown ({e})"),
                    };
                    self.record(format!(
                        "atunnel exited ({}); cgroup OOM kills so far: {ooms}; restarting",
                        describe(&status)
                    ));
                    self.status.deaths += 1;
                    None
                }
                Wake::ActorsExited(status) => {
                    // The actors' programs are the far end: replace them
                    // with atunnel so every sandbox serves again.
                    self.actors = None;
                    self.record(format!(
                        "actors exited ({}); restarting atunnel and the actors",
                        describe(&status)
                    ));
                    None
                }
                Wake::Command(command) => match &command.request {
                    Request::Restart {
                        tunnel_args,
                        contender,
                        wrapper,
                    } => {
                        self.status.restarts += 1;
                        self.status.extra_args = tunnel_args.clone();
                        self.status.contender = *contender;
                        self.status.wrapper = wrapper.clone();
                        Some(command)
                    }
                    Request::Deactivate { actor } | Request::Activate { actor } => {
                        // One actor's lifecycle: atunnel and the rest run on.
                        let activate = matches!(command.request, Request::Activate { .. });
                        let result = self.lifecycle(*actor, activate).await;
                        self.publish();
                        let _ = command.reply.send(
                            result
                                .map(|()| self.status.clone())
                                .map_err(|e| e.to_string()),
                        );
                        continue;
                    }
                    Request::Status { .. } => {
                        let _ = command.reply.send(Ok(self.status.clone()));
                        continue;
                    }
                },
            };
            let done = tokio::select! {
                _ = cancel.cancelled() => None,
                r = self.replace() => Some(r),
            };
            let Some(result) = done else {
                if let Some(command) = restart {
                    let _ = command.reply.send(Err("the worker is stopping".into()));
                }
                return;
            };
            if let Some(command) = restart {
                let _ = command.reply.send(
                    result
                        .map(|()| self.status.clone())
                        .map_err(|e| e.to_string()),
                );
            }
        }
    }

    /// Deactivates or (re)activates actor number `i` over the control API.
    pub(super) async fn lifecycle(
        &mut self,
        i: usize,
        activate: bool,
    ) -> Result<(), atunnel_process::BoxError> {
        if i >= self.args.actors {
            return Err(format!("no actor {i}: the worker hosts {}", self.args.actors).into());
        }
        if let Some(peer) = self.status.contender.peer() {
            return Err(format!(
                "{} runs in atunnel's place: no actor lifecycle",
                peer.name()
            )
            .into());
        }
        let control = self.control.as_mut().ok_or("atunnel is not running")?;
        if activate {
            control.activate(&actor(i)).await?;
            self.status.inactive_actors.remove(&i);
        } else {
            control.deactivate(&actor(i)).await?;
            self.status.inactive_actors.insert(i);
        }
        Ok(())
    }

    pub(super) fn record(&mut self, event: String) {
        // Shown with the load generator's progress (stderr is shared).
        eprintln!("         {event}");
        self.status.events.push(event);
    }

    pub(super) fn publish(&mut self) {
        self.status.tunnel_pid = self.tunnel.as_ref().and_then(|t| t.pid());
        self.status.actors_pid = self.actors.as_ref().and_then(|t| t.pid());
        self.publish.send_replace(self.status.clone());
    }

    /// Stops what runs and starts a fresh atunnel and actors.
    pub(super) async fn replace(&mut self) -> Result<(), atunnel_process::BoxError> {
        self.status.state = TunnelState::Starting;
        self.publish();
        self.stop_children().await;
        let result = self.start().await;
        self.publish();
        result
    }

    /// Starts atunnel inside its cgroup (moved there before it execs, so it
    /// is accounted from its first allocation), then the actors in its
    /// sandboxes. Sets the state either way.
    pub(super) async fn start(&mut self) -> Result<(), atunnel_process::BoxError> {
        let result = self.start_roles().await;
        match &result {
            Ok(()) => {
                self.status.state = TunnelState::Running;
                self.status.error = None;
            }
            Err(e) => {
                self.status.state = TunnelState::Failed;
                self.status.error = Some(e.to_string());
                eprintln!("atunnel-bench worker: starting atunnel: {e}");
                self.stop_children().await;
            }
        }
        result
    }

    pub(super) async fn start_roles(&mut self) -> Result<(), atunnel_process::BoxError> {
        if let Some(peer) = self.status.contender.peer() {
            return self.start_peer(peer).await;
        }
        let hook = role::both(
            Box::new(self.cgroup.pre_exec_hook()),
            role::own_process_group(),
        );
        let (command, gateway) = self.serve_command()?;
        let tunnel = role::start_wrapped(&self.status.wrapper, &command, Some(hook)).await?;
        let serving: ServeReady = serde_json::from_str(&tunnel.first_line)?;
        self.status.generation += 1;
        self.status.inactive_actors.clear();
        self.tunnel = Some(tunnel);
        self.status.gateway = Some((gateway.address.clone(), gateway.server_name.clone()));
        let mut control = Control::connect(&serving.control_socket, gateway);
        let mut ready = HostReady {
            stats: serving.stats,
            ingress: serving.ingress,
            actors: Vec::with_capacity(self.args.actors),
        };
        for i in 0..self.args.actors {
            let runtime_netns = control.bring_up(&actor(i)).await?;
            let a = actor(i);
            ready.actors.push(HostedActor {
                name: format!("{}/{}", a.atespace, a.name),
                runtime_netns: Some(runtime_netns),
                listeners: BTreeMap::new(),
            });
        }
        self.control = Some(control);
        let names: Vec<&str> = ready
            .actors
            .iter()
            .filter_map(|a| a.runtime_netns.as_deref())
            .collect();
        let actors = role::start_with(
            &["actors".into(), arg("netns", names.join(","))],
            Some(role::own_process_group()),
        )
        .await?;
        self.status.ready = Some(ready);
        self.status.atunnel_control = Some(serving.control_socket.clone());
        self.actors = Some(actors);
        Ok(())
    }

    /// Starts `peer` in atunnel's place: the actors first (in sandboxes the
    /// worker builds for a peer that can enter them, else on loopback: its
    /// backends), then its configuration written to the peers folder, then
    /// the peer from it inside atunnel's cgroup; ready once it accepts
    /// connections on atunnel's ingress HTTPS address.
    pub(super) async fn start_peer(&mut self, peer: Peer) -> Result<(), atunnel_process::BoxError> {
        let binary = peer.find().ok_or_else(|| {
            format!(
                "{} is not installed (Debian: apt-get install nginx haproxy)",
                peer.name()
            )
        })?;
        let (backends, egress) = if peer.reaches_sandboxes() {
            self.start_peer_sandboxes().await?
        } else {
            (self.start_loopback_actors().await?, None)
        };
        let setup = PeerSetup {
            listen: self.args.ingress_https,
            cert_bundle: self.pki.worker_bundle(),
            client_ca: self.pki.pod_ca(),
            backends: backends.clone(),
            egress,
            dir: self.peers_dir(),
        };
        let config = peer.write_config(&setup)?;
        let mut command = self.status.wrapper.clone();
        command.extend(peer.command(&binary, &config));
        let hook = role::both(
            Box::new(self.cgroup.pre_exec_hook()),
            role::own_process_group(),
        );
        let mut cmd = tokio::process::Command::new(&command[0]);
        cmd.args(&command[1..])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true);
        // SAFETY: the hook only makes async-signal-safe syscalls (open,
        // write, close for the cgroup move; setpgid), as pre_exec requires
        // after fork.
        unsafe { cmd.pre_exec(hook) };
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting {}: {e}", binary.display()))?;
        self.status.generation += 1;
        self.status.inactive_actors.clear();
        let tunnel = self.tunnel.insert(Role {
            child,
            first_line: String::new(),
        });
        wait_listening(peer, &mut tunnel.child, self.args.ingress_https).await?;
        self.status.peer = Some(PeerRunning {
            config,
            listen: self.args.ingress_https,
            backends,
            sandboxes: self
                .peer_sandboxes
                .iter()
                .map(|s| s.name().to_string())
                .collect(),
        });
        Ok(())
    }

    /// The actors' program on loopback, one port per actor (for a peer
    /// that cannot enter a sandbox); their backends.
    pub(super) async fn start_loopback_actors(
        &mut self,
    ) -> Result<Vec<Backend>, atunnel_process::BoxError> {
        let n = self.args.actors;
        let backends = (0..n)
            .map(|i| {
                let a = actor(i);
                let addr = crate::actors::loopback_addr(crate::actors::LOOPBACK_BASE_PORT, i)?;
                Ok(Backend {
                    actor: format!("{}/{}", a.atespace, a.name),
                    addr,
                    netns: None,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let actors = role::start_with(
            &["actors".into(), arg("loopback-actors", n)],
            Some(role::own_process_group()),
        )
        .await?;
        self.actors = Some(actors);
        Ok(backends)
    }

    /// Each actor's sandbox built as atunnel builds it (its name, egress
    /// port and IPv6 setting; the veth and the nftables rules), the actors'
    /// program serving inside them as for atunnel; their backends, reached
    /// from each sandbox's gateway side, and the egress relay in them.
    pub(super) async fn start_peer_sandboxes(
        &mut self,
    ) -> Result<(Vec<Backend>, Option<EgressRelay>), atunnel_process::BoxError> {
        if self.exec.is_none() {
            self.exec = Some(NsExecutor::start()?);
        }
        let exec = self.exec.clone().expect("started above");
        let (egress_port, ipv6) = sandbox_shape(&self.args.tunnel_arg)?;
        let mut backends = Vec::with_capacity(self.args.actors);
        for i in 0..self.args.actors {
            let a = actor(i);
            let name = format!("{}{}", self.args.netns_prefix, a.uid);
            // Pushed at once: stop_children removes what was built.
            let sandbox = SandboxNetwork::create(&exec, &name, egress_port, ipv6).await?;
            backends.push(Backend {
                actor: format!("{}/{}", a.atespace, a.name),
                addr: atunnel_sandbox::sandbox::actor_addr(crate::actors::ACTOR_PORT),
                netns: Some(sandbox.gateway.name().to_string()),
            });
            self.peer_sandboxes.push(sandbox);
        }
        let names: Vec<&str> = self.peer_sandboxes.iter().map(|s| s.name()).collect();
        let actors = role::start_with(
            &["actors".into(), arg("netns", names.join(","))],
            Some(role::own_process_group()),
        )
        .await?;
        self.actors = Some(actors);
        let egress = EgressRelay {
            port: egress_port,
            netns: self
                .peer_sandboxes
                .iter()
                .map(|s| s.gateway.name().to_string())
                .collect(),
            far_end: self.args.gateway.ip(),
            port_offset: atunnel_support::sink_tls::DEFAULT_PORT_OFFSET,
            server_name: pki::GATEWAY_NAME.to_string(),
            ca: self.pki.gateway_ca(),
        };
        Ok((backends, Some(egress)))
    }

    /// Where a peer's configuration goes.
    pub(super) fn peers_dir(&self) -> PathBuf {
        self.args.peers_dir.clone().unwrap_or_else(|| {
            self.args
                .control
                .parent()
                .unwrap_or(Path::new("."))
                .join("peers")
        })
    }

    /// Where atunnel serves its control API: beside the worker's own.
    pub(super) fn atunnel_socket(&self) -> PathBuf {
        self.args.control.with_extension("atunnel.sock")
    }

    /// The `serve` role's command line and the gateway the actors' egress
    /// is prepared for: the worker's flags, then `--tunnel-arg`s, then the
    /// last restart's, later ones replacing earlier ones of the same name.
    /// `--gateway` and `--gateway-name` are not atunnel's flags but the
    /// worker's PrepareEgress arguments.
    pub(super) fn serve_command(
        &self,
    ) -> Result<(Vec<String>, proto::Gateway), atunnel_process::BoxError> {
        let (a, p) = (&self.args, &self.pki);
        let own = vec![
            arg("control-socket", self.atunnel_socket().display()),
            arg("gateway", a.gateway),
            arg("gateway-name", pki::GATEWAY_NAME),
            arg("gateway-ca", p.gateway_ca().display()),
            arg("node-agent-socket", a.node_agent_socket.display()),
            arg("worker-cert", p.worker_bundle().display()),
            arg("worker-key", p.worker_bundle().display()),
            arg("netns-prefix", &a.netns_prefix),
            arg("ingress-https", a.ingress_https),
            arg("ingress-connect", a.ingress_connect),
            arg("credential-bundle", p.worker_bundle().display()),
            arg("trust-bundle", p.pod_ca().display()),
            arg("stats", a.stats),
        ];
        let flags = layered(&[&own, &self.args.tunnel_arg, &self.status.extra_args]);
        let (flags, gateway) = split_gateway(flags)?;
        let mut command = vec!["serve".to_string()];
        command.extend(flags);
        Ok((command, gateway))
    }

    /// Stops the actors and atunnel, and removes sandboxes a killed atunnel
    /// left behind.
    pub(super) async fn stop_children(&mut self) {
        if let Some(actors) = self.actors.take() {
            actors.stop().await;
        }
        self.control = None;
        if let Some(tunnel) = self.tunnel.take() {
            tunnel.stop().await;
        }
        // A peer's children outlive it when it is killed (nginx's worker
        // does): nothing may be left running in atunnel's cgroup.
        kill_cgroup_leftovers(&self.status.cgroup);
        self.status.ready = None;
        self.status.atunnel_control = None;
        self.status.gateway = None;
        self.status.peer = None;
        if let Some(exec) = &self.exec {
            for sandbox in self.peer_sandboxes.drain(..) {
                let name = sandbox.name().to_string();
                if let Err(e) = sandbox.destroy(exec).await {
                    eprintln!("atunnel-bench worker: removing sandbox {name}: {e}");
                }
            }
        }
        role::sweep_namespaces(&self.args.netns_prefix).await;
    }
}

/// The egress port and IPv6 setting atunnel's sandboxes get with the
/// worker's `--tunnel-arg`s `flags`: its defaults unless they are named.
pub(super) fn sandbox_shape(flags: &[String]) -> Result<(u16, bool), atunnel_process::BoxError> {
    let mut port = atunnel_sandbox::sandbox::DEFAULT_EGRESS_PORT;
    let mut ipv6 = true;
    for flag in flags {
        match flag.split_once('=') {
            Some(("--egress-port", v)) => {
                port = v.parse().map_err(|e| format!("{flag}: {e}"))?;
            }
            _ if flag == "--no-sandbox-ipv6" => ipv6 = false,
            _ => {}
        }
    }
    Ok((port, ipv6))
}

/// SIGKILLs every process still in `cgroup` (read from `cgroup.procs`).
pub(super) fn kill_cgroup_leftovers(cgroup: &CgroupDirs) {
    let Ok(pids) = cgroup.processes() else {
        return;
    };
    for pid in pids {
        let Ok(raw) = i32::try_from(pid) else {
            continue;
        };
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(raw),
            nix::sys::signal::Signal::SIGKILL,
        );
        eprintln!("atunnel-bench worker: killed process {pid} left in atunnel's cgroup");
    }
}

/// How long a peer gets to listen after it starts (nginx and HAProxy take
/// milliseconds; a busy host, a few seconds).
pub(super) const PEER_START_TIMEOUT: Duration = Duration::from_secs(30);

/// Returns once `addr` accepts a connection (the peer is serving), or an
/// error once the peer exits or [`PEER_START_TIMEOUT`] passes. Neither
/// peer says when it is ready, so this polls the listener.
pub(super) async fn wait_listening(
    peer: Peer,
    child: &mut tokio::process::Child,
    addr: SocketAddr,
) -> Result<(), atunnel_process::BoxError> {
    let deadline = tokio::time::Instant::now() + PEER_START_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait()? {
            return Err(
                format!("{} exited ({status}) before serving on {addr}", peer.name()).into(),
            );
        }
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "{} did not serve on {addr} within {PEER_START_TIMEOUT:?}",
                peer.name()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Takes `--gateway=` and `--gateway-name=` out of `flags`: the gateway
/// the worker prepares each actor's egress for, not a flag of atunnel's.
pub(super) fn split_gateway(
    flags: Vec<String>,
) -> Result<(Vec<String>, proto::Gateway), atunnel_process::BoxError> {
    let mut gateway = proto::Gateway::default();
    let mut rest = Vec::with_capacity(flags.len());
    for flag in flags {
        match flag.split_once('=') {
            Some(("--gateway", v)) => gateway.address = v.to_string(),
            Some(("--gateway-name", v)) => gateway.server_name = v.to_string(),
            _ if matches!(flag_name(&flag), "--gateway" | "--gateway-name") => {
                return Err(format!("{flag}: give it as {flag}=value").into());
            }
            _ => rest.push(flag),
        }
    }
    if gateway.address.is_empty() {
        return Err("no --gateway= for the actors' egress".into());
    }
    Ok((rest, gateway))
}

pub(super) fn describe(status: &std::io::Result<std::process::ExitStatus>) -> String {
    match status {
        Ok(s) => s.to_string(),
        Err(e) => format!("exit status unknown: {e}"),
    }
}
