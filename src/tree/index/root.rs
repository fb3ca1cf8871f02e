//! The index: which leaf owns which key. It owns the root of the inner nodes (`inner.rs`),
//! the structure lock and the structure version, and nothing else.
//!
//! Inner nodes are immutable; a structure change (leaf split, leaf removal) builds a new root
//! and publishes it under the structure lock, then bumps the version before the changed
//! leaf's lock is released. Only such a change of a leaf takes keys away from it, and only
//! while holding that leaf's lock (a removal grows a neighbour's range without it).
//!
//! So a reader reads the version, walks down, locks the leaf (or reads it optimistically,
//! `optimistic.rs`), and settles with [`Index::settle`]:
//! - the version has not moved: the leaf it walked to owns the key;
//! - it moved: it walks the current root again. The current root reflects every change that
//!   took keys from the leaf before the reader locked it (or read the leaf's version), so if
//!   it still routes the key to this leaf, the leaf owns it for as long as the reader holds
//!   it (or until the leaf's version moves). Only
//!   a change that moved the key elsewhere (a split or removal of this very leaf) makes the
//!   reader let go and try the leaf the new walk found. A change elsewhere in the tree costs
//!   the readers in flight one more walk down, not a restart.

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
    /// Settles that found the structure changed and walked again: that kept their leaf, and
    /// that had to move to another. Tests only: a read stores nothing to shared memory.
    #[cfg(test)]
    rechecks: AtomicU64,
    #[cfg(test)]
    restarts: AtomicU64,
    /// Size of an inner node (the page size).
    node_size: usize,
}

