//! A lost disk in a run (`Fault::Wipe`): the driver crashes a node, deletes its data dir and
//! restarts it empty under its old id; the node must hold its vote, be caught up by a leader,
//! and end the run holding what every other node holds, with every invariant kept. Swarm seed
//! 17 with an 8 s fault phase wipes n2 at 3,265 ms, its first fault, so nothing before it can
//! make the driver pass it over (`Driver::may_lose_a_disk`).

use simulation::{run_seed, Knobs};

const SEED: u64 = 17;
const KNOBS: Knobs = Knobs {
    fault_phase_ms: 8_000,
    swarm: true,
    membership: true,
    deletes: false,
    wipes: true,
    replace_after_ms: 3_000,
};

#[test]
fn a_wiped_node_rejoins_empty_is_caught_up_and_every_invariant_holds() {
    let r = run_seed(SEED, KNOBS);
    let log = r.history.fault_log.join("\n");
    assert!(r.stats.effects.wipes > 0, "no disk was wiped:\n{log}");
    assert!(log.contains("n2: disk wiped"), "n2's disk was not wiped:\n{log}");
    assert!(log.contains("n2 restarts on an empty log"), "n2 did not restart empty:\n{log}");
    assert!(r.stats.effects.lost_caught_up > 0, "n2 was never seen caught up:\n{log}");
    let n2 = r.history.finals.iter().find(|f| f.node == 2).expect("n2's final state was read");
    assert!(n2.streams.as_ref().is_ok_and(|s| !s.is_empty()), "n2 ended empty or unreadable: {:?}", n2.streams);
    let violations: Vec<String> = r.violations.iter().map(ToString::to_string).collect();
    assert!(violations.is_empty(), "{}\n{log}", violations.join("\n"));
}
