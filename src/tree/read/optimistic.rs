//! Reads that take no leaf lock (paper §4.1), with the pool's optimistic read
//! (`pool/optimistic.rs`): a lookup searches the leaf's mini-page in place through
//! `RacyNode` (`node/racy.rs`, which touches what a locked search would), having requested
//! every line of its metas at once (a binary search's steps then find them in cache rather
//! than each waiting on memory in turn); a scan refilling
//! its buffer copies the node's used bytes in two bulk copies and, once the copy validated,
//! reads a full-page mirror's records from it in place (`Copied::adopt`). Both then
//! validate against the leaf's version, and keep the answer only if it held still and the
//! leaf owned the key meanwhile (`Index::settle`: a structure change elsewhere costs one
//! more walk down, validated again). Nothing on this path stores to memory another thread
//! reads: the lock word and the version stay as they were (the hit counters are striped per
//! thread).
//!
//! The locked path (`None` from here) does the read instead when:
//! - a writer holds the leaf, or one interfered with every attempt;
//! - the answer needs the leaf page from disk: I/O may cache what it read, a write;
//! - the answer meets pending merges (folded over the page's value, or by the operator).
//!
//! A lookup that finds a record whose reference bit is clear, or a block in the
//! copy-on-access region, still answers from its read, then sets the bit or moves the block
//! if it can take the leaf's write lock at once with the leaf unchanged since the read
//! (`OptimisticRead::try_upgrade`), as a locked lookup does when it is the only reader.

use std::ops::Bound;

use super::copied::{copy_present, fold_alone, Copied};
use crate::error::Result;
use crate::node::{NodeKind, NodeRef, RacyNode, RecordKind, Search, Words};
use crate::pool::{BlockView, Location, OptimisticRead};
use crate::sync::EpochGuard;
use crate::tree::index::Owner;
use crate::tree::index::{Path, Seek};
use crate::tree::stats::Event;
use crate::tree::{Shared, NO_PAGE};

/// Attempts before a read takes the lock: a writer that interferes twice in a row is busy
/// with the leaf, and waiting on its lock beats reading the leaf again.
const TRIES: u32 = 2;

impl Words for BlockView<'_> {
    #[inline]
    fn word(&self, i: usize) -> u64 {
        self.load_word(i)
    }

    #[inline]
    fn copy(&self, at: usize, len: usize, out: &mut Vec<u8>) {
        self.copy_bytes(at, len, out);
    }

    #[inline]
    fn prefetch(&self, at: usize) {
        self.prefetch_at(at);
    }
}

/// The mini-page `read` found.
fn racy<'p>(read: &OptimisticRead<'p>) -> Option<RacyNode<BlockView<'p>>> {
    let block = read.block()?;
    Some(RacyNode::new(block.len(), block))
}

/// Whether a node decides every key in its range: a full-page mirror, or a mini-page with
/// no page below.
fn decides_all<L: Words>(node: &RacyNode<L>) -> bool {
    node.kind() == Some(NodeKind::Leaf) || node.disk_page().is_none_or(|p| p == NO_PAGE)
}

