//! `runnev serve` and `runnev local` as a user starts them: refusals at start say what is wrong
//! in one sentence and exit non-zero; `runnev local` never starts beside a node it did not
//! start, starts a crashed node again (not one stopped cleanly, nor one that keeps failing), and
//! never exits 0 when its nodes could not run.

mod common;

use std::time::Duration;

use common::*;
use runnev::launcher::port_holder;
use tokio::io::{AsyncBufReadExt, BufReader};

fn peers(base: u16) -> String {
    (0..3).map(|i| format!("{}=127.0.0.1:{}", i + 1, base + i)).collect::<Vec<_>>().join(",")
}

/// `runnev serve --id 2` on node 2's data dir under `dir`, listening on `port`, not a child of
/// `runnev local` (a stray, as a user starts one by hand).
fn stray_node(dir: &std::path::Path, base: u16, port: u16) -> tokio::process::Child {
    let data = dir.join("node-2");
    tokio::process::Command::new(BIN)
        .args(["serve", "--id", "2", "--data-dir", data.to_str().unwrap()])
        .args(["--listen", &format!("127.0.0.1:{port}"), "--peers", &peers(base)])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Starts `runnev local` on `base` under `dir`; returns it once its banner says the nodes run.
async fn start_local(dir: &std::path::Path, base: u16) -> tokio::process::Child {
    start_local_with(dir, base, &[]).await
}

/// Stops `runnev local` with SIGTERM and checks that it stops cleanly (exit 0) within 30 s.
async fn stop_local(local: &mut tokio::process::Child) {
    signal(local.id().unwrap(), libc::SIGTERM);
    let status = tokio::time::timeout(Duration::from_secs(30), local.wait()).await.expect("local stops").unwrap();
    assert_eq!(status.code(), Some(0), "a clean stop");
}

/// [`start_local`] with `extra` arguments after `local`.
async fn start_local_with(dir: &std::path::Path, base: u16, extra: &[&str]) -> tokio::process::Child {
    start_local_to(dir, base, extra, None).await
}

/// [`start_local_with`], its stderr written to `stderr` when given (else dropped).
async fn start_local_to(
    dir: &std::path::Path,
    base: u16,
    extra: &[&str],
    stderr: Option<&std::path::Path>,
) -> tokio::process::Child {
    let stderr = match stderr {
        Some(path) => std::process::Stdio::from(std::fs::File::create(path).unwrap()),
        None => std::process::Stdio::null(),
    };
    let mut local = tokio::process::Command::new(BIN)
        .args(["local", "--base-port", &base.to_string(), "--dir", dir.to_str().unwrap()])
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(local.stdout.take().unwrap()).lines();
    let banner = tokio::time::timeout(Duration::from_secs(60), async {
        let mut seen = Vec::new();
        while let Ok(Some(l)) = lines.next_line().await {
            let done = l.starts_with("Ctrl-C stops the cluster.");
            seen.push(l);
            if done {
                return seen;
            }
        }
        panic!("runnev local ended before its banner: {seen:#?}");
    })
    .await
    .expect("runnev local's banner within 60 s");
    assert!(banner.iter().any(|l| l.starts_with("RUNNEV_NODES=http://127.0.0.1:")), "{banner:#?}");
    assert!(banner.iter().any(|l| l.starts_with("Status page") && l.ends_with(&format!(":{base}/"))), "{banner:#?}");
    local
}

/// `runnev serve` with these settings; the answer once it exits.
async fn serve(id: &str, data: &std::path::Path, listen: &str, peers: &str, env: &[(&str, &str)]) -> CliRun {
    let data = data.to_str().expect("utf-8 path");
    cli(&["serve", "--id", id, "--data-dir", data, "--listen", listen, "--peers", peers], env).await
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: a process of this test's own tree, identified just before.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, sig) }, 0, "kill {pid}");
}

/// `serve --id 0` is refused; a second node on a data dir in use says so in one sentence (it
/// used to print redb's "Database already open. Cannot acquire lock." twice); and a one-node
/// cluster (`--peers 1=HOST:PORT`) serves the client commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_id_0_and_a_data_dir_in_use_in_one_sentence() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let r = serve("0", &data, "127.0.0.1:1", "0=127.0.0.1:1", &[]).await;
    r.expect_code(2, "serve --id 0");
    assert!(r.stderr.contains("node ids start at 1; 0 is not a node id"), "{r:#?}");
    let r = serve("1", &data, "127.0.0.1:1", "0=127.0.0.1:1", &[]).await;
    r.expect_code(2, "a peer with id 0");
    assert!(!data.exists(), "nothing was created");

    let c = Cluster::start(1, &[]).await;
    let nodes = c.node(1).addr();
    cli(&["streams", "create", "solo", "--nodes", &nodes], &[]).await.expect_code(0, "one node: create");
    let r = cli(&["publish", "solo", "--seq", "1", "alone", "--nodes", &nodes], &[]).await;
    r.expect_code(0, "one node: publish");

    let data = c.data_dir(1);
    let r = serve("1", &data, &format!("127.0.0.1:{}", closed_port()), &format!("1={nodes}"), &[("RUST_LOG", "error")])
        .await;
    r.expect_code(1, "a second node on the same data dir");
    let expected = format!(
        "runnev: the data dir {} is in use: another runnev process holds the lock on its database",
        data.display()
    );
    assert!(r.stderr.contains(&expected), "{r:#?}");
    assert!(!r.stderr.contains("Database already open"), "{r:#?}");
    assert_eq!(r.stderr.lines().count(), 1, "one sentence: {r:#?}");
}

