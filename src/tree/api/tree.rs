//! The public handle, [`Tree`]: a thin facade over the shared state (`shared.rs`) and the
//! background threads (`background.rs`).

use super::keyspace::Keyspace;
use crate::config::Config;
use crate::error::Result;
use crate::limits::Limits;
use crate::tree::background::Background;
use crate::tree::keyspace::Space;
use crate::tree::persist;
use crate::tree::shared::Shared;
use crate::tree::stats::Stats;

/// A concurrent, persistent ordered key-value map. See the crate docs for an overview.
///
/// `Tree` is `Send + Sync`; every method takes `&self`, so share it with `Arc<Tree>` or
/// scoped threads.
///
/// ```
/// use bfkv::{Config, Tree};
/// let tree = Tree::open(Config::in_memory())?;
/// tree.insert(b"apple", b"red")?;
/// assert_eq!(tree.get(b"apple")?, Some(b"red".to_vec()));
/// tree.remove(b"apple")?;
/// assert_eq!(tree.get(b"apple")?, None);
/// # Ok::<(), bfkv::Error>(())
/// ```
pub struct Tree {
    pub(super) shared: std::sync::Arc<Shared>,
    background: Background,
}

impl Tree {
    /// Opens the tree described by `config`: creates the directory and an empty tree if
    /// absent or empty, otherwise loads its last checkpoint. A path that is not a tree's is
    /// refused before anything is created there.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for bad settings (or a page size that differs from the
    /// existing tree's), [`Error::Locked`](crate::Error::Locked) if another `Tree` (in this or another process)
    /// has the directory open, [`Error::Corruption`](crate::Error::Corruption) if the checkpoint or data file is
    /// damaged, [`Error::Io`](crate::Error::Io) for operating-system failures, and of kind `NotADirectory` for a
    /// path that is a file, `DirectoryNotEmpty` for a directory holding files but no tree.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let tree = bfkv::Tree::open(bfkv::Config::new(dir.path()))?;
    /// // A second handle on the same directory is refused while the first is open.
    /// let second = bfkv::Tree::open(bfkv::Config::new(dir.path()));
    /// assert!(matches!(second, Err(bfkv::Error::Locked { .. })));
    /// # drop(tree);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(config: Config) -> Result<Tree> {
        config.validate()?;
        // Shuttle explores the foreground paths only: no background threads in its models.
        let threads = if cfg!(shuttle) {
            0
        } else {
            config.evictor_threads
        };
        let shared = std::sync::Arc::new(persist::open(config)?);
        Ok(Tree {
            background: Background::start(&shared, threads),
            shared,
        })
    }

    /// A handle on the keyspace named `name`, created (durably, per the tree's
    /// [`Durability`](crate::Durability)) if it does not exist yet. Names are 1 to 255 bytes.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for an empty or too long name;
    /// as [`Tree::insert`] when the creation is written.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let tree = bfkv::Tree::open(bfkv::Config::new(dir.path()))?;
    /// tree.keyspace("users")?.insert(b"1", b"ada")?;
    /// tree.close()?;
    /// let tree = bfkv::Tree::open(bfkv::Config::new(dir.path()))?;
    /// assert_eq!(tree.keyspaces()?, ["users"]);
    /// assert_eq!(tree.keyspace("users")?.get(b"1")?, Some(b"ada".to_vec()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn keyspace(&self, name: &str) -> Result<Keyspace> {
        let space = self.shared.keyspace_named(name)?;
        Ok(Keyspace::new(self.shared.clone(), space))
    }

    /// An empty [`Batch`](crate::Batch) of writes to this tree's keyspaces, applied all or
    /// nothing by [`Batch::commit`](crate::Batch::commit).
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let accounts = tree.keyspace("accounts")?;
    /// accounts.insert(b"alice", 100u64.to_le_bytes())?;
    /// let mut batch = tree.batch();
    /// batch.insert(&accounts, b"alice", 60u64.to_le_bytes());
    /// batch.insert(&accounts, b"bob", 40u64.to_le_bytes());
    /// batch.commit()?;
    /// assert_eq!(accounts.get(b"bob")?, Some(40u64.to_le_bytes().to_vec()));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn batch(&self) -> crate::Batch {
        crate::Batch::new(self.shared.clone())
    }

    /// A handle on the default keyspace, the one the tree's own methods act on (so a batch
    /// can name it).
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// tree.default_keyspace().insert(b"k", b"v")?;
    /// assert_eq!(tree.get(b"k")?, Some(b"v".to_vec()));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn default_keyspace(&self) -> Keyspace {
        Keyspace::new(self.shared.clone(), self.default_space().clone())
    }

    /// The names of the tree's keyspaces, in byte order (the default keyspace has none).
    ///
    /// # Errors
    /// [`Error::Io`](crate::Error::Io) or [`Error::Corruption`](crate::Error::Corruption)
    /// reading the catalog.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// tree.keyspace("b")?;
    /// tree.keyspace("a")?;
    /// assert_eq!(tree.keyspaces()?, ["a", "b"]);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn keyspaces(&self) -> Result<Vec<String>> {
        self.shared.keyspace_names()
    }

    /// Removes the keyspace named `name` and every key in it (nothing if it does not
    /// exist). Its handles answer [`Error::KeyspaceDropped`](crate::Error::KeyspaceDropped)
    /// from then on; a keyspace created later under the same name starts empty. The keys
    /// are removed before this returns (a crash part way is finished by the next `open`);
    /// their pages are freed as the emptied leaves are written back.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for an invalid name; as
    /// [`Tree::remove`] for the removals.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let tmp = tree.keyspace("tmp")?;
    /// tmp.insert(b"k", b"v")?;
    /// tree.drop_keyspace("tmp")?;
    /// assert!(matches!(tmp.get(b"k"), Err(bfkv::Error::KeyspaceDropped { .. })));
    /// assert_eq!(tree.keyspace("tmp")?.get(b"k")?, None);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn drop_keyspace(&self, name: &str) -> Result<()> {
        self.shared.drop_keyspace(name)
    }

    /// Copies the tree into the new directory `target`, online: writers go on during the
    /// copy (only checkpoints wait for it). The copy is an independent tree that
    /// [`Tree::open`] opens (while this one is open too) and holds every write acknowledged
    /// before the call. The data file is copied (the kernel shares blocks where the file
    /// system can, as on XFS and Btrfs), complete log segments are hard-linked, and the
    /// copy is opened and closed once before this returns, so it is checked and needs no
    /// recovery. With a log (`Sync`, `Buffered`) the copy is the tree after a prefix of the
    /// acknowledged writes; under `Durability::None`, which keeps no order of writes, each
    /// write made while the backup runs may be in it or not. Until the copy is complete
    /// `target` holds the file `BACKUP-INCOMPLETE`, so what a crash, a kill or a full disk
    /// leaves of it is refused by [`Tree::open`] (`Corruption` naming that file).
    ///
    /// # Errors
    /// [`Error::Io`](crate::Error::Io) of kind `AlreadyExists` if anything is at `target`
    /// (nothing there is touched); [`Error::InvalidInput`](crate::Error::InvalidInput) for a
    /// target inside the tree's own directory, however the path reaches it (`..`, links;
    /// nothing is written); [`Error::InvalidConfig`](crate::Error::InvalidConfig) for
    /// an in-memory tree; I/O errors of the copy, after which `target` is removed again.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let tree = bfkv::Tree::open(bfkv::Config::new(dir.path().join("db")))?;
    /// tree.insert(b"k", b"v")?;
    /// tree.backup(dir.path().join("copy"))?;
    /// let copy = bfkv::Tree::open(bfkv::Config::new(dir.path().join("copy")))?;
    /// assert_eq!(copy.get(b"k")?, Some(b"v".to_vec()));
    /// assert!(tree.backup(dir.path().join("copy")).is_err()); // never overwrites
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn backup(&self, target: impl AsRef<std::path::Path>) -> Result<()> {
        self.shared.backup(target.as_ref())
    }

    /// The default keyspace's state.
    pub(super) fn default_space(&self) -> &std::sync::Arc<Space> {
        self.shared.catalog().default_space()
    }

    /// Makes every write acknowledged so far durable, whatever the [`Durability`]: syncs the
    /// write-ahead log, or (under `Durability::None`) writes a checkpoint.
    ///
    /// [`Durability`]: crate::Durability
    ///
    /// # Errors
    /// [`Error::Io`](crate::Error::Io) if writing or syncing fails; acknowledged data stays intact.
    ///
    /// ```
    /// use bfkv::{Config, Durability, Tree};
    /// let dir = tempfile::tempdir()?;
    /// let tree = Tree::open(Config::new(dir.path()).durability(Durability::Buffered))?;
    /// tree.insert(b"k", b"v")?;
    /// tree.flush()?; // now on stable storage, as if written with `Durability::Sync`
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn flush(&self) -> Result<()> {
        self.shared.flush()
    }

    /// Writes a checkpoint: dirty mini-pages are merged into their leaves and written, then
    /// the leaf map is saved atomically. A no-op for in-memory trees.
    ///
    /// # Errors
    /// [`Error::Io`](crate::Error::Io) if writing or syncing fails.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let tree = bfkv::Tree::open(bfkv::Config::new(dir.path()))?;
    /// tree.insert(b"k", b"v")?;
    /// tree.checkpoint()?;
    /// assert!(tree.stats().checkpoints >= 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn checkpoint(&self) -> Result<()> {
        self.shared.checkpoint()
    }

    /// Checkpoints and closes the tree. Dropping the tree does the same, ignoring errors.
    ///
    /// # Errors
    /// As [`Tree::checkpoint`].
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let tree = bfkv::Tree::open(bfkv::Config::new(dir.path()))?;
    /// tree.insert(b"k", b"v")?;
    /// tree.close()?; // errors surface here; dropping the tree would ignore them
    /// let tree = bfkv::Tree::open(bfkv::Config::new(dir.path()))?;
    /// assert_eq!(tree.get(b"k")?, Some(b"v".to_vec()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn close(mut self) -> Result<()> {
        self.stop_background();
        self.shared.close()
    }

    fn stop_background(&mut self) {
        self.background.stop();
    }

    /// This tree with its background threads stopped: checkpoints and evictions then run
    /// only when a test calls them.
    #[cfg(all(test, not(shuttle)))]
    pub(crate) fn without_background(mut self) -> Tree {
        self.stop_background();
        self
    }

    /// Counters describing what the tree has done so far (cheap to read).
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// tree.insert(b"k", b"v")?;
    /// tree.get(b"k")?;
    /// assert_eq!(tree.stats().cache_hits, 1);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// Where the cache's bytes are right now (diagnosis; walks every leaf).
    #[cfg(any(fuzzing, bfkv_internals))]
    #[doc(hidden)]
    pub fn census(&self) -> crate::tree::census::Census {
        self.shared.census()
    }

    /// A tree over already opened state with `threads` evictor threads (tests that open over
    /// fault-injecting disks or watch the evictors' bell).
    #[cfg(any(all(test, not(shuttle)), fuzzing, bfkv_internals))]
    pub(crate) fn from_shared(shared: std::sync::Arc<Shared>, threads: usize) -> Tree {
        Tree {
            background: Background::start(&shared, threads),
            shared,
        }
    }

    /// The shared state, for tests that look inside.
    #[cfg(any(test, fuzzing, bfkv_internals))]
    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// The key and value size limits of this tree.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let limits = tree.limits();
    /// assert!(tree.insert(vec![0u8; limits.max_key_len], b"").is_ok());
    /// assert!(tree.insert(vec![0u8; limits.max_key_len + 1], b"").is_err());
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn limits(&self) -> Limits {
        self.shared.limits()
    }

    /// The size of this tree's leaf pages in bytes: the one it was created with
    /// ([`Config::page_size`](crate::Config::page_size)).
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let tree = bfkv::Tree::open(bfkv::Config::new(dir.path()).page_size(16 << 10))?;
    /// tree.close()?;
    /// // Reopened without a page size, it keeps its own.
    /// let tree = bfkv::Tree::open(bfkv::Config::new(dir.path()))?;
    /// assert_eq!(tree.page_size(), 16 << 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn page_size(&self) -> usize {
        self.shared.page_size()
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        self.stop_background();
        let _ = self.shared.close();
    }
}

impl std::fmt::Debug for Tree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tree")
            .field("dir", &self.shared.config().dir)
            .finish_non_exhaustive()
    }
}
