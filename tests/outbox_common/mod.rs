//! Shared helpers of the outbox tests: the PostgreSQL URL (`RUNNEV_TEST_POSTGRES_URL`, set by
//! `scripts/postgres env`), unique table names, and `runnev outbox-relay` / `sink-postgres`
//! child processes with their logs and metrics.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use runnev::launcher::{free_ports, log_tail, open_log, spawn_child, Signal};

use crate::common::{cli_security_env, prom_value, wait_for, Http, BIN};

/// The variable that opts out of the outbox tests on a machine without PostgreSQL: with it set
/// to `1` they print `SKIPPED` and return; without it, a missing database fails them.
pub const SKIP_ENV: &str = "RUNNEV_SKIP_POSTGRES";

/// The test database URL. Panics (the test fails, loudly) when `RUNNEV_TEST_POSTGRES_URL` is
/// not set, saying how to start one; `None` (after printing that the test is skipped) only when
/// [`SKIP_ENV`]`=1` says so explicitly.
pub fn pg_url(test: &str) -> Option<String> {
    match std::env::var("RUNNEV_TEST_POSTGRES_URL") {
        Ok(u) if !u.trim().is_empty() => Some(u),
        _ if std::env::var(SKIP_ENV).is_ok_and(|v| v == "1") => {
            eprintln!("SKIPPED: {test}: no PostgreSQL, and {SKIP_ENV}=1 opts out of the outbox tests");
            None
        }
        _ => panic!(
            "{test} needs PostgreSQL and RUNNEV_TEST_POSTGRES_URL is not set: start a throwaway server \
             with `eval \"$(scripts/postgres env)\"` (scripts/test does this), or set {SKIP_ENV}=1 to \
             skip the outbox tests on purpose"
        ),
    }
}

/// The test's database URL; fails the test when there is none, returns from it (skipped) only
/// when [`SKIP_ENV`] opts out.
#[macro_export]
macro_rules! require_pg {
    ($name:expr) => {
        match outbox_common::pg_url($name) {
            Some(u) => u,
            None => return,
        }
    };
}

