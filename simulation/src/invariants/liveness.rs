//! **Liveness after the faults end** — the Raft paper §5.2 (with a majority up and connected, a
//! leader is elected and serves) and SPEC §2.6 (any node takes publishes), §2.4 (subscriptions
//! deliver everything retained).
//!
//! Once every fault has ended (network repaired, crashed nodes restarted, RPC faults off), the
//! cluster must converge within the heal budget (every node agrees on one leader and has
//! applied what it knows committed), the heal-phase publishes must succeed, every workload
//! publish must end with an answer, every subscriber must reach its stream's last seq, and
//! every node must be readable for the final comparison.

use crate::history::{History, Outcome};

use super::Violation;

const NAME: &str = "liveness";

pub(super) fn check(h: &History, out: &mut Vec<Violation>) {
    let mut v = |detail: String| out.push(Violation { invariant: NAME, detail });
    for p in &h.liveness.problems {
        v(p.clone());
    }
    if h.liveness.converged_at_ms.is_none() && h.liveness.problems.is_empty() {
        v("the cluster never converged after the faults ended".into());
    }
    let heal = h.liveness.heal_started_at_ms;
    for (i, p) in h.publishes.iter().enumerate() {
        // An acknowledged publish is done; a deliberate resend after it may go unanswered.
        if p.acks().next().is_some() {
            continue;
        }
        match p.attempts.last() {
            None => v(format!("publish #{i} to {} was never sent", p.stream)),
            Some(a) if matches!(a.outcome, Outcome::Unknown(_)) && a.at_ms >= heal => v(format!(
                "publish #{i} to {} (seq {:?}) still had no answer at {} ms, after the faults ended at {heal} ms: {:?}",
                p.stream, p.seq, a.at_ms, a.outcome
            )),
            Some(_) => {}
        }
    }
    for (id, pos, target) in &h.liveness.subscriber_positions {
        if pos < target {
            let last: Vec<String> = h
                .subscribers
                .iter()
                .filter(|s| s.id == *id)
                .flat_map(|s| s.events.iter().rev().take(4).rev())
                .map(|(at, e)| match e {
                    crate::history::Seen::Batch(b) => format!("{at} ms: batch {}", b.seq),
                    other => format!("{at} ms: {other:?}"),
                })
                .collect();
            v(format!("sub{id} reached seq {pos} but its stream holds up to {target}; its last events: {last:?}"));
        }
    }
    for f in &h.finals {
        if let Err(e) = &f.streams {
            v(format!("n{} could not be read after the heal phase: {e}", f.node));
        }
    }
    if h.finals.is_empty() {
        v("no node's final state was read".into());
    }
}

#[cfg(test)]
mod tests {
    use crate::invariants::fixtures::*;

    #[test]
    fn no_convergence_or_a_stuck_publish_or_subscriber_is_flagged() {
        let mut h = good();
        h.liveness.converged_at_ms = None;
        assert_eq!(broken(&h), vec!["liveness"]);
        let mut h = good();
        h.publishes[2].attempts = vec![unknown()];
        h.publishes[2].attempts[0].at_ms = 500;
        assert_eq!(broken(&h), vec!["liveness"]);
        let mut h = good();
        h.liveness.subscriber_positions[0].1 = 2;
        assert_eq!(broken(&h), vec!["liveness"]);
        // A deliberate resend of an acknowledged publish may go unanswered.
        let mut h = good();
        h.publishes[0].attempts.push(unknown());
        h.publishes[0].attempts.last_mut().unwrap().at_ms = 500;
        assert_eq!(broken(&h), Vec::<&str>::new());
    }

    #[test]
    fn problems_the_run_reported_are_forwarded() {
        let mut h = good();
        h.liveness.problems.push("the heal publish to h timed out".into());
        let v = crate::invariants::check(&h);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].to_string(), "[liveness] the heal publish to h timed out");
        // A run that never converged and said why reports the why, not a second line.
        h.liveness.converged_at_ms = None;
        assert_eq!(crate::invariants::check(&h).len(), 1);
    }

    #[test]
    fn no_final_state_or_an_unreadable_node_is_flagged() {
        let mut h = good();
        h.finals.clear();
        let b = broken(&h);
        assert!(b.contains(&"liveness"), "{b:?}");
        let mut h = good();
        h.finals[2].streams = Err("connection refused".into());
        assert_eq!(broken(&h), vec!["liveness"]);
    }

    #[test]
    fn a_publish_never_sent_is_flagged() {
        let mut h = good();
        h.publishes[2].attempts.clear();
        let b = broken(&h);
        assert!(b.contains(&"liveness"), "{b:?}");
    }
}
