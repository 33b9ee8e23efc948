//! The outbox relay's many-frames publish, the removal of relayed rows and the sink's bulk
//! path, against a real PostgreSQL (`RUNNEV_TEST_POSTGRES_URL`) and real three-node clusters
//! (one of them with TLS and tokens).

mod common;
mod outbox_common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use outbox_common::*;

/// Inserts `n` rows of `stream` with payloads `payload(tag, i)` in one statement, written
/// `age_secs` seconds ago (`created_at`). Returns the payloads in id order.
async fn insert(
    pg: &tokio_postgres::Client,
    table: &str,
    stream: &str,
    tag: &str,
    n: u64,
    age_secs: f64,
) -> Vec<Vec<u8>> {
    let ps: Vec<Vec<u8>> = (0..n).map(|i| payload(tag, i)).collect();
    pg.execute(
        &format!(
            "INSERT INTO {table} (stream, payload, created_at)
             SELECT $1, p, now() - make_interval(secs => $3) FROM unnest($2::bytea[]) WITH ORDINALITY AS x(p, o) ORDER BY o"
        ),
        &[&stream, &ps, &age_secs],
    )
    .await
    .unwrap_or_else(|e| panic!("insert: {e:?}"));
    ps
}

/// Rows of the outbox (any state).
async fn rows(pg: &tokio_postgres::Client, table: &str) -> i64 {
    pg.query_one(&format!("SELECT count(*) FROM {table}"), &[]).await.unwrap().get(0)
}

/// Waits (bounded) until the progress of `stream` says every one of its `n` rows is assigned
/// and published, and `left` rows remain in the outbox.
async fn relayed_leaving(pg: &tokio_postgres::Client, table: &str, stream: &str, n: u64, left: i64) {
    until(&format!("{n} rows of {stream} relayed, {left} left in the outbox"), Duration::from_secs(60), || async {
        match (progress(pg, table, stream).await, rows(pg, table).await) {
            (p, r) if p == (n, n) && r == left => Ok(()),
            other => Err(format!("(published, assigned), rows = {other:?}")),
        }
    })
    .await
}

/// Checks that `stream` holds exactly `want` at seqs 1..=len, once each.
async fn check_stream(c: &Cluster, stream: &str, want: &[Vec<u8>]) {
    // Node 2 may be a follower: read once it has applied what the leader committed.
    let leader = c.leader().await;
    let committed = c.cluster_info(leader).await.expect("the leader's view").commit_index;
    let got = read_all(&c.http, &c.url(2), stream, committed, Duration::from_secs(20)).await.unwrap();
    let seqs: Vec<u64> = got.iter().map(|b| b.seq).collect();
    assert_eq!(seqs, (1..=want.len() as u64).collect::<Vec<_>>(), "stream {stream}: seqs");
    for (b, w) in got.iter().zip(want) {
        assert_eq!(&b.data, w, "stream {stream}: seq {} is not the row relayed with it", b.seq);
    }
}

/// Waits until the relay's counter `name` reaches `at_least`; returns its value.
async fn metric_at_least(c: &Cluster, p: &Proc, name: &str, at_least: f64) -> f64 {
    until(&format!("{name} >= {at_least}"), Duration::from_secs(60), || async {
        match p.metric(&c.http, name).await {
            Some(v) if v >= at_least => Ok(v),
            v => Err(format!("{name} = {v:?}; alive: {}", p.alive())),
        }
    })
    .await
}

