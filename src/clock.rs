//! Cluster time: what `ts` the leader stamps, and whether a node's wall clock is fit to lead.
//!
//! One wrong wall clock must not move the cluster's time. Every node measures every other
//! member's wall clock once a second (`GET /raft/clock`, [`CLOCK_PROBE_MS`]); the leader stamps
//! the **median** of its own clock and the voters' clocks as it last measured them, so with
//! three voters one wrong clock, the leader's or a follower's, moves the stamp by no more than
//! the measurement error. A node whose clock differs from that median by more than
//! `--max-clock-offset-ms` says so (a rate-limited warning, the `runnev_clock_offset_ms` and
//! `runnev_clock_offset_over_max` gauges, `/v1/cluster`) and must not lead: it refuses to stamp
//! writes and ticks, and [`should_step_down`] tells the node to stop standing for election and to
//! stop its heartbeats, so that the followers elect another leader.
//!
//! How a peer's clock is measured (NTP's idea, reduced to one exchange): `t0` and `t1` are read
//! from the monotonic clock around the request, `peer_ms` is the peer's wall clock in the answer;
//! the peer read it about `(t0 + t1) / 2`, with an error of at most half the round trip. A sample
//! whose round trip is over [`CLOCK_PROBE_RTT_MAX_MS`] is discarded. A sample is kept with the
//! monotonic instant it stands for, and the peer's clock *now* is extrapolated from it with the
//! monotonic clock: so a jump of this node's own wall clock between two probes changes neither
//! the estimate of the peers' clocks nor the median. A sample older than [`CLOCK_SAMPLE_FRESH_MS`]
//! counts as unknown. A node that knows the clocks of fewer than a majority of the voters (itself
//! included) cannot tell whether its own is wrong: it is *unverified*, and stamps nothing until it
//! knows them.
//!
//! The replicated state machine adds the other half of the rule: the effective `ts` of an entry
//! is never below one applied before it (`storage::state_machine`).
//!
//! Owns: the measurements, the median and the verdict. Must never: read the wall clock except
//! through the [`Clock`] seam, or read `std::time::Instant` (tokio's clock is the one the
//! simulation simulates); nor be consulted while applying the log.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::api::Clock;
use crate::limits::{
    CLOCK_PROBE_MS, CLOCK_PROBE_RTT_MAX_MS, CLOCK_SAMPLE_FRESH_MS, CLOCK_VERIFY_WAIT_MS, CLOCK_WARN_EVERY_MS,
};
use crate::net::HttpClient;
use crate::raft::{NodeId, Raft};

/// The path a node answers with its wall clock, in ms since the Unix epoch, as decimal text.
pub const CLOCK_PATH: &str = "/raft/clock";

/// One measurement of a peer's wall clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// The peer's wall clock, ms since the Unix epoch, as it answered.
    pub peer_ms: u64,
    /// The monotonic instant the answer stands for: the middle of the round trip.
    pub at: Instant,
    /// The round trip, in ms: twice the largest error of the sample.
    pub rtt_ms: u64,
}

impl Sample {
    /// The sample of an exchange sent at `t0` and answered at `t1` with the peer's `peer_ms`;
    /// `None` when the round trip is over [`CLOCK_PROBE_RTT_MAX_MS`].
    pub fn of_exchange(peer_ms: u64, t0: Instant, t1: Instant) -> Option<Sample> {
        let rtt = t1.saturating_duration_since(t0);
        let rtt_ms = u64::try_from(rtt.as_millis()).unwrap_or(u64::MAX);
        (rtt_ms <= CLOCK_PROBE_RTT_MAX_MS).then(|| Sample { peer_ms, at: t0 + rtt / 2, rtt_ms })
    }

    /// The peer's wall clock at `now`, extrapolated with the monotonic clock; `None` when the
    /// sample is older than [`CLOCK_SAMPLE_FRESH_MS`] (unknown).
    pub fn estimate(&self, now: Instant) -> Option<u64> {
        let age = now.saturating_duration_since(self.at);
        if age > Duration::from_millis(CLOCK_SAMPLE_FRESH_MS) {
            return None;
        }
        Some(self.peer_ms.saturating_add(u64::try_from(age.as_millis()).unwrap_or(u64::MAX)))
    }
}

