//! Where a consumer keeps its cursor between runs.
//!
//! Owns: durable, atomic cursor storage. Must never: leave a torn or empty cursor file after a
//! crash (write to a temporary file, fsync, rename over, fsync the directory).

use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Saves and loads a consumer's cursor: the last seq it fully processed (0 for none).
/// Save it *after* the side effect of that seq is durable; on restart, resume from `load()` and
/// skip `seq <= cursor`.
pub trait CursorStore: Send + Sync {
    /// The saved cursor, or 0 when none was saved.
    ///
    /// Errors: the store cannot be read or holds something that is not a cursor.
    fn load(&self) -> io::Result<u64>;
    /// Saves `cursor` durably before returning.
    ///
    /// Errors: the store cannot be written; the previous cursor is kept.
    fn save(&self, cursor: u64) -> io::Result<()>;
}

/// A cursor in a small text file holding the seq in decimal.
#[derive(Debug, Clone)]
pub struct FileCursor {
    path: PathBuf,
}

impl FileCursor {
    /// A cursor stored at `path` (created on first save).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        FileCursor { path: path.into() }
    }

    fn dir(&self) -> &Path {
        match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        }
    }
}

impl CursorStore for FileCursor {
    fn load(&self) -> io::Result<u64> {
        match std::fs::read_to_string(&self.path) {
            Ok(s) => {
                let t = s.trim();
                if t == "-1" {
                    return Ok(0);
                }
                t.parse().map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{} holds {t:?}, not a seq", self.path.display()),
                    )
                })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(e),
        }
    }

    fn save(&self, cursor: u64) -> io::Result<()> {
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let mut f = std::fs::File::create(&tmp)?;
        writeln!(f, "{cursor}")?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &self.path)?;
        std::fs::File::open(self.dir())?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saves_atomically_and_loads_back() {
        let dir = tempfile::tempdir().unwrap();
        let c = FileCursor::new(dir.path().join("cursor"));
        assert_eq!(c.load().unwrap(), 0);
        c.save(42).unwrap();
        assert_eq!(c.load().unwrap(), 42);
        c.save(43).unwrap();
        assert_eq!(c.load().unwrap(), 43);
        assert!(!dir.path().join("cursor.tmp").exists());
        std::fs::write(dir.path().join("cursor"), "-1\n").unwrap();
        assert_eq!(c.load().unwrap(), 0);
        std::fs::write(dir.path().join("cursor"), "garbage").unwrap();
        assert!(c.load().is_err());
    }
}
