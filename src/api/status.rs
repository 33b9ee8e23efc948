//! The status page: `GET /` serves one self-contained HTML page (`status.html`, inline CSS and
//! JS, no external asset, so it works offline) that shows the members, the leader, the term,
//! each node's commit and applied log index, each follower's lag and every stream's seqs,
//! retained bytes and retention, polling this node once a second; and `GET /v1/cluster/nodes`,
//! the one answer that gathers every member's own `GET /v1/cluster` for it.
//!
//! The page asks only the node that served it (no CORS, one origin, one TLS certificate to
//! trust): `GET /v1/cluster/nodes` and `GET /v1/streams`. This node asks each member in turn
//! for its own view, concurrently, within [`STATUS_PEER_MS`] each, over the nodes' own
//! connections (with peer TLS, its node certificate).
//!
//! Owns: the page's bytes and headers, and the gathering of the members' views. Must never:
//! change state or propose anything (it only reads: openraft's metrics, the members' read-only
//! `GET /v1/cluster`); put data in the page itself (the page is served without a token when
//! `--auth` is on, and everything it shows comes from endpoints that need one); carry a client's
//! token to another node (a member is asked as this node, after this node checked the token for
//! the same `read` grant); or wait on a member longer than [`STATUS_PEER_MS`].

use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::{cluster, json, AppState};
use crate::limits::{PEER_PROBE_BYTES_MAX, STATUS_PEER_MS};
use crate::wire::{ClusterView, NodeReport, NodesView};

/// The page, compiled into the binary.
const PAGE: &str = include_str!("status.html");

/// What the page may load and where it may connect: nothing but its own inline style and script,
/// and requests to the node that served it. A page that tried to load anything from elsewhere
/// would be stopped by the browser, so it works the same offline.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
     connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `GET /`: the status page, `200 text/html`, the same bytes on every node and with or without
/// `--auth` (it holds no data; it asks for a token when its requests are answered `401`).
#[utoipa::path(
    get,
    path = "/",
    operation_id = "status_page",
    summary = "The status page, for a browser",
    tag = "node",
    responses(
        (status = 200, description = "An HTML page with inline style and script that polls `GET /v1/cluster/nodes` and `GET /v1/streams` every second; no token needed", content_type = "text/html", body = String),
    )
)]
pub(super) async fn page() -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        PAGE,
    )
        .into_response()
}

/// `GET /v1/cluster/nodes`: [`NodesView`], each member of this node's configuration with its own
/// cluster view, or why it did not give one within [`STATUS_PEER_MS`]. This node's own view is
/// taken directly. Needs what `GET /v1/cluster` needs (with `--auth`, any `read` grant).
#[utoipa::path(
    get,
    path = "/v1/cluster/nodes",
    operation_id = "get_cluster_nodes",
    summary = "Every member's own view of the cluster, asked by this node",
    tag = "cluster",
    responses(
        (status = 200, description = "Each member of this node's configuration with its own `GET /v1/cluster`, or why it gave none within 800 ms", body = NodesView),
        super::openapi::AuthErrors,
    )
)]
pub(super) async fn nodes(State(s): State<AppState>) -> Response {
    let own = cluster::view_of(&s);
    let mut members: Vec<(u64, String)> = own.members.iter().map(|m| (m.id, m.addr.clone())).collect();
    if members.is_empty() {
        // Before the cluster formed: only this node, at no known address.
        members.push((s.node_id, String::new()));
    }
    let asks = members.into_iter().map(|(id, addr)| {
        let s = &s;
        let own = &own;
        async move {
            if id == s.node_id {
                return NodeReport { id, addr, reachable: true, error: None, view: Some(own.clone()) };
            }
            match ask(s, &addr).await {
                Ok(view) => NodeReport { id, addr, reachable: true, error: None, view: Some(view) },
                Err(why) => NodeReport { id, addr, reachable: false, error: Some(why), view: None },
            }
        }
    });
    let mut nodes = futures::future::join_all(asks).await;
    nodes.sort_by_key(|n| n.id);
    json(StatusCode::OK, &NodesView { node_id: s.node_id, nodes })
}

/// One member's `GET /v1/cluster`, asked as this node.
///
/// Errors: a text saying what failed: the connection, no answer within [`STATUS_PEER_MS`], a
/// status other than `200`, or an answer that is not a cluster view.
async fn ask(s: &AppState, addr: &str) -> Result<ClusterView, String> {
    let url = format!("http://{addr}/v1/cluster");
    let (status, body) =
        crate::net::get(&s.http, &url, Duration::from_millis(STATUS_PEER_MS), PEER_PROBE_BYTES_MAX).await?;
    if status != StatusCode::OK {
        let text = String::from_utf8_lossy(&body);
        return Err(format!("{url} answered {status}: {}", text.chars().take(200).collect::<String>()));
    }
    serde_json::from_slice(&body).map_err(|e| format!("{url} answered what is not a cluster view: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_nothing_from_elsewhere() {
        for needle in ["http://", "https://", "src=\"//", "href=\"//", "url(//", "@import"] {
            assert!(!PAGE.contains(needle), "the status page holds {needle:?}: it must work offline");
        }
        assert!(PAGE.starts_with("<!doctype html>"));
        // The page's data paths are the ones this module and the stream endpoints serve.
        assert!(PAGE.contains("/v1/cluster/nodes") && PAGE.contains("/v1/streams"));
    }
}
