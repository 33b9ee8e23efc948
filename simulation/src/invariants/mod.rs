//! The history checker: one file per invariant, each citing the rule it checks (a section of
//! `shared/SPEC.md` or of the Raft paper, Ongaro & Ousterhout 2014).
//!
//! Owns: deciding whether a run's [`History`] is correct. Every check reads the history only:
//! it draws no randomness and changes nothing, so enabling or disabling one never changes a run.
//! Must never: excuse a violation because of a fault; faults are the point.

mod acked_durable;
mod idempotent_publish;
mod incarnations;
mod liveness;
mod node_health;
mod one_history;
mod read_your_writes;
mod replicas_agree;
mod subscriber_view;
mod ts_order;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::history::{History, NodeId, Seen};

/// A broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The invariant's name (its file under `src/invariants/`).
    pub invariant: &'static str,
    /// What was seen, with the values.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.invariant, self.detail)
    }
}

/// Where an observation of a batch came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    /// A node's final state.
    Node(NodeId),
    /// A subscriber's delivery.
    Subscriber(usize),
    /// A read-your-writes probe on a node.
    Read(NodeId),
    /// A publish acknowledgement (its ts, and the payload that was sent).
    Ack(usize),
}

/// One observation of (stream, seq).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// Who showed it.
    pub source: Source,
    /// Its ts.
    pub ts: u64,
    /// Its payload.
    pub data: Vec<u8>,
}

/// Every observation of every batch in the history, by (stream, seq).
pub type Observations = BTreeMap<(String, u64), Vec<Observed>>;

/// Collects every observation of a batch: final states, deliveries, read probes and
/// acknowledgements.
pub fn observations(h: &History) -> Observations {
    let mut out: Observations = BTreeMap::new();
    let mut add = |stream: &str, seq: u64, o: Observed| out.entry((stream.to_string(), seq)).or_default().push(o);
    for f in &h.finals {
        if let Ok(streams) = &f.streams {
            for (name, s) in streams {
                for b in &s.batches {
                    add(name, b.seq, Observed { source: Source::Node(f.node), ts: b.ts, data: b.data.clone() });
                }
            }
        }
    }
    for s in &h.subscribers {
        for (_, e) in &s.events {
            if let Seen::Batch(b) = e {
                add(&s.stream, b.seq, Observed { source: Source::Subscriber(s.id), ts: b.ts, data: b.data.clone() });
            }
        }
    }
    for r in &h.read_checks {
        if let Ok((_, batches)) = &r.answer {
            for b in batches {
                add(&r.stream, b.seq, Observed { source: Source::Read(r.node), ts: b.ts, data: b.data.clone() });
            }
        }
    }
    for (i, p) in h.publishes.iter().enumerate() {
        for (seq, ts, _, _) in p.acks() {
            add(&p.stream, seq, Observed { source: Source::Ack(i), ts, data: p.payload.clone() });
        }
    }
    out
}

/// The seqs of `stream` known to have held a batch at some point.
pub fn known_seqs(obs: &Observations, stream: &str) -> BTreeSet<u64> {
    obs.range((stream.to_string(), 0)..=(stream.to_string(), u64::MAX)).map(|((_, seq), _)| *seq).collect()
}

/// Runs every invariant over `h`.
pub fn check(h: &History) -> Vec<Violation> {
    let obs = observations(h);
    let mut v = Vec::new();
    node_health::check(h, &mut v);
    acked_durable::check(h, &mut v);
    one_history::check(h, &obs, &mut v);
    replicas_agree::check(h, &mut v);
    idempotent_publish::check(h, &obs, &mut v);
    subscriber_view::check(h, &obs, &mut v);
    read_your_writes::check(h, &mut v);
    ts_order::check(h, &mut v);
    incarnations::check(h, &mut v);
    liveness::check(h, &mut v);
    v
}

/// Synthetic histories for the checker's own tests: a small correct run to break on purpose.
#[cfg(test)]
pub(crate) mod fixtures {
    use std::collections::BTreeMap;

    use crate::history::*;