impl Shared {
    /// Whether `read`, of the leaf `path` reached from structure `version`, holds: nothing
    /// wrote the leaf while it was read, and the leaf owned `seek` meanwhile (`index/root.rs`).
    /// Returns the path in the root that proved it.
    #[inline]
    fn holds<'g>(
        &self,
        guard: &'g EpochGuard,
        seek: Seek<'_>,
        path: Path<'g>,
        version: u64,
        read: &OptimisticRead<'_>,
    ) -> Option<Path<'g>> {
        if !read.validate() {
            return None;
        }
        match self.index().settle(guard, seek, path, version) {
            Owner::Unchanged(path) => Some(path),
            // The second walk proves ownership only if it fell inside the validated read.
            Owner::Rechecked(path) => read.validate().then_some(path),
            Owner::Moved(..) => None,
        }
    }

    /// Starts loading the lines of leaf `pid`'s mini-page that a search for `key` compares
    /// bytes on (`RacyNode::prefetch_search`): a hint, which reads the mini-page's header
    /// and metas, decides nothing on them and stores nothing.
    pub(in crate::tree) fn prefetch_search(&self, pid: crate::pool::PageId, key: &[u8]) {
        if let Some(node) = self.pool().read_optimistic(pid).as_ref().and_then(racy) {
            node.prefetch_search(key);
        }
    }

    /// [`Shared::get_into`] answered from the leaf's mini-page without locking it:
    /// `Some(found)`, the value in `out` (empty on entry), or `None` when the locked path
    /// must answer (module docs), with `out` empty again.
    pub(in crate::tree) fn get_optimistic(
        &self,
        guard: &EpochGuard,
        key: &[u8],
        out: &mut Vec<u8>,
    ) -> Option<bool> {
        for _ in 0..TRIES {
            let (version, path) = self.index().walk(guard, Seek::Key(key));
            let read = self.pool().read_optimistic(path.leaf())?;
            let Location::Mini(addr) = read.location() else {
                return None;
            };
            let Some(node) = racy(&read) else {
                continue;
            };
            node.prefetch_metas();
            // What `get_in_leaf` would answer from this node (`None` where it would read the
            // page from disk), and the record it found.
            let answer = match node.search(key) {
                Search::Found(i) => {
                    let record = node.record(i);
                    match record.kind() {
                        RecordKind::Upsert => None,
                        kind => {
                            if kind.exists() {
                                node.value_into(record, out);
                            }
                            Some((kind.exists(), Some((i, record.ref_bit()))))
                        }
                    }
                }
                // A full-page mirror holds every record of its leaf; a mini-page with no
                // page below is the whole leaf.
                Search::NotFound(_) if decides_all(&node) => Some((false, None)),
                Search::NotFound(_) => None,
            };
            if self
                .holds(guard, Seek::Key(key), path, version, &read)
                .is_none()
            {
                out.clear();
                continue;
            }
            let (found, record) = answer?;
            if record.is_some() || node.kind() == Some(NodeKind::Leaf) {
                self.counters().count(Event::CacheHit);
            }
            if let Some((i, referenced)) = record {
                // As `get_in_leaf` does: mark the record referenced and move a block near
                // the head to the tail, best effort, as only a write can.
                let move_to_tail = self.pool().is_copy_on_access(addr);
                if !referenced || move_to_tail {
                    if let Some(mut w) = read.try_upgrade() {
                        self.touch(&mut w, i, move_to_tail);
                    }
                }
            }
            return Some(found);
        }
        None
    }

    /// A scan's refill from the leaf for `seek` without locking it, when its mini-page
    /// decides every key in its range (a full-page mirror, or a mini-page with no page
    /// below): copies the node's used bytes into `snap` (one bulk copy, cheaper than
    /// reading record by record), validates, and copies the records between `start` and
    /// `end` from there into `out` (empty on entry). Returns the path to the leaf, or `None`,
    /// with `out` empty, when the locked path must do it.
    ///
    /// # Errors
    /// What the merge operator returns for a pending merge in a mini-page with no page below.
    pub(in crate::tree) fn collect_optimistic<'g>(
        &self,
        guard: &'g EpochGuard,
        seek: Seek<'_>,
        (start, end): (&Bound<Vec<u8>>, &Bound<Vec<u8>>),
        snap: &mut Vec<u8>,
        out: &mut Copied,
    ) -> Result<Option<Path<'g>>> {
        for _ in 0..TRIES {
            let (version, path) = self.index().walk(guard, seek);
            let Some(read) = self.pool().read_optimistic(path.leaf()) else {
                return Ok(None);
            };
            if !matches!(read.location(), Location::Mini(_)) {
                return Ok(None);
            }
            let Some(block) = read.block() else {
                continue;
            };
            let racy = RacyNode::new(block.len(), block);
            if !decides_all(&racy) {
                // The disk page is needed (or the header was torn): the locked path decides.
                return Ok(None);
            }
            let (metas_end, data_start) = racy.used_extent();
            snap.resize(block.len(), 0);
            block.copy_to(0, &mut snap[..metas_end]);
            block.copy_to(data_start, &mut snap[data_start..]);
            let Some(path) = self.holds(guard, seek, path, version, &read) else {
                continue;
            };
            if NodeRef::from_bytes(snap).kind() == NodeKind::Leaf {
                self.counters().count(Event::CacheHit);
                // The copy is this scan's own: read its records in place.
                if !out.adopt(snap, start, end) {
                    copy_present(NodeRef::from_bytes(snap), start, end, out);
                }
                return Ok(Some(path));
            }
            let node = NodeRef::from_bytes(snap);
            if node.disk_page().is_none_or(|p| p == NO_PAGE) {
                fold_alone(node, start, end, out, |k, b, ops| {
                    self.fold_or_mark(k, b, ops)
                })?;
            } else {
                return Ok(None);
            }
            return Ok(Some(path));
        }
        Ok(None)
    }
}

