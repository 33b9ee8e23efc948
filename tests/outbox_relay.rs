//! The outbox relay against a real PostgreSQL (`RUNNEV_TEST_POSTGRES_URL`) and a real three-node
//! cluster: crash points, repeated `kill -9`, out-of-order commits, the hot standby, and clear
//! retried errors for an unreachable database, wrong credentials and a missing table.

mod common;
mod outbox_common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use outbox_common::*;
use rand::Rng as _;

/// A relay poll interval (1 h) far beyond any deadline of these tests: a relay run with it
/// relays a commit in time only if the commit's NOTIFY wakes it.
const NOTIFY_ONLY_POLL_MS: u64 = 3_600_000;

/// Inserts `n` rows into `table` (one transaction), payloads `"{tag}-{i}"` spread over
/// `streams` round robin. Returns the payloads per stream in id order.
async fn insert_rows(
    pg: &tokio_postgres::Client,
    table: &str,
    streams: &[&str],
    tag: &str,
    n: usize,
) -> BTreeMap<String, Vec<Vec<u8>>> {
    let mut out: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
    let (mut ss, mut ps) = (Vec::new(), Vec::new());
    for i in 0..n {
        let s = streams[i % streams.len()].to_string();
        let p = payload(tag, i as u64);
        out.entry(s.clone()).or_default().push(p.clone());
        ss.push(s);
        ps.push(p);
    }
    for (cs, cp) in ss.chunks(5000).zip(ps.chunks(5000)) {
        pg.execute(
            &format!("INSERT INTO {table} (stream, payload) SELECT s, p FROM unnest($1::text[], $2::bytea[]) WITH ORDINALITY AS x(s, p, o) ORDER BY o"),
            &[&cs, &cp],
        )
        .await
        .unwrap_or_else(|e| panic!("insert: {e:?}"));
    }
    out
}

/// Checks that each stream holds exactly the expected payloads once, and that every row's seq
/// in the table is the seq of its batch.
async fn check_streams(c: &Cluster, pg: &tokio_postgres::Client, table: &str, want: &BTreeMap<String, Vec<Vec<u8>>>) {
    for (stream, payloads) in want {
        let got = read_all(&c.http, &c.url(1), stream, 0, Duration::from_secs(20)).await.unwrap();
        let mut count: BTreeMap<&[u8], usize> = BTreeMap::new();
        for b in &got {
            *count.entry(&b.data).or_default() += 1;
        }
        let dups: Vec<_> = count.iter().filter(|(_, n)| **n > 1).collect();
        assert!(dups.is_empty(), "stream {stream}: {} payloads appear more than once", dups.len());
        let missing = payloads.iter().filter(|p| !count.contains_key(p.as_slice())).count();
        assert_eq!(missing, 0, "stream {stream}: {missing} committed rows are missing");
        assert_eq!(got.len(), payloads.len(), "stream {stream}: batch count");
        let rows = pg
            .query(&format!("SELECT seq, payload FROM {table} WHERE stream = $1 ORDER BY seq"), &[stream])
            .await
            .unwrap();
        let by_seq: BTreeMap<u64, Vec<u8>> =
            rows.iter().map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, Vec<u8>>(1))).collect();
        for b in &got {
            assert_eq!(
                by_seq.get(&b.seq),
                Some(&b.data),
                "stream {stream}: seq {} is not the row with that seq",
                b.seq
            );
        }
    }
}

async fn wait_relayed(pg: &tokio_postgres::Client, table: &str, timeout: Duration, relay: &Proc) {
    until("every row relayed", timeout, || async {
        let n = unrelayed(pg, table).await;
        if n == 0 {
            Ok(())
        } else {
            Err(format!("{n} rows not relayed; relay alive: {}", relay.alive()))
        }
    })
    .await
}

