//! A full disk against real `runnev serve` processes: each node's data directory is a
//! size-limited tmpfs (`mount -t tmpfs -o size=…`, which needs root or CAP_SYS_ADMIN), and a
//! filler file takes its free space down to a few hundred KiB.
//!
//! The rules checked: a node whose disk is low takes no new writes but never stops its Raft core
//! (a follower is not `Shutdown`, `/healthz` stays 200); a write that needs a low disk is `507
//! storage_full`, never `500`, whether the leader's disk is low or a majority's; reads go on; once
//! the filler is removed, the node takes writes again and catches up by itself, with no restart;
//! no acknowledged batch is lost, and no refused one appears. A fresh node on a disk smaller than
//! one full log segment starts, joins and stores batches.
//!
//! Where `mount` is not permitted, each test says `SKIPPED: …` with the reason and returns
//! (scripts/test counts and names the skipped tests in its summary).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use runnev::wire::ClusterView;

const STREAM: &str = "disk";
/// Free bytes the filler leaves: far below what a node keeps free on these disks.
const LEAVE_BYTES: u64 = 512 * 1024;
/// Size of every test disk: room for a full 64 MiB log segment; the guard keeps a quarter of it
/// free (32 MiB, below the default 64 MiB) and a ballast of 4 MiB.
const DISK_BYTES: u64 = 128 * 1024 * 1024;
/// 4 KiB batches published one by one while a follower's disk is full: more entries than the
/// state machine applies between two durable commits (`SM_DURABLE_EVERY_ENTRIES`), so without
/// the guard the follower writes them all out at once onto its full disk.
const FOLLOWER_LOW_BATCHES: usize = 1_100;
/// A disk smaller than one full log segment (64 MiB).
const SMALL_DISK_BYTES: u64 = 24 * 1024 * 1024;
const WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);

