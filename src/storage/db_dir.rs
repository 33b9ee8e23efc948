//! The directory that holds the redb database file, and the creation of the database in it.
//!
//! A data directory whose [`DB_FILE`] does not exist yet gets one created atomically
//! (`open_database`): redb creates the database under [`DB_FILE_NEW`], the store's tables are
//! committed durably, the database is closed (which syncs its shutdown header), the file is
//! renamed to [`DB_FILE`] and the directory is fsynced; only then is it opened under its name.
//! So a file named [`DB_FILE`] is always one that was completely created once. Why: redb
//! initialises a new file in steps (it sizes it, writes and fsyncs its header, then writes and
//! fsyncs the magic number), and refuses a file that is not empty and lacks the magic number.
//! Created in place, a crash between those steps (a kill or a power loss) left a file that
//! every later start refused (`Not a redb database: magic number mismatch`): the node could
//! never start again on that directory (simulation seed 5101). A temporary file left by such a
//! crash is removed at the next start: a node that crashed there had not opened its store, so
//! it held nothing.
//!
//! The directory is a seam ([`DatabaseDir`]): production uses the real file system
//! ([`FsDatabaseDir`]), the simulation its simulated disk, and both run `open_database`.
//!
//! Owns: the database file's names in the data directory and the order of the creation's steps.
//! Must never: give a file named [`DB_FILE`] to redb to initialise (only the temporary file is
//! ever a new database), or remove or replace a file named [`DB_FILE`].

use std::io;
use std::path::PathBuf;

use redb::Database;

use super::StoreError;

/// The database's file name in the data directory.
pub const DB_FILE: &str = "runnev.redb";

/// The name the database is created under before it is renamed to [`DB_FILE`]; a file of this
/// name at start is what a crash during a creation left, and is removed.
pub const DB_FILE_NEW: &str = "runnev.redb.new";

/// The directory that holds the database file: the few file operations creating the database
/// atomically takes. Names are plain file names in the directory ([`DB_FILE`], [`DB_FILE_NEW`]).
pub trait DatabaseDir {
    /// A redb storage backend over one file of the directory.
    type Backend: redb::StorageBackend;
    /// Whether a file (or any entry) named `name` exists.
    fn exists(&self, name: &str) -> io::Result<bool>;
    /// The file `name` as a redb backend, created empty if it does not exist (the creation of
    /// the directory entry need not be durable: the rename and [`DatabaseDir::sync`] after it
    /// are what make a new database's name durable).
    fn backend(&self, name: &str) -> io::Result<Self::Backend>;
    /// Renames `from` to `to` atomically, replacing `to` if it exists: after a crash the
    /// directory holds one or the other, never a mix.
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
    /// Removes the file `name` (an error if there is none).
    fn remove(&self, name: &str) -> io::Result<()>;
    /// Makes the directory's entries durable (the names created, renamed and removed so far).
    fn sync(&self) -> io::Result<()>;
}

/// The database's directory on the real file system: `runnev serve`'s data directory.
#[derive(Debug, Clone)]
pub struct FsDatabaseDir {
    dir: PathBuf,
}

impl FsDatabaseDir {
    /// The directory `dir` (which must exist by the time it is used).
    pub fn new(dir: impl Into<PathBuf>) -> FsDatabaseDir {
        FsDatabaseDir { dir: dir.into() }
    }
}

impl DatabaseDir for FsDatabaseDir {
    type Backend = redb::backends::FileBackend;

    /// An entry of that name, whatever it is (a symbolic link counts, dangling or not).
    fn exists(&self, name: &str) -> io::Result<bool> {
        match std::fs::symlink_metadata(self.dir.join(name)) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Opened as redb's `Builder::create` opens its file: read and write, created if missing,
    /// never truncated. redb takes its lock on it when the database opens.
    fn backend(&self, name: &str) -> io::Result<redb::backends::FileBackend> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.dir.join(name))?;
        redb::backends::FileBackend::new(file).map_err(io::Error::other)
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        std::fs::rename(self.dir.join(from), self.dir.join(to))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        std::fs::remove_file(self.dir.join(name))
    }

    fn sync(&self) -> io::Result<()> {
        std::fs::File::open(&self.dir)?.sync_all()
    }
}

