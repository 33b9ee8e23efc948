//! Raft: the openraft type configuration, the commands that travel in the log, the transport
//! between nodes and cluster formation.
//!
//! Owns: what is replicated and how it reaches the other nodes. Must never: decide stream rules
//! (that is [`crate::stream`]) or touch disk (that is [`crate::storage`]).

pub mod candidacy;
pub mod formation;
pub mod network;
pub mod removal;
pub mod runtime;
pub mod vote_gate;

use serde::{Deserialize, Serialize};

use crate::stream::{FramesRejection, PublishRejection, Retention, StreamMeta};

/// A node's id in the cluster (`--id`).
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// Runnev's openraft type configuration. Snapshots travel as files, so installing one needs
    /// memory bounded by the chunk size, not the state size.
    pub TypeConfig:
        D = Command,
        R = Outcome,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = crate::storage::io::SnapshotFile,
        AsyncRuntime = runtime::SeededTokio,
);

/// The Raft handle of a Runnev node.
pub type Raft = openraft::Raft<TypeConfig>;
/// A log id (term and log index) in Runnev's configuration.
pub type LogId = openraft::LogId<NodeId>;
/// Openraft's storage error in Runnev's configuration.
pub type StorageError = openraft::StorageError<NodeId>;

/// A command in the Raft log: the only way replicated state changes. Everything that must be the
/// same on every replica (seq, `ts`, whether to auto-create) is decided before proposing or
/// while applying, never from a follower's clock or flags.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Create a stream, or replace its retention. `retention: None` creates it with no limits or
    /// leaves an existing one unchanged (SPEC §3, `PUT` without a body).
    PutStream {
        /// Stream name, already validated.
        name: String,
        /// New retention, if a body was given.
        retention: Option<Retention>,
        /// Leader time when proposed, ms since the Unix epoch; used for age retention.
        ts: u64,
    },
    /// Delete a stream and all its batches.
    DeleteStream {
        /// Stream name.
        name: String,
    },
    /// Publish one batch (SPEC §2.3).
    Publish {
        /// Stream name.
        stream: String,
        /// The publisher's seq, or `None` for server-assigned.
        seq: Option<u64>,
        /// Leader time when proposed, ms since the Unix epoch: the batch's `ts`.
        ts: u64,
        /// Create the stream if missing (the leader's `--auto-create-streams`).
        auto_create: bool,
        /// The payload, byte for byte: a slice of the request's body, shared by every copy of
        /// the entry (replication and apply clone entries; `Bytes` encodes as `serde_bytes`
        /// did, so the log's format is unchanged).
        data: bytes::Bytes,
    },
    /// The leader's clock, so age retention evicts from idle streams too (SPEC §2.7).
    Tick {
        /// Leader time, ms since the Unix epoch.
        ts: u64,
    },
    /// Several commands proposed as one log entry (one fsync on each node for all of them),
    /// applied in order, each as if alone; the leader's proposer batches concurrent requests
    /// this way ([`crate::api::proposer`]).
    Batch(Vec<Command>),
    /// Publish many batches of one stream, all or none, in one entry (SPEC §6): frame k takes
    /// seq `seq + k` (or `last_seq + 1 + k` without `seq`), each frame follows SPEC §2.3, and a
    /// mix of duplicates and new frames is refused ([`crate::stream::decide_frames`]). Every
    /// frame gets the entry's `ts`. Added after the other variants, so their encoding is
    /// unchanged; a node of an older build cannot decode it (upgrade every node before clients
    /// send frames).
    PublishFrames {
        /// Stream name.
        stream: String,
        /// The publisher's seq of the first frame, or `None` for server-assigned seqs.
        seq: Option<u64>,
        /// Leader time when proposed, ms since the Unix epoch: every frame's `ts`.
        ts: u64,
        /// Create the stream if missing (the leader's `--auto-create-streams`).
        auto_create: bool,
        /// The payloads, in frame order, byte for byte (1 to
        /// [`crate::limits::FRAMES_PER_APPEND_MAX`] of them when proposed by the API).
        frames: Vec<bytes::Bytes>,
    },
    // New variants go last: the log holds commands by their variant's position.
    /// Create a client token (only its salted hash travels; [`crate::auth`]). With `bootstrap`,
    /// the cluster's first admin token: made (or replaced) only if no bootstrap token was ever
    /// made, so every node proposing its `--admin-token-file` at start makes one, once.
    PutToken {
        /// Token name, already validated.
        name: String,
        /// Salt, hash and grants.
        record: crate::auth::TokenRecord,
        /// Whether this is the bootstrap token.
        bootstrap: bool,
    },
    /// Delete a client token.
    DeleteToken {
        /// Token name.
        name: String,
    },
}