/// A tmpfs mounted on a directory, unmounted (lazily, whoever still holds it) when dropped.
struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `bytes` on `dir` (created if missing); `Err` says why it could not.
    fn mount(dir: &Path, bytes: u64) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs on {} failed ({}): {}",
                dir.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs { dir: dir.to_path_buf() })
    }

    fn free_bytes(&self) -> u64 {
        let st = rustix::fs::statvfs(&self.dir).expect("statvfs on the tmpfs");
        st.f_bavail * st.f_frsize
    }

    fn filler(&self) -> PathBuf {
        self.dir.join("FILLER")
    }

    /// Takes the free space down to about [`LEAVE_BYTES`] with a filler file.
    fn fill(&self) {
        let f = std::fs::OpenOptions::new().create(true).append(true).open(self.filler()).expect("the filler file");
        let have = f.metadata().expect("filler metadata").len();
        let grow = self.free_bytes().saturating_sub(LEAVE_BYTES);
        rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, have + grow).expect("allocating the filler");
        eprintln!("{}: filled, {} bytes free", self.dir.display(), self.free_bytes());
    }

    /// Removes the filler file.
    fn free(&self) {
        std::fs::remove_file(self.filler()).expect("removing the filler");
        eprintln!("{}: filler removed, {} bytes free", self.dir.display(), self.free_bytes());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// Mounts a tmpfs of `bytes` for each of `ids` under `root`, or says why not.
fn mount_all(root: &Path, ids: &[u64], bytes: u64) -> Result<Vec<(u64, Tmpfs)>, String> {
    ids.iter().map(|id| Ok((*id, Tmpfs::mount(&root.join(format!("node-{id}")), bytes)?))).collect()
}

/// Starts a three-node cluster whose nodes `on_tmpfs` have their data directory on a tmpfs of
/// `bytes`; `None` (after printing `SKIPPED`) where mounting is not permitted.
async fn start(test: &str, on_tmpfs: &[u64], bytes: u64) -> Option<(Cluster, Vec<(u64, Tmpfs)>)> {
    let mut disks = Err(String::from("not mounted"));
    let cluster_started = {
        let disks = &mut disks;
        let probe = tempfile::Builder::new().prefix("runnev-test-mount-").tempdir().expect("a temp dir");
        match Tmpfs::mount(&probe.path().join("probe"), 1024 * 1024) {
            Err(e) => {
                skipped(&format!("full_disk::{test}: {e}; the test needs to mount a tmpfs (root or CAP_SYS_ADMIN)"));
                return None;
            }
            Ok(t) => drop(t),
        }
        Cluster::start_edited(3, &[], |spec| *disks = mount_all(&spec.root, on_tmpfs, bytes)).await
    };
    let disks = disks.unwrap_or_else(|e| panic!("mounting the test disks: {e}"));
    Some((cluster_started, disks))
}

async fn view(c: &Cluster, id: u64) -> ClusterView {
    c.cluster_info(id).await.unwrap_or_else(|e| panic!("GET /v1/cluster on node {id}: {e}"))
}

/// Waits until node `id` reports its disk low (`low`) or not.
async fn wait_disk(c: &Cluster, id: u64, low: bool) {
    wait_for(&format!("node {id} to report its disk low={low}"), WAIT, POLL, || async {
        let v = c.cluster_info(id).await?;
        match v.disk.as_ref().map(|d| d.low) {
            Some(l) if l == low => Ok(()),
            other => Err(format!("disk low={other:?}: {v}")),
        }
    })
    .await
}

/// Waits until the leader `leader` knows the disk of each of `ids` is low (`low`) or not.
async fn wait_leader_knows(c: &Cluster, leader: u64, ids: &[u64], low: bool) {
    wait_for(&format!("leader {leader} to see the disks of {ids:?} low={low}"), WAIT, POLL, || async {
        let v = c.cluster_info(leader).await?;
        let seen: Vec<Option<bool>> =
            ids.iter().map(|id| v.members.iter().find(|m| m.id == *id).and_then(|m| m.disk_low)).collect();
        match seen.iter().all(|s| *s == Some(low)) {
            true => Ok(()),
            false => Err(format!("{seen:?}: {v}")),
        }
    })
    .await
}

/// The published batches: acknowledged (seq, payload) and refused payloads.
#[derive(Default)]
struct Ledger {
    acked: Vec<(u64, Vec<u8>)>,
    refused: Vec<Vec<u8>>,
    n: u64,
}

impl Ledger {
    fn next_payload(&mut self, tag: &str) -> Vec<u8> {
        self.n += 1;
        let mut p = format!("{tag}-{:06}-", self.n).into_bytes();
        p.resize(4096, b'x');
        p
    }

    /// Publishes one new 4 KiB batch via `id`: the answer and the payload.
    async fn publish(&mut self, c: &Cluster, id: u64, tag: &str) -> (Resp, Vec<u8>) {
        let data = self.next_payload(tag);
        let url = format!("{}/v1/streams/{STREAM}/batches", c.url(id));
        let r = c.http.post(&url, data.clone()).await.unwrap_or_else(|e| panic!("publish via node {id}: {e}"));
        (r, data)
    }

    /// Publishes one batch via `id`; expects `201`.
    async fn publish_ok(&mut self, c: &Cluster, id: u64, tag: &str) {
        let (r, data) = self.publish(c, id, tag).await;
        assert_eq!(r.status, 201, "publish via node {id} ({tag}): {}", r.describe());
        self.acked.push((r.json()["seq"].as_u64().expect("a seq"), data));
    }

    /// Publishes one batch via `id`; expects `507 storage_full`.
    async fn publish_full(&mut self, c: &Cluster, id: u64, tag: &str) -> String {
        let (r, data) = self.publish(c, id, tag).await;
        assert_eq!(
            (r.status, r.error_code().as_deref()),
            (507, Some("storage_full")),
            "publish via node {id} ({tag}) should be refused for a full disk: {}",
            r.describe()
        );
        self.refused.push(data);
        r.text()
    }

    /// Every acknowledged batch is on every node, byte for byte, and no refused one is.
    async fn check_all(&self, c: &Cluster, min_index: u64) {
        for id in c.ids() {
            let got = read_all(&c.http, &c.url(id), STREAM, min_index, WAIT)
                .await
                .unwrap_or_else(|e| panic!("reading node {id}: {e}"));
            let by_seq: std::collections::BTreeMap<u64, &Vec<u8>> = got.iter().map(|b| (b.seq, &b.data)).collect();
            for (seq, data) in &self.acked {
                assert_eq!(by_seq.get(seq), Some(&data), "node {id}: acknowledged seq {seq} lost or changed");
            }
            for data in &self.refused {
                assert!(!got.iter().any(|b| &b.data == data), "node {id}: a refused batch was stored");
            }
            assert_eq!(got.len(), self.acked.len(), "node {id}: batches that nobody acknowledged");
        }
    }
}

/// The Raft core of node `id` runs: not `Shutdown`, no stop reason, `/healthz` 200.
async fn assert_raft_runs(c: &Cluster, id: u64) {
    let v = view(c, id).await;
    assert!(v.state != "Shutdown" && v.raft_stopped.is_none(), "node {id}'s Raft core stopped: {v}");
    let h = c.http.get(&format!("{}/healthz", c.url(id))).await.expect("healthz");
    assert_eq!(h.status, 200, "node {id} /healthz: {}", h.describe());
}

/// `/readyz` of node `id` says its disk is low (`low`), or not: a node that takes no new entries
/// is no place to send traffic (it used to answer `ready` while falling behind; a fresh user's
/// trial).
async fn assert_ready_says_disk_low(c: &Cluster, id: u64, low: bool) {
    wait_for(&format!("node {id} /readyz saying disk low={low}"), WAIT, POLL, || async {
        let r = c.http.get(&format!("{}/readyz", c.url(id))).await.map_err(|e| e.to_string())?;
        let says = r.status == 503 && r.text().starts_with("disk low: ");
        if says == low {
            Ok(())
        } else {
            Err(r.describe())
        }
    })
    .await
}

/// Reads on node `id` answer from what it has applied.
async fn assert_reads(c: &Cluster, id: u64, at_least: usize) {
    let r = c.http.get(&format!("{}/v1/streams/{STREAM}/batches?after=0&limit=1000", c.url(id))).await.expect("read");
    assert_eq!(r.status, 200, "read on node {id}: {}", r.describe());
    let n = r.json()["batches"].as_array().map_or(0, |b| b.len());
    assert!(n >= at_least, "read on node {id}: {n} batches, expected at least {at_least}");
}

/// One follower's disk fills: the cluster goes on without it, its Raft core keeps running, it
/// serves reads, and it catches up by itself once space is back. Then the leader's disk fills:
/// `507` through it and through a follower (forwarded), not `500`, and the leader goes on after.
/// Then a majority's: the leader answers `507` itself. No acknowledged batch is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_with_507_keeps_raft_running_and_recovers_by_itself() {
    let Some((mut c, disks)) = start("a_full_disk_refuses_writes", &[1, 2, 3], DISK_BYTES).await else { return };
    let disk = |id: u64| &disks.iter().find(|(i, _)| *i == id).expect("a disk per node").1;
    create_stream(&c.http, &c.url(1), STREAM).await;
    let mut ledger = Ledger::default();
    let leader = c.leader().await;
    let followers = c.followers().await;
    for i in 0..10 {
        ledger.publish_ok(&c, [leader, followers[0], followers[1]][i % 3], "before").await;
    }

    // A follower's disk fills. More batches than its free space could hold go on through the
    // other two (without the guard, its Raft core stopped on ENOSPC here, for good).
    let low = followers[0];
    disk(low).fill();
    for i in 0..FOLLOWER_LOW_BATCHES {
        ledger.publish_ok(&c, if i % 2 == 0 { leader } else { low }, "follower-low").await;
    }
    assert_raft_runs(&c, low).await;
    wait_disk(&c, low, true).await;
    assert_ready_says_disk_low(&c, low, true).await;
    wait_leader_knows(&c, leader, &[low], true).await;
    let held = view(&c, low).await.last_log_index;
    for i in 0..20 {
        ledger.publish_ok(&c, if i % 2 == 0 { leader } else { low }, "follower-low").await;
    }
    assert_eq!(view(&c, low).await.last_log_index, held, "the low follower took entries onto its full disk");
    assert_raft_runs(&c, low).await;
    assert_reads(&c, low, 10).await;
    disk(low).free();
    wait_disk(&c, low, false).await;
    assert_ready_says_disk_low(&c, low, false).await;
    let commit = c.leader_commit_index().await;
    ledger.check_all(&c, commit).await;
    assert_eq!(view(&c, low).await.disk.map(|d| d.low), Some(false));

    // The leader's disk fills.
    let leader = c.leader().await;
    let follower = c.followers().await[0];
    disk(leader).fill();
    wait_disk(&c, leader, true).await;
    let why = ledger.publish_full(&c, leader, "leader-low").await;
    assert!(why.contains("takes no writes"), "{why}");
    ledger.publish_full(&c, follower, "leader-low-forwarded").await;
    assert_raft_runs(&c, leader).await;
    assert_reads(&c, leader, 10).await;
    disk(leader).free();
    wait_disk(&c, leader, false).await;
    for _ in 0..5 {
        ledger.publish_ok(&c, leader, "leader-back").await;
    }

    // A majority's disks fill: the leader's own has room, but the entry could not commit.
    let leader = c.leader().await;
    let followers = c.followers().await;
    for f in &followers {
        disk(*f).fill();
    }
    for f in &followers {
        wait_disk(&c, *f, true).await;
    }
    wait_leader_knows(&c, leader, &followers, true).await;
    let why = ledger.publish_full(&c, leader, "majority-low").await;
    assert!(why.contains("majority"), "{why}");
    ledger.publish_full(&c, followers[0], "majority-low-forwarded").await;
    for f in &followers {
        assert_raft_runs(&c, *f).await;
        assert_reads(&c, *f, 10).await;
    }
    for f in &followers {
        disk(*f).free();
    }
    wait_leader_knows(&c, leader, &followers, false).await;
    for i in 0..10 {
        ledger.publish_ok(&c, [leader, followers[0], followers[1]][i % 3], "majority-back").await;
    }
    let commit = c.leader_commit_index().await;
    ledger.check_all(&c, commit).await;
    for id in c.ids() {
        assert_raft_runs(&c, id).await;
    }
}

/// A fresh node whose disk is smaller than one full log segment (64 MiB) starts, joins the
/// cluster and stores every batch: the log's segments start small and grow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_node_on_a_small_disk_starts_joins_and_stores() {
    let Some((mut c, disks)) = start("a_fresh_node_on_a_small_disk", &[3], SMALL_DISK_BYTES).await else { return };
    assert!(disks[0].1.free_bytes() < 64 * 1024 * 1024);
    create_stream(&c.http, &c.url(1), STREAM).await;
    let mut ledger = Ledger::default();
    for i in 0..60 {
        ledger.publish_ok(&c, [1, 2, 3][i % 3], "small").await;
    }
    let commit = c.leader_commit_index().await;
    ledger.check_all(&c, commit).await;
    assert_raft_runs(&c, 3).await;
    assert_eq!(view(&c, 3).await.disk.map(|d| d.low), Some(false), "node 3 should have room left");
}
