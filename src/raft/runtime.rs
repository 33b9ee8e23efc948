//! The async runtime openraft runs on: tokio, with the randomness openraft draws (its election
//! timeouts) taken from a seed when the caller gives one.
//!
//! Owns: [`SeededTokio`], the `AsyncRuntime` of [`super::TypeConfig`], and the seed scope
//! [`with_seed`]. Must never: change what tokio does (every task, timer and channel is tokio's,
//! unchanged), or draw anything but OS randomness outside a [`with_seed`] scope — production
//! never opens one.
//!
//! Why: openraft 0.9 picks each node's election timeout with
//! `Config::new_rand_election_timeout::<RT>()`, a uniform draw in
//! `[election_timeout_min, election_timeout_max)` from `RT::thread_rng()` of the runtime in the
//! type configuration. With openraft's `TokioRuntime` that is `rand::thread_rng()`, seeded by
//! the OS, so two runs of one simulation seed elected different leaders at different times.
//! Here the draw comes from a generator seeded by the caller, per node, for everything that
//! node's Raft does (the seed follows the tasks openraft spawns); the idea is openraft 0.10's
//! `DeterministicRng` seam, on 0.9's `AsyncRuntime::thread_rng`.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::{AsyncRuntime, OptionalSend, TokioRuntime};
use rand_08::rngs::{StdRng, ThreadRng};
use rand_08::{RngCore, SeedableRng};

tokio::task_local! {
    /// The seeded generator of the node whose task this is (set by [`with_seed`], carried into
    /// the tasks openraft spawns by [`SeededTokio::spawn`]).
    static SEEDED: Arc<Mutex<StdRng>>;
}

/// Runs `fut` (a node: `crate::node::run`) with openraft's randomness drawn from a generator
/// seeded with `seed` (any `u64`; ChaCha12 via `rand` 0.8's `StdRng::seed_from_u64`) instead of
/// the OS. The same seed and the same sequence of draws give the same election timeouts. Tasks
/// openraft spawns inside the scope share the generator; tasks spawned with `tokio::spawn`
/// directly do not (nothing in them draws). For deterministic simulation only: a real cluster
/// needs nodes whose timeouts differ, which OS randomness gives.
pub async fn with_seed<F: Future>(seed: u64, fut: F) -> F::Output {
    SEEDED.scope(Arc::new(Mutex::new(StdRng::seed_from_u64(seed))), fut).await
}

/// openraft's `TokioRuntime` in everything but [`AsyncRuntime::thread_rng`], which returns the
/// generator of the enclosing [`with_seed`] scope, or `rand::thread_rng()` (OS-seeded) outside
/// one. Source: openraft 0.9.25 `async_runtime.rs`, which this delegates to.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SeededTokio;

/// What [`SeededTokio::thread_rng`] returns: the scope's seeded generator or the thread's
/// OS-seeded one. Draws are taken when asked for, not ahead.
pub struct NodeRng(Source);

enum Source {
    Os(ThreadRng),
    Seeded(Arc<Mutex<StdRng>>),
}

impl NodeRng {
    fn with<R>(&mut self, f: impl FnOnce(&mut dyn RngCore) -> R) -> R {
        match &mut self.0 {
            Source::Os(r) => f(r),
            // A poisoned lock only means a draw panicked; the generator's state is still valid.
            Source::Seeded(r) => f(&mut *r.lock().unwrap_or_else(|p| p.into_inner())),
        }
    }
}

impl RngCore for NodeRng {
    fn next_u32(&mut self) -> u32 {
        self.with(|r| r.next_u32())
    }

    fn next_u64(&mut self) -> u64 {
        self.with(|r| r.next_u64())
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.with(|r| r.fill_bytes(dest))
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_08::Error> {
        self.with(|r| r.try_fill_bytes(dest))
    }
}

type Tokio = TokioRuntime;

impl AsyncRuntime for SeededTokio {
    type JoinError = <Tokio as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <Tokio as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <Tokio as AsyncRuntime>::Sleep;
    type Instant = <Tokio as AsyncRuntime>::Instant;
    type TimeoutError = <Tokio as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = <Tokio as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = NodeRng;
    type OneshotSender<T: OptionalSend> = <Tokio as AsyncRuntime>::OneshotSender<T>;
    type OneshotReceiverError = <Tokio as AsyncRuntime>::OneshotReceiverError;
    type OneshotReceiver<T: OptionalSend> = <Tokio as AsyncRuntime>::OneshotReceiver<T>;

    /// `tokio::spawn`, inside the spawner's [`with_seed`] scope if it has one.
    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        match SEEDED.try_with(Arc::clone) {
            Ok(rng) => tokio::spawn(SEEDED.scope(rng, future)),
            Err(_) => Tokio::spawn(future),
        }
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        Tokio::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        Tokio::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(duration: Duration, future: F) -> Self::Timeout<R, F> {
        Tokio::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(deadline: Self::Instant, future: F) -> Self::Timeout<R, F> {
        Tokio::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        Tokio::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        NodeRng(match SEEDED.try_with(Arc::clone) {
            Ok(rng) => Source::Seeded(rng),
            Err(_) => Source::Os(rand_08::thread_rng()),
        })
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        Tokio::oneshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Election timeouts as openraft draws them (`Config::new_rand_election_timeout`), `n` of
    /// them, in a task openraft would spawn.
    async fn timeouts(n: usize) -> Vec<u64> {
        let cfg = openraft::Config { election_timeout_min: 150, election_timeout_max: 300, ..Default::default() };
        SeededTokio::spawn(async move { (0..n).map(|_| cfg.new_rand_election_timeout::<SeededTokio>()).collect() })
            .await
            .expect("the task runs")
    }

    #[tokio::test]
    async fn a_seed_fixes_the_election_timeouts_and_another_seed_changes_them() {
        let a = with_seed(7, timeouts(16)).await;
        let b = with_seed(7, timeouts(16)).await;
        let c = with_seed(8, timeouts(16)).await;
        assert_eq!(a, b, "the same seed must draw the same election timeouts");
        assert_ne!(a, c, "another seed must draw other timeouts");
        assert!(a.iter().all(|t| (150..300).contains(t)), "{a:?} outside [150, 300)");
    }

    #[tokio::test]
    async fn without_a_seed_the_draws_come_from_the_os() {
        // 16 draws from 150 values: two OS-seeded runs agree with probability 150^-16.
        assert_ne!(timeouts(16).await, timeouts(16).await);
    }
}
