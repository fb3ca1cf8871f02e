//! The index: which leaf owns which key. It owns the root of the inner nodes (`inner.rs`),
//! the structure lock and the structure version, and nothing else.
//!
//! Inner nodes are immutable; a structure change (leaf split, leaf removal) builds a new root
//! and publishes it under the structure lock, then bumps the version before the changed
//! leaf's lock is released. A reader reads the version, walks down, locks the leaf, and
//! re-reads the version: if it moved, the leaf it locked may no longer own the key, so it
//! unlocks and walks again (`read_leaf`, `write_leaf`).

use super::inner::{self, Entry, Inner, Path, Seek};
use crate::pool::{BufferPool, PageId, ReadGuard, WriteGuard};
use crate::sync::{self, AtomicU64, Mutex, MutexGuard, Ordering, RcuCell};

/// Proof that the caller holds the structure lock: only its holder may publish a new root.
pub(crate) type SmoGuard<'a> = MutexGuard<'a, ()>;

/// The inner nodes and the lock and version that order changes to them.
pub(crate) struct Index {
    root: RcuCell<Inner>,
    smo: Mutex<()>,
    version: AtomicU64,
    /// Size of an inner node (the page size).
    node_size: usize,
}

impl Index {
    /// An index whose structure is `root`.
    pub(crate) fn new(root: Inner, node_size: usize) -> Index {
        Index {
            root: RcuCell::new(root),
            smo: Mutex::new(()),
            version: AtomicU64::new(0),
            node_size,
        }
    }

    /// Walks to the leaf for `seek` and read-locks it in `pool`, validated against structure
    /// changes: the returned leaf owns `seek` for as long as its guard lives.
    #[inline]
    pub(crate) fn read_leaf<'g>(
        &self,
        pool: &'g BufferPool,
        guard: &'g sync::EpochGuard,
        seek: Seek<'_>,
    ) -> (Path<'g>, ReadGuard<'g>) {
        loop {
            let version = self.version.load(Ordering::Acquire);
            let path = Path::descend(self.root.load(guard), seek);
            let page = pool.read(path.leaf());
            if self.version.load(Ordering::Acquire) == version {
                return (path, page);
            }
            drop(page);
            sync::spin_hint();
        }
    }

    /// As [`Index::read_leaf`], write-locking the leaf that owns `key`.
    #[inline]
    pub(crate) fn write_leaf<'g>(
        &self,
        pool: &'g BufferPool,
        guard: &'g sync::EpochGuard,
        key: &[u8],
    ) -> (Path<'g>, WriteGuard<'g>) {
        loop {
            let version = self.version.load(Ordering::Acquire);
            let path = Path::descend(self.root.load(guard), Seek::Key(key));
            let page = pool.write(path.leaf());
            if self.version.load(Ordering::Acquire) == version {
                return (path, page);
            }
            drop(page);
            sync::spin_hint();
        }
    }

    /// As [`Index::write_leaf`], unless the leaf that owns `key` is `held`, which the caller
    /// has locked already (then `None`: a held leaf's range only grows, so it owns `key`
    /// for as long as the caller holds it).
    pub(crate) fn write_leaf_unless<'g>(
        &self,
        pool: &'g BufferPool,
        guard: &'g sync::EpochGuard,
        key: &[u8],
        held: PageId,
    ) -> Option<(Path<'g>, WriteGuard<'g>)> {
        loop {
            let version = self.version.load(Ordering::Acquire);
            let path = Path::descend(self.root.load(guard), Seek::Key(key));
            if path.leaf() == held {
                return None;
            }
            let page = pool.write(path.leaf());
            if self.version.load(Ordering::Acquire) == version {
                return Some((path, page));
            }
            drop(page);
            sync::spin_hint();
        }
    }

    /// The structure version now, for a reader that validates a leaf without locking it
    /// (`optimistic.rs`): read it before walking down.
    #[inline]
    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Whether no structure change was published since `version` was read. Checked after
    /// the leaf's own validation: together they prove the leaf owned the key while it was
    /// read, as holding its lock would.
    #[inline]
    pub(crate) fn unchanged_since(&self, version: u64) -> bool {
        // The leaf's version check (a plain load) stays before this one.
        sync::fence(Ordering::Acquire);
        self.version.load(Ordering::Relaxed) == version
    }

    /// The path to the leaf that owns `seek` now. Stable only while the caller holds that
    /// leaf's lock (or the structure lock).
    pub(crate) fn descend<'g>(&self, guard: &'g sync::EpochGuard, seek: Seek<'_>) -> Path<'g> {
        Path::descend(self.root.load(guard), seek)
    }

    /// Takes the structure lock if it is free (leaf-lock holders never wait for it).
    pub(crate) fn try_smo(&self) -> Option<SmoGuard<'_>> {
        self.smo.try_lock()
    }

    /// Takes the structure lock, waiting. Only for threads that hold no leaf lock.
    pub(crate) fn lock_smo(&self) -> SmoGuard<'_> {
        self.smo.lock()
    }

    /// Replaces leaf `pid`'s entry (found by `key`) with `replacement` and publishes the new
    /// root. Returns false (nothing changed) if that would remove the last leaf.
    pub(crate) fn replace_leaf(
        &self,
        _smo: &SmoGuard<'_>,
        key: &[u8],
        pid: PageId,
        replacement: Vec<Entry>,
    ) -> bool {
        let guard = sync::pin();
        let root = self.root.load(&guard);
        let Some(new_root) = inner::replace_leaf(root, key, pid, replacement, self.node_size)
        else {
            return false;
        };
        self.root.replace(new_root, &guard);
        self.version.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// Every leaf with its exact low bound, in key order.
    pub(crate) fn leaves(&self) -> Vec<(Vec<u8>, PageId)> {
        let guard = sync::pin();
        inner::leaves(self.root.load(&guard))
    }
}