/// `runnev local` supervises its nodes as systemd's `Restart=on-failure` does: a node killed
/// (`kill -9`, a crash) is started again on its data 2 s later and serves; a node stopped
/// cleanly (SIGTERM sent to it) stays down. A clean stop of `runnev local` exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_restarts_a_crashed_node_but_not_one_stopped_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("local");
    let base = free_base(3);
    let mut local = start_local(&root, base).await;

    let killed = port_holder(base + 1).expect("node 2 listens").pid;
    signal(killed, libc::SIGKILL);
    let restarted = wait_for("node 2 started again", Duration::from_secs(30), Duration::from_millis(100), || async {
        match port_holder(base + 1) {
            Some(h) if h.pid != killed && h.is_runnev_node() => Ok(h.pid),
            other => Err(format!("port held by {other:?}")),
        }
    })
    .await;
    // `runnev local` without --secure serves plain HTTP, whatever the harness's security.
    let http = Http::insecure(Duration::from_secs(5));
    wait_for("the restarted node 2 ready", Duration::from_secs(30), Duration::from_millis(100), || async {
        match http.get(&format!("http://127.0.0.1:{}/readyz", base + 1)).await {
            Ok(r) if r.status == 200 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    signal(port_holder(base + 2).expect("node 3 listens").pid, libc::SIGTERM);
    wait_for("node 3's port free", Duration::from_secs(20), Duration::from_millis(50), || async {
        port_holder(base + 2).map_or(Ok(()), |h| Err(format!("held by {h:?}")))
    })
    .await;
    // Past the restart delay and two watch ticks: a node stopped cleanly is left down.
    tokio::time::sleep(Duration::from_millis(runnev::local::RESTART_MS + 1_500)).await;
    assert!(port_holder(base + 2).is_none(), "node 3 stopped cleanly and was not started again");
    assert_eq!(port_holder(base + 1).map(|h| h.pid), Some(restarted), "node 2 still runs");

    stop_local(&mut local).await;
}

/// The first hour's trap: a node started by hand beside an earlier `runnev local` survives
/// its stop (it is not `runnev local`'s), and the next `runnev local` must refuse to start
/// beside it, naming it and how to stop it, rather than let it lead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_refuses_a_stray_node() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("local");
    let base = free_base(3);

    let mut local = start_local(&root, base).await;
    stop_local(&mut local).await;
    let mut stray = stray_node(&root, base, base + 1);
    wait_for("the hand-started node 2", Duration::from_secs(20), Duration::from_millis(50), || async {
        port_holder(base + 1).map(|_| ()).ok_or_else(|| "not listening yet".to_string())
    })
    .await;

    let stray_pid = stray.id().unwrap();
    let r = cli(&["local", "--base-port", &base.to_string(), "--dir", root.to_str().unwrap()], &[]).await;
    r.expect_code(1, "runnev local beside a stray node");
    assert!(r.stderr.contains(&format!("port {} is held by a runnev node", base + 1)), "{r:#?}");
    assert!(r.stderr.contains(&format!("kill {stray_pid}")), "{r:#?}");
    assert!(port_holder(base).is_none(), "nothing of its own was started");
    stray.kill().await.unwrap();
    stray.wait().await.unwrap();
}

/// A node that cannot run again is not restarted for ever: after five starts within a minute
/// `runnev local` says so and leaves it down, and once no node runs nor is to be started again
/// it exits 1. (Each node's data dir is marked with another data format while it runs, so every
/// restart is refused at once.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_gives_up_on_nodes_that_cannot_run_and_exits_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("local");
    let base = free_base(3);
    let stderr = dir.path().join("local.stderr");
    let mut local = start_local_to(&root, base, &[], Some(&stderr)).await;
    for i in 0..3u16 {
        std::fs::write(root.join(format!("node-{}", i + 1)).join("FORMAT"), "runnev data format 9\n").unwrap();
        signal(port_holder(base + i).expect("a node listens").pid, libc::SIGKILL);
    }
    let status = tokio::time::timeout(Duration::from_secs(90), local.wait()).await.expect("local ends").unwrap();
    assert_eq!(status.code(), Some(1), "no node can run");
    let said = std::fs::read_to_string(&stderr).unwrap();
    for id in 1..=3 {
        assert!(
            said.contains(&format!("runnev local: node {id} exited"))
                && said.contains(&format!("runnev local: node {id} started again")),
            "{said}"
        );
    }
    assert_eq!(said.matches("so it is not started again").count(), 3, "each node given up once: {said}");
    assert!(said.contains("data format 9"), "the cause, from the node's own words: {said}");
    assert!(said.contains("none is started again"), "{said}");
}

