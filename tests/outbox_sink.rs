//! The PostgreSQL sink against a real PostgreSQL (`RUNNEV_TEST_POSTGRES_URL`): redelivery is
//! deduped inside the transaction, `kill -9` at random points and a crash just before the commit
//! apply each batch exactly once, and a gap is logged, counted and recorded.

mod common;
mod outbox_common;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use outbox_common::*;
use rand::Rng as _;
use runnev::client::{Batch as CBatch, Delivery, Gap};
use runnev::outbox::sink::{apply_deliveries, init_schema, SqlApply};

fn sink_args(url: &str, nodes: &[String], stream: &str, consumer: &str, apply_sql: &str) -> Vec<String> {
    [
        "sink-postgres",
        "--postgres",
        url,
        "--nodes",
        &nodes.join(","),
        "--stream",
        stream,
        "--consumer",
        consumer,
        "--apply-sql",
        apply_sql,
        "--init-schema",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A table without unique constraints, so a second application would show as a second row.
async fn effects_table(pg: &tokio_postgres::Client, table: &str) {
    pg.batch_execute(&format!("CREATE TABLE {table} (seq bigint NOT NULL, payload bytea NOT NULL)")).await.unwrap();
}

async fn effects(pg: &tokio_postgres::Client, table: &str) -> BTreeMap<u64, (usize, Vec<u8>)> {
    let mut out: BTreeMap<u64, (usize, Vec<u8>)> = BTreeMap::new();
    for r in pg.query(&format!("SELECT seq, payload FROM {table}"), &[]).await.unwrap() {
        let e = out.entry(r.get::<_, i64>(0) as u64).or_insert((0, r.get(1)));
        e.0 += 1;
    }
    out
}

/// The cursor and the effects read from one snapshot: a killed sink's last COMMIT may still be
/// landing, and two separate reads could straddle it.
async fn cursor_and_effects(
    pg: &mut tokio_postgres::Client,
    table: &str,
    consumer: &str,
    stream: &str,
) -> (u64, BTreeMap<u64, (usize, Vec<u8>)>) {
    let tx = pg
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .unwrap();
    let cur = tx
        .query_opt("SELECT cursor FROM runnev_sink_cursor WHERE consumer = $1 AND stream = $2", &[&consumer, &stream])
        .await
        .unwrap()
        .map(|r| r.get::<_, i64>(0) as u64)
        .unwrap_or(0);
    let mut out: BTreeMap<u64, (usize, Vec<u8>)> = BTreeMap::new();
    for r in tx.query(&format!("SELECT seq, payload FROM {table}"), &[]).await.unwrap() {
        let e = out.entry(r.get::<_, i64>(0) as u64).or_insert((0, r.get(1)));
        e.0 += 1;
    }
    tx.commit().await.unwrap();
    (cur, out)
}

async fn cursor(pg: &tokio_postgres::Client, consumer: &str, stream: &str) -> u64 {
    pg.query_opt("SELECT cursor FROM runnev_sink_cursor WHERE consumer = $1 AND stream = $2", &[&consumer, &stream])
        .await
        .unwrap()
        .map(|r| r.get::<_, i64>(0) as u64)
        .unwrap_or(0)
}

/// The library helper: the same deliveries applied twice (a redelivery) take effect once; a
/// batch at or below the committed cursor is skipped inside the transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_sink_redelivery_is_deduped_inside_the_transaction() {
    let url = require_pg!("outbox_sink_redelivery_is_deduped_inside_the_transaction");
    let mut pg = connect(&url).await;
    init_schema(&pg).await.unwrap();
    let table = unique("sink_dedupe");
    effects_table(&pg, &table).await;
    let consumer = unique("c");
    let mut apply = SqlApply::new(format!("INSERT INTO {table} (seq, payload) VALUES ($2, $4)"), consumer.clone());
    let batch =
        |seq: u64| Delivery::Batch(CBatch { seq, ts: 1_700_000_000_000 + seq, data: Bytes::from(format!("b{seq}")) });
    let first: Vec<Delivery> = (1..=5).map(batch).collect();
    let out = apply_deliveries(&mut pg, &consumer, "s", &first, &mut apply).await.unwrap();
    assert_eq!((out.applied, out.redelivered, out.cursor), (5, 0, 5));
    let again: Vec<Delivery> = (3..=8).map(batch).collect();
    let out = apply_deliveries(&mut pg, &consumer, "s", &again, &mut apply).await.unwrap();
    assert_eq!((out.applied, out.redelivered, out.cursor), (3, 3, 8));
    let out = apply_deliveries(&mut pg, &consumer, "s", &again, &mut apply).await.unwrap();
    assert_eq!((out.applied, out.redelivered, out.cursor), (0, 6, 8));
    // A gap is recorded and moves the cursor; the batch after it is applied.
    let gap = vec![Delivery::Gap(Gap { from: 9, to: 12 }), batch(13)];
    let out = apply_deliveries(&mut pg, &consumer, "s", &gap, &mut apply).await.unwrap();
    assert_eq!((out.applied, out.gaps.clone(), out.cursor), (1, vec![Gap { from: 9, to: 12 }], 13));
    let e = effects(&pg, &table).await;
    assert_eq!(e.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3, 4, 5, 6, 7, 8, 13]);
    assert!(e.values().all(|(n, _)| *n == 1), "applied twice: {e:?}");
    assert_eq!(cursor(&pg, &consumer, "s").await, 13);
    let gaps: i64 = pg
        .query_one(
            "SELECT count(*) FROM runnev_sink_gaps WHERE consumer = $1 AND from_seq = 9 AND to_seq = 12",
            &[&consumer],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(gaps, 1);
    drop_tables(&pg, &[&table]).await;
}

/// `runnev sink-postgres` killed at random points, and once aborted between applying and
/// committing: every batch is applied exactly once and the cursor ends at the last seq.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_sink_killed_repeatedly_applies_each_batch_once() {
    let url = require_pg!("outbox_sink_killed_repeatedly_applies_each_batch_once");
    let c = Cluster::start(3, &[]).await;
    let mut pg = connect(&url).await;
    let table = unique("sink_kill");
    effects_table(&pg, &table).await;
    let stream = "sink-kill";
    let client = c.client();
    client.put_stream(stream, None).await.unwrap();
    let n = 2000u64;
    // One writer, in order: payload i has seq i + 1.
    for i in 0..n {
        client.publish(stream, Some(i + 1), payload("sk", i)).await.unwrap();
    }
    let consumer = unique("killer");
    let mut args =
        sink_args(&url, &c.urls(), stream, &consumer, &format!("INSERT INTO {table} (seq, payload) VALUES ($2, $4)"));
    // At most 50 batches a transaction, so 2,000 take at least 40 commits however fast they
    // arrive: the third commit below always comes (with the default of 5,000, all of them could
    // go in one or two transactions and the sink would wait at the failpoint's count forever),
    // and the kills land between commits.
    args.extend(["--batch-size".to_string(), "50".to_string()]);
    // First run: abort right before the third commit (effects applied, not committed).
    let mut sink = Proc::start("sink", &args, &[("RUNNEV_OUTBOX_FAILPOINT", "before-commit:3")]);
    sink.wait_exit(Duration::from_secs(60)).await;
    let before = cursor(&pg, &consumer, stream).await;
    let applied = effects(&pg, &table).await;
    assert_eq!(applied.len() as u64, before, "effects and cursor committed together");
    sink.set_env("RUNNEV_OUTBOX_FAILPOINT", None);
    let mut rng = rng(test_seed("sink restarts"), 0);
    for _ in 0..10 {
        sink.spawn();
        tokio::time::sleep(Duration::from_millis(200 + rng.random_range(0..600))).await;
        sink.kill_9();
        let (cur, e) = cursor_and_effects(&mut pg, &table, &consumer, stream).await;
        assert_eq!(e.len() as u64, cur, "effects and cursor out of step after a kill");
    }
    sink.spawn();
    until("the sink caught up", Duration::from_secs(120), || async {
        let cur = cursor(&pg, &consumer, stream).await;
        if cur == n {
            Ok(())
        } else {
            Err(format!("cursor {cur}"))
        }
    })
    .await;
    let e = effects(&pg, &table).await;
    assert_eq!(e.len() as u64, n);
    for (seq, (count, data)) in &e {
        assert_eq!(*count, 1, "seq {seq} applied {count} times");
        assert_eq!(data, &payload("sk", seq - 1), "seq {seq} payload");
    }
    let gauge = until("the cursor gauge", Duration::from_secs(10), || async {
        sink.metric(&c.http, "runnev_outbox_sink_cursor").await.ok_or_else(|| "no metric yet".to_string())
    })
    .await;
    assert_eq!(gauge, n as f64);
    drop_tables(&pg, &[&table]).await;
}

