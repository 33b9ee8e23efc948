//! Whether this node hears from a leader: the test a subscription needs before it may promise a
//! client that nothing new has been committed.
//!
//! A follower (or learner) heard from a leader when it accepted an append-entries or
//! install-snapshot RPC (openraft's heartbeats are empty appends, every
//! [`crate::limits::RAFT_HEARTBEAT_MS`]); a leader, when a quorum last acknowledged it (openraft's
//! `millis_since_quorum_ack`). A node cut off from the cluster goes on answering from its applied
//! state, but it cannot know whether it is behind: a subscription there would send `: ping`
//! forever and the client would never fail over.
//!
//! Owns: the time of the last contact and the verdict. Must never: read the wall clock (it uses
//! tokio's monotonic clock, which the simulation simulates) or block.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::limits::LEADER_SILENCE_MAX_MS;
use crate::raft::{NodeId, Raft};

/// When this node last heard from a leader.
#[derive(Debug, Default)]
pub struct LeaderContact {
    last: Mutex<Option<Instant>>,
}

impl LeaderContact {
    /// Records that a leader was heard from now (an accepted append-entries or install-snapshot
    /// RPC).
    pub fn heard(&self) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }

    /// How long this node has not heard from a leader, when that is longer than
    /// [`LEADER_SILENCE_MAX_MS`] (or it never has since it started): `Some(silence)`, `None`
    /// for "in contact". A leader is in contact while a quorum acknowledged it within the bound.
    pub fn cut_off(&self, raft: &Raft, id: NodeId) -> Option<Silence> {
        let quorum_ack_ms = {
            let m = raft.metrics();
            let m = m.borrow();
            (super::known_leader(&m, id) == Some(id)).then_some(m.millis_since_quorum_ack).flatten()
        };
        verdict(quorum_ack_ms, self.since_heard())
    }

    /// How long this node has not heard from a leader as a follower, when that is longer than
    /// [`LEADER_SILENCE_MAX_MS`] (or it never has since it started): `Some(silence)`; `None`
    /// while a leader's RPCs arrive. What a node that would forward a write to its leader asks
    /// first: a leader that sends it nothing (stopped, frozen, cut off from it) would not
    /// answer the write either.
    pub fn follower_silence(&self) -> Option<Silence> {
        verdict(None, self.since_heard())
    }

    /// Resolves, with the silence, once [`LeaderContact::follower_silence`] reports one,
    /// looking every `every`: raced against a forwarded write, so a leader that stops sending
    /// RPCs while it holds the write ends the wait within about [`LEADER_SILENCE_MAX_MS`].
    pub async fn silent(&self, every: Duration) -> Silence {
        loop {
            if let Some(silence) = self.follower_silence() {
                return silence;
            }
            tokio::time::sleep(every).await;
        }
    }

    fn since_heard(&self) -> Option<Duration> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).map(|t| t.elapsed())
    }
}

/// The verdict of [`LeaderContact::cut_off`] from its two inputs: `quorum_ack_ms`, how long ago
/// (ms) a majority of the voters last acknowledged this node, `Some` only while it leads and
/// has been acknowledged since its election (openraft's `millis_since_quorum_ack`); and
/// `since_heard`, how long ago it last heard from a leader as a follower (`None`: never since it
/// started). Either older than [`LEADER_SILENCE_MAX_MS`] is a silence.
///
/// A leader no majority has acknowledged since its election (`quorum_ack_ms` `None`) is judged
/// by its contact as a follower: that gives a new leader its first round trip, and takes one
/// whose voters went down right after they elected it as cut off once the bound has passed
/// since it last heard from a leader.
fn verdict(quorum_ack_ms: Option<u64>, since_heard: Option<Duration>) -> Option<Silence> {
    let bound = Duration::from_millis(LEADER_SILENCE_MAX_MS);
    if let Some(ms) = quorum_ack_ms {
        let s = Duration::from_millis(ms);
        return (s > bound).then_some(Silence::NoQuorum(s));
    }
    match since_heard {
        Some(s) if s <= bound => None,
        Some(s) => Some(Silence::For(s)),
        None => Some(Silence::Never),
    }
}

/// How long a node has been without a leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Silence {
    /// It has not heard from one since it started.
    Never,
    /// It last heard from one this long ago.
    For(Duration),
    /// It leads, and a majority of the voters last acknowledged it this long ago.
    NoQuorum(Duration),
}

impl std::fmt::Display for Silence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Silence::Never => f.write_str("has not heard from a leader since it started"),
            Silence::For(d) => write!(f, "has not heard from a leader for {} ms", d.as_millis()),
            Silence::NoQuorum(d) => {
                write!(f, "is leader but no majority of the voters has acknowledged it for {} ms", d.as_millis())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A follower's silence starts once it has heard nothing for the bound, and the wait for it
    /// resolves then, not before; every RPC heard puts it off again.
    #[tokio::test(start_paused = true)]
    async fn a_follower_falls_silent_once_it_hears_nothing_for_the_bound() {
        let contact = LeaderContact::default();
        assert_eq!(contact.follower_silence(), Some(Silence::Never));
        contact.heard();
        assert_eq!(contact.follower_silence(), None);
        let started = Instant::now();
        let every = Duration::from_millis(100);
        tokio::time::sleep(BOUND / 2).await;
        contact.heard();
        let silence = contact.silent(every).await;
        let waited = started.elapsed();
        assert!(matches!(silence, Silence::For(d) if d > BOUND), "{silence:?}");
        assert!(waited > BOUND + BOUND / 2, "resolved after {waited:?}: before the bound from the last RPC");
        assert!(waited <= BOUND + BOUND / 2 + every + every, "resolved after {waited:?}: long after the bound");
    }

    const BOUND: Duration = Duration::from_millis(LEADER_SILENCE_MAX_MS);
    const PAST: Duration = Duration::from_millis(LEADER_SILENCE_MAX_MS + 1);

    /// A leader is in contact while a majority acknowledged it within the bound, whatever it
    /// heard as a follower, and cut off (NoQuorum) once that is older than the bound.
    #[test]
    fn a_leader_is_judged_by_its_majority_s_last_acknowledgement() {
        assert_eq!(verdict(Some(100), None), None);
        assert_eq!(verdict(Some(LEADER_SILENCE_MAX_MS), Some(PAST)), None);
        assert_eq!(verdict(Some(LEADER_SILENCE_MAX_MS + 1), Some(Duration::ZERO)), Some(Silence::NoQuorum(PAST)));
    }

    /// A follower, or a leader no majority has acknowledged since its election, is judged by the
    /// last time it heard from a leader: in contact up to the bound, then silent for that long,
    /// and silent from its start when it never heard from one.
    #[test]
    fn without_an_acknowledgement_the_last_leader_heard_decides() {
        assert_eq!(verdict(None, Some(Duration::from_millis(100))), None);
        assert_eq!(verdict(None, Some(BOUND)), None);
        assert_eq!(verdict(None, Some(PAST)), Some(Silence::For(PAST)));
        assert_eq!(verdict(None, None), Some(Silence::Never));
    }
}
