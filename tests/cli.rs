//! The `runnev` client commands as a user runs them, against a stopped cluster, a partial one (1
//! of 3 nodes up) and a healthy one: what they print and the exit status scripts rely on
//! (docs/cli.md): 0 success, 2 usage, 3 unreachable, 4 refused, 5 unknown outcome, 6 unavailable.

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

/// `--nodes` for the cluster `c`, as `HOST:PORT` without a scheme.
fn nodes_of(c: &Cluster) -> String {
    c.nodes().iter().map(|n| n.addr()).collect::<Vec<_>>().join(",")
}

/// `runnev ARGS` running in the background (a subscription), its stdout and stderr piped, killed
/// when dropped.
fn subscriber(args: &[&str]) -> tokio::process::Child {
    tokio::process::Command::new(BIN)
        .args(args)
        .envs(cli_security_env())
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// With no node listening, every client command fails at once with exit 3 and says where it
/// looked; `status` too (it used to exit 0, saying "within 10s" of a refusal in 6 ms), and a
/// subscription with `--max-outage` gives up (it retries for ever without it, see below).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_cluster_is_reported_unreachable_with_exit_3() {
    let nodes = format!("127.0.0.1:{},127.0.0.1:{}", closed_port(), closed_port());
    for args in [
        vec!["streams", "--nodes", &nodes],
        vec!["publish", "orders", "x", "--nodes", &nodes],
        vec!["publish", "orders", "--seq", "1", "x", "--nodes", &nodes],
        vec!["streams", "create", "orders", "--nodes", &nodes],
    ] {
        let r = cli(&args, &[]).await;
        r.expect_code(3, &format!("{args:?}"));
        let at = format!("runnev: no Runnev node reachable at {}://127.0.0.1:", cli_scheme());
        assert!(r.stderr.starts_with(&at), "{r:#?}");
        assert!(r.stderr.contains("Connection refused"), "{r:#?}");
        println!("{args:?}: exit 3 after {:?}", r.took);
    }

    // A sink for a stream name no stream can have is refused at start (it retried for ever;
    // found by a fresh user's trial), before it reaches for PostgreSQL or the cluster.
    let r = cli(
        &[
            "sink-postgres",
            "--postgres",
            "postgres://u@127.0.0.1:1/d",
            "--nodes",
            &nodes,
            "--stream",
            "bad/name",
            "--consumer",
            "c",
            "--apply-sql",
            "SELECT 1",
        ],
        &[],
    )
    .await;
    r.expect_code(1, "sink-postgres --stream bad/name");
    assert!(r.stderr.contains(r#"configuration: --stream "bad/name": stream name"#), "{r:#?}");

    let r = cli(&["status", "--nodes", &nodes, "-o", "text"], &[]).await;
    r.expect_code(3, "status");
    assert_eq!(r.stdout.matches("unreachable: Connection refused").count(), 2, "{r:#?}");
    assert!(!r.stdout.contains("within"), "{r:#?}");
    let r = cli(&["status", "--nodes", &nodes], &[]).await;
    r.expect_code(3, "status, JSON");
    for line in r.json_lines() {
        assert!(line["error"].as_str().is_some_and(|e| e.contains("Connection refused")), "{line}");
    }

    let r = cli(&["subscribe", "orders", "--max-outage", "2s", "--nodes", &nodes], &[]).await;
    r.expect_code(3, "subscribe --max-outage");
    assert!(r.stderr.contains("runnev: no connection for"), "each retry is noted: {r:#?}");
    assert!(r.stderr.contains("runnev: no Runnev node reachable at"), "{r:#?}");

    // Its notes on a stderr whose reader is gone (`… 2>&1 | head -1`) do not stop it: it ends
    // with its own status, not a panic's 101 (a fresh user's trial).
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.args(["subscribe", "orders", "--max-outage", "2s", "--nodes", &nodes])
        .env_remove("RUNNEV_NODES")
        .envs(cli_security_env())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("spawning runnev subscribe");
    drop(child.stderr.take());
    let status = tokio::time::timeout(CLI_HANG, child.wait()).await.expect("in time").expect("its status");
    assert_eq!(status.code(), Some(3), "subscribe with its stderr closed: {status:?}");
}

/// With 1 of 3 nodes up there is no leader: a write ends with exit 6 and the reason in words
/// with the server's message, never its raw JSON; reads and `status` still work.
/// The outbox relay's and the sink's counts and request size out of range are usage errors
/// (exit 2) that name their flag, before anything is contacted (they used to pass the flag
/// parser and stop at start with "configuration: concurrency and delete batch must be at
/// least 1", naming no flag).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_flags_out_of_range_are_usage_errors_that_name_the_flag() {
    let pg = "postgres://runnev@127.0.0.1:1/runnev";
    let relay = ["outbox-relay", "--postgres", pg];
    for (flag, value) in [
        ("--concurrency", "0"),
        ("--delete-batch", "0"),
        ("--batch-size", "0"),
        ("--batch-size", "100001"),
        ("--max-append-bytes", "2"),
        ("--max-append-bytes", "65MiB"),
    ] {
        let args: Vec<&str> = relay.iter().copied().chain([flag, value]).collect();
        let r = cli(&args, &[]).await;
        r.expect_code(2, &format!("outbox-relay {flag} {value}"));
        assert!(r.stderr.contains(flag), "{r:#?}");
    }
    let r = cli(
        &["outbox-relay", "--postgres", pg, "--max-append-bytes", "64MiB", "--batch-size", "100000", "--help"],
        &[],
    )
    .await;
    r.expect_code(0, "the bounds themselves are accepted");
    let r =
        cli(&["sink-postgres", "--postgres", pg, "--stream", "s", "--consumer", "c", "--batch-size", "0"], &[]).await;
    r.expect_code(2, "sink-postgres --batch-size 0");
    assert!(r.stderr.contains("--batch-size"), "{r:#?}");
}

/// Names checked before anything is asked or written, each in its own words (exit 2): a token
/// name (it was refused by the node, exit 4), a client certificate's name (it said "not a token
/// name"); and `cert create-node` without a CA says how to make one (found by a fresh user's
/// trial).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cert_and_token_names_are_checked_locally() {
    let r = cli(&["auth", "token", "create", "a_b", "--grant", "read:*", "--nodes", "127.0.0.1:1"], &[]).await;
    r.expect_code(2, "a token name with _");
    assert!(r.stderr.contains("\"a_b\" is not a token name"), "{r:#?}");
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let certs_arg = certs.to_str().unwrap();
    let r = cli(&["cert", "create-client", "--dir", certs_arg, "--name", "bad name"], &[]).await;
    r.expect_code(2, "a client name with a space");
    assert!(r.stderr.contains("\"bad name\" is not a client name"), "{r:#?}");
    let r = cli(&["cert", "create-node", "--dir", certs_arg, "--id", "1", "--host", "127.0.0.1"], &[]).await;
    r.expect_code(1, "a node certificate without a CA");
    assert!(r.stderr.contains(&format!("runnev cert create-ca --dir {certs_arg}")), "{r:#?}");
}