/// The median of `clocks` (ms since the Unix epoch): the middle one, or the midpoint of the two
/// middle ones for an even count; `None` for none.
pub fn median(clocks: &mut [u64]) -> Option<u64> {
    clocks.sort_unstable();
    let n = clocks.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(clocks[n / 2]),
        _ => Some(clocks[n / 2 - 1].midpoint(clocks[n / 2])),
    }
}

/// `a - b` in ms, saturated to the i64 range.
fn signed_diff(a: u64, b: u64) -> i64 {
    let d = i128::from(a) - i128::from(b);
    i64::try_from(d).unwrap_or(if d < 0 { i64::MIN } else { i64::MAX })
}

/// What a node can say of its own clock now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It knows the clocks of fewer than a majority of the voters (itself included).
    Unverified,
    /// Its clock is within the bound of the median.
    InBounds,
    /// Its clock is further than the bound from the median: it must not lead.
    OutOfBounds,
}

/// A node's clock against the cluster's, at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assessment {
    /// The median of this node's clock and the voters' clocks it knows, ms since the Unix
    /// epoch: the `ts` a leader stamps.
    pub median_ms: u64,
    /// This node's wall clock minus the median, in ms.
    pub offset_ms: i64,
    /// How many voters' clocks it knows (its own included, when it is a voter).
    pub known: usize,
    /// How many voters there are.
    pub voters: usize,
    /// The verdict.
    pub verdict: Verdict,
}

/// Assesses this node's clock (`own_ms`) against the voters' clocks it knows (`peer_clocks`,
/// the other voters', estimated now), among `voters` voters; `own_is_voter` tells whether it is
/// one. The median is over its own clock and the known voters' clocks.
pub fn assess(own_ms: u64, own_is_voter: bool, voters: usize, peer_clocks: &[u64], max_offset_ms: u64) -> Assessment {
    let mut clocks = Vec::with_capacity(peer_clocks.len() + 1);
    clocks.push(own_ms);
    clocks.extend_from_slice(peer_clocks);
    let median_ms = median(&mut clocks).unwrap_or(own_ms);
    let offset_ms = signed_diff(own_ms, median_ms);
    let known = peer_clocks.len() + usize::from(own_is_voter);
    let verdict = if known < voters / 2 + 1 {
        Verdict::Unverified
    } else if offset_ms.unsigned_abs() > max_offset_ms {
        Verdict::OutOfBounds
    } else {
        Verdict::InBounds
    };
    Assessment { median_ms, offset_ms, known, voters, verdict }
}

/// The decision the node takes every second: `Some(true)` when it must not lead (its clock is out
/// of bounds: stop standing for election, and step down if it leads), `Some(false)` when it may,
/// `None` when it cannot tell (unverified: leave things as they are).
pub fn should_step_down(a: &Assessment) -> Option<bool> {
    match a.verdict {
        Verdict::OutOfBounds => Some(true),
        Verdict::InBounds => Some(false),
        Verdict::Unverified => None,
    }
}

/// Why the leader stamps nothing: `503 not_ready` for the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClockError {
    /// The node's clock is out of bounds.
    #[error(
        "this node's wall clock is {offset_ms} ms off the median of the cluster's clocks, more than --max-clock-offset-ms {max_offset_ms}: it does not lead; retry on another node once a leader with a good clock is elected"
    )]
    OutOfBounds {
        /// Its offset, in ms.
        offset_ms: i64,
        /// The bound, in ms.
        max_offset_ms: u64,
    },
    /// The node has not measured the clocks of a majority of the voters.
    #[error(
        "this node has measured the clocks of {known} of {voters} voters, not a majority, within {CLOCK_VERIFY_WAIT_MS} ms: it cannot tell whether its own clock is right; retry"
    )]
    Unverified {
        /// Voters' clocks known.
        known: usize,
        /// Voters.
        voters: usize,
    },
}

/// The clock measurements of one node, shared by its prober, its write path and `/v1/cluster`.
pub struct ClusterClock {
    wall: Clock,
    max_offset_ms: u64,
    samples: Mutex<BTreeMap<NodeId, Sample>>,
    rounds: watch::Sender<u64>,
}