/// A crash after publishing and before recording the progress, and a crash after assigning and
/// before publishing: nothing lost, nothing twice, and the retry is answered duplicate: true.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_relay_crash_points_lose_nothing_and_publish_once() {
    let url = require_pg!("outbox_relay_crash_points_lose_nothing_and_publish_once");
    let c = Cluster::start(3, &[]).await;
    let pg = connect(&url).await;
    let table = unique("ob_fp");
    create_outbox(&pg, &table).await;
    let want = insert_rows(&pg, &table, &["fp"], "fp", 10).await;
    let args = relay_args(&url, &c.urls(), &table, &["--batch-size", "4", "--poll-ms", "100"]);

    // 1. Abort after the first batch of 4 is acknowledged, before the progress is committed.
    let mut relay = Proc::start("relay", &args, &[("RUNNEV_OUTBOX_FAILPOINT", "after-publish")]);
    relay.wait_exit(Duration::from_secs(60)).await;
    let stored = read_all(&c.http, &c.url(1), "fp", 0, Duration::from_secs(10)).await.unwrap();
    assert_eq!(stored.len(), 4, "the first batch was published before the crash");
    assert_eq!(progress(&pg, &table, "fp").await, (0, 4), "assigned 4, recorded none");

    // 2. Restart, crash again in the second cycle, before it publishes. The first cycle
    //    republishes seqs 1-4 (the cluster answers duplicate: true) and assigns 5-8 (held back:
    //    "fp" had unacknowledged rows); the second assigns 9-10 and dies before publishing 5-8.
    relay.set_env("RUNNEV_OUTBOX_FAILPOINT", Some("after-assign:2"));
    relay.spawn();
    relay.wait_exit(Duration::from_secs(60)).await;
    assert!(
        relay.log_text().contains("answered duplicate: true"),
        "the retry after the crash was not answered duplicate: true:\n{}",
        relay.log_tail(30)
    );
    assert_eq!(progress(&pg, &table, "fp").await, (4, 10), "recorded 4, assigned all 10");
    assert_eq!(read_all(&c.http, &c.url(1), "fp", 0, Duration::from_secs(10)).await.unwrap().len(), 4);

    // 3. A clean run finishes the job.
    relay.set_env("RUNNEV_OUTBOX_FAILPOINT", None);
    relay.spawn();
    wait_relayed(&pg, &table, Duration::from_secs(60), &relay).await;
    assert_eq!(progress(&pg, &table, "fp").await, (10, 10));
    check_streams(&c, &pg, &table, &want).await;
    let got = read_all(&c.http, &c.url(2), "fp", 0, Duration::from_secs(10)).await.unwrap();
    let seqs: Vec<u64> = got.iter().map(|b| b.seq).collect();
    assert_eq!(seqs, (1..=10).collect::<Vec<_>>());
    let data: Vec<&Vec<u8>> = got.iter().map(|b| &b.data).collect();
    assert_eq!(data, want["fp"].iter().collect::<Vec<_>>(), "rows in id order");
    let relayed = until("relay metrics", Duration::from_secs(10), || async {
        relay.metric(&c.http, "runnev_outbox_relayed_total").await.ok_or_else(|| "no metric yet".to_string())
    })
    .await;
    assert!(relayed >= 2.0, "runnev_outbox_relayed_total = {relayed}");
    drop_outbox(&pg, &table).await;
}

/// A large relay while the relay process is SIGKILLed at random points, over and over; rows are
/// also inserted while it runs. Every row ends up in its stream exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_relay_killed_repeatedly_keeps_every_row_once() {
    let url = require_pg!("outbox_relay_killed_repeatedly_keeps_every_row_once");
    let c = Cluster::start(3, &[]).await;
    let pg = connect(&url).await;
    let table = unique("ob_kill");
    create_outbox(&pg, &table).await;
    let streams = ["kill-a", "kill-b", "kill-c"];
    let mut want = insert_rows(&pg, &table, &streams, "first", 4000).await;
    let args = relay_args(&url, &c.urls(), &table, &["--batch-size", "200", "--poll-ms", "200"]);
    let mut relay = Proc::start("relay", &args, &[]);
    let mut rng = rng(test_seed("relay kills"), 0);
    let started = Instant::now();
    for round in 0..12 {
        tokio::time::sleep(Duration::from_millis(300 + rng.random_range(0..1200))).await;
        relay.kill_9();
        let more = insert_rows(&pg, &table, &streams, &format!("round{round}"), 150).await;
        for (s, p) in more {
            want.entry(s).or_default().extend(p);
        }
        relay.spawn();
    }
    wait_relayed(&pg, &table, Duration::from_secs(180), &relay).await;
    let total: usize = want.values().map(Vec::len).sum();
    eprintln!("relayed {total} rows through {} relay starts (12 SIGKILLs) in {:.1?}", relay.starts, started.elapsed());
    check_streams(&c, &pg, &table, &want).await;
    assert!(relay.alive(), "the relay exited:\n{}", relay.log_tail(30));
    drop_outbox(&pg, &table).await;
}

