//! The data directory's layout by Raft group: which files are the node's and which are a
//! group's.
//!
//! A data directory (`--data-dir`) holds the node's `FORMAT` ([`super::format`]) and one
//! directory per Raft group the node hosts, `groups/<group id>/`, with everything of that group:
//! its Raft log (`log/`), its payload segments (`payloads/`), its database (`runnev.redb`: its
//! vote, its state machine and batch index, its Raft metadata) and its snapshot
//! (`snapshot.bin`). Each group is one [`super::Store`]; nothing a store writes lives outside
//! its group's directory, so a node can host several groups side by side, each with its own
//! term, vote, log index and commit, and streams can later be spread over them. The idea is
//! the one CockroachDB's ranges and TiKV's regions are built on: one Raft group per shard of the
//! keyspace, many per node (TiKV keeps them in one engine; Runnev keeps a directory per group, so
//! moving or dropping a group is a directory operation).
//!
//! Today a node hosts one group, [`GroupId::CLUSTER`] (id 0): every stream, the cluster's
//! membership and its tokens. Data formats 1 to 4 kept that group's files at the top of the
//! data directory; `adopt_flat_layout` moves them into `groups/0/` at the first start of a
//! build of format 5, by renames (nothing is rewritten), after marking the directory format 5.
//!
//! Owns: the path of a group's directory and the move of the flat layout into group 0's.
//! Must never: read or rewrite the files it moves, or move any while another process holds the
//! database.

use std::path::{Path, PathBuf};

use super::StoreError;

/// The directory of the groups, in the data directory.
pub const GROUPS_DIR: &str = "groups";

/// A group's Raft log, in its directory ([`super::segments`]).
pub const LOG_DIR: &str = "log";

/// A group's payload segments, in its directory ([`super::payloads`]).
pub const PAYLOADS_DIR: &str = "payloads";

/// A Raft group's id: the name of its directory under [`GROUPS_DIR`] and the group its Raft
/// RPCs address (`/raft/groups/<id>/…`, [`crate::raft::network`]). Group 0 is every cluster's
/// ([`GroupId::CLUSTER`]); further ids are for the cluster to assign once streams are spread
/// over groups (not built yet), never for a node to pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct GroupId(pub u32);

impl GroupId {
    /// The group every cluster has: all its streams today, its membership and its tokens.
    pub const CLUSTER: GroupId = GroupId(0);
}

impl std::fmt::Display for GroupId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The directory of `group` in the data directory `data_dir`: `data_dir/groups/<id>`.
pub fn group_dir(data_dir: &Path, group: GroupId) -> PathBuf {
    data_dir.join(GROUPS_DIR).join(group.to_string())
}

/// The directory of the cluster's group in `data_dir` (the tests' shorthand).
#[cfg(test)]
pub(crate) fn group0(data_dir: &Path) -> PathBuf {
    group_dir(data_dir, GroupId::CLUSTER)
}

/// The names data formats 1 to 4 gave group 0's files at the top of the data directory: the
/// Raft log, the payload segments, the database (and the temporary file it is created as), and
/// every snapshot file (`snapshot.bin` and the temporary `snapshot.*.tmp` files a crash may
/// have left).
fn is_flat_layout_name(name: &str) -> bool {
    matches!(name, LOG_DIR | PAYLOADS_DIR | super::db_dir::DB_FILE | super::db_dir::DB_FILE_NEW)
        || name.starts_with("snapshot.")
}

/// Moves group 0's files that a data directory of format 1 to 4 keeps at its top into
/// `groups/0/` ([`group_dir`]), one rename each, then fsyncs the three directories. Returns how
/// many it moved (0 for a new directory, or one already of format 5 with nothing left at its
/// top).
///
/// `older` says the directory's `FORMAT` is older than 5 (or absent). Before the first rename
/// it checks that no process holds the database (at the top, or in `groups/0/`: a node of an
/// older build still running on the directory would go on writing to files moved from under
/// it), and marks an older directory format 5, so that from the first rename on a build of
/// format 4 refuses the directory instead of starting empty on a top it finds bare (it would
/// rejoin as a wiped node). A crash part way leaves a directory of format 5 with some files
/// still at its top: the next start moves the rest, which is why a directory of format 5 is
/// looked at too.
///
/// Errors: [`StoreError::Corrupt`] when a file is both at the top and in `groups/0/` (nothing is
/// moved or marked: which one holds the node's state cannot be told);
/// [`StoreError::Db`] (`DatabaseAlreadyOpen`) when another process holds the database (nothing
/// is moved or marked); [`StoreError::Io`] when a directory cannot be read, created, renamed
/// into or fsynced, or `FORMAT` cannot be written.
pub(crate) fn adopt_flat_layout(data_dir: &Path, older: bool) -> Result<usize, StoreError> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(data_dir)? {
        let entry = entry?;
        if let Some(name) = entry.file_name().to_str().filter(|n| is_flat_layout_name(n)) {
            names.push(name.to_string());
        }
    }
    if names.is_empty() {
        return Ok(0);
    }
    names.sort();
    let group = group_dir(data_dir, GroupId::CLUSTER);
    for name in &names {
        if std::fs::symlink_metadata(group.join(name)).is_ok() {
            return Err(StoreError::Corrupt(format!(
                "{} and {} both exist: a data directory of format 4 or older keeps group 0's files at its top, one of \
                 format 5 under {}; move away the one that is not this node's state",
                data_dir.join(name).display(),
                group.join(name).display(),
                group.display()
            )));
        }
    }
    let _held = [data_dir.join(super::db_dir::DB_FILE), group.join(super::db_dir::DB_FILE)]
        .iter()
        .filter(|p| p.exists())
        .map(|p| hold(p))
        .collect::<Result<Vec<_>, _>>()?;
    if older {
        super::format::write(data_dir)?;
    }
    std::fs::create_dir_all(&group)?;
    for name in &names {
        std::fs::rename(data_dir.join(name), group.join(name))?;
    }
    for dir in [group.as_path(), &data_dir.join(GROUPS_DIR), data_dir] {
        super::sync_dir(dir)?;
    }
    tracing::info!(data_dir = %data_dir.display(), moved = ?names, to = %group.display(), "moved group 0's files into its directory (data format 5)");
    Ok(names.len())
}

