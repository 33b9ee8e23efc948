//! **A stream deleted and created again is a new incarnation that continues after the old
//! one** — [contract §5](../docs/contract.md#5-gaps-are-announced-never-silent) ("a stream
//! deleted and created again continues after the deleted stream's `last_seq`, and the old seqs
//! count as evicted": `first_seq = old last_seq + 1`, `evicted_through = old last_seq`, a retry
//! of an old seq is answered `409 seq_evicted`), the definition of a seq (contract, terms: never
//! given to another batch, not even after the stream is deleted and created again), and §1
//! (an acknowledged batch is kept, until the stream is deleted).
//!
//! For every deletion the control client made (`History::deletions`):
//! - **nothing acknowledged was lost before the delete**: every batch acknowledged before the
//!   control client read the stream for its deletion (with `min_index` = the highest index
//!   acknowledged by then) is in that read, with its payload and ts, unless the read was told
//!   it is evicted (retention, or an earlier incarnation);
//! - the read is one incarnation: strictly increasing seqs, none above its `last_seq`;
//! - **the new incarnation continues after the old one**: its creation answers
//!   `evicted_through >= ` the old `last_seq` as read, `first_seq > evicted_through`, and, when
//!   it was created by that call, exactly `first_seq = last_seq + 1 = evicted_through + 1`; every
//!   node's final copy of the stream holds no batch at or below its `evicted_through`, which is
//!   at least every deleted incarnation's `last_seq`;
//! - **a seq of a deleted incarnation is never answered as stored in a later one**: a publish
//!   sent after the creation again whose acknowledgement names a seq at or below the deleted
//!   `last_seq` is a violation: `duplicate: true` means the dedup of the deleted stream
//!   survived, `duplicate: false` that a seq was given twice (the workload resends one such
//!   batch after every re-creation: the answer must be `409 seq_evicted`).
//!
//! Subscribers across a deletion are checked by `subscriber_view` (the deleted incarnation's
//! batches count as known seqs there, so skipping one without a gap is a silent gap; on a
//! stream without retention a gap must end where a deleted incarnation did).

use crate::history::{fnv, History, Outcome};

use super::Violation;

const NAME: &str = "incarnations";

