//! The Raft transport: append-entries, vote and install-snapshot RPCs as HTTP POSTs to the peer's
//! one listen address, bodies postcard-encoded, each addressed to one Raft group
//! ([`RaftRpc::path`]: `/raft/append`, `/raft/vote`, `/raft/snapshot` for the cluster's group,
//! `/raft/groups/<id>/…` for any group).
//!
//! Owns: the client side (openraft's [`RaftNetworkFactory`]) and the wire encoding; the server
//! side is [`crate::api::raft_rpc`]. Must never: wait without a deadline (every RPC carries
//! openraft's TTL and a timed-out connection is dropped), or trust a peer's bytes (they are
//! decoded with a size cap and a decode error is an error, not a panic).

use std::borrow::Cow;
use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{NodeId, TypeConfig};
use crate::limits::{
    PEER_DISK_LOW_FRESH_MS, PEER_DISK_LOW_RETRY_MS, RAFT_APPEND_BYTES_MAX, RAFT_RPC_BYTES_MAX, REFUSED_RPC_PAUSE_MS,
};
use crate::net::HttpClient;
use crate::storage::layout::GroupId;

/// The version of the Raft RPC protocol this build speaks: the paths, the postcard encoding of
/// openraft's messages and of [`crate::raft::Command`]. Sent on every RPC in
/// [`PROTOCOL_HEADER`]; a node refuses an RPC of another version (`400 protocol_mismatch`, with
/// a log line naming both) rather than misread it. An RPC without the header is version 1,
/// which is what nodes sent before the header existed. A new [`crate::raft::Command`] variant
/// appended after the others (as `PublishFrames` was) keeps the version: every message an older
/// build can read is encoded as before, and only the new entry is unreadable to it
/// (docs/operations.md says to upgrade every node before clients use it).
pub const PROTOCOL_VERSION: u32 = 1;

/// The header that carries [`PROTOCOL_VERSION`] on every Raft RPC.
pub const PROTOCOL_HEADER: &str = "runnev-protocol";

/// Path of the append-entries RPC (Raft paper §5.3) of the cluster's group
/// ([`GroupId::CLUSTER`]).
pub const APPEND_PATH: &str = "/raft/append";
/// Path of the request-vote RPC (Raft paper §5.2) of the cluster's group.
pub const VOTE_PATH: &str = "/raft/vote";
/// Path of the install-snapshot RPC (Raft paper §7) of the cluster's group, one chunk per call.
pub const SNAPSHOT_PATH: &str = "/raft/snapshot";
/// The route of any group's RPCs ([`RaftRpc::path`]): `/raft/groups/<group id>/<rpc>`, where
/// `<rpc>` is `append`, `vote` or `snapshot`.
pub const GROUP_RPC_ROUTE: &str = "/raft/groups/{group}/{rpc}";

/// A Raft RPC, by kind: what the transport sends and a node serves, for one Raft group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RaftRpc {
    /// Append-entries (Raft paper §5.3), heartbeats included.
    Append,
    /// Request-vote (Raft paper §5.2).
    Vote,
    /// Install-snapshot (Raft paper §7), one chunk.
    Snapshot,
}

impl RaftRpc {
    /// The last segment of the RPC's path: `append`, `vote` or `snapshot`.
    pub fn name(self) -> &'static str {
        match self {
            RaftRpc::Append => "append",
            RaftRpc::Vote => "vote",
            RaftRpc::Snapshot => "snapshot",
        }
    }

    /// The RPC named `name` ([`RaftRpc::name`]), if any.
    pub fn from_name(name: &str) -> Option<RaftRpc> {
        [RaftRpc::Append, RaftRpc::Vote, RaftRpc::Snapshot].into_iter().find(|r| r.name() == name)
    }

    /// The path a node serves this RPC of `group` on. The cluster's group keeps the paths nodes
    /// have always served ([`APPEND_PATH`], [`VOTE_PATH`], [`SNAPSHOT_PATH`]), so a cluster whose
    /// nodes run builds from before groups had ids upgrades one node at a time; every group is
    /// also served under [`GROUP_RPC_ROUTE`], the path any other group's RPCs take (a node that
    /// does not host the group answers `404 not_found`, and one of an older build `404` too:
    /// an RPC never reaches another group's Raft state).
    pub fn path(self, group: GroupId) -> Cow<'static, str> {
        match (group, self) {
            (GroupId::CLUSTER, RaftRpc::Append) => Cow::Borrowed(APPEND_PATH),
            (GroupId::CLUSTER, RaftRpc::Vote) => Cow::Borrowed(VOTE_PATH),
            (GroupId::CLUSTER, RaftRpc::Snapshot) => Cow::Borrowed(SNAPSHOT_PATH),
            (group, rpc) => Cow::Owned(format!("/raft/groups/{group}/{}", rpc.name())),
        }
    }
}

