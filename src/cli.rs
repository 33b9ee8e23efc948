//! Client commands of the `runnev` binary (SPEC §5): publish, subscribe, streams, status,
//! cluster, the hand-over of `bench` to the benchmark's executable, and the exit statuses every
//! command ends with.
//!
//! Output is JSON lines when stdout is not a terminal and readable text on one (`--output`
//! chooses); notes for people (reconnections, "already deleted") go to stderr. Errors are
//! printed in words, never as the server's raw JSON, and end the process with an [`Exit`] status
//! that says what kind of failure it was.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use futures::StreamExt;
use runnev::client::{
    Client, ClientError, Connection, CursorStore, Deleted, Delivery, FileCursor, RetryPolicy, SubscribeOptions,
};
use runnev::stream::Retention;
use runnev::units::{format_bytes, format_duration, Limit};
use runnev::wire::{ClusterView, StreamInfo};
use tokio_util::task::AbortOnDropHandle;

use super::{ClusterCmd, RetentionArgs, StreamsCmd};

/// How a command prints its results (`--output`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Readable text, for people.
    Text,
    /// One JSON document per line, for programs.
    Json,
}

impl Output {
    /// Text when stdout is a terminal, JSON otherwise.
    pub fn detect() -> Output {
        if std::io::stdout().is_terminal() {
            Output::Text
        } else {
            Output::Json
        }
    }
}

/// The exit status of `runnev`, by kind of failure (listed by `runnev --help` and docs/cli.md).
/// Usage errors found by clap exit with clap's own status, 2, which [`Exit::Usage`] reuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The command did what it was asked.
    Success = 0,
    /// A local problem: a file that cannot be read or written, a node that cannot start or whose
    /// Raft core stopped (`serve` exits so for its supervisor to restart it).
    Local = 1,
    /// The command line is wrong (clap's status for its own usage errors), or its TLS settings
    /// do not fit the cluster ([`ClientError::Tls`]).
    Usage = 2,
    /// No node answered at all: nothing listens at the `--nodes` given.
    Unreachable = 3,
    /// The cluster answered with a `4xx` error: retrying the same request cannot help.
    Refused = 4,
    /// A publish without a seq may or may not have been stored.
    Unknown = 5,
    /// Nodes answered, but none could take the request in time (no leader, not ready, `5xx`).
    Unavailable = 6,
}

impl Exit {
    /// Every status, in order.
    pub const ALL: [Exit; 7] =
        [Exit::Success, Exit::Local, Exit::Usage, Exit::Unreachable, Exit::Refused, Exit::Unknown, Exit::Unavailable];

    /// The status's line in `runnev --help`.
    pub fn summary(self) -> &'static str {
        match self {
            Exit::Success => "success",
            Exit::Local => "a local problem: a file that cannot be read or written, a node that cannot start or whose Raft core stopped",
            Exit::Usage => {
                "usage: an unknown command or flag, a value that does not parse, or TLS settings (--ca-file, --nodes) that do not fit the cluster"
            }
            Exit::Unreachable => "unreachable: no Runnev node answered at the --nodes given",
            Exit::Refused => "refused: the cluster answered with an error (its code and message are printed)",
            Exit::Unknown => "unknown outcome: a publish without --seq may or may not have been stored",
            Exit::Unavailable => {
                "unavailable: nodes answered, but none could take the request in time (no leader, not ready)"
            }
        }
    }
}

/// A failure of the command line with its own exit status.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CliError {
    /// The status to exit with.
    pub exit: Exit,
    /// What went wrong, and what to do.
    pub message: String,
}

/// A usage error found after clap (a flag in the wrong place, a missing flag).
pub fn usage(message: &str) -> anyhow::Error {
    CliError { exit: Exit::Usage, message: message.to_string() }.into()
}

/// The exit status of a client error.
fn exit_of_client(e: &ClientError) -> Exit {
    match e {
        ClientError::Api { status, .. } if (400..500).contains(status) => Exit::Refused,
        ClientError::Api { .. } => Exit::Unavailable,
        ClientError::OutcomeUnknown(_) => Exit::Unknown,
        ClientError::Unreachable { .. } => Exit::Unreachable,
        ClientError::Unavailable { .. } => Exit::Unavailable,
        ClientError::InvalidStreamName(_) | ClientError::Config(_) | ClientError::Tls { .. } => Exit::Usage,
        _ => Exit::Local,
    }
}

/// The exit status of a failed command: the first cause that says, else [`Exit::Local`].
pub fn exit_of(e: &anyhow::Error) -> Exit {
    for cause in e.chain() {
        if let Some(c) = cause.downcast_ref::<CliError>() {
            return c.exit;
        }
        if let Some(c) = cause.downcast_ref::<ClientError>() {
            return exit_of_client(c);
        }
    }
    Exit::Local
}

/// The error in one line: its causes joined by `: `, a cause whose text is already there left
/// out (an error that embeds its source's text would otherwise print it twice), a refusal
/// introduced as such.
pub fn message(e: &anyhow::Error, exit: Exit) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    match exit {
        Exit::Refused => format!("refused by the cluster: {out}"),
        _ => out,
    }
}

/// `runnev serve`'s error when its store cannot be opened: one sentence for a data dir that
/// another process holds.
pub fn store_open_error(dir: &Path, e: runnev::storage::StoreError) -> anyhow::Error {
    match e {
        runnev::storage::StoreError::Db(redb::Error::DatabaseAlreadyOpen) => anyhow!(
            "the data dir {} is in use: another runnev process holds the lock on its database {}; stop that \
             process, or give this node a data dir of its own",
            dir.display(),
            runnev::storage::layout::group_dir(dir, runnev::storage::layout::GroupId::CLUSTER)
                .join(runnev::storage::db_dir::DB_FILE)
                .display()
        ),
        e => anyhow::Error::new(e).context(format!("opening the data dir {}", dir.display())),
    }
}