/// `runnev local --log-format json` runs its nodes with the same log format: every line a node
/// writes to `DIR/node-N.log` is a JSON object naming the node (the launcher's own heading
/// lines aside).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_passes_its_log_format_to_its_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("local");
    let base = free_base(3);
    let mut local = start_local_with(&root, base, &["--log-format", "json"]).await;
    for id in 1..=3u64 {
        let path = root.join(format!("node-{id}.log"));
        let lines = wait_for(
            &format!("node {id}'s 'node serving' line"),
            Duration::from_secs(20),
            Duration::from_millis(50),
            || {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                async move {
                    let lines: Vec<String> =
                        text.lines().filter(|l| !l.starts_with("=====")).map(str::to_owned).collect();
                    match lines.iter().any(|l| l.contains("node serving")) {
                        true => Ok(lines),
                        false => Err(format!("not yet: {lines:?}")),
                    }
                }
            },
        )
        .await;
        for l in &lines {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("node {id}: not JSON ({e}): {l}"));
            assert_eq!(v["node"], id, "node {id}: {l}");
        }
    }
    stop_local(&mut local).await;
}

/// A SIGTERM while the nodes are still starting stops them and `runnev local` cleanly (exit 0).
/// Its handler used to be installed only after the banner, so a signal before it, or between
/// the banner and the handler (a test stopping it at once on a loaded machine), killed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_stopped_while_its_nodes_start_stops_them_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("local");
    let base = free_base(3);
    let local = tokio::process::Command::new(BIN)
        .args(["local", "--base-port", &base.to_string(), "--dir", root.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The nodes' data dirs appear once they were spawned; the banner comes after they are up.
    wait_for("the nodes to be spawned", Duration::from_secs(20), Duration::from_millis(5), || {
        let spawned = root.join("node-1.log").exists();
        async move {
            if spawned {
                Ok(())
            } else {
                Err("not yet".to_string())
            }
        }
    })
    .await;
    signal(local.id().unwrap(), libc::SIGTERM);
    let out =
        tokio::time::timeout(Duration::from_secs(30), local.wait_with_output()).await.expect("local stops").unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "a clean stop while starting: {stdout}");
    assert!(stdout.contains("runnev local: stopping"), "{stdout}");
    assert!(!stdout.contains("Ctrl-C stops the cluster."), "stopped before its banner: {stdout}");
}