/// The database file at `path` locked against every other process for as long as the
/// returned file is held (redb takes the same whole-file lock on the databases it opens), or
/// [`StoreError::Db`] (`DatabaseAlreadyOpen`) when another process holds it.
fn hold(path: &Path) -> Result<std::fs::File, StoreError> {
    let file = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(StoreError::Db(redb::Error::DatabaseAlreadyOpen)),
        Err(std::fs::TryLockError::Error(e)) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        v.sort();
        v
    }

    #[test]
    fn a_group_directory_is_named_by_its_id_under_groups() {
        assert_eq!(group_dir(Path::new("/d"), GroupId::CLUSTER), Path::new("/d/groups/0"));
        assert_eq!(group_dir(Path::new("/d"), GroupId(17)), Path::new("/d/groups/17"));
    }

    #[test]
    fn the_flat_layout_moves_into_group_0_and_leaves_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("log")).unwrap();
        std::fs::write(d.join("log").join("1.seg"), b"entries").unwrap();
        std::fs::create_dir(d.join("payloads")).unwrap();
        std::fs::write(d.join("runnev.redb"), b"db").unwrap();
        std::fs::write(d.join("snapshot.bin"), b"snap").unwrap();
        std::fs::write(d.join("snapshot.install.tmp"), b"half").unwrap();
        std::fs::write(d.join("FORMAT"), b"runnev data format 4\n").unwrap();
        std::fs::write(d.join("operator-notes.txt"), b"mine").unwrap();
        assert_eq!(adopt_flat_layout(d, true).unwrap(), 5);
        // Marked before the first file moved: a build of format 4 refuses it from then on.
        assert_eq!(std::fs::read_to_string(d.join("FORMAT")).unwrap(), "runnev data format 5\n");
        assert_eq!(names(d), ["FORMAT", "groups", "operator-notes.txt"]);
        let g = group_dir(d, GroupId::CLUSTER);
        assert_eq!(names(&g), ["log", "payloads", "runnev.redb", "snapshot.bin", "snapshot.install.tmp"]);
        assert_eq!(std::fs::read(g.join("log").join("1.seg")).unwrap(), b"entries");
        assert_eq!(std::fs::read(g.join("snapshot.bin")).unwrap(), b"snap");
        // Done: a second call finds nothing to move.
        assert_eq!(adopt_flat_layout(d, false).unwrap(), 0);
    }

    /// A crash after the mark and the first renames: the directory says format 5, some files
    /// are still at its top; the next start moves them.
    #[test]
    fn a_move_cut_part_way_is_finished_by_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let g = group_dir(d, GroupId::CLUSTER);
        std::fs::create_dir_all(g.join("log")).unwrap();
        std::fs::write(d.join("FORMAT"), b"runnev data format 5\n").unwrap();
        std::fs::write(d.join("runnev.redb"), b"db").unwrap();
        std::fs::write(d.join("snapshot.bin"), b"snap").unwrap();
        assert_eq!(adopt_flat_layout(d, false).unwrap(), 2);
        assert_eq!(names(&g), ["log", "runnev.redb", "snapshot.bin"]);
        assert_eq!(names(d), ["FORMAT", "groups"]);
    }

    /// A node of an older build still runs on the directory and holds its database: nothing is
    /// moved or marked (the running node would go on writing to files moved from under it, and
    /// start empty at its next start).
    #[test]
    fn a_flat_layout_whose_database_a_running_node_holds_is_left_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let running = redb::Database::create(d.join("runnev.redb")).unwrap();
        std::fs::create_dir(d.join("log")).unwrap();
        std::fs::write(d.join("FORMAT"), b"runnev data format 4\n").unwrap();
        let e = adopt_flat_layout(d, true).unwrap_err();
        assert!(matches!(e, StoreError::Db(redb::Error::DatabaseAlreadyOpen)), "{e}");
        assert_eq!(names(d), ["FORMAT", "log", "runnev.redb"]);
        assert_eq!(std::fs::read_to_string(d.join("FORMAT")).unwrap(), "runnev data format 4\n");
        drop(running);
        assert_eq!(adopt_flat_layout(d, true).unwrap(), 2, "once it stopped");
    }

    #[test]
    fn a_file_both_at_the_top_and_in_group_0_is_refused_and_nothing_moves() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let g = group_dir(d, GroupId::CLUSTER);
        std::fs::create_dir_all(&g).unwrap();
        std::fs::write(g.join("runnev.redb"), b"new").unwrap();
        std::fs::write(d.join("runnev.redb"), b"old").unwrap();
        std::fs::write(d.join("snapshot.bin"), b"snap").unwrap();
        std::fs::write(d.join("FORMAT"), b"runnev data format 4\n").unwrap();
        let e = adopt_flat_layout(d, true).unwrap_err();
        assert!(matches!(&e, StoreError::Corrupt(m) if m.contains("both exist")), "{e}");
        assert_eq!(std::fs::read_to_string(d.join("FORMAT")).unwrap(), "runnev data format 4\n");
        assert_eq!(names(d), ["FORMAT", "groups", "runnev.redb", "snapshot.bin"]);
        assert_eq!(std::fs::read(g.join("runnev.redb")).unwrap(), b"new");
    }
}
