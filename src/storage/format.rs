//! The data directory's format version: the one-line file `FORMAT` at the top of a data
//! directory, `runnev data format N`.
//!
//! It versions everything under the directory together: the segment files of the Raft log, the
//! redb tables of the state machine and the Raft metadata, and the snapshot files (which also
//! carry their own magic). A build writes [`FORMAT_VERSION`] and reads the formats in
//! [`READABLE`]; a directory written by any other format is refused at open with both numbers,
//! before anything in it is opened or changed, rather than misread. A directory of an older
//! readable format is marked with the current one at open, before anything is written to it:
//! from then on it may hold records the older build would misread, so that build refuses it.
//! A directory without the file was written before the file existed, in format 1. The idea
//! follows etcd's and CockroachDB's version files beside their data.
//!
//! Formats: 1, batch values without a checksum; 2, batch values written from then on carry a
//! CRC-32 of their key and content (`storage::BatchValue`), and values of format 1 are still
//! read as they are; 3, payloads leave the database for per-stream payload segments
//! (`storage::payloads`) and the database keeps a 40-byte index row per batch
//! (`storage::IndexRow`). A directory of format 1 or 2 is marked 3 and then upgraded at its
//! first start, in one durable transaction (`Store::migrate_inline_batches`); 4, the current
//! snapshot a node keeps is a manifest of its own payload segments (`RUNNEVM1`,
//! `storage::snapshot`), which a build of format 3 would refuse; nothing is rewritten to go from
//! 3 to 4 (a whole snapshot left by format 3 is read as it is until the next one replaces it).
//! 5, the files of the Raft group a node hosts move from the top of the directory into
//! `groups/0/` (`storage::layout`), by renames at the first start (nothing is rewritten).
//! The snapshot a node sends is the same in all five (`RUNNEVS2`), and so is the Raft RPC
//! protocol, so a cluster can be upgraded one node at a time.
//!
//! Owns: reading, checking and writing `FORMAT`. Must never: rewrite data (a format that needs
//! its records rewritten comes with its own upgrade path) or touch any other file.

use std::io::Write;
use std::path::Path;

use super::StoreError;

/// The data format this build writes.
pub const FORMAT_VERSION: u32 = 5;

/// The data formats this build reads: its own; formats 1 and 2, whose inline batch values it
/// moves to payload segments at the first start (`Store::migrate_inline_batches`); 3 and 4,
/// read as they are. Formats 1 to 4 have their group's files moved into `groups/0/` at the first
/// start (`storage::layout::adopt_flat_layout`).
pub const READABLE: [u32; 5] = [1, 2, 3, 4, 5];

/// The file's name, in the data directory.
pub const FORMAT_FILE: &str = "FORMAT";

const PREFIX: &str = "runnev data format ";

/// Checks `dir`'s format: `true` when the directory has no file or holds an older readable
/// format, and [`write`] must mark it once the store opened. The mark waits for the open: a
/// start that fails (the database locked by a node of an older build still running on it, say)
/// must leave that node's directory in the format it reads. (The one exception is a directory
/// whose files must move into `groups/0/`: it is marked once no process holds its database and
/// before the first file moves, `storage::layout::adopt_flat_layout`.)
///
/// Errors: [`StoreError::UnsupportedFormat`] for a format outside [`READABLE`];
/// [`StoreError::Corrupt`] when the file is not one line `runnev data format N`;
/// [`StoreError::Io`] when it cannot be read.
pub(crate) fn check(dir: &Path) -> Result<bool, StoreError> {
    let path = dir.join(FORMAT_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            let found = parse(&bytes).ok_or_else(|| {
                StoreError::Corrupt(format!(
                    "{} does not read `{PREFIX}N` (it holds {} bytes)",
                    path.display(),
                    bytes.len()
                ))
            })?;
            if found == FORMAT_VERSION {
                Ok(false)
            } else if READABLE.contains(&found) {
                tracing::info!(dir = %dir.display(), from = found, to = FORMAT_VERSION, "data format to be upgraded");
                Ok(true)
            } else {
                Err(StoreError::UnsupportedFormat { found, supported: FORMAT_VERSION })
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// [`check`], then [`write`] when it says so (for the tests, which open no store).
#[cfg(test)]
fn check_or_write(dir: &Path) -> Result<(), StoreError> {
    if check(dir)? {
        write(dir)?;
    }
    Ok(())
}

/// The version in a `FORMAT` file's bytes: one line, `runnev data format N`, with or without
/// the final newline.
fn parse(bytes: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(bytes).ok()?;
    let line = text.strip_suffix('\n').unwrap_or(text);
    line.strip_prefix(PREFIX)?.parse().ok()
}

/// Marks `dir` as [`FORMAT_VERSION`], durably: temporary file, fsync, rename, fsync of the
/// directory.
///
/// Errors: [`StoreError::Io`] when the file cannot be written.
pub(crate) fn write(dir: &Path) -> Result<(), StoreError> {
    let tmp = dir.join(format!("{FORMAT_FILE}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(format!("{PREFIX}{FORMAT_VERSION}\n").as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, dir.join(FORMAT_FILE))?;
    super::sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_directory_gets_the_file_and_opens_again() {
        let dir = tempfile::tempdir().unwrap();
        check_or_write(dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join(FORMAT_FILE)).unwrap();
        assert_eq!(text, format!("runnev data format {FORMAT_VERSION}\n"));
        check_or_write(dir.path()).unwrap();
        assert!(!dir.path().join("FORMAT.tmp").exists());
    }

    #[test]
    fn another_format_is_refused_with_both_numbers_and_left_as_it_is() {
        for other in [0, FORMAT_VERSION + 1, 99] {
            let dir = tempfile::tempdir().unwrap();
            let text = format!("runnev data format {other}\n");
            std::fs::write(dir.path().join(FORMAT_FILE), &text).unwrap();
            match check_or_write(dir.path()) {
                Err(StoreError::UnsupportedFormat { found, supported: FORMAT_VERSION }) if found == other => {}
                got => panic!("format {other}: expected UnsupportedFormat, got {got:?}"),
            }
            assert_eq!(std::fs::read_to_string(dir.path().join(FORMAT_FILE)).unwrap(), text);
        }
    }

    #[test]
    fn format_1_is_read_and_marked_with_the_current_format() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FORMAT_FILE), "runnev data format 1\n").unwrap();
        check_or_write(dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join(FORMAT_FILE)).unwrap();
        assert_eq!(text, format!("runnev data format {FORMAT_VERSION}\n"));
    }

    #[test]
    fn a_damaged_file_is_corrupt_not_a_version() {
        for bad in [&b""[..], b"runnev data format", b"runnev data format x\n", b"format 1\n", b"\xff\xfe"] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join(FORMAT_FILE), bad).unwrap();
            assert!(matches!(check_or_write(dir.path()), Err(StoreError::Corrupt(_))), "{bad:?}");
        }
    }
}
