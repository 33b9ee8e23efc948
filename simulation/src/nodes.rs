//! The simulated nodes: production `runnev::node::run` on turmoil's network, the simulated disk
//! (redb's file and the Raft log's segments) and simulated time.
//!
//! Owns: a node's host factory (turmoil calls it again on every restart). Must never: give a
//! node anything production does not (no shortcut around the router, the Raft transport or the
//! store): only the socket, clock, disk and RPC-fault seams differ, and the seed openraft's
//! election timeouts are drawn from (`runnev::raft::runtime::with_seed`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use runnev::api::Clock;
use runnev::node::{Environment, NodeConfig};
use runnev::storage::Store;

use crate::disk::SimDisk;
use crate::history::NodeId;
use crate::net::{SimDialer, SimListener};
use crate::plan::{node_host, NODES, NODE_PORT};
use crate::rng::SimRng;
use crate::world::{now_ms, Shared, SimRpcFaults};

/// Node `id`'s wall clock: simulated time as ms since the Unix epoch, plus the node's current
/// clock jump (`Shared::clock_offset_ms`, set by the driver). What the node's cluster clock
/// measures and stamps `ts` from.
pub fn sim_clock(shared: Arc<Shared>, id: NodeId) -> Clock {
    Arc::new(move || {
        let now = turmoil::since_epoch().map(|d| d.as_millis() as u64).unwrap_or(0);
        let offset = shared.clock_offset_ms.get(id as usize).map_or(0, |o| o.load(Ordering::SeqCst));
        now.saturating_add_signed(offset)
    })
}

/// The configuration of node `id` in a run of `shared.plan`.
pub fn node_config(shared: &Shared, id: NodeId, data_dir: PathBuf) -> NodeConfig {
    // Every node, but not itself when the driver restarts it unlisted ([`Shared::unlisted`]).
    let unlisted = shared.unlisted.get(id as usize).is_some_and(|u| u.load(Ordering::SeqCst));
    let peers: BTreeMap<NodeId, String> =
        (1..=NODES).filter(|n| !(unlisted && *n == id)).map(|n| (n, format!("{}:{NODE_PORT}", node_host(n)))).collect();
    NodeConfig {
        id,
        data_dir,
        peers,
        max_batch_bytes: runnev::limits::BATCH_BYTES_DEFAULT,
        max_append_bytes: runnev::limits::APPEND_BYTES_DEFAULT,
        auto_create_streams: false,
        snapshot_logs: shared.plan.snapshot_logs,
        snapshot_keep_logs: shared.plan.snapshot_keep_logs,
        // The workload's payloads are tens of bytes: about a hundred entries' worth, so runs
        // whose entry count is high (`snapshot_logs` 200) also snapshot by bytes.
        snapshot_log_bytes: 2_048,
        max_clock_offset_ms: runnev::limits::MAX_CLOCK_OFFSET_MS_DEFAULT,
        min_free_disk_bytes: 0,
        security: Default::default(),
        admin_token: None,
        max_connections: runnev::limits::CONNECTIONS_MAX_DEFAULT,
        max_subscribers: runnev::limits::SUBSCRIBERS_MAX_DEFAULT,
        max_queued_proposals: runnev::limits::PROPOSALS_QUEUED_MAX_DEFAULT,
        header_read_timeout: runnev::limits::HEADER_READ_TIMEOUT_DEFAULT,
        body_read_timeout: runnev::limits::BODY_READ_TIMEOUT_DEFAULT,
        exit_after_raft_stop: runnev::limits::RAFT_STOPPED_EXIT_AFTER_DEFAULT,
    }
}

/// How long the simulated supervisor waits before it starts a node whose process exited, in
/// ms: `RestartSec=2s` of deploy/runnev.service.
const SUPERVISOR_RESTART_MS: u64 = 2_000;

/// The host software of node `id`: each call starts one incarnation on the same disk and
/// data directory.
pub fn node_software(
    shared: Arc<Shared>,
    id: NodeId,
    disk: SimDisk,
    data_dir: PathBuf,
) -> impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = turmoil::Result>>> {
    let incarnations = Arc::new(AtomicU64::new(0));
    move || {
        let (shared, disk, data_dir) = (shared.clone(), disk.clone(), data_dir.clone());
        let incarnation = incarnations.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            // A node cannot start on a full disk (opening writes, and a wiped node's first
            // writes: `guard_wiped_node` records its vote); its supervisor tries again every
            // second until space is back, as a restart policy does.
            loop {
                let cfg = node_config(&shared, id, data_dir.clone());
                let opened = loop {
                    match Store::open_with(&cfg.data_dir, &disk.db_dir(), disk.segments(), disk.payloads()) {
                        Err(e) if e.is_storage_full() => {
                            let line = format!("{:>7} ms n{id} cannot start on a full disk ({e}); retrying", now_ms());
                            shared.record(|h| h.fault_log.push(line));
                            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                        }
                        other => break other,
                    }
                };
                let store = match opened {
                    Ok(s) => s,
                    Err(e) => {
                        let why =
                            format!("n{id} incarnation {incarnation} at {} ms: store did not open: {e}", now_ms());
                        shared.record(|h| h.node_errors.push(why));
                        std::future::pending::<()>().await;
                        return Ok(());
                    }
                };
                let listener = SimListener::bind(NODE_PORT).await?;
                let env = Environment {
                    dialer: Arc::new(SimDialer),
                    clock: sim_clock(shared.clone(), id),
                    prometheus: None,
                    rpc_faults: Some(Arc::new(SimRpcFaults::new(shared.clone(), id, incarnation))),
                    disk_guard: false,
                };
                // openraft's election timeouts: drawn from the seed, per node and incarnation.
                let election_seed = SimRng::derive(shared.plan.seed, "election", id << 32 | incarnation).next_u64();
                let old_store = Arc::downgrade(&store);
                let node = runnev::node::run(cfg, store, listener, env, std::future::pending());
                match runnev::raft::runtime::with_seed(election_seed, node).await {
                    Err(runnev::node::NodeError::Storage(e)) if e.is_storage_full() => {
                        let line = format!("{:>7} ms n{id} cannot start on a full disk ({e}); retrying", now_ms());
                        shared.record(|h| h.fault_log.push(line));
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    }
                    Err(runnev::node::NodeError::RaftStopped(why)) => {
                        // The process exits; its supervisor starts it again after
                        // `RestartSec=` (deploy/runnev.service). An exit keeps what the OS
                        // holds for the disk, so the same incarnation goes on (no cut).
                        let line = format!(
                            "{:>7} ms n{id} exits, its raft core stopped ({why}); restarted in {SUPERVISOR_RESTART_MS} ms",
                            now_ms()
                        );
                        shared.record(|h| h.fault_log.push(line));
                        tokio::time::sleep(std::time::Duration::from_millis(SUPERVISOR_RESTART_MS)).await;
                        // The exited process held nothing: no task of it may still reach its
                        // store when the next one opens the same disk.
                        if old_store.upgrade().is_some() {
                            let why = format!(
                                "n{id} incarnation {incarnation} at {} ms: the node's store outlived it",
                                now_ms()
                            );
                            shared.record(|h| h.node_errors.push(why));
                            return Ok(());
                        }
                    }
                    Err(e) => {
                        let why = format!("n{id} incarnation {incarnation} at {} ms: node stopped: {e}", now_ms());
                        shared.record(|h| h.node_errors.push(why));
                        return Ok(());
                    }
                    Ok(()) => return Ok(()),
                }
            }
        })
    }
}
