//! The benchmark: `runnev bench` (publish load, catch-up, failover, restart) and the peer
//! comparison (`runnev-bench nats`), out of the product: the `runnev` binary does not link this
//! crate; `runnev bench ARGS` runs the `runnev-bench` executable found beside it.
//!
//! Owns: driving load and faults against a cluster and summarising them: [`publish`] (the
//! publish load generator, generic over the system under load, and its Runnev target),
//! [`catchup`], [`failover`], [`membership`] and [`restart`] (the modes that read a whole stream,
//! change the membership, or kill and restart nodes of a cluster they start through
//! `runnev::launcher`), [`outbox`] (the transactional outbox end to end: PostgreSQL writers,
//! relay, cluster, sink), [`scale`] (many streams, many subscribers, disk per byte of
//! payload), [`nats`] (NATS JetStream as
//! a target), [`stats`] (percentiles) and [`cli`] (the command line). Must never: be on the
//! serving path, or be linked into the `runnev` binary (its dependencies, such as the NATS client,
//! stay out of the product).
#![deny(missing_docs)]

pub mod catchup;
pub mod cli;
pub mod cluster;
pub mod failover;
pub mod membership;
pub mod nats;
pub mod outbox;
pub mod publish;
pub mod restart;
pub mod scale;
pub mod stats;