/// A stream as the API shows it (SPEC §3, stream info).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamInfo {
    /// Stream name.
    pub name: String,
    /// Its metadata.
    pub meta: StreamMeta,
}

/// What applying one log entry did; returned to the client that proposed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// A blank, membership or tick entry: nothing for a client.
    Nothing,
    /// `PutStream` applied.
    Stream {
        /// True when the stream did not exist before.
        created: bool,
        /// The stream after the change.
        info: StreamInfo,
    },
    /// `DeleteStream` applied.
    Deleted,
    /// A publish was accepted, or recognised as a duplicate.
    Published {
        /// The batch's seq.
        seq: u64,
        /// The batch's ts, ms since the Unix epoch.
        ts: u64,
        /// True when the batch was already stored; nothing was written.
        duplicate: bool,
        /// Raft log index of the entry that stored the batch (for a duplicate: of the original).
        index: u64,
    },
    /// The stream does not exist (and was not auto-created).
    StreamNotFound,
    /// The publish broke a rule of SPEC §2.3; nothing was written.
    Rejected(PublishRejection),
    /// The outcomes of a [`Command::Batch`], in order.
    Batch(Vec<Outcome>),
    /// A [`Command::PublishFrames`] was accepted (every frame stored by this entry), or every
    /// frame recognised as a duplicate (nothing written).
    FramesPublished {
        /// The first frame's seq.
        first_seq: u64,
        /// The last frame's seq.
        last_seq: u64,
        /// How many frames.
        count: u64,
        /// The frames' ts (for duplicates: the last frame's original's), ms since the Unix epoch.
        ts: u64,
        /// True when every frame was already stored; nothing was written.
        duplicate: bool,
        /// Raft log index of the entry that stored the frames (for duplicates: that stored the
        /// last frame's original).
        index: u64,
    },
    /// A [`Command::PublishFrames`] was refused by SPEC §6; nothing was written.
    FramesRejected(FramesRejection),
    /// A token command applied.
    Token(TokenOutcome),
}

/// What applying [`Command::PutToken`] or [`Command::DeleteToken`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TokenOutcome {
    /// The token was made.
    Created,
    /// A token of that name exists; nothing changed.
    Exists,
    /// A bootstrap token was made before; nothing changed.
    AlreadyBootstrapped,
    /// The token was deleted.
    Deleted,
    /// No token of that name; nothing changed.
    NotFound,
}

impl Command {
    /// Payload bytes the command carries: a publish's payload, a batch's sum (0 for everything
    /// else). What byte limits on proposals and entries count (framing left out).
    pub fn payload_bytes(&self) -> u64 {
        match self {
            Command::Publish { data, .. } => data.len() as u64,
            Command::PublishFrames { frames, .. } => frames.iter().map(|f| f.len() as u64).fold(0, u64::saturating_add),
            // Saturating: a sum that cannot overflow in practice must still not panic on any log.
            Command::Batch(cmds) => cmds.iter().map(Command::payload_bytes).fold(0, u64::saturating_add),
            _ => 0,
        }
    }
}

/// Payload bytes a log entry carries ([`Command::payload_bytes`]; 0 for blank and membership
/// entries).
pub fn entry_payload_bytes(entry: &openraft::Entry<TypeConfig>) -> u64 {
    match &entry.payload {
        openraft::EntryPayload::Normal(c) => c.payload_bytes(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The log holds commands postcard-encoded: a change of a payload's Rust type must not
    /// change a byte of them (entries written by older builds are read back, and nodes of two
    /// builds replicate to each other during an upgrade).
    #[test]
    fn publish_commands_keep_their_log_encoding() {
        let publish = Command::Publish {
            stream: "s".into(),
            seq: Some(2),
            ts: 3,
            auto_create: true,
            data: b"ab".to_vec().into(),
        };
        let frames = Command::PublishFrames {
            stream: "s".into(),
            seq: None,
            ts: 300,
            auto_create: false,
            frames: vec![b"x".to_vec().into(), Vec::new().into()],
        };
        let publish_bytes = postcard::to_allocvec(&publish).unwrap();
        let frames_bytes = postcard::to_allocvec(&frames).unwrap();
        // Variant 2, "s", Some(2), ts 3, true, 2 bytes "ab".
        assert_eq!(publish_bytes, [2, 1, b's', 1, 2, 3, 1, 2, b'a', b'b']);
        // Variant 5, "s", None, ts 300 (varint ac 02), false, 2 frames: "x" and empty.
        assert_eq!(frames_bytes, [5, 1, b's', 0, 0xac, 0x02, 0, 2, 1, b'x', 0]);
        assert_eq!(postcard::from_bytes::<Command>(&publish_bytes).unwrap(), publish);
        assert_eq!(postcard::from_bytes::<Command>(&frames_bytes).unwrap(), frames);
    }
}