/// Two transactions commit out of id order: the one with the higher id is relayed first, the
/// lower id commits afterwards and is relayed after it (next seq), not lost, not refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_relay_out_of_order_commits_are_neither_lost_nor_refused() {
    let url = require_pg!("outbox_relay_out_of_order_commits_are_neither_lost_nor_refused");
    let c = Cluster::start(3, &[]).await;
    let pg = connect(&url).await;
    let table = unique("ob_order");
    create_outbox(&pg, &table).await;
    let args = relay_args(&url, &c.urls(), &table, &["--poll-ms", "100"]);
    let relay = Proc::start("relay", &args, &[]);

    let a = connect(&url).await;
    let b = connect(&url).await;
    a.batch_execute("BEGIN").await.unwrap();
    let id_a: i64 = a
        .query_one(&format!("INSERT INTO {table} (stream, payload) VALUES ('order', 'A'::bytea) RETURNING id"), &[])
        .await
        .unwrap()
        .get(0);
    b.batch_execute("BEGIN").await.unwrap();
    let id_b: i64 = b
        .query_one(&format!("INSERT INTO {table} (stream, payload) VALUES ('order', 'B'::bytea) RETURNING id"), &[])
        .await
        .unwrap()
        .get(0);
    assert!(id_a < id_b);
    b.batch_execute("COMMIT").await.unwrap();

    let first = until("B relayed", Duration::from_secs(30), || async {
        let got = read_all(&c.http, &c.url(1), "order", 0, Duration::from_secs(5)).await?;
        if got.len() == 1 {
            Ok(got)
        } else {
            Err(format!("{} batches", got.len()))
        }
    })
    .await;
    assert_eq!((first[0].seq, first[0].data.as_slice()), (1, &b"B"[..]));

    // A commits late, with the lower id.
    a.batch_execute("COMMIT").await.unwrap();
    wait_relayed(&pg, &table, Duration::from_secs(30), &relay).await;
    let got = read_all(&c.http, &c.url(3), "order", 0, Duration::from_secs(10)).await.unwrap();
    let seen: Vec<(u64, &[u8])> = got.iter().map(|b| (b.seq, b.data.as_slice())).collect();
    assert_eq!(seen, vec![(1, &b"B"[..]), (2, &b"A"[..])]);
    let log = relay.log_text();
    assert!(!log.contains("seq_not_increasing") && !log.contains("ERROR"), "relay log has errors:\n{log}");
    drop_outbox(&pg, &table).await;
}

/// One active relay per table; a second instance waits as a hot standby and takes over when the
/// first is killed. Both expose `runnev_outbox_active`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_relay_standby_takes_over_when_the_active_relay_dies() {
    let url = require_pg!("outbox_relay_standby_takes_over_when_the_active_relay_dies");
    let c = Cluster::start(3, &[]).await;
    let pg = connect(&url).await;
    let table = unique("ob_standby");
    create_outbox(&pg, &table).await;
    // The poll interval is far beyond every deadline below: only a NOTIFY can wake the active
    // relay in time.
    let args = relay_args(
        &url,
        &c.urls(),
        &table,
        &["--poll-ms", &NOTIFY_ONLY_POLL_MS.to_string(), "--standby-poll-ms", "200"],
    );
    let r1 = Proc::start("relay-1", &args, &[]);
    until("relay 1 active", Duration::from_secs(20), || async {
        match r1.metric(&c.http, "runnev_outbox_active").await {
            Some(1.0) => Ok(()),
            v => Err(format!("active = {v:?}")),
        }
    })
    .await;
    let r2 = Proc::start("relay-2", &args, &[]);
    until("relay 2 on standby", Duration::from_secs(20), || async {
        match r2.metric(&c.http, "runnev_outbox_active").await {
            Some(0.0) => Ok(()),
            v => Err(format!("active = {v:?}")),
        }
    })
    .await;

    // The active relay is idle (it relayed nothing yet, and found nothing on its first look);
    // the commit below can only reach it by NOTIFY within the liveness bound of 60 s, a
    // sixtieth of its poll interval.
    until("relay 1 idle after its first cycle", Duration::from_secs(20), || async {
        match r1.metric(&c.http, "runnev_outbox_lag_rows").await {
            Some(0.0) => Ok(()),
            v => Err(format!("lag rows {v:?}")),
        }
    })
    .await;
    let mut want = insert_rows(&pg, &table, &["standby"], "one", 100).await;
    let t = Instant::now();
    until("the commit's NOTIFY to wake the idle relay (its poll is 1 h away)", Duration::from_secs(60), || async {
        match unrelayed(&pg, &table).await {
            0 => Ok(()),
            n => Err(format!("{n} rows not relayed; relay 1 alive: {}", r1.alive())),
        }
    })
    .await;
    eprintln!("100 rows relayed {:.0?} after the commit (woken by NOTIFY; a figure, not a verdict)", t.elapsed());
    assert!(r2.log_text().contains("hot standby"));

    r1.kill_9();
    let killed = Instant::now();
    for (s, p) in insert_rows(&pg, &table, &["standby"], "two", 100).await {
        want.entry(s).or_default().extend(p);
    }
    wait_relayed(&pg, &table, Duration::from_secs(30), &r2).await;
    eprintln!("standby took over and relayed 100 rows {:.1?} after the kill", killed.elapsed());
    assert_eq!(r2.metric(&c.http, "runnev_outbox_active").await, Some(1.0));
    check_streams(&c, &pg, &table, &want).await;
    drop_outbox(&pg, &table).await;
}

