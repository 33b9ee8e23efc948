//! The process's log output: which lines are written (the `RUST_LOG` filter and two filters of
//! openraft's noise), and how (readable text, or one JSON object per line for log pipelines).
//!
//! Owns: the `tracing` subscriber of every `runnev` command and of `runnev-bench`, and the
//! context added to each JSON line (the node id and its current Raft term). Must never: decide
//! what a module logs (each logs its own events through `tracing`), or write a secret (no token
//! or key passes through here; the request span holds only the request id, method and route).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::limits::LOG_REPEAT_MS;

/// How log lines are written (`--log-format`, `RUNNEV_LOG_FORMAT`).
///
/// `Json` is tracing-subscriber's JSON format, one object per line: `timestamp` (RFC 3339,
/// UTC), `level`, `target`, `fields` (with `message`), `span` (the innermost span's fields, e.g.
/// `{"name": "request", "id": "n1-42", "method", "route"}`), and, in `runnev serve`, `node` (the
/// node id) and `term` (its current Raft term, Raft paper §5.1, as last seen).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Readable lines (coloured on a terminal).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The log filter when `RUST_LOG` is not set: Runnev's own info lines, openraft's warnings.
pub const LOG_DEFAULT: &str = "info,openraft=warn";

static NODE: OnceLock<u64> = OnceLock::new();
static TERM: AtomicU64 = AtomicU64::new(0);

/// Names the node this process serves, so every JSON line carries `"node": id`. Set once by
/// `runnev serve`; a second call is ignored (one node per process).
pub fn set_node(id: u64) {
    let _ = NODE.set(id);
}

/// Records the node's current Raft term for the JSON lines' `"term"`. Called by the node as
/// its Raft metrics change; only read when a line is written (never by the simulation's
/// checks, so the simulation's many nodes in one process may all call it).
pub fn set_term(term: u64) {
    TERM.store(term, Ordering::Relaxed);
}

/// [`init_with`] with the default filter: for `runnev serve`, the other long-running commands
/// and `runnev-bench`.
pub fn init(format: LogFormat) {
    init_with(format, LOG_DEFAULT);
}

/// Installs this process's `tracing` subscriber on stderr, filtered by `RUST_LOG`, else by
/// `default` (`warn` for the client commands, whose own output is on stdout).
///
/// One warning of openraft is always dropped: "A message will be ignored because vote changed".
/// openraft 0.9.25 logs it (`RaftCore::does_vote_match`, at WARN) whenever a vote response
/// arrives at a node that is no longer the candidate it was sent for, and for the response it
/// sends itself after saving any vote it did not cast for itself: on every election, at every
/// follower, it is the normal course of Raft (Raft paper §5.2), not a fault. Runnev's own
/// formation makes it certain at every first start, as every node initialises and campaigns at
/// term 1 at once. openraft offers no way to lower it to debug, so it is filtered out at its one
/// call site; the election itself is still logged at info by openraft (`RUST_LOG=openraft=info`).
/// Repeated replication errors are thinned out as well (`is_repeated_replication_error`).
pub fn init_with(format: LogFormat, default: &str) {
    use tracing_subscriber::filter::{dynamic_filter_fn, filter_fn, FilterExt};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let env = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let filter = env
        .and(filter_fn(|meta| !is_benign_vote_race(meta)))
        // Dynamic: a plain `filter_fn` is asked once per call site and its answer cached.
        .and(dynamic_filter_fn(|meta, _| !is_repeated_replication_error(meta)));
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let layer = match format {
        LogFormat::Text => layer.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).boxed(),
        LogFormat::Json => layer
            .json()
            .event_format(WithNode(
                tracing_subscriber::fmt::format().json().with_current_span(true).with_span_list(false),
            ))
            .boxed(),
    };
    tracing_subscriber::registry().with(layer.with_filter(filter)).init();
}

/// A JSON event format that adds `node` and `term` to the object the inner format wrote.
struct WithNode<F>(F);

impl<S, N, F> FormatEvent<S, N> for WithNode<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> std::fmt::Result {
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        let Some(node) = NODE.get() else {
            return writer.write_str(&line);
        };
        match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(line.trim_end()) {
            Ok(mut object) => {
                object.insert("node".into(), (*node).into());
                object.insert("term".into(), TERM.load(Ordering::Relaxed).into());
                writeln!(writer, "{}", serde_json::Value::Object(object))
            }
            // Not an object (it always is): the line as the inner format wrote it.
            Err(_) => writer.write_str(&line),
        }
    }
}

/// The targets of openraft's replication: its replication tasks, and the leader's handling of
/// their results ("update progress error", "heartbeat error").
const REPLICATION_TARGETS: [&str; 2] = ["openraft::replication", "openraft::engine::handler::replication_handler"];

/// Whether `meta` is a warning or error of openraft's replication ([`REPLICATION_TARGETS`]: a
/// follower that cannot be reached, or refuses, is reported on every retry, several times a
/// second, at error level) whose call site already logged within [`LOG_REPEAT_MS`]: the first line of each kind is kept,
/// and what is dropped is counted in `runnev_log_lines_suppressed_total`. Runnev's own lines say
/// when a node's state changes (its disk is low, its Raft core stopped).
fn is_repeated_replication_error(meta: &tracing::Metadata<'_>) -> bool {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};
    static LAST: OnceLock<Mutex<HashMap<tracing::callsite::Identifier, Instant>>> = OnceLock::new();
    if *meta.level() > tracing::Level::WARN
        || !REPLICATION_TARGETS.iter().any(|t| meta.target().starts_with(t))
        || !meta.is_event()
    {
        return false;
    }
    let site = meta.callsite();
    let mut last = LAST.get_or_init(Mutex::default).lock().unwrap_or_else(|p| p.into_inner());
    let now = Instant::now();
    match last.get(&site) {
        Some(t) if now.duration_since(*t) < Duration::from_millis(LOG_REPEAT_MS) => {
            metrics::counter!("runnev_log_lines_suppressed_total").increment(1);
            true
        }
        _ => {
            last.insert(site, now);
            false
        }
    }
}

/// Whether `meta` is openraft 0.9.25's "message will be ignored because vote changed" warning
/// (see [`init_with`]); openraft is pinned to that exact version, so its call site is too.
fn is_benign_vote_race(meta: &tracing::Metadata<'_>) -> bool {
    *meta.level() == tracing::Level::WARN
        && meta.target() == "openraft::core::raft_core"
        && meta.file().is_some_and(|f| f.ends_with("raft_core.rs"))
        && meta.line() == Some(1553)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::Layer;

    /// A writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// openraft's leader logs "update progress error" on every failed append, and a follower that
    /// refuses for good made it thousands of lines a second (a fresh user's trial: 30 MB in
    /// 13 s): each replication call site, of both targets, logs once per [`LOG_REPEAT_MS`];
    /// other warnings are kept.
    #[test]
    fn repeated_replication_warnings_are_thinned_out() {
        let out = Lines::default();
        let writer = out.clone();
        let layer = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .with_filter(tracing_subscriber::filter::dynamic_filter_fn(|meta, _| !is_repeated_replication_error(meta)));
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
            for _ in 0..100 {
                tracing::warn!(target: "openraft::engine::handler::replication_handler", "update progress error");
                tracing::error!(target: "openraft::replication", "RPCError");
                tracing::warn!(target: "openraft::core", "another warning");
            }
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.matches("update progress error").count(), 1, "{text}");
        assert_eq!(text.matches("RPCError").count(), 1, "{text}");
        assert_eq!(text.matches("another warning").count(), 100);
    }
}