pub(super) fn check(h: &History, out: &mut Vec<Violation>) {
    let mut v = |detail: String| out.push(Violation { invariant: NAME, detail });
    for (k, d) in h.deletions.iter().enumerate() {
        let b = &d.before;
        let name = &d.stream;
        // The read of the incarnation being deleted.
        for w in b.batches.windows(2) {
            if w[1].0 <= w[0].0 {
                v(format!("deletion #{k} of {name}: the read before it went from seq {} to {}", w[0].0, w[1].0));
            }
        }
        // (Not checked against its `evicted_through`: that is the highest any page announced, and
        // on a stream with retention a later page may announce evictions past an earlier page's
        // batches: seed 72.)
        if let Some(&(seq, _, _)) = b.batches.iter().find(|(s, _, _)| *s == 0 || *s > b.last_seq) {
            v(format!("deletion #{k} of {name}: the read before it holds seq {seq}, past its last_seq {}", b.last_seq));
        }
        for (i, p) in h.publishes.iter().enumerate().filter(|(_, p)| &p.stream == name) {
            for a in &p.attempts {
                let Outcome::Ack { seq, ts, duplicate, index } = a.outcome else { continue };
                // Acknowledged before the read: it must be in it.
                if a.at_ms < b.read_ms {
                    match b.batches.iter().find(|(s, _, _)| *s == seq) {
                        Some(&(_, t, digest)) if t == ts && digest == fnv(&p.payload) => {}
                        Some(&(_, t, _)) => v(format!(
                            "deletion #{k} of {name}: just before it, seq {seq} held other bytes or ts {t}, but publish #{i} was acknowledged there with its own payload and ts {ts}"
                        )),
                        None if seq <= b.evicted_through => {}
                        None => v(format!(
                            "deletion #{k} of {name}: acknowledged batch {name}/{seq} (publish #{i}, index {index}, at {} ms) was not in the stream read at {} ms with min_index {} just before the delete (last_seq {}, evicted_through {})",
                            a.at_ms, b.read_ms, b.min_index, b.last_seq, b.evicted_through
                        )),
                    }
                }
                // Sent after the creation again: a seq of the deleted incarnation is gone.
                if let Some(r) = d.recreated {
                    if a.sent_ms >= r.at_ms && seq <= b.last_seq {
                        v(format!(
                            "publish #{i} to {name}/{seq}, sent at {} ms after the stream was deleted and created again (at {} ms; the deleted stream's last_seq {}), was answered as stored (duplicate: {duplicate}, index {index}) instead of 409 seq_evicted",
                            a.sent_ms, r.at_ms, b.last_seq
                        ));
                    }
                }
            }
        }
        // The creation again continues after the deleted seqs.
        if let Some(r) = d.recreated {
            let exact = !r.created || (r.first_seq == r.last_seq.saturating_add(1) && r.last_seq == r.evicted_through);
            if r.evicted_through < b.last_seq
                || r.first_seq <= r.evicted_through
                || r.last_seq < r.evicted_through
                || !exact
            {
                v(format!(
                    "deletion #{k} of {name} (last_seq {} when read): created again as first_seq {} last_seq {} evicted_through {} (created: {}), not after the deleted seqs",
                    b.last_seq, r.first_seq, r.last_seq, r.evicted_through, r.created
                ));
            }
        }
    }
    // Every node's final copy of a deleted stream.
    for f in &h.finals {
        let Ok(streams) = &f.streams else { continue };
        for (name, s) in streams {
            let deleted_last = h.deletions.iter().filter(|d| &d.stream == name).map(|d| d.before.last_seq).max();
            let Some(deleted_last) = deleted_last else { continue };
            if s.evicted_through < deleted_last {
                v(format!(
                    "n{}: {name} has evicted_through {} below a deleted incarnation's last_seq {deleted_last}",
                    f.node, s.evicted_through
                ));
            }
            if let Some(b) = s.batches.iter().find(|b| b.seq <= s.evicted_through) {
                v(format!(
                    "n{}: {name} holds seq {} at or below its evicted_through {} (a deleted incarnation's batch, or a seq given twice)",
                    f.node, b.seq, s.evicted_through
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::history::{Outcome, Seen};
    use crate::invariants::fixtures::*;

    fn incarnation_violations(h: &crate::history::History) -> Vec<String> {
        crate::invariants::check(h).into_iter().filter(|v| v.invariant == "incarnations").map(|v| v.detail).collect()
    }

    /// `h` breaks `incarnations` once, saying `what`, and no other invariant.
    fn only_one_incarnation_violation(h: &crate::history::History, what: &str) {
        let details = incarnation_violations(h);
        assert_eq!(details.len(), 1, "{details:?}");
        assert!(details[0].contains(what), "{details:?}");
        assert_eq!(broken(h), vec!["incarnations"]);
    }

    #[test]
    fn a_delete_and_re_create_that_keep_the_contract_pass_every_invariant() {
        let h = good_with_delete();
        assert_eq!(crate::invariants::check(&h), vec![]);
        // The resend across the delete was refused as the contract says.
        assert!(matches!(
            h.publishes[0].attempts.last().unwrap().outcome,
            Outcome::Rejected { status: 409, ref code } if code == "seq_evicted"
        ));
    }

    /// The dedup index of the deleted stream survived: a resend of a deleted seq, sent after
    /// the re-creation, is answered `duplicate: true` (the batch was stored, in the deleted
    /// incarnation, so the older checks alone let it pass).
    #[test]
    fn a_duplicate_answered_from_a_deleted_incarnation_is_flagged() {
        let mut h = good_with_delete();
        let probe = h.publishes[0].attempts.last_mut().unwrap();
        probe.outcome = Outcome::Ack { seq: 1, ts: 1_001, duplicate: true, index: 11 };
        only_one_incarnation_violation(&h, "was answered as stored (duplicate: true");
    }

    /// The new incarnation reused the deleted one's seqs: created again from seq 1, and the
    /// resend of seq 1 stored as a new batch.
    #[test]
    fn a_re_create_that_reuses_deleted_seqs_is_flagged() {
        let mut h = good_with_delete();
        let r = h.deletions[0].recreated.as_mut().unwrap();
        (r.first_seq, r.last_seq, r.evicted_through) = (1, 0, 0);
        let details = incarnation_violations(&h);
        assert!(details.iter().any(|d| d.contains("not after the deleted seqs")), "{details:?}");
        let mut h = good_with_delete();
        let probe = h.publishes[0].attempts.last_mut().unwrap();
        probe.outcome = Outcome::Ack { seq: 1, ts: 1_100, duplicate: false, index: 40 };
        let details = incarnation_violations(&h);
        assert!(details.iter().any(|d| d.contains("(duplicate: false")), "{details:?}");
    }

    /// An acknowledged batch was gone from the stream before it was deleted: the deletion must
    /// not hide its loss (the final state no longer holds the stream it was in).
    #[test]
    fn an_acknowledged_batch_missing_just_before_the_delete_is_flagged() {
        let mut h = good_with_delete();
        h.deletions[0].before.batches.retain(|(seq, _, _)| *seq != 2);
        // The other invariants see nothing: the batch's seq is below the final evicted_through.
        only_one_incarnation_violation(&h, "acknowledged batch s/2 (publish #1");
    }

    /// A batch of the deleted incarnation is still served by a node after the re-creation.
    #[test]
    fn a_deleted_batch_kept_in_the_new_incarnation_is_flagged() {
        let mut h = good_with_delete();
        on_node(&mut h, 2, "s", |s| {
            s.batches.insert(0, batch(4, "d"));
            s.batches_counted += 1;
            s.first_seq = 4;
        });
        let details = incarnation_violations(&h);
        assert!(details.iter().any(|d| d.starts_with("n2: s holds seq 4 at or below")), "{details:?}");
    }

    /// A subscriber that had not received every batch of the deleted stream goes on with the
    /// new one's batches without the gap the contract announces.
    #[test]
    fn a_subscriber_crossing_a_delete_without_its_gap_is_flagged() {
        let mut h = good_with_delete();
        // sub0 missed s/4 of the deleted stream (and was told nothing).
        h.subscribers[0].events.retain(|(_, e)| !matches!(e, Seen::Batch(b) if b.seq == 4));
        assert_eq!(broken(&h), vec!["subscriber_view"]);
        // Told with a gap 3..=4: fine (3 was a hole, 4 deleted).
        let mut h = good_with_delete();
        let at = h.subscribers[0].events.iter().position(|(_, e)| matches!(e, Seen::Batch(b) if b.seq == 4)).unwrap();
        h.subscribers[0].events[at].1 = Seen::Gap { from: 3, to: 4 };
        assert_eq!(crate::invariants::check(&h), vec![]);
        // A gap that does not end where the deleted stream did, on a stream without retention.
        h.subscribers[0].events[at].1 = Seen::Gap { from: 3, to: 3 };
        h.subscribers[0].events.insert(at + 1, (at as u64, Seen::Batch(batch(4, "d"))));
        assert_eq!(broken(&h), vec!["subscriber_view"]);
    }
}
