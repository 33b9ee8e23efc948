//! A Runnev node: opens storage, starts Raft, forms or rejoins the cluster, serves the router.
//!
//! Owns: wiring and lifecycle. Takes its listener, dialer, clock and shutdown signal from the
//! caller (`main` in production, the simulation under turmoil), so the same code runs in both.
//! Must never: pick a socket type or read a clock itself.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use openraft::SnapshotPolicy;

use crate::api::{self, AppState, Clock, NodeState};
use crate::limits::*;
use crate::net::{self, Dialer};
use crate::raft::candidacy::Candidacy;
use crate::raft::network::{Network, PeerDisks, RpcFaults};
use crate::raft::{formation, Command, NodeId, Raft};
use crate::storage::log_store::LogStore;
use crate::storage::state_machine::StateMachine;
use crate::storage::{Store, StoreError};

/// A node's configuration (the flags of `runnev serve`, SPEC §5).
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// This node's id (`--id`).
    pub id: NodeId,
    /// Where the database and snapshot live (`--data-dir`).
    pub data_dir: PathBuf,
    /// Initial cluster members, id → `host:port` (`--peers`).
    pub peers: BTreeMap<NodeId, String>,
    /// Largest publish payload, in bytes (`--max-batch-bytes`).
    pub max_batch_bytes: usize,
    /// Largest body of a frames publish (SPEC §6), in bytes (`--max-append-bytes`, at most
    /// [`crate::limits::APPEND_BYTES_MAX`]).
    pub max_append_bytes: usize,
    /// Create streams on first publish (`--auto-create-streams`).
    pub auto_create_streams: bool,
    /// Applied log entries between snapshots (`--snapshot-logs`).
    pub snapshot_logs: u64,
    /// Log entries kept behind a snapshot (`--snapshot-keep-logs`).
    pub snapshot_keep_logs: u64,
    /// Payload bytes applied since the last snapshot that make the next one due, whatever the
    /// entry count (`--snapshot-log-bytes`).
    pub snapshot_log_bytes: u64,
    /// Most this node's wall clock may differ from the median of the voters' clocks before it
    /// stops leading, in ms (`--max-clock-offset-ms`, at least
    /// [`MAX_CLOCK_OFFSET_MS_MIN`]).
    pub max_clock_offset_ms: u64,
    /// Free bytes below which the node takes no new writes (`--min-free-disk-bytes`, 0: off;
    /// at most a quarter of the file system, [`crate::disk`]).
    pub min_free_disk_bytes: u64,
    /// Peer TLS and client authentication (`--tls-*`, `--auth`).
    pub security: crate::api::auth::Security,
    /// Most connections held open at once (`--max-connections`).
    pub max_connections: usize,
    /// Most subscriptions served at once (`--max-subscribers`).
    pub max_subscribers: usize,
    /// Most proposals waiting on the leader for a log entry (`--max-queued-proposals`, at
    /// least 1); past it writes are answered `503 overloaded`.
    pub max_queued_proposals: usize,
    /// Deadline for each request head, from when the connection waits for it
    /// (`--header-read-timeout`, at least [`crate::limits::HEADER_READ_TIMEOUT_MIN`];
    /// [`crate::serve`]).
    pub header_read_timeout: Duration,
    /// Deadline for each request body, from the end of its head (`--body-read-timeout`, at
    /// least [`crate::limits::BODY_READ_TIMEOUT_MIN`]); past it `408 request_timeout`.
    pub body_read_timeout: Duration,
    /// How long a node whose Raft core stopped for good keeps answering (`503`, `/healthz`
    /// failing, the reason in `/v1/cluster` and its log) before [`run`] returns
    /// [`NodeError::RaftStopped`] and the process exits for its supervisor to restart it
    /// ([`crate::limits::RAFT_STOPPED_EXIT_AFTER_DEFAULT`]).
    pub exit_after_raft_stop: Duration,
    /// The token of `--admin-token-file`: made the cluster's first admin token (grant
    /// `admin:*`) by whichever node first leads a cluster that has none (`bootstrap_admin`).
    pub admin_token: Option<crate::auth::Token>,
}

