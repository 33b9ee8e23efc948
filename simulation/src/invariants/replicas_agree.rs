//! **Replicas converge** — SPEC §2.2 (one history on every node) and the Raft paper §5.3 (Log
//! Matching, and a leader brings every follower's log in line with its own).
//!
//! After the heal phase every node has applied the same barrier entry and nothing is being
//! written, so every node must hold exactly the same streams, the same metadata (first and last
//! seq, `evicted_through`, batch count) and the same retained batches. A node that cannot be
//! read at all is reported by the liveness check.

use crate::history::History;

use super::Violation;

const NAME: &str = "replicas_agree";

pub(super) fn check(h: &History, out: &mut Vec<Violation>) {
    let readable: Vec<_> = h.finals.iter().filter_map(|f| f.streams.as_ref().ok().map(|s| (f.node, s))).collect();
    // Each node's own metadata against what it stores, the first node's included (comparing
    // the others with it would miss a miscount that every node shares).
    for (n, streams) in &readable {
        for (name, s) in streams.iter() {
            if s.batches.len() as u64 != s.batches_counted {
                out.push(Violation {
                    invariant: NAME,
                    detail: format!(
                        "{name} on n{n}: metadata counts {} batches but {} are stored",
                        s.batches_counted,
                        s.batches.len()
                    ),
                });
            }
        }
    }
    let Some((n0, first)) = readable.first() else { return };
    for (n, streams) in &readable[1..] {
        let names: Vec<&String> = streams.keys().collect();
        let names0: Vec<&String> = first.keys().collect();
        if names != names0 {
            out.push(Violation {
                invariant: NAME,
                detail: format!("n{n0} has streams {names0:?} but n{n} has {names:?}"),
            });
            continue;
        }
        for (name, s) in streams.iter() {
            let s0 = &first[name];
            let meta = (s.first_seq, s.last_seq, s.evicted_through, s.batches_counted);
            let meta0 = (s0.first_seq, s0.last_seq, s0.evicted_through, s0.batches_counted);
            if meta != meta0 {
                out.push(Violation {
                    invariant: NAME,
                    detail: format!(
                        "{name}: (first_seq, last_seq, evicted_through, batches) is {meta0:?} on n{n0} but {meta:?} on n{n}"
                    ),
                });
            }
            if s.batches != s0.batches {
                let seqs: Vec<u64> = s.batches.iter().map(|b| b.seq).collect();
                let seqs0: Vec<u64> = s0.batches.iter().map(|b| b.seq).collect();
                out.push(Violation {
                    invariant: NAME,
                    detail: format!("{name}: retained batches differ: n{n0} has seqs {seqs0:?}, n{n} has {seqs:?}"),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::history::FinalStream;
    use crate::invariants::fixtures::*;

    #[test]
    fn a_replica_missing_an_unacknowledged_batch_is_flagged() {
        let mut h = good();
        // Only one node has an extra batch nobody acknowledged (so no ack is lost).
        h.publishes.push(crate::history::Publish {
            publisher: crate::history::Publisher::Workload(0),
            stream: "s".into(),
            seq: Some(5),
            payload: b"e".to_vec(),
            attempts: vec![unknown()],
        });
        on_node(&mut h, 1, "s", |s| {
            s.batches.push(batch(5, "e"));
            s.batches_counted += 1;
            s.last_seq = 5;
        });
        assert_eq!(broken(&h), vec!["replicas_agree"]);
    }

    #[test]
    fn different_metadata_is_flagged() {
        let mut h = good();
        on_node(&mut h, 2, "r", |s| s.evicted_through = 3);
        assert!(broken(&h).contains(&"replicas_agree"));
    }

    #[test]
    fn different_stream_sets_are_flagged() {
        // n3 also has a stream nobody else has (empty, so no batch observation is involved).
        let mut h = good();
        let extra = FinalStream { first_seq: 1, last_seq: 0, evicted_through: 0, batches_counted: 0, batches: vec![] };
        h.finals[2].streams.as_mut().unwrap().insert("x".into(), extra);
        assert_eq!(broken(&h), vec!["replicas_agree"]);
    }

    /// Regression: the count was compared with the stored batches on every node but the first,
    /// so a miscount shared by every node, or on the only readable node, went unseen.
    #[test]
    fn a_count_that_does_not_match_the_stored_batches_is_flagged() {
        // Every node agrees with every other, and every one of them miscounts.
        let mut h = good();
        on_all_nodes(&mut h, "s", |s| s.batches_counted = 4);
        assert_eq!(broken(&h), vec!["replicas_agree"]);
        let details: Vec<String> = crate::invariants::check(&h).into_iter().map(|v| v.detail).collect();
        assert_eq!(details.len(), 3, "one per node, the first included: {details:?}");
        // The only readable node miscounts.
        let mut h = good();
        on_node(&mut h, 1, "s", |s| s.batches_counted = 2);
        h.finals.truncate(1);
        assert_eq!(broken(&h), vec!["replicas_agree"]);
    }
}