/// A `--ca-file` that cannot be read is a local problem, exit 1 as docs/cli.md says, naming the
/// file (it was exit 2, a usage error; found by a fresh user's trial).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_ca_file_is_a_local_problem() {
    let missing = "/nonexistent/runnev-ca.pem";
    let r = cli(&["--ca-file", missing, "streams", "ls", "--nodes", "127.0.0.1:1"], &[]).await;
    r.expect_code(1, "an unreadable --ca-file");
    assert!(r.stderr.contains(&format!("reading --ca-file {missing}")), "{r:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_without_a_majority_says_no_leader_with_exit_6() {
    let mut c = Cluster::start(3, &[]).await;
    let nodes = nodes_of(&c);
    cli(&["streams", "create", "orders", "--nodes", &nodes], &[]).await.expect_code(0, "create");
    let survivor = c.followers().await[0];
    // Asked of a follower alone, `status` names the leader it follows (it used to say "no
    // leader" when the leader was not among the nodes asked).
    let leader = c.leader().await;
    let r = cli(&["status", "-o", "text", "--nodes", &c.node(survivor).addr()], &[]).await;
    r.expect_code(0, "status of a follower alone");
    assert!(r.stdout.contains(&format!("leader: node {leader} (term ")), "{r:#?}");
    assert!(r.stdout.contains(&format!("as node {survivor} follows it; node {leader} was not asked")), "{r:#?}");
    assert!(!r.stdout.contains("no leader"), "{r:#?}");
    for id in c.ids() {
        if id != survivor {
            c.stop(id).await;
        }
    }

    let r = cli(&["publish", "orders", "--seq", "1", "x", "--nodes", &nodes], &[]).await;
    r.expect_code(6, "publish without a majority");
    assert!(r.stderr.contains("no leader: a majority of nodes is down or partitioned"), "{r:#?}");
    // The client names a node by how it reaches it (HOST:PORT is `https://HOST:PORT` over TLS).
    assert!(r.stderr.contains(&format!("{} said: ", c.url(survivor))), "the server's message: {r:#?}");
    assert!(!r.stderr.contains('{'), "no raw JSON: {r:#?}");

    let r = cli(&["streams", "ls", "--nodes", &nodes], &[]).await;
    r.expect_code(0, "a read from the survivor");
    assert_eq!(r.json_lines()[0]["name"], "orders", "{r:#?}");

    let r = cli(&["status", "-o", "text", "--nodes", &nodes], &[]).await;
    r.expect_code(0, "status with one node answering");
    assert_eq!(r.stdout.matches("unreachable: Connection refused").count(), 2, "{r:#?}");
    assert!(r.stdout.contains("no leader among the nodes that answered"), "{r:#?}");
}