/// Why a node could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Storage could not be opened.
    #[error("opening storage in the data dir: {0}")]
    Storage(#[from] StoreError),
    /// The Raft configuration is invalid.
    #[error("raft configuration: {0}")]
    Config(String),
    /// Raft failed to start.
    #[error("starting raft: {0}")]
    Raft(String),
    /// The data directory's file system could not be measured ([`crate::disk`]).
    #[error("measuring the data directory's free space: {0}")]
    Disk(std::io::Error),
    /// The listener failed.
    #[error("serving: {0}")]
    Serve(#[from] std::io::Error),
    /// The Raft core stopped for good while the node served (a storage error, a panic, an
    /// internal error of openraft): the node stopped serving
    /// [`NodeConfig::exit_after_raft_stop`] later. Its state is on disk; a new process on the
    /// same data directory starts from it (crash-only: recovery is the restart path).
    #[error("the raft core stopped ({0}); a restart on the same data dir recovers from what is on disk")]
    RaftStopped(String),
}

fn raft_config(cfg: &NodeConfig) -> Result<openraft::Config, NodeError> {
    if cfg.max_clock_offset_ms < MAX_CLOCK_OFFSET_MS_MIN {
        return Err(NodeError::Config(format!(
            "--max-clock-offset-ms {} is below {MAX_CLOCK_OFFSET_MS_MIN} ms, twice the largest error of a clock measurement",
            cfg.max_clock_offset_ms
        )));
    }
    if cfg.max_batch_bytes > BATCH_BYTES_MAX {
        return Err(NodeError::Config(format!(
            "--max-batch-bytes {} is over the most this build supports, {BATCH_BYTES_MAX} bytes",
            cfg.max_batch_bytes
        )));
    }
    if cfg.max_append_bytes > APPEND_BYTES_MAX {
        return Err(NodeError::Config(format!(
            "--max-append-bytes {} is over the most this build supports, {APPEND_BYTES_MAX} bytes",
            cfg.max_append_bytes
        )));
    }
    if cfg.header_read_timeout < HEADER_READ_TIMEOUT_MIN {
        return Err(NodeError::Config(format!(
            "--header-read-timeout {:?} is below {HEADER_READ_TIMEOUT_MIN:?}: pooled connections would be cut while reused",
            cfg.header_read_timeout
        )));
    }
    if cfg.body_read_timeout < BODY_READ_TIMEOUT_MIN {
        return Err(NodeError::Config(format!(
            "--body-read-timeout {:?} is below {BODY_READ_TIMEOUT_MIN:?}",
            cfg.body_read_timeout
        )));
    }
    if cfg.max_queued_proposals == 0 {
        return Err(NodeError::Config("--max-queued-proposals must be at least 1".into()));
    }
    // An entry holds at most PROPOSAL_BYTES_MAX plus one batch or one frames publish (its
    // payloads and their framing); size appends to fit one RPC.
    let frames_bytes_max = cfg.max_append_bytes + FRAMES_PER_APPEND_MAX * FRAME_ENTRY_FRAMING_BYTES;
    let entry_bytes_max = (PROPOSAL_BYTES_MAX + cfg.max_batch_bytes.max(frames_bytes_max) + ENTRY_FRAMING_BYTES) as u64;
    let entries_per_append = (RAFT_RPC_BYTES_MAX as u64 / entry_bytes_max).clamp(1, RAFT_ENTRIES_PER_APPEND_MAX);
    let c = openraft::Config {
        cluster_name: "runnev".into(),
        heartbeat_interval: RAFT_HEARTBEAT_MS,
        election_timeout_min: RAFT_ELECTION_TIMEOUT_MIN_MS,
        election_timeout_max: RAFT_ELECTION_TIMEOUT_MAX_MS,
        max_payload_entries: entries_per_append,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(cfg.snapshot_logs.max(1)),
        max_in_snapshot_log_to_keep: cfg.snapshot_keep_logs,
        snapshot_max_chunk_size: SNAPSHOT_CHUNK_BYTES,
        ..Default::default()
    };
    c.validate().map_err(|e| NodeError::Config(e.to_string()))
}

/// What a node takes from the world around it: production passes TCP, the wall clock and a
/// Prometheus recorder; the simulation passes turmoil's network, simulated time and faults.
pub struct Environment {
    /// Opens connections to peers.
    pub dialer: Arc<dyn Dialer>,
    /// This node's wall clock (ms since the Unix epoch): the only source of wall time; the `ts`
    /// a leader stamps is the median of the voters' ([`crate::clock`]).
    pub clock: Clock,
    /// Renders `/metrics`.
    pub prometheus: Option<PrometheusHandle>,
    /// Injects duplicated and replayed Raft RPCs (simulation only).
    pub rpc_faults: Option<Arc<dyn RpcFaults>>,
    /// Whether the data directory's free space is guarded ([`crate::disk`]); off in the
    /// simulation, whose storage lives in memory.
    pub disk_guard: bool,
}

impl Environment {
    /// TCP, the wall clock, no faults.
    pub fn production(prometheus: Option<PrometheusHandle>) -> Self {
        Environment {
            dialer: Arc::new(net::TcpDialer),
            clock: api::system_clock(),
            prometheus,
            rpc_faults: None,
            disk_guard: true,
        }
    }
}

/// Runs a node on `store` until `shutdown` resolves, serving on `listener`.
///
/// Errors: the Raft config is invalid, or the listener fails.
pub async fn run<L>(
    cfg: NodeConfig,
    store: Arc<Store>,
    listener: L,
    env: Environment,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), NodeError>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug + crate::tls::PeerAddr,
{
    let Environment { dialer, clock, prometheus, rpc_faults, disk_guard } = env;
    let http = net::http_client(dialer);
    let mut config = raft_config(&cfg)?;
    formation::guard_wiped_node(&store, cfg.id, &cfg.peers, &http).await?;
    // An empty data dir may be a wiped one (listed in --peers or not): no vote until formation or a
    // leader says otherwise (raft::vote_gate), recorded so that a restart keeps it; nor its own
    // vote as a candidate (raft::candidacy), from the first election timeout on.
    let vote_gate = Arc::new(formation::gate_at_start(&store, cfg.id, &cfg.peers)?);
    let gate_open = vote_gate.closed().is_none();
    config.enable_elect = Candidacy::stands_at_start(gate_open);
    let config = Arc::new(config);
    let restore = store.clone();
    crate::storage::blocking(move || crate::storage::snapshot::restore_state_machine(&restore)).await?;
    let sm = StateMachine::new(store.clone());
    metrics::counter!("runnev_snapshots_installed_total", "group" => store.group().to_string()).absolute(0);
    let disk = Arc::new(match disk_guard {
        true => crate::disk::DiskGuard::open(&cfg.data_dir, cfg.min_free_disk_bytes, store.disk_low_flag())
            .map_err(NodeError::Disk)?,
        false => crate::disk::DiskGuard::off(),
    });
    let peer_disks = Arc::new(PeerDisks::default());
    let network = Network::new(store.group(), http.clone(), rpc_faults, peer_disks.clone());
    let raft = Raft::new(cfg.id, config, network, LogStore::new(store.clone()), sm)
        .await
        .map_err(|e| NodeError::Raft(e.to_string()))?;

    let candidacy = Candidacy::new(raft.clone(), gate_open);
    let membership_lock = Arc::new(tokio::sync::Mutex::new(()));
    let (stop_tx, stopping) = tokio::sync::watch::channel(false);
    // Stops on the caller's signal, or once the Raft core has been stopped for
    // `exit_after_raft_stop`: nothing inside the process can restart the core (openraft 0.9
    // ends it for good), and a node left so would stay out of service under a supervisor that
    // restarts only processes that exit (systemd's `Restart=on-failure`, `runnev local`).
    let raft_stopped = Arc::new(std::sync::OnceLock::<String>::new());
    let shutdown = {
        let (raft, raft_stopped, grace) = (raft.clone(), raft_stopped.clone(), cfg.exit_after_raft_stop);
        async move {
            tokio::select! {
                () = shutdown => {}
                why = api::raft_stops(&raft) => {
                    tokio::time::sleep(grace).await;
                    tracing::error!(reason = %why, "stopping the node: its raft core stopped {} ms ago", grace.as_millis());
                    let _ = raft_stopped.set(why);
                }
            }
            let _ = stop_tx.send(true);
        }
    };
    // When this node started, by its own clock: a supervisor's restarts show as changes
    // (the `RunnevNodeRestarting` alert: a core that stops exits, and comes back).
    metrics::gauge!("runnev_start_time_seconds").set(clock() as f64 / 1000.0);
    let cluster_clock = crate::clock::ClusterClock::new(clock, cfg.max_clock_offset_ms);
    let contact = Arc::<api::contact::LeaderContact>::default();
    let removal = Arc::<crate::raft::removal::Removal>::default();
    let state = AppState::new(NodeState {
        node_id: cfg.id,
        raft: raft.clone(),
        store: store.clone(),
        http: http.clone(),
        max_batch_bytes: cfg.max_batch_bytes,
        max_append_bytes: cfg.max_append_bytes,
        auto_create_streams: cfg.auto_create_streams,
        clock: cluster_clock.clone(),
        prometheus,
        membership_lock: membership_lock.clone(),
        proposer: api::proposer::Proposer::start(raft.clone(), cfg.max_queued_proposals),
        stopping,
        contact: contact.clone(),
        removal: removal.clone(),
        disk: disk.clone(),
        peer_disks,
        security: cfg.security,
        subscribers: Arc::new(tokio::sync::Semaphore::new(cfg.max_subscribers)),
        max_subscribers: cfg.max_subscribers,
        subscribe_reads: Arc::new(tokio::sync::Semaphore::new(crate::limits::SUBSCRIBE_READS_CONCURRENT_MAX)),
        body_read_timeout: cfg.body_read_timeout,
        vote_gate: vote_gate.clone(),
    });
    let peer_terms = tokio::spawn(formation::learn_peer_terms(
        vote_gate.clone(),
        cfg.id,
        cfg.peers.clone(),
        http.clone(),
        store.clone(),
    ));
    let removed = {
        let silent = move || contact.follower_silence().is_some();
        tokio::spawn(crate::raft::removal::watch(
            removal,
            raft.clone(),
            cfg.id,
            cfg.peers.clone(),
            http.clone(),
            silent,
        ))
    };
    let stand = tokio::spawn(crate::raft::candidacy::follow_gate(candidacy.clone(), vote_gate.clone()));
    let formation =
        tokio::spawn(formation::form(raft.clone(), cfg.id, cfg.peers.clone(), http.clone(), store.clone(), vote_gate));
    let clocks = tokio::spawn(crate::clock::run(cluster_clock.clone(), raft.clone(), candidacy, http, cfg.id));
    let ticker = tokio::spawn(retention_ticks(raft.clone(), store.clone(), cfg.id, cluster_clock));
    let joint = tokio::spawn(finish_joint_changes(raft.clone(), cfg.id, membership_lock));
    let watch = tokio::spawn(report_raft_stop(raft.clone()));
    store.set_snapshot_log_bytes(cfg.snapshot_log_bytes);
    let snapshots = tokio::spawn(snapshot_by_bytes(raft.clone(), store.clone()));
    let disk_watch = disk_guard.then(|| tokio::spawn(watch_disk(disk)));
    let bootstrap =
        cfg.admin_token.clone().map(|t| tokio::spawn(bootstrap_admin(raft.clone(), store.clone(), cfg.id, t)));
    api::export_zeroes();
    tracing::info!(id = cfg.id, data_dir = %cfg.data_dir.display(), "node serving");
    let app = api::router(state);
    let listener = crate::tls::PeerListener::new(listener, cfg.max_connections);
    crate::serve::serve(listener, app, cfg.header_read_timeout, shutdown).await;
    // Each task ends here, not at some later poll: a supervisor in the same process (the
    // simulation's) opens the data dir again once `run` has returned.
    let tasks = [
        Some(watch),
        Some(snapshots),
        disk_watch,
        bootstrap,
        Some(formation),
        Some(stand),
        Some(peer_terms),
        Some(removed),
        Some(clocks),
        Some(ticker),
        Some(joint),
    ];
    for task in tasks.into_iter().flatten() {
        task.abort();
        let _ = task.await;
    }
    if let Err(e) = raft.shutdown().await {
        tracing::warn!(error = %e, "raft shutdown");
    }
    tracing::info!(id = cfg.id, "node stopped");
    match raft_stopped.get() {
        Some(why) => Err(NodeError::RaftStopped(why.clone())),
        None => Ok(()),
    }
}

/// Asks openraft for a snapshot each time the payload bytes applied since the last one reach
/// `--snapshot-log-bytes` ([`Store::snapshot_due`]): openraft 0.9's policy counts entries only
/// (`--snapshot-logs`), and with large batches the log behind a snapshot would grow with the
/// entries' bytes. A snapshot already being built makes openraft ignore the request. Runs until
/// aborted.
async fn snapshot_by_bytes(raft: Raft, store: Arc<Store>) {
    loop {
        store.snapshot_due().await;
        tracing::debug!("payload bytes applied since the last snapshot reached --snapshot-log-bytes: snapshot");
        if let Err(e) = raft.trigger().snapshot().await {
            tracing::debug!(error = %e, "could not ask for a snapshot");
            return;
        }
    }
}

/// Logs once, as an error, that the Raft core stopped for good while the node serves: from
/// then on the node answers client requests `503` and `/healthz` fails, until [`run`] stops
/// the node ([`NodeConfig::exit_after_raft_stop`]; see `api`). Until then it keeps the term of
/// the JSON log lines current ([`crate::logging::set_term`]).
async fn report_raft_stop(raft: Raft) {
    let why = tokio::select! {
        biased;
        why = api::raft_stops(&raft) => why,
        never = follow_term(&raft) => match never {},
    };
    tracing::error!(reason = %why, "the raft core has stopped: this node serves no reads or writes and /healthz answers 503 until it stops, for its supervisor to restart it");
}

/// Sets the term of the JSON log lines ([`crate::logging::set_term`]) at every change of this
/// node's vote; never ends (a stopped core's last term stays). It watches openraft's server
/// metrics, which change with the vote, role, leader and membership only, not at every log
/// entry as the full metrics do ([`api::raft_stops`]).
async fn follow_term(raft: &Raft) -> std::convert::Infallible {
    let mut rx = raft.server_metrics();
    loop {
        crate::logging::set_term(rx.borrow_and_update().vote.leader_id().get_term());
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Measures the data directory's free space every [`DISK_CHECK_MS`], so the ballast is deleted
/// or restored and the verdict kept current without traffic ([`crate::disk`]).
async fn watch_disk(disk: Arc<crate::disk::DiskGuard>) {
    let mut every = tokio::time::interval(Duration::from_millis(DISK_CHECK_MS));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let d = disk.clone();
        let _ = crate::storage::blocking(move || Ok::<_, StoreError>(d.check())).await;
    }
}

/// Makes `token` the cluster's first admin token (grant `admin:*`): while no bootstrap token
/// was ever applied, this node, when leader, proposes it (the state machine makes it only if
/// none was made before, so of several nodes with the file, one makes it, once). Once one is
/// applied, warns if it is not this node's token (nodes given different files). The secret is
/// never logged; only its salted hash is proposed.
async fn bootstrap_admin(raft: Raft, store: Arc<Store>, id: NodeId, token: crate::auth::Token) {
    let Some((name, secret)) = token.parts().map(|(n, s)| (n.to_string(), s.to_string())) else { return };
    let mut every = tokio::time::interval(Duration::from_millis(BOOTSTRAP_TOKEN_RETRY_MS));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let s = store.clone();
        let Ok((tokens, bootstrapped)) = crate::storage::blocking(move || s.tokens()).await else { continue };
        if bootstrapped {
            let ours = tokens.iter().any(|(n, r)| *n == name && r.verifies(&secret));
            if !ours {
                tracing::warn!(
                    "the cluster's bootstrap token is not the one in this node's --admin-token-file (or it was deleted)"
                );
            }
            return;
        }
        if crate::api::known_leader(&raft.metrics().borrow(), id) != Some(id) {
            continue;
        }
        let grants = vec![crate::auth::Grant { permission: crate::auth::Permission::Admin, streams: "*".into() }];
        let record = match crate::auth::TokenRecord::new(&secret, grants) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "no randomness for the bootstrap token's salt");
                continue;
            }
        };
        match raft.client_write(Command::PutToken { name: name.clone(), record, bootstrap: true }).await {
            Ok(r) => tracing::info!(outcome = ?r.data, token = %name, "bootstrap admin token proposed"),
            Err(e) => tracing::debug!(error = %e, "bootstrap token not committed; will retry"),
        }
    }
}

