//! The status page (`GET /`, src/api/status.rs) against real `runnev serve` processes: every node
//! serves it as self-contained HTML that loads nothing from elsewhere, the data paths it polls
//! answer, and `GET /v1/cluster/nodes` reports every member's own indexes, the leader's view of
//! each follower's lag, and a killed member as unreachable. tests/browser/ drives the page
//! itself in a headless browser.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use runnev::wire::{NodesView, StreamList};

/// The paths the page fetches: every `getJson('…')` in its script.
fn fetched_paths(page: &str) -> Vec<String> {
    page.split("getJson('").skip(1).filter_map(|rest| rest.split('\'').next()).map(str::to_string).collect()
}

/// The values of `attr="…"` (or `attr='…'`) attributes in `page`.
fn attribute_values(page: &str, attr: &str) -> Vec<String> {
    let mut out = Vec::new();
    for quote in ['"', '\''] {
        let open = format!("{attr}={quote}");
        for rest in page.split(open.as_str()).skip(1) {
            out.extend(rest.split(quote).next().map(str::to_string));
        }
    }
    out
}

async fn nodes_view(http: &Http, base: &str) -> Result<NodesView, String> {
    let r = http.get(&format!("{base}/v1/cluster/nodes")).await?;
    if r.status != 200 {
        return Err(r.describe());
    }
    serde_json::from_slice(&r.body).map_err(|e| format!("not a nodes view: {e}: {}", r.describe()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_serves_the_status_page_and_its_data() {
    let mut c = Cluster::start(3, &[]).await;
    let http = c.http.clone();

    // The page: 200 text/html on every node, with nothing loaded from another place.
    let mut page = String::new();
    for id in c.ids() {
        let r = http.get(&format!("{}/", c.url(id))).await.unwrap();
        assert_eq!(r.status, 200, "node {id}: {}", r.describe());
        let ct = r.header("content-type").unwrap_or_default();
        assert!(ct.starts_with("text/html"), "node {id}: content-type {ct:?}");
        assert!(r.header("content-security-policy").is_some_and(|p| p.contains("default-src 'none'")));
        page = r.text();
        assert!(page.to_ascii_lowercase().starts_with("<!doctype html>"), "{}", truncate(&page, 200));
        for url in attribute_values(&page, "src").into_iter().chain(attribute_values(&page, "href")) {
            assert!(!url.contains("//"), "node {id}: the page loads {url:?} from elsewhere");
        }
        assert!(!page.contains("http://") && !page.contains("https://"), "node {id}: the page names another place");
        let head = http.request(hyper::Method::HEAD, &format!("{}/", c.url(id)), None, &[], REQUEST_TIMEOUT).await;
        assert_eq!(head.unwrap().status, 200, "node {id}: HEAD /");
    }

    // Every path the page fetches answers 200 JSON, on every node.
    let paths = fetched_paths(&page);
    assert!(
        paths.contains(&"/v1/cluster/nodes".to_string()) && paths.contains(&"/v1/streams".to_string()),
        "{paths:?}"
    );
    for id in c.ids() {
        for p in &paths {
            let r = http.get(&format!("{}{p}", c.url(id))).await.unwrap();
            assert_eq!(r.status, 200, "node {id} {p}: {}", r.describe());
            r.json();
        }
    }

    // A stream's last seq, and the followers caught up on the leader's view (lag 0).
    create_stream(&http, &c.url(1), "orders").await;
    let mut last_index = 0;
    for i in 0..5 {
        let r = http.post(&format!("{}/v1/streams/orders/batches", c.url(1)), Bytes::from(payload("s", i))).await;
        let r = r.unwrap();
        assert_eq!(r.status, 201, "{}", r.describe());
        last_index = r.json()["index"].as_u64().unwrap();
    }
    let leader = c.leader().await;
    let leader_url = c.url(leader);
    let streams: StreamList =
        serde_json::from_slice(&http.get(&format!("{leader_url}/v1/streams")).await.unwrap().body).unwrap();
    assert_eq!(streams.streams.iter().find(|s| s.name == "orders").map(|s| s.last_seq), Some(5));
    let follower = c.ids().into_iter().find(|i| *i != leader).unwrap();
    let view = wait_for(
        "every node reachable, and caught up in the leader's view",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || {
            let (http, url) = (http.clone(), c.url(follower));
            async move {
                let v = nodes_view(&http, &url).await?;
                let lv =
                    v.nodes.iter().find(|n| n.id == leader).and_then(|n| n.view.clone()).ok_or("no leader view")?;
                let caught_up = lv.members.iter().all(|m| m.lag_entries == Some(0));
                let all_applied =
                    v.nodes.iter().all(|n| n.view.as_ref().is_some_and(|w| w.applied_index >= last_index));
                match v.nodes.iter().all(|n| n.reachable) && caught_up && all_applied {
                    true => Ok(v),
                    false => Err(format!("{v:?}")),
                }
            }
        },
    )
    .await;
    assert_eq!(view.node_id, follower);
    assert_eq!(view.nodes.iter().map(|n| n.id).collect::<Vec<_>>(), vec![1, 2, 3]);
    for n in &view.nodes {
        let v = n.view.as_ref().unwrap();
        assert_eq!(v.node_id, n.id, "each node reports its own view");
        assert_eq!(n.addr, c.node(n.id).addr());
        assert!(n.error.is_none());
        // Only the leader knows the followers' lag.
        let lags: Vec<Option<u64>> = v.members.iter().map(|m| m.lag_entries).collect();
        if n.id == leader {
            assert!(lags.iter().all(Option::is_some), "{lags:?}");
        } else {
            assert!(lags.iter().all(Option::is_none), "{lags:?}");
        }
    }

    // A killed member is shown unreachable, with why, by every node still up; the rest still answer.
    let victim = c.ids().into_iter().find(|i| *i != leader && *i != follower).unwrap();
    c.kill_9(victim);
    for asker in [leader, follower] {
        let url = c.url(asker);
        let v =
            wait_for("the killed node shown unreachable", Duration::from_secs(10), Duration::from_millis(100), || {
                let (http, url) = (http.clone(), url.clone());
                async move {
                    let v = nodes_view(&http, &url).await?;
                    match v.nodes.iter().find(|n| n.id == victim) {
                        Some(n) if !n.reachable => Ok(v),
                        other => Err(format!("{other:?}")),
                    }
                }
            })
            .await;
        let dead = v.nodes.iter().find(|n| n.id == victim).unwrap();
        assert!(dead.view.is_none() && dead.error.as_deref().is_some_and(|e| !e.is_empty()), "{dead:?}");
        assert!(v.nodes.iter().filter(|n| n.id != victim).all(|n| n.reachable), "{v:?}");
    }
}
