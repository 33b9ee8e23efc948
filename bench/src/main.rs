//! `runnev-bench`: the benchmark's executable; `runnev bench ARGS` runs it with ARGS.

fn main() -> std::process::ExitCode {
    runnev_bench::cli::main()
}
