//! **Idempotent publish on (stream, seq)** — SPEC §2.3: a retry of the same (stream, seq) and
//! payload is recognised (`200`, `"duplicate": true`, nothing written), across leader failover
//! and crashes, so it is stored once.
//!
//! Checked for every publish that carried a seq:
//! - every acknowledgement names the seq that was asked for;
//! - its payload is stored under that seq only (never a second time under another seq);
//! - `duplicate: true` comes only when the batch really is stored (observed with this payload
//!   at that seq, or since evicted by retention). (It may answer the first call of a publish:
//!   the client retries inside one call, and an earlier HTTP send may have stored the batch.)
//! - the cluster never rejects one of the workload's publishes: publishers only resend the
//!   same (seq, payload) and only move forward, so `409 seq_conflict`, `seq_not_increasing`,
//!   `seq_evicted` or a `404` (the stream was created before publishing began) are wrong —
//!   but where the control client deleted the stream (contract §5): a `404` while it may have
//!   been gone (the attempt overlaps the time from the first delete call to the answer of the
//!   creation again), and `409 seq_evicted` for a seq at or below the `evicted_through` a
//!   creation again answered (the deleted stream's seqs, which a resend may carry).
//!
//! Publishes without seq are at-least-once by design (a resend after an unknown outcome may
//! store the payload twice, README "Retries"); for them only the last rule applies, and
//! `duplicate: true` must never appear.

use std::collections::{BTreeMap, BTreeSet};

use crate::history::{Attempt, History, Outcome, Publish};

use super::{Observations, Source, Violation};

const NAME: &str = "idempotent_publish";

pub(super) fn check(h: &History, obs: &Observations, out: &mut Vec<Violation>) {
    // (stream, payload) → seqs it was seen at (outside acknowledgements).
    let mut stored_at: BTreeMap<(&str, &[u8]), BTreeSet<u64>> = BTreeMap::new();
    for ((stream, seq), seen) in obs {
        for o in seen.iter().filter(|o| !matches!(o.source, Source::Ack(_))) {
            stored_at.entry((stream.as_str(), o.data.as_slice())).or_default().insert(*seq);
        }
    }
    for (i, p) in h.publishes.iter().enumerate() {
        let mut v = |detail: String| out.push(Violation { invariant: NAME, detail });
        for (k, a) in p.attempts.iter().enumerate() {
            match &a.outcome {
                Outcome::Rejected { status, code } if refused_across_a_delete(h, p, a, *status, code) => {}
                Outcome::Rejected { status, code } => v(format!(
                    "publish #{i} to {} (seq {:?}, attempt {k}{}) was rejected with {status} {code} (attempts before: {:?})",
                    p.stream,
                    p.seq,
                    if a.deliberate_resend { ", a deliberate resend" } else { "" },
                    p.attempts[..k].iter().map(|a| &a.outcome).collect::<Vec<_>>()
                )),
                Outcome::Ack { seq, duplicate, .. } => {
                    if p.seq.is_some_and(|s| s != *seq) {
                        v(format!("publish #{i} asked for {}/{:?} but was acknowledged as seq {seq}", p.stream, p.seq));
                    }
                    if *duplicate && p.seq.is_none() {
                        v(format!("publish #{i} to {} had no seq yet was answered duplicate: true", p.stream));
                    }
                    if *duplicate {
                        let seen_here = stored_at
                            .get(&(p.stream.as_str(), p.payload.as_slice()))
                            .is_some_and(|seqs| seqs.contains(seq));
                        let evicted = h.may_evict(&p.stream) && *seq <= h.evicted_through(&p.stream);
                        if !seen_here && !evicted {
                            v(format!(
                                "publish #{i} to {}/{seq} was answered duplicate: true but that batch is stored nowhere",
                                p.stream
                            ));
                        }
                    }
                }
                Outcome::Unknown(_) => {}
            }
        }
        if let Some(requested) = p.seq {
            if let Some(seqs) = stored_at.get(&(p.stream.as_str(), p.payload.as_slice())) {
                let elsewhere: Vec<&u64> = seqs.iter().filter(|s| **s != requested).collect();
                if !elsewhere.is_empty() {
                    v(format!(
                        "publish #{i} to {}/{requested} is stored under other seqs too: {elsewhere:?}",
                        p.stream
                    ));
                }
            }
        }
    }
}