/// While leader, proposes the cluster's clock (the median of the voters', [`crate::clock`]) every
/// [`RETENTION_TICK_MS`] if any stream has `max_age_ms`, so idle streams age out too (SPEC §2.7).
/// A leader whose clock is out of bounds, or not yet verified, proposes no tick.
async fn retention_ticks(raft: Raft, store: Arc<Store>, id: NodeId, clock: Arc<crate::clock::ClusterClock>) {
    let mut every = tokio::time::interval(Duration::from_millis(RETENTION_TICK_MS));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if crate::api::known_leader(&raft.metrics().borrow(), id) != Some(id) {
            continue;
        }
        let s = store.clone();
        let aging = crate::storage::blocking(move || s.streams())
            .await
            .map(|all| all.iter().any(|i| i.meta.retention.max_age_ms.is_some() && i.meta.batches > 0))
            .unwrap_or(false);
        if aging {
            let ts = match clock.stamp_now(&raft, id) {
                Ok(ts) => ts,
                Err(e) => {
                    tracing::debug!(error = %e, "no retention tick");
                    continue;
                }
            };
            if let Err(e) = raft.client_write(Command::Tick { ts }).await {
                tracing::debug!(error = %e, "retention tick not committed");
            }
        }
    }
}

/// While leader, completes a membership change that a previous leader left in its joint
/// configuration (openraft commits a joint config, then the final one; a leader lost between the
/// two leaves the cluster joint until someone finishes it — Raft paper §6).
///
/// The configuration is read under the membership lock, from the Raft core
/// (`api::members::membership_to_change`): read before the lock, it could be the joint config of
/// a change the API was making under the lock, and once that change had finished (removing this
/// leader, say) the finisher proposed its stale target from a node no longer in the cluster
/// (simulation seed 40939).
async fn finish_joint_changes(raft: Raft, id: NodeId, lock: Arc<tokio::sync::Mutex<()>>) {
    let mut every = tokio::time::interval(Duration::from_millis(JOINT_REPAIR_MS));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let joint = {
            let metrics = raft.metrics();
            let m = metrics.borrow();
            crate::api::known_leader(&m, id) == Some(id)
                && m.membership_config.membership().get_joint_config().len() > 1
        };
        if !joint {
            continue;
        }
        let _serial = lock.lock().await;
        let membership = crate::api::members::membership_to_change(&raft, id).await;
        let Some(target) = membership.as_ref().and_then(crate::api::members::joint_target) else { continue };
        tracing::info!(voters = ?target, "finishing a membership change left in a joint config");
        if let Err(e) = raft.change_membership(openraft::ChangeMembers::ReplaceAllVoters(target), false).await {
            tracing::warn!(error = %e, "finishing the joint config failed; will retry");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::atomic::{AtomicBool, Ordering};

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};

    use super::*;
    use crate::storage::db_dir::FsDatabaseDir;
    use crate::storage::segments::{FsSegments, SegmentDir, SegmentFile};

    /// Segments whose writes fail once `broken` is set, as a failing disk's would.
    struct Breakable {
        inner: FsSegments,
        broken: Arc<AtomicBool>,
    }

    struct BreakableFile {
        inner: Arc<dyn SegmentFile>,
        broken: Arc<AtomicBool>,
    }

    fn fail_if(broken: &AtomicBool) -> io::Result<()> {
        match broken.load(Ordering::SeqCst) {
            true => Err(io::Error::other("the disk failed (test)")),
            false => Ok(()),
        }
    }

    impl SegmentFile for BreakableFile {
        fn read_at(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
            self.inner.read_at(offset, out)
        }
        fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
            fail_if(&self.broken)?;
            self.inner.write_at(offset, data)
        }
        fn sync_data(&self) -> io::Result<()> {
            fail_if(&self.broken)?;
            self.inner.sync_data()
        }
        fn zero_from(&self, offset: u64) -> io::Result<()> {
            fail_if(&self.broken)?;
            self.inner.zero_from(offset)
        }
        fn capacity(&self) -> io::Result<u64> {
            self.inner.capacity()
        }
    }

    impl SegmentDir for Breakable {
        fn list(&self) -> io::Result<Vec<u64>> {
            self.inner.list()
        }
        fn open(&self, first: u64) -> io::Result<Arc<dyn SegmentFile>> {
            Ok(Arc::new(BreakableFile { inner: self.inner.open(first)?, broken: self.broken.clone() }))
        }
        fn create(&self, first: u64, bytes: u64) -> io::Result<Arc<dyn SegmentFile>> {
            fail_if(&self.broken)?;
            Ok(Arc::new(BreakableFile { inner: self.inner.create(first, bytes)?, broken: self.broken.clone() }))
        }
        fn remove(&self, first: u64) -> io::Result<()> {
            self.inner.remove(first)
        }
        fn save_commit_hint(&self, bytes: &[u8]) -> io::Result<()> {
            self.inner.save_commit_hint(bytes)
        }
        fn load_commit_hint(&self) -> io::Result<Option<Vec<u8>>> {
            self.inner.load_commit_hint()
        }
    }

    /// One request; the deadline only catches a hang (the verdict is the answer).
    async fn call(http: &net::HttpClient, method: &str, url: &str, body: &'static str) -> (u16, String) {
        let req = hyper::Request::builder()
            .method(method)
            .uri(url)
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .expect("a request");
        let exchange = async {
            let resp = http.request(req).await.expect("the node answers");
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.expect("a whole answer").to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        };
        match tokio::time::timeout(Duration::from_secs(8), exchange).await {
            Ok(answer) => answer,
            Err(_) => panic!("{method} {url} hung"),
        }
    }

    /// A one-node cluster serving on loopback, ready.
    struct OneNode {
        /// The node's store, dropped once nothing of the node holds it.
        store: std::sync::Weak<Store>,
        addr: String,
        stop: tokio::sync::oneshot::Sender<()>,
        node: tokio::task::JoinHandle<Result<(), NodeError>>,
        http: net::HttpClient,
    }

    /// Starts a one-node cluster (it forms by itself) in `dir`, on segments that fail once
    /// `broken` is set, and waits for it to be ready.
    async fn one_node(dir: &std::path::Path, broken: &Arc<AtomicBool>, exit_after_raft_stop: Duration) -> OneNode {
        let node = start_one_node(dir, broken, exit_after_raft_stop).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while call(&node.http, "GET", &format!("http://{}/readyz", node.addr), "").await.0 != 200 {
            assert!(tokio::time::Instant::now() < deadline, "the node never became ready");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        node
    }

    /// Starts [`one_node`]'s node without waiting for it.
    async fn start_one_node(
        dir: &std::path::Path,
        broken: &Arc<AtomicBool>,
        exit_after_raft_stop: Duration,
    ) -> OneNode {
        let group = crate::storage::layout::group0(dir);
        let segments = Breakable { inner: FsSegments::new(group.join("log")).unwrap(), broken: broken.clone() };
        let payloads = Arc::new(crate::storage::payloads::FsPayloads::new(group.join("payloads")).unwrap());
        let store = Store::open_with(dir, &FsDatabaseDir::new(&group), Arc::new(segments), payloads).unwrap();
        let weak = Arc::downgrade(&store);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let cfg = NodeConfig {
            id: 1,
            data_dir: dir.to_path_buf(),
            peers: BTreeMap::from([(1, addr.clone())]),
            max_batch_bytes: 1 << 20,
            max_append_bytes: crate::limits::APPEND_BYTES_DEFAULT,
            auto_create_streams: true,
            snapshot_logs: 1000,
            snapshot_keep_logs: 100,
            snapshot_log_bytes: crate::limits::SNAPSHOT_LOG_BYTES_DEFAULT,
            max_clock_offset_ms: crate::limits::MAX_CLOCK_OFFSET_MS_DEFAULT,
            min_free_disk_bytes: 0,
            security: Default::default(),
            admin_token: None,
            max_connections: crate::limits::CONNECTIONS_MAX_DEFAULT,
            max_subscribers: crate::limits::SUBSCRIBERS_MAX_DEFAULT,
            max_queued_proposals: crate::limits::PROPOSALS_QUEUED_MAX_DEFAULT,
            header_read_timeout: crate::limits::HEADER_READ_TIMEOUT_DEFAULT,
            body_read_timeout: crate::limits::BODY_READ_TIMEOUT_DEFAULT,
            exit_after_raft_stop,
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let node = tokio::spawn(run(cfg, store, listener, Environment::production(None), async {
            let _ = stopped.await;
        }));
        let http = net::http_client(Arc::new(net::TcpDialer));
        OneNode { store: weak, addr, stop, node, http }
    }

    /// Stops `node` and waits until nothing of it holds its store.
    async fn stop_one_node(node: OneNode) {
        let OneNode { store, stop, node, http, .. } = node;
        let _ = stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), node).await.expect("the node stops");
        drop(http);
        wait_released(&store).await;
    }

    /// Waits until nothing of a node that has stopped holds its store (at most 10 s).
    async fn wait_released(store: &std::sync::Weak<Store>) {
        let released = tokio::time::Instant::now() + Duration::from_secs(10);
        while store.strong_count() > 0 {
            assert!(
                tokio::time::Instant::now() < released,
                "the stopped node's store is still held 10 s after run returned"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The term of the vote `node` stored.
    fn stored_term(node: &OneNode) -> u64 {
        let store = node.store.upgrade().expect("the running node holds its store");
        store.saved_vote().unwrap().expect("a stored vote").leader_id().term
    }

    /// A node whose vote gate is closed does not stand for election: its vote for itself is a
    /// vote, and it may have acknowledged entries its log no longer holds (simulation seed
    /// 16436: a wiped node, its gate closed, was elected with its own vote and that of a node
    /// further behind, without entries committed on its lost disk). Here a one-node cluster is
    /// restarted on its data dir with its vote held as a wiped node's is: marked as catching
    /// up, its stored term stays where it was through ten election timeouts; unmarked (the
    /// control), it elects itself and its term goes up.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_whose_vote_gate_is_closed_does_not_stand_for_election() {
        let wait = Duration::from_millis(10 * RAFT_ELECTION_TIMEOUT_MAX_MS);
        for wiped in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let broken = Arc::new(AtomicBool::new(false));
            let formed = one_node(dir.path(), &broken, RAFT_STOPPED_EXIT_AFTER_DEFAULT).await;
            let term = stored_term(&formed);
            stop_one_node(formed).await;
            // Both restart on a vote not yet committed, as a wiped node's held vote is: a node
            // restarting on a committed vote of its own, the only voter, leads again at once,
            // without an election.
            let store = Store::open(dir.path()).unwrap();
            let held = openraft::Vote::new(term, 1);
            if wiped {
                store.seed_wiped_vote(&held).unwrap();
            } else {
                store.seed_vote(&held).unwrap();
            }
            drop(store);
            let restarted = start_one_node(dir.path(), &broken, RAFT_STOPPED_EXIT_AFTER_DEFAULT).await;
            tokio::time::sleep(wait).await;
            let after = stored_term(&restarted);
            stop_one_node(restarted).await;
            if wiped {
                assert_eq!(after, term, "a node with a closed vote gate stood for election");
            } else {
                assert!(after > term, "the control: an open gate stands and elects itself ({term} -> {after})");
            }
        }
    }

    /// A node whose Raft core stops on a storage error (its log's disk fails under an append)
    /// says so and holds nobody: `/healthz` and `/readyz` answer 503, writes and reads answer
    /// `503 not_ready` naming the stop (a write on a stopped leader once answered `500`, a read
    /// with `min_index` waited its 10 s, a long poll its `wait_ms`, a subscription forever), an
    /// open subscription ends, and `/v1/cluster` reports why and no leader. Found with
    /// simulation seed 200860 (a follower whose core quit answered reads only after the
    /// client's deadline and looked ready).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_whose_raft_core_stopped_says_so_and_holds_no_request() {
        let dir = tempfile::tempdir().unwrap();
        let broken = Arc::new(AtomicBool::new(false));
        let OneNode { addr, stop, node, http, .. } = one_node(dir.path(), &broken, Duration::from_secs(60)).await;
        let url = |path: &str| format!("http://{addr}{path}");

        // A one-node cluster forms by itself; a publish commits.
        let (status, body) = call(&http, "POST", &url("/v1/streams/s/batches"), "one").await;
        assert_eq!(status, 201, "{body}");
        let (status, _) = call(&http, "GET", &url("/healthz"), "").await;
        assert_eq!(status, 200);
        let subscription = http
            .request(hyper::Request::get(url("/v1/streams/s/subscribe")).body(Full::new(Bytes::new())).unwrap())
            .await
            .unwrap();
        assert_eq!(subscription.status().as_u16(), 200);

        // The disk fails under the next append: the Raft core quits on the storage error.
        broken.store(true, Ordering::SeqCst);
        let (status, body) = call(&http, "POST", &url("/v1/streams/s/batches"), "two").await;
        assert_eq!(status, 503, "the write's outcome is unknown, not a definitive error: {body}");

        let (status, body) = call(&http, "GET", &url("/healthz"), "").await;
        assert_eq!((status, body.starts_with("raft stopped: ")), (503, true), "{body}");
        let (status, body) = call(&http, "GET", &url("/readyz"), "").await;
        assert_eq!((status, body.starts_with("raft stopped: ")), (503, true), "{body}");
        for (method, path) in [
            ("POST", "/v1/streams/s/batches?seq=9"),
            ("GET", "/v1/streams/s/batches?after=0&min_index=1000"),
            ("GET", "/v1/streams/s/batches?after=1&wait_ms=60000"),
            ("GET", "/v1/streams/s/subscribe?after=1"),
            ("GET", "/v1/streams"),
            ("PUT", "/v1/streams/t"),
        ] {
            let (status, body) = call(&http, method, &url(path), "x").await;
            assert_eq!(status, 503, "{method} {path}: {body}");
            assert!(body.contains("\"not_ready\"") && body.contains("raft has stopped"), "{method} {path}: {body}");
        }
        // The subscription opened before the stop ends (its client resumes on another node).
        let ended = tokio::time::timeout(Duration::from_secs(8), subscription.into_body().collect()).await;
        assert!(ended.is_ok_and(|b| b.is_ok()), "the open subscription still hangs");
        let (status, body) = call(&http, "GET", &url("/v1/cluster"), "").await;
        let view: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(status, 200);
        assert!(view["raft_stopped"].as_str().is_some_and(|why| why.contains("the disk failed")), "{view}");
        assert!(view["leader_id"].is_null(), "{view}");

        let _ = stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), node).await;
    }

    /// A node whose Raft core stopped stops serving `exit_after_raft_stop` later and [`run`]
    /// returns [`NodeError::RaftStopped`], so `runnev serve` exits for its supervisor to
    /// restart it; the restart on the same data dir serves what was committed. Found with
    /// simulation seed 8710: openraft 0.9 stopped a leader's core on an internal race (a
    /// snapshot sent to a replication stream that had just ended on a higher vote), and the
    /// node answered `503` for good after every fault had healed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_whose_raft_core_stopped_exits_and_a_restart_serves_again() {
        let dir = tempfile::tempdir().unwrap();
        let broken = Arc::new(AtomicBool::new(false));
        let OneNode { store, addr, stop: _stop, node, http } =
            one_node(dir.path(), &broken, Duration::from_millis(300)).await;
        let (status, body) = call(&http, "POST", &format!("http://{addr}/v1/streams/s/batches"), "one").await;
        assert_eq!(status, 201, "{body}");
        broken.store(true, Ordering::SeqCst);
        let (status, body) = call(&http, "POST", &format!("http://{addr}/v1/streams/s/batches"), "two").await;
        assert_eq!(status, 503, "{body}");
        let ended = tokio::time::timeout(Duration::from_secs(20), node).await;
        match ended {
            Ok(Ok(Err(NodeError::RaftStopped(why)))) => assert!(why.contains("the disk failed"), "{why}"),
            Ok(other) => panic!("the node ended otherwise: {other:?}"),
            Err(_) => panic!("the node still runs 20 s after its raft core stopped"),
        }

        // Nothing of the stopped node holds its store once `run` has returned...
        drop(http);
        wait_released(&store).await;
        // ...so a supervisor can start it again on the same data dir (the disk repaired).
        broken.store(false, Ordering::SeqCst);
        let OneNode { addr, stop, node, http, .. } = one_node(dir.path(), &broken, Duration::from_millis(300)).await;
        let (status, body) = call(&http, "GET", &format!("http://{addr}/v1/streams/s/batches?after=0"), "").await;
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("\"seq\":1"), "the committed batch is served after the restart: {body}");
        let _ = stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), node).await;
    }
}
