//! `runnev-peer-bench`: the former name of `runnev-bench`, kept so `runnev-peer-bench nats …`
//! goes on working; the same command line.

/// The same allocator as the `runnev` executable (mimalloc; see its `src/main.rs`): the
/// outbox relay, writers and sinks of `runnev bench outbox` run as they do in `runnev`, and the
/// load generator costs the same whichever system it drives.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    runnev_bench::cli::main()
}