/// Whether rejection `status code` of attempt `a` of publish `p` is the contract's answer
/// because its stream was deleted: `404 stream_not_found` while it may have been gone, `409
/// seq_evicted` for a seq of a deleted incarnation (at or below what a creation again answered
/// as `evicted_through`, for a deletion that began before the answer came).
fn refused_across_a_delete(h: &History, p: &Publish, a: &Attempt, status: u16, code: &str) -> bool {
    let deletions = h.deletions.iter().filter(|d| d.stream == p.stream && d.delete_sent_ms <= a.at_ms);
    match (status, code) {
        (404, "stream_not_found") => deletions.clone().any(|d| d.recreated.is_none_or(|r| a.sent_ms <= r.at_ms)),
        (409, "seq_evicted") => {
            p.seq.is_some_and(|seq| deletions.clone().any(|d| d.recreated.is_some_and(|r| seq <= r.evicted_through)))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use crate::history::{Attempt, Outcome, Seen};
    use crate::invariants::fixtures::*;

    #[test]
    fn a_retried_publish_stored_twice_is_flagged() {
        let mut h = good();
        // The retried seq 2 ("b") also shows up as seq 5 on every node.
        on_all_nodes(&mut h, "s", |s| {
            s.batches.push(batch(5, "b"));
            s.batches_counted += 1;
            s.last_seq = 5;
        });
        h.liveness.subscriber_positions = vec![(0, 5, 5), (1, 4, 4)];
        assert!(broken(&h).contains(&"idempotent_publish"));
    }

    #[test]
    fn duplicate_true_for_a_batch_stored_nowhere_is_flagged() {
        let mut h = good();
        h.publishes.push(crate::history::Publish {
            publisher: crate::history::Publisher::Workload(0),
            stream: "s".into(),
            seq: Some(6),
            payload: b"f".to_vec(),
            attempts: vec![unknown(), ack(6, true)],
        });
        let b = broken(&h);
        assert!(b.contains(&"idempotent_publish"), "{b:?}");
    }

    #[test]
    fn duplicate_true_for_a_seqless_publish_is_flagged() {
        let mut h = good();
        h.publishes[0].seq = None;
        h.publishes[0].attempts = vec![ack(1, true)];
        assert_eq!(broken(&h), vec!["idempotent_publish"]);
    }

    #[test]
    fn an_ack_naming_another_seq_is_flagged() {
        // Publish #0 asked for s/1; suppose the answer named seq 3 (and the nodes agree that
        // its payload sits at 3): the publisher's own seq was not honoured.
        let mut h = good();
        h.publishes[0].attempts = vec![ack(3, false)];
        on_all_nodes(&mut h, "s", |s| {
            s.batches.retain(|b| b.seq != 1);
            s.batches.insert(1, batch(3, "a"));
            s.first_seq = 2;
        });
        h.subscribers[0].events =
            vec![(2, Seen::Batch(batch(2, "b"))), (3, Seen::Batch(batch(3, "a"))), (4, Seen::Batch(batch(4, "d")))];
        let details: Vec<String> = crate::invariants::check(&h).into_iter().map(|v| v.to_string()).collect();
        assert!(
            details.iter().any(
                |d| d.contains("[idempotent_publish] publish #0 asked for s/Some(1) but was acknowledged as seq 3")
            ),
            "{details:?}"
        );
        assert_eq!(broken(&h), vec!["idempotent_publish"], "{details:?}");
    }

    /// A deleted stream (contract §5): `404` only while it may have been gone, `409 seq_evicted`
    /// only for a seq of the deleted stream.
    #[test]
    fn refusals_across_a_delete_are_allowed_only_where_the_stream_was_gone() {
        let refused = |sent_ms, at_ms, status, code: &str| Attempt {
            sent_ms,
            at_ms,
            deliberate_resend: false,
            outcome: Outcome::Rejected { status, code: code.into() },
        };
        // The resend of s/1 after the re-creation is refused 409 seq_evicted: right.
        assert_eq!(broken(&good_with_delete()), Vec::<&str>::new());
        // s/5 (publish #7) refused 404 while s was deleted (100..200 ms), then acknowledged.
        let mut h = good_with_delete();
        h.publishes[7].attempts.insert(0, refused(150, 160, 404, "stream_not_found"));
        assert_eq!(broken(&h), Vec::<&str>::new());
        // ... but a 404 before the delete began, or sent after the stream was back, is wrong.
        h.publishes[7].attempts[0] = refused(60, 70, 404, "stream_not_found");
        assert_eq!(broken(&h), vec!["idempotent_publish"]);
        h.publishes[7].attempts[0] = refused(201, 203, 404, "stream_not_found");
        assert_eq!(broken(&h), vec!["idempotent_publish"]);
        // 409 seq_evicted for s/5, above the deleted stream's seqs, is wrong.
        let mut h = good_with_delete();
        h.publishes[7].attempts.insert(0, refused(210, 212, 409, "seq_evicted"));
        assert_eq!(broken(&h), vec!["idempotent_publish"]);
    }

    #[test]
    fn a_conflict_answer_to_a_resend_is_flagged() {
        let mut h = good();
        h.publishes[2].attempts.push(Attempt {
            sent_ms: 98,
            at_ms: 99,
            deliberate_resend: true,
            outcome: Outcome::Rejected { status: 409, code: "seq_not_increasing".into() },
        });
        assert_eq!(broken(&h), vec!["idempotent_publish"]);
    }
}
