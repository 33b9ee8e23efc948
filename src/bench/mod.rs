//! The load generators behind `runnev bench` and the side-by-side comparison (`bench/`).
//!
//! Owns: driving load against a cluster and summarising it: [`publish`] (the publish load
//! generator, generic over the system under load, and its Runnev target), [`stats`] (percentiles). Must never:
//! be on the serving path (nothing in [`crate::node`] or [`crate::api`] uses it), or pull in a
//! dependency the server does not already have (peer clients live in the `bench/` crate).

pub mod catchup;
pub mod cluster;
pub mod failover;
pub mod publish;
pub mod restart;
pub mod stats;