/// The same with the leader as the survivor: cut off from both followers it keeps its role
/// (openraft 0.9 steps down only when a membership without it commits). A write to it used to
/// wait out the commit timeout (`Runnev-Outcome: unknown`) or be refused for its clocks, and
/// `status` named it leader (found by a new user's trial); now the write is refused with exit 6
/// and the reason in words, nothing proposed, and `status` says there is no leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_without_a_majority_says_no_leader_with_exit_6() {
    let mut c = Cluster::start(3, &[]).await;
    let nodes = nodes_of(&c);
    cli(&["streams", "create", "orders", "--nodes", &nodes], &[]).await.expect_code(0, "create");
    // The leader every node agrees on, then the others stopped. On a loaded machine a new
    // election can move the lead between reading it and stopping the others (CI once stopped
    // the new leader and left the old one a candidate, "no leader is known"): that run tests
    // nothing here, so the others start again and it is tried anew.
    let mut leader = None;
    for attempt in 1..=3 {
        let (l, _) = c.wait_leader_agreed(Duration::from_secs(20)).await;
        let others: Vec<u64> = c.running_ids().into_iter().filter(|id| *id != l).collect();
        for &id in &others {
            c.stop(id).await;
        }
        // Past the silence a leader may have before it counts as cut off (2 s).
        tokio::time::sleep(Duration::from_millis(runnev::limits::LEADER_SILENCE_MAX_MS + 500)).await;
        if c.cluster_info(l).await.is_ok_and(|v| v.state == "Leader") {
            leader = Some(l);
            break;
        }
        eprintln!("attempt {attempt}: node {l} no longer led once the others were stopped; again");
        for id in others {
            c.restart(id).await;
        }
    }
    let leader = leader.expect("a leader left alone in three attempts");
    let before = c.cluster_info(leader).await.expect("view").last_log_index;

    let r =
        c.http.post(&format!("{}/v1/streams/orders/batches?seq=1", c.url(leader)), b"x".to_vec()).await.expect("post");
    assert_eq!((r.status, r.error_code().as_deref()), (503, Some("no_leader")), "{}", r.describe());
    assert_eq!(r.header(runnev::error::OUTCOME_HEADER), None, "nothing was proposed: {}", r.describe());
    assert!(r.text().contains("no majority of the voters has acknowledged it"), "{}", r.describe());

    let r = cli(&["publish", "orders", "--seq", "1", "x", "--nodes", &nodes], &[]).await;
    r.expect_code(6, "publish to a leader without a majority");
    assert!(r.stderr.contains("no leader: a majority of nodes is down or partitioned"), "{r:#?}");

    let r = cli(&["status", "-o", "text", "--nodes", &nodes], &[]).await;
    r.expect_code(0, "status with the lone leader answering");
    assert!(r.stdout.contains("no leader among the nodes that answered"), "{r:#?}");
    assert!(r.stdout.contains(&format!("node {leader} names itself leader")), "{r:#?}");
    assert!(!r.stdout.contains("leader: node"), "{r:#?}");
    let after = c.cluster_info(leader).await.expect("view").last_log_index;
    assert_eq!(after, before, "the refused writes appended nothing to the leader's log");

    // A subscription there is refused, and the reason says the node leads (it used to say it
    // had not heard from a leader).
    let r = c.http.get(&format!("{}/v1/streams/orders/subscribe", c.url(leader))).await.expect("subscribe");
    assert_eq!((r.status, r.error_code().as_deref()), (503, Some("not_ready")), "{}", r.describe());
    assert!(r.text().contains("is leader but no majority of the voters has acknowledged it"), "{}", r.describe());
}

