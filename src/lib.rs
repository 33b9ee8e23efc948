//! Runnev: a Raft-replicated, clustered log service (see `README.md`; the contract, SPEC, is under `docs/`).
//!
//! How a publish flows, module by module:
//! 1. [`api`] parses `POST /v1/streams/{name}/batches` and validates it (names and rules from
//!    [`stream`], limits from [`limits`], errors from [`error`]);
//! 2. on a follower, [`api`] forwards the request to the leader over [`net`]; on the leader it
//!    proposes a [`raft::Command`] through openraft;
//! 3. [`raft::network`] replicates the entry; each node's [`storage::log_store`] fsyncs it before
//!    openraft counts it, and the entry commits on a majority (Raft paper §5.3);
//! 4. [`storage::state_machine`] applies it, deciding seq and dedup with [`stream`]'s pure rules,
//!    and the outcome returns to the client.
//!
//! The `ts` the leader stamps is the median of the voters' wall clocks ([`clock`]), and the state
//! machine never lets it go backwards.
//!
//! Before any write reaches openraft, [`disk`] checks that this node's data directory has room
//! for it (a leader answers `507 storage_full`, a follower answers the leader's entries as
//! heartbeats), so a full disk never stops a Raft core.
//!
//! Reads and subscriptions are served by any node from its applied state in [`storage`].
//! [`node`] wires one node together; [`launcher`] starts `runnev serve` processes on one machine,
//! for [`local`] (a three-node cluster), the benchmark and the tests.
#![deny(missing_docs)]

pub mod api;
pub mod auth;
pub mod client;
pub mod clock;
pub mod disk;
pub mod error;
pub mod launcher;
pub mod limits;
pub mod local;
pub mod logging;
pub mod net;
pub mod node;
pub mod open_files;
pub mod outbox;
pub mod raft;
pub mod serve;
pub mod storage;
pub mod stream;
pub mod tls;
pub mod units;
pub mod wire;
