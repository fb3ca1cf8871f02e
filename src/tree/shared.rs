//! The state one open tree shares between its handle, iterators and background threads: the
//! components of `tree/mod.rs`, composed. Each component keeps its own fields private; this
//! struct hands out shared references to them, and the operations that need several (a
//! lookup needs the index, the leaf cache and the storage) are methods here and in the
//! operation files (`leaf.rs`, `evict.rs`, `checkpoint.rs`, ...).

use crate::config::Config;
use crate::error::{Error, Result};
use crate::limits::Limits;
use crate::node::{NodeKind, NodeMut};
use crate::pool::{BufferPool, Evicted, Location, PageId, WriteGuard};
use crate::sync::{self, AtomicBool, Ordering};
use crate::tree::background::Control;
use crate::tree::cache::Doorkeeper;
use crate::tree::cache::Written;
use crate::tree::catalog::Catalog;
use crate::tree::index::{Entry, Inner, Path, Seek};
use crate::tree::index::{Index, SmoGuard};
use crate::tree::persist::DirLock;
use crate::tree::persist::Journal;
use crate::tree::stats::{Counters, Event};
use crate::tree::storage::Storage;
use crate::tree::versions::Versions;
use crate::tree::writeback::PageBatch;
use crate::tree::writeback::{SUPERSEDED_LEAST, WANTED_SHARE};
use crate::tree::{Restart, Step, WriteOp, NO_PAGE};
use crate::wal::Appended;

/// The state shared by every handle and iterator of one open tree.
pub(crate) struct Shared {
    config: Config,
    limits: Limits,
    /// Which leaf owns which key.
    index: Index,
    /// The leaves' cached nodes (the circular buffer and the mapping table).
    pool: BufferPool,
    /// Which disk reads promote their record (`admit.rs`).
    doorkeeper: Doorkeeper,
    /// The data file.
    storage: Storage,
    /// The write-ahead log.
    journal: Journal,
    counters: Counters,
    /// Wakes the evictor threads (`background.rs`): rung by whoever takes buffer room while
    /// the buffer is short of it.
    evict_bell: std::sync::Arc<Control>,
    /// Wakes the checkpointer (`background.rs`): rung by a write after which the log has
    /// grown past its mark.
    checkpoint_bell: std::sync::Arc<Control>,
    closed: AtomicBool,
    dir: Option<DirLock>,
    /// The keyspaces (`catalog.rs`).
    catalog: Catalog,
    /// The write sequence, who reads at which point of it, and the old values they need
    /// (`versions/`).
    versions: Versions,
}

impl Shared {
    /// Assembles a tree from its components.
    pub(crate) fn assemble(
        config: Config,
        pool: BufferPool,
        index: Index,
        storage: Storage,
        journal: Journal,
        dir: Option<DirLock>,
    ) -> Shared {
        Shared {
            limits: if storage.blobs().enabled() {
                config.limits()
            } else {
                config.limits().inline_only()
            },
            // Without a store nothing is read from disk: the smallest filter does.
            doorkeeper: Doorkeeper::new(if storage.is_in_memory() {
                0
            } else {
                config.cache_size
            }),
            versions: Versions::new(config.max_snapshot_bytes),
            config,
            index,
            pool,
            storage,
            journal,
            counters: Counters::default(),
            evict_bell: Control::new(),
            checkpoint_bell: Control::new(),
            closed: AtomicBool::new(false),
            dir,
            catalog: Catalog::new(),
        }
    }

    /// A fresh tree's structure: one empty leaf, held as a full-page mirror in `pool`.
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

    /// The configuration the tree was opened with.
    #[inline]
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// The key and value size limits.
    #[inline]
    pub(crate) fn limits(&self) -> Limits {
        self.limits
    }

    /// The size of a leaf page (and of every inner node).
    #[inline]
    pub(crate) fn page_size(&self) -> usize {
        self.config.page_size
    }

    /// The index component.
    #[inline]
    pub(crate) fn index(&self) -> &Index {
        &self.index
    }

    /// The buffer pool: the circular buffer and the mapping table.
    #[inline]
    pub(crate) fn pool(&self) -> &BufferPool {
        &self.pool
    }

