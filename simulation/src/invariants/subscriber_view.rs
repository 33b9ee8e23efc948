//! **Subscribers see one ordered history, gaps announced** — SPEC §2.4 (delivery in seq order,
//! at least once; clients dedupe by `seq <= cursor`; the server never skips a retained batch)
//! and §2.5 (a gap is announced, `{"from": after + 1, "to": evicted_through}`, before the
//! oldest retained batch; never silent), and §4 (resume after `Last-Event-ID`).
//!
//! A subscriber's view (after the client's dedupe, across reconnects and restarts) must be
//! strictly increasing. Between two consecutive items, every seq skipped must never have held
//! a batch (a publisher's hole): a seq known to exist (from any node, delivery, read or
//! acknowledgement) skipped without a gap is a silent gap. A gap must start right after the
//! cursor, lie on a stream with retention, not go past what the nodes report evicted, and not
//! cover a batch that any node still retains. A restart resumes from the cursor.
//!
//! Across a deletion (contract §5: a subscription follows the stream's name): the batches the
//! deleted stream held just before its deletion count as known seqs, so a subscriber that goes
//! on with the new stream without having received them must have been told a gap; on a stream
//! without retention a gap is due only to a deletion, and ends at the deleted stream's
//! `last_seq` (the `evicted_through` its creation again answered).

use crate::history::{History, Seen};

use super::{known_seqs, Observations, Violation};

const NAME: &str = "subscriber_view";

