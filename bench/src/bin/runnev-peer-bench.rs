//! `runnev-peer-bench`: the former name of `runnev-bench`, kept so `runnev-peer-bench nats …`
//! goes on working; the same command line.

fn main() -> std::process::ExitCode {
    runnev_bench::cli::main()
}