/// Flags where users put them, names checked with the server's words, durations and sizes as
/// people write them, output for people on request and JSON otherwise, refusals in words with
/// exit 4, and a clean start: no warning at formation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_take_flags_anywhere_units_and_names_on_a_healthy_cluster() {
    let c = Cluster::start(3, &[]).await;
    let nodes = nodes_of(&c);
    let env = [("RUNNEV_NODES", nodes.as_str())];

    // Formation logs no openraft "vote changed" warning (a benign race, filtered at its call site).
    for n in c.nodes() {
        let log = std::fs::read_to_string(&n.log_path).unwrap();
        assert!(!log.contains("because vote changed"), "node {}: {log}", n.id);
        // A node started late on a loaded machine (a majority formed without it) is warned
        // about by the others and rejoins as a wiped node: the start order, not a fault.
        // Nor is a leader of term 1 deposed by a higher vote: every node initialises and
        // campaigns at term 1 at once, and with openraft's leader ids (term, node id) two may
        // win term 1, the lower one stepping down when a follower answers with the higher vote
        // (openraft logs that at its one replication-error call site, with every other error).
        let late = |l: &&str| {
            l.contains("Connection refused")
                || l.contains("rejoining as a wiped node")
                || (l.contains("seen a higher vote: T1-") && l.contains("GT mine: T1-"))
        };
        let warned: Vec<&str> = log.lines().filter(|l| l.contains(" WARN ")).filter(|l| !late(l)).collect();
        assert!(warned.is_empty(), "node {} warned at a clean start: {warned:#?}\n{log}", n.id);
    }

    // --nodes and --output after the subcommand, before it, or between; HOST:PORT or a URL.
    let first = c.url(1);
    for args in [
        vec!["streams", "create", "t1", "--nodes", nodes.as_str()],
        vec!["--nodes", nodes.as_str(), "streams", "create", "t2"],
        vec!["streams", "--nodes", nodes.as_str(), "create", "t3"],
        vec!["-n", first.as_str(), "-o", "json", "streams", "create", "t4"],
    ] {
        let r = cli(&args, &[]).await;
        r.expect_code(0, &format!("{args:?}"));
        assert!(r.json_lines()[0]["name"].as_str().is_some_and(|n| n.starts_with('t')), "{r:#?}");
    }
    let r = cli(&["streams", "ls", "-o", "text"], &env).await;
    r.expect_code(0, "ls");
    for t in ["t1", "t2", "t3", "t4"] {
        assert!(r.stdout.lines().any(|l| l.starts_with(t)), "{r:#?}");
    }
    let r = cli(&["--output", "text", "probe", &format!("{first}/healthz")], &[]).await;
    r.expect_code(2, "client flags before a command that is not a client command");

    // A bad name: refused before anything is sent, in the server's own words, exit 2.
    let server = c.http.put(&format!("{}/v1/streams/bad%20name", c.url(1)), None).await.unwrap();
    let server_says = server.json()["error"]["message"].as_str().unwrap().to_string();
    let r = cli(&["streams", "create", "bad name"], &env).await;
    r.expect_code(2, "a bad stream name");
    assert!(r.stderr.contains(&server_says), "{server_says:?} in {r:#?}");
    let r = cli(&["publish", "bad/name", "x"], &env).await;
    r.expect_code(2, "a bad stream name in publish");

    // Durations and sizes in, none to clear a limit, readable out.
    let r =
        cli(&["streams", "create", "r", "--max-age", "1h", "--max-bytes", "64MiB", "--max-batches", "10"], &env).await;
    r.expect_code(0, "create with units");
    assert_eq!(
        r.json_lines()[0]["retention"],
        serde_json::json!({"max_batches": 10, "max_bytes": 67_108_864, "max_age_ms": 3_600_000})
    );
    let r = cli(&["streams", "set", "r", "--max-age", "none", "--max-batches", "20"], &env).await;
    r.expect_code(0, "set");
    assert_eq!(
        r.json_lines()[0]["retention"],
        serde_json::json!({"max_batches": 20, "max_bytes": 67_108_864, "max_age_ms": null}),
        "the limits not given are kept, none clears one"
    );
    let r = cli(&["streams", "info", "r", "-o", "text"], &env).await;
    r.expect_code(0, "info");
    assert!(r.stdout.contains("retention  max batches 20, max bytes 64.0 MiB"), "{r:#?}");
    let r = cli(&["streams", "create", "r2", "--max-age-ms", "1h", "-o", "text"], &env).await;
    r.expect_code(0, "the old flag takes a duration too");
    assert!(r.stdout.contains("created r2 (retention: max age 1h)"), "{r:#?}");
    for (flag, value) in [("--max-age", "60"), ("--max-bytes", "lots"), ("--max-batches", "0"), ("--max-age", "0s")] {
        let r = cli(&["streams", "create", "r3", flag, value], &env).await;
        r.expect_code(2, &format!("{flag} {value}"));
    }
    let r = cli(&["streams", "set", "r"], &env).await;
    r.expect_code(2, "set without a limit");

    // Publish: JSON when piped, words on request; refusals with exit 4 in words.
    let r = cli(&["publish", "t1", "--seq", "41", "order 41"], &env).await;
    r.expect_code(0, "publish");
    let ack: &Value = &r.json_lines()[0];
    assert_eq!((ack["seq"].as_u64(), ack["duplicate"].as_bool()), (Some(41), Some(false)), "{r:#?}");
    let r = cli(&["publish", "t1", "-s", "41", "order 41", "-o", "text"], &env).await;
    r.expect_code(0, "duplicate publish");
    assert!(r.stdout.starts_with("seq 41 was already in t1: a duplicate, stored once"), "{r:#?}");
    let r = cli(&["publish", "t1", "--seq", "41", "another payload"], &env).await;
    r.expect_code(4, "seq conflict");
    assert!(r.stderr.starts_with("runnev: refused by the cluster: seq_conflict (409): "), "{r:#?}");
    let r = cli(&["publish", "missing", "x"], &env).await;
    r.expect_code(4, "missing stream");
    assert!(r.stderr.contains("create it with `runnev streams create missing`"), "{r:#?}");
    assert!(!r.stderr.contains("PUT /v1"), "{r:#?}");
    let r = cli(&["publish", "t1", "--seq", "0", "x"], &env).await;
    r.expect_code(2, "seq 0");
    let payload = std::env::temp_dir().join(format!("runnev-cli-payload-{}", std::process::id()));
    std::fs::write(&payload, b"from a file").unwrap();
    let r = cli(&["publish", "t1", "-f", payload.to_str().unwrap(), "-o", "text"], &env).await;
    std::fs::remove_file(&payload).unwrap();
    r.expect_code(0, "publish --file");
    assert!(r.stdout.starts_with("published seq 42 to t1"), "{r:#?}");
    let r = cli(&["publish", "t1", "-f", "/nonexistent/payload"], &env).await;
    r.expect_code(1, "an unreadable file is a local problem");

    // --after: -1 is the start, as for the server; other negative numbers are refused.
    let r = cli(&["subscribe", "t1", "--after", "-5"], &env).await;
    r.expect_code(2, "--after -5");
    assert!(r.stderr.contains("must be a non-negative integer"), "{r:#?}");
    let server = c.http.get(&format!("{}/v1/streams/t1/batches?after=-5", c.url(1))).await.unwrap();
    assert_eq!(server.status, 400, "the server refuses it the same way: {}", server.describe());

    // A cursor past the stream's last seq (42) waits, and says why nothing may come (found by a
    // fresh user's trial; after a restore it is the consumer that would dedupe new batches away).
    let mut sub = subscriber(&["subscribe", "t1", "--after", "100", "--nodes", &nodes]);
    let mut notes = BufReader::new(sub.stderr.take().unwrap()).lines();
    let note = tokio::time::timeout(Duration::from_secs(30), notes.next_line())
        .await
        .expect("a note within 30 s")
        .unwrap()
        .expect("the subscriber is still running");
    assert!(note.starts_with("runnev: the cursor 100 is past the last seq of stream t1, 42;"), "{note}");
    assert!(sub.try_wait().unwrap().is_none(), "the subscription waits after the note");
    sub.kill().await.unwrap();

    // Delete, then a second delete is refused (it was not a lost answer).
    cli(&["streams", "rm", "t4", "-o", "text"], &env).await.expect_code(0, "delete");
    let r = cli(&["streams", "delete", "t4"], &env).await;
    r.expect_code(4, "deleting a missing stream");
    assert!(r.stderr.contains("does not exist (nothing to delete)"), "{r:#?}");
}