/// A connected client (the connection runs in a background task).
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) =
        tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap_or_else(|e| panic!("connect {url}: {e}"));
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// A table name no other test run uses: `prefix_<pid>_<counter>_<time>`.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() % 1_000_000_000;
    format!("{prefix}_{}_{}_{t}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// Creates an outbox table `table` (and its progress table).
pub async fn create_outbox(pg: &tokio_postgres::Client, table: &str) {
    runnev::outbox::relay::init_schema(pg, table).await.unwrap_or_else(|e| panic!("outbox schema {table}: {e}"));
}

/// A free loopback port.
pub fn free_port() -> u16 {
    free_ports(1).expect("a free port")[0]
}

/// A `runnev` child process (relay or sink) logging to a file; killed on drop.
pub struct Proc {
    pub name: String,
    args: Vec<String>,
    envs: Vec<(String, String)>,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
    child: std::sync::Mutex<Option<Child>>,
    pub metrics_port: u16,
    pub starts: u32,
}

impl Proc {
    /// Starts `runnev ARGS --metrics-listen 127.0.0.1:PORT` with extra environment `envs`.
    pub fn start(name: &str, args: &[String], envs: &[(&str, &str)]) -> Proc {
        let dir = tempfile::Builder::new().prefix(&format!("runnev-{name}-")).tempdir().unwrap();
        let log = dir.path().join(format!("{name}.log"));
        let mut p = Proc {
            name: name.to_string(),
            args: args.to_vec(),
            envs: envs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            log,
            _dir: dir,
            child: std::sync::Mutex::new(None),
            metrics_port: 0,
            starts: 0,
        };
        p.spawn();
        p
    }

    /// Starts it again (after a kill or an exit), on a new metrics port.
    pub fn spawn(&mut self) {
        assert!(self.slot().is_none(), "{} is running", self.name);
        self.starts += 1;
        self.metrics_port = free_port();
        let mut cmd = Command::new(BIN);
        cmd.args(&self.args)
            .arg("--metrics-listen")
            .arg(format!("127.0.0.1:{}", self.metrics_port))
            .env("RUST_LOG", std::env::var("RUNNEV_TEST_LOG").unwrap_or_else(|_| "info".into()))
            .envs(cli_security_env())
            .stdin(Stdio::null());
        for (k, v) in &self.envs {
            cmd.env(k, v);
        }
        // Not the command line: it holds the database URL, password included.
        let heading = format!("test: start #{} of {}", self.starts, self.name);
        let log = open_log(&self.log, &heading).unwrap_or_else(|e| panic!("opening {}: {e}", self.log.display()));
        cmd.stdout(log.try_clone().expect("clone log handle")).stderr(log);
        *self.slot() = Some(spawn_child(cmd, Signal::Kill).unwrap_or_else(|e| panic!("spawning {BIN}: {e}")));
    }

    /// Sets (or with `None` removes) an environment variable for the next start.
    pub fn set_env(&mut self, key: &str, value: Option<&str>) {
        self.envs.retain(|(k, _)| k != key);
        if let Some(v) = value {
            self.envs.push((key.to_string(), v.to_string()));
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// SIGKILL and reap.
    pub fn kill_9(&self) {
        if let Some(mut c) = self.slot().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// True while the process runs (reaps it when it has exited).
    pub fn alive(&self) -> bool {
        let mut slot = self.slot();
        match slot.as_mut().map(|c| c.try_wait()) {
            Some(Ok(None)) => true,
            Some(_) => {
                *slot = None;
                false
            }
            None => false,
        }
    }

    /// Waits (bounded) for the process to exit on its own, e.g. at a failpoint.
    pub async fn wait_exit(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.alive() {
            assert!(Instant::now() < deadline, "{} did not exit within {timeout:?}:\n{}", self.name, self.log_tail(30));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The whole log.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `n` log lines.
    pub fn log_tail(&self, n: usize) -> String {
        log_tail(&self.log, n)
    }

    /// Sum of a metric's samples from this process's `/metrics`, if it answers.
    pub async fn metric(&self, http: &Http, name: &str) -> Option<f64> {
        let r = http.get(&format!("http://127.0.0.1:{}/metrics", self.metrics_port)).await.ok()?;
        prom_value(&r.text(), name)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill_9();
        if std::thread::panicking() {
            eprintln!("----- {} log {} (last 60 lines) -----\n{}", self.name, self.log.display(), self.log_tail(60));
        }
    }
}

/// Polls `f` until it returns `Some`, panicking after `timeout` with `what` and the last state.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    wait_for(what, timeout, Duration::from_millis(100), &mut f).await
}

/// `published_seq` and `assigned_seq` of `stream` in `<table>_progress` (0, 0 when absent).
pub async fn progress(pg: &tokio_postgres::Client, table: &str, stream: &str) -> (u64, u64) {
    let rows = pg
        .query(&format!("SELECT published_seq, assigned_seq FROM {table}_progress WHERE stream = $1"), &[&stream])
        .await
        .unwrap();
    rows.first().map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, i64>(1) as u64)).unwrap_or((0, 0))
}

/// Rows of the outbox not yet acknowledged (no seq, or seq above published_seq).
pub async fn unrelayed(pg: &tokio_postgres::Client, table: &str) -> i64 {
    unrelayed_where(pg, table, "true").await
}

/// [`unrelayed`], of the rows for which the SQL condition `filter` on the outbox row `o` holds
/// (`o.stream = 'a'`).
pub async fn unrelayed_where(pg: &tokio_postgres::Client, table: &str, filter: &str) -> i64 {
    pg.query_one(
        &format!(
            "SELECT count(*) FROM {table} o LEFT JOIN {table}_progress p ON p.stream = o.stream
             WHERE ({filter}) AND (o.seq IS NULL OR p.published_seq IS NULL OR o.seq > p.published_seq)"
        ),
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// The relay command line for `table` against `nodes`, keeping relayed rows for an hour
/// (`--keep-relayed 1h`) so that a test can compare each stream with the rows and their seqs.
/// The tests of removal use [`relay_args_removing`].
pub fn relay_args(url: &str, nodes: &[String], table: &str, extra: &[&str]) -> Vec<String> {
    let mut a = relay_args_removing(url, nodes, table, &["--keep-relayed", "1h"]);
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// The relay command line for `table` against `nodes` with the default removal of relayed rows.
pub fn relay_args_removing(url: &str, nodes: &[String], table: &str, extra: &[&str]) -> Vec<String> {
    let mut a = vec![
        "outbox-relay".to_string(),
        "--postgres".into(),
        url.into(),
        "--nodes".into(),
        nodes.join(","),
        "--table".into(),
        table.into(),
        "--create-streams".into(),
    ];
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// Drops an outbox table and everything its schema created (call at the end of a passing
/// test; a failing one keeps them for a look). Best effort: a failure is only printed.
pub async fn drop_outbox(pg: &tokio_postgres::Client, table: &str) {
    cleanup(
        pg,
        &format!(
            "DROP TABLE IF EXISTS {table}, {table}_progress; DROP FUNCTION IF EXISTS {table}_notify(), {table}_frozen();"
        ),
    )
    .await
}

/// Drops plain tables (end of a passing test). Best effort.
pub async fn drop_tables(pg: &tokio_postgres::Client, tables: &[&str]) {
    cleanup(pg, &format!("DROP TABLE IF EXISTS {}", tables.join(", "))).await
}

async fn cleanup(pg: &tokio_postgres::Client, sql: &str) {
    if let Err(e) = pg.batch_execute(&format!("SET lock_timeout = '10s'; {sql}")).await {
        eprintln!("cleanup failed (tables left behind): {sql}: {e}");
    }
}
