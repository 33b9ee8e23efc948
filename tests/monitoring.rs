//! What operators watch: JSON log lines that name the node, its term and the request
//! (`--log-format json`, `X-Request-Id`), and the series behind the dashboard and alert rules
//! in `deploy/monitoring/`, exported by a real cluster.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use hyper::Method;
use serde_json::Value;

/// The JSON lines of node `id`'s log (the launcher writes a heading of its own first).
fn json_lines(c: &Cluster, id: u64) -> Vec<Value> {
    let log = std::fs::read_to_string(c.log_path(id)).unwrap_or_else(|e| panic!("reading node {id}'s log: {e}"));
    log.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("node {id}: a log line is not JSON ({e}): {l}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_log_lines_name_the_node_its_term_and_the_request() {
    let mut c = Cluster::start(3, &["--log-format", "json"]).await;
    let (_, term) = c.wait_leader_agreed(Duration::from_secs(20)).await;
    let http = Http::new();
    let url = c.url(2);

    // A client's own request id is kept and sent back; a request without one is given one.
    let asked = "monitoring-test-7f3a";
    let refused = http
        .request(
            Method::POST,
            &format!("{url}/raft/vote"),
            Some(bytes::Bytes::from_static(b"not postcard")),
            &[("runnev-protocol", "2"), ("x-request-id", asked)],
            REQUEST_TIMEOUT,
        )
        .await
        .expect("raft vote request");
    assert_eq!(refused.status, 400, "{}", refused.describe());
    assert_eq!(refused.header("x-request-id").as_deref(), Some(asked), "{}", refused.describe());
    let health = http.get(&format!("{url}/healthz")).await.expect("healthz");
    let given = health.header("x-request-id").unwrap_or_default();
    assert!(
        given.strip_prefix("n2-").is_some_and(|n| n.parse::<u64>().is_ok()),
        "a request without X-Request-Id is given n<node>-<count>, got {given:?}"
    );

    // Every line is a JSON object naming the node and its term; the refusal's line names the
    // request it refused.
    let line = wait_for("node 2 to log the refused vote", Duration::from_secs(10), Duration::from_millis(50), || {
        let lines = json_lines(&c, 2);
        async move {
            lines
                .into_iter()
                .find(|l| l["span"]["id"] == asked)
                .ok_or_else(|| "no JSON line with span.id = the request's id yet".to_string())
        }
    })
    .await;
    assert_eq!(line["node"], 2, "{line}");
    assert_eq!(line["span"]["route"], "/raft/vote", "{line}");
    assert_eq!(line["level"], "WARN", "{line}");
    assert!(line["fields"]["message"].as_str().is_some_and(|m| m.contains("refusing a Raft RPC")), "{line}");
    assert_eq!(line["term"].as_u64(), Some(term), "the line carries the node's current term: {line}");
    for id in c.ids() {
        let lines = json_lines(&c, id);
        assert!(lines.iter().any(|l| l["fields"]["message"] == "node serving"), "node {id}: no 'node serving' line");
        for l in &lines {
            assert_eq!(l["node"], id, "node {id}: {l}");
            assert!(l["term"].is_u64() && l["timestamp"].is_string() && l["level"].is_string(), "node {id}: {l}");
        }
    }
}

/// The `runnev_…` series that `text` (a dashboard or a rule file) refers to.
fn series_named_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("runnev_") {
        let tail = &rest[at..];
        let end = tail.find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_')).unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_alert_rules_use_only_series_a_cluster_exports() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/monitoring");
    let dashboard_text = std::fs::read_to_string(root.join("grafana-dashboard.json")).expect("reading the dashboard");
    let rules_text = std::fs::read_to_string(root.join("alerts.yml")).expect("reading the alert rules");

    // The dashboard's shape as Grafana reads it: panels with a type, a place and queries.
    let dashboard: Value = serde_json::from_str(&dashboard_text).expect("the dashboard is JSON");
    assert!(dashboard["title"].is_string() && dashboard["uid"].is_string(), "title and uid");
    assert!(dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 36), "schemaVersion");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "a panel for each thing the dashboard promises");
    let mut ids = BTreeSet::new();
    for p in panels {
        assert!(ids.insert(p["id"].as_u64().expect("panel id")), "panel ids are unique: {p}");
        assert!(p["type"].is_string() && p["title"].is_string(), "{p}");
        for k in ["h", "w", "x", "y"] {
            assert!(p["gridPos"][k].is_u64(), "gridPos.{k}: {p}");
        }
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty() && targets.iter().all(|t| t["expr"].is_string()), "queries: {p}");
    }

    // A cluster that has published, read past a gap and measured its disk.
    let c = Cluster::start(3, &[]).await;
    let leader = c.leader().await;
    let http = Http::new();
    let base = c.url(leader);
    let created = http
        .put(&format!("{base}/v1/streams/watched"), Some(r#"{"retention": {"max_batches": 2}}"#))
        .await
        .expect("create stream");
    assert!(created.status == 201 || created.status == 200, "{}", created.describe());
    for i in 0..5 {
        let r = http.post(&format!("{base}/v1/streams/watched/batches"), format!("b{i}")).await.expect("publish");
        assert_eq!(r.status, 201, "{}", r.describe());
    }
    let read = http.get(&format!("{base}/v1/streams/watched/batches?after=0")).await.expect("read");
    assert!(read.json()["gap"].is_object(), "reading from 0 behind retention meets a gap: {}", read.describe());

    let mut exported = BTreeSet::new();
    for id in c.ids() {
        let text = http.get(&format!("{}/metrics", c.url(id))).await.expect("metrics").text();
        // No request of this test parks to wait, and the gauge is there at 0 all the same (it was
        // absent until a node's first long poll).
        assert_eq!(
            prom_value_where(&text, "runnev_waiting_requests", Some(("kind", "read"))),
            Some(0.0),
            "node {id} exports runnev_waiting_requests before any request waits"
        );
        for line in text.lines().filter(|l| l.starts_with("runnev_")) {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            exported.insert(name.to_string());
            for suffix in ["_bucket", "_sum", "_count"] {
                if let Some(base) = name.strip_suffix(suffix) {
                    exported.insert(base.to_string());
                }
            }
        }
    }
    let lag_on_leader = prom_value_where(
        &http.get(&format!("{base}/metrics")).await.expect("metrics").text(),
        "runnev_raft_follower_lag_entries",
        None,
    );
    assert!(lag_on_leader.is_some(), "the leader reports its followers' lag");

    let wanted: BTreeSet<String> =
        series_named_in(&dashboard_text).union(&series_named_in(&rules_text)).cloned().collect();
    for must in ["runnev_raft_follower_lag_entries", "runnev_gaps_delivered_total", "runnev_log_fsync_seconds_bucket"] {
        assert!(wanted.contains(must), "the dashboard or the rules watch {must}");
    }
    let missing: Vec<&String> = wanted.iter().filter(|n| !exported.contains(*n)).collect();
    assert!(missing.is_empty(), "series the dashboard or alert rules use that no node exports: {missing:?}");

    // Each metric docs/http-api.md calls a histogram is exported as one (with buckets), not as a
    // summary: `runnev_proposal_commands` was a summary (found by a new user's trial).
    let api_doc = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/http-api.md"))
        .expect("reading docs/http-api.md");
    let histograms: Vec<&str> = api_doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `")?.split_once("` | histogram |").map(|(name, _)| name))
        .collect();
    assert!(histograms.contains(&"runnev_proposal_commands"), "{histograms:?}");
    let leader_metrics = http.get(&format!("{base}/metrics")).await.expect("metrics").text();
    for name in histograms {
        if leader_metrics.lines().any(|l| l.starts_with(name)) {
            assert!(
                leader_metrics.contains(&format!("# TYPE {name} histogram")),
                "{name} is documented as a histogram but exported otherwise:\n{}",
                leader_metrics.lines().filter(|l| l.contains(name)).collect::<Vec<_>>().join("\n")
            );
        }
    }
}