/// Unreachable database, wrong credentials, missing table: a clear error, retried with
/// backoff, the process stays up, and once the table exists the rows flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_relay_database_problems_are_clear_errors_retried_with_backoff() {
    let url = require_pg!("outbox_relay_database_problems_are_clear_errors_retried_with_backoff");
    let c = Cluster::start(3, &[]).await;
    let pg = connect(&url).await;

    let closed = format!("postgres://runnev:runnev@127.0.0.1:{}/runnev", free_port());
    let cfg: tokio_postgres::Config = url.parse().unwrap();
    let wrong = {
        let user = cfg.get_user().unwrap_or("runnev");
        let host = match &cfg.get_hosts()[0] {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        };
        let port = cfg.get_ports().first().copied().unwrap_or(5432);
        format!("postgres://{user}:definitely-wrong@{host}:{port}/{}", cfg.get_dbname().unwrap_or("runnev"))
    };
    let table = unique("ob_err");
    let unreachable = Proc::start("unreachable", &relay_args(&closed, &c.urls(), &table, &[]), &[]);
    let badauth = Proc::start("badauth", &relay_args(&wrong, &c.urls(), &table, &[]), &[]);
    let missing = Proc::start("missing", &relay_args(&url, &c.urls(), &table, &["--poll-ms", "100"]), &[]);

    for (p, needle) in [
        (&unreachable, "cannot reach PostgreSQL at runnev@127.0.0.1"),
        (&badauth, "password authentication failed"),
        (&missing, "does not exist"),
    ] {
        // Retried: at least two failed attempts, each logged and counted (a liveness bound, not
        // a count of log lines after a fixed sleep).
        until(&format!("{}: two failed attempts, logged and counted", p.name), Duration::from_secs(60), || async {
            assert!(p.alive(), "{} exited:\n{}", p.name, p.log_tail(20));
            let reconnects = p.log_text().matches("reconnecting").count();
            let errors = p.metric(&c.http, "runnev_outbox_errors_total").await.unwrap_or(0.0);
            if reconnects >= 2 && errors >= 2.0 {
                Ok(())
            } else {
                Err(format!("{reconnects} reconnects logged, runnev_outbox_errors_total = {errors}"))
            }
        })
        .await;
        assert!(p.alive(), "{} exited:\n{}", p.name, p.log_tail(20));
        let log = p.log_text();
        assert!(log.contains(needle), "{}: no {needle:?} in the log:\n{}", p.name, p.log_tail(20));
        assert!(!log.contains("definitely-wrong"), "{}: the password is in the log", p.name);
    }
    assert!(missing.log_text().contains("--init-schema"), "the missing-table error says how to fix it");
    assert!(badauth.log_text().contains("check the user, password and database"));

    // Create the table: the waiting relay picks it up on its next retry and relays.
    create_outbox(&pg, &table).await;
    let want = insert_rows(&pg, &table, &["late"], "late", 20).await;
    wait_relayed(&pg, &table, Duration::from_secs(60), &missing).await;
    check_streams(&c, &pg, &table, &want).await;
    drop_outbox(&pg, &table).await;
}

