//! **No acknowledged batch is lost** — SPEC §2.1 ("accepted means committed": killing any
//! minority, by `kill -9` or power cut, never loses an acknowledged batch) and the Raft paper
//! §5.4.1–5.4.2 (Leader Completeness: a committed entry is in the log of every later leader).
//!
//! After the heal phase, every node must hold every acknowledged batch, with the payload that
//! was sent and the ts the acknowledgement gave, unless retention evicted it: on a stream with
//! a retention limit, a seq at or below the node's `evicted_through` may be gone. Streams
//! without retention never evict, so there every acknowledged seq must be retained.

use crate::history::History;

use super::Violation;

const NAME: &str = "acked_durable";

pub(super) fn check(h: &History, out: &mut Vec<Violation>) {
    for (i, p) in h.publishes.iter().enumerate() {
        for (seq, ts, duplicate, index) in p.acks() {
            for f in &h.finals {
                let Ok(streams) = &f.streams else { continue };
                let Some(s) = streams.get(&p.stream) else {
                    out.push(Violation {
                        invariant: NAME,
                        detail: format!(
                            "n{}: stream {} is gone, but publish #{i} was acknowledged (seq {seq}, index {index})",
                            f.node, p.stream
                        ),
                    });
                    continue;
                };
                match s.batches.iter().find(|b| b.seq == seq) {
                    Some(b) if b.data == p.payload && b.ts == ts => {}
                    Some(b) => out.push(Violation {
                        invariant: NAME,
                        detail: format!(
                            "n{}: {}/{seq} holds {} bytes with ts {}, but publish #{i} was acknowledged with its own {} bytes and ts {ts}",
                            f.node,
                            p.stream,
                            b.data.len(),
                            b.ts,
                            p.payload.len()
                        ),
                    }),
                    None if h.may_evict(&p.stream) && seq <= s.evicted_through => {}
                    None => out.push(Violation {
                        invariant: NAME,
                        detail: format!(
                            "n{}: acknowledged batch {}/{seq} (publish #{i}, index {index}, duplicate {duplicate}) is missing; the node has last_seq {} evicted_through {}",
                            f.node, p.stream, s.last_seq, s.evicted_through
                        ),
                    }),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::invariants::fixtures::*;

    #[test]
    fn a_lost_acknowledged_batch_is_flagged() {
        let mut h = good();
        on_node(&mut h, 3, "s", |s| {
            s.batches.retain(|b| b.seq != 2);
            s.batches_counted -= 1;
        });
        assert!(broken(&h).contains(&"acked_durable"));
    }

    #[test]
    fn an_eviction_below_evicted_through_is_not_a_loss_but_one_above_is() {
        let mut h = good();
        assert!(!broken(&h).contains(&"acked_durable"), "r/1 and r/2 are evicted, not lost");
        on_all_nodes(&mut h, "r", |s| s.evicted_through = 1);
        assert!(broken(&h).contains(&"acked_durable"), "r/2 is above evicted_through yet missing");
    }

    #[test]
    fn a_vanished_stream_is_flagged() {
        // n2 no longer has stream `s` at all, though batches of it were acknowledged.
        let mut h = good();
        h.finals[1].streams.as_mut().unwrap().remove("s");
        let b = broken(&h);
        assert!(b.contains(&"acked_durable"), "{b:?}");
        let gone: Vec<String> = crate::invariants::check(&h)
            .into_iter()
            .filter(|v| v.invariant == "acked_durable")
            .map(|v| v.detail)
            .collect();
        assert!(gone.iter().all(|d| d.starts_with("n2: stream s is gone")), "{gone:?}");
        assert_eq!(gone.len(), 3, "one per acknowledged batch of `s`: {gone:?}");
    }

    #[test]
    fn an_acknowledged_batch_with_other_bytes_is_flagged() {
        let mut h = good();
        on_all_nodes(&mut h, "s", |s| s.batches[0].data = b"other".to_vec());
        assert!(broken(&h).contains(&"acked_durable"));
    }
}