impl ClusterClock {
    /// A node's measurements, reading its own wall clock through `wall`, with the bound
    /// `max_offset_ms` (`--max-clock-offset-ms`).
    pub fn new(wall: Clock, max_offset_ms: u64) -> Arc<ClusterClock> {
        Arc::new(ClusterClock { wall, max_offset_ms, samples: Mutex::default(), rounds: watch::Sender::new(0) })
    }

    /// This node's wall clock, ms since the Unix epoch (what `GET /raft/clock` answers).
    pub fn wall_ms(&self) -> u64 {
        (self.wall)()
    }

    /// The bound, in ms.
    pub fn max_offset_ms(&self) -> u64 {
        self.max_offset_ms
    }

    fn samples(&self) -> std::sync::MutexGuard<'_, BTreeMap<NodeId, Sample>> {
        self.samples.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Each peer's clock minus this node's, in ms, for the peers whose sample is fresh.
    pub fn peer_offsets(&self) -> BTreeMap<NodeId, i64> {
        self.peer_offsets_at(Instant::now())
    }

    fn peer_offsets_at(&self, now: Instant) -> BTreeMap<NodeId, i64> {
        let own = self.wall_ms();
        self.samples().iter().filter_map(|(id, s)| Some((*id, signed_diff(s.estimate(now)?, own)))).collect()
    }

    /// This node's clock against the voters' clocks it knows, now.
    pub fn assess(&self, id: NodeId, voters: &BTreeSet<NodeId>) -> Assessment {
        self.assess_at(id, voters, Instant::now())
    }

    fn assess_at(&self, id: NodeId, voters: &BTreeSet<NodeId>, now: Instant) -> Assessment {
        let peers: Vec<u64> = {
            let samples = self.samples();
            voters.iter().filter(|v| **v != id).filter_map(|v| samples.get(v)?.estimate(now)).collect()
        };
        assess(self.wall_ms(), voters.contains(&id), voters.len(), &peers, self.max_offset_ms)
    }

    /// The `ts` this node stamps on a proposal now: the median of the voters' clocks.
    ///
    /// Errors: its clock is out of bounds; or it is unverified ([`ClusterClock::stamp`] waits).
    pub fn stamp_now(&self, raft: &Raft, id: NodeId) -> Result<u64, ClockError> {
        let a = self.assess(id, &voters(raft));
        match a.verdict {
            Verdict::InBounds => Ok(a.median_ms),
            Verdict::OutOfBounds => {
                Err(ClockError::OutOfBounds { offset_ms: a.offset_ms, max_offset_ms: self.max_offset_ms })
            }
            Verdict::Unverified => Err(ClockError::Unverified { known: a.known, voters: a.voters }),
        }
    }

    /// Like [`ClusterClock::stamp_now`], but an unverified node waits (up to
    /// [`CLOCK_VERIFY_WAIT_MS`], one probe round after another) to know a majority's clocks: a
    /// node that just started or just became leader has not measured its peers yet.
    ///
    /// Errors: out of bounds (at once), or still unverified after the wait.
    pub async fn stamp(&self, raft: &Raft, id: NodeId) -> Result<u64, ClockError> {
        let deadline = Instant::now() + Duration::from_millis(CLOCK_VERIFY_WAIT_MS);
        let mut rounds = self.rounds.subscribe();
        loop {
            rounds.borrow_and_update();
            match self.stamp_now(raft, id) {
                Err(ClockError::Unverified { .. }) if Instant::now() < deadline => {
                    let _ = tokio::time::timeout_at(deadline, rounds.changed()).await;
                }
                other => return other,
            }
        }
    }
}

/// The voters of the membership `raft` knows.
fn voters(raft: &Raft) -> BTreeSet<NodeId> {
    raft.metrics().borrow().membership_config.membership().voter_ids().collect()
}

/// Measures one peer's clock: `GET http://{addr}/raft/clock`.
async fn probe(http: &HttpClient, addr: &str) -> Option<Sample> {
    let url = format!("http://{addr}{CLOCK_PATH}");
    let t0 = Instant::now();
    let answer = crate::net::get(http, &url, Duration::from_millis(CLOCK_PROBE_RTT_MAX_MS), 64).await;
    let t1 = Instant::now();
    match answer {
        Ok((status, body)) if status.is_success() => {
            let peer_ms = std::str::from_utf8(&body).ok()?.trim().parse::<u64>().ok()?;
            Sample::of_exchange(peer_ms, t0, t1)
        }
        _ => None,
    }
}

