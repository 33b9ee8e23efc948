//! Peer TLS and client tokens, against real `runnev serve` processes (docs/security.md): forged
//! Raft RPCs reach no node's Raft state, tokens are checked on every node with their grants,
//! deleted tokens stop everywhere, and secrets are never stored, logged or listed.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use openraft::{CommittedLeaderId, LogId, Vote};
use runnev::net::{http_client, HttpClient, TcpDialer};
use runnev::tls::{client_config, create_ca, issue, write_private, write_public, Subject, TlsDialer};

const FORM: Duration = Duration::from_secs(60);

/// A CA and node certificates 1..=n under a fresh directory, an admin token file, and the
/// flags that make a node use them.
struct Pki {
    dir: PathBuf,
    admin: String,
}

impl Pki {
    fn new(nodes: u64) -> Pki {
        let dir = tempfile::Builder::new().prefix("runnev-test-pki-").tempdir().unwrap().keep();
        let files = runnev::local::prepare_secure(&dir, nodes).unwrap();
        let admin = std::fs::read_to_string(&files.admin_token).unwrap().trim().to_string();
        Pki { dir, admin }
    }

    fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    fn cert(&self, id: u64) -> (PathBuf, PathBuf) {
        (self.dir.join(format!("node-{id}.pem")), self.dir.join(format!("node-{id}.key")))
    }

    /// An HTTP client speaking TLS to the nodes, presenting node `as_node`'s certificate (or
    /// none).
    fn client(&self, as_node: Option<u64>) -> HttpClient {
        let identity = as_node.map(|id| self.cert(id));
        let config = client_config(&self.ca(), identity.as_ref().map(|(c, k)| (c.as_path(), k.as_path()))).unwrap();
        http_client(Arc::new(TlsDialer::new(Arc::new(TcpDialer), config)))
    }