    pub fn batch(seq: u64, data: &str) -> Batch {
        Batch { seq, ts: 1_000 + seq, data: data.as_bytes().to_vec() }
    }

    pub fn ack(seq: u64, duplicate: bool) -> Attempt {
        Attempt {
            sent_ms: seq * 10 - 5,
            at_ms: seq * 10,
            deliberate_resend: false,
            outcome: Outcome::Ack { seq, ts: 1_000 + seq, duplicate, index: 10 + seq },
        }
    }

    pub fn unknown() -> Attempt {
        Attempt { sent_ms: 0, at_ms: 1, deliberate_resend: false, outcome: Outcome::Unknown("timed out".into()) }
    }

    fn final_stream(batches: Vec<Batch>, evicted_through: u64, last_seq: u64) -> FinalStream {
        FinalStream {
            first_seq: batches.first().map_or(last_seq + 1, |b| b.seq),
            last_seq,
            evicted_through,
            batches_counted: batches.len() as u64,
            batches,
        }
    }

    /// Stream `s` (no retention): seqs 1, 2, 4 (3 is a publisher's hole), all acknowledged,
    /// seq 2 after a retry; stream `r` (max 2 batches): seqs 1..=4, 1 and 2 evicted. One
    /// subscriber on each, the one on `r` told about the gap. Three identical nodes.
    pub fn good() -> History {
        let s_batches = vec![batch(1, "a"), batch(2, "b"), batch(4, "d")];
        let r_batches = vec![batch(3, "r3"), batch(4, "r4")];
        let mut streams = BTreeMap::new();
        streams.insert("s".to_string(), final_stream(s_batches.clone(), 0, 4));
        streams.insert("r".to_string(), final_stream(r_batches.clone(), 2, 4));
        let pubs = vec![
            Publish {
                publisher: Publisher::Workload(0),
                stream: "s".into(),
                seq: Some(1),
                payload: b"a".to_vec(),
                attempts: vec![ack(1, false)],
            },
            Publish {
                publisher: Publisher::Workload(0),
                stream: "s".into(),
                seq: Some(2),
                payload: b"b".to_vec(),
                attempts: vec![unknown(), ack(2, true)],
            },
            Publish {
                publisher: Publisher::Workload(0),
                stream: "s".into(),
                seq: Some(4),
                payload: b"d".to_vec(),
                attempts: vec![ack(4, false)],
            },
            Publish {
                publisher: Publisher::Workload(1),
                stream: "r".into(),
                seq: Some(1),
                payload: b"r1".to_vec(),
                attempts: vec![ack(1, false)],
            },
            Publish {
                publisher: Publisher::Workload(1),
                stream: "r".into(),
                seq: Some(2),
                payload: b"r2".to_vec(),
                attempts: vec![ack(2, false)],
            },
            Publish {
                publisher: Publisher::Workload(1),
                stream: "r".into(),
                seq: Some(3),
                payload: b"r3".to_vec(),
                attempts: vec![ack(3, false)],
            },
            Publish {
                publisher: Publisher::Workload(1),
                stream: "r".into(),
                seq: Some(4),
                payload: b"r4".to_vec(),
                attempts: vec![ack(4, false)],
            },
        ];
        History {
            seed: 1,
            streams: vec![
                StreamSpec { name: "s".into(), max_batches: None },
                StreamSpec { name: "r".into(), max_batches: Some(2) },
            ],
            publishes: pubs,
            subscribers: vec![
                SubscriberLog {
                    id: 0,
                    stream: "s".into(),
                    start_after: 0,
                    events: s_batches.iter().map(|b| (b.seq, Seen::Batch(b.clone()))).collect(),
                },
                SubscriberLog {
                    id: 1,
                    stream: "r".into(),
                    start_after: 0,
                    events: vec![
                        (1, Seen::Batch(batch(1, "r1"))),
                        (2, Seen::Gap { from: 2, to: 2 }),
                        (3, Seen::Restart { cursor: 2 }),
                        (4, Seen::Batch(batch(3, "r3"))),
                        (5, Seen::Batch(batch(4, "r4"))),
                    ],
                },
            ],
            read_checks: vec![ReadCheck {
                node: 2,
                stream: "s".into(),
                seq: 2,
                payload: b"b".to_vec(),
                min_index: 12,
                answer: Ok((None, vec![batch(2, "b")])),
            }],
            finals: (1..=3).map(|node| NodeFinal { node, streams: Ok(streams.clone()) }).collect(),
            liveness: Liveness {
                heal_started_at_ms: 50,
                converged_at_ms: Some(100),
                publishers_finished: true,
                subscriber_positions: vec![(0, 4, 4), (1, 4, 4)],
                problems: vec![],
            },
            ..Default::default()
        }
    }