/// The relay should be its streams' only publisher; when another publisher takes seqs the relay
/// had assigned (a 409), those rows get new seqs after the stream's last one — none lost, none
/// twice. A row the cluster refuses for good (413) holds back only its own stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_relay_foreign_publisher_and_a_stuck_stream() {
    let url = require_pg!("outbox_relay_foreign_publisher_and_a_stuck_stream");
    let c = Cluster::start(3, &["--max-batch-bytes", "1000"]).await;
    let pg = connect(&url).await;
    let table = unique("ob_foreign");
    create_outbox(&pg, &table).await;
    let args = relay_args(&url, &c.urls(), &table, &["--poll-ms", "100"]);
    let mut want = insert_rows(&pg, &table, &["shared"], "one", 2).await;
    let mut relay = Proc::start("relay", &args, &[]);
    wait_relayed(&pg, &table, Duration::from_secs(30), &relay).await;
    relay.kill_9();

    // Seqs 3-5 assigned, then the relay dies before publishing them; another publisher takes 10.
    for (s, p) in insert_rows(&pg, &table, &["shared"], "two", 3).await {
        want.entry(s).or_default().extend(p);
    }
    relay.set_env("RUNNEV_OUTBOX_FAILPOINT", Some("after-assign"));
    relay.spawn();
    relay.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(progress(&pg, &table, "shared").await, (2, 5));
    let client = c.client();
    client.publish("shared", Some(10), &b"foreign"[..]).await.unwrap();

    // A row too large for the cluster, in its own stream, next to rows of a healthy stream.
    pg.execute(&format!("INSERT INTO {table} (stream, payload) VALUES ('big', $1)"), &[&vec![7u8; 2000]])
        .await
        .unwrap();
    let ok = insert_rows(&pg, &table, &["healthy"], "ok", 5).await;
    relay.set_env("RUNNEV_OUTBOX_FAILPOINT", None);
    relay.spawn();
    until("shared and healthy relayed", Duration::from_secs(30), || async {
        let n = unrelayed_where(&pg, &table, "o.stream <> 'big'").await;
        if n == 0 {
            Ok(())
        } else {
            Err(format!("{n} rows left"))
        }
    })
    .await;
    let shared = read_all(&c.http, &c.url(1), "shared", 0, Duration::from_secs(10)).await.unwrap();
    let seqs: Vec<u64> = shared.iter().map(|b| b.seq).collect();
    assert_eq!(seqs, vec![1, 2, 10, 11, 12, 13], "rows 3-5 moved after the foreign seq 10");
    assert_eq!(shared[2].data, b"foreign");
    let ours: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::from([(
        "shared".to_string(),
        shared.iter().filter(|b| b.seq != 10).map(|b| b.data.clone()).collect(),
    )]);
    assert_eq!(ours, want, "each row once, in id order");
    check_streams(&c, &pg, &table, &ok).await;
    let reassigned = relay.metric(&c.http, "runnev_outbox_reassigned_total").await;
    assert_eq!(reassigned, Some(3.0));
    until("the stuck row reported in the log", Duration::from_secs(30), || async {
        if relay.log_text().contains("payload_too_large") {
            Ok(())
        } else {
            Err(relay.log_tail(20))
        }
    })
    .await;
    until("the big row alone counted as lag", Duration::from_secs(10), || async {
        match relay.metric(&c.http, "runnev_outbox_lag_rows").await {
            Some(1.0) => Ok(()),
            v => Err(format!("lag rows {v:?}")),
        }
    })
    .await;
    let errors = relay.metric(&c.http, "runnev_outbox_errors_total").await.unwrap_or(0.0);
    assert!(errors >= 1.0, "the stuck row is counted as an error");
    assert!(relay.alive());
    // The log says how to unblock it, and doing so works: the row deleted, the stream's next
    // row follows it.
    assert!(
        relay.log_text().contains("raise the nodes' --max-batch-bytes, or delete the row"),
        "{}",
        relay.log_tail(20)
    );
    pg.execute(&format!("DELETE FROM {table} WHERE stream = 'big'"), &[]).await.unwrap();
    let after = insert_rows(&pg, &table, &["big"], "after", 1).await;
    wait_relayed(&pg, &table, Duration::from_secs(30), &relay).await;
    check_streams(&c, &pg, &table, &after).await;
    drop_outbox(&pg, &table).await;
}

