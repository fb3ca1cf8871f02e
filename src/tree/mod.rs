//! The tree core: inner nodes, leaf and mini-page operations, eviction, scans, persistence.
//!
//! Locking, in one place (the invariants every file here relies on):
//! - A leaf and its mini-page are protected by the leaf's lock in the mapping table
//!   (`pool`). Every access to a mini-page's bytes or a leaf's disk page happens under it.
//! - Inner nodes are immutable; structure changes (leaf split, leaf removal) build a new root
//!   and publish it under the structure lock `smo`, then bump `smo_version` before the leaf
//!   lock of the changed leaf is released. A reader reads the version, walks down, locks the
//!   leaf, and re-reads the version: if it moved, the leaf it locked may no longer own the
//!   key, so it unlocks and restarts.
//! - Lock order: leaf lock, then `smo`. A thread that holds a leaf lock only ever *tries*
//!   `smo`; when that fails it releases everything and restarts. So the holder of `smo` (a
//!   checkpoint) may block on leaf locks without deadlock.
//! - Nobody evicts while holding a leaf lock: an operation that cannot allocate releases its
//!   locks, evicts one block, and restarts.

mod admit;
mod background;
#[cfg(any(test, fuzzing, bfkv_internals))]
mod census;
#[cfg(any(test, fuzzing, bfkv_internals))]
mod check;
mod checkpoint;
mod clean;
#[cfg(any(all(test, not(shuttle)), fuzzing, bfkv_internals))]
pub(crate) mod crash;
mod evict;
mod inner;
mod leaf;
mod persist;
#[cfg(all(test, not(shuttle)))]
mod power_tests;
mod scan;
#[cfg(all(test, shuttle))]
mod shuttle_tests;
mod stats;
#[cfg(test)]
mod tests;

use std::path::PathBuf;

use crate::config::{Config, Limits};
use crate::error::{Error, Result};
use crate::node::{NodeKind, NodeMut};
use crate::pool::{BufferPool, Location, PageId, ReadGuard, WriteGuard};
use crate::store::{PageBuf, PageStore};
use crate::sync::{self, Arc, AtomicBool, AtomicU64, Mutex, MutexGuard, Ordering, RcuCell};
use crate::wal::{Appended, LogOp, Lsn, Wal};

#[cfg(any(fuzzing, bfkv_internals))]
pub use census::Census;
use inner::{Inner, Path, Seek};
pub use scan::Range;
use stats::Counters;
pub use stats::Stats;

/// The disk page of a leaf that has never been written (the largest a mapping entry holds;
/// the store never allocates it).
const NO_PAGE: u64 = crate::pool::MAX_DISK_PAGE;

/// Node flag (tree-owned bit of the node header): a full-page mirror that differs from disk.
const FLAG_DIRTY: u8 = 1 << 2;

/// The state shared by every handle and iterator of one open tree.
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) limits: Limits,
    pub(crate) page_size: usize,
    pub(crate) pool: BufferPool,
    pub(crate) store: Option<Arc<dyn PageStore>>,
    pub(crate) data_path: PathBuf,
    root: RcuCell<Inner>,
    smo: Mutex<()>,
    smo_version: AtomicU64,
    pub(crate) pages: persist::PageTracker,
    pub(crate) counters: Counters,
    /// Which disk reads promote their record (`admit.rs`).
    pub(crate) doorkeeper: admit::Doorkeeper,
    closed: AtomicBool,
    dir: Option<persist::DirLock>,
    /// The write-ahead log of a file-backed tree (opened even under `Durability::None`, so
    /// that a log left by an earlier session is replayed).
    pub(crate) wal: Option<Wal>,
    /// Whether writes are logged (`Sync` and `Buffered`).
    pub(crate) log_writes: bool,
    /// The LSN the last durable checkpoint covers: replay starts there.
    pub(crate) checkpoint_lsn: AtomicU64,
    /// Wakes the evictor threads (`background`): rung by whoever takes buffer room while
    /// the buffer is short of it.
    pub(crate) evict_bell: std::sync::Arc<background::Control>,
}