/// An answer lost on the way: a publish without seq may or may not be stored (exit 5); a delete
/// whose retry finds the stream or member gone succeeded (exit 0, "already deleted").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_answers_are_unknown_for_a_publish_and_done_for_a_delete() {
    let mut c = Cluster::start(3, &[]).await;
    let nodes = nodes_of(&c);
    let env = [("RUNNEV_NODES", nodes.as_str())];
    cli(&["streams", "create", "lost"], &env).await.expect_code(0, "create");

    // The proxy is first in the list, so it takes the first attempt; the others follow.
    let rest = format!("{},{}", c.node(2).addr(), c.node(3).addr());
    let via = |proxy: &LossyProxy| format!("{},{rest}", proxy.addr);
    let proxy = LossyProxy::start(&c.node(1).addr(), 1).await;
    let r = cli(&["publish", "lost", "maybe", "--nodes", &via(&proxy)], &[]).await;
    r.expect_code(5, "publish without seq, answer lost");
    assert!(r.stderr.contains("the outcome is unknown"), "{r:#?}");
    let (http, leader_url) = (c.http.clone(), c.url(c.leader().await));
    wait_for("the lost publish, stored once", Duration::from_secs(10), Duration::from_millis(50), || {
        let (http, url) = (http.clone(), leader_url.clone());
        async move {
            match read_all(&http, &url, "lost", 0, Duration::from_secs(5)).await?.len() {
                1 => Ok(()),
                n => Err(format!("{n} batches")),
            }
        }
    })
    .await;

    let proxy = LossyProxy::start(&c.node(1).addr(), 1).await;
    let r = cli(&["streams", "delete", "lost", "--nodes", &via(&proxy), "-o", "text"], &[]).await;
    r.expect_code(0, "delete, answer lost");
    assert_eq!(r.stdout.trim(), "deleted lost (already deleted)", "{r:#?}");
    assert!(r.stderr.contains("already deleted"), "{r:#?}");

    c.add_node(4).await;
    let addr4 = c.node(4).addr();
    cli(&["cluster", "add", "4", &addr4], &env).await.expect_code(0, "add a learner");
    let proxy = LossyProxy::start(&c.node(1).addr(), 1).await;
    let r = cli(&["cluster", "rm", "4", "--nodes", &via(&proxy)], &[]).await;
    r.expect_code(0, "remove, answer lost");
    assert!(r.stderr.contains("already removed"), "{r:#?}");
    let view = &r.json_lines()[0];
    assert!(view["members"].as_array().unwrap().iter().all(|m| m["id"] != 4), "{view}");
    let r = cli(&["cluster", "rm", "4"], &env).await;
    r.expect_code(4, "removing a node that is not a member");
}