    /// The promotion filter.
    #[inline]
    pub(crate) fn doorkeeper(&self) -> &Doorkeeper {
        &self.doorkeeper
    }

    /// The data file and its page bookkeeping.
    #[inline]
    pub(crate) fn storage(&self) -> &Storage {
        &self.storage
    }

    /// The write-ahead log.
    #[inline]
    pub(crate) fn journal(&self) -> &Journal {
        &self.journal
    }

    /// The counters behind `Stats`.
    #[inline]
    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The keyspaces.
    #[inline]
    pub(crate) fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// The write sequence and the old values scans, snapshots and transactions need.
    #[inline]
    pub(crate) fn versions(&self) -> &Versions {
        &self.versions
    }

    /// The evictor threads' doorbell.
    pub(crate) fn evict_bell(&self) -> &std::sync::Arc<Control> {
        &self.evict_bell
    }

    /// The checkpointer's doorbell.
    pub(crate) fn checkpoint_bell(&self) -> &std::sync::Arc<Control> {
        &self.checkpoint_bell
    }

    /// Wakes the evictors when a write left the buffer short of room, and the checkpointer
    /// when the log grew past its mark.
    pub(crate) fn after_write(&self) {
        self.nudge_evictors();
        if self.wants_checkpoint() {
            self.checkpoint_bell.ring();
        }
    }

    /// Frees memory by evicting one block; in-memory trees cannot.
    ///
    /// # Errors
    /// `CacheFull` for an in-memory tree; `Io` or `Corruption` from writing the block back.
    pub(crate) fn make_room(&self) -> Result<()> {
        if self.storage.is_in_memory() {
            return Err(Error::CacheFull {
                cache_size: self.config.cache_size,
            });
        }
        self.evict_until_settled(|| {
            self.pool
                .evict_one(&mut |guard, bytes| self.evict_block(guard, bytes))
        })
    }

    /// Runs `evict` (one eviction or one run) until it makes progress or finds nothing to
    /// evict, dropping the blocks it orphaned after each try.
    fn evict_until_settled(&self, mut evict: impl FnMut() -> Result<Evicted>) -> Result<()> {
        loop {
            let outcome = evict();
            self.drain_orphans();
            match outcome? {
                Evicted::Progress | Evicted::Nothing => return Ok(()),
                // The block's write-back needs the busy structure lock: try again.
                Evicted::Busy => sync::yield_now(),
            }
        }
    }

    /// `make_room` for an evictor thread: evicts a run of `checkpoint::BATCH` blocks from
    /// the head, their leaves written back first in one batch (`write_back_claimed`, in
    /// the evictor's own `batch`), so the device works on many pages at once rather than
    /// one per evictor.
    ///
    /// # Errors
    /// As [`Shared::make_room`].
    pub(super) fn make_room_batch(&self, batch: &mut PageBatch) -> Result<()> {
        self.evict_until_settled(|| {
            self.pool.evict_batch(
                crate::tree::writeback::BATCH,
                &mut |owners| self.write_back_claimed(owners, batch),
                &mut |guard, bytes| self.evict_block(guard, bytes),
            )
        })
    }

    /// Evicts every block, so every leaf lives on disk only (tests).
    #[cfg(test)]
    pub(crate) fn evict_all(&self) {
        for _ in 0..10_000 {
            if self.pool.stats().bytes_in_use == 0 {
                return;
            }
            self.make_room().expect("evict");
        }
        panic!("the buffer never emptied");
    }

    /// `make_room` on a foreground thread, which found the buffer full (counted: the
    /// evictor threads should have kept room).
    ///
    /// # Errors
    /// As [`Shared::make_room`].
    pub(crate) fn make_room_here(&self) -> Result<()> {
        self.make_room()?;
        self.counters.count(Event::ForegroundEviction);
        Ok(())
    }