/// Header on a node's answer to `/raft/append` or `/raft/snapshot` while its disk is low
/// ([`crate::disk`]): it took none of the entries (it answered the append as a heartbeat), or
/// refused the snapshot chunk. Value `1`.
pub const DISK_LOW_HEADER: &str = "runnev-disk-low";

/// What a leader knows of its followers' disks: which of them said, in their latest append
/// answers, that their disk is low. Shared by the transport (which records it, and spares a
/// low follower entries it would refuse) and the write path (which refuses with `507` when a
/// majority of voters cannot store a write).
///
/// A report is current for [`PEER_DISK_LOW_FRESH_MS`]: a low follower repeats it on every
/// heartbeat answer, and one answer without it clears it.
#[derive(Debug, Default)]
pub struct PeerDisks {
    /// Node id → (when it last said its disk is low, when it was last sent entries).
    low: std::sync::Mutex<std::collections::BTreeMap<NodeId, (Instant, Option<Instant>)>>,
}

impl PeerDisks {
    fn map(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<NodeId, (Instant, Option<Instant>)>> {
        self.low.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records an append or snapshot answer of `peer`: with the low-disk header or without.
    pub fn record(&self, peer: NodeId, low: bool) {
        let mut m = self.map();
        match low {
            true => {
                let sent = m.get(&peer).and_then(|(_, sent)| *sent);
                m.insert(peer, (Instant::now(), sent));
            }
            false => {
                m.remove(&peer);
            }
        }
    }

    /// Whether `peer` said its disk is low within [`PEER_DISK_LOW_FRESH_MS`].
    pub fn is_low(&self, peer: NodeId) -> bool {
        let fresh = Duration::from_millis(PEER_DISK_LOW_FRESH_MS);
        self.map().get(&peer).is_some_and(|(at, _)| at.elapsed() < fresh)
    }

    /// Whether entries should go to `peer` now: its disk is not known to be low, or they were
    /// last tried more than [`PEER_DISK_LOW_RETRY_MS`] ago (then this counts as a try).
    fn entries_due(&self, peer: NodeId) -> bool {
        if !self.is_low(peer) {
            return true;
        }
        let mut m = self.map();
        let Some((_, sent)) = m.get_mut(&peer) else { return true };
        let due = sent.is_none_or(|t| t.elapsed() >= Duration::from_millis(PEER_DISK_LOW_RETRY_MS));
        if due {
            *sent = Some(Instant::now());
        }
        due
    }
}

/// What happens to one outgoing Raft RPC, as a fault injector decides (simulation only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RpcFault {
    /// Send it once, normally.
    Deliver,
    /// Send it, and send the same bytes once more concurrently: the peer sees it twice.
    Duplicate,
    /// Send it, and send the same bytes again after this delay: a stale replay.
    ReplayAfter(Duration),
    /// Do not send it: the call fails at once as a connection cut before the request left
    /// would (the peer sees nothing). On a snapshot chunk, the transfer is interrupted.
    Drop,
}

/// Decides the fate of outgoing Raft RPCs. Production nodes have none; the simulation injects
/// duplicated and replayed RPCs through it (turmoil's TCP cannot duplicate segments).
pub trait RpcFaults: Send + Sync + 'static {
    /// Called before each RPC `rpc` to `target`.
    fn on_send(&self, target: NodeId, rpc: RaftRpc) -> RpcFault;
}

/// Makes a [`PeerConnection`] per target for openraft, for one Raft group.
#[derive(Clone)]
pub struct Network {
    group: GroupId,
    http: HttpClient,
    faults: Option<Arc<dyn RpcFaults>>,
    disks: Arc<PeerDisks>,
}

