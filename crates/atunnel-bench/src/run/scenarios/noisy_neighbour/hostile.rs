//! The hostile actor: the patterns' persistent connections, floods and
//! their tally.

use super::*;

/// What the hostile actor's tasks counted.
#[derive(Default)]
pub(super) struct Tally {
    /// Connections opened (or, for the flood, held).
    pub(super) opened: AtomicU64,
    /// Held connections that ended (reset by a bound, mostly) and were
    /// opened again.
    pub(super) ended: AtomicU64,
    /// Opens that failed; for the flood, connections atunnel reset.
    pub(super) failed: AtomicU64,
    /// Connections held now.
    pub(super) holding: AtomicU64,
    /// Flood attempts, or DNS queries sent.
    pub(super) sent: AtomicU64,
}

/// A hostile pattern running: its tasks, what they hold, and how to stop
/// them. Stopping drops every socket they hold (closed as a program's
/// exit closes them: FIN, or RST where unread bytes wait).
pub(super) struct Hostile {
    pub(super) cancel: CancellationToken,
    pub(super) tasks: TaskTracker,
    pub(super) tally: Arc<Tally>,
}

impl Hostile {
    pub(super) async fn start(
        pattern: Pattern,
        sizes: &Sizes,
        plan: &Plan,
        stage: &Stage,
        exec: &NsExecutor,
    ) -> Result<Self, BoxError> {
        let (actors, router) = (&stage.actors, &stage.router);
        let h = Hostile {
            cancel: CancellationToken::new(),
            tasks: TaskTracker::new(),
            tally: Arc::new(Tally::default()),
        };
        let gate = Arc::new(Semaphore::new(OPENING_AT_ONCE));
        match pattern {
            Pattern::UnreadDownloads => {
                for _ in 0..sizes.stalled {
                    h.keep(
                        &gate,
                        RETRY,
                        actors.clone(),
                        |a| async move {
                            let s = a.dial(HOSTILE, SOURCE).await.map_err(|e| e.to_string())?;
                            // Open once the first bytes came through.
                            tokio::time::timeout(Duration::from_secs(5), s.readable())
                                .await
                                .map_err(|_| "no byte within 5 s".to_string())?
                                .map_err(|e| e.to_string())?;
                            Ok(s)
                        },
                        |s: TcpStream| async move { closed_unread(&s).await },
                    );
                }
            }
            Pattern::StalledUploads => {
                for _ in 0..sizes.stalled {
                    h.keep(
                        &gate,
                        RETRY,
                        actors.clone(),
                        |a| async move { a.dial(HOSTILE, STALL).await.map_err(|e| e.to_string()) },
                        |mut s: TcpStream| async move {
                            static CHUNK: [u8; 64 * 1024] = [b'u'; 64 * 1024];
                            while s.write_all(&CHUNK).await.is_ok() {}
                        },
                    );
                }
            }
            Pattern::StalledIngressConnect => {
                for _ in 0..sizes.ingress {
                    h.keep(
                        &gate,
                        RETRY,
                        router.clone(),
                        |r| async move {
                            r.tls
                                .connect_tunnel(&r.topo, HOSTILE, FLOOD_PORT)
                                .await
                                .map_err(|e| e.to_string())
                        },
                        |tls: tokio_rustls::client::TlsStream<TcpStream>| async move {
                            closed_unread(tls.get_ref().0).await
                        },
                    );
                }
            }
            Pattern::StalledResponseBodies => {
                for k in 0..sizes.stalled_bodies as u64 {
                    h.keep(
                        &gate,
                        RETRY,
                        stage.victim.clone(),
                        move |v| async move {
                            let send = shared_sender(&v.https, k, &v.router).await?;
                            stalled_request(send, HOSTILE).await
                        },
                        body_ended,
                    );
                }
            }
            Pattern::ActorsAtBudget => {
                for &actor in &plan.hostiles {
                    // A gate per actor: each stays inside its own opening
                    // budget, as one actor's programs would.
                    let gate = Arc::new(Semaphore::new(OPENING_AT_ONCE));
                    for _ in 0..plan.egress_each {
                        h.keep(
                            &gate,
                            AT_BUDGET_RETRY,
                            actors.clone(),
                            move |a| async move {
                                let mut s = a.dial(actor, ECHO).await.map_err(|e| e.to_string())?;
                                tokio::time::timeout(HEAD_LIMIT, crate::traffic::ping(&mut s))
                                    .await
                                    .map_err(|_| "no echo within 5 s".to_string())?
                                    .map_err(|e| e.to_string())?;
                                Ok(s)
                            },
                            |s: TcpStream| async move { closed_unread(&s).await },
                        );
                    }
                    let conns: Arc<Vec<tokio::sync::Mutex<Option<H2Sender>>>> = Arc::new(
                        (0..INGRESS_BUDGET.div_ceil(ACTOR_ROUTER_STREAMS))
                            .map(|_| tokio::sync::Mutex::new(None))
                            .collect(),
                    );
                    for k in 0..INGRESS_BUDGET as u64 {
                        h.keep(
                            &gate,
                            AT_BUDGET_RETRY,
                            (conns.clone(), router.clone()),
                            move |(conns, r)| async move {
                                let send = shared_sender(&conns, k, &r).await?;
                                stalled_request(send, actor).await
                            },
                            body_ended,
                        );
                    }
                }
            }
            Pattern::ConnectionFlood => {
                let held = Arc::new(std::sync::Mutex::new(Vec::new()));
                for _ in 0..sizes.flood_workers {
                    h.tasks.spawn(flood_worker(
                        h.cancel.clone(),
                        actors.clone(),
                        h.tally.clone(),
                        held.clone(),
                    ));
                }
            }
            Pattern::DnsFlood => {
                let ns = actors.sandboxes[HOSTILE as usize % actors.sandboxes.len()].clone();
                let socket = exec
                    .run_in(&ns, || {
                        let s = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
                        s.set_nonblocking(true)?;
                        Ok::<_, std::io::Error>(s)
                    })
                    .await??;
                let socket = tokio::net::UdpSocket::from_std(socket)?;
                socket.connect(DNS_RELAY).await?;
                h.tasks
                    .spawn(dns_flood(h.cancel.clone(), socket, h.tally.clone()));
            }
        }
        Ok(h)
    }