/// Without `--create-streams`, rows naming a stream that does not exist wait without a seq,
/// logged and counted, while the other streams' rows are relayed (they used to wait too: the
/// whole cycle failed on the missing stream); once the stream is created its rows follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_relay_a_missing_stream_holds_back_only_its_own_rows() {
    let url = require_pg!("outbox_relay_a_missing_stream_holds_back_only_its_own_rows");
    let c = Cluster::start(3, &[]).await;
    let pg = connect(&url).await;
    let table = unique("ob_missing");
    create_outbox(&pg, &table).await;
    let client = c.client();
    client.put_stream("here", None).await.unwrap();
    // The missing stream's rows come first: the oldest rows without a seq.
    let gone = insert_rows(&pg, &table, &["gone"], "gone", 5).await;
    let here = insert_rows(&pg, &table, &["here"], "here", 5).await;
    let args: Vec<String> = relay_args(&url, &c.urls(), &table, &["--poll-ms", "100"])
        .into_iter()
        .filter(|a| a != "--create-streams")
        .collect();
    let relay = Proc::start("relay", &args, &[]);
    until("the existing stream's rows relayed", Duration::from_secs(30), || async {
        let n = unrelayed_where(&pg, &table, "o.stream = 'here'").await;
        if n == 0 {
            Ok(())
        } else {
            Err(format!("{n} rows of 'here' left; relay alive: {}\n{}", relay.alive(), relay.log_tail(10)))
        }
    })
    .await;
    check_streams(&c, &pg, &table, &here).await;
    assert_eq!(unassigned(&pg, &table, "gone").await, 5, "the missing stream's rows keep no seq");
    until("the missing stream logged and counted", Duration::from_secs(30), || async {
        let errors = relay.metric(&c.http, "runnev_outbox_errors_total").await.unwrap_or(0.0);
        if relay.log_text().contains("\"gone\", which does not exist") && errors >= 1.0 {
            Ok(())
        } else {
            Err(format!("errors {errors}:\n{}", relay.log_tail(10)))
        }
    })
    .await;
    assert!(relay.alive(), "{}", relay.log_tail(20));
    client.put_stream("gone", None).await.unwrap();
    wait_relayed(&pg, &table, Duration::from_secs(30), &relay).await;
    check_streams(&c, &pg, &table, &gone).await;
    drop_outbox(&pg, &table).await;
}