impl Network {
    /// The transport of Raft group `group` over `http`, with an optional fault injector,
    /// recording the peers' disk reports in `disks`.
    pub fn new(group: GroupId, http: HttpClient, faults: Option<Arc<dyn RpcFaults>>, disks: Arc<PeerDisks>) -> Self {
        Network { group, http, faults, disks }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerConnection {
        PeerConnection {
            group: self.group,
            target,
            addr: node.addr.clone(),
            http: self.http.clone(),
            faults: self.faults.clone(),
            disks: self.disks.clone(),
        }
    }
}

/// The RPC client to one peer, for one Raft group.
pub struct PeerConnection {
    group: GroupId,
    target: NodeId,
    addr: String,
    http: HttpClient,
    faults: Option<Arc<dyn RpcFaults>>,
    disks: Arc<PeerDisks>,
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

/// Why an RPC failed below Raft.
#[derive(Debug, thiserror::Error)]
enum TransportError {
    #[error("connecting to {addr}: {source}")]
    Connect { addr: String, source: hyper_util::client::legacy::Error },
    #[error("rpc to {addr} failed: {source}")]
    Request { addr: String, source: hyper_util::client::legacy::Error },
    #[error("rpc to {addr} timed out after {ms} ms")]
    Timeout { addr: String, ms: u128 },
    #[error("rpc to {addr}: {what}")]
    Protocol { addr: String, what: String },
}

fn post(addr: &str, path: &str, body: Bytes) -> Result<hyper::Request<Full<Bytes>>, axum::http::Error> {
    hyper::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/octet-stream")
        .header(PROTOCOL_HEADER, PROTOCOL_VERSION)
        .body(Full::new(body))
}

impl PeerConnection {
    /// Sends a copy of an RPC now or later, ignoring its answer (fault injection).
    fn send_copy(&self, path: Cow<'static, str>, body: Bytes, after: Duration) {
        let (http, addr) = (self.http.clone(), self.addr.clone());
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            if let Ok(req) = post(&addr, &path, body) {
                let _ = tokio::time::timeout(Duration::from_secs(5), http.request(req)).await;
            }
        });
    }