/// Whether the leaf a reader reached owns its key ([`Index::settle`]).
pub(crate) enum Owner<'g> {
    /// No structure change since the walk: the path walked.
    Unchanged(Path<'g>),
    /// The structure changed, and the current root still routes the key to the leaf: the
    /// path in the current root. An optimistic reader must validate its leaf read again,
    /// after this walk, to keep it.
    Rechecked(Path<'g>),
    /// A split or removal of the leaf moved the key: the structure version to try next with,
    /// and the path to the leaf that owns the key now.
    Moved(u64, Path<'g>),
}

impl Index {
    /// An index whose structure is `root`.
    pub(crate) fn new(root: Inner, node_size: usize) -> Index {
        Index {
            root: RcuCell::new(root),
            smo: Mutex::new(()),
            version: AtomicU64::new(0),
            #[cfg(test)]
            rechecks: AtomicU64::new(0),
            #[cfg(test)]
            restarts: AtomicU64::new(0),
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
        let (mut version, mut path) = self.walk(guard, seek);
        loop {
            let page = pool.read(path.leaf());
            match self.settle(guard, seek, path, version) {
                Owner::Unchanged(path) | Owner::Rechecked(path) => return (path, page),
                Owner::Moved(v, p) => (version, path) = (v, p),
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
        let seek = Seek::Key(key);
        let (mut version, mut path) = self.walk(guard, seek);
        loop {
            let page = pool.write(path.leaf());
            match self.settle(guard, seek, path, version) {
                Owner::Unchanged(path) | Owner::Rechecked(path) => return (path, page),
                Owner::Moved(v, p) => (version, path) = (v, p),
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
        let seek = Seek::Key(key);
        let (mut version, mut path) = self.walk(guard, seek);
        loop {
            if path.leaf() == held {
                return None;
            }
            let page = pool.write(path.leaf());
            match self.settle(guard, seek, path, version) {
                Owner::Unchanged(path) | Owner::Rechecked(path) => return Some((path, page)),
                Owner::Moved(v, p) => (version, path) = (v, p),
            }
            drop(page);
            sync::spin_hint();
        }
    }

    /// The structure version, then the walk to the leaf for `seek` in the root that was
    /// current at or after it: the start of every read (module docs).
    #[inline]
    pub(crate) fn walk<'g>(&self, guard: &'g sync::EpochGuard, seek: Seek<'_>) -> (u64, Path<'g>) {
        let version = self.version.load(Ordering::Acquire);
        (version, Path::descend(self.root.load(guard), seek))
    }

    /// Whether the leaf `path` reached (walked from structure `version`, by
    /// [`Index::walk`]) owns `seek`, judged after the caller locked it or read it
    /// optimistically (module docs).
    #[inline]
    pub(crate) fn settle<'g>(
        &self,
        guard: &'g sync::EpochGuard,
        seek: Seek<'_>,
        path: Path<'g>,
        version: u64,
    ) -> Owner<'g> {
        // An optimistic reader's leaf validation (a plain load) stays before this load.
        sync::fence(Ordering::Acquire);
        if self.version.load(Ordering::Relaxed) == version {
            return Owner::Unchanged(path);
        }
        self.settle_changed(guard, seek, path.leaf())
    }

    /// [`Index::settle`] after a structure change: walks the current root.
    #[cold]
    fn settle_changed<'g>(
        &self,
        guard: &'g sync::EpochGuard,
        seek: Seek<'_>,
        leaf: PageId,
    ) -> Owner<'g> {
        let (version, now) = self.walk(guard, seek);
        let kept = now.leaf() == leaf;
        #[cfg(test)]
        {
            let counter = if kept { &self.rechecks } else { &self.restarts };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        if kept {
            Owner::Rechecked(now)
        } else {
            Owner::Moved(version, now)
        }
    }

    /// How many settles walked the current root again and kept their leaf, and how many
    /// had to move to another leaf.
    #[cfg(test)]
    pub(crate) fn settles(&self) -> (u64, u64) {
        (
            self.rechecks.load(Ordering::Relaxed),
            self.restarts.load(Ordering::Relaxed),
        )
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

#[cfg(all(test, not(shuttle)))]
mod tests {
    use super::*;

    fn key(i: u8) -> Vec<u8> {
        vec![b'k', i]
    }

    /// Leaves 1, 2, 3 with low bounds (none), k10, k20.
    fn three_leaves() -> Index {
        let leaves = vec![(Vec::new(), 1), (key(10), 2), (key(20), 3)];
        Index::new(inner::bulk_load(leaves, 4096).expect("root"), 4096)
    }

    #[test]
    fn a_change_elsewhere_keeps_the_leaf_and_a_change_of_it_moves_the_key() {
        let index = three_leaves();
        let guard = sync::pin();
        let seek = Seek::Key(&[b'k', 5]);
        let settle = |version, path: Path<'_>| match index.settle(&guard, seek, path, version) {
            Owner::Unchanged(p) => ("unchanged", p.leaf()),
            Owner::Rechecked(p) => ("rechecked", p.leaf()),
            Owner::Moved(v, p) => {
                assert_eq!(v, index.version.load(Ordering::Relaxed));
                ("moved", p.leaf())
            }
        };

        let (v0, path) = index.walk(&guard, seek);
        assert_eq!(path.leaf(), 1);
        assert_eq!(settle(v0, path), ("unchanged", 1));

        // Leaf 3 splits after the walk: leaf 1 still owns k5, with one more walk.
        let (v1, path) = index.walk(&guard, seek);
        let smo = index.lock_smo();
        let split_3 = vec![Entry::leaf(key(20), 3), Entry::leaf(key(30), 4)];
        assert!(index.replace_leaf(&smo, &key(25), 3, split_3));
        assert_eq!(settle(v1, path), ("rechecked", 1));

        // Leaf 2 goes away after the walk: leaf 1's range grows, and it still owns k5.
        let (v2, path) = index.walk(&guard, seek);
        assert!(index.replace_leaf(&smo, &key(15), 2, Vec::new()));
        assert_eq!(settle(v2, path), ("rechecked", 1));
        assert_eq!(index.descend(&guard, Seek::Key(&key(15))).leaf(), 1);

        // Leaf 1 splits at k3 after the walk: k5 moved to leaf 5.
        let (v3, path) = index.walk(&guard, seek);
        let split_1 = vec![Entry::leaf(Vec::new(), 1), Entry::leaf(key(3), 5)];
        assert!(index.replace_leaf(&smo, &key(1), 1, split_1));
        assert_eq!(settle(v3, path), ("moved", 5));

        // Leaf 5 is removed after the walk: k5 falls back to leaf 1.
        let (v4, path) = index.walk(&guard, seek);
        assert_eq!(path.leaf(), 5);
        assert!(index.replace_leaf(&smo, &key(5), 5, Vec::new()));
        assert_eq!(settle(v4, path), ("moved", 1));

        assert_eq!(index.settles(), (2, 2));
    }

    #[test]
    fn seeks_other_than_a_key_settle_the_same_way() {
        let index = three_leaves();
        let guard = sync::pin();
        let before_k20 = Seek::Before(&[b'k', 20]);
        let walks = [
            index.walk(&guard, Seek::First),
            index.walk(&guard, Seek::Last),
            index.walk(&guard, before_k20),
        ];
        assert_eq!(walks.each_ref().map(|(_, p)| p.leaf()), [1, 3, 2]);
        // Leaf 2 splits at k15: First and Last keep their leaves, the leaf before k20 is
        // now the new one.
        let smo = index.lock_smo();
        let split_2 = vec![Entry::leaf(key(10), 2), Entry::leaf(key(15), 6)];
        assert!(index.replace_leaf(&smo, &key(12), 2, split_2));
        let seeks = [Seek::First, Seek::Last, before_k20];
        let settled: Vec<(bool, PageId)> = walks
            .into_iter()
            .zip(seeks)
            .map(
                |((v, path), seek)| match index.settle(&guard, seek, path, v) {
                    Owner::Unchanged(_) => panic!("the version moved"),
                    Owner::Rechecked(p) => (true, p.leaf()),
                    Owner::Moved(_, p) => (false, p.leaf()),
                },
            )
            .collect();
        assert_eq!(settled, [(true, 1), (true, 3), (false, 6)]);
    }
}