    /// Spawns a [`persistent`] holder that stops with this pattern and
    /// counts into its tally. Each open is given its own clone of `with`
    /// (what it dials through), as the future it returns outlives the call.
    fn keep<W, C, O, OFut, H, HFut>(
        &self,
        gate: &Arc<Semaphore>,
        retry: Duration,
        with: W,
        open: O,
        hold: H,
    ) where
        W: Clone + Send + 'static,
        C: Send + 'static,
        O: Fn(W) -> OFut + Send + 'static,
        OFut: Future<Output = Result<C, String>> + Send + 'static,
        H: Fn(C) -> HFut + Send + 'static,
        HFut: Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn(persistent(
            self.cancel.clone(),
            gate.clone(),
            self.tally.clone(),
            retry,
            move || open(with.clone()),
            hold,
        ));
    }

    /// Stops the tasks and waits for them (their sockets closed).
    pub(super) async fn stop(self) {
        self.cancel.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// Holds one connection from `open` with `hold` until it ends, then opens
/// another, until cancelled: a hostile actor that keeps what a bound
/// resets. At most [`OPENING_AT_ONCE`] opens at once across those sharing
/// `gate`; a failed open is tried again `retry` later.
pub(super) async fn persistent<C, O, OFut, H, HFut>(
    cancel: CancellationToken,
    gate: Arc<Semaphore>,
    tally: Arc<Tally>,
    retry: Duration,
    open: O,
    hold: H,
) where
    O: Fn() -> OFut,
    OFut: Future<Output = Result<C, String>>,
    H: Fn(C) -> HFut,
    HFut: Future<Output = ()>,
{
    loop {
        let conn = {
            let _permit = tokio::select! {
                _ = cancel.cancelled() => return,
                p = gate.acquire() => p,
            };
            let conn = tokio::select! {
                _ = cancel.cancelled() => return,
                c = open() => c,
            };
            tokio::time::sleep(OPEN_SPACING).await;
            conn
        };
        let Ok(conn) = conn else {
            tally.failed.fetch_add(1, Ordering::Relaxed);
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(retry) => continue,
            }
        };
        tally.opened.fetch_add(1, Ordering::Relaxed);
        tally.holding.fetch_add(1, Ordering::Relaxed);
        let ended = tokio::select! {
            _ = cancel.cancelled() => false,
            () = hold(conn) => true,
        };
        tally.holding.fetch_sub(1, Ordering::Relaxed);
        if !ended {
            return;
        }
        tally.ended.fetch_add(1, Ordering::Relaxed);
    }
}

/// Opens egress connections one after another as fast as they go; keeps
/// each that atunnel admits (one byte there and back), counts each it
/// resets.
pub(super) async fn flood_worker(
    cancel: CancellationToken,
    actors: Actors,
    tally: Arc<Tally>,
    held: Arc<std::sync::Mutex<Vec<TcpStream>>>,
) {
    pub(super) const TRY_FOR: Duration = Duration::from_secs(2);
    loop {
        let attempt = async {
            let mut s = tokio::time::timeout(TRY_FOR, actors.dial(HOSTILE, ECHO))
                .await
                .map_err(|_| ())?
                .map_err(|_| ())?;
            tokio::time::timeout(TRY_FOR, crate::traffic::ping(&mut s))
                .await
                .map_err(|_| ())?
                .map_err(|_| ())?;
            Ok::<_, ()>(s)
        };
        let attempt = tokio::select! {
            _ = cancel.cancelled() => break,
            a = attempt => a,
        };
        tally.sent.fetch_add(1, Ordering::Relaxed);
        match attempt {
            Ok(s) => {
                tally.opened.fetch_add(1, Ordering::Relaxed);
                tally.holding.fetch_add(1, Ordering::Relaxed);
                held.lock().expect("held lock").push(s);
            }
            Err(()) => {
                tally.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    // The last worker out closes what the flood holds.
    let mut held = held.lock().expect("held lock");
    tally
        .holding
        .fetch_sub(held.len() as u64, Ordering::Relaxed);
    held.clear();
}

/// Sends DNS queries on `socket` at [`DNS_RATE`] until cancelled; a late
/// wake-up sends what is due at once, but never more than 100 ms' worth.
pub(super) async fn dns_flood(
    cancel: CancellationToken,
    socket: tokio::net::UdpSocket,
    tally: Arc<Tally>,
) {
    // A header (ID, RD, one question) and `noisy.bench. IN A`.
    let mut query = *b"\0\0\x01\0\0\x01\0\0\0\0\0\0\x05noisy\x05bench\0\0\x01\0\x01";
    let start = Instant::now();
    let mut sent = 0u64;
    loop {
        let due = (start.elapsed().as_secs_f64() * DNS_RATE) as u64;
        sent = sent.max(due.saturating_sub((DNS_RATE / 10.0) as u64));
        while sent < due {
            query[..2].copy_from_slice(&(sent as u16).to_be_bytes());
            // A full socket buffer drops the query, as the kernel would.
            let _ = socket.try_send(&query);
            sent += 1;
            tally.sent.fetch_add(1, Ordering::Relaxed);
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(1)) => {}
        }
    }
}