#[cfg(all(test, not(shuttle)))]
mod tests {
    use std::collections::BTreeMap;
    use std::ops::Bound;

    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    use crate::{Config, Tree};

    /// Every entry's lock word and version.
    fn entries(tree: &Tree) -> Vec<(u64, u64)> {
        let pool = tree.shared().pool();
        (0..pool.page_id_limit())
            .map(|pid| pool.entry_words(pid))
            .collect()
    }

    #[test]
    fn lookups_and_scans_store_nothing_to_their_leaves() {
        // No copy-on-access region: a lookup there moves the block, a write by design.
        let config = Config::in_memory()
            .cache_size(8 << 20)
            .second_chance_percent(0);
        let tree = Tree::open(config).unwrap();
        let n = 5000u32;
        for i in 0..n {
            tree.insert(i.to_be_bytes(), [7u8; 24]).unwrap();
        }
        assert!(tree.stats().splits > 10, "too few leaves to mean anything");
        let read_all = || {
            let mut value = Vec::new();
            for i in 0..n {
                assert!(tree.get_into(i.to_be_bytes(), &mut value).unwrap());
                assert_eq!(value, [7u8; 24]);
            }
            assert!(!tree.get_into(n.to_be_bytes(), &mut value).unwrap());
            assert_eq!(tree.iter().count(), n as usize);
            assert_eq!(tree.range(..100u32.to_be_bytes()).rev().count(), 100);
        };
        // The first lookup of a record marks it referenced: a write.
        read_all();
        let before = entries(&tree);
        let (hits, locks) = (tree.stats().cache_hits, tree.shared().pool().read_locks());
        read_all();
        assert!(tree.stats().cache_hits >= hits + u64::from(n));
        assert_eq!(
            entries(&tree),
            before,
            "a read stored to a lock word or version"
        );
        assert_eq!(
            tree.shared().pool().read_locks(),
            locks,
            "a read took a leaf's lock (a store to its word, however brief)"
        );
        tree.insert(0u32.to_be_bytes(), [8u8; 24]).unwrap();
        assert_ne!(entries(&tree), before, "a write leaves a trace");
    }

    #[test]
    fn scans_over_whole_leaves_take_no_lock() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::new(dir.path())
            .page_size(4096)
            .cache_size(8 << 20)
            .promotion_percent(100);
        let tree = Tree::open(config).unwrap();
        let mut expected = BTreeMap::new();
        for i in 0..4000u32 {
            let (k, v) = (
                (2 * i).to_be_bytes().to_vec(),
                vec![i as u8; 1 + i as usize % 29],
            );
            tree.insert(&k, &v).unwrap();
            expected.insert(k, v);
        }
        tree.shared().evict_all();
        for k in expected.keys() {
            tree.get(k).unwrap();
        }
        assert!(
            tree.stats().leaves_cached > 20,
            "too few leaves cached whole"
        );
        let locks = tree.shared().pool().read_locks();
        let bound = |rng: &mut SmallRng, at: u32| {
            let key = at.to_be_bytes().to_vec();
            match rng.gen_range(0..3) {
                0 => Bound::Unbounded,
                1 => Bound::Included(key),
                _ => Bound::Excluded(key),
            }
        };
        let mut rng = SmallRng::seed_from_u64(5);
        for round in 0..400 {
            let from = rng.gen_range(0..8002u32);
            let to = rng.gen_range(from + 1..8003);
            let range = (bound(&mut rng, from), bound(&mut rng, to));
            let take = rng.gen_range(1..300);
            let want = expected
                .range(range.clone())
                .map(|(k, v)| (k.clone(), v.clone()));
            let scan = tree.range(range.clone()).map(Result::unwrap);
            if round % 2 == 0 {
                assert!(scan.take(take).eq(want.take(take)), "{range:?} up");
            } else {
                assert!(
                    scan.rev().take(take).eq(want.rev().take(take)),
                    "{range:?} down"
                );
            }
        }
        assert_eq!(
            tree.shared().pool().read_locks(),
            locks,
            "a scan over leaves cached whole took a lock"
        );
    }
}