/// The relay's session while it waits for a publish with the next cycle's assignment done and
/// not committed: `idle in transaction`, its last statement the progress update of the
/// assignment. `Err` says what the session shows instead.
async fn assignment_open_while_publishing(pg: &tokio_postgres::Client, table: &str) -> Result<(), String> {
    let sessions: Vec<(String, String)> = pg
        .query(
            "SELECT coalesce(state, ''), query FROM pg_stat_activity
             WHERE application_name = 'runnev-outbox-relay' AND query LIKE '%' || $1 || '%'",
            &[&format!("{table}_progress SET assigned_seq")],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    if sessions.iter().any(|(state, _)| state == "idle in transaction") {
        Ok(())
    } else {
        Err(format!("relay sessions whose last statement assigned seqs: {sessions:?}"))
    }
}

/// Rows of `stream` with no seq, as another session sees them.
async fn unassigned(pg: &tokio_postgres::Client, table: &str, stream: &str) -> i64 {
    pg.query_one(&format!("SELECT count(*) FROM {table} WHERE stream = $1 AND seq IS NULL"), &[&stream])
        .await
        .unwrap()
        .get(0)
}

/// The pipeline: while a cycle is being published (the cluster paused, so it stays in flight),
/// the relay assigns the next cycle's rows in its open transaction; once the publish lands it
/// records it and commits with that assignment, then publishes the next rows after it, in
/// order. A crash in between (the publish landed, the next assignment not committed) loses and
/// repeats nothing: the landed rows are published again (duplicate: true) and the others are
/// assigned anew, after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_relay_assigns_the_next_cycle_while_one_is_in_flight_and_a_crash_between_loses_nothing() {
    let url =
        require_pg!("outbox_relay_assigns_the_next_cycle_while_one_is_in_flight_and_a_crash_between_loses_nothing");
    let mut c = Cluster::start(3, &[]).await;
    let pg = connect(&url).await;
    let table = unique("ob_pipe");
    create_outbox(&pg, &table).await;
    let nodes = [1, 2, 3];
    let args = relay_args(&url, &c.urls(), &table, &["--poll-ms", &NOTIFY_ONLY_POLL_MS.to_string()]);
    // Landed publishes: "warm", A, B, C; the crash comes when C lands, D being assigned.
    let mut relay = Proc::start("relay", &args, &[("RUNNEV_OUTBOX_FAILPOINT", "after-publish:4")]);
    let mut want = insert_rows(&pg, &table, &["pipe"], "warm", 1).await;
    wait_relayed(&pg, &table, Duration::from_secs(30), &relay).await;

    for (round, (first, next)) in [("A", "B"), ("C", "D")].into_iter().enumerate() {
        let before = progress(&pg, &table, "pipe").await;
        c.pause_all(&nodes);
        let a = insert_rows(&pg, &table, &["pipe"], first, 5).await;
        until(&format!("{first} assigned and publishing"), Duration::from_secs(20), || async {
            match progress(&pg, &table, "pipe").await {
                p if p == (before.0, before.1 + 5) => Ok(()),
                p => Err(format!("(published, assigned) = {p:?}")),
            }
        })
        .await;
        let b = insert_rows(&pg, &table, &["pipe"], next, 5).await;
        until(&format!("{next} assigned while {first} is in flight"), Duration::from_secs(8), || async {
            assignment_open_while_publishing(&pg, &table).await
        })
        .await;
        assert_eq!(unassigned(&pg, &table, "pipe").await, 5, "{next}'s assignment is not committed yet");
        assert_eq!(progress(&pg, &table, "pipe").await, (before.0, before.1 + 5), "{first} not recorded yet");
        c.resume_all(&nodes);
        for m in [a, b] {
            for (s, p) in m {
                want.entry(s).or_default().extend(p);
            }
        }
        if round == 0 {
            wait_relayed(&pg, &table, Duration::from_secs(60), &relay).await;
            check_streams(&c, &pg, &table, &want).await;
        }
    }

    // C landed; the relay died before committing D's assignment with C's progress.
    relay.wait_exit(Duration::from_secs(60)).await;
    assert_eq!(progress(&pg, &table, "pipe").await, (11, 16), "C assigned and unrecorded");
    assert_eq!(unassigned(&pg, &table, "pipe").await, 5, "D's assignment was rolled back");
    relay.set_env("RUNNEV_OUTBOX_FAILPOINT", None);
    relay.spawn();
    wait_relayed(&pg, &table, Duration::from_secs(60), &relay).await;
    assert!(
        relay.log_text().contains("answered duplicate: true"),
        "C was not published again as a duplicate:\n{}",
        relay.log_tail(30)
    );
    check_streams(&c, &pg, &table, &want).await;
    let got = read_all(&c.http, &c.url(2), "pipe", 0, Duration::from_secs(10)).await.unwrap();
    let seqs: Vec<u64> = got.iter().map(|b| b.seq).collect();
    assert_eq!(seqs, (1..=21).collect::<Vec<_>>());
    let data: Vec<&Vec<u8>> = got.iter().map(|b| &b.data).collect();
    assert_eq!(data, want["pipe"].iter().collect::<Vec<_>>(), "rows in commit order, each once");
    drop_outbox(&pg, &table).await;
}

