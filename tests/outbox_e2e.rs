//! End to end against a real PostgreSQL (`RUNNEV_TEST_POSTGRES_URL`): many concurrent
//! application transactions (some rolled back) write business rows and outbox rows → `runnev
//! outbox-relay` → a three-node cluster whose leader is killed in the middle → `runnev
//! sink-postgres`. Every committed business row appears exactly once in the sink table; rolled-
//! back ones never do.

mod common;
mod outbox_common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::*;
use outbox_common::*;
use rand::Rng as _;

const WRITERS: u64 = 6;
const TXS_PER_WRITER: u64 = 250;
const STREAM: &str = "orders-e2e";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_end_to_end_concurrent_transactions_leader_kill_exactly_once() {
    let url = require_pg!("outbox_end_to_end_concurrent_transactions_leader_kill_exactly_once");
    let mut c = Cluster::start(3, &[]).await;
    let pg = connect(&url).await;
    let outbox = unique("e2e_outbox");
    let orders = unique("e2e_orders");
    let sunk = unique("e2e_sunk");
    create_outbox(&pg, &outbox).await;
    pg.batch_execute(&format!(
        "CREATE TABLE {orders} (id text PRIMARY KEY, amount int8 NOT NULL);
         CREATE TABLE {sunk} (order_id text NOT NULL, seq int8 NOT NULL);"
    ))
    .await
    .unwrap();
    let consumer = unique("e2e");

    let relay = Proc::start("relay", &relay_args(&url, &c.urls(), &outbox, &["--batch-size", "100"]), &[]);
    // The sink extracts the order id from the JSON payload into its own table (no unique
    // constraint: a second application would show as a second row).
    let apply = format!("INSERT INTO {sunk} (order_id, seq) SELECT convert_from($4, 'UTF8')::jsonb->>'order', $2");
    let sink_args: Vec<String> = [
        "sink-postgres",
        "--postgres",
        &url,
        "--nodes",
        &c.urls().join(","),
        "--stream",
        STREAM,
        "--consumer",
        &consumer,
        "--apply-sql",
        &apply,
        "--init-schema",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let sink = Proc::start("sink", &sink_args, &[]);

    // The application: WRITERS connections, each running transactions that insert an order and
    // its outbox row; about one in six rolls back, one in ten writes two orders. Each writer
    // stops halfway at a barrier the test opens only once the leader is dead, so the second half
    // of the transactions certainly runs while the cluster replaces its leader.
    let seed = test_seed("outbox writers");
    let halfway = std::sync::Arc::new(tokio::sync::Barrier::new(WRITERS as usize + 1));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (url, outbox, orders, halfway) = (url.clone(), outbox.clone(), orders.clone(), halfway.clone());
        writers.push(tokio::spawn(async move {
            let mut pg = connect(&url).await;
            let mut rng = rng(seed, w);
            let (mut committed, mut rolled_back) = (Vec::new(), Vec::new());
            for t in 0..TXS_PER_WRITER {
                if t == TXS_PER_WRITER / 2 {
                    halfway.wait().await;
                }
                let tx = pg.transaction().await.unwrap();
                let n = if rng.random_range(0..10) == 0 { 2 } else { 1 };
                let ids: Vec<String> = (0..n).map(|k| format!("w{w}-t{t}-{k}")).collect();
                for id in &ids {
                    tx.execute(
                        &format!("INSERT INTO {orders} (id, amount) VALUES ($1, $2)"),
                        &[id, &(rng.random_range(0..1000) as i64)],
                    )
                    .await
                    .unwrap();
                    let body = serde_json::json!({"order": id}).to_string().into_bytes();
                    tx.execute(&format!("INSERT INTO {outbox} (stream, payload) VALUES ($1, $2)"), &[&STREAM, &body])
                        .await
                        .unwrap();
                }
                if rng.random_range(0..6) == 0 {
                    tx.rollback().await.unwrap();
                    rolled_back.extend(ids);
                } else {
                    tx.commit().await.unwrap();
                    committed.extend(ids);
                }
                // Paced (seeded), so the relay and the sink work while transactions commit.
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..30))).await;
            }
            (committed, rolled_back)
        }));
    }

    // Kill the leader once some rows have gone through and every writer is halfway; open the
    // barrier; restart the old leader once every writer is done.
    until("the first rows in the sink", Duration::from_secs(60), || async {
        let n: i64 = pg.query_one(&format!("SELECT count(*) FROM {sunk}"), &[]).await.unwrap().get(0);
        if n >= 50 {
            Ok(())
        } else {
            Err(format!("{n} rows sunk"))
        }
    })
    .await;
    let leader = c.leader().await;
    c.kill_9(leader);
    let killed = Instant::now();
    tokio::time::timeout(Duration::from_secs(60), halfway.wait()).await.expect("liveness bound: writers reach halfway");
    eprintln!("killed leader {leader}; the writers' second halves run from now on");

    let mut committed = BTreeSet::new();
    let mut rolled_back = BTreeSet::new();
    for w in writers {
        let (c, r) = w.await.unwrap();
        committed.extend(c);
        rolled_back.extend(r);
    }
    c.restart(leader).await;
    assert!(!rolled_back.is_empty() && committed.len() > 1000);

    let want = committed.len() as i64;
    until("every committed order in the sink", Duration::from_secs(180), || async {
        let n: i64 = pg.query_one(&format!("SELECT count(*) FROM {sunk}"), &[]).await.unwrap().get(0);
        if n >= want {
            Ok(())
        } else {
            Err(format!("{n} of {want} sunk; relay alive {}, sink alive {}", relay.alive(), sink.alive()))
        }
    })
    .await;
    eprintln!(
        "{} committed and {} rolled-back orders; all committed ones sunk {:.1?} after the leader kill",
        committed.len(),
        rolled_back.len(),
        killed.elapsed()
    );
    // Count once the sink has processed the whole stream (its cursor is the stream's last seq
    // and the relay has nothing left): a duplicate application would be in the table by then.
    until("the sink's cursor at the stream's last seq", Duration::from_secs(120), || async {
        if unrelayed(&pg, &outbox).await != 0 {
            return Err("the relay has rows left".to_string());
        }
        let info = c.http.get(&format!("{}/v1/streams/{STREAM}", c.url(1))).await?;
        let last = info.try_json().and_then(|v| v["last_seq"].as_u64()).ok_or_else(|| info.describe())?;
        let cursor: Option<i64> = pg
            .query_opt(
                "SELECT cursor FROM runnev_sink_cursor WHERE consumer = $1 AND stream = $2",
                &[&consumer, &STREAM],
            )
            .await
            .map_err(|e| e.to_string())?
            .map(|r| r.get(0));
        if cursor == Some(last as i64) {
            Ok(())
        } else {
            Err(format!("cursor {cursor:?}, last_seq {last}"))
        }
    })
    .await;

    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut seqs = BTreeSet::new();
    for r in pg.query(&format!("SELECT order_id, seq FROM {sunk}"), &[]).await.unwrap() {
        *seen.entry(r.get(0)).or_default() += 1;
        assert!(seqs.insert(r.get::<_, i64>(1)), "seq applied twice");
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "orders applied more than once: {twice:?}");
    let in_db: BTreeSet<String> =
        pg.query(&format!("SELECT id FROM {orders}"), &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(in_db, committed, "the business table holds exactly the committed orders");
    let sunk_ids: BTreeSet<String> = seen.keys().cloned().collect();
    assert_eq!(sunk_ids, committed, "the sink holds exactly the committed orders");
    assert!(rolled_back.iter().all(|id| !sunk_ids.contains(id)));
    // The stream itself: each committed order once, read from the restarted node once it has
    // applied what the leader has committed (right after its restart it may still be catching
    // up, and a read there answers what it has applied so far).
    let committed_index = c.leader_commit_index().await;
    let batches = read_all(&c.http, &c.url(leader), STREAM, committed_index, Duration::from_secs(30)).await.unwrap();
    assert_eq!(batches.len(), committed.len(), "stream length");
    assert!(relay.alive() && sink.alive());
    drop_outbox(&pg, &outbox).await;
    drop_tables(&pg, &[&orders, &sunk]).await;
}