/// Every [`CLOCK_PROBE_MS`]: measures every other member's clock, assesses this node's, reports
/// it (log, metrics) and takes the [`should_step_down`] decision, which `candidacy` turns into
/// openraft's switches ([`crate::raft::candidacy`]). Runs until aborted.
pub async fn run(
    clock: Arc<ClusterClock>,
    raft: Raft,
    candidacy: Arc<crate::raft::candidacy::Candidacy>,
    http: HttpClient,
    id: NodeId,
) {
    let mut every = tokio::time::interval(Duration::from_millis(CLOCK_PROBE_MS));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warned: Option<Instant> = None;
    let mut refusing = false;
    loop {
        every.tick().await;
        let (peers, voters): (Vec<(NodeId, String)>, BTreeSet<NodeId>) = {
            let m = raft.metrics().borrow().clone();
            let membership = m.membership_config.membership();
            let peers =
                membership.nodes().filter(|(n, _)| **n != id).map(|(n, node)| (*n, node.addr.clone())).collect();
            (peers, membership.voter_ids().collect())
        };
        let measured = futures::future::join_all(peers.iter().map(|(n, addr)| {
            let http = &http;
            async move { (*n, probe(http, addr).await) }
        }))
        .await;
        {
            let mut samples = clock.samples();
            samples.retain(|n, _| peers.iter().any(|(p, _)| p == n));
            for (n, sample) in measured {
                if let Some(s) = sample {
                    samples.insert(n, s);
                }
            }
        }
        clock.rounds.send_modify(|r| *r = r.wrapping_add(1));
        let a = clock.assess(id, &voters);
        metrics::gauge!("runnev_clock_offset_ms").set(a.offset_ms as f64);
        metrics::gauge!("runnev_clock_offset_over_max").set(if a.verdict == Verdict::OutOfBounds { 1.0 } else { 0.0 });
        let step_down = should_step_down(&a);
        if step_down == Some(true) {
            if warned.is_none_or(|w| w.elapsed() >= Duration::from_millis(CLOCK_WARN_EVERY_MS)) {
                tracing::warn!(
                    offset_ms = a.offset_ms,
                    max_clock_offset_ms = clock.max_offset_ms,
                    known = a.known,
                    voters = a.voters,
                    "this node's wall clock is off the median of the cluster's clocks by more than the bound: it does not lead; fix its clock"
                );
                warned = Some(Instant::now());
            }
        } else if step_down == Some(false) && refusing {
            tracing::info!(
                offset_ms = a.offset_ms,
                "this node's wall clock is back within the bound: it may lead again"
            );
            warned = None;
        }
        if let Some(down) = step_down {
            if down != refusing {
                candidacy.clock_allows(!down);
                refusing = down;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_clock() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [7]), Some(7));
        assert_eq!(median(&mut [9, 1, 5]), Some(5));
        assert_eq!(median(&mut [10, 20]), Some(15));
        assert_eq!(median(&mut [u64::MAX, u64::MAX - 2]), Some(u64::MAX - 1), "no overflow");
        assert_eq!(median(&mut [4, 1, 3, 2]), Some(2));
    }

    const NOW: u64 = 1_800_000_000_000;
    const MAX: u64 = 500;

    /// With three voters, one clock 600 s off, the leader's or a follower's, does not move the
    /// stamp, and only the wrong node is out of bounds.
    #[test]
    fn one_wrong_clock_of_three_does_not_move_the_median() {
        let fast = NOW + 600_000;
        // The fast node itself: both peers read 600 s behind it.
        let a = assess(fast, true, 3, &[NOW + 3, NOW - 2], MAX);
        assert_eq!((a.median_ms, a.verdict), (NOW + 3, Verdict::OutOfBounds));
        assert_eq!(a.offset_ms, 600_000 - 3);
        assert_eq!(should_step_down(&a), Some(true));
        // A good node with the fast one among its peers.
        let a = assess(NOW, true, 3, &[fast, NOW + 40], MAX);
        assert_eq!((a.median_ms, a.offset_ms, a.verdict), (NOW + 40, -40, Verdict::InBounds));
        assert_eq!(should_step_down(&a), Some(false));
        // The mirror case: a slow node.
        let slow = NOW - 600_000;
        let a = assess(slow, true, 3, &[NOW, NOW + 1], MAX);
        assert_eq!((a.median_ms, a.verdict), (NOW, Verdict::OutOfBounds));
        let a = assess(NOW, true, 3, &[slow, NOW + 1], MAX);
        assert_eq!((a.median_ms, a.verdict), (NOW, Verdict::InBounds));
    }

    #[test]
    fn fewer_than_a_majority_of_clocks_cannot_tell() {
        let a = assess(NOW + 600_000, true, 3, &[], MAX);
        assert_eq!((a.verdict, a.known), (Verdict::Unverified, 1));
        assert_eq!(should_step_down(&a), None);
        // Two of three known: enough; when they disagree past twice the bound, neither can
        // tell who is right, and both are out of bounds.
        let a = assess(NOW, true, 3, &[NOW + 600_000], MAX);
        assert_eq!((a.median_ms, a.verdict), (NOW + 300_000, Verdict::OutOfBounds));
        let a = assess(NOW, true, 3, &[NOW + 800], MAX);
        assert_eq!((a.offset_ms, a.verdict), (-400, Verdict::InBounds));
        // A single voter is its own majority.
        assert_eq!(assess(NOW, true, 1, &[], MAX).verdict, Verdict::InBounds);
        // A learner counts only the voters' clocks.
        assert_eq!(assess(NOW, false, 3, &[NOW], MAX).verdict, Verdict::Unverified);
        assert_eq!(assess(NOW, false, 3, &[NOW, NOW], MAX).verdict, Verdict::InBounds);
    }

    #[test]
    fn the_bound_is_inclusive_and_offsets_saturate() {
        assert_eq!(assess(NOW + MAX, true, 3, &[NOW, NOW], MAX).verdict, Verdict::InBounds);
        assert_eq!(assess(NOW + MAX + 1, true, 3, &[NOW, NOW], MAX).verdict, Verdict::OutOfBounds);
        assert_eq!(signed_diff(u64::MAX, 0), i64::MAX);
        assert_eq!(signed_diff(0, u64::MAX), i64::MIN);
        assert_eq!(assess(0, true, 3, &[u64::MAX, u64::MAX], MAX).offset_ms, i64::MIN);
    }

    #[test]
    fn samples_stand_for_the_middle_of_the_round_trip_and_go_stale() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(40);
        let s = Sample::of_exchange(NOW, t0, t1).expect("a fast exchange");
        assert_eq!((s.at, s.rtt_ms), (t0 + Duration::from_millis(20), 40));
        // The peer's clock moves on with the monotonic clock, whatever this node's wall clock does.
        assert_eq!(s.estimate(s.at + Duration::from_millis(1_500)), Some(NOW + 1_500));
        assert_eq!(s.estimate(s.at + Duration::from_millis(CLOCK_SAMPLE_FRESH_MS + 1)), None, "stale is unknown");
        let slow = t0 + Duration::from_millis(CLOCK_PROBE_RTT_MAX_MS + 1);
        assert_eq!(Sample::of_exchange(NOW, t0, slow), None, "a slow exchange is discarded");
    }

    /// The node's own wall clock jumping between two probes does not move the median when it
    /// knows both peers: their clocks are extrapolated with the monotonic clock.
    #[test]
    fn a_jump_of_the_own_clock_between_probes_does_not_move_the_stamp() {
        let wall = Arc::new(std::sync::atomic::AtomicU64::new(NOW));
        let w = wall.clone();
        let clock = ClusterClock::new(Arc::new(move || w.load(std::sync::atomic::Ordering::Relaxed)), MAX);
        let t0 = Instant::now();
        for (peer, ms) in [(2, NOW + 10), (3, NOW - 10)] {
            clock.samples().insert(peer, Sample::of_exchange(ms, t0, t0).expect("sample"));
        }
        let voters: BTreeSet<NodeId> = [1, 2, 3].into();
        assert_eq!(clock.assess_at(1, &voters, t0).median_ms, NOW);
        let later = t0 + Duration::from_millis(700);
        wall.store(NOW + 700 + 600_000, std::sync::atomic::Ordering::Relaxed);
        let a = clock.assess_at(1, &voters, later);
        assert_eq!((a.median_ms, a.verdict), (NOW + 710, Verdict::OutOfBounds));
        assert_eq!(clock.peer_offsets_at(later)[&3], -600_010);
    }
}