/// `cluster add` returns once the learner is added, and says so when the node does not answer;
/// `--wait-voter` waits for the promotion, noting progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_add_returns_with_the_learner_and_waits_for_a_voter_on_request() {
    let mut c = Cluster::start(3, &[]).await;
    let nodes = nodes_of(&c);
    let env = [("RUNNEV_NODES", nodes.as_str())];

    // A node that is not running: added as a learner at once, with a note saying how to check.
    let ghost = format!("127.0.0.1:{}", closed_port());
    let r = cli(&["cluster", "add", "5", &ghost, "-o", "text"], &env).await;
    r.expect_code(0, "add a node that is not running");
    assert!(r.stdout.starts_with(&format!("added node 5 at {ghost} as a learner")), "{r:#?}");
    assert!(r.stdout.contains(&format!("5 (learner, {ghost})")), "{r:#?}");
    assert!(r.stderr.contains(&format!("node 5 does not answer at {ghost}")), "{r:#?}");
    let probe = if c.secure() {
        format!("runnev probe https://{ghost}/healthz --ca-file CA")
    } else {
        format!("runnev probe http://{ghost}/healthz")
    };
    assert!(r.stderr.contains(&probe), "{r:#?}");
    let r = cli(&["cluster", "add", "5", &ghost, "--wait-voter", "--timeout", "3s"], &env).await;
    r.expect_code(6, "waiting for a node that is not running");
    assert!(r.stderr.contains("is still a learner"), "{r:#?}");
    cli(&["cluster", "remove", "5"], &env).await.expect_code(0, "remove the ghost");

    // A running node: promoted, and --wait-voter returns with it a voter.
    c.add_node(4).await;
    let addr4 = c.node(4).addr();
    let r = cli(&["cluster", "add", "4", &addr4, "--wait-voter"], &env).await;
    r.expect_code(0, "add and wait for the voter");
    assert!(r.stderr.contains("waiting for node 4 to catch up"), "{r:#?}");
    let view = &r.json_lines()[0];
    let m4 = view["members"].as_array().unwrap().iter().find(|m| m["id"] == 4).cloned().unwrap();
    assert_eq!(m4["voter"], true, "{view}");
    let r = cli(&["cluster", "add", "4", &addr4, "-o", "text"], &env).await;
    r.expect_code(0, "adding a voter again");
    assert!(r.stdout.starts_with("node 4 is already a voter"), "{r:#?}");
    let r = cli(&["cluster", "add", "0", &addr4], &env).await;
    r.expect_code(2, "node id 0");

    // Removed and left running, node 4 still shows itself a voter (it is not told): adding it
    // back through a node list that starts with it adds it, rather than answering "already a
    // voter" from its view and changing nothing (an operator's trial).
    cli(&["cluster", "remove", "4"], &env).await.expect_code(0, "remove node 4");
    let first_4 = format!("{},{nodes}", c.url(4));
    let r = cli(&["cluster", "add", "4", &addr4, "--wait-voter", "--nodes", &first_4, "-o", "text"], &[]).await;
    r.expect_code(0, "add node 4 back");
    assert!(r.stdout.starts_with(&format!("node 4 at {addr4} is a voter")), "{r:#?}");
    let view = c.cluster_info(c.leader().await).await.expect("the leader's view");
    assert!(view.members.iter().any(|m| m.id == 4 && m.voter), "node 4 is a voter again: {view}");
}

