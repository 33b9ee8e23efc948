//! The data directory's format version: the one-line file `FORMAT` at the top of a data
//! directory, `runnev data format N`.
//!
//! It versions everything under the directory together: the segment files of the Raft log, the
//! redb tables of the state machine and the Raft metadata, and the snapshot files (which also
//! carry their own magic). A build reads exactly the format it writes ([`FORMAT_VERSION`]); a
//! directory written by another format is refused at open with both numbers, before anything in
//! it is opened or changed, rather than misread. A directory without the file was written before
//! the file existed, in format 1, and gets the file. The idea follows etcd's and CockroachDB's
//! version files beside their data.
//!
//! Owns: reading, checking and writing `FORMAT`. Must never: migrate data (a new format comes
//! with its own upgrade path) or touch any other file.

use std::io::Write;
use std::path::Path;

use super::StoreError;

/// The data format this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;

/// The file's name, in the data directory.
pub const FORMAT_FILE: &str = "FORMAT";

const PREFIX: &str = "runnev data format ";

/// Checks `dir`'s format, writing the file (durably: temporary file, fsync, rename, fsync of the
/// directory) when the directory has none.
///
/// Errors: [`StoreError::UnsupportedFormat`] for another format's directory;
/// [`StoreError::Corrupt`] when the file is not one line `runnev data format N`;
/// [`StoreError::Io`] when it cannot be read or written.
pub(crate) fn check_or_write(dir: &Path) -> Result<(), StoreError> {
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
                Ok(())
            } else {
                Err(StoreError::UnsupportedFormat { found, supported: FORMAT_VERSION })
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => write(dir),
        Err(e) => Err(e.into()),
    }
}

/// The version in a `FORMAT` file's bytes: one line, `runnev data format N`, with or without
/// the final newline.
fn parse(bytes: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(bytes).ok()?;
    let line = text.strip_suffix('\n').unwrap_or(text);
    line.strip_prefix(PREFIX)?.parse().ok()
}

fn write(dir: &Path) -> Result<(), StoreError> {
    let tmp = dir.join(format!("{FORMAT_FILE}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(format!("{PREFIX}{FORMAT_VERSION}\n").as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, dir.join(FORMAT_FILE))?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
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
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FORMAT_FILE), "runnev data format 2\n").unwrap();
        match check_or_write(dir.path()) {
            Err(StoreError::UnsupportedFormat { found: 2, supported: FORMAT_VERSION }) => {}
            other => panic!("expected UnsupportedFormat, got {other:?}"),
        }
        assert_eq!(std::fs::read_to_string(dir.path().join(FORMAT_FILE)).unwrap(), "runnev data format 2\n");
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