/// Writes one line to stdout (an error, such as a closed pipe, ends the command).
/// Writes a line to stderr (notes, progress, errors), ignoring a failure: a closed stderr must
/// not stop a command (`eprintln!` panics then, exit 101, as `runnev subscribe … 2>&1 | head`
/// showed in a fresh user's trial), and there is nowhere left to report it.
pub fn note(line: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

fn say(line: impl std::fmt::Display) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// A `404 stream_not_found` with the command line's way to create the stream, instead of the
/// HTTP API's.
fn with_hint(stream: &str, e: ClientError) -> ClientError {
    match e {
        ClientError::Api { status, code, frame, .. } if code == "stream_not_found" => ClientError::Api {
            status,
            code,
            message: format!("stream {stream:?} does not exist; create it with `runnev streams create {stream}`"),
            frame,
        },
        e => e,
    }
}

/// `runnev publish STREAM [--seq N] [--frames] [DATA | --file F | stdin]`.
pub async fn publish(
    client: &Client,
    output: Output,
    stream: &str,
    seq: Option<u64>,
    frames: bool,
    data: Option<String>,
    file: Option<PathBuf>,
) -> Result<()> {
    let payload = read_payload(data, file, std::io::stdin().lock())?;
    if frames {
        return publish_lines(client, output, stream, seq, &payload).await;
    }
    let ack = client.publish(stream, seq, payload).await.map_err(|e| with_hint(stream, e))?;
    match output {
        Output::Json => say(serde_json::to_string(&ack)?),
        Output::Text if ack.duplicate => say(format_args!(
            "seq {} was already in {stream}: a duplicate, stored once (log index {})",
            ack.seq, ack.index
        )),
        Output::Text => say(format_args!("published seq {} to {stream} (log index {})", ack.seq, ack.index)),
    }
}

/// The payload `runnev publish` sends: DATA as given, else the file `--file` names, else all of
/// `stdin`. A DATA or `--file` of `-` means stdin, as for most command lines (a payload that is
/// the one byte `-` is sent with `--file` of a file holding it, or through stdin).
///
/// Errors: the file or stdin cannot be read.
pub fn read_payload(data: Option<String>, file: Option<PathBuf>, mut stdin: impl Read) -> Result<Vec<u8>> {
    // A `-` names stdin, the source when neither is given (clap refuses both at once).
    let data = data.filter(|d| d != "-");
    let file = file.filter(|f| f.as_os_str() != "-");
    match (data, file) {
        (Some(d), _) => Ok(d.into_bytes()),
        (None, Some(f)) => std::fs::read(&f).with_context(|| format!("reading {}", f.display())),
        (None, None) => {
            let mut buf = Vec::new();
            stdin.read_to_end(&mut buf).context("reading stdin")?;
            Ok(buf)
        }
    }
}

/// The lines of `input`, one batch each, as `BufRead::lines` splits them: at `\n`, a `\r`
/// before it dropped, and no empty batch after a final newline. An empty line is an empty batch.
pub fn split_lines(input: &[u8]) -> Vec<&[u8]> {
    let body = input.strip_suffix(b"\n").unwrap_or(input);
    if input.is_empty() {
        return Vec::new();
    }
    body.split(|b| *b == b'\n').map(|l| l.strip_suffix(b"\r").unwrap_or(l)).collect()
}

/// Groups `lines` into requests of at most [`runnev::limits::FRAMES_PER_APPEND_MAX`] frames
/// and, past its first frame, at most `max_bytes` of body (frame headers included): the
/// `(start, end)` line ranges, in order.
pub fn requests_of(lines: &[&[u8]], max_bytes: usize) -> Vec<(usize, usize)> {
    use runnev::limits::{FRAMES_PER_APPEND_MAX, FRAME_HEADER_BYTES};
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0usize);
    for (i, line) in lines.iter().enumerate() {
        let b = line.len().saturating_add(FRAME_HEADER_BYTES);
        if i > start && (i - start >= FRAMES_PER_APPEND_MAX || bytes.saturating_add(b) > max_bytes) {
            out.push((start, i));
            (start, bytes) = (i, 0);
        }
        bytes = bytes.saturating_add(b);
    }
    if start < lines.len() {
        out.push((start, lines.len()));
    }
    out
}

/// `runnev publish STREAM --frames`: each line a batch, sent as frames (SPEC §6) in as few
/// requests as the default limits allow (10 000 frames, 8 MiB each); each request is one Raft
/// entry, all or none, and prints its answer. With `--seq N` line i gets seq N + i, so the same
/// command run again answers `duplicate` for what was stored.
async fn publish_lines(client: &Client, output: Output, stream: &str, seq: Option<u64>, input: &[u8]) -> Result<()> {
    let lines = split_lines(input);
    if lines.is_empty() {
        return Err(usage("--frames: the input has no line to publish"));
    }
    for (start, end) in requests_of(&lines, runnev::limits::APPEND_BYTES_DEFAULT) {
        let first = match seq {
            Some(n) => Some(n.checked_add(start as u64).ok_or_else(|| usage("--seq plus the line count passes 2^64"))?),
            None => None,
        };
        let ack = client.publish_many(stream, first, &lines[start..end]).await.map_err(|e| {
            let done = if start == 0 {
                "nothing was published".to_string()
            } else {
                format!("lines 1 to {start} were published, the rest not")
            };
            anyhow::Error::new(with_hint(stream, e)).context(format!("publishing lines {} to {end}: {done}", start + 1))
        })?;
        match output {
            Output::Json => say(serde_json::to_string(&ack)?)?,
            Output::Text if ack.duplicate => say(format_args!(
                "seqs {}..={} were already in {stream}: {} duplicates, stored once (log index {})",
                ack.first_seq, ack.last_seq, ack.count, ack.index
            ))?,
            Output::Text => say(format_args!(
                "published {} batches, seqs {}..={}, to {stream} (log index {})",
                ack.count, ack.first_seq, ack.last_seq, ack.index
            ))?,
        }
    }
    Ok(())
}

