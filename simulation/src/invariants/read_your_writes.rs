//! **Read-your-writes with `min_index`** — SPEC §3: passing a publish's `index` as
//! `min_index` to a read on any node makes that node wait until it has applied that index
//! (or answer `503 not_ready`), and SPEC §2.6: a follower behind the cursor waits instead of
//! answering "empty".
//!
//! After an acknowledgement, the workload reads `after = seq - 1` with `min_index = index` on
//! one node. If that node answered, the first batch must be the acknowledged one with its
//! payload — or, on a stream with retention, a gap must cover it. A node that could not answer
//! in time (partitioned, `not_ready`) is allowed.

use crate::history::History;

use super::Violation;

const NAME: &str = "read_your_writes";

pub(super) fn check(h: &History, out: &mut Vec<Violation>) {
    for r in &h.read_checks {
        let Ok((gap, batches)) = &r.answer else { continue };
        let covered = gap.is_some_and(|(from, to)| from <= r.seq && r.seq <= to);
        if covered && h.may_evict(&r.stream) {
            continue;
        }
        let detail = match batches.first() {
            Some(b) if b.seq == r.seq && b.data == r.payload => continue,
            Some(b) => format!("got seq {} ({} bytes) first", b.seq, b.data.len()),
            None => format!("got no batch (gap {gap:?})"),
        };
        out.push(Violation {
            invariant: NAME,
            detail: format!(
                "n{} read {}/{} with min_index {} after it was acknowledged, and {detail}",
                r.node, r.stream, r.seq, r.min_index
            ),
        });
    }
}

#[cfg(test)]
mod tests {
    use crate::invariants::fixtures::*;

    #[test]
    fn a_stale_read_past_min_index_is_flagged() {
        let mut h = good();
        h.read_checks[0].answer = Ok((None, vec![]));
        assert_eq!(broken(&h), vec!["read_your_writes"]);
        let mut h = good();
        h.read_checks[0].answer = Err("503 not_ready".into());
        assert_eq!(broken(&h), Vec::<&str>::new(), "a node that could not answer is allowed");
    }

    #[test]
    fn a_wrong_first_batch_is_flagged() {
        // The read after seq 1 with min_index 12 started at seq 4: seq 2 was skipped.
        let mut h = good();
        h.read_checks[0].answer = Ok((None, vec![batch(4, "d")]));
        assert_eq!(broken(&h), vec!["read_your_writes"]);
        // Seq 2 first, but with bytes that are not the acknowledged ones (also two histories).
        let mut h = good();
        h.read_checks[0].answer = Ok((None, vec![batch(2, "a")]));
        let b = broken(&h);
        assert!(b.contains(&"read_your_writes"), "{b:?}");
        // A gap that covers the seq excuses it only on a stream that may evict.
        let mut h = good();
        h.read_checks[0].answer = Ok((Some((1, 2)), vec![batch(4, "d")]));
        assert_eq!(broken(&h), vec!["read_your_writes"]);
    }
}