    async fn start(&self, n: usize, extra: &[&str]) -> Cluster {
        let files = runnev::local::prepare_secure(&self.dir, n as u64).unwrap();
        let mut args: Vec<String> = files.serve_args.clone();
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ca, admin) = (self.ca(), self.admin.clone());
        // Its own CA and node certificates (the tests present them as forged peers), not the harness's.
        Cluster::start_insecure_edited(n, &args, move |spec| {
            spec.tls_ca = Some(ca);
            spec.token = Some(admin);
        })
        .await
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One request; the status and body, or why no HTTP answer came (a refused handshake).
async fn send(
    http: &HttpClient,
    method: &str,
    url: &str,
    token: Option<&str>,
    body: Bytes,
) -> Result<(u16, String), String> {
    send_with(http, method, url, token, &[], body).await
}

/// [`send`] with extra `headers`.
async fn send_with(
    http: &HttpClient,
    method: &str,
    url: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Result<(u16, String), String> {
    let mut req = hyper::Request::builder().method(method).uri(url);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req.body(Full::new(body)).map_err(|e| e.to_string())?;
    let exchange = async {
        let resp = http.request(req).await.map_err(|e| runnev::net::cause_text(&e))?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(Duration::from_secs(10), exchange).await.map_err(|_| "timed out".to_string())?
}

/// Leader and term as every node sees them (through the admin token).
async fn views(c: &Cluster, http: &HttpClient, admin: &str) -> Vec<(u64, Option<u64>, u64)> {
    let mut out = Vec::new();
    for id in c.ids() {
        let (status, body) =
            send(http, "GET", &format!("{}/v1/cluster", c.url(id)), Some(admin), Bytes::new()).await.unwrap();
        assert_eq!(status, 200, "node {id}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        out.push((id, v["leader_id"].as_u64(), v["term"].as_u64().unwrap()));
    }
    out
}

/// A postcard-encoded vote request from `candidate` at a high term with a far-ahead log: what
/// deposes a leader when it reaches openraft.
fn forged_vote(candidate: u64) -> Bytes {
    let rpc = openraft::raft::VoteRequest::new(
        Vote::new(1_000, candidate),
        Some(LogId::new(CommittedLeaderId::new(1_000, candidate), 1_000_000)),
    );
    Bytes::from(postcard::to_stdvec(&rpc).unwrap())
}

/// A postcard-encoded append-entries from `leader` at a high, committed term.
fn forged_append(leader: u64) -> Bytes {
    let rpc = openraft::raft::AppendEntriesRequest::<runnev::raft::TypeConfig> {
        vote: Vote::new_committed(1_000, leader),
        prev_log_id: None,
        entries: vec![],
        leader_commit: None,
    };
    Bytes::from(postcard::to_stdvec(&rpc).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_raft_rpcs_reach_no_node() {
    let pki = Pki::new(3);
    let c = pki.start(3, &[]).await;
    let anonymous = pki.client(None);
    let before = views(&c, &anonymous, &pki.admin).await;
    let (leader, term) = (before[0].1, before[0].2);
    assert!(leader.is_some() && before.iter().all(|v| (v.1, v.2) == (leader, term)), "{before:?}");

    // Another CA's certificate for node 1, the same name and id.
    let other = tempfile::tempdir().unwrap();
    let other_ca = create_ca("an attacker's CA").unwrap();
    let forged_cert = issue(&other_ca, &Subject::Node(1), &["127.0.0.1".into()]).unwrap();
    write_public(&other.path().join("ca.pem"), &other_ca.cert_pem).unwrap();
    write_public(&other.path().join("n1.pem"), &forged_cert.cert_pem).unwrap();
    write_private(&other.path().join("n1.key"), &forged_cert.key_pem).unwrap();
    let other_ca_client = |verify_with: &Path| {
        let config = client_config(
            verify_with,
            Some((other.path().join("n1.pem").as_path(), other.path().join("n1.key").as_path())),
        )
        .unwrap();
        http_client(Arc::new(TlsDialer::new(Arc::new(TcpDialer), config)))
    };
    // Presents the other CA's certificate while trusting the cluster's CA (so the server is
    // accepted and the refusal is the server's).
    let wrong_ca_peer = other_ca_client(&pki.ca());
    // Trusts only the other CA: the nodes' certificates are refused by this client.
    let wrong_ca_server = other_ca_client(&other.path().join("ca.pem"));
    let plain = Http::insecure(REQUEST_TIMEOUT);

    for target in c.ids() {
        let url = |path: &str| format!("{}{path}", c.url(target));
        let claimed = if target == 1 { 2 } else { 1 };
        // Plain HTTP: the node speaks TLS only. It answers `400 tls_required` before any
        // handshake, from the listener, and no request reaches a handler.
        let r = plain
            .post(&url("/raft/vote").replacen("https://", "http://", 1), forged_vote(claimed))
            .await
            .unwrap_or_else(|e| panic!("a plain-HTTP vote to node {target} got no answer: {e}"));
        assert_eq!(r.status, 400, "a plain-HTTP vote to node {target}: {}", r.describe());
        assert_eq!(r.error_code().as_deref(), Some("tls_required"), "{}", r.describe());
        // TLS without a client certificate: 403 before the body is read.
        for (path, body) in [("/raft/vote", forged_vote(claimed)), ("/raft/append", forged_append(claimed))] {
            let (status, text) = send(&anonymous, "POST", &url(path), None, body).await.unwrap();
            assert_eq!(status, 403, "anonymous {path} to node {target}: {text}");
            assert!(text.contains("\"forbidden\""), "{text}");
        }
        let (status, text) =
            send(&anonymous, "POST", &url("/raft/snapshot"), None, Bytes::from_static(b"x")).await.unwrap();
        assert_eq!(status, 403, "anonymous snapshot to node {target}: {text}");
        // A valid certificate of another node: it may not speak for `claimed`.
        let impostor = c.ids().into_iter().find(|id| *id != claimed).unwrap();
        let as_other_node = pki.client(Some(impostor));
        for (path, body) in [("/raft/vote", forged_vote(claimed)), ("/raft/append", forged_append(claimed))] {
            let (status, text) = send(&as_other_node, "POST", &url(path), None, body).await.unwrap();
            assert_eq!(
                status, 403,
                "node {impostor}'s certificate, {path} claiming node {claimed}, to node {target}: {text}"
            );
            assert!(text.contains(&format!("names node {impostor}")), "{text}");
        }
        // A certificate from another CA: the handshake is refused.
        let r = send(&wrong_ca_peer, "POST", &url("/raft/vote"), None, forged_vote(1)).await;
        assert!(r.is_err(), "a certificate of another CA reached node {target}: {r:?}");
        let r = send(&wrong_ca_server, "GET", &url("/healthz"), None, Bytes::new()).await;
        assert!(r.is_err(), "a client trusting another CA accepted node {target}: {r:?}");
    }

    let after = views(&c, &anonymous, &pki.admin).await;
    assert_eq!(after, before, "a forged rpc moved the leader or the term");
    // The node's own traffic still flows: a write commits on the authenticated cluster.
    let (status, text) =
        send(&anonymous, "PUT", &format!("{}/v1/streams/s", c.url(1)), Some(&pki.admin), Bytes::new()).await.unwrap();
    assert_eq!(status, 201, "{text}");
    assert_eq!(views(&c, &anonymous, &pki.admin).await.iter().map(|v| v.2).max(), Some(term));
}

/// A node started with certificates that do not fit it (another node's, a client's, or one of
/// another CA) is refused at start with exit 2, naming the file and what to use: it used to run,
/// refused by every peer, saying only that it waited for a majority (a fresh user's trial).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_refuses_certificates_that_do_not_fit_it() {
    let pki = Pki::new(2);
    let ca = runnev::tls::read_ca(&pki.dir).unwrap();
    let client = issue(&ca, &Subject::Client("ops".into()), &[]).unwrap();
    write_public(&pki.dir.join("client.pem"), &client.cert_pem).unwrap();
    write_private(&pki.dir.join("client.key"), &client.key_pem).unwrap();
    let other = create_ca("another cluster").unwrap();
    write_public(&pki.dir.join("other-ca.pem"), &other.cert_pem).unwrap();
    let base = free_base(2);
    let peers = format!("1=127.0.0.1:{base},2=127.0.0.1:{}", base + 1);
    let path = |name: &str| pki.dir.join(name).display().to_string();
    let cases = [
        (
            "another node's certificate",
            path("ca.pem"),
            path("node-1.pem"),
            path("node-1.key"),
            "names node 1, but this node is --id 2",
        ),
        (
            "a client certificate",
            path("ca.pem"),
            path("client.pem"),
            path("client.key"),
            "names a client (\"ops\"), not a node",
        ),
        (
            "another CA",
            path("other-ca.pem"),
            path("node-2.pem"),
            path("node-2.key"),
            "is not a valid certificate of the CA in",
        ),
    ];
    for (what, ca, cert, key, says) in cases {
        let data = tempfile::tempdir().unwrap();
        let listen = format!("127.0.0.1:{}", base + 1);
        let args = [
            "serve",
            "--id",
            "2",
            "--data-dir",
            data.path().to_str().unwrap(),
            "--listen",
            &listen,
            "--peers",
            &peers,
            "--tls-ca",
            &ca,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ];
        let r = tokio::time::timeout(FORM, cli(&args, &[])).await.unwrap_or_else(|_| panic!("{what}: the node ran"));
        r.expect_code(2, what);
        assert!(r.stderr.contains(says) && r.stderr.contains("--tls-cert"), "{what}: {r:#?}");
    }
}

/// Waits until every node has applied the leader's commit index as of now.
async fn wait_all_applied(c: &Cluster, http: &HttpClient, admin: &str) {
    let leader = c.leader().await;
    let (_, body) =
        send(http, "GET", &format!("{}/v1/cluster", c.url(leader)), Some(admin), Bytes::new()).await.unwrap();
    let commit = serde_json::from_str::<serde_json::Value>(&body).unwrap()["commit_index"].as_u64().unwrap();
    for id in c.ids() {
        wait_for(&format!("node {id} applying index {commit}"), FORM, Duration::from_millis(50), || async {
            let (_, body) = send(http, "GET", &format!("{}/v1/cluster", c.url(id)), Some(admin), Bytes::new()).await?;
            let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
            match v["applied_index"].as_u64() {
                Some(a) if a >= commit => Ok(()),
                other => Err(format!("applied {other:?}")),
            }
        })
        .await;
    }
}

async fn create_token(c: &Cluster, http: &HttpClient, admin: &str, node: u64, name: &str, grants: &str) -> String {
    let body = format!("{{\"name\": \"{name}\", \"grants\": {grants}}}");
    let (status, text) =
        send(http, "POST", &format!("{}/v1/auth/tokens", c.url(node)), Some(admin), Bytes::from(body)).await.unwrap();
    assert_eq!(status, 201, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["token"].as_str().unwrap().to_string()
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_checked_on_every_node_and_never_kept() {
    let pki = Pki::new(3);
    // Frequent snapshots, so the tokens travel in one too.
    let c = pki.start(3, &["--snapshot-logs", "3"]).await;
    let http = pki.client(None);
    let admin = pki.admin.as_str();
    let url = |id: u64, path: &str| format!("{}{path}", c.url(id));
    let (status, text) = send(&http, "PUT", &url(1, "/v1/streams/orders.eu"), Some(admin), Bytes::new()).await.unwrap();
    assert_eq!(status, 201, "{text}");

    // Created through a follower and through the leader.
    let leader = c.leader().await;
    let follower = c.ids().into_iter().find(|i| *i != leader).unwrap();
    let reader =
        create_token(&c, &http, admin, follower, "reader", r#"[{"permission": "read", "streams": "orders.*"}]"#).await;
    let publisher =
        create_token(&c, &http, admin, leader, "publisher", r#"[{"permission": "publish", "streams": "orders.*"}]"#)
            .await;
    let (status, text) = send(
        &http,
        "POST",
        &url(leader, "/v1/streams/orders.eu/batches"),
        Some(&publisher),
        Bytes::from_static(b"one"),
    )
    .await
    .unwrap();
    assert_eq!(status, 201, "{text}");
    wait_all_applied(&c, &http, admin).await;

    // The same token with its last hex digit changed (to one it is not: a fixed "0" would be the
    // token itself one time in sixteen).
    let last = if reader.ends_with('0') { '1' } else { '0' };
    let wrong = format!("{}{last}", &reader[..reader.len() - 1]);
    assert_ne!(wrong, reader);
    for id in c.ids() {
        let read = url(id, "/v1/streams/orders.eu/batches?after=0");
        let (status, text) = send(&http, "GET", &read, None, Bytes::new()).await.unwrap();
        assert_eq!(status, 401, "node {id}, no token: {text}");
        assert!(text.contains("\"unauthorized\""), "{text}");
        let (status, text) = send(&http, "GET", &read, Some(&wrong), Bytes::new()).await.unwrap();
        assert_eq!(status, 401, "node {id}, wrong secret: {text}");
        let (status, text) = send(&http, "GET", &read, Some(&reader), Bytes::new()).await.unwrap();
        assert_eq!(status, 200, "node {id}, read token: {text}");
        assert!(text.contains(&b64(b"one")), "{text}");
        // Outside its pattern, or another permission: 403.
        let (status, text) =
            send(&http, "GET", &url(id, "/v1/streams/billing"), Some(&reader), Bytes::new()).await.unwrap();
        assert_eq!(status, 403, "node {id}, read token on another stream: {text}");
        let (status, text) =
            send(&http, "POST", &url(id, "/v1/streams/orders.eu/batches"), Some(&reader), Bytes::from_static(b"x"))
                .await
                .unwrap();
        assert_eq!(status, 403, "node {id}, publish with a read token: {text}");
        assert!(text.contains("\"forbidden\""), "{text}");
        let (status, text) =
            send(&http, "DELETE", &url(id, "/v1/cluster/members/3"), Some(&publisher), Bytes::new()).await.unwrap();
        assert_eq!(status, 403, "node {id}, member removal with a publish token: {text}");
        let (status, text) =
            send(&http, "GET", &url(id, "/v1/auth/tokens"), Some(&reader), Bytes::new()).await.unwrap();
        assert_eq!(status, 403, "node {id}, token list with a read token: {text}");
        // The open paths stay open: the probes, and the API's description, which is the
        // committed docs/openapi.json.
        let (status, _) = send(&http, "GET", &url(id, "/healthz"), None, Bytes::new()).await.unwrap();
        assert_eq!(status, 200);
        let (status, doc) = send(&http, "GET", &url(id, "/v1/openapi.json"), None, Bytes::new()).await.unwrap();
        assert_eq!(status, 200, "node {id}, the OpenAPI document without a token: {doc}");
        let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json")).unwrap();
        assert!(doc == committed, "node {id} serves another OpenAPI document than docs/openapi.json");
    }
    let (_, view) = send(&http, "GET", &url(leader, "/v1/cluster"), Some(admin), Bytes::new()).await.unwrap();
    let members = serde_json::from_str::<serde_json::Value>(&view).unwrap()["members"].as_array().map(Vec::len);
    assert_eq!(members, Some(3), "the refused removal removed a member: {view}");

    // The list shows names and grants, no secret and no hash.
    let (status, listed) =
        send(&http, "GET", &url(follower, "/v1/auth/tokens"), Some(admin), Bytes::new()).await.unwrap();
    assert_eq!(status, 200, "{listed}");
    assert!(
        listed.contains("\"reader\"") && listed.contains("\"publisher\"") && listed.contains("\"admin\""),
        "{listed}"
    );

    // Deleted on one node: refused on every node once applied.
    let (status, text) =
        send(&http, "DELETE", &url(follower, "/v1/auth/tokens/reader"), Some(admin), Bytes::new()).await.unwrap();
    assert_eq!(status, 204, "{text}");
    wait_all_applied(&c, &http, admin).await;
    for id in c.ids() {
        let (status, text) =
            send(&http, "GET", &url(id, "/v1/streams/orders.eu/batches?after=0"), Some(&reader), Bytes::new())
                .await
                .unwrap();
        assert_eq!(status, 401, "node {id}, deleted token: {text}");
        // The same request as another node forwards it (it found the token in its own state):
        // this node may only be behind, so `503 not_ready`, which a client retries, not `401`.
        let (status, text) = send_with(
            &http,
            "GET",
            &url(id, "/v1/streams/orders.eu/batches?after=0"),
            Some(&reader),
            &[("runnev-forward-hops", "1")],
            Bytes::new(),
        )
        .await
        .unwrap();
        assert_eq!(status, 503, "node {id}, deleted token, forwarded: {text}");
        assert!(text.contains("\"not_ready\""), "{text}");
    }
    let (status, _) =
        send(&http, "DELETE", &url(leader, "/v1/auth/tokens/reader"), Some(admin), Bytes::new()).await.unwrap();
    assert_eq!(status, 404);

    // No secret anywhere: not in the list, not in any file of any data dir (database, log,
    // snapshot), not in any node's log.
    let secrets: Vec<String> = [admin, reader.as_str(), publisher.as_str()]
        .iter()
        .map(|t| runnev::auth::Token::parse(t).unwrap().parts().unwrap().1.to_string())
        .collect();
    let mut scanned = 0;
    let mut files: Vec<PathBuf> = c.ids().iter().flat_map(|id| files_under(&c.data_dir(*id))).collect();
    files.extend(c.ids().iter().map(|id| c.log_path(*id)));
    assert!(files.iter().any(|f| f.ends_with("snapshot.bin")), "no snapshot was built: {files:?}");
    for f in &files {
        let bytes = std::fs::read(f).unwrap_or_default();
        scanned += bytes.len();
        for s in &secrets {
            assert!(!bytes.windows(s.len()).any(|w| w == s.as_bytes()), "a token's secret is in {}", f.display());
        }
    }
    assert!(scanned > 0);
    for s in &secrets {
        assert!(!listed.contains(s.as_str()), "a secret is in GET /v1/auth/tokens: {listed}");
    }
}

/// A plain-HTTP request to a node that speaks TLS is answered `400 tls_required`, with the
/// usual error body and what to do, rather than a TLS alert that curl shows as "Received
/// HTTP/0.9" (a fresh user's trial); the node goes on serving TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_http_request_to_a_tls_node_is_told_to_use_tls() {
    let pki = Pki::new(3);
    let c = pki.start(3, &[]).await;
    let url = c.url(1);
    let port: u16 = url.rsplit(':').next().and_then(|p| p.trim_end_matches('/').parse().ok()).expect("a port");
    let (_, answer) = common::raw_get(port, "/healthz").await.expect("an answer");
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("\"tls_required\"") && answer.contains("https://"), "{answer}");
    assert!(
        answer.contains("--ca-file") && answer.contains("ca_file="),
        "names the CLI's and Python's CA option: {answer}"
    );
    let anonymous = pki.client(None);
    let (status, text) = send(&anonymous, "GET", &format!("{url}/healthz"), None, Bytes::new()).await.unwrap();
    assert_eq!(status, 200, "TLS still served: {text}");
}

/// The command line over TLS shows the nodes as `https://` (it showed `http://`, found by a
/// fresh user's trial), and a `--ca-file` of another CA is a usage error, exit 2 after one try
/// of each node, naming the fix (it was retried for a second and reported as exit 3, "no node
/// reachable", an outage).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_over_tls_shows_https_and_names_a_ca_that_does_not_fit() {
    let pki = Pki::new(3);
    let c = pki.start(3, &[]).await;
    let nodes = c.nodes().iter().map(|n| n.addr()).collect::<Vec<_>>().join(",");
    let (ca, token) = (pki.ca().to_string_lossy().into_owned(), pki.admin.clone());
    let r =
        cli(&["status", "-o", "text", "--nodes", &nodes], &[("RUNNEV_CA_FILE", &ca), ("RUNNEV_TOKEN", &token)]).await;
    r.expect_code(0, "status over TLS");
    for n in c.nodes() {
        assert!(r.stdout.contains(&format!("https://{} ", n.addr())), "{r:#?}");
    }
    assert!(!r.stdout.contains("http://"), "{r:#?}");

    let other = tempfile::tempdir().unwrap();
    let other_ca = other.path().join("ca.pem");
    write_public(&other_ca, &create_ca("another CA").unwrap().cert_pem).unwrap();
    let other_ca = other_ca.to_string_lossy().into_owned();
    for args in [&["streams", "list"][..], &["status"], &["publish", "s", "--seq", "1", "x"], &["subscribe", "s"]] {
        let mut args = args.to_vec();
        args.extend(["--nodes", nodes.as_str()]);
        let r = cli(&args, &[("RUNNEV_CA_FILE", &other_ca), ("RUNNEV_TOKEN", &token)]).await;
        r.expect_code(2, &format!("{args:?} trusting another CA"));
        assert!(r.stderr.contains("TLS with https://127.0.0.1:"), "{r:#?}");
        assert!(r.stderr.contains("not signed by the CA given with --ca-file"), "{r:#?}");
    }
    // https:// without a CA to verify it with is refused before anything is sent.
    let r = cli(&["streams", "list", "--nodes", &c.url(1)], &[("RUNNEV_CA_FILE", ""), ("RUNNEV_TOKEN", &token)]).await;
    r.expect_code(2, "https:// without --ca-file");
    assert!(r.stderr.contains("needs the cluster CA's certificate"), "{r:#?}");
    // Nor is a token sent over plain HTTP, where it would travel in clear (a fresh user's trial).
    let r = cli(&["streams", "list", "--nodes", &nodes], &[("RUNNEV_CA_FILE", ""), ("RUNNEV_TOKEN", &token)]).await;
    r.expect_code(2, "a token without --ca-file");
    assert!(r.stderr.contains("a token is sent only over TLS"), "{r:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_loopback_address_needs_tls_or_insecure() {
    let dir = tempfile::tempdir().unwrap();
    let port = runnev::launcher::free_ports(1).unwrap()[0];
    let run = |extra: &[&str]| {
        let mut cmd = std::process::Command::new(BIN);
        cmd.args([
            "serve",
            "--id",
            "1",
            "--listen",
            &format!("0.0.0.0:{port}"),
            "--peers",
            &format!("1=127.0.0.1:{port}"),
        ])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
        cmd
    };
    let out = run(&[]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--insecure") && err.contains("not a loopback address"), "{err}");

    let child = run(&["--insecure"]).spawn().unwrap();
    let http = Http::new();
    wait_for("the --insecure node to serve", FORM, Duration::from_millis(100), || async {
        let r = http.get(&format!("http://127.0.0.1:{port}/healthz")).await?;
        (r.status == 200).then_some(()).ok_or(r.describe())
    })
    .await;
    // SAFETY: signalling our own child, not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("WARN") && err.contains("--insecure"), "no warning logged: {err}");
}

/// A node with `--auth` but no `--admin-token-file`, whose cluster has no admin token yet,
/// warns at start that it makes none (a fresh user's trial met a cluster nobody could use).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_without_an_admin_token_file_warns_on_a_cluster_without_one() {
    let pki = Pki::new(1);
    let dir = tempfile::tempdir().unwrap();
    let port = runnev::launcher::free_ports(1).unwrap()[0];
    let (cert, key) = pki.cert(1);
    let child = std::process::Command::new(BIN)
        .args(["serve", "--id", "1", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--peers", &format!("1=127.0.0.1:{port}"), "--auth"])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--tls-ca")
        .arg(pki.ca())
        .arg("--tls-cert")
        .arg(cert)
        .arg("--tls-key")
        .arg(key)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let http = pki.client(None);
    wait_for("the node to serve", FORM, Duration::from_millis(100), || async {
        let (status, text) =
            send(&http, "GET", &format!("https://127.0.0.1:{port}/healthz"), None, Bytes::new()).await?;
        (status == 200).then_some(()).ok_or(text)
    })
    .await;
    // SAFETY: signalling our own child, not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("WARN") && err.contains("--auth without --admin-token-file"), "no warning logged: {err}");
}

/// A node without `--auth` checks no request, so it refuses to create a token (`403 forbidden`,
/// nothing proposed): a token anyone could mint there would stay valid once authentication is
/// switched on. Listing still works, and shows none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_auth_creates_no_token() {
    let c = Cluster::start_insecure(1, &[]).await;
    let http = http_client(Arc::new(TcpDialer));
    let url = format!("{}/v1/auth/tokens", c.url(1));
    let body = r#"{"name": "ops", "grants": [{"permission": "admin", "streams": "*"}]}"#;
    let (status, text) = send(&http, "POST", &url, None, Bytes::from(body)).await.unwrap();
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("forbidden") && text.contains("--auth"), "{text}");
    let (status, text) = send(&http, "GET", &url, None, Bytes::new()).await.unwrap();
    assert_eq!(status, 200, "{text}");
    let listed: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(listed["tokens"], serde_json::json!([]), "no token was made: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_bounds_a_node_answers_overloaded() {
    // Plain: it holds connections with raw HTTP/1 bytes to count them against the bound.
    let c = Cluster::start_insecure(1, &["--max-subscribers", "1", "--max-connections", "8"]).await;
    let port = c.node(1).port;
    let (status, text) =
        send(&http_client(Arc::new(TcpDialer)), "PUT", &format!("{}/v1/streams/s", c.url(1)), None, Bytes::new())
            .await
            .unwrap();
    assert_eq!(status, 201, "{text}");

    // One subscription holds the one subscriber slot; the next is 503 overloaded.
    let (first, head) = raw_get(port, "/v1/streams/s/subscribe?after=0").await.unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let (_, head) = raw_get(port, "/v1/streams/s/subscribe?after=0").await.unwrap();
    assert!(head.starts_with("HTTP/1.1 503") && head.to_ascii_lowercase().contains("retry-after: 1"), "{head}");
    drop(first);
    wait_for("the subscriber slot to be given back", FORM, Duration::from_millis(100), || async {
        let (_, head) = raw_get(port, "/v1/streams/s/subscribe?after=0").await?;
        head.starts_with("HTTP/1.1 200").then_some(()).ok_or(head)
    })
    .await;

    // Connections held open: up to the bound they are served, past it 503 overloaded.
    let mut held = Vec::new();
    let mut refused = None;
    for _ in 0..12 {
        let (conn, head) = raw_get(port, "/healthz").await.unwrap();
        if head.starts_with("HTTP/1.1 503") {
            refused = Some(head);
            break;
        }
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        held.push(conn);
    }
    let refused = refused.expect("no connection was refused past --max-connections 8");
    assert!(refused.contains("\"overloaded\"") || refused.to_ascii_lowercase().contains("retry-after"), "{refused}");
    assert!(held.len() <= 8, "{} connections were served at once", held.len());
    drop(held);
    wait_for("connections to be served again", FORM, Duration::from_millis(100), || async {
        let (_, head) = raw_get(port, "/healthz").await?;
        head.starts_with("HTTP/1.1 200").then_some(()).ok_or(head)
    })
    .await;
}

/// The status page (`GET /`) is served without a token, holds no data, and its data paths need
/// one: without, `401`; with a token of no `read` grant, `403`; with a read token, every member's
/// view, which each node gathers from the others as itself (its node certificate), without the
/// client's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_is_open_and_its_data_needs_a_read_token() {
    let pki = Pki::new(3);
    let c = pki.start(3, &[]).await;
    let http = pki.client(None);
    let admin = pki.admin.as_str();
    let reader = create_token(&c, &http, admin, 1, "viewer", r#"[{"permission": "read", "streams": "*"}]"#).await;
    let publisher =
        create_token(&c, &http, admin, 1, "writer", r#"[{"permission": "publish", "streams": "orders.*"}]"#).await;
    wait_all_applied(&c, &http, admin).await;
    for id in c.ids() {
        let url = |path: &str| format!("{}{path}", c.url(id));
        let (status, page) = send(&http, "GET", &url("/"), None, Bytes::new()).await.unwrap();
        assert_eq!(status, 200, "node {id}: the page without a token");
        assert!(page.contains("sessionStorage") && !page.contains("rnv_viewer"), "node {id}");
        for path in ["/v1/cluster/nodes", "/v1/streams"] {
            let (status, text) = send(&http, "GET", &url(path), None, Bytes::new()).await.unwrap();
            assert_eq!(status, 401, "node {id} {path} without a token: {text}");
            let (status, text) = send(&http, "GET", &url(path), Some(&publisher), Bytes::new()).await.unwrap();
            assert_eq!(status, 403, "node {id} {path} with a publish token: {text}");
            let (status, text) = send(&http, "GET", &url(path), Some(&reader), Bytes::new()).await.unwrap();
            assert_eq!(status, 200, "node {id} {path} with a read token: {text}");
        }
        let (_, text) = send(&http, "GET", &url("/v1/cluster/nodes"), Some(&reader), Bytes::new()).await.unwrap();
        let v: runnev::wire::NodesView = serde_json::from_str(&text).unwrap();
        assert_eq!(v.nodes.len(), 3, "{text}");
        assert!(v.nodes.iter().all(|n| n.reachable && n.view.as_ref().is_some_and(|w| w.node_id == n.id)), "{text}");
    }
}

/// The Rust client's subscriptions carry its token, as its other requests do (they went without
/// one, and a node with `--auth` refused them `401`): a read token subscribes, over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_sends_the_clients_token() {
    use futures::StreamExt;
    let pki = Pki::new(1);
    let c = pki.start(1, &[]).await;
    let http = pki.client(None);
    let admin = pki.admin.as_str();
    let url = |path: &str| format!("{}{path}", c.url(1));
    let (status, text) = send(&http, "PUT", &url("/v1/streams/feed"), Some(admin), Bytes::new()).await.unwrap();
    assert_eq!(status, 201, "{text}");
    let (status, text) =
        send(&http, "POST", &url("/v1/streams/feed/batches"), Some(admin), Bytes::from_static(b"one")).await.unwrap();
    assert_eq!(status, 201, "{text}");
    let reader = create_token(&c, &http, admin, 1, "reader", r#"[{"permission": "read", "streams": "*"}]"#).await;
    let token = runnev::auth::Token::parse(&reader).unwrap();
    let client = runnev::client::Client::secure(&c.urls(), Some(&pki.ca()), Some(token)).unwrap();
    let mut sub = client.subscribe("feed", 0);
    let first = tokio::time::timeout(FORM, sub.next()).await.expect("an event").expect("an item");
    match first {
        Ok(runnev::client::Delivery::Batch(b)) => assert_eq!((b.seq, &b.data[..]), (1, &b"one"[..])),
        other => panic!("expected batch 1, got {other:?}"),
    }
    // A long poll waiting with the token when it is deleted.
    let long_poll = {
        let (http, url, reader) = (http.clone(), url("/v1/streams/feed/batches?after=1&wait_ms=20000"), reader.clone());
        tokio::spawn(async move { send(&http, "GET", &url, Some(&reader), Bytes::new()).await })
    };
    wait_for("the long poll to wait", FORM, Duration::from_millis(20), || async {
        let (_, text) = send(&http, "GET", &url("/metrics"), Some(admin), Bytes::new()).await?;
        let waiting = prom_value_where(&text, "runnev_waiting_requests", Some(("kind", "read"))).unwrap_or(0.0);
        (waiting >= 1.0).then_some(()).ok_or(format!("{waiting} reads waiting"))
    })
    .await;
    // The token deleted, the open subscription gets no batch published after it: the node ends
    // it, and the client's next request is refused (a fresh user's trial kept reading on a
    // deleted token for as long as the connection lasted). The long poll is answered `401`, not
    // with the batch (it was answered with it).
    let (status, text) =
        send(&http, "DELETE", &url("/v1/auth/tokens/reader"), Some(admin), Bytes::new()).await.unwrap();
    assert_eq!(status, 204, "{text}");
    let (status, text) =
        send(&http, "POST", &url("/v1/streams/feed/batches"), Some(admin), Bytes::from_static(b"two")).await.unwrap();
    assert_eq!(status, 201, "{text}");
    let (status, text) = long_poll.await.unwrap().unwrap();
    assert_eq!(status, 401, "a long poll on a deleted token: {text}");
    assert!(text.contains("was deleted") && !text.contains("\"batches\""), "{text}");
    let next = tokio::time::timeout(FORM, sub.next()).await.expect("the subscription to end or fail");
    match next {
        Some(Err(e)) => assert!(e.to_string().contains("401") || e.to_string().contains("unauthorized"), "{e}"),
        other => panic!("expected the subscription refused after its token's deletion, got {other:?}"),
    }
}

/// The only token with `admin:*` cannot be deleted (`409 last_admin_token`, nothing proposed):
/// without it no client could administer the cluster. Once another admin token exists, it can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_admin_token_cannot_be_deleted() {
    if security().is_none() {
        return skipped("security::the_last_admin_token_cannot_be_deleted: RUNNEV_TEST_INSECURE=1 runs no token");
    }
    let c = Cluster::start(3, &[]).await;
    let leader = c.leader().await;
    for id in c.ids() {
        let r = c.http.delete(&format!("{}/v1/auth/tokens/admin", c.url(id))).await.unwrap();
        assert_eq!(r.status, 409, "node {id}: {}", r.describe());
        assert_eq!(r.error_code().as_deref(), Some("last_admin_token"), "{}", r.describe());
    }
    let body = r#"{"name": "ops", "grants": [{"permission": "admin", "streams": "*"}]}"#;
    let r = c
        .http
        .request(
            hyper::Method::POST,
            &format!("{}/v1/auth/tokens", c.url(leader)),
            Some(Bytes::from(body)),
            &[("content-type", "application/json")],
            REQUEST_TIMEOUT,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 201, "{}", r.describe());
    let ops = r.json()["token"].as_str().expect("the new token").to_string();
    let auth = format!("Bearer {ops}");
    let delete_with_ops = |name: &str| {
        let url = format!("{}/v1/auth/tokens/{name}", c.url(leader));
        let headers = [("authorization", auth.clone())];
        let http = c.http.clone();
        async move {
            let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            http.request(hyper::Method::DELETE, &url, None, &headers, REQUEST_TIMEOUT).await.unwrap()
        }
    };
    let r = delete_with_ops("admin").await;
    assert_eq!(r.status, 204, "with another admin token the first one can go: {}", r.describe());
    let r = delete_with_ops("ops").await;
    assert_eq!(r.status, 409, "now ops is the last: {}", r.describe());
}