/// A consumer that fell behind retention: the gap is logged as an error, counted in
/// `runnev_outbox_sink_gaps_total`, recorded in `runnev_sink_gaps`, and the retained batches
/// after it are applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_sink_surfaces_a_gap() {
    let url = require_pg!("outbox_sink_surfaces_a_gap");
    let c = Cluster::start(3, &[]).await;
    let pg = connect(&url).await;
    let table = unique("sink_gap");
    effects_table(&pg, &table).await;
    let stream = "sink-gap";
    let client = c.client();
    client.put_stream(stream, Some(serde_json::from_str(r#"{"max_batches": 5}"#).unwrap())).await.unwrap();
    for i in 0..20u64 {
        client.publish(stream, None, payload("gap", i)).await.unwrap();
    }
    let consumer = unique("gapper");
    let args =
        sink_args(&url, &c.urls(), stream, &consumer, &format!("INSERT INTO {table} (seq, payload) VALUES ($2, $4)"));
    let sink = Proc::start("sink", &args, &[]);
    until("the sink applied the retained batches", Duration::from_secs(30), || async {
        let cur = cursor(&pg, &consumer, stream).await;
        if cur == 20 {
            Ok(())
        } else {
            Err(format!("cursor {cur}"))
        }
    })
    .await;
    let gaps: Vec<(i64, i64)> = pg
        .query(
            "SELECT from_seq, to_seq FROM runnev_sink_gaps WHERE consumer = $1 AND stream = $2",
            &[&consumer, &stream],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(gaps, vec![(1, 15)]);
    let e = effects(&pg, &table).await;
    assert_eq!(e.keys().copied().collect::<Vec<_>>(), (16..=20).collect::<Vec<_>>());
    let log = sink.log_text();
    assert!(log.contains("ERROR") && log.contains("GAP"), "the gap is logged as an error:\n{}", sink.log_tail(20));
    let counted = until("gap metric", Duration::from_secs(10), || async {
        sink.metric(&c.http, "runnev_outbox_sink_gaps_total").await.ok_or_else(|| "no metric".to_string())
    })
    .await;
    assert_eq!(counted, 1.0);
    let seqs = sink.metric(&c.http, "runnev_outbox_sink_gap_seqs_total").await;
    assert_eq!(seqs, Some(15.0));
    drop_tables(&pg, &[&table]).await;
}

/// A statement of `--apply-sql` that PostgreSQL refuses is logged in the server's words (it
/// was logged only as "PostgreSQL: db error", the sink retrying for ever; found by a fresh
/// user's trial), and nothing is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_sink_logs_a_refused_statement_in_the_server_s_words() {
    let url = require_pg!("outbox_sink_logs_a_refused_statement_in_the_server_s_words");
    let c = Cluster::start(1, &[]).await;
    let pg = connect(&url).await;
    let stream = "sink-refused";
    let client = c.client();
    client.put_stream(stream, None).await.unwrap();
    client.publish(stream, None, payload("refused", 1)).await.unwrap();
    let consumer = unique("refused");
    let sink = Proc::start("sink", &sink_args(&url, &c.urls(), stream, &consumer, "SELECT 1/0"), &[]);
    until("the refusal is logged", Duration::from_secs(30), || async {
        let log = sink.log_text();
        match log.contains("division by zero (SQLSTATE 22012)") {
            true => Ok(()),
            false => Err(sink.log_tail(5)),
        }
    })
    .await;
    assert_eq!(cursor(&pg, &consumer, stream).await, 0, "nothing applied");
}
