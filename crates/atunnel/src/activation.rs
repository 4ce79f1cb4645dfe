//! One activation of one actor: what its egress and its ingress share from
//! `Tunnel::activate` to `Tunnel::deactivate`. Each side keeps its own
//! state (egress its credential and gateway client, ingress its dialer and
//! pools) beside an `Arc` of this.
//!
//! Deactivation cancels it once, and both sides stop at that instant: no
//! side can refuse new work while the other still takes it.

use std::sync::Mutex;

use atunnel_core::relay::RelayBounds;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Cancelled once, at deactivation; never reused (a new activation is a
/// new value).
pub struct ActorActivation {
    cancel: CancellationToken,
    /// What the actor's work in flight (egress tunnels, ingress requests
    /// and CONNECT tunnels) ends on: cancelled with `cancel`, and when the
    /// overload guard sheds the actor, then replaced so that work admitted
    /// later is not cut with it. One token where a tunnel would otherwise
    /// wait on two (72 B each, in every idle tunnel's task).
    cut: Mutex<CancellationToken>,
    /// Egress's tunnels and its certificate renewal. A tracker per side
    /// because each is counted on its own: ingress's in-flight budget is
    /// its tracker's length, and egress reports its open tasks when its
    /// drain times out.
    egress_tasks: TaskTracker,
    /// Ingress's requests and CONNECT tunnels in flight.
    ingress_tasks: TaskTracker,
    /// When egress tunnels and ingress CONNECT tunnels that cannot finish
    /// are reset: one setting for both directions of the actor's traffic.
    relay: RelayBounds,
}

impl ActorActivation {
    pub fn new(relay: RelayBounds) -> Self {
        Self {
            cancel: CancellationToken::new(),
            cut: Mutex::default(),
            egress_tasks: TaskTracker::new(),
            ingress_tasks: TaskTracker::new(),
            relay,
        }
    }

    /// Whether deactivation has begun.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Completes once deactivation has begun.
    pub(crate) fn cancelled(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.cancel.cancelled()
    }

    /// Deactivation's token, for a task that outlives a borrow (renewal).
    pub(crate) fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Refuses new work on both sides and cuts what is in flight on both.
    /// Idempotent.
    pub fn cancel(&self) {
        self.cancel.cancel();
        self.cut.lock().expect("cut lock poisoned").cancel();
    }

    /// The token work admitted now ends on.
    pub(crate) fn cut_token(&self) -> CancellationToken {
        self.cut.lock().expect("cut lock poisoned").clone()
    }

    /// Cuts the work in flight on both sides (shedding); work admitted
    /// later is not cut unless the activation is being cancelled.
    pub(crate) fn shed(&self) {
        let mut cut = self.cut.lock().expect("cut lock poisoned");
        let old = std::mem::take(&mut *cut);
        // `cancel` cancels its token before it takes this lock to cut the
        // current one, so a shed that comes after it leaves none uncut.
        if self.cancel.is_cancelled() {
            cut.cancel();
        }
        old.cancel();
    }

    pub(crate) fn egress_tasks(&self) -> &TaskTracker {
        &self.egress_tasks
    }

    pub(crate) fn ingress_tasks(&self) -> &TaskTracker {
        &self.ingress_tasks
    }

    /// The relay bounds of the actor's egress and ingress CONNECT tunnels.
    pub fn relay(&self) -> &RelayBounds {
        &self.relay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shed_cuts_work_in_flight_and_not_work_admitted_after() {
        let a = ActorActivation::new(RelayBounds::default());
        let before = a.cut_token();
        a.shed();
        assert!(before.is_cancelled());
        assert!(!a.cut_token().is_cancelled());
        assert!(!a.is_cancelled());
    }

    #[test]
    fn cancel_cuts_and_a_later_shed_leaves_nothing_uncut() {
        let a = ActorActivation::new(RelayBounds::default());
        let before = a.cut_token();
        a.cancel();
        assert!(a.is_cancelled() && before.is_cancelled());
        a.shed();
        assert!(a.cut_token().is_cancelled());
        a.cancel();
        assert!(a.cut_token().is_cancelled());
    }
}