/// A stream's rows go out as frames of one request (every batch carries the entry's ts; the
/// relay counts one request for 1,000 rows). A crash after that publish and before the
/// progress is recorded keeps every row (none is removed before its progress is recorded);
/// the next relay's request is answered `duplicate: true`; then the rows are removed, and the
/// stream holds each row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_relay_publishes_a_stream_as_frames_and_a_crash_after_publish_is_a_duplicate() {
    let url = require_pg!("outbox_relay_publishes_a_stream_as_frames_and_a_crash_after_publish_is_a_duplicate");
    let mut c = Cluster::start(3, &[]).await;
    let pg = connect(&url).await;
    let table = unique("ob_frames");
    create_outbox(&pg, &table).await;
    let want = insert(&pg, &table, "frames", "fr", 1000, 0.0).await;
    let args = relay_args_removing(&url, &c.urls(), &table, &["--batch-size", "1000", "--poll-ms", "100"]);

    let mut relay = Proc::start("relay", &args, &[("RUNNEV_OUTBOX_FAILPOINT", "after-publish")]);
    relay.wait_exit(Duration::from_secs(60)).await;
    // Node 1 may be a follower: read once it has applied what the leader committed.
    let committed = c.leader_commit_index().await;
    let stored = read_all(&c.http, &c.url(1), "frames", committed, Duration::from_secs(20)).await.unwrap();
    assert_eq!(stored.len(), 1000, "published before the crash");
    assert!(stored.iter().all(|b| b.ts == stored[0].ts), "the 1,000 rows are not one request (one entry, one ts)");
    assert_eq!(progress(&pg, &table, "frames").await, (0, 1000), "assigned 1000, recorded none");
    assert_eq!(rows(&pg, &table).await, 1000, "an unrecorded row was removed");

    relay.set_env("RUNNEV_OUTBOX_FAILPOINT", None);
    relay.spawn();
    relayed_leaving(&pg, &table, "frames", 1000, 0).await;
    let relayed = metric_at_least(&c, &relay, "runnev_outbox_relayed_total", 1000.0).await;
    let duplicates = metric_at_least(&c, &relay, "runnev_outbox_duplicates_total", 1000.0).await;
    let requests = relay.metric(&c.http, "runnev_outbox_publish_requests_total").await;
    assert_eq!((relayed, duplicates, requests), (1000.0, 1000.0, Some(1.0)), "one request answered duplicate");
    assert!(relay.log_text().contains("answered duplicate: true"));
    check_stream(&c, "frames", &want).await;
    drop_outbox(&pg, &table).await;
}

/// An earlier attempt stored only the first frames of a request (as a relay splitting a large
/// set and dying between two requests leaves it): the next request is answered `409
/// partial_duplicate` naming the first new frame, and the relay resends from there with its
/// seq. Nothing lost, nothing twice; the three stored rows are counted as duplicates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_relay_resends_from_the_first_new_frame_on_partial_duplicate() {
    let url = require_pg!("outbox_relay_resends_from_the_first_new_frame_on_partial_duplicate");
    let c = Cluster::start(3, &[]).await;
    let pg = connect(&url).await;
    let table = unique("ob_partial");
    create_outbox(&pg, &table).await;
    let want = insert(&pg, &table, "partial", "pd", 10, 0.0).await;
    let args = relay_args_removing(&url, &c.urls(), &table, &["--poll-ms", "100"]);

    // Seqs 1-10 assigned, nothing published.
    let mut relay = Proc::start("relay", &args, &[("RUNNEV_OUTBOX_FAILPOINT", "after-assign")]);
    relay.wait_exit(Duration::from_secs(60)).await;
    assert_eq!(progress(&pg, &table, "partial").await, (0, 10));
    // The first three rows stored at their seqs, as a first request of a split would have.
    let client = c.client();
    client.publish_many("partial", Some(1), &want[..3]).await.unwrap();

    relay.set_env("RUNNEV_OUTBOX_FAILPOINT", None);
    relay.spawn();
    relayed_leaving(&pg, &table, "partial", 10, 0).await;
    check_stream(&c, "partial", &want).await;
    let duplicates = metric_at_least(&c, &relay, "runnev_outbox_duplicates_total", 3.0).await;
    let requests = relay.metric(&c.http, "runnev_outbox_publish_requests_total").await;
    assert_eq!((duplicates, requests), (3.0, Some(2.0)), "frames 0-2 stored; one resend from frame 3");
    assert!(relay.log_text().contains("resending from the first new one"), "{}", relay.log_tail(20));
    drop_outbox(&pg, &table).await;
}

/// Relayed rows are removed in DELETEs of at most --delete-batch rows, and only once their
/// progress is recorded: a relay killed after publishing its second cycle (the first one
/// recorded) leaves exactly the unrecorded rows, which the next relay publishes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_relay_removes_recorded_rows_in_bounded_deletes_and_never_an_unrecorded_one() {
    let url = require_pg!("outbox_relay_removes_recorded_rows_in_bounded_deletes_and_never_an_unrecorded_one");
    let c = Cluster::start(3, &[]).await;
    let pg = connect(&url).await;
    let table = unique("ob_remove");
    create_outbox(&pg, &table).await;
    let want = insert(&pg, &table, "remove", "rm", 1000, 0.0).await;
    let args = relay_args_removing(
        &url,
        &c.urls(),
        &table,
        &["--batch-size", "400", "--delete-batch", "50", "--poll-ms", "100"],
    );

    // Cycle 1 publishes and records 1-400; cycle 2 removes them, publishes 401-800, dies.
    let mut relay = Proc::start("relay", &args, &[("RUNNEV_OUTBOX_FAILPOINT", "after-publish:2")]);
    relay.wait_exit(Duration::from_secs(60)).await;
    assert_eq!(progress(&pg, &table, "remove").await, (400, 800));
    let left: Vec<i64> = pg
        .query(&format!("SELECT seq FROM {table} WHERE seq IS NOT NULL ORDER BY seq"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, (401..=800).collect::<Vec<i64>>(), "recorded rows removed, unrecorded ones kept");
    assert_eq!(rows(&pg, &table).await, 600, "400 removed, 400 unrecorded, 200 unassigned");

    relay.set_env("RUNNEV_OUTBOX_FAILPOINT", None);
    relay.spawn();
    relayed_leaving(&pg, &table, "remove", 1000, 0).await;
    check_stream(&c, "remove", &want).await;
    // This run removed 600 rows (401-1000), each DELETE at most 50 of them.
    let removed = metric_at_least(&c, &relay, "runnev_outbox_removed_total", 600.0).await;
    let deletes = relay.metric(&c.http, "runnev_outbox_remove_statements_total").await.unwrap_or(0.0);
    assert_eq!(removed, 600.0);
    assert!(deletes >= removed / 50.0, "{removed} rows removed by {deletes} DELETEs of at most 50");
    drop_outbox(&pg, &table).await;
}

