//! Chaos across real containers: a three-node cluster of `runnev:local` containers on a Docker
//! network of the test's own, under continuous publish (with seq, so retries dedupe) and a live
//! subscription, through four faults:
//!
//! 1. the leader's container is disconnected from the network, then reconnected;
//! 2. the leader is `docker kill`ed (SIGKILL), then started again on its volume;
//! 3. all three are restarted one at a time (`docker stop`: SIGTERM, then `docker start`);
//! 4. a follower is `docker pause`d until the leader has snapshotted and purged the log past it,
//!    then unpaused: it must catch up by installing a snapshot.
//!
//! After each fault: every acknowledged (seq, payload) is readable with identical bytes on every
//! node, no seq has two payloads, the replicas are identical (seq, ts, bytes), and the subscriber
//! saw every acknowledged batch, in order, once. The unavailability window of each fault (fault
//! injection to the first publish acknowledged after it) is printed, with the longest stall
//! between two acknowledgements during the fault.
//!
//! The nodes run secure, as deploy/ runs them: peer and client TLS with a CA the test makes, and
//! `--auth` with an admin token; every request of the test goes over TLS with that token.
//!
//! The test reaches the containers only through ports published on 127.0.0.1. It needs a Docker
//! engine and the image `runnev:local` (`deploy/build-image.sh`, which `deploy/ci.sh` runs first);
//! without either it fails, saying which is missing, unless `RUNNEV_SKIP_DOCKER=1` opts out on
//! purpose (then it prints `SKIPPED` and returns). `RUNNEV_IMAGE` names another image. Everything it
//! creates (containers, volumes, network) carries the label `runnev.test=container_chaos` and is
//! removed when the test ends, passes or fails; leftovers of a run that was killed are removed by
//! the next run.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::StreamExt;
use runnev::client::{Client, ClientError, Delivery, RetryPolicy};
use runnev::wire::ClusterView;

const STREAM: &str = "chaos";
/// Written only while a follower is paused, through the two live nodes.
const FILL_STREAM: &str = "chaos-fill";
const LABEL: &str = "runnev.test=container_chaos";
/// Every entry applied triggers a snapshot this often, keeping this few entries behind it, so a
/// paused follower falls behind the purged log within seconds.
const SNAPSHOT_LOGS: &str = "200";
const SNAPSHOT_KEEP_LOGS: &str = "20";
/// Pause between two publishes of the load generator (bounds the load: ~150 publishes/s at most).
const PUBLISH_PACE: Duration = Duration::from_millis(5);

// ---------------------------------------------------------------------------------------------
// docker CLI
// ---------------------------------------------------------------------------------------------