/// A subscription outlives a full outage of the cluster (longer than the client's 30 s retry
/// deadline, which used to end it with exit 1), noting each reconnection on stderr, and goes on
/// after the restart; with `--max-outage` it gives up instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_outlives_a_full_outage_unless_given_a_max_outage() {
    let mut c = Cluster::start(3, &[]).await;
    let nodes = nodes_of(&c);
    let env = [("RUNNEV_NODES", nodes.as_str())];
    cli(&["streams", "create", "feed"], &env).await.expect_code(0, "create");
    cli(&["publish", "feed", "--seq", "1", "one"], &env).await.expect_code(0, "publish 1");

    let mut sub = subscriber(&["subscribe", "feed", "--nodes", &nodes]);
    let mut lines = BufReader::new(sub.stdout.take().unwrap()).lines();
    let stderr = sub.stderr.take().unwrap();
    let notes = tokio::spawn(async move {
        let mut all = Vec::new();
        let mut l = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = l.next_line().await {
            all.push(line);
        }
        all
    });
    async fn next(lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await.expect("a line within 60 s");
        let line = line.unwrap().expect("the subscriber is still printing");
        // In docs/cli.md's order (it was alphabetical: data, seq, ts).
        assert!(line.starts_with(r#"{"seq":"#) && line.contains(r#","ts":"#), "{line}");
        serde_json::from_str::<Value>(&line).unwrap()
    }
    assert_eq!(next(&mut lines).await["seq"], 1);

    for id in c.ids() {
        c.stop(id).await;
    }
    let giving_up = cli(&["subscribe", "feed", "--max-outage", "3s", "--after", "1", "--nodes", &nodes], &[]).await;
    giving_up.expect_code(3, "subscribe --max-outage during the outage");
    // Past the client's 30 s deadline, which used to end the subscription.
    tokio::time::sleep(Duration::from_secs(33)).await;
    assert!(sub.try_wait().unwrap().is_none(), "the subscriber exited during the outage");

    for id in c.ids() {
        c.restart(id).await;
    }
    c.wait_leader_agreed(Duration::from_secs(30)).await;
    cli(&["publish", "feed", "--seq", "2", "two"], &env).await.expect_code(0, "publish 2 after the restart");
    assert_eq!(next(&mut lines).await["seq"], 2);
    sub.kill().await.unwrap();
    let notes = notes.await.unwrap();
    assert!(notes.iter().any(|l| l.starts_with("runnev: subscription connection lost")), "{notes:#?}");
    assert!(notes.iter().filter(|l| l.starts_with("runnev: no connection for")).count() >= 5, "{notes:#?}");
    assert!(notes.iter().any(|l| l.contains("still trying")), "the 30 s report, and on: {notes:#?}");
    assert!(notes.iter().any(|l| l.starts_with("runnev: subscribed again at")), "{notes:#?}");
}
