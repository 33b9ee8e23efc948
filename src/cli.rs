//! Client commands of the `runnev` binary (SPEC §5): publish, subscribe, streams, status, and the
//! hand-over of `bench` to the benchmark's executable.
//! Output is JSON lines when stdout is piped and readable text on a terminal.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use base64::Engine;
use futures::StreamExt;
use runnev::client::{Client, CursorStore, Delivery, FileCursor};
use runnev::stream::Retention;

fn tty() -> bool {
    std::io::stdout().is_terminal()
}

/// `runnev publish STREAM [--seq N] [DATA | --file F | stdin]`.
pub async fn publish(
    client: &Client,
    stream: &str,
    seq: Option<u64>,
    data: Option<String>,
    file: Option<PathBuf>,
) -> Result<()> {
    let payload = match (data, file) {
        (Some(d), None) => d.into_bytes(),
        (None, Some(f)) => std::fs::read(&f).with_context(|| format!("reading {}", f.display()))?,
        (None, None) => {
            let mut buf = Vec::new();
            std::io::stdin().read_to_end(&mut buf).context("reading stdin")?;
            buf
        }
        (Some(_), Some(_)) => bail!("give the payload as DATA or --file, not both"),
    };
    let ack = client.publish(stream, seq, payload).await?;
    println!("{}", serde_json::to_string(&ack)?);
    Ok(())
}

/// `runnev subscribe STREAM [--after C] [--cursor-file F]`: prints each delivery, then (with a
/// cursor file) saves the cursor — after printing, so a crash repeats rather than loses.
pub async fn subscribe(client: &Client, stream: &str, after: Option<i64>, cursor_file: Option<PathBuf>) -> Result<()> {
    let store = cursor_file.map(FileCursor::new);
    let start = match (&store, after) {
        (_, Some(a)) => a.max(0) as u64,
        (Some(s), None) => s.load().context("loading the cursor")?,
        (None, None) => 0,
    };
    let pretty = tty();
    let mut out = std::io::stdout().lock();
    let mut sub = client.subscribe(stream, start);
    while let Some(item) = sub.next().await {
        let cursor = match item? {
            Delivery::Batch(b) => {
                if pretty {
                    writeln!(out, "seq {} (ts {}): {}", b.seq, b.ts, String::from_utf8_lossy(&b.data))?;
                } else {
                    let data = base64::engine::general_purpose::STANDARD.encode(&b.data);
                    writeln!(out, "{}", serde_json::json!({"seq": b.seq, "ts": b.ts, "data": data}))?;
                }
                b.seq
            }
            Delivery::Gap(g) => {
                if pretty {
                    writeln!(out, "GAP: seqs {}..={} were evicted by retention before they were read", g.from, g.to)?;
                } else {
                    writeln!(out, "{}", serde_json::json!({"gap": g}))?;
                }
                g.to
            }
        };
        out.flush()?;
        if let Some(s) = &store {
            s.save(cursor).context("saving the cursor")?;
        }
    }
    Ok(())
}

/// `runnev streams …`.
pub async fn streams(client: &Client, cmd: Option<super::StreamsCmd>) -> Result<()> {
    use super::StreamsCmd::*;
    match cmd.unwrap_or(List) {
        List => {
            let all = client.streams().await?;
            if tty() {
                println!(
                    "{:<32} {:>12} {:>12} {:>12} {:>10} {:>12}",
                    "STREAM", "FIRST_SEQ", "LAST_SEQ", "EVICTED", "BATCHES", "BYTES"
                );
                for s in all {
                    println!(
                        "{:<32} {:>12} {:>12} {:>12} {:>10} {:>12}",
                        s.name, s.first_seq, s.last_seq, s.evicted_through, s.batches, s.bytes
                    );
                }
            } else {
                for s in all {
                    println!("{}", serde_json::to_string(&s)?);
                }
            }
        }
        Create { name, max_batches, max_bytes, max_age_ms } => {
            let limits = [max_batches, max_bytes, max_age_ms];
            let retention =
                limits.iter().any(Option::is_some).then_some(Retention { max_batches, max_bytes, max_age_ms });
            let (info, created) = client.put_stream(&name, retention).await?;
            if tty() {
                println!("{} {}", if created { "created" } else { "updated" }, info.name);
            } else {
                println!("{}", serde_json::to_string(&info)?);
            }
        }
        Info { name } => println!("{}", serde_json::to_string_pretty(&client.stream(&name).await?)?),
        Delete { name } => {
            client.delete_stream(&name).await?;
            if tty() {
                println!("deleted {name}");
            }
        }
    }
    Ok(())
}