fn docker(args: &[&str]) -> Result<String, String> {
    let out = Command::new("docker").args(args).output().map_err(|e| format!("running docker {args:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "docker {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `docker` off the async workers (a `docker restart` blocks for seconds).
async fn docker_async(args: Vec<String>) -> Result<String, String> {
    tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        docker(&refs)
    })
    .await
    .map_err(|e| format!("docker task: {e}"))?
}

async fn docker_must(args: &[&str]) -> String {
    let owned: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    docker_async(owned).await.unwrap_or_else(|e| panic!("{e}"))
}

/// Why the test cannot run here, if it cannot.
fn skip_reason(image: &str) -> Option<String> {
    if let Err(e) = docker(&["info", "--format", "{{.ServerVersion}}"]) {
        return Some(format!("no Docker engine reachable ({e})"));
    }
    if docker(&["image", "inspect", "--format", "{{.Id}}", image]).is_err() {
        return Some(format!("image {image} is missing; build it with deploy/build-image.sh"));
    }
    None
}

fn pid_alive(pid: &str) -> bool {
    pid.parse::<u32>().map(|p| std::path::Path::new(&format!("/proc/{p}")).exists()).unwrap_or(false)
}

/// Removes what earlier runs of this test left behind when they were killed (their test process
/// is gone); never touches the resources of a run that is still going.
fn remove_leftovers() {
    let filter = format!("label={LABEL}");
    if let Ok(list) =
        docker(&["ps", "-a", "--filter", &filter, "--format", "{{.Names}} {{.Label \"runnev.test.pid\"}}"])
    {
        for line in list.lines() {
            let mut it = line.split_whitespace();
            if let (Some(name), Some(pid)) = (it.next(), it.next()) {
                if !pid_alive(pid) {
                    let _ = docker(&["rm", "-f", "-v", name]);
                }
            }
        }
    }
    for kind in ["network", "volume"] {
        let fmt = "{{.Name}} {{.Label \"runnev.test.pid\"}}";
        if let Ok(list) = docker(&[kind, "ls", "--filter", &filter, "--format", fmt]) {
            for line in list.lines() {
                let mut it = line.split_whitespace();
                if let (Some(name), Some(pid)) = (it.next(), it.next()) {
                    if !pid_alive(pid) {
                        let _ = docker(&[kind, "rm", name]);
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The containers
// ---------------------------------------------------------------------------------------------

struct NodeBox {
    id: u64,
    /// Container name, also the host name peers dial.
    name: String,
    volume: String,
    /// Host port on 127.0.0.1 published to the container's 7001.
    port: u16,
}

impl NodeBox {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// The cluster's containers, volumes and network; all removed on drop, even when the test fails
/// (then each container's log tail is printed first). The nodes run as in production: peer and
/// client TLS with a CA of the test's own, and `--auth` with an admin token.
struct Env {
    network: String,
    nodes: Vec<NodeBox>,
    /// The CA, the node certificates and keys, and the admin token (a directory of mode 0700).
    secrets: std::path::PathBuf,
    token: runnev::auth::Token,
}

/// Makes the cluster's credentials in `dir`: `ca.pem`, `node-N.pem`/`node-N.key` naming each
/// node's container (and 127.0.0.1, where the test reaches it), `admin.token`. The image runs as
/// uid 10001, which must read its key and the token through the bind mounts: as root the files
/// are given to it, otherwise they are made readable (the directory itself stays 0700).
fn make_secrets(dir: &std::path::Path, names: &[(u64, String)]) -> runnev::auth::Token {
    use runnev::tls::{create_ca, issue, read_ca, write_private, write_public, Subject};
    use std::os::unix::fs::PermissionsExt;
    let ca = create_ca("runnev container chaos test CA").expect("making the CA");
    write_public(&dir.join("ca.pem"), &ca.cert_pem).expect("ca.pem");
    write_private(&dir.join("ca.key"), &ca.key_pem).expect("ca.key");
    let ca = read_ca(dir).expect("reading the CA");
    let mut private = vec![dir.join("admin.token")];
    for (id, name) in names {
        let issued = issue(&ca, &Subject::Node(*id), &[name.clone(), "127.0.0.1".into()]).expect("node certificate");
        write_public(&dir.join(format!("node-{id}.pem")), &issued.cert_pem).expect("node certificate");
        write_private(&dir.join(format!("node-{id}.key")), &issued.key_pem).expect("node key");
        private.push(dir.join(format!("node-{id}.key")));
    }
    let token = runnev::auth::Token::generate(runnev::auth::ADMIN_TOKEN_NAME).expect("randomness");
    write_private(&private[0], &format!("{}\n", token.expose())).expect("admin.token");
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    for path in &private {
        if root {
            std::os::unix::fs::chown(path, Some(10001), Some(10001)).expect("chown for the image's user");
        } else {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        }
    }
    token
}

impl Env {
    fn create(image: &str) -> Env {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().subsec_nanos();
        let pid = std::process::id();
        let tag = format!("rnvchaos-{pid}-{:x}", nanos & 0xffff);
        let pid_label = format!("runnev.test.pid={pid}");
        let network = format!("{tag}-net");
        let secrets = tempfile::Builder::new().prefix("runnev-chaos-secrets-").tempdir().expect("tempdir").keep();
        let names: Vec<(u64, String)> = (1..=3u64).map(|id| (id, format!("{tag}-n{id}"))).collect();
        let token = make_secrets(&secrets, &names);
        let mut env = Env { network: network.clone(), nodes: Vec::new(), secrets, token };
        docker(&["network", "create", "--label", LABEL, "--label", &pid_label, &network])
            .unwrap_or_else(|e| panic!("{e}"));
        // Free loopback ports for the published client API.
        let ports = runnev::launcher::free_ports(3).expect("free ports");
        for id in 1..=3u64 {
            env.nodes.push(NodeBox {
                id,
                name: format!("{tag}-n{id}"),
                volume: format!("{tag}-v{id}"),
                port: ports[(id - 1) as usize],
            });
        }
        let peers = env.nodes.iter().map(|n| format!("{}={}:7001", n.id, n.name)).collect::<Vec<_>>().join(",");
        for n in &env.nodes {
            docker(&["volume", "create", "--label", LABEL, "--label", &pid_label, &n.volume])
                .unwrap_or_else(|e| panic!("{e}"));
            let publish = format!("127.0.0.1:{}:7001", n.port);
            let mount = format!("{}:/var/lib/runnev", n.volume);
            let id = n.id.to_string();
            let file = |name: &str, at: &str| format!("{}:/etc/runnev/{at}:ro", env.secrets.join(name).display());
            let (ca, cert, key, token) = (
                file("ca.pem", "ca.pem"),
                file(&format!("node-{id}.pem"), "node.pem"),
                file(&format!("node-{id}.key"), "node.key"),
                file("admin.token", "admin.token"),
            );
            docker(&[
                "run",
                "-d",
                "--name",
                &n.name,
                "--hostname",
                &n.name,
                "--label",
                LABEL,
                "--label",
                &pid_label,
                "--network",
                &network,
                "-p",
                &publish,
                "-v",
                &mount,
                "-v",
                &ca,
                "-v",
                &cert,
                "-v",
                &key,
                "-v",
                &token,
                "-e",
                "RUST_LOG=info,openraft=warn",
                "-e",
                "NO_COLOR=1",
                image,
                "serve",
                "--id",
                &id,
                "--data-dir",
                "/var/lib/runnev",
                "--listen",
                "0.0.0.0:7001",
                "--tls-ca",
                "/etc/runnev/ca.pem",
                "--tls-cert",
                "/etc/runnev/node.pem",
                "--tls-key",
                "/etc/runnev/node.key",
                "--auth",
                "--admin-token-file",
                "/etc/runnev/admin.token",
                "--peers",
                &peers,
                "--snapshot-logs",
                SNAPSHOT_LOGS,
                "--snapshot-keep-logs",
                SNAPSHOT_KEEP_LOGS,
            ])
            .unwrap_or_else(|e| panic!("{e}"));
        }
        println!(
            "started {} on network {network}: {}",
            image,
            env.nodes
                .iter()
                .map(|n| format!("node {} = {} at {}", n.id, n.name, n.url()))
                .collect::<Vec<_>>()
                .join(", ")
        );
        env
    }

    fn node(&self, id: u64) -> &NodeBox {
        &self.nodes[(id - 1) as usize]
    }

    fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(NodeBox::url).collect()
    }

    /// Dials the nodes over TLS, verifying them against the test's CA.
    fn dialer(&self) -> Arc<dyn runnev::net::Dialer> {
        let config = runnev::tls::client_config(&self.secrets.join("ca.pem"), None).expect("the CA file");
        Arc::new(runnev::tls::TlsDialer::new(Arc::new(runnev::net::TcpDialer), config))
    }

    /// A client of `urls` over TLS with the admin token.
    fn client(&self, urls: &[String], policy: RetryPolicy) -> Client {
        Client::with_dialer(urls, self.dialer(), policy).expect("node addresses").with_token(Some(self.token.clone()))
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for n in &self.nodes {
                let state = docker(&["inspect", "--format", "{{.State.Status}} exit={{.State.ExitCode}}", &n.name])
                    .unwrap_or_else(|e| e);
                eprintln!("---- node {} ({}, {state}): last log lines ----", n.id, n.name);
                match Command::new("docker").args(["logs", "--tail", "60", &n.name]).output() {
                    Ok(o) => {
                        eprintln!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
                    }
                    Err(e) => eprintln!("docker logs: {e}"),
                }
            }
        }
        for n in &self.nodes {
            // A paused container cannot be removed before it is unpaused.
            let _ = docker(&["unpause", &n.name]);
            let _ = docker(&["rm", "-f", "-v", &n.name]);
        }
        for n in &self.nodes {
            if let Err(e) = docker(&["volume", "rm", "-f", &n.volume]) {
                eprintln!("cleanup: {e}");
            }
        }
        if let Err(e) = docker(&["network", "rm", &self.network]) {
            eprintln!("cleanup: {e}");
        }
        let _ = std::fs::remove_dir_all(&self.secrets);
        println!("removed containers, volumes and network {}", self.network);
    }
}

// ---------------------------------------------------------------------------------------------
// Load: one publisher with explicit seqs, one subscriber
// ---------------------------------------------------------------------------------------------

/// The payload of `seq`: deterministic, binary, 16 to ~1 KiB.
fn payload(seq: u64) -> Vec<u8> {
    let len = 16 + (seq.wrapping_mul(2_654_435_761) % 1000) as usize;
    let mut v = format!("chaos seq={seq};").into_bytes();
    let mut x = seq ^ 0x9E37_79B9_7F4A_7C15;
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push((x & 0xff) as u8);
    }
    v
}

#[derive(Clone, Copy, Debug)]
struct Acked {
    /// The publish call's duration, retries included.
    latency: Duration,
    seq: u64,
    ts: u64,
    index: u64,
    duplicate: bool,
    at: Instant,
}

#[derive(Default)]
struct Shared {
    /// Acknowledged publishes in seq order (seq i at position i - 1).
    acked: Mutex<Vec<Acked>>,
    /// What the subscriber delivered, in order.
    delivered: Mutex<Vec<(u64, Bytes)>>,
    /// Invariant violations the load tasks saw.
    violations: Mutex<Vec<String>>,
    /// Publish calls that gave up (ClientError::Unavailable) and were retried with the same seq.
    publish_gave_up: AtomicU64,
    /// Other transient publish failures (retried with the same seq).
    publish_other_errors: AtomicU64,
    subscribe_errors: AtomicU64,
    stop: AtomicBool,
}

impl Shared {
    fn violation(&self, what: String) {
        eprintln!("VIOLATION: {what}");
        self.violations.lock().unwrap().push(what);
    }

    fn last_acked(&self) -> Option<Acked> {
        self.acked.lock().unwrap().last().copied()
    }
}

fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

async fn publisher(client: Client, sh: Arc<Shared>) {
    let mut seq = 1u64;
    let mut last_err_print = Instant::now() - Duration::from_secs(60);
    while !sh.stop.load(Ordering::Relaxed) {
        let data = payload(seq);
        let started = Instant::now();
        match client.publish(STREAM, Some(seq), data).await {
            Ok(ack) => {
                if ack.seq != seq {
                    sh.violation(format!("publish seq {seq} acknowledged as seq {}", ack.seq));
                }
                sh.acked.lock().unwrap().push(Acked {
                    seq,
                    ts: ack.ts,
                    index: ack.index,
                    duplicate: ack.duplicate,
                    at: Instant::now(),
                    latency: started.elapsed(),
                });
                seq += 1;
                tokio::time::sleep(PUBLISH_PACE).await;
            }
            Err(e) => {
                match &e {
                    ClientError::Unavailable { .. } | ClientError::Unreachable { .. } => {
                        sh.publish_gave_up.fetch_add(1, Ordering::Relaxed)
                    }
                    ClientError::Api { code, .. } if code.starts_with("seq_") => {
                        // A retry of the same (seq, payload) must be a duplicate, never a conflict.
                        sh.violation(format!("publish seq {seq}: {e}"));
                        sh.publish_other_errors.fetch_add(1, Ordering::Relaxed)
                    }
                    _ => sh.publish_other_errors.fetch_add(1, Ordering::Relaxed),
                };
                if last_err_print.elapsed() > Duration::from_secs(2) {
                    println!("  publish seq {seq} failed, retrying with the same seq: {e}");
                    last_err_print = Instant::now();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn subscriber(client: Client, sh: Arc<Shared>) {
    let mut sub = client.subscribe(STREAM, 0);
    let mut last = 0u64;
    while !sh.stop.load(Ordering::Relaxed) {
        let item = match tokio::time::timeout(Duration::from_millis(500), sub.next()).await {
            Err(_) => continue,
            Ok(None) => {
                sh.violation("the subscription ended".into());
                return;
            }
            Ok(Some(item)) => item,
        };
        match item {
            Ok(Delivery::Batch(b)) => {
                if b.seq != last + 1 {
                    sh.violation(format!("subscriber: seq {} delivered after seq {last}", b.seq));
                }
                last = b.seq;
                sh.delivered.lock().unwrap().push((b.seq, b.data));
            }
            Ok(Delivery::Gap(g)) => sh.violation(format!("subscriber: gap {g:?} on a stream without retention")),
            Err(e) => {
                sh.subscribe_errors.fetch_add(1, Ordering::Relaxed);
                println!("  subscription: {e}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Cluster views and checks
// ---------------------------------------------------------------------------------------------

/// One GET to node `n` over TLS with the admin token (for /metrics and /readyz), bounded in time.
async fn http_get(env: &Env, n: &NodeBox, path: &str) -> Result<(u16, String), String> {
    let http = runnev::net::http_client(env.dialer());
    let url = format!("{}{path}", n.url());
    let (status, body) =
        runnev::net::get_as(&http, &url, Duration::from_secs(3), 1 << 20, Some(env.token.expose())).await?;
    Ok((status.as_u16(), String::from_utf8_lossy(&body).into_owned()))
}

/// The first sample of metric `name` in `/metrics` text, parsed by prometheus-parse.
fn prom_value(text: &str, name: &str) -> Option<f64> {
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).ok()?;
    scrape.samples.iter().filter(|s| s.metric == name).find_map(|s| match s.value {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => Some(v),
        _ => None,
    })
}

struct Views<'a> {
    env: &'a Env,
    probe: Client,
}

impl Views<'_> {
    async fn view(&self, id: u64) -> Result<ClusterView, String> {
        self.probe.cluster_view(&self.env.node(id).url()).await.map_err(|e| e.to_string())
    }

    /// Every node's view, asked concurrently (a cut-off node costs one probe timeout).
    async fn all(&self) -> BTreeMap<u64, Result<ClusterView, String>> {
        let asks = self.env.nodes.iter().map(|n| async move { (n.id, self.view(n.id).await) });
        futures::future::join_all(asks).await.into_iter().collect()
    }

    /// Waits until a majority agrees on a leader other than `old`; returns it and the time taken.
    async fn leader_change(&self, old: u64, since: Instant, timeout: Duration) -> (u64, Duration) {
        loop {
            let views = self.all().await;
            let mut votes: BTreeMap<(u64, u64), usize> = BTreeMap::new();
            for v in views.values().flatten() {
                if let Some(l) = v.leader_id {
                    *votes.entry((l, v.term)).or_default() += 1;
                }
            }
            if let Some(((l, _), _)) = votes.iter().find(|((l, _), n)| *l != old && **n >= 2) {
                return (*l, since.elapsed());
            }
            assert!(since.elapsed() < timeout, "no new leader (other than {old}) within {timeout:?}: {views:?}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// The leader a majority agrees on (and that says it leads), waiting up to `timeout`.
    async fn leader(&self, timeout: Duration) -> u64 {
        let start = Instant::now();
        loop {
            let views = self.all().await;
            let mut votes: BTreeMap<(u64, u64), usize> = BTreeMap::new();
            for v in views.values().flatten() {
                if let Some(l) = v.leader_id {
                    *votes.entry((l, v.term)).or_default() += 1;
                }
            }
            for ((l, t), n) in &votes {
                if *n >= 2 {
                    if let Some(Ok(v)) = views.get(l) {
                        if v.leader_id == Some(*l) && v.term == *t {
                            return *l;
                        }
                    }
                }
            }
            if start.elapsed() > timeout {
                panic!("no leader agreed by a majority within {timeout:?}: {views:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until all three nodes are ready (/readyz), agree on one leader and term, and have
    /// applied at least what the leader had committed when the wait began. Returns the time taken.
    async fn wait_recovered(&self, what: &str, timeout: Duration) -> Duration {
        let start = Instant::now();
        let leader = self.leader(timeout).await;
        let target = self.view(leader).await.map_or(0, |v| v.commit_index);
        loop {
            let views = self.all().await;
            let mut ok = true;
            let mut leaders = Vec::new();
            for (id, v) in &views {
                match v {
                    Ok(v) => {
                        leaders.push((v.leader_id, v.term));
                        if v.applied_index < target {
                            ok = false;
                        }
                    }
                    Err(_) => ok = false,
                }
                match http_get(self.env, self.env.node(*id), "/readyz").await {
                    Ok((200, _)) => {}
                    _ => ok = false,
                }
            }
            if ok && leaders.windows(2).all(|w| w[0] == w[1]) && leaders[0].0.is_some() {
                return start.elapsed();
            }
            if start.elapsed() > timeout {
                panic!(
                    "{what}: the cluster did not recover within {timeout:?} (target applied index {target}): {views:?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Reads every batch with seq <= `upto` from one node, after it has applied `min_index`.
async fn read_node(
    env: &Env,
    url: &str,
    stream: &str,
    upto: u64,
    min_index: u64,
) -> Result<Vec<(u64, u64, Bytes)>, String> {
    let policy = RetryPolicy {
        request_timeout: Duration::from_secs(15),
        backoff_min: Duration::from_millis(100),
        backoff_max: Duration::from_secs(1),
        give_up_after: Duration::from_secs(30),
        unreachable_after: Duration::from_secs(30),
    };
    let one = env.client(&[url.to_string()], policy);
    let mut out = Vec::new();
    let mut after = 0;
    while after < upto {
        let r = one.read_at(stream, after, 10_000, 0, Some(min_index)).await.map_err(|e| format!("{url}: {e}"))?;
        if r.gap.is_some() {
            return Err(format!("{url}: gap {:?} after {after}", r.gap));
        }
        if r.batches.is_empty() {
            return Err(format!("{url}: nothing after seq {after} although seq {upto} was acknowledged"));
        }
        for b in r.batches {
            if b.seq > upto {
                break;
            }
            out.push((b.seq, b.ts, b.data));
        }
        after = r.next_after;
    }
    Ok(out)
}

/// The checks after a fault. Returns the highest seq checked.
async fn verify(env: &Env, sh: &Shared, what: &str) -> u64 {
    let started = Instant::now();
    let acked: Vec<Acked> = sh.acked.lock().unwrap().clone();
    let upto = acked.len() as u64;
    assert!(upto > 0, "{what}: nothing was acknowledged");
    let min_index = acked.iter().map(|a| a.index).max().unwrap();
    for (i, a) in acked.iter().enumerate() {
        assert_eq!(a.seq, i as u64 + 1, "{what}: acknowledged seqs are not 1..n");
    }

    // Every node: exactly seqs 1..=upto, each with the acknowledged payload; all nodes identical.
    let mut replicas = Vec::new();
    for n in &env.nodes {
        let got = read_node(env, &n.url(), STREAM, upto, min_index)
            .await
            .unwrap_or_else(|e| panic!("{what}: reading node {}: {e}", n.id));
        assert_eq!(got.len() as u64, upto, "{what}: node {} serves {} batches up to seq {upto}", n.id, got.len());
        for (i, (seq, ts, data)) in got.iter().enumerate() {
            let a = &acked[i];
            assert_eq!(*seq, a.seq, "{what}: node {} batch #{i} has seq {seq}, expected {}", n.id, a.seq);
            assert!(
                data[..] == payload(*seq)[..],
                "{what}: node {} seq {seq}: payload differs from the acknowledged one ({} bytes vs {})",
                n.id,
                data.len(),
                payload(*seq).len()
            );
            assert_eq!(*ts, a.ts, "{what}: node {} seq {seq}: ts {ts} but the ack said {}", n.id, a.ts);
        }
        replicas.push((n.id, got));
    }
    for (id, r) in &replicas[1..] {
        assert!(r == &replicas[0].1, "{what}: node {id} differs from node {}", replicas[0].0);
    }

    // The subscriber saw every acknowledged batch, in order, once.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = sh.delivered.lock().unwrap().len() as u64;
        if n >= upto {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the subscriber delivered {n} batches, {upto} were acknowledged, after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    {
        let delivered = sh.delivered.lock().unwrap();
        for (i, (seq, data)) in delivered.iter().enumerate() {
            assert_eq!(*seq, i as u64 + 1, "{what}: subscriber delivery #{i} is seq {seq}");
            if *seq <= upto {
                assert!(data[..] == payload(*seq)[..], "{what}: subscriber seq {seq}: payload differs");
            }
        }
    }
    let violations = sh.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{what}: violations seen by the load: {violations:#?}");
    let dups = acked.iter().filter(|a| a.duplicate).count();
    println!(
        "  verified after {what}: seqs 1..={upto} (index <= {min_index}) identical on all 3 nodes and \
         delivered in order; {dups} acks were duplicates of a retried publish; checked in {:.1?}",
        started.elapsed()
    );
    upto
}

/// The unavailability of one fault, measured on the publisher's acknowledgements.
struct Window {
    fault: String,
    /// Fault injection to the first publish acknowledged that the leader proposed after it.
    to_first_ack: Duration,
    /// Longest time between two consecutive acknowledgements from the injection to the end of
    /// the fault's phase.
    longest_stall: Duration,
    /// Fault injection to a majority agreeing on a new leader (faults that take the leader away).
    election: Option<Duration>,
    /// The publish load during the phase.
    load: String,
}

async fn first_ack_after(sh: &Shared, at: Instant, at_ms: u64, timeout: Duration, what: &str) -> Duration {
    let deadline = at + timeout;
    loop {
        {
            let acked = sh.acked.lock().unwrap();
            // Acknowledgements come in order; a batch proposed after the fault has ts >= at_ms.
            if let Some(a) = acked.iter().rev().take_while(|a| a.at >= at).filter(|a| a.ts >= at_ms).last() {
                return a.at - at;
            }
        }
        assert!(Instant::now() < deadline, "{what}: no publish acknowledged within {timeout:?} of the fault");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn longest_stall(sh: &Shared, from: Instant, to: Instant) -> Duration {
    let acked = sh.acked.lock().unwrap();
    let mut prev = from;
    let mut worst = Duration::ZERO;
    for a in acked.iter().filter(|a| a.at >= from && a.at <= to) {
        worst = worst.max(a.at - prev);
        prev = a.at;
    }
    worst.max(to.saturating_duration_since(prev))
}

/// Publishes acknowledged between `from` and `to`, their rate and latencies.
fn load_stats(sh: &Shared, from: Instant, to: Instant) -> String {
    let acked = sh.acked.lock().unwrap();
    let mut lat: Vec<Duration> = acked.iter().filter(|a| a.at >= from && a.at <= to).map(|a| a.latency).collect();
    if lat.is_empty() {
        return "no publish acknowledged".into();
    }
    lat.sort();
    let secs = (to - from).as_secs_f64().max(0.001);
    format!(
        "{} publishes acknowledged in {:.1}s ({:.0}/s), latency p50 {:.1?} p99 {:.1?} max {:.1?}",
        lat.len(),
        secs,
        lat.len() as f64 / secs,
        lat[lat.len() / 2],
        lat[(lat.len() * 99 / 100).min(lat.len() - 1)],
        lat[lat.len() - 1]
    )
}

fn fault_clock() -> (Instant, u64) {
    (Instant::now(), wall_ms())
}

// ---------------------------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_across_containers() {
    let image = std::env::var("RUNNEV_IMAGE").unwrap_or_else(|_| "runnev:local".to_string());
    if let Some(why) = skip_reason(&image) {
        // A missing prerequisite is a failure, never a pass: only an explicit opt-out skips.
        if std::env::var("RUNNEV_SKIP_DOCKER").is_ok_and(|v| v == "1") {
            println!("SKIPPED: chaos_across_containers: {why}; RUNNEV_SKIP_DOCKER=1 opts out");
            return;
        }
        panic!(
            "chaos_across_containers cannot run: {why}. Run deploy/ci.sh (builds the image, then runs this \
             test), or set RUNNEV_SKIP_DOCKER=1 to skip it on purpose"
        );
    }
    let revision = docker(&[
        "image",
        "inspect",
        "--format",
        "{{index .Config.Labels \"org.opencontainers.image.revision\"}}",
        &image,
    ])
    .unwrap_or_default();
    let head = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    println!("image {image} built from revision {revision:?}; the checkout is at {head:?}");
    if !head.is_empty() && !revision.starts_with(&head) {
        println!("WARNING: the image is not built from this checkout; rebuild it with deploy/build-image.sh");
    }
    let test_start = Instant::now();
    remove_leftovers();
    let env = Env::create(&image);
    let views = Views {
        env: &env,
        probe: env.client(
            &env.urls(),
            RetryPolicy {
                request_timeout: Duration::from_millis(500),
                backoff_min: Duration::from_millis(50),
                backoff_max: Duration::from_millis(200),
                give_up_after: Duration::from_secs(2),
                unreachable_after: Duration::from_secs(2),
            },
        ),
    };
    let formed = views.wait_recovered("cluster formation", Duration::from_secs(60)).await;
    println!("cluster formed in {formed:.1?} (after containers started)");

    // Load: the client fails over between the three published ports; a request to a node that is
    // cut off or paused is abandoned after 2 s and retried on the next node with the same seq.
    let policy = RetryPolicy {
        request_timeout: Duration::from_secs(2),
        backoff_min: Duration::from_millis(20),
        backoff_max: Duration::from_millis(500),
        give_up_after: Duration::from_secs(30),
        // Containers restart: refused connections are retried as long as the rest.
        unreachable_after: Duration::from_secs(30),
    };
    let client = env.client(&env.urls(), policy);
    client.put_stream(STREAM, None).await.expect("creating the stream");
    // The answer to PUT carries no log index to wait for, and a subscription to a node that has
    // not applied the creation yet ends with 404: wait until every node knows the stream.
    for n in &env.nodes {
        let one = env.client(&[n.url()], policy);
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Err(e) = one.stream(STREAM).await {
            assert!(Instant::now() < deadline, "node {} does not know stream {STREAM} after 10 s: {e}", n.id);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let sh = Arc::new(Shared::default());
    let pub_task = tokio::spawn(publisher(client.clone(), sh.clone()));
    let sub_task = tokio::spawn(subscriber(client.clone(), sh.clone()));
    // Load flows before the first fault (a liveness bound, not a rate).
    let deadline = Instant::now() + Duration::from_secs(60);
    let before = loop {
        match sh.last_acked().map(|a| a.seq) {
            Some(seq) if seq >= 10 => break seq,
            _ => {}
        }
        assert!(Instant::now() < deadline, "liveness bound: fewer than 10 publishes acknowledged within 60 s of load");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!("load running: {before} publishes acknowledged");
    verify(&env, &sh, "warm-up").await;

    let ch = Chaos { env: &env, views, sh: sh.clone(), policy };
    let mut windows = partition_the_leader(&ch).await;
    windows.extend(kill_the_leader(&ch).await);
    let (rolling, restart_stops) = rolling_restart(&ch).await;
    windows.extend(rolling);
    windows.extend(pause_a_follower(&ch).await);

    // ---- stop the load, final check
    tokio::time::sleep(Duration::from_secs(1)).await;
    sh.stop.store(true, Ordering::Relaxed);
    pub_task.await.expect("publisher task");
    sub_task.await.expect("subscriber task");
    let total = verify(&env, &sh, "the whole run").await;

    report(&windows, &restart_stops, &sh, total, test_start);
    drop(ch);
    drop(env);
}

/// Prints each fault's unavailability window and the run's totals.
fn report(windows: &[Window], restart_stops: &[(u64, Duration)], sh: &Shared, total: u64, test_start: Instant) {
    println!(
        "\nUNAVAILABILITY WINDOWS (fault injection -> first publish acknowledged that was proposed after it; \
         longest stall between two acks in the phase; time to a new leader)"
    );
    for w in windows {
        println!(
            "  {:<60} window {:>9.2?}   longest stall {:>9.2?}   new leader {:>9}",
            w.fault,
            w.to_first_ack,
            w.longest_stall,
            w.election.map(|e| format!("{e:.2?}")).unwrap_or_else(|| "-".into())
        );
        println!("  {:<60} load: {}", "", w.load);
    }
    println!(
        "{total} batches acknowledged and verified; publish calls that gave up and were retried: {}, other \
         transient publish errors: {}, subscription errors: {}; test took {:.1?}",
        sh.publish_gave_up.load(Ordering::Relaxed),
        sh.publish_other_errors.load(Ordering::Relaxed),
        sh.subscribe_errors.load(Ordering::Relaxed),
        test_start.elapsed()
    );
    let slow: Vec<String> = restart_stops
        .iter()
        .filter(|(_, d)| *d >= Duration::from_secs(10))
        .map(|(id, d)| format!("node {id} ({d:.1?})"))
        .collect();
    if !slow.is_empty() {
        println!(
            "NOTE: SIGTERM did not stop {} within docker's 10 s grace period (docker then sent SIGKILL)",
            slow.join(", ")
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The faults, one per function, in the order the test injects them
// ---------------------------------------------------------------------------------------------

/// What every fault works with: the containers, the cluster views, the load's shared record and
/// the load's retry policy.
struct Chaos<'a> {
    env: &'a Env,
    views: Views<'a>,
    sh: Arc<Shared>,
    policy: RetryPolicy,
}

/// Fault 1. partition: the leader's container leaves the network, then comes back: The leader's container leaves the network, then comes back.
async fn partition_the_leader(ch: &Chaos<'_>) -> Vec<Window> {
    let Chaos { env, views, sh, .. } = ch;
    let mut windows = Vec::new();
    let leader = views.leader(Duration::from_secs(20)).await;
    let name = env.node(leader).name.clone();
    println!("\n[1] disconnecting leader node {leader} ({name}) from {}", env.network);
    let t0 = Instant::now();
    docker_must(&["network", "disconnect", &env.network, &name]).await;
    // The fault is certainly in effect once the command returns.
    let (at, at_ms) = fault_clock();
    println!("    (docker network disconnect took {:.2?})", at - t0);
    let (elected, election) = views.leader_change(leader, at, Duration::from_secs(30)).await;
    let to_first = first_ack_after(sh, at, at_ms, Duration::from_secs(60), "partition").await;
    println!(
        "    node {elected} elected by the majority side {election:.2?} after the disconnect; first publish \
         acknowledged {to_first:.2?} after it"
    );
    // Stay cut off long enough for the old leader to notice nothing and the rest to move on.
    let hold = Duration::from_secs(5).saturating_sub(at.elapsed());
    tokio::time::sleep(hold).await;
    let new_leader = views.leader(Duration::from_secs(20)).await;
    assert_ne!(new_leader, leader, "the majority side should have elected another leader");
    println!("    node {new_leader} leads the majority side; reconnecting node {leader}");
    docker_must(&["network", "connect", &env.network, &name]).await;
    let (re_at, re_ms) = fault_clock();
    let re_first = first_ack_after(sh, re_at, re_ms, Duration::from_secs(60), "partition heal").await;
    let recovered = views.wait_recovered("partition heal", Duration::from_secs(60)).await;
    println!("    after the reconnect: first publish acknowledged in {re_first:.2?}; all 3 ready in {recovered:.1?}");
    let end = Instant::now();
    windows.push(Window {
        fault: format!("1. leader (node {leader}) disconnected from the network"),
        to_first_ack: to_first,
        longest_stall: longest_stall(sh, at, re_at),
        election: Some(election),
        load: load_stats(sh, at, re_at),
    });
    windows.push(Window {
        fault: format!("1b. node {leader} reconnected"),
        to_first_ack: re_first,
        longest_stall: longest_stall(sh, re_at, end),
        election: None,
        load: load_stats(sh, re_at, end),
    });
    verify(env, sh, "partition of the leader").await;
    windows
}

/// Fault 2. docker kill the leader, start it again: `docker kill` the leader, then start it again.
async fn kill_the_leader(ch: &Chaos<'_>) -> Vec<Window> {
    let Chaos { env, views, sh, .. } = ch;
    let mut windows = Vec::new();
    let leader = views.leader(Duration::from_secs(20)).await;
    let name = env.node(leader).name.clone();
    println!("\n[2] docker kill leader node {leader} ({name})");
    docker_must(&["kill", &name]).await;
    let (at, at_ms) = fault_clock();
    let (elected, election) = views.leader_change(leader, at, Duration::from_secs(30)).await;
    let to_first = first_ack_after(sh, at, at_ms, Duration::from_secs(60), "kill").await;
    println!(
        "    node {elected} elected {election:.2?} after the kill; first publish acknowledged {to_first:.2?} after it"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    docker_must(&["start", &name]).await;
    let recovered = views.wait_recovered("restart after kill", Duration::from_secs(60)).await;
    println!("    node {leader} started again; all 3 ready in {recovered:.1?}");
    windows.push(Window {
        fault: format!("2. leader (node {leader}) killed (SIGKILL)"),
        to_first_ack: to_first,
        longest_stall: longest_stall(sh, at, Instant::now()),
        election: Some(election),
        load: load_stats(sh, at, Instant::now()),
    });
    verify(env, sh, "kill of the leader").await;
    windows
}

/// Fault 3. rolling restart, one node at a time: Every node in turn: `docker stop` (SIGTERM), then `docker start`.
async fn rolling_restart(ch: &Chaos<'_>) -> (Vec<Window>, Vec<(u64, Duration)>) {
    let Chaos { env, views, sh, .. } = ch;
    let mut windows = Vec::new();
    let mut restart_stops = Vec::new();
    println!("\n[3] restarting all three nodes one at a time (docker stop: SIGTERM, then docker start)");
    for id in 1..=3u64 {
        let leader = views.leader(Duration::from_secs(20)).await;
        let name = env.node(id).name.clone();
        let role = if id == leader { "leader" } else { "follower" };
        // SIGTERM is sent when the command starts: the fault begins then.
        let at = Instant::now();
        docker_must(&["stop", "-t", "10", &name]).await;
        let stopped = at.elapsed();
        // A node stopping on SIGTERM drains first (it may still commit for a few hundred ms):
        // the window is measured from the moment it is gone.
        let (gone, gone_ms) = fault_clock();
        let election =
            if id == leader { Some(views.leader_change(leader, at, Duration::from_secs(30)).await.1) } else { None };
        let to_first = first_ack_after(sh, gone, gone_ms, Duration::from_secs(60), "rolling restart").await;
        docker_must(&["start", &name]).await;
        views.wait_recovered("rolling restart", Duration::from_secs(60)).await;
        let how = if stopped >= Duration::from_secs(10) {
            "SIGTERM did not stop it: docker sent SIGKILL after 10 s".to_string()
        } else {
            "exited by itself on SIGTERM".to_string()
        };
        println!(
            "    node {id} ({role}): docker stop took {stopped:.1?} ({how}); first publish acknowledged \
             {to_first:.2?} after it was gone{}; started again, all 3 ready {:.1?} after SIGTERM",
            election.map(|e| format!(" (new leader elected {e:.2?} after SIGTERM)")).unwrap_or_default(),
            at.elapsed()
        );
        restart_stops.push((id, stopped));
        windows.push(Window {
            fault: format!("3. rolling restart: node {id} ({role}) stopped by SIGTERM"),
            to_first_ack: to_first,
            longest_stall: longest_stall(sh, at, Instant::now()),
            election,
            load: load_stats(sh, at, Instant::now()),
        });
    }
    verify(env, sh, "rolling restart").await;
    (windows, restart_stops)
}

/// Fault 4. pause a follower until the leader has purged the log past it: `docker pause` a follower until the leader has purged its log past it, then unpause: it catches up by snapshot.
async fn pause_a_follower(ch: &Chaos<'_>) -> Vec<Window> {
    let Chaos { env, views, sh, policy } = ch;
    let policy = *policy;
    let mut windows = Vec::new();
    let leader = views.leader(Duration::from_secs(20)).await;
    let follower = (1..=3u64).find(|i| *i != leader).unwrap();
    let mut fill_seq = 0u64;
    let mut fill_index = 0u64;
    let name = env.node(follower).name.clone();
    let fv = views.view(follower).await.expect("follower view");
    let f_applied = fv.applied_index;
    let installed_before = match http_get(env, env.node(follower), "/metrics").await {
        Ok((200, body)) => prom_value(&body, "runnev_snapshots_installed_total").unwrap_or(0.0),
        other => panic!("GET /metrics on node {follower}: {other:?}"),
    };
    println!(
        "\n[4] docker pause follower node {follower} ({name}) at applied_index {f_applied} \
         (leader {leader}; snapshots installed so far: {installed_before})"
    );
    docker_must(&["pause", &name]).await;
    let (at, at_ms) = fault_clock();
    let to_first = first_ack_after(sh, at, at_ms, Duration::from_secs(60), "pause").await;
    // The main load keeps going through all three nodes (a third of its requests hit the
    // paused node and time out); a second publisher writes to another stream through the two
    // live nodes, so the leader's log moves past the follower quickly. Wait until the leader's
    // log no longer has what the follower needs next.
    let live: Vec<String> = (1..=3u64).filter(|i| *i != follower).map(|i| env.node(i).url()).collect();
    let fill = env.client(&live, policy);
    fill.put_stream(FILL_STREAM, None).await.expect("creating the fill stream");
    let deadline = Instant::now() + Duration::from_secs(90);
    let purged = loop {
        let v = views.view(leader).await;
        if let Some(p) = v.as_ref().ok().and_then(|v| v.purged_index) {
            if p > f_applied + 1 {
                break p;
            }
        }
        assert!(
            Instant::now() < deadline,
            "pause: the leader did not purge past the paused follower's applied index {f_applied} in 90 s: {v:?}"
        );
        for _ in 0..50 {
            fill_seq += 1;
            let ack = fill.publish(FILL_STREAM, Some(fill_seq), payload(fill_seq)).await.expect("fill publish");
            fill_index = fill_index.max(ack.index);
        }
    };
    let leader_commit = views.view(leader).await.map_or(0, |v| v.commit_index);
    println!(
        "    leader purged its log through index {purged} after {:.1?} (commit_index {leader_commit}); unpausing",
        at.elapsed()
    );
    let un_at = Instant::now();
    docker_must(&["unpause", &name]).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let fv = loop {
        if let Ok(v) = views.view(follower).await {
            if v.applied_index >= leader_commit {
                break v;
            }
        }
        assert!(Instant::now() < deadline, "pause: node {follower} did not catch up to {leader_commit} in 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let installed_after = match http_get(env, env.node(follower), "/metrics").await {
        Ok((200, body)) => prom_value(&body, "runnev_snapshots_installed_total").unwrap_or(0.0),
        other => panic!("GET /metrics on node {follower}: {other:?}"),
    };
    println!(
        "    node {follower} caught up to {leader_commit} {:.1?} after the unpause: snapshot_index {}, \
         snapshots installed {installed_before} -> {installed_after}",
        un_at.elapsed(),
        fv.snapshot_index.map_or_else(|| "null".to_string(), |i| i.to_string())
    );
    assert!(
        installed_after > installed_before,
        "node {follower} fell behind the leader's purged log ({f_applied} < {purged}) but installed no snapshot"
    );
    views.wait_recovered("unpause", Duration::from_secs(60)).await;
    windows.push(Window {
        fault: format!("4. follower (node {follower}) paused until the leader purged past it"),
        to_first_ack: to_first,
        longest_stall: longest_stall(sh, at, Instant::now()),
        election: None,
        load: load_stats(sh, at, Instant::now()),
    });
    verify(env, sh, "pause of a follower").await;
    for n in &env.nodes {
        let got = read_node(env, &n.url(), FILL_STREAM, fill_seq, fill_index)
            .await
            .unwrap_or_else(|e| panic!("pause: reading {FILL_STREAM} on node {}: {e}", n.id));
        assert_eq!(got.len() as u64, fill_seq, "pause: node {} serves {} of {fill_seq} fill batches", n.id, got.len());
        for (i, (seq, _, data)) in got.iter().enumerate() {
            assert_eq!(*seq, i as u64 + 1, "pause: node {} fill batch #{i}", n.id);
            assert!(data[..] == payload(*seq)[..], "pause: node {} fill seq {seq}: payload differs", n.id);
        }
    }
    println!("  verified the {fill_seq} batches of {FILL_STREAM} on all 3 nodes");
    windows
}