/// Opens the database [`DB_FILE`] of `dir`, first creating it atomically if it does not exist
/// (module doc): a leftover [`DB_FILE_NEW`] is removed; then, when [`DB_FILE`] is missing, a
/// database is created under [`DB_FILE_NEW`], `create_tables` commits its tables durably, it
/// is closed, renamed to [`DB_FILE`] and the directory is synced.
///
/// Errors: [`StoreError::Io`] when the directory cannot be read, or the temporary file removed,
/// created or renamed, or the directory synced; [`StoreError::Db`] when redb cannot create,
/// commit to, close or open the database (another process holds [`DB_FILE`]:
/// `redb::Error::DatabaseAlreadyOpen`; the file is not a redb database). A creation that fails
/// leaves at most [`DB_FILE_NEW`], removed at the next start, and never a [`DB_FILE`].
pub(crate) fn open_database(
    dir: &impl DatabaseDir,
    create_tables: impl FnOnce(&Database) -> Result<(), StoreError>,
) -> Result<Database, StoreError> {
    if dir.exists(DB_FILE_NEW)? {
        tracing::info!(file = DB_FILE_NEW, "removing a database whose creation a crash cut short");
        dir.remove(DB_FILE_NEW)?;
    }
    if !dir.exists(DB_FILE)? {
        let db = Database::builder().create_with_backend(dir.backend(DB_FILE_NEW)?)?;
        create_tables(&db)?;
        db.close()?;
        dir.rename(DB_FILE_NEW, DB_FILE)?;
        dir.sync()?;
    }
    Ok(Database::builder().create_with_backend(dir.backend(DB_FILE)?)?)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::storage::format::FORMAT_FILE;
    use crate::storage::layout::group0;
    use crate::storage::segments::FsSegments;
    use crate::storage::Store;

    /// A crash during a creation left `runnev.redb.new` (here: garbage, as a torn power loss
    /// leaves it) and no `runnev.redb`: the next start removes it and creates the database.
    #[test]
    fn a_leftover_temporary_database_is_removed_and_the_store_opens() {
        let dir = tempfile::tempdir().unwrap();
        let group = group0(dir.path());
        std::fs::create_dir_all(&group).unwrap();
        std::fs::write(group.join(DB_FILE_NEW), [0xa5u8; 8192]).unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert!(store.is_pristine().unwrap());
        assert!(!group.join(DB_FILE_NEW).exists(), "the leftover is gone");
        assert!(group.join(DB_FILE).exists());
    }

    /// A store created under the temporary name and renamed into place reopens with what it
    /// holds; a leftover temporary file beside it is removed and the database kept.
    #[test]
    fn a_store_created_atomically_reopens_with_what_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let group = group0(dir.path());
        let store = Store::open(dir.path()).unwrap();
        assert!(!group.join(DB_FILE_NEW).exists());
        store.mark_formed().unwrap();
        drop(store);
        std::fs::write(group.join(DB_FILE_NEW), b"junk").unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert!(store.formed().unwrap(), "the database in place was opened, not created again");
        assert!(!group.join(DB_FILE_NEW).exists());
    }

    /// The real file system's directory, whose rename fails: a creation cut short just before
    /// its rename.
    struct RenameFails(FsDatabaseDir);

    impl DatabaseDir for RenameFails {
        type Backend = redb::backends::FileBackend;
        fn exists(&self, name: &str) -> io::Result<bool> {
            self.0.exists(name)
        }
        fn backend(&self, name: &str) -> io::Result<Self::Backend> {
            self.0.backend(name)
        }
        fn rename(&self, _: &str, _: &str) -> io::Result<()> {
            Err(io::Error::other("the rename failed"))
        }
        fn remove(&self, name: &str) -> io::Result<()> {
            self.0.remove(name)
        }
        fn sync(&self) -> io::Result<()> {
            self.0.sync()
        }
    }

    /// A creation that fails before its rename leaves no `runnev.redb` and no `FORMAT` (the
    /// open failed), only the temporary file, which the next start replaces.
    #[test]
    fn a_creation_that_fails_before_its_rename_leaves_no_database() {
        let dir = tempfile::tempdir().unwrap();
        let group = group0(dir.path());
        let segments = Arc::new(FsSegments::new(group.join(crate::storage::layout::LOG_DIR)).unwrap());
        let payloads = Arc::new(
            crate::storage::payloads::FsPayloads::new(group.join(crate::storage::layout::PAYLOADS_DIR)).unwrap(),
        );
        let failed = Store::open_with(dir.path(), &RenameFails(FsDatabaseDir::new(&group)), segments, payloads);
        assert!(matches!(failed, Err(StoreError::Io(_))), "{:?}", failed.err());
        assert!(group.join(DB_FILE_NEW).exists());
        assert!(!group.join(DB_FILE).exists());
        assert!(!dir.path().join(FORMAT_FILE).exists());
        let store = Store::open(dir.path()).unwrap();
        assert!(store.is_pristine().unwrap());
        assert!(!group.join(DB_FILE_NEW).exists());
    }
}