    /// The value of `key`.
    pub(crate) fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut value = Vec::new();
        Ok(self.get_into(key, &mut value)?.then_some(value))
    }

    /// Whether `key` is present, its stored value copied into `out` (cleared first).
    pub(crate) fn get_into(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        out.clear();
        let guard = sync::pin();
        if let Some(found) = self.get_optimistic(&guard, key, out) {
            drop(guard);
            self.journal.check().inspect_err(|_| out.clear())?;
            return Ok(found);
        }
        let (path, page) = self.index.read_leaf(&self.pool, &guard, Seek::Key(key));
        let lookup = self.get_in_leaf(&path, page, key, out);
        drop(guard);
        let lookup = lookup.inspect_err(|_| out.clear())?;
        // After the log failed the leaves may hold refused writes (`Journal::check`).
        self.journal.check().inspect_err(|_| out.clear())?;
        if lookup.wants_room() {
            // A promotion found the buffer full. Make room for the next one; the answer is
            // already known, and a failure to evict belongs to the writer that meets it.
            let _ = self.make_room_here();
        }
        Ok(lookup.found())
    }

    /// Applies a write and, when writes are logged, waits until its log record is durable
    /// per the configured durability (with no leaf lock held).
    pub(crate) fn write(&self, key: &[u8], op: WriteOp<'_>) -> Result<()> {
        if let Some(appended) = self.apply(key, op, true)? {
            self.journal.commit(appended)?;
        }
        Ok(())
    }

    /// Applies a write to the tree; with `log`, appends its log record (if writes are
    /// logged) while the leaf is still locked, so the log's order for a key is the order its
    /// writes were applied.
    ///
    /// A write whose record the log refuses stays in the leaf, but the log has then failed
    /// for good (`Wal::check`): the tree answers every later call with that error until it
    /// is reopened, and the reopened tree does not have the write.
    pub(crate) fn apply(&self, key: &[u8], op: WriteOp<'_>, log: bool) -> Result<Option<Appended>> {
        self.apply_with(key, log, |_, _, _| Ok(Some(op)))
    }

    /// As [`Shared::apply`], for the write `decide` chooses with the leaf locked (it may
    /// read the key's current value there); `None` writes nothing. `decide` runs again
    /// whenever the attempt restarts.
    pub(crate) fn apply_with<'v>(
        &self,
        key: &[u8],
        log: bool,
        mut decide: impl FnMut(&Self, &Path<'_>, &WriteGuard<'_>) -> Result<Option<WriteOp<'v>>>,
    ) -> Result<Option<Appended>> {
        if log {
            self.journal.check()?;
        }
        let mut spins = 0u32;
        loop {
            let guard = sync::pin();
            let (path, mut page) = self.index.write_leaf(&self.pool, &guard, key);
            let Some(op) = decide(self, &path, &page)? else {
                return Ok(None);
            };
            // While a snapshot or a transaction is open, what the write replaces is saved
            // for it before the leaf is released (`versions/store.rs`).
            let old = if self.versions.versioning() {
                Some(self.value_in_leaf(&path, &page, key)?)
            } else {
                None
            };
            let written = match self.write_in_leaf(&path, &mut page, key, op)? {
                Step::Done(written) => written,
                Step::Restart(restart) => {
                    drop(page);
                    drop(guard);
                    self.restart(restart, &mut spins)?;
                    continue;
                }
            };
            if let Some(old) = old {
                let undo = vec![(key.to_vec(), old)];
                let pin = self.pin_for(&undo);
                self.versions.record(undo, pin, |_| Ok(()))?;
            }
            let appended = if log {
                self.journal.append(key, op)?
            } else {
                None
            };
            if let Written::Emptied = written {
                self.remove_empty_leaf(key, page);
            }
            self.counters.count(Event::WriteBuffered);
            return Ok(appended);
        }
    }

    /// Replaces the value of `key` by `new` (`None`: removes it) if it is `expected`
    /// (`None`: absent), atomically: the comparison and the write happen under the leaf's
    /// lock. Returns whether it matched; waits for durability like a write when it wrote.
    pub(crate) fn compare_and_swap(
        &self,
        key: &[u8],
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool> {
        let mut matched = false;
        let appended = self.apply_with(key, true, |shared, path, page| {
            // Under the leaf's lock the reference is current: its extent cannot be freed.
            let current = shared
                .value_in_leaf(path, page, key)?
                .map(|v| shared.user_value(v))
                .transpose()?;
            matched = current.as_deref() == expected;
            // Removing an absent key matches and changes nothing.
            if !matched || (new.is_none() && current.is_none()) {
                return Ok(None);
            }
            Ok(Some(new.map_or(WriteOp::Delete, WriteOp::Put)))
        })?;
        if let Some(appended) = appended {
            self.journal.commit(appended)?;
        }
        // A failed comparison read a leaf that may hold refused writes (`Journal::check`).
        self.journal.check()?;
        Ok(matched)
    }

    /// Replays the log from the last checkpoint (recovery), before anyone else can write.
    /// `floors` are the checkpoint's leaves (low bound, image LSN, in key order): a record
    /// below the image LSN of the leaf its key falls in is already in that leaf's page, and
    /// is skipped, so that no write applies twice (`pages.rs`).
    ///
    /// # Errors
    /// `Corruption` for a record the tree cannot have written; `InvalidConfig` for a merge
    /// record when no merge operator is configured; errors from applying a write.
    pub(crate) fn replay_log(&self, floors: &[(Vec<u8>, crate::wal::Lsn)]) -> Result<()> {
        let dir = self.config.dir.clone().unwrap_or_default();
        let bad = |reason| Error::corruption(dir.join("wal"), None, reason);
        let stats = self.journal.replay(|lsn, write| {
            let (key, op) = write.map_err(bad)?;
            let value = match op {
                WriteOp::Put(value) => value,
                WriteOp::Delete => &[],
                WriteOp::Merge(operands) => {
                    if self.merge_operator_for(key).is_none() {
                        return Err(crate::tree::merge::no_operator());
                    }
                    if !crate::tree::merge::is_operand_list(operands) {
                        return Err(bad("merge record with a damaged operand list"));
                    }
                    operands
                }
            };
            // The tree never logs what it would refuse; applying it could not end.
            if self.limits.check_stored(key, value).is_err() {
                return Err(bad("log record larger than this tree accepts"));
            }
            let leaf = floors.partition_point(|(low, _)| low.as_slice() <= key);
            if leaf > 0 && lsn < floors[leaf - 1].1 {
                return Ok(());
            }
            // The extent of a replayed reference is in use (`blob/extents.rs`).
            if let WriteOp::Put(value) = op {
                if let Some(r) = self.storage().blobs().decode(value) {
                    self.storage().blobs().claim(&r)?;
                }
            }
            self.apply(key, op, false)?;
            if let WriteOp::Put(value) = op {
                self.replayed_catalog_write(key, value);
            }
            Ok(())
        })?;
        self.counters.replayed(stats.applied);
        Ok(())
    }

    /// Whether the log grew enough since the last checkpoint to warrant a new one, or (when
    /// checkpoints can be fuzzy, and so cost what was written since the last one) enough
    /// superseded pages wait for one to be freed.
    pub(crate) fn wants_checkpoint(&self) -> bool {
        self.journal.grew_past(self.config.checkpoint_log_bytes)
            || self.storage.blobs().wants_checkpoint()
            || (self.may_checkpoint_fuzzily()
                && self
                    .storage
                    .pages()
                    .superseded_past(WANTED_SHARE, SUPERSEDED_LEAST))
    }

    /// Makes every acknowledged write durable: a log sync when writes are logged, else a
    /// checkpoint.
    pub(crate) fn flush(&self) -> Result<()> {
        if self.journal.flush()? {
            return Ok(());
        }
        self.checkpoint()
    }

    /// Publishes a new structure: replaces leaf `pid`'s entry (found by `key`) with
    /// `replacement`, and tells the page tracker the leaf's bounds changed. Returns false
    /// (nothing changed) if that would remove the last leaf.
    pub(crate) fn publish(
        &self,
        smo: &SmoGuard<'_>,
        key: &[u8],
        pid: PageId,
        replacement: Vec<Entry>,
    ) -> bool {
        if !self.index.replace_leaf(smo, key, pid, replacement) {
            return false;
        }
        self.storage.pages().restructured(pid);
        true
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

    /// Checkpoints and gives the directory up; later calls do nothing.
    pub(crate) fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        // Calls through keyspace handles still inside finish first; later ones are refused.
        self.catalog.shut_all();
        let result = self.checkpoint();
        // The log lets go of the directory before the lock does: once another tree may own
        // the directory, nothing of this one may write or remove files there.
        let closed = self.journal.close();
        if let Some(dir) = &self.dir {
            dir.release();
        }
        result.and(closed)
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
