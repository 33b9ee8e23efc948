//! `runnev-bench`: the benchmark's executable; `runnev bench ARGS` runs it with ARGS.

/// The same allocator as the `runnev` executable (mimalloc; see its `src/main.rs`): the
/// outbox relay, writers and sinks of `runnev bench outbox` run as they do in `runnev`, and the
/// load generator costs the same whichever system it drives.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    runnev_bench::cli::main()
}
