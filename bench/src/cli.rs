//! The command line of `runnev-bench`, which `runnev bench` runs: without a subcommand,
//! `runnev bench [FLAGS]` is `bench publish`.
//!
//! Owns: parsing the flags and handing each mode its arguments; progress goes to stderr,
//! summaries to stdout. Must never: take flags that differ from those `runnev bench` documents
//! (README, BENCHMARKS.md).

use std::sync::Arc;

use anyhow::Result;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use runnev::client::Client;

use crate::cluster::RUNNEV_EXE_ENV;
use crate::publish::{run as run_load, stream_names, LoadArgs, RunnevTarget};
use runnev::net::HttpVersion;

#[derive(Parser)]
#[command(
    name = "runnev-bench",
    about = "Load and fault benchmarks of Runnev; without a subcommand, `bench [FLAGS]` is `bench publish`",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    publish: PublishArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Bounded publish load; prints msgs/s, MB/s and latency percentiles (the default).
    Publish(PublishArgs),
    /// Catch-up read of a whole stream from a follower by one consumer (poll and SSE); MB/s.
    Catchup(crate::catchup::CatchupArgs),
    /// Kill (or restart) the leader of a cluster it starts, repeatedly; unavailability window.
    Failover(crate::failover::FailoverArgs),
    /// Fill a cluster it starts, then restart a follower; time until it is ready.
    Restart(crate::restart::RestartArgs),
    /// Add and remove voters of a cluster it starts under publish load; the pause publishers see.
    Membership(crate::membership::MembershipArgs),
    /// The same publish load on one stream and on many (default 10,000); msgs/s of each and
    /// their ratio.
    Streams(crate::scale::StreamsArgs),
    /// SSE subscribers (default 1,000) on one follower of a cluster it starts, under publish
    /// load: the follower's memory and the fan-out rate.
    Subscribers(crate::scale::SubscribersArgs),
    /// Fill a cluster it starts, then snapshot: its disk per byte of payload at each phase.
    Disk(crate::scale::DiskArgs),
    /// Publish load against a NATS JetStream stream; each publish waits for its PubAck.
    Nats(crate::nats::NatsArgs),
    /// PostgreSQL writers → outbox relay → a cluster it starts → sinks; rows/s per stage,
    /// commit → sink latency, outbox table size.
    Outbox(crate::outbox::OutboxArgs),
}

/// Flags of `runnev bench publish` (also accepted by plain `runnev bench`, and by `runnev bench
/// streams`).
#[derive(clap::Args)]
pub struct PublishArgs {
    /// Nodes to talk to, comma-separated base URLs; the client fails over between them.
    #[arg(long = "nodes", env = "RUNNEV_NODES", default_value = runnev::client::DEFAULT_NODES)]
    pub nodes: String,
    /// The token to send (nodes run with --auth).
    #[arg(long = "token", env = "RUNNEV_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The cluster CA's certificate: speak TLS to the nodes and verify them with it.
    #[arg(long = "ca-file", env = "RUNNEV_CA_FILE")]
    pub ca_file: Option<std::path::PathBuf>,
    /// The HTTP version spoken to the nodes: `auto` (HTTP/2 over TLS by ALPN, HTTP/1.1
    /// plain), `1` (HTTP/1.1: a connection per publish in flight) or `2` (HTTP/2: every publish
    /// in flight to a node on one connection; plain, with prior knowledge).
    #[arg(long = "http", default_value = "auto", value_parser = parse_http_version)]
    pub http: HttpVersion,
    /// The load.
    #[command(flatten)]
    pub load: LoadArgs,
}

impl PublishArgs {
    /// A client over `--nodes`, secured by `--ca-file` and `--token`, speaking `--http`.
    ///
    /// Errors: the flags do not make a client (a bad URL, CA file or token).
    pub fn client(&self) -> Result<Client> {
        Ok(Client::from_flags_speaking(&self.nodes, self.ca_file.as_deref(), self.token.as_deref(), self.http)?)
    }
}

/// `--http`: `auto`, `1` or `2`.
fn parse_http_version(s: &str) -> std::result::Result<HttpVersion, String> {
    match s {
        "auto" => Ok(HttpVersion::Auto),
        "1" | "1.1" => Ok(HttpVersion::Http1),
        "2" => Ok(HttpVersion::Http2),
        other => Err(format!("{other:?}: expected auto, 1 or 2")),
    }
}

/// `runnev bench publish` (and plain `runnev bench`): a bounded publish load with the generator
/// of [`crate::publish`]; progress on stderr, then a table or one JSON line on stdout.
async fn publish(a: PublishArgs) -> Result<()> {
    let client = a.client()?;
    let spec = a.load.spec();
    let names = stream_names(&a.load.stream, spec.streams);
    let target = Arc::new(RunnevTarget::new(client, names));
    let summary = run_load(target, &spec, !a.load.quiet).await?;
    if a.load.json {
        println!("{}", summary.json_line());
    } else {
        print!("{}", summary.table());
    }
    Ok(())
}

async fn run(cli: Cli) -> Result<()> {
    match cli.cmd.unwrap_or(Cmd::Publish(cli.publish)) {
        Cmd::Publish(a) => publish(a).await?,
        Cmd::Catchup(a) => crate::catchup::run(a).await?,
        Cmd::Failover(a) => crate::failover::run(a).await?,
        Cmd::Restart(a) => crate::restart::run(a).await?,
        Cmd::Membership(a) => crate::membership::run(a).await?,
        Cmd::Streams(a) => crate::scale::streams(a).await?,
        Cmd::Subscribers(a) => crate::scale::subscribers(a).await?,
        Cmd::Disk(a) => crate::scale::disk(a).await?,
        Cmd::Nats(a) => crate::nats::run(a).await?,
        Cmd::Outbox(a) => crate::outbox::run(a).await?,
    }
    Ok(())
}

/// Parses the command line, runs the mode, and prints an error on stderr; the exit code says
/// whether it succeeded.
pub fn main() -> std::process::ExitCode {
    runnev::logging::init(runnev::logging::LogFormat::Text);
    // Run through `runnev bench`, usage and errors name that command.
    let via_runnev = std::env::var_os(RUNNEV_EXE_ENV).is_some();
    let name = if via_runnev { "runnev bench" } else { "runnev-bench" };
    let matches = Cli::command().bin_name(name).get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let outcome = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime.block_on(run(cli)),
        Err(e) => Err(anyhow::anyhow!("starting the runtime: {e}")),
    };
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