/// The top-up: a row committed while cycle N is in flight, after cycle N+1 was assigned (its
/// transaction open, waiting for N), goes out with N+1, not a cycle later: when N lands, the
/// relay assigns it in N+1's transaction, after N+1's rows, and publishes both in one request.
/// Order and contents are checked as everywhere; the requests counted tell whether it waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_relay_tops_up_the_prepared_cycle_with_rows_committed_before_the_one_in_flight_lands() {
    let url = require_pg!("outbox_relay_tops_up_the_prepared_cycle_with_rows_committed_before_the_one_in_flight_lands");
    let mut c = Cluster::start(3, &[]).await;
    let pg = connect(&url).await;
    let table = unique("ob_topup");
    create_outbox(&pg, &table).await;
    let nodes = [1, 2, 3];
    let args = relay_args(&url, &c.urls(), &table, &["--poll-ms", &NOTIFY_ONLY_POLL_MS.to_string()]);
    let relay = Proc::start("relay", &args, &[]);
    let mut want = insert_rows(&pg, &table, &["topup"], "warm", 1).await;
    wait_relayed(&pg, &table, Duration::from_secs(30), &relay).await;

    c.pause_all(&nodes);
    let a = insert_rows(&pg, &table, &["topup"], "A", 5).await;
    until("A assigned and publishing", Duration::from_secs(20), || async {
        match progress(&pg, &table, "topup").await {
            (1, 6) => Ok(()),
            p => Err(format!("(published, assigned) = {p:?}")),
        }
    })
    .await;
    let b = insert_rows(&pg, &table, &["topup"], "B", 5).await;
    until("B assigned while A is in flight", Duration::from_secs(8), || async {
        assignment_open_while_publishing(&pg, &table).await
    })
    .await;
    // C commits after B's cycle was prepared, while A is still in flight.
    let late = insert_rows(&pg, &table, &["topup"], "C", 5).await;
    c.resume_all(&nodes);
    for m in [a, b, late] {
        for (s, p) in m {
            want.entry(s).or_default().extend(p);
        }
    }
    wait_relayed(&pg, &table, Duration::from_secs(60), &relay).await;
    check_streams(&c, &pg, &table, &want).await;
    let got = read_all(&c.http, &c.url(1), "topup", 0, Duration::from_secs(10)).await.unwrap();
    assert_eq!(got.iter().map(|b| b.seq).collect::<Vec<_>>(), (1..=16).collect::<Vec<_>>());
    until("all 16 rows counted as relayed", Duration::from_secs(20), || async {
        match relay.metric(&c.http, "runnev_outbox_relayed_total").await {
            Some(n) if n >= 16.0 => Ok(()),
            n => Err(format!("runnev_outbox_relayed_total = {n:?}")),
        }
    })
    .await;
    let requests = relay.metric(&c.http, "runnev_outbox_publish_requests_total").await;
    assert_eq!(requests, Some(3.0), "warm, A, then B with C in one request (C did not wait for a cycle of its own)");
    // One request is one entry: B's and C's rows carry one ts.
    assert!(got[6..].iter().all(|b| b.ts == got[6].ts), "B and C were not published together");
    drop_outbox(&pg, &table).await;
}

/// Relay throughput on this machine: `RUNNEV_OUTBOX_BENCH_ROWS` rows (default 20 000) over
/// `RUNNEV_OUTBOX_BENCH_STREAMS` streams (default 4), 1 KiB payloads, default relay flags.
/// Run: `cargo test --release --test outbox_relay -- --ignored --nocapture throughput`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn outbox_relay_throughput() {
    let url = require_pg!("outbox_relay_throughput");
    let rows: usize = std::env::var("RUNNEV_OUTBOX_BENCH_ROWS").ok().and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let nstreams: usize = std::env::var("RUNNEV_OUTBOX_BENCH_STREAMS").ok().and_then(|s| s.parse().ok()).unwrap_or(4);
    let c = Cluster::start(3, &[]).await;
    let pg = connect(&url).await;
    let table = unique("ob_bench");
    create_outbox(&pg, &table).await;
    let names: Vec<String> = (0..nstreams).map(|i| format!("bench-{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let (mut ss, mut ps) = (Vec::new(), Vec::new());
    for i in 0..rows {
        ss.push(refs[i % refs.len()].to_string());
        let mut p = payload("bench", i as u64);
        p.resize(1024, b'x');
        ps.push(p);
    }
    for (cs, cp) in ss.chunks(5000).zip(ps.chunks(5000)) {
        pg.execute(
            &format!("INSERT INTO {table} (stream, payload) SELECT * FROM unnest($1::text[], $2::bytea[])"),
            &[&cs, &cp],
        )
        .await
        .unwrap();
    }
    // Create the streams first so the measurement is the relay's steady state.
    for s in &names {
        create_stream(&c.http, &c.url(1), s).await;
    }
    let relay = Proc::start("relay", &relay_args(&url, &c.urls(), &table, &[]), &[]);
    let t = Instant::now();
    wait_relayed(&pg, &table, Duration::from_secs(600), &relay).await;
    let secs = t.elapsed().as_secs_f64();
    println!(
        "outbox relay throughput: {rows} rows of 1 KiB over {nstreams} streams in {secs:.2} s = {:.0} rows/s",
        rows as f64 / secs
    );
    drop_outbox(&pg, &table).await;
}