/// `runnev subscribe STREAM [--after C] [--cursor-file F] [--max-outage D]`: prints each
/// delivery, then (with a cursor file) saves the cursor — after printing, so a crash repeats
/// rather than loses. Retries without end (each reconnection noted on stderr) unless
/// `max_outage` is given.
pub async fn subscribe(
    client: &Client,
    output: Output,
    stream: &str,
    after: Option<u64>,
    cursor_file: Option<PathBuf>,
    max_outage: Option<Duration>,
) -> Result<()> {
    let store = cursor_file.map(FileCursor::new);
    let start = match (&store, after) {
        (_, Some(a)) => a,
        (Some(s), None) => s.load().context("loading the cursor")?,
        (None, None) => 0,
    };
    // Whether a failure was noted since the last connection (then the reconnection is noted too).
    let troubled = Arc::new(AtomicBool::new(false));
    let hook = {
        let troubled = troubled.clone();
        move |c: &Connection| match c {
            Connection::Lost { why } => {
                troubled.store(true, Ordering::Relaxed);
                note(format_args!("runnev: subscription connection lost ({why}); reconnecting"));
            }
            Connection::Failed { why, outage, retry_in } => {
                troubled.store(true, Ordering::Relaxed);
                note(format_args!(
                    "runnev: no connection for {} ({why}); retrying in {}",
                    format_duration(*outage),
                    format_duration(*retry_in)
                ));
            }
            Connection::Connected { node, outage } => {
                if troubled.swap(false, Ordering::Relaxed) {
                    note(format_args!(
                        "runnev: subscribed again at {node} after {} without a connection",
                        format_duration(*outage)
                    ));
                }
            }
        }
    };
    let options = SubscribeOptions { max_outage, on_connection: Some(Arc::new(hook)) };
    // Beside the subscription, never in its way: an outage makes it give up after a few seconds.
    let ahead_check = (start > 0).then(|| {
        let (client, stream) = (client.clone(), stream.to_string());
        tokio::spawn(async move {
            let info = tokio::time::timeout(CURSOR_AHEAD_CHECK, client.stream(&stream)).await;
            if let Some(line) =
                info.ok().and_then(Result::ok).and_then(|i| cursor_ahead_note(&stream, start, i.last_seq))
            {
                note(format_args!("{line}"));
            }
        })
    });
    let _abort_on_exit = ahead_check.map(AbortOnDropHandle::new);
    let mut sub = client.subscribe_with(stream, start, options);
    let mut out = std::io::stdout().lock();
    while let Some(item) = sub.next().await {
        let delivery = match item {
            Ok(d) => d,
            Err(e @ (ClientError::Unreachable { after, .. } | ClientError::Unavailable { after, .. }))
                if max_outage.is_none_or(|max| after < max) =>
            {
                // Reported every 30 s of an outage; the subscription keeps trying.
                note(format_args!("runnev: {e}; still trying"));
                continue;
            }
            Err(e) => return Err(with_hint(stream, e).into()),
        };
        let cursor = match delivery {
            Delivery::Batch(b) => {
                if output == Output::Text {
                    writeln!(out, "seq {} (ts {}): {}", b.seq, b.ts, String::from_utf8_lossy(&b.data))?;
                } else {
                    // The wire's own shape, in its order (docs/cli.md): seq, ts, data.
                    let line = runnev::wire::BatchBody::encode(b.seq, b.ts, &b.data);
                    writeln!(out, "{}", serde_json::to_string(&line)?)?;
                }
                b.seq
            }
            Delivery::Gap(g) => {
                if output == Output::Text {
                    writeln!(
                        out,
                        "GAP: seqs {}..={} were evicted (by retention, or by a deletion of the stream) before they were read",
                        g.from, g.to
                    )?;
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

/// How long `runnev subscribe` waits for the stream's info to check its cursor against
/// ([`cursor_ahead_note`]) before it does without the check.
const CURSOR_AHEAD_CHECK: Duration = Duration::from_secs(5);

/// The note `runnev subscribe` prints on stderr when its starting cursor `start` is past the
/// stream's `last_seq` as one node reports it, `None` otherwise. The subscription waits for
/// batches after the cursor either way (SPEC §2.6: a cursor ahead is not an error); the note
/// says why nothing may come: after a restore from a backup the rebuilt cluster hands out the
/// seqs past its cut again, and a consumer ahead of them would dedupe those batches away
/// (docs/operations.md, "Restoring into a new cluster").
fn cursor_ahead_note(stream: &str, start: u64, last_seq: u64) -> Option<String> {
    (start > last_seq).then(|| {
        format!(
            "runnev: the cursor {start} is past the last seq of stream {stream}, {last_seq}; waiting for batches after {start}. \
             That is expected only when publishers set their own seqs and skip ahead; after a restore from a \
             backup, set the cursor back to {last_seq} (docs/operations.md, \"Restoring into a new cluster\")"
        )
    })
}

/// A stream's retention in words: `max batches 100000, max age 7days`, or `none`.
fn retention_text(r: &Retention) -> String {
    let mut parts = Vec::new();
    if let Some(n) = r.max_batches {
        parts.push(format!("max batches {n}"));
    }
    if let Some(n) = r.max_bytes {
        parts.push(format!("max bytes {}", format_bytes(n)));
    }
    if let Some(ms) = r.max_age_ms {
        parts.push(format!("max age {}", format_duration(Duration::from_millis(ms))));
    }
    if parts.is_empty() {
        "none (everything is kept)".to_string()
    } else {
        parts.join(", ")
    }
}

/// Applies the flags to `base`: a flag given sets (or, with `none`, clears) its limit; the rest
/// of `base` stays. `None` when no flag was given.
fn retention_from(args: &RetentionArgs, base: Retention) -> Option<Retention> {
    let age = match (args.max_age, args.max_age_ms) {
        (Some(l), _) => Some(match l {
            Limit::Set(d) => Limit::Set(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            Limit::Unset => Limit::Unset,
        }),
        (None, Some(ms)) => Some(Limit::Set(ms)),
        (None, None) => None,
    };
    if args.max_batches.is_none() && args.max_bytes.is_none() && age.is_none() {
        return None;
    }
    let pick = |flag: Option<Limit<u64>>, old: Option<u64>| flag.map_or(old, Limit::into_option);
    Some(Retention {
        max_batches: pick(args.max_batches, base.max_batches),
        max_bytes: pick(args.max_bytes, base.max_bytes),
        max_age_ms: pick(age, base.max_age_ms),
    })
}

fn print_info(output: Output, verb: Option<&str>, info: &StreamInfo) -> Result<()> {
    if output == Output::Json {
        return say(serde_json::to_string(info)?);
    }
    if let Some(verb) = verb {
        return say(format_args!("{verb} {} (retention: {})", info.name, retention_text(&info.retention)));
    }
    let evicted =
        if info.evicted_through == 0 { "nothing".to_string() } else { format!("seqs up to {}", info.evicted_through) };
    say(format_args!(
        "stream     {}\nfirst seq  {}\nlast seq   {}\nevicted    {evicted}\nbatches    {}\nbytes      {} ({} bytes)\nretention  {}",
        info.name,
        info.first_seq,
        info.last_seq,
        info.batches,
        format_bytes(info.bytes),
        info.bytes,
        retention_text(&info.retention)
    ))
}

/// `runnev streams …`.
pub async fn streams(client: &Client, output: Output, cmd: Option<StreamsCmd>) -> Result<()> {
    use StreamsCmd::*;
    match cmd.unwrap_or(List) {
        List => {
            let all = client.streams().await?;
            if output == Output::Json {
                for s in all {
                    say(serde_json::to_string(&s)?)?;
                }
                return Ok(());
            }
            say(format_args!(
                "{:<32} {:>10} {:>10} {:>10} {:>10} {:>12}  RETENTION",
                "STREAM", "FIRST_SEQ", "LAST_SEQ", "EVICTED", "BATCHES", "BYTES"
            ))?;
            for s in all {
                say(format_args!(
                    "{:<32} {:>10} {:>10} {:>10} {:>10} {:>12}  {}",
                    s.name,
                    s.first_seq,
                    s.last_seq,
                    s.evicted_through,
                    s.batches,
                    format_bytes(s.bytes),
                    retention_text(&s.retention)
                ))?;
            }
            Ok(())
        }
        Create { name, retention } => {
            let (info, created) = client.put_stream(&name, retention_from(&retention, Retention::default())).await?;
            print_info(output, Some(if created { "created" } else { "updated" }), &info)
        }
        Set { name, retention } => {
            if retention_from(&retention, Retention::default()).is_none() {
                return Err(usage("give a limit to change: --max-batches, --max-bytes or --max-age (none clears one)"));
            }
            let current = client.stream(&name).await.map_err(|e| with_hint(&name, e))?;
            let wanted = retention_from(&retention, current.retention);
            // The stream may be deleted between the read and the write; the PUT would then create
            // it again, which `set` must not do. The window is one round trip of an admin command.
            let (info, created) = client.put_stream(&name, wanted).await?;
            if created {
                note(format_args!(
                    "runnev: note: {name} was deleted meanwhile and has been created again with this retention"
                ));
            }
            print_info(output, Some("updated"), &info)
        }
        Info { name } => print_info(output, None, &client.stream(&name).await.map_err(|e| with_hint(&name, e))?),
        Delete { name } => {
            let deleted = client.delete_stream(&name).await.map_err(|e| match e {
                ClientError::Api { status, code, frame, .. } if code == "stream_not_found" => ClientError::Api {
                    status,
                    code,
                    message: format!("stream {name:?} does not exist (nothing to delete)"),
                    frame,
                },
                e => e,
            })?;
            if deleted == Deleted::Already {
                note(format_args!(
                    "runnev: note: {name} is gone: the first attempt's answer was lost and the retry found no \
                     stream, so that attempt deleted it (already deleted)"
                ));
            }
            match output {
                Output::Json => say(serde_json::json!({"deleted": name, "already": deleted == Deleted::Already})),
                Output::Text if deleted == Deleted::Already => say(format_args!("deleted {name} (already deleted)")),
                Output::Text => say(format_args!("deleted {name}")),
            }
        }
    }
}

/// `runnev backup FILE`: streams a backup from the leader to `FILE.partial`, checks the whole
/// file, then renames it to `FILE`; a file that does not check out is removed and the command
/// fails (exit 1), so `FILE` only ever names a complete backup. Prints what it holds and how
/// fast it came (MB/s, 10^6 bytes a second).
pub async fn backup(client: &Client, output: Output, file: &Path) -> Result<()> {
    let started = Instant::now();
    // Refused before the cluster is asked (it used to fail at the rename, the whole backup
    // taken and its `.partial` left behind).
    if file.is_dir() {
        bail!(
            "{} is a directory: give the backup file's path, e.g. {}",
            file.display(),
            file.join("cluster.backup").display()
        );
    }
    let partial = PathBuf::from(format!("{}.partial", file.display()));
    // Mode 0600: a backup holds every stream's payloads and the tokens' names, grants and salted
    // hashes (it was written 0644 under the usual umask). A partial file left by an older run
    // is removed first, so that it cannot lend the new one its mode.
    let _ = std::fs::remove_file(&partial);
    let mut out = tokio::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&partial)
        .await
        .with_context(|| format!("creating {}", partial.display()))?;
    let sent = client.backup(&mut out).await;
    let synced = out.sync_all().await;
    drop(out);
    let (node, _) = match (sent, synced) {
        (Ok(got), Ok(())) => got,
        (Err(e), _) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e.into());
        }
        (_, Err(e)) => {
            let _ = std::fs::remove_file(&partial);
            return Err(anyhow!("writing {}: {e}", partial.display()));
        }
    };
    let checked = partial.clone();
    let info = match tokio::task::spawn_blocking(move || runnev::storage::backup::check(&checked)).await? {
        Ok(info) => info,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            bail!("the backup from {node} did not check out, nothing kept: {e}");
        }
    };
    if let Err(e) = std::fs::rename(&partial, file) {
        let _ = std::fs::remove_file(&partial);
        bail!("renaming {} to {}: {e}; nothing kept", partial.display(), file.display());
    }
    let secs = started.elapsed().as_secs_f64();
    let mbps = info.bytes as f64 / 1e6 / secs.max(1e-9);
    match output {
        Output::Json => say(serde_json::json!({
            "file": file.display().to_string(), "node": node, "log_index": info.log_index, "term": info.term,
            "streams": info.streams, "batches": info.batches, "bytes": info.bytes, "seconds": secs, "mb_per_s": mbps,
        })),
        Output::Text => say(format_args!(
            "backup of {node} at log index {} saved to {}: {} streams, {} batches, {} in {} ({mbps:.1} MB/s)",
            info.log_index.unwrap_or(0),
            file.display(),
            info.streams,
            info.batches,
            format_bytes(info.bytes),
            format_duration(started.elapsed()),
        )),
    }
}

/// `runnev restore`: lays out a fresh data directory for node `id` of a new cluster from a
/// backup file, after checking the whole file; prints what it holds and how fast it went.
pub async fn restore(
    from: &Path,
    data_dir: &Path,
    id: u64,
    peers: &std::collections::BTreeMap<u64, String>,
) -> Result<()> {
    let started = Instant::now();
    let (from_c, dir_c, peers_c) = (from.to_path_buf(), data_dir.to_path_buf(), peers.clone());
    let info = tokio::task::spawn_blocking(move || runnev::storage::backup::restore(&from_c, &dir_c, id, &peers_c))
        .await?
        .map_err(|e| anyhow!("restoring {} into {}: {e}", from.display(), data_dir.display()))?;
    let mbps = info.bytes as f64 / 1e6 / started.elapsed().as_secs_f64().max(1e-9);
    say(format_args!(
        "node {id}: {} restored from {} (log index {}): {} streams, {} batches, {} in {} ({mbps:.1} MB/s); start it \
         with runnev serve --id {id} --data-dir {} --listen {} --peers {} and the TLS and token flags of the \
         new cluster (the backup's tokens, the admin's included, are the new cluster's)",
        data_dir.display(),
        from.display(),
        info.log_index.unwrap_or(0),
        info.streams,
        info.batches,
        format_bytes(info.bytes),
        format_duration(started.elapsed()),
        data_dir.display(),
        peers.get(&id).map_or("HOST:PORT", String::as_str),
        peers.iter().map(|(n, a)| format!("{n}={a}")).collect::<Vec<_>>().join(","),
    ))
}

/// `runnev status`: every node's view of the cluster. Fails with [`ClientError::Unreachable`]
/// (exit 3) when no node answers.
/// `runnev auth token create`: prints the token (text) or the answer (JSON).
pub async fn token_create(client: &Client, output: Output, name: &str, grants: Vec<runnev::auth::Grant>) -> Result<()> {
    let answer = client.create_token(name, &grants).await?;
    match output {
        Output::Json => say(serde_json::to_string(&answer)?)?,
        Output::Text => {
            say(answer["token"].as_str().unwrap_or_default())?;
            note(format_args!("runnev: token {name:?} created; its secret is shown only now: keep it safe"));
        }
    }
    Ok(())
}

/// `runnev auth token list`: names and grants.
pub async fn token_list(client: &Client, output: Output) -> Result<()> {
    let answer = client.tokens().await?;
    match output {
        Output::Json => say(serde_json::to_string(&answer)?)?,
        Output::Text => {
            for t in answer["tokens"].as_array().into_iter().flatten() {
                let grants: Vec<String> = t["grants"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|g| {
                        format!("{}:{}", g["permission"].as_str().unwrap_or("?"), g["streams"].as_str().unwrap_or("?"))
                    })
                    .collect();
                say(format!("{:<24} {}", t["name"].as_str().unwrap_or("?"), grants.join(" ")))?;
            }
        }
    }
    Ok(())
}

/// `runnev auth token delete`.
pub async fn token_delete(client: &Client, output: Output, name: &str) -> Result<()> {
    let deleted = client.delete_token(name).await?;
    match output {
        Output::Json => say(serde_json::json!({"deleted": name, "already": deleted == Deleted::Already}))?,
        Output::Text => say(format!("deleted token {name}"))?,
    }
    Ok(())
}

/// `runnev status`: every node's view of the cluster.
pub async fn status(client: &Client, output: Output) -> Result<()> {
    let started = Instant::now();
    let mut rows = Vec::new();
    for node in client.nodes() {
        rows.push((node.clone(), client.cluster_view(node).await));
    }
    let why = |node: &str, e: &ClientError| match e {
        ClientError::Unreachable { last, .. } => last.strip_prefix(&format!("{node}: ")).unwrap_or(last).to_string(),
        e => e.to_string(),
    };
    if output == Output::Json {
        for (node, v) in &rows {
            // Through a JSON value: keys sorted, as this output has always been.
            let v = match v {
                Ok(view) => serde_json::to_value(view)?,
                Err(e) => serde_json::json!({"node": node, "error": why(node, e)}),
            };
            say(v)?;
        }
    } else {
        say(format_args!(
            "{:<28} {:>4} {:>10} {:>7} {:>6} {:>10} {:>10}",
            "NODE", "ID", "STATE", "LEADER", "TERM", "COMMIT", "APPLIED"
        ))?;
        for (node, v) in &rows {
            match v {
                Ok(v) => say(format_args!(
                    "{:<28} {:>4} {:>10} {:>7} {:>6} {:>10} {:>10}",
                    node,
                    v.node_id,
                    v.state,
                    v.leader_id.map_or_else(|| "none".to_string(), |l| l.to_string()),
                    v.term,
                    v.commit_index,
                    v.applied_index
                ))?,
                Err(e) => say(format_args!("{node:<28} unreachable: {}", why(node, e)))?,
            }
        }
    }
    // A client whose --ca-file does not fit the cluster is misconfigured, not cut off.
    if rows.iter().all(|(_, v)| matches!(v, Err(ClientError::Tls { .. }))) {
        if let Some((_, Err(e))) = rows.pop() {
            return Err(e.into());
        }
    }
    let views: Vec<&ClusterView> = rows.iter().filter_map(|(_, v)| v.as_ref().ok()).collect();
    if views.is_empty() {
        let last = rows.iter().filter_map(|(n, v)| v.as_ref().err().map(|e| format!("{n}: {}", why(n, e)))).next_back();
        return Err(ClientError::Unreachable {
            nodes: client.nodes().to_vec(),
            after: started.elapsed(),
            last: last.unwrap_or_default(),
        }
        .into());
    }
    if output == Output::Text {
        let leader = views.iter().find(|v| v.leader_id == Some(v.node_id));
        // A leader cut off from the others goes on naming itself leader (openraft 0.9 steps down
        // only when a membership without it commits), so its own readiness says whether a
        // majority still acknowledges it.
        let leader_url = leader.and_then(|l| {
            rows.iter().find(|(_, v)| v.as_ref().is_ok_and(|v| v.node_id == l.node_id)).map(|(node, _)| node)
        });
        let alone = match leader_url {
            Some(node) => client.readiness(node).await.ok().flatten().filter(|why| why == "leader without a quorum"),
            None => None,
        };
        match (leader, alone) {
            (Some(l), None) => {
                say(format_args!("leader: node {} (term {}); voters {:?}", l.node_id, l.term, l.voters()))?
            }
            (Some(l), Some(_)) => say(format_args!(
                "no leader among the nodes that answered: node {} names itself leader (term {}) but no majority \
                 acknowledges it; a majority of nodes is down or partitioned",
                l.node_id, l.term
            ))?,
            (None, _) => {
                // The leader was not among the nodes asked (`--nodes` named followers only): a
                // node that names a leader and is ready has heard from it lately.
                let named = rows
                    .iter()
                    .find_map(|(node, v)| v.as_ref().ok().and_then(|v| v.leader_id.map(|leader| (node, v, leader))));
                let heard = match named {
                    Some((node, v, leader)) => {
                        client.readiness(node).await.ok().flatten().is_none().then_some((v, leader))
                    }
                    None => None,
                };
                match heard {
                    Some((v, leader)) => say(format_args!(
                        "leader: node {leader} (term {}), as node {} follows it; node {leader} was not asked; voters {:?}",
                        v.term,
                        v.node_id,
                        v.voters()
                    ))?,
                    None => {
                        say("no leader among the nodes that answered: a majority of nodes is down or partitioned")?
                    }
                }
            }
        }
    }
    Ok(())
}

/// The members of a view in words: `1 (voter, 127.0.0.1:7001), 4 (learner, …)`.
fn members_text(v: &ClusterView) -> String {
    let members: Vec<String> = v
        .members
        .iter()
        .map(|m| format!("{} ({}, {})", m.id, if m.voter { "voter" } else { "learner" }, m.addr))
        .collect();
    // A leader that removed itself answers the change with its own view, in which it still
    // names itself: it leads no more.
    let leader = match v.leader_id {
        Some(l) if v.members.iter().any(|m| m.id == l) => l.to_string(),
        Some(l) => format!("none yet (node {l} left)"),
        None => "none".to_string(),
    };
    format!("members {}; leader {leader}", members.join(", "))
}

fn print_view(output: Output, headline: &str, v: &ClusterView) -> Result<()> {
    match output {
        // Through a JSON value: keys sorted, as this output has always been.
        Output::Json => say(serde_json::to_value(v)?),
        Output::Text => say(format_args!("{headline}\n{}", members_text(v))),
    }
}

/// Whether `addr` answers `/healthz` within a second, asked over `client`'s transport (TLS with
/// its CA when the cluster runs it); the problem if not.
async fn node_answers(client: &Client, addr: &str) -> Result<(), String> {
    let url = format!("{}/healthz", client.url_of(addr));
    match runnev::net::get(client.transport(), &url, Duration::from_secs(1), runnev::limits::CLI_PROBE_BYTES_MAX).await
    {
        Ok((s, _)) if s.is_success() => Ok(()),
        Ok((s, _)) => Err(format!("{url} answered {s}")),
        Err(e) => Err(e),
    }
}

fn not_answering_note(client: &Client, id: u64, addr: &str, why: &str) -> String {
    let url = client.url_of(addr);
    let ca = if url.starts_with("https://") { " --ca-file CA" } else { "" };
    format!(
        "node {id} does not answer at {addr} from here ({why}): is `runnev serve --id {id} --listen {addr} …` running \
         there? Check with `runnev probe {url}/healthz{ca}` (from a machine that reaches it)"
    )
}

/// The cluster view of the first of `client`'s nodes that says it leads; `None` when none does.
async fn leader_view(client: &Client) -> Option<ClusterView> {
    for node in client.nodes() {
        match client.cluster_view(node).await {
            Ok(v) if v.leader_id == Some(v.node_id) => return Some(v),
            _ => continue,
        }
    }
    None
}

/// The promotion progress of learner `id`, as the leader among `client`'s nodes sees it.
async fn catch_up_progress(client: &Client, id: u64) -> Option<String> {
    let v = leader_view(client).await?;
    let last = v.last_log_index.unwrap_or(0);
    let matched = v.members.iter().find(|m| m.id == id).and_then(|m| m.matched_index);
    Some(match matched {
        Some(m) => format!("it has {m} of the leader's {last} log entries"),
        None => "it has received nothing from the leader yet".to_string(),
    })
}

/// `runnev cluster add|remove`.
pub async fn cluster(client: &Client, output: Output, cmd: ClusterCmd) -> Result<()> {
    match cmd {
        ClusterCmd::Add { id, addr, wait_voter, timeout, learner: _ } => {
            // Only the leader's view says what the membership is: a node removed without being
            // told (the one an operator adding it back may list first) still shows itself a voter.
            if let Some(before) = leader_view(client).await {
                let known = before.members.iter().find(|m| m.id == id);
                if let Some(m) = known.filter(|m| m.voter && m.addr == addr) {
                    return print_view(output, &format!("node {id} is already a voter at {}", m.addr), &before);
                }
            }
            let view = client.add_member(id, &addr, false).await?;
            if let Err(why) = node_answers(client, &addr).await {
                if !wait_voter {
                    note(format_args!("runnev: note: {}", not_answering_note(client, id, &addr, &why)));
                }
            }
            if !wait_voter {
                let head = format!(
                    "added node {id} at {addr} as a learner (it receives the log but does not vote); promote it \
                     once it has caught up with `runnev cluster add {id} {addr} --wait-voter`"
                );
                return print_view(output, &head, &view);
            }
            let view = wait_voter_promotion(client, id, &addr, timeout).await?;
            print_view(output, &format!("node {id} at {addr} is a voter"), &view)
        }
        ClusterCmd::Remove { id } => {
            let (view, deleted) = client.remove_member(id).await?;
            let head = if deleted == Deleted::Already {
                note(format_args!(
                    "runnev: note: node {id} is gone: the first attempt's answer was lost and the retry found no \
                     such member, so that attempt removed it (already removed)"
                ));
                format!("removed node {id} (already removed)")
            } else {
                format!("removed node {id}")
            };
            print_view(output, &head, &view)
        }
    }
}

/// How often `--wait-voter` tries the promotion again after the server answered not ready.
const PROMOTE_RETRY: Duration = Duration::from_secs(1);

/// Asks for learner `id`'s promotion until it is a voter or `timeout` passes, noting its progress
/// on stderr after each try (the server waits up to 10 s for it to catch up on each).
async fn wait_voter_promotion(client: &Client, id: u64, addr: &str, timeout: Duration) -> Result<ClusterView> {
    // One attempt per try (a round over the nodes if they refuse): the loop here does the waiting.
    // The client's own transport and token: a secure cluster needs both.
    let once = client.with_policy(RetryPolicy {
        give_up_after: Duration::ZERO,
        unreachable_after: Duration::ZERO,
        ..client.policy()
    });
    let started = Instant::now();
    note(format_args!(
        "runnev: waiting for node {id} to catch up and become a voter (at most {})",
        format_duration(timeout)
    ));
    let mut answered_before = true;
    loop {
        let left = timeout.saturating_sub(started.elapsed());
        let problem = match tokio::time::timeout(left, once.add_member(id, addr, true)).await {
            Ok(Ok(v)) if v.voters().contains(&id) => return Ok(v),
            Ok(Ok(_)) => Some("the cluster answered without promoting it".to_string()),
            // The server's own "did not catch up" is what the progress says.
            Ok(Err(ClientError::Unavailable { last, .. })) if last.contains("did not catch up") => None,
            Ok(Err(e @ (ClientError::Unavailable { .. } | ClientError::Unreachable { .. }))) => Some(e.to_string()),
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => None,
        };
        let progress = catch_up_progress(client, id).await.unwrap_or_else(|| "its progress is unknown".into());
        let problem = problem.map(|p| format!(" ({p})")).unwrap_or_default();
        note(format_args!(
            "runnev: after {}: node {id} is still a learner: {progress}{problem}",
            format_duration(started.elapsed())
        ));
        let answers = node_answers(client, addr).await;
        match &answers {
            Err(why) if answered_before => {
                note(format_args!("runnev: note: {}", not_answering_note(client, id, addr, why)))
            }
            Ok(()) if !answered_before => note(format_args!("runnev: node {id} answers at {addr} now")),
            _ => {}
        }
        answered_before = answers.is_ok();
        if started.elapsed() + PROMOTE_RETRY >= timeout {
            return Err(CliError {
                exit: Exit::Unavailable,
                message: format!(
                    "node {id} is still a learner after {}: {progress}; it stays a learner (run the command again to \
                     keep waiting, or `runnev cluster remove {id}`)",
                    format_duration(started.elapsed())
                ),
            }
            .into());
        }
        tokio::time::sleep(PROMOTE_RETRY).await;
    }
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
pub async fn probe(url: &str, timeout: Duration, ca: Option<&std::path::Path>) -> Result<()> {
    use std::sync::Arc;
    let tcp: Arc<dyn runnev::net::Dialer> = Arc::new(runnev::net::TcpDialer);
    // The dialer decides TLS; the URL keeps its scheme, so messages say how the node was asked.
    let dialer = match (ca, url.starts_with("https://")) {
        (Some(ca), true) => {
            let config = runnev::tls::client_config(ca, None)?;
            Arc::new(runnev::tls::TlsDialer::new(tcp, config)) as Arc<dyn runnev::net::Dialer>
        }
        (None, true) => bail!("{url}: an https:// URL needs the cluster CA's certificate (--ca-file)"),
        (_, false) => tcp,
    };
    let http = runnev::net::http_client(dialer);
    match runnev::net::get(&http, url, timeout, runnev::limits::CLI_PROBE_BYTES_MAX).await {
        Ok((status, _)) if status.is_success() => Ok(()),
        Ok((status, _)) => bail!("{url} answered {status}"),
        Err(e) => bail!("{e}"),
    }
}

#[cfg(test)]
mod frames_tests {
    use super::*;

    #[test]
    fn lines_split_like_bufread_lines() {
        assert!(split_lines(b"").is_empty());
        assert_eq!(split_lines(b"a\nb\r\n\nc"), vec![b"a".as_slice(), b"b", b"", b"c"]);
        assert_eq!(split_lines(b"a\n"), vec![b"a".as_slice()]);
        assert_eq!(split_lines(b"\n"), vec![b"".as_slice()]);
    }

    #[test]
    fn requests_keep_within_frames_and_bytes() {
        let line = [0u8; 6];
        let lines = vec![line.as_slice(); 25_000];
        assert_eq!(requests_of(&lines, usize::MAX), vec![(0, 10_000), (10_000, 20_000), (20_000, 25_000)]);
        // 10 bytes a frame (header included): 3 frames per 30 bytes.
        assert_eq!(requests_of(&lines[..7], 30), vec![(0, 3), (3, 6), (6, 7)]);
        // A line larger than the budget goes alone (the server answers 413 if it is too large).
        let big = [0u8; 100];
        assert_eq!(requests_of(&[&line, &big, &line], 30), vec![(0, 1), (1, 2), (2, 3)]);
    }
}

#[cfg(test)]
mod payload_tests {
    use super::*;

    #[test]
    fn a_dash_for_data_or_file_reads_stdin_and_anything_else_is_taken_as_given() {
        let stdin = || &b"from stdin"[..];
        assert_eq!(read_payload(Some("-".into()), None, stdin()).unwrap(), b"from stdin");
        assert_eq!(read_payload(None, Some("-".into()), stdin()).unwrap(), b"from stdin");
        assert_eq!(read_payload(None, None, stdin()).unwrap(), b"from stdin");
        assert_eq!(read_payload(Some("--".into()), None, stdin()).unwrap(), b"--");
        assert_eq!(read_payload(Some("hello".into()), None, stdin()).unwrap(), b"hello");
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("p");
        std::fs::write(&f, b"-").unwrap();
        assert_eq!(read_payload(None, Some(f), stdin()).unwrap(), b"-", "a file holding a dash is sent as is");
        let missing = dir.path().join("missing");
        assert!(read_payload(None, Some(missing), stdin()).is_err());
    }
}

#[cfg(test)]
mod subscribe_tests {
    use super::*;

    #[test]
    fn only_a_cursor_past_the_last_seq_gets_the_note() {
        assert_eq!(cursor_ahead_note("s", 3, 3), None, "caught up");
        assert_eq!(cursor_ahead_note("s", 2, 3), None, "behind");
        let note = cursor_ahead_note("orders", 10, 3).expect("ahead");
        assert!(note.starts_with("runnev: the cursor 10 is past the last seq of stream orders, 3;"), "{note}");
        assert!(note.contains("set the cursor back to 3"), "{note}");
        assert!(cursor_ahead_note("s", u64::MAX, 0).is_some());
    }
}

#[cfg(test)]
mod view_tests {
    use super::*;

    #[test]
    fn a_leader_outside_the_members_is_not_named_the_leader() {
        let member = |id: u64| {
            serde_json::json!({"id": id, "addr": format!("h:{id}"), "voter": true, "matched_index": null,
                "clock_offset_ms": null, "disk_low": null, "lag_entries": null})
        };
        let view = |leader: Option<u64>| -> ClusterView {
            serde_json::from_value(serde_json::json!({"node_id": 3, "leader_id": leader, "state": "Learner", "term": 2,
                "commit_index": 9, "applied_index": 9, "last_log_index": 9, "snapshot_index": null,
                "purged_index": null, "raft_stopped": null, "members": [member(1), member(2)],
                "voter_sets": [[1, 2]], "clock": null, "disk": null}))
            .expect("a view")
        };
        assert_eq!(members_text(&view(Some(2))), "members 1 (voter, h:1), 2 (voter, h:2); leader 2");
        assert_eq!(
            members_text(&view(Some(3))),
            "members 1 (voter, h:1), 2 (voter, h:2); leader none yet (node 3 left)"
        );
        assert_eq!(members_text(&view(None)), "members 1 (voter, h:1), 2 (voter, h:2); leader none");
    }
}
