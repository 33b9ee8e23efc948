//! **One history** — SPEC §2.2 (every node serves the same bytes, seq and ts for a given
//! (stream, seq), forever, and never a batch that is not committed) and the Raft paper §5.4.3
//! (State Machine Safety: no two servers apply different commands at the same log index).
//!
//! Every observation of a (stream, seq) — any node's final state, any subscriber's delivery,
//! any read probe, any acknowledgement — must agree on the payload and the ts; and every
//! payload observed on a stream must be one some publisher sent to that stream (a node never
//! makes data up, nor moves a batch to another stream). And what a subscriber or a read was
//! served must be in the final history of every node (or since evicted by retention): a node
//! that served an uncommitted entry, later truncated, shows up here.

use std::collections::BTreeSet;

use crate::history::History;

use super::{Observations, Source, Violation};

const NAME: &str = "one_history";

pub(super) fn check(h: &History, obs: &Observations, out: &mut Vec<Violation>) {
    for ((stream, seq), seen) in obs {
        let first = &seen[0];
        if let Some(other) = seen.iter().find(|o| o.data != first.data || o.ts != first.ts) {
            out.push(Violation {
                invariant: NAME,
                detail: format!(
                    "{stream}/{seq} has two versions: {:?} saw {} bytes ts {}, {:?} saw {} bytes ts {}",
                    first.source,
                    first.data.len(),
                    first.ts,
                    other.source,
                    other.data.len(),
                    other.ts
                ),
            });
        }
        let sent: BTreeSet<&[u8]> =
            h.publishes.iter().filter(|p| &p.stream == stream).map(|p| p.payload.as_slice()).collect();
        for o in seen {
            if !sent.contains(o.data.as_slice()) {
                out.push(Violation {
                    invariant: NAME,
                    detail: format!(
                        "{stream}/{seq} as {:?} saw it holds {} bytes nobody published to {stream}",
                        o.source,
                        o.data.len()
                    ),
                });
                break;
            }
        }
        let served = seen.iter().find(|o| matches!(o.source, Source::Subscriber(_) | Source::Read(_)));
        if let Some(o) = served {
            for f in &h.finals {
                let Ok(streams) = &f.streams else { continue };
                let Some(s) = streams.get(stream) else { continue };
                let held = s.batches.iter().any(|b| b.seq == *seq);
                let evicted = h.may_evict(stream) && *seq <= s.evicted_through;
                if !held && !evicted {
                    out.push(Violation {
                        invariant: NAME,
                        detail: format!(
                            "{stream}/{seq} was served to {:?} but n{} does not hold it (last_seq {}, evicted_through {})",
                            o.source, f.node, s.last_seq, s.evicted_through
                        ),
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::history::Seen;
    use crate::invariants::fixtures::*;

    #[test]
    fn a_divergent_replica_is_flagged() {
        let mut h = good();
        on_node(&mut h, 2, "s", |s| s.batches[2].data = b"a".to_vec());
        let b = broken(&h);
        assert!(b.contains(&"one_history"), "{b:?}");
        assert!(b.contains(&"replicas_agree"), "{b:?}");
    }

    #[test]
    fn a_subscriber_seeing_other_bytes_is_flagged() {
        let mut h = good();
        h.subscribers[0].events[1].1 = Seen::Batch(batch(2, "not-b"));
        assert!(broken(&h).contains(&"one_history"));
    }

    #[test]
    fn a_served_batch_missing_from_the_final_history_is_flagged() {
        let mut h = good();
        // A subscriber was served seq 3 of `s`, which no node holds (3 was a hole).
        h.publishes.push(crate::history::Publish {
            publisher: crate::history::Publisher::Workload(0),
            stream: "s".into(),
            seq: Some(3),
            payload: b"c".to_vec(),
            attempts: vec![unknown()],
        });
        h.subscribers[0].events.insert(2, (3, Seen::Batch(batch(3, "c"))));
        assert_eq!(broken(&h), vec!["one_history"]);
    }

    #[test]
    fn a_payload_nobody_published_is_flagged() {
        // Every node agrees on s/3, but nobody ever published its bytes.
        let mut h = good();
        on_all_nodes(&mut h, "s", |s| {
            s.batches.insert(2, batch(3, "made up"));
            s.batches_counted += 1;
        });
        h.subscribers[0].events.insert(2, (3, Seen::Batch(batch(3, "made up"))));
        assert_eq!(broken(&h), vec!["one_history"]);
        // A payload published to another stream is not one published to this one.
        let mut h = good();
        on_all_nodes(&mut h, "s", |s| {
            s.batches.insert(2, batch(3, "r3"));
            s.batches_counted += 1;
        });
        h.subscribers[0].events.insert(2, (3, Seen::Batch(batch(3, "r3"))));
        assert_eq!(broken(&h), vec!["one_history"]);
    }

    #[test]
    fn a_different_ts_is_a_different_history() {
        let mut h = good();
        on_node(&mut h, 1, "s", |s| s.batches[0].ts += 1);
        assert!(broken(&h).contains(&"one_history"));
    }
}
