//! `scripts/postgres`, the throwaway PostgreSQL server the outbox tests and the README's outbox
//! walkthrough run on: a cluster left behind by an earlier run that no longer starts (killed,
//! then damaged; or owned by another uid) is set aside and replaced, so a machine that kept
//! `/tmp` between runs does not fail every outbox test. Runs the script on its own port and
//! directory, never the server the other tests use.

mod common;
mod outbox_common;

use std::path::Path;
use std::process::Command;

/// Runs `scripts/postgres ARG` on `port` and `dir`; returns (success, stderr).
fn script(arg: &str, port: u16, dir: &Path) -> (bool, String) {
    let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/postgres"))
        .arg(arg)
        .env("RUNNEV_PG_PORT", port.to_string())
        .env("RUNNEV_PG_DIR", dir)
        .env("RUNNEV_PG_DB", "runnev_script_test")
        .output()
        .expect("run scripts/postgres");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `kill -9` of the server whose `postmaster.pid` is under `dir` (the stop a crashed machine
/// or a killed container gives it).
fn kill_server(dir: &Path) {
    let pidfile = dir.join("data/postmaster.pid");
    let pid = std::fs::read_to_string(&pidfile).expect("postmaster.pid of a running server");
    let pid = pid.lines().next().unwrap_or_default().trim().to_string();
    assert!(Command::new("kill").args(["-9", &pid]).status().expect("kill").success());
    for _ in 0..100 {
        if !Command::new("kill").args(["-0", &pid]).status().expect("kill -0").success() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("postgres {pid} still runs after kill -9");
}

#[test]
fn scripts_postgres_replaces_a_left_behind_cluster_that_does_not_start() {
    let _ = require_pg!("scripts_postgres_replaces_a_left_behind_cluster_that_does_not_start");
    let port = runnev::launcher::free_ports(1).expect("a free port")[0];
    let dir = std::env::temp_dir().join(format!("runnev-test-pgscript-{}-{port}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);

    let (ok, err) = script("start", port, &dir);
    assert!(ok, "a first start failed: {err}");
    assert!(script("status", port, &dir).0);

    // Killed, then damaged: without pg_control the server cannot start, whatever is done to
    // its pid file.
    kill_server(&dir);
    std::fs::remove_file(dir.join("data/global/pg_control")).expect("remove pg_control");
    let (ok, err) = script("start", port, &dir);
    assert!(ok, "the script gave up on a damaged cluster instead of replacing it: {err}");
    assert!(err.contains("did not start"), "the script must say why it replaced the cluster: {err}");
    assert!(script("status", port, &dir).0, "no server runs after the replacement");
    let aside = std::fs::read_dir(&dir)
        .expect("read the script's directory")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("data.broken."))
        .count();
    assert_eq!(aside, 1, "the damaged cluster is kept aside once, for a look");

    // Killed and left as it was: started again as it is (the same cluster, nothing set aside).
    kill_server(&dir);
    let (ok, err) = script("start", port, &dir);
    assert!(ok, "a killed cluster did not start again: {err}");
    assert!(!err.contains("did not start"), "a cluster that only needed its pid file cleared was replaced: {err}");

    let _ = script("stop", port, &dir);
    let _ = std::fs::remove_dir_all(&dir);
}