    /// Sends one RPC of this connection's group and decodes the answer; records whether the
    /// peer said its disk is low ([`DISK_LOW_HEADER`]) when `rpc` is an append or a snapshot
    /// chunk.
    async fn call<Req, Resp, E>(&self, rpc: RaftRpc, req: &Req, ttl: Duration) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: Error + DeserializeOwned,
    {
        let addr = &self.addr;
        let proto =
            |what: String| RPCError::Network(NetworkError::new(&TransportError::Protocol { addr: addr.clone(), what }));
        // Sized before it is written (no regrowth copies of an append's entries).
        let body = Bytes::from(crate::storage::encode(req).map_err(|e| proto(format!("encoding: {e}")))?);
        let path = rpc.path(self.group);
        match self.faults.as_ref().map_or(RpcFault::Deliver, |f| f.on_send(self.target, rpc)) {
            RpcFault::Deliver => {}
            RpcFault::Duplicate => self.send_copy(path.clone(), body.clone(), Duration::ZERO),
            RpcFault::ReplayAfter(d) => self.send_copy(path.clone(), body.clone(), d),
            RpcFault::Drop => return Err(proto("the connection was cut before the request left (simulated)".into())),
        }
        let request = post(addr, &path, body).map_err(|e| proto(format!("building request: {e}")))?;
        let exchange = async {
            let resp = self.http.request(request).await.map_err(|source| {
                if source.is_connect() {
                    RPCError::Unreachable(Unreachable::new(&TransportError::Connect { addr: addr.clone(), source }))
                } else {
                    RPCError::Network(NetworkError::new(&TransportError::Request { addr: addr.clone(), source }))
                }
            })?;
            let status = resp.status();
            if rpc != RaftRpc::Vote {
                self.disks.record(self.target, resp.headers().contains_key(DISK_LOW_HEADER));
            }
            let bytes = Limited::new(resp.into_body(), RAFT_RPC_BYTES_MAX)
                .collect()
                .await
                .map_err(|e| proto(format!("reading answer: {e}")))?
                .to_bytes();
            if !status.is_success() {
                // A live peer that refuses (401/403: a certificate that does not fit, 503: not
                // ready, 409: another protocol) refuses the retry too: paced, or openraft 0.9
                // resends an append the moment the error is reported, thousands of times a
                // second (a fresh user's trial: 2.8 MB/s of log and 40 % CPU on two nodes).
                if rpc != RaftRpc::Vote {
                    tokio::time::sleep(refused_rpc_pause(ttl)).await;
                }
                return Err(proto(format!("status {status}: {}", String::from_utf8_lossy(&bytes))));
            }
            postcard::from_bytes::<Result<Resp, RaftError<NodeId, E>>>(&bytes)
                .map_err(|e| proto(format!("decoding answer: {e}")))
        };
        match tokio::time::timeout(ttl, exchange).await {
            Ok(Ok(Ok(resp))) => Ok(resp),
            Ok(Ok(Err(remote))) => Err(RPCError::RemoteError(RemoteError::new(self.target, remote))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(RPCError::Network(NetworkError::new(&TransportError::Timeout {
                addr: addr.clone(),
                ms: ttl.as_millis(),
            }))),
        }
    }
}

/// How long an append or snapshot chunk that a peer answered with an error status waits before
/// the error is reported: [`REFUSED_RPC_PAUSE_MS`], at most half the RPC's deadline `ttl` (the
/// refusal, not a timeout, is what openraft hears).
fn refused_rpc_pause(ttl: Duration) -> Duration {
    Duration::from_millis(REFUSED_RPC_PAUSE_MS).min(ttl / 2)
}

/// How many of `entries`, from the first, fit in `budget` payload bytes: at least one (a
/// single large entry still goes), all when they fit.
fn entries_within(entries: &[openraft::Entry<TypeConfig>], budget: u64) -> usize {
    let mut bytes = 0u64;
    for (i, e) in entries.iter().enumerate() {
        bytes += super::entry_payload_bytes(e);
        if bytes > budget && i > 0 {
            return i;
        }
    }
    entries.len()
}

impl RaftNetwork<TypeConfig> for PeerConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        let mut rpc = rpc;
        if !rpc.entries.is_empty() && !self.disks.entries_due(self.target) {
            // The peer's disk is low: it would answer the entries as a heartbeat. Send it the
            // heartbeat only (it keeps its leader and its commit index), paced so openraft's
            // immediate resend of what is still unmatched does not spin; it matched up to
            // prev_log_id, no further.
            let pause = option.hard_ttl() / 2;
            tokio::time::sleep(pause).await;
            rpc.entries.clear();
            let prev = rpc.prev_log_id;
            return match self.call(RaftRpc::Append, &rpc, option.hard_ttl() - pause).await? {
                AppendEntriesResponse::Success => Ok(AppendEntriesResponse::PartialSuccess(prev)),
                other => Ok(other),
            };
        }
        let keep = entries_within(&rpc.entries, RAFT_APPEND_BYTES_MAX);
        if keep == rpc.entries.len() {
            return self.call(RaftRpc::Append, &rpc, option.hard_ttl()).await;
        }
        // Send a prefix; the follower's success then covers that prefix only.
        rpc.entries.truncate(keep);
        let sent = rpc.entries.last().map(|e| e.log_id);
        match self.call(RaftRpc::Append, &rpc, option.hard_ttl()).await? {
            AppendEntriesResponse::Success => Ok(AppendEntriesResponse::PartialSuccess(sent)),
            other => Ok(other),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        if !self.disks.entries_due(self.target) {
            let what = format!("node {}'s disk is low: it takes no snapshot until space is freed", self.target);
            return Err(RPCError::Network(NetworkError::new(&TransportError::Protocol {
                addr: self.addr.clone(),
                what,
            })));
        }
        self.call(RaftRpc::Snapshot, &rpc, option.hard_ttl()).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.call(RaftRpc::Vote, &rpc, option.hard_ttl()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::{Command, LogId};
    use openraft::{CommittedLeaderId, EntryPayload};

    /// The cluster's group keeps the paths of builds from before groups had ids (a cluster
    /// upgrades one node at a time); any other group's RPCs name it, under the route every
    /// node serves.
    #[test]
    fn an_rpc_path_names_its_group_except_the_cluster_s() {
        let all = [RaftRpc::Append, RaftRpc::Vote, RaftRpc::Snapshot];
        let cluster: Vec<_> = all.iter().map(|r| r.path(GroupId::CLUSTER)).collect();
        assert_eq!(cluster, [APPEND_PATH, VOTE_PATH, SNAPSHOT_PATH]);
        let other: Vec<_> = all.iter().map(|r| r.path(GroupId(12))).collect();
        assert_eq!(other, ["/raft/groups/12/append", "/raft/groups/12/vote", "/raft/groups/12/snapshot"]);
        for r in all {
            assert_eq!(RaftRpc::from_name(r.name()), Some(r));
            assert_eq!(GROUP_RPC_ROUTE.replace("{group}", "12").replace("{rpc}", r.name()), r.path(GroupId(12)));
        }
        assert_eq!(RaftRpc::from_name("elect"), None);
    }

    fn publish(index: u64, bytes: usize) -> openraft::Entry<TypeConfig> {
        openraft::Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Command::Publish {
                stream: "s".into(),
                seq: None,
                ts: 0,
                auto_create: false,
                data: vec![0; bytes].into(),
            }),
        }
    }