/// `runnev status`: every node's view of the cluster, as a table.
pub async fn status(client: &Client) -> Result<()> {
    let mut rows = Vec::new();
    for node in client.nodes() {
        rows.push((node.clone(), client.cluster_view(node).await));
    }
    if !tty() {
        for (node, v) in rows {
            // Through a JSON value: keys sorted, as this output has always been.
            let v = match v {
                Ok(view) => serde_json::to_value(view)?,
                Err(e) => serde_json::json!({"node": node, "error": e.to_string()}),
            };
            println!("{v}");
        }
        return Ok(());
    }
    println!(
        "{:<28} {:>4} {:>10} {:>7} {:>6} {:>10} {:>10}",
        "NODE", "ID", "STATE", "LEADER", "TERM", "COMMIT", "APPLIED"
    );
    for (node, v) in rows {
        match v {
            Ok(v) => println!(
                "{:<28} {:>4} {:>10} {:>7} {:>6} {:>10} {:>10}",
                node,
                v.node_id.to_string(),
                v.state,
                v.leader_id.map_or_else(|| "null".to_string(), |l| l.to_string()),
                v.term.to_string(),
                v.commit_index.to_string(),
                v.applied_index.to_string()
            ),
            Err(e) => println!("{node:<28} unreachable: {e}"),
        }
    }
    Ok(())
}

/// The benchmark's executable, which `runnev bench` runs.
const BENCH_EXE: &str = "runnev-bench";

/// `runnev bench ARGS`: replaces this process with `runnev-bench ARGS` (the benchmark is not
/// linked into `runnev`), found beside this executable, else on `PATH`. It learns this
/// executable's path from `RUNNEV_EXE`, to start `runnev serve` nodes of the same build.
/// Returns only on failure: the error says how to build it when it is missing.
pub fn bench(args: Vec<std::ffi::OsString>) -> anyhow::Error {
    use std::os::unix::process::CommandExt;
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return anyhow::anyhow!("finding this executable: {e}"),
    };
    let beside = exe.with_file_name(BENCH_EXE);
    let on_path = || {
        std::env::var_os("PATH")
            .and_then(|paths| std::env::split_paths(&paths).map(|d| d.join(BENCH_EXE)).find(|p| p.is_file()))
    };
    let Some(bench) = Some(beside.clone()).filter(|p| p.is_file()).or_else(on_path) else {
        return anyhow::anyhow!(
            "`runnev bench` runs {BENCH_EXE}, which is neither at {} nor on PATH; build it with \
             `cargo build --release -p runnev-bench` (or `cargo build -p runnev-bench` for a debug \
             runnev; plain `cargo build` at the repository root builds both)",
            beside.display()
        );
    };
    // runnev-bench reads it as its cluster::RUNNEV_EXE_ENV.
    let err = std::process::Command::new(&bench).args(args).env("RUNNEV_EXE", &exe).exec();
    anyhow::anyhow!("running {}: {err}", bench.display())
}

/// `runnev probe URL`: succeeds when URL answers 2xx in time (for health checks in images that
/// have no curl).
pub async fn probe(url: &str, timeout: Duration) -> Result<()> {
    let http = runnev::net::http_client(std::sync::Arc::new(runnev::net::TcpDialer));
    match runnev::net::get(&http, url, timeout, runnev::limits::CLI_PROBE_BYTES_MAX).await {
        Ok((status, _)) if status.is_success() => Ok(()),
        Ok((status, _)) => bail!("{url} answered {status}"),
        Err(e) => bail!("{e}"),
    }
}