pub(super) fn check(h: &History, obs: &Observations, out: &mut Vec<Violation>) {
    for sub in &h.subscribers {
        // The batches a deleted incarnation held just before its deletion existed too.
        let mut known = known_seqs(obs, &sub.stream);
        for d in h.deletions.iter().filter(|d| d.stream == sub.stream) {
            known.extend(d.before.batches.iter().map(|(seq, _, _)| *seq));
        }
        // On a stream without retention only a deletion evicts: a gap ends where a deleted
        // incarnation did (the `evicted_through` its creation again answered).
        let boundaries: Option<Vec<u64>> = h.stream(&sub.stream).is_none_or(|s| s.max_batches.is_none()).then(|| {
            h.deletions
                .iter()
                .filter(|d| d.stream == sub.stream)
                .filter_map(|d| d.recreated.map(|r| r.evicted_through))
                .collect()
        });
        let retained: Vec<u64> = h
            .finals
            .iter()
            .filter_map(|f| f.streams.as_ref().ok())
            .filter_map(|m| m.get(&sub.stream))
            .flat_map(|s| s.batches.iter().map(|b| b.seq))
            .collect();
        let evicted_through = h.evicted_through(&sub.stream);
        let mut v = |detail: String| {
            out.push(Violation { invariant: NAME, detail: format!("sub{} on {}: {detail}", sub.id, sub.stream) })
        };
        let mut pos = sub.start_after;
        for (at, e) in &sub.events {
            let (next_start, next_pos) = match e {
                Seen::Batch(b) => (b.seq, b.seq),
                Seen::Gap { from, to } => (*from, *to),
                Seen::Restart { cursor } => {
                    if *cursor != pos {
                        v(format!("at {at} ms restarted from cursor {cursor}, but had processed up to {pos}"));
                    }
                    continue;
                }
                Seen::Error(_) => continue,
            };
            if next_pos <= pos {
                v(format!("at {at} ms got {e:?} after reaching {pos}: not strictly increasing"));
                continue;
            }
            // A gap may (wrongly) start at or before the cursor: then nothing lies between the
            // cursor and it, and the range must not be built backwards (it would panic).
            let skipped: Vec<u64> =
                if next_start > pos + 1 { known.range(pos + 1..next_start).copied().collect() } else { Vec::new() };
            if !skipped.is_empty() {
                v(format!("at {at} ms jumped from {pos} to {e:?}, silently skipping existing seqs {skipped:?}"));
            }
            if let Seen::Gap { from, to } = e {
                if *from != pos + 1 {
                    v(format!("at {at} ms the gap {from}..={to} does not start right after the cursor {pos}"));
                }
                if !h.may_evict(&sub.stream) {
                    v(format!("at {at} ms announced gap {from}..={to} on a stream without retention"));
                } else if boundaries.as_ref().is_some_and(|b| !b.contains(to)) {
                    v(format!(
                        "at {at} ms announced gap {from}..={to} on a stream without retention, not ending where a deleted incarnation did ({boundaries:?})"
                    ));
                }
                if *to > evicted_through {
                    v(format!("at {at} ms announced gap {from}..={to} past evicted_through {evicted_through}"));
                }
                let hidden: Vec<&u64> = retained.iter().filter(|s| (*from..=*to).contains(*s)).collect();
                if !hidden.is_empty() {
                    v(format!("at {at} ms announced gap {from}..={to} over batches still retained: {hidden:?}"));
                }
            }
            pos = next_pos;
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::history::Seen;
    use crate::invariants::fixtures::*;

    #[test]
    fn a_silent_gap_is_flagged() {
        let mut h = good();
        // sub1 on `r` skips from 1 to 3 without announcing that 2 was evicted.
        h.subscribers[1].events.retain(|(_, e)| !matches!(e, Seen::Gap { .. } | Seen::Restart { .. }));
        assert_eq!(broken(&h), vec!["subscriber_view"]);
    }

    #[test]
    fn a_skipped_batch_on_a_stream_without_retention_is_flagged() {
        let mut h = good();
        h.subscribers[0].events.remove(1);
        assert_eq!(broken(&h), vec!["subscriber_view"]);
    }

    #[test]
    fn a_publishers_hole_is_not_a_gap() {
        // sub0 goes 2 → 4: seq 3 never existed.
        let h = good();
        assert!(!broken(&h).contains(&"subscriber_view"));
    }

    #[test]
    fn redelivery_after_the_cursor_and_false_gaps_are_flagged() {
        let mut h = good();
        h.subscribers[0].events.push((9, Seen::Batch(batch(2, "b"))));
        assert_eq!(broken(&h), vec!["subscriber_view"]);
        let mut h = good();
        h.subscribers[1].events[1].1 = Seen::Gap { from: 2, to: 3 };
        assert_eq!(broken(&h), vec!["subscriber_view"], "gap past evicted_through over a retained batch");
    }

    #[test]
    fn a_restart_from_another_cursor_is_flagged() {
        // sub1 had processed up to 2 (the gap's end) but resumed from 1: it would see 2 again.
        let mut h = good();
        h.subscribers[1].events[2].1 = Seen::Restart { cursor: 1 };
        assert_eq!(broken(&h), vec!["subscriber_view"]);
        // Resuming past the cursor would skip what it never processed.
        let mut h = good();
        h.subscribers[1].events[2].1 = Seen::Restart { cursor: 3 };
        assert_eq!(broken(&h), vec!["subscriber_view"]);
    }

    /// Regression: a gap starting at or before the cursor made the checker build a backwards
    /// range and panic instead of reporting the misplaced gap.
    #[test]
    fn a_gap_that_does_not_start_right_after_the_cursor_is_flagged() {
        // After batch 1 the gap must be 2..=2; one announced as 1..=2 overlaps what was delivered.
        let mut h = good();
        h.subscribers[1].events[1].1 = Seen::Gap { from: 1, to: 2 };
        assert_eq!(broken(&h), vec!["subscriber_view"]);
        // One that leaves room after the cursor: 3..=2 is empty, so use a subscriber from 0 that
        // is told 2..=2 while seq 1 was never delivered (and is known to exist).
        let mut h = good();
        h.subscribers[1].events.remove(0);
        assert_eq!(broken(&h), vec!["subscriber_view"]);
    }

    #[test]
    fn a_gap_on_a_stream_without_retention_is_flagged() {
        // sub0 on `s` (no retention) is told 1..=1 was evicted; the nodes still hold it.
        let mut h = good();
        h.subscribers[0].events[0].1 = Seen::Gap { from: 1, to: 1 };
        assert_eq!(broken(&h), vec!["subscriber_view"]);
    }
}