/// `--keep-relayed 10m`: relayed rows written an hour ago are removed, rows written now are
/// relayed and kept (for the window), still in the table after further cycles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_relay_keep_relayed_keeps_rows_for_the_window() {
    let url = require_pg!("outbox_relay_keep_relayed_keeps_rows_for_the_window");
    let c = Cluster::start(3, &[]).await;
    let pg = connect(&url).await;
    let table = unique("ob_keep");
    create_outbox(&pg, &table).await;
    let mut want = insert(&pg, &table, "keep", "old", 30, 3600.0).await;
    want.extend(insert(&pg, &table, "keep", "new", 20, 0.0).await);
    let args = relay_args_removing(&url, &c.urls(), &table, &["--keep-relayed", "10m", "--poll-ms", "100"]);
    let relay = Proc::start("relay", &args, &[]);
    relayed_leaving(&pg, &table, "keep", 50, 20).await;
    // Several more cycles (poll 100 ms): the young rows stay.
    let cycles_before = relay.metric(&c.http, "runnev_outbox_remove_statements_total").await.unwrap_or(0.0);
    metric_at_least(&c, &relay, "runnev_outbox_remove_statements_total", cycles_before + 5.0).await;
    let kept: Vec<i64> = pg
        .query(&format!("SELECT seq FROM {table} ORDER BY seq"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(kept, (31..=50).collect::<Vec<i64>>(), "the rows inside the window are kept");
    check_stream(&c, "keep", &want).await;
    drop_outbox(&pg, &table).await;
}

/// The sink's default (bulk) path: one statement per transaction, not per batch; a crash
/// between applying and committing leaves neither effects nor cursor; after restarts every
/// batch is in `runnev_sink_batches` once and the cursor is the last seq.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_sink_bulk_path_applies_each_batch_once_with_its_cursor() {
    let url = require_pg!("outbox_sink_bulk_path_applies_each_batch_once_with_its_cursor");
    let c = Cluster::start(3, &[]).await;
    let pg = connect(&url).await;
    let stream = "sink-bulk";
    let client = c.client();
    client.put_stream(stream, None).await.unwrap();
    let n = 3000u64;
    let want: Vec<Vec<u8>> = (0..n).map(|i| payload("bulk", i)).collect();
    for (k, part) in want.chunks(500).enumerate() {
        client.publish_many(stream, Some(k as u64 * 500 + 1), part).await.unwrap();
    }
    let consumer = unique("bulk");
    let args = bulk_sink_args(&url, &c.urls(), stream, &consumer);
    let mut sink = Proc::start("sink", &args, &[("RUNNEV_OUTBOX_FAILPOINT", "before-commit:2")]);
    sink.wait_exit(Duration::from_secs(60)).await;
    let (cursor, got) = sink_state(&pg, &consumer, stream).await;
    assert_eq!(got.len() as i64, cursor, "effects and cursor committed together");
    assert!(got.keys().copied().eq(1..=cursor), "applied in seq order up to the cursor");

    sink.set_env("RUNNEV_OUTBOX_FAILPOINT", None);
    sink.spawn();
    until("the sink caught up", Duration::from_secs(120), || async {
        match sink_state(&pg, &consumer, stream).await {
            (cur, _) if cur == n as i64 => Ok(()),
            (cur, _) => Err(format!("cursor {cur}")),
        }
    })
    .await;
    let (_, got) = sink_state(&pg, &consumer, stream).await;
    assert_eq!(got.len() as u64, n, "each batch once (the primary key would refuse a second)");
    for (seq, data) in &got {
        assert_eq!(data, &want[*seq as usize - 1], "seq {seq}");
    }
    let batches = metric_at_least(&c, &sink, "runnev_outbox_sink_batches_total", 1.0).await;
    let statements = sink.metric(&c.http, "runnev_outbox_sink_statements_total").await.unwrap_or(0.0);
    assert!(statements >= 1.0 && statements < batches, "{batches} batches applied by {statements} statements");
    pg.execute("DELETE FROM runnev_sink_batches WHERE consumer = $1", &[&consumer]).await.unwrap();
}