    /// [`good`], then stream `s` deleted (read at 100 ms holding 1, 2 and 4; deleted at 110 ms)
    /// and created again at 200 ms after its old seqs (`first_seq` 5, `evicted_through` 4);
    /// publish #0's seq 1 is resent at 201 ms and refused `409 seq_evicted`, and two new
    /// batches, 5 and 6, are acknowledged (publishes #7 and #8). The subscriber on `s` had
    /// received every batch of the deleted stream and goes on with 5 and 6 (no gap due).
    pub fn good_with_delete() -> History {
        let mut h = good();
        let digest = |d: &str| fnv(d.as_bytes());
        h.deletions.push(Deletion {
            stream: "s".into(),
            before: BeforeDelete {
                read_ms: 100,
                min_index: 17,
                batches: vec![(1, 1_001, digest("a")), (2, 1_002, digest("b")), (4, 1_004, digest("d"))],
                last_seq: 4,
                evicted_through: 0,
            },
            delete_sent_ms: 100,
            deleted_at_ms: 110,
            already: false,
            recreated: Some(Recreated { at_ms: 200, created: true, first_seq: 5, last_seq: 4, evicted_through: 4 }),
        });
        h.publishes[0].attempts.push(Attempt {
            sent_ms: 201,
            at_ms: 205,
            deliberate_resend: true,
            outcome: Outcome::Rejected { status: 409, code: "seq_evicted".into() },
        });
        for (seq, data) in [(5, "e"), (6, "f")] {
            h.publishes.push(Publish {
                publisher: Publisher::Workload(0),
                stream: "s".into(),
                seq: Some(seq),
                payload: data.as_bytes().to_vec(),
                attempts: vec![Attempt {
                    sent_ms: 200 + 10 * seq,
                    at_ms: 205 + 10 * seq,
                    deliberate_resend: false,
                    outcome: Outcome::Ack { seq, ts: 1_000 + seq, duplicate: false, index: 30 + seq },
                }],
            });
            h.subscribers[0].events.push((205 + 10 * seq, Seen::Batch(batch(seq, data))));
        }
        let fresh = FinalStream {
            first_seq: 5,
            last_seq: 6,
            evicted_through: 4,
            batches_counted: 2,
            batches: vec![batch(5, "e"), batch(6, "f")],
        };
        for f in &mut h.finals {
            f.streams.as_mut().unwrap().insert("s".into(), fresh.clone());
        }
        h.liveness.subscriber_positions[0] = (0, 6, 6);
        h
    }

    /// The invariants `h` breaks, by name, each once.
    pub fn broken(h: &History) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = super::check(h).into_iter().map(|v| v.invariant).collect();
        names.dedup();
        names
    }

    /// Applies `f` to node `node`'s copy of `stream`.
    pub fn on_node(h: &mut History, node: u64, stream: &str, f: impl FnOnce(&mut FinalStream)) {
        let fin = h.finals.iter_mut().find(|n| n.node == node).unwrap();
        f(fin.streams.as_mut().unwrap().get_mut(stream).unwrap());
    }

    /// Applies `f` to every node's copy of `stream`.
    pub fn on_all_nodes(h: &mut History, stream: &str, f: impl Fn(&mut FinalStream)) {
        for node in 1..=3 {
            on_node(h, node, stream, &f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;

    #[test]
    fn a_correct_history_passes_every_invariant() {
        let h = good();
        assert_eq!(super::check(&h), vec![]);
    }
}