/// What a write does to its key.
#[derive(Clone, Copy)]
pub(crate) enum WriteOp<'a> {
    Put(&'a [u8]),
    Delete,
}

/// Why an attempt at an operation must be restarted after releasing every lock.
pub(crate) enum Restart {
    /// The buffer is full: evict, then retry.
    NeedSpace,
    /// The structure lock is busy or the structure changed: retry.
    Retry,
}

/// Result of one attempt: done, or restart for a reason.
pub(crate) type Attempt<T> = Result<std::result::Result<T, Restart>>;

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
    shared: std::sync::Arc<Shared>,
    background: background::Background,
}

impl Tree {
    /// Opens the tree described by `config`: creates the directory and an empty tree if
    /// absent, otherwise loads its last checkpoint.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for bad settings (or a page size that differs from the
    /// existing tree's), [`Error::Locked`] if another `Tree` (in this or another process)
    /// has the directory open, [`Error::Corruption`] if the checkpoint or data file is
    /// damaged, [`Error::Io`] for operating-system failures.
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
            background: background::Background::start(&shared, threads),
            shared,
        })
    }

    /// Inserts `key` → `value`, replacing any previous value.
    ///
    /// # Errors
    /// [`Error::KeyTooLarge`] / [`Error::ValueTooLarge`] past [`Limits`] (the tree is
    /// unchanged), [`Error::CacheFull`] for a full in-memory tree, [`Error::Io`] or
    /// [`Error::Corruption`] if making room needed the disk and it failed.
    pub fn insert(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<()> {
        let (key, value) = (key.as_ref(), value.as_ref());
        self.shared.limits.check(key, value)?;
        self.shared.write(key, WriteOp::Put(value))?;
        self.after_write();
        Ok(())
    }

    /// Removes `key`. Removing an absent key is not an error.
    ///
    /// # Errors
    /// As [`Tree::insert`].
    pub fn remove(&self, key: impl AsRef<[u8]>) -> Result<()> {
        let key = key.as_ref();
        self.shared.limits.check(key, &[])?;
        self.shared.write(key, WriteOp::Delete)?;
        self.after_write();
        Ok(())
    }

    /// The value stored under `key`, if any.
    ///
    /// # Errors
    /// [`Error::KeyTooLarge`] for a key no tree could hold, [`Error::Io`] or
    /// [`Error::Corruption`] when reading the leaf from disk fails.
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>> {
        let key = key.as_ref();
        self.shared.limits.check(key, &[])?;
        let value = self.shared.get(key);
        // A promotion or a move to the tail may have taken room.
        self.shared.nudge_evictors();
        value
    }

    /// The records with keys in `range`, in ascending order (`.rev()` for descending).
    ///
    /// The iterator holds no lock between calls to `next`; it sees every key that is present
    /// for its whole duration and none that is absent for its whole duration.
    ///
    /// ```
    /// # let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// for k in [b"a", b"b", b"c"] { tree.insert(k, b"")?; }
    /// let keys: Vec<Vec<u8>> = tree.range(b"b".as_slice()..).map(|r| r.map(|(k, _)| k)).collect::<Result<_, _>>()?;
    /// assert_eq!(keys, vec![b"b".to_vec(), b"c".to_vec()]);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn range<K, R>(&self, range: R) -> Range<'_>
    where
        K: AsRef<[u8]>,
        R: std::ops::RangeBounds<K>,
    {
        Range::new(&self.shared, range)
    }

    /// Every record, in ascending key order.
    pub fn iter(&self) -> Range<'_> {
        Range::new::<&[u8], _>(&self.shared, ..)
    }

    /// Makes every write acknowledged so far durable, whatever the [`Durability`]: syncs the
    /// write-ahead log, or (under `Durability::None`) writes a checkpoint.
    ///
    /// [`Durability`]: crate::Durability
    ///
    /// # Errors
    /// [`Error::Io`] if writing or syncing fails; acknowledged data stays intact.
    pub fn flush(&self) -> Result<()> {
        self.shared.flush()
    }

    /// Writes a checkpoint: dirty mini-pages are merged into their leaves and written, then
    /// the leaf map is saved atomically. A no-op for in-memory trees.
    ///
    /// # Errors
    /// [`Error::Io`] if writing or syncing fails.
    pub fn checkpoint(&self) -> Result<()> {
        self.shared.checkpoint()
    }

    /// Checkpoints and closes the tree. Dropping the tree does the same, ignoring errors.
    ///
    /// # Errors
    /// As [`Tree::checkpoint`].
    pub fn close(mut self) -> Result<()> {
        self.stop_background();
        self.shared.close()
    }

    fn stop_background(&mut self) {
        self.background.stop();
    }

    /// Counters describing what the tree has done so far (cheap to read).
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// Where the cache's bytes are right now (diagnosis; walks every leaf).
    #[cfg(any(fuzzing, bfkv_internals))]
    #[doc(hidden)]
    pub fn census(&self) -> census::Census {
        self.shared.census()
    }

    /// Wakes the evictors when a write left the buffer short of room, and the checkpointer
    /// when the log grew past its mark.
    fn after_write(&self) {
        self.shared.nudge_evictors();
        if self.shared.wants_checkpoint() {
            self.background.nudge_checkpointer();
        }
    }

    /// The key and value size limits of this tree.
    pub fn limits(&self) -> Limits {
        self.shared.limits
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
            .field("dir", &self.shared.config.dir)
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// Assembles a tree around an opened pool, store and log with `root` as its structure.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn assemble(
        config: Config,
        pool: BufferPool,
        store: Option<Arc<dyn PageStore>>,
        data_path: PathBuf,
        root: Inner,
        pages: persist::PageTracker,
        dir: Option<persist::DirLock>,
        wal: Option<Wal>,
        checkpoint_lsn: Lsn,
    ) -> Shared {
        Shared {
            log_writes: wal.is_some() && config.durability != crate::Durability::None,
            wal,
            checkpoint_lsn: AtomicU64::new(checkpoint_lsn),
            limits: config.limits(),
            // Without a store nothing is read from disk: the smallest filter does.
            doorkeeper: admit::Doorkeeper::new(if store.is_some() {
                config.cache_size
            } else {
                0
            }),
            page_size: config.page_size,
            config,
            pool,
            store,
            data_path,
            root: RcuCell::new(root),
            smo: Mutex::new(()),
            smo_version: AtomicU64::new(0),
            pages,
            counters: Counters::default(),
            closed: AtomicBool::new(false),
            dir,
            evict_bell: background::Control::new(),
        }
    }

    /// A fresh tree: one empty leaf, held as a full-page mirror.
    pub(crate) fn empty_root(pool: &BufferPool, page_size: usize) -> Result<Inner> {
        let mut guard = pool
            .insert_page(Location::Disk(NO_PAGE))
            .ok_or_else(Error::too_many_leaves)?;
        let Some(mut block) = pool.alloc(page_size, guard.page_id()) else {
            return Err(Error::InvalidConfig {
                reason: "cache too small for one leaf page",
            });
        };
        let mut node = NodeMut::init(block.bytes_mut(), NodeKind::Leaf, None, None);
        node.set_disk_page(None);
        guard.set_mini(block);
        Ok(Inner::single_leaf(guard.page_id(), page_size))
    }

    fn is_in_memory(&self) -> bool {
        self.store.is_none()
    }

    /// Frees memory by evicting one block; in-memory trees cannot.
    pub(crate) fn make_room(&self) -> Result<()> {
        if self.is_in_memory() {
            return Err(Error::CacheFull {
                cache_size: self.config.cache_size,
            });
        }
        loop {
            let mut retry = false;
            let outcome = self.pool.evict_one(&mut |guard, bytes| match self
                .evict_block(guard, bytes)?
            {
                Ok(()) => Ok(()),
                Err(_) => {
                    retry = true;
                    Err(Error::InvalidConfig {
                        reason: "eviction retried",
                    })
                }
            });
            self.drain_orphans();
            match outcome {
                Ok(_) => return Ok(()),
                Err(_) if retry => sync::yield_now(),
                Err(e) => return Err(e),
            }
        }
    }

    /// `make_room` on a foreground thread, which found the buffer full (counted: the
    /// evictor threads should have kept room).
    pub(crate) fn make_room_here(&self) -> Result<()> {
        self.make_room()?;
        self.counters
            .foreground_evictions
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Walks to the leaf for `seek` and read-locks it, validated against structure changes.
    pub(crate) fn read_leaf<'g>(
        &'g self,
        guard: &'g sync::EpochGuard,
        seek: Seek<'_>,
    ) -> (Path<'g>, ReadGuard<'g>) {
        loop {
            let version = self.smo_version.load(Ordering::Acquire);
            let path = Path::descend(self.root.load(guard), seek);
            let page = self.pool.read(path.leaf());
            if self.smo_version.load(Ordering::Acquire) == version {
                return (path, page);
            }
            drop(page);
            sync::spin_hint();
        }
    }

    fn write_leaf<'g>(
        &'g self,
        guard: &'g sync::EpochGuard,
        key: &[u8],
    ) -> (Path<'g>, WriteGuard<'g>) {
        loop {
            let version = self.smo_version.load(Ordering::Acquire);
            let path = Path::descend(self.root.load(guard), Seek::Key(key));
            let page = self.pool.write(path.leaf());
            if self.smo_version.load(Ordering::Acquire) == version {
                return (path, page);
            }
            drop(page);
            sync::spin_hint();
        }
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let guard = sync::pin();
        let (path, page) = self.read_leaf(&guard, Seek::Key(key));
        let (value, wants_room) = self.get_in_leaf(&path, page, key)?;
        drop(guard);
        if wants_room {
            // A promotion found the buffer full. Make room for the next one; the answer is
            // already known, and a failure to evict belongs to the writer that meets it.
            let _ = self.make_room_here();
        }
        Ok(value)
    }

    /// Applies a write and, when writes are logged, waits until its log record is durable
    /// per the configured durability (with no leaf lock held).
    fn write(&self, key: &[u8], op: WriteOp<'_>) -> Result<()> {
        if let Some(appended) = self.apply(key, op, self.log_writes)? {
            if let Some(wal) = &self.wal {
                wal.commit(appended)?;
            }
        }
        Ok(())
    }

    /// Applies a write to the tree; with `log`, appends its log record while the leaf is
    /// still locked, so the log's order for a key is the order its writes were applied.
    pub(crate) fn apply(&self, key: &[u8], op: WriteOp<'_>, log: bool) -> Result<Option<Appended>> {
        let mut spins = 0u32;
        loop {
            let guard = sync::pin();
            let (path, mut page) = self.write_leaf(&guard, key);
            let attempt = self.write_in_leaf(&path, &mut page, key, op)?;
            let written = match attempt {
                Ok(written) => written,
                Err(restart) => {
                    drop(page);
                    drop(guard);
                    self.restart(restart, &mut spins)?;
                    continue;
                }
            };
            let lsn = match (&self.wal, log) {
                (Some(wal), true) => Some(wal.append(match op {
                    WriteOp::Put(value) => LogOp::Insert { key, value },
                    WriteOp::Delete => LogOp::Remove { key },
                })?),
                _ => None,
            };
            if let leaf::Written::Emptied = written {
                self.remove_empty_leaf(key, page);
            }
            self.counters
                .hot()
                .writes_buffered
                .fetch_add(1, Ordering::Relaxed);
            return Ok(lsn);
        }
    }

    /// Replays the log from the last checkpoint (recovery), before anyone else can write.
    pub(crate) fn replay_log(&self) -> Result<()> {
        let Some(wal) = &self.wal else { return Ok(()) };
        let from = self.checkpoint_lsn.load(Ordering::Acquire);
        let stats = wal.replay(from, |_, op| {
            let (key, op) = match op {
                LogOp::Insert { key, value } => (key, WriteOp::Put(value)),
                LogOp::Remove { key } => (key, WriteOp::Delete),
            };
            self.apply(key, op, false).map(|_| ())
        })?;
        self.counters
            .replayed
            .fetch_add(stats.applied, Ordering::Relaxed);
        Ok(())
    }

    /// Whether the log grew enough since the last checkpoint to warrant a new one.
    pub(crate) fn wants_checkpoint(&self) -> bool {
        match &self.wal {
            Some(wal) if self.log_writes => {
                wal.bytes_since(self.checkpoint_lsn.load(Ordering::Relaxed))
                    > self.config.checkpoint_log_bytes
            }
            _ => false,
        }
    }

    /// Makes every acknowledged write durable: a log sync when writes are logged, else a
    /// checkpoint.
    pub(crate) fn flush(&self) -> Result<()> {
        match &self.wal {
            Some(wal) if self.log_writes => wal.flush(),
            _ => self.checkpoint(),
        }
    }

    /// Prepares the next attempt of an operation that had to release its locks.
    pub(crate) fn restart(&self, why: Restart, spins: &mut u32) -> Result<()> {
        match why {
            Restart::NeedSpace => self.make_room_here(),
            Restart::Retry => {
                *spins += 1;
                backoff(*spins);
                Ok(())
            }
        }
    }
    /// Takes the structure lock if it is free (leaf-lock holders never wait for it).
    pub(crate) fn try_smo(&self) -> Option<MutexGuard<'_, ()>> {
        self.smo.try_lock()
    }

    /// Takes the structure lock, waiting. Only for threads that hold no leaf lock.
    pub(crate) fn lock_smo(&self) -> MutexGuard<'_, ()> {
        self.smo.lock()
    }

    /// Publishes a new structure: replaces leaf `pid`'s entry (found by `key`) with
    /// `replacement`. Returns false (nothing changed) if that would remove the last leaf.
    pub(crate) fn publish(
        &self,
        _smo: &MutexGuard<'_, ()>,
        key: &[u8],
        pid: PageId,
        replacement: Vec<inner::Entry>,
    ) -> bool {
        let guard = sync::pin();
        let root = self.root.load(&guard);
        let Some(new_root) = inner::replace_leaf(root, key, pid, replacement, self.page_size)
        else {
            return false;
        };
        self.root.replace(new_root, &guard);
        self.smo_version.fetch_add(1, Ordering::AcqRel);
        self.pages.restructured(pid);
        true
    }

    /// The current root, valid while `guard` lives.
    pub(crate) fn root_ref<'g>(&self, guard: &'g sync::EpochGuard) -> &'g Inner {
        self.root.load(guard)
    }

    /// Every leaf with its exact low bound, in key order.
    pub(crate) fn leaf_list(&self) -> Vec<(Vec<u8>, PageId)> {
        let guard = sync::pin();
        inner::leaves(self.root.load(&guard))
    }

    /// Reads disk page `page` into `buf`.
    pub(crate) fn read_page(&self, page: u64, buf: &mut PageBuf) -> Result<()> {
        let Some(store) = &self.store else {
            return Err(Error::corruption(
                &self.data_path,
                Some(page),
                "in-memory tree has no disk pages",
            ));
        };
        store.read(page, buf)
    }

    fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let result = self.checkpoint();
        if let Some(dir) = &self.dir {
            dir.release();
        }
        result
    }
}

/// Waits a little longer after each failed attempt, so contenders make progress.
fn backoff(attempt: u32) {
    if attempt < 8 {
        for _ in 0..(1 << attempt) {
            sync::spin_hint();
        }
    } else {
        sync::yield_now();
    }
}
