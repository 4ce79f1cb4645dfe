//! Tests that assert timing bounds on real sockets, in a binary apart from
//! `tests/it` so that none of its heavier tests run beside them: a peer
//! that vanishes without a FIN found within the keepalive and open-timeout
//! bounds (`dead_peers`), and one actor's unread uploads not stalling
//! another's past 5 s (`ingress_isolation`). Both are light, so they share
//! this binary. `wait_bounds`, timing too, floods the process with
//! 12,000 connections and has a binary of its own.

mod dead_peers;
mod ingress_isolation;