/// A node that cannot start (here its data dir is held by another process) stops `runnev local`
/// with exit 1 and the node's own words, instead of a banner, "node N exited" and exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_exits_non_zero_naming_why_a_node_could_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("local");
    let base = free_base(3);
    let elsewhere = free_base(1);
    let mut holder = stray_node(&root, base, elsewhere);
    wait_for("the process holding node 2's data dir", Duration::from_secs(20), Duration::from_millis(50), || async {
        port_holder(elsewhere).map(|_| ()).ok_or_else(|| "not listening yet".to_string())
    })
    .await;

    let r = cli(&["local", "--base-port", &base.to_string(), "--dir", root.to_str().unwrap()], &[]).await;
    r.expect_code(1, "runnev local with a node that cannot start");
    assert!(r.stderr.contains("runnev: node 2 could not start: the data dir"), "{r:#?}");
    assert!(r.stderr.contains("is in use: another runnev process holds the lock"), "{r:#?}");
    assert!(!r.stdout.contains("Ctrl-C stops the cluster."), "no banner for a cluster that did not start: {r:#?}");
    for i in [0, 2] {
        assert!(port_holder(base + i).is_none(), "node {} was stopped", i + 1);
    }
    holder.kill().await.unwrap();
}

/// A data directory written in another data format is refused at start, with both format
/// numbers, and left as it was: nothing in it is opened or created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_a_data_dir_of_another_format_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("FORMAT"), "runnev data format 9\n").unwrap();
    let port = closed_port();
    let r =
        serve("1", &data, &format!("127.0.0.1:{port}"), &format!("1=127.0.0.1:{port}"), &[("RUST_LOG", "error")]).await;
    r.expect_code(1, "a data dir of format 9");
    assert!(r.stderr.contains("data format 9; this runnev reads formats 1 to 5"), "{r:#?}");
    let names: Vec<String> =
        std::fs::read_dir(&data).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names, vec!["FORMAT".to_string()], "nothing else was created");
    assert_eq!(std::fs::read_to_string(data.join("FORMAT")).unwrap(), "runnev data format 9\n");
}

/// Flags after `--` reach every node's `runnev serve` (here `--auto-create-streams`: a publish to
/// a stream nobody created is stored); a flag `runnev local` sets itself is refused at once, with
/// exit 2, in words, before anything is made (given twice, every node would have refused to
/// start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_passes_flags_after_a_double_dash_to_its_nodes_but_not_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("local");
    let base = free_base(3);
    let (root_text, base_text) = (root.to_str().unwrap(), base.to_string());
    for (own, secure) in [("--listen=127.0.0.1:1", false), ("--peers", false), ("--tls-cert", true)] {
        let mut args = vec!["local", "--dir", root_text, "--base-port", &base_text];
        if secure {
            args.push("--secure");
        }
        args.extend(["--", own]);
        let r = cli(&args, &[]).await;
        r.expect_code(2, own);
        assert!(
            r.stderr.contains(&format!("{own} cannot be passed to the nodes: runnev local sets it itself")),
            "{r:#?}"
        );
        assert!(!root.exists(), "nothing was made: {r:#?}");
    }

    let mut local = start_local_with(&root, base, &["--", "--auto-create-streams"]).await;
    let http = Http::insecure(Duration::from_secs(5));
    let r = http.post(&format!("http://127.0.0.1:{base}/v1/streams/made.by.publish/batches"), b"x".to_vec()).await;
    let r = r.expect("publish");
    assert_eq!(r.status, 201, "the stream was created by the publish: {}", r.describe());
    stop_local(&mut local).await;
}