    /// A follower's "disk low" answer holds for PEER_DISK_LOW_FRESH_MS and one answer without it
    /// clears it; while it holds, entries go to that follower once per PEER_DISK_LOW_RETRY_MS
    /// (heartbeats in between), and other followers are not affected.
    #[tokio::test(start_paused = true)]
    async fn a_low_follower_gets_entries_once_a_second_until_it_has_room() {
        let disks = PeerDisks::default();
        assert!(!disks.is_low(2) && disks.entries_due(2) && disks.entries_due(2));
        disks.record(2, true);
        assert!(disks.is_low(2) && !disks.is_low(3));
        assert!(disks.entries_due(2), "the first try after the report");
        assert!(!disks.entries_due(2) && !disks.entries_due(2));
        assert!(disks.entries_due(3));
        tokio::time::advance(Duration::from_millis(PEER_DISK_LOW_RETRY_MS)).await;
        disks.record(2, true);
        assert!(disks.entries_due(2), "a retry a second later");
        assert!(!disks.entries_due(2));
        // A report goes stale when the follower stops answering.
        tokio::time::advance(Duration::from_millis(PEER_DISK_LOW_FRESH_MS)).await;
        assert!(!disks.is_low(2) && disks.entries_due(2));
        disks.record(2, true);
        disks.record(2, false);
        assert!(!disks.is_low(2) && disks.entries_due(2));
    }

    /// An append that a live peer refuses with an error status (here `503`) is reported only
    /// after [`REFUSED_RPC_PAUSE_MS`]: openraft 0.9 resends it at once, and a peer refusing for
    /// good was asked thousands of times a second (a fresh user's trial, a node started with
    /// another node's certificate). A vote is not paced.
    #[tokio::test]
    async fn an_append_a_peer_refuses_is_reported_after_a_pause() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let refuse = || async { (axum::http::StatusCode::SERVICE_UNAVAILABLE, "not_ready") };
        let app = axum::Router::new()
            .route(APPEND_PATH, axum::routing::post(refuse))
            .route(VOTE_PATH, axum::routing::post(refuse));
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let http = crate::net::http_client(Arc::new(crate::net::TcpDialer));
        let mut network = Network::new(GroupId::CLUSTER, http, None, Arc::default());
        let mut peer = network.new_client(2, &BasicNode::new(&addr)).await;
        let option = RPCOption::new(Duration::from_secs(5));
        let vote = openraft::Vote::new_committed(1, 1);
        for _ in 0..2 {
            let append = AppendEntriesRequest { vote, prev_log_id: None, entries: Vec::new(), leader_commit: None };
            let started = std::time::Instant::now();
            let refused = peer.append_entries(append, option.clone()).await;
            assert!(matches!(&refused, Err(RPCError::Network(e)) if e.to_string().contains("503")), "{refused:?}");
            assert!(started.elapsed() >= Duration::from_millis(REFUSED_RPC_PAUSE_MS), "{:?}", started.elapsed());
        }
        let refused = peer.vote(VoteRequest::new(vote, None), option).await;
        assert!(matches!(&refused, Err(RPCError::Network(_))), "{refused:?}");
        server.abort();
    }

    #[test]
    fn appends_are_cut_to_the_byte_budget_but_never_to_nothing() {
        let e: Vec<_> = (1..=4).map(|i| publish(i, 400)).collect();
        assert_eq!(entries_within(&e, 10_000), 4);
        assert_eq!(entries_within(&e, 800), 2);
        assert_eq!(entries_within(&e, 799), 1);
        assert_eq!(entries_within(&e, 10), 1, "one oversized entry still goes alone");
        assert_eq!(entries_within(&[], 10), 0);
        let batch = openraft::Entry::<TypeConfig> {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), 9),
            payload: EntryPayload::Normal(Command::Batch(vec![
                Command::Tick { ts: 1 },
                match publish(0, 300).payload {
                    EntryPayload::Normal(c) => c,
                    _ => unreachable!(),
                },
            ])),
        };
        assert_eq!(crate::raft::entry_payload_bytes(&batch), 300);
    }
}
