//! **`ts` never goes backwards within a stream** — [contract §2](../docs/contract.md) and SPEC
//! §2.2: a batch's `ts` is the leader's cluster time when it was stamped, and the state machine
//! makes the effective `ts` of an entry no lower than any applied before it
//! (`storage::state_machine`: `ts = max(proposed, last ts)`), so a stream's batches, in seq
//! order, have non-decreasing `ts` whatever the leaders' wall clocks did (clock jumps, a new
//! leader whose clock is behind). The batches of one frames publish share one `ts`.
//!
//! Checked on every node's final state and on every subscriber's deliveries (in the order
//! delivered, which is seq order).

use crate::history::{History, Seen};

use super::Violation;

const NAME: &str = "ts_order";

pub(super) fn check(h: &History, out: &mut Vec<Violation>) {
    for f in &h.finals {
        let Ok(streams) = &f.streams else { continue };
        for (name, s) in streams {
            for w in s.batches.windows(2) {
                if w[1].ts < w[0].ts {
                    out.push(Violation {
                        invariant: NAME,
                        detail: format!(
                            "n{}: {name}/{} has ts {} after {name}/{} with ts {}",
                            f.node, w[1].seq, w[1].ts, w[0].seq, w[0].ts
                        ),
                    });
                }
            }
        }
    }
    for s in &h.subscribers {
        let mut last: Option<(u64, u64)> = None;
        for (_, e) in &s.events {
            let Seen::Batch(b) = e else { continue };
            if let Some((seq, ts)) = last {
                if b.seq > seq && b.ts < ts {
                    out.push(Violation {
                        invariant: NAME,
                        detail: format!(
                            "sub{} on {}: seq {} with ts {} delivered after seq {seq} with ts {ts}",
                            s.id, s.stream, b.seq, b.ts
                        ),
                    });
                }
            }
            last = Some((b.seq, b.ts));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use crate::history::Seen;

    #[test]
    fn a_stored_ts_that_goes_back_is_caught() {
        let mut h = good();
        // Seq 4 of `s` stamped before seq 2, on every node and for the subscriber alike.
        on_all_nodes(&mut h, "s", |s| s.batches[2].ts = 1_000);
        for (_, e) in &mut h.subscribers[0].events {
            if let Seen::Batch(b) = e {
                if b.seq == 4 {
                    b.ts = 1_000;
                }
            }
        }
        let v: Vec<_> = super::super::check(&h).into_iter().filter(|v| v.invariant == "ts_order").collect();
        assert_eq!(v.len(), 4, "three nodes and one subscriber: {v:?}");
    }

    #[test]
    fn equal_ts_is_fine() {
        let mut h = good();
        on_all_nodes(&mut h, "s", |s| {
            for b in &mut s.batches {
                b.ts = 5_000;
            }
        });
        assert!(super::super::check(&h).iter().all(|v| v.invariant != "ts_order"));
    }
}