/// `runnev sink-postgres` on its default (bulk) path, creating its tables.
fn bulk_sink_args(url: &str, nodes: &[String], stream: &str, consumer: &str) -> Vec<String> {
    let nodes = nodes.join(",");
    let args = ["sink-postgres", "--postgres", url, "--nodes", &nodes, "--stream", stream, "--consumer", consumer];
    args.iter().map(|s| s.to_string()).chain(["--init-schema".to_string()]).collect()
}

/// The sink's cursor and its rows in `runnev_sink_batches` (seq → payload).
async fn sink_state(pg: &tokio_postgres::Client, consumer: &str, stream: &str) -> (i64, BTreeMap<i64, Vec<u8>>) {
    let cursor = pg
        .query("SELECT cursor FROM runnev_sink_cursor WHERE consumer = $1 AND stream = $2", &[&consumer, &stream])
        .await
        .unwrap()
        .first()
        .map_or(0, |r| r.get::<_, i64>(0));
    let got = pg
        .query(
            "SELECT seq, payload FROM runnev_sink_batches WHERE consumer = $1 AND stream = $2 ORDER BY seq",
            &[&consumer, &stream],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    (cursor, got)
}

/// Relay and sink against a cluster with client TLS and tokens (`runnev local --secure`'s
/// files): with `--ca-file` (the sink: `RUNNEV_CA_FILE`) and `RUNNEV_TOKEN` every row is
/// relayed and applied once; without the token the relay is refused (401) and relays nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_relay_and_sink_speak_tls_and_tokens() {
    let url = require_pg!("outbox_relay_and_sink_speak_tls_and_tokens");
    let dir = tempfile::Builder::new().prefix("runnev-test-outbox-pki-").tempdir().unwrap();
    let files = runnev::local::prepare_secure(dir.path(), 3).unwrap();
    let admin = std::fs::read_to_string(&files.admin_token).unwrap().trim().to_string();
    let serve: Vec<&str> = files.serve_args.iter().map(String::as_str).collect();
    let (ca, token) = (files.ca.clone(), admin.clone());
    let c = Cluster::start_insecure_edited(3, &serve, move |spec| {
        spec.tls_ca = Some(ca);
        spec.token = Some(token);
    })
    .await;
    let pg = connect(&url).await;
    let table = unique("ob_tls");
    create_outbox(&pg, &table).await;
    let want = insert(&pg, &table, "secure", "tls", 200, 0.0).await;
    let ca = files.ca.display().to_string();

    let refused = Proc::start("no-token", &relay_args_removing(&url, &c.urls(), &table, &["--ca-file", &ca]), &[]);
    until("the relay without a token refused", Duration::from_secs(60), || async {
        let log = refused.log_text();
        if log.contains("401") || log.contains("unauthorized") {
            Ok(())
        } else {
            Err(refused.log_tail(10))
        }
    })
    .await;
    assert_eq!(progress(&pg, &table, "secure").await.0, 0, "nothing relayed without a token");
    drop(refused);

    let _relay = Proc::start(
        "relay",
        &relay_args_removing(&url, &c.urls(), &table, &["--ca-file", &ca, "--poll-ms", "100"]),
        &[("RUNNEV_TOKEN", &admin)],
    );
    relayed_leaving(&pg, &table, "secure", 200, 0).await;
    let consumer = unique("tls");
    let sink_args = bulk_sink_args(&url, &c.urls(), "secure", &consumer);
    let _sink = Proc::start("sink", &sink_args, &[("RUNNEV_TOKEN", &admin), ("RUNNEV_CA_FILE", &ca)]);
    until("the sink applied every batch", Duration::from_secs(60), || async {
        match sink_state(&pg, &consumer, "secure").await {
            (200, got) if got.len() == 200 => Ok(got),
            (cur, got) => Err(format!("cursor {cur}, {} rows", got.len())),
        }
    })
    .await
    .iter()
    .zip(&want)
    .for_each(|((seq, data), w)| assert_eq!(data, w, "seq {seq}"));
    pg.execute("DELETE FROM runnev_sink_batches WHERE consumer = $1", &[&consumer]).await.unwrap();
    drop_outbox(&pg, &table).await;
}
