//! **Nodes neither panic nor fail to restart** — SPEC §3 ("bad input never crashes a node"),
//! STYLE principle 3 (a peer or a client never makes a node panic), and SPEC §5 (a node
//! restarted on its data rejoins): a crash, even a power cut that loses unsynced writes, must
//! leave a store that reopens.
//!
//! Any panic on the simulation's thread (node, client or driver), any node incarnation whose
//! store failed to open or whose server stopped, and any turmoil error fails the run.

use crate::history::History;

use super::Violation;

const NAME: &str = "node_health";

pub(super) fn check(h: &History, out: &mut Vec<Violation>) {
    for p in &h.panics {
        out.push(Violation { invariant: NAME, detail: format!("panic: {p}") });
    }
    for e in &h.node_errors {
        out.push(Violation { invariant: NAME, detail: e.clone() });
    }
    if let Some(e) = &h.sim_error {
        out.push(Violation { invariant: NAME, detail: format!("the simulation failed: {e}") });
    }
}

#[cfg(test)]
mod tests {
    use crate::invariants::fixtures::*;

    #[test]
    fn panics_and_failed_restarts_are_flagged() {
        let mut h = good();
        h.panics.push("at 5 ms: boom".into());
        assert_eq!(broken(&h), vec!["node_health"]);
        let mut h = good();
        h.node_errors.push("n2 incarnation 1: store did not open".into());
        assert_eq!(broken(&h), vec!["node_health"]);
    }

    #[test]
    fn a_failed_simulation_is_flagged() {
        let mut h = good();
        h.sim_error = Some("host n1 returned an error".into());
        let v = crate::invariants::check(&h);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].to_string(), "[node_health] the simulation failed: host n1 returned an error");
    }
}
