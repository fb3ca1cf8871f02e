//! Bulk load (`Tree::bulk_load`): sorted records written straight into fresh, packed leaf
//! pages, which then replace the one leaf whose range holds them all.
//!
//! **Streaming.** Each record is checked (keys strictly ascending, the limits of `insert`),
//! a value too long for a record goes to the blob file as `insert` sends it (`outline.rs`),
//! and the records gather in a window of a few pages, cut into leaves as a packed split
//! cuts them (`Shared::leaf_groups`: each leaf as full as it can be, separators the
//! shortest keys between neighbours). Every leaf but the window's last two (whose cut may
//! still change with the records to come) is built as write-back builds one
//! (`Shared::build_leaf`) into a `PageBatch`, written 32 per `write_batch`; only its low
//! bound and page stay in memory. Nothing the tree can reach refers to these pages yet: an
//! error (or a panic in the caller's iterator) frees them, a crash leaves them to the next
//! open, which frees every page its checkpoint does not name. The first and the last leaf
//! are held back: they share the old leaf's range with its records outside the span.
//!
//! **Install**, which everyone else sees as a split: the structure lock, then the write
//! lock of the leaf that owns the first key (a checkpoint's order; leaf-lock holders only
//! try the structure lock). That leaf must own the last key too and hold no present record
//! in the span (its node merged over its page, merges folded), or nothing changes. Its
//! records below and above the span join the first and last leaves, written now, under
//! the lock. The old leaf's page id becomes the first new leaf's (its cached node, all in
//! the edge leaves now, is dropped), the others get new ids, and `Shared::publish` puts
//! them in the index at once, bumping the structure version before the leaf's lock is
//! released. So a checkpoint or idle write-back that staged the old leaf finds its write
//! token changed and drops its page, and a checkpoint's snapshot (taken under the
//! structure lock) names the old leaf or the new ones, never a mix.
//!
//! **Exactly once.** Every new leaf's image LSN is read under the old leaf's lock: the edge
//! leaves hold every logged write to their ranges, and every write logged to the span
//! before came to nothing (it held no record), so replay from a checkpoint naming the new
//! leaves skips what lies below that LSN and applies the rest once.
//!
//! **Durability.** The load is not logged; a checkpoint after the install makes it durable
//! under every `Durability`. Until that checkpoint's file replaces the last one, a crash
//! recovers from the last one, which names none of the new pages.

use crate::error::{Error, Result};
use crate::node::{self, NodeKind, NodeRef, Record, RecordKind};
use crate::pool::{Location, WriteGuard};
use crate::store::PageStore;
use crate::sync;
use crate::tree::blob::Stored;
use crate::tree::cache::node_records;
use crate::tree::index::{Bounds, Entry, Seek};
use crate::tree::keyspace::Prefix;
use crate::tree::keyspace::Space;
use crate::tree::read::Range;
use crate::tree::writeback::PageBatch;
use crate::tree::{Shared, FLAG_DAMAGED, NO_PAGE};

/// Leaves written with one `write_batch`: as many as a checkpoint pass writes at once.
const BATCH: usize = crate::tree::writeback::BATCH;

/// Pages' worth of record bytes the window gathers before it is cut: several leaves per
/// cut, so that re-cutting the two it keeps costs little.
const WINDOW_PAGES: usize = 8;

/// Bytes a record's meta takes in a node besides its key and value (`node/layout.rs`).
const META: usize = 8;

/// Why a bulk load refuses its input.
const NOT_ASCENDING: &str = "bulk load keys must be strictly ascending";
const SPAN_CROSSES: &str = "bulk load key span crosses a leaf boundary";
const SPAN_NOT_EMPTY: &str = "bulk load key span already holds a key";

fn refused(reason: &'static str) -> Error {
    Error::InvalidInput { reason }
}

/// A leaf the load built: its exact low bound (`None`: the old leaf's, minus infinity) and
/// its page.
type Built = (Option<Vec<u8>>, u64);

/// The pages a load writes: built into a batch, written 32 at a time, and freed again
/// unless the install takes them.
struct Pages<'s> {
    shared: &'s Shared,
    store: &'s dyn PageStore,
    batch: PageBatch,
    /// Leaves built into `batch`, not yet written.
    staged: Vec<Built>,
    /// Pages written that nothing references yet.
    owned: Vec<u64>,
}

impl Pages<'_> {
    /// Builds a leaf of `records` between `low` and `high` into the batch, on a page of
    /// its own.
    fn stage(&mut self, low: Option<&[u8]>, high: Option<&[u8]>, records: &[Record]) -> Result<()> {
        let buf = self.batch.next_buf(self.shared.page_size());
        self.shared.build_leaf(buf, low, high, records, false)?;
        let new = self.batch.stage(self.store)?;
        self.staged.push((low.map(<[u8]>::to_vec), new));
        Ok(())
    }

    /// Cuts `records` into packed leaves between `low` and `high` and stages them.
    fn stage_all(
        &mut self,
        records: &[Record],
        low: Option<&[u8]>,
        high: Option<&[u8]>,
    ) -> Result<()> {
        let groups = self.shared.leaf_groups(records, low, high, true);
        for (g, (range, group_low)) in groups.iter().enumerate() {
            let group_high = groups.get(g + 1).map_or(high, |(_, next)| next.as_deref());
            self.stage(group_low.as_deref(), group_high, &records[range.clone()])?;
        }
        Ok(())
    }

    /// Writes the staged leaves with one `write_batch` and returns them. On failure they
    /// stay staged, for `abandon`.
    fn write_out(&mut self) -> Result<Vec<Built>> {
        self.batch
            .write_out(self.store, self.shared.storage().blobs())?;
        self.owned.extend(self.staged.iter().map(|&(_, page)| page));
        Ok(std::mem::take(&mut self.staged))
    }

    /// Frees every page built or written: the load failed.
    fn abandon(&mut self) {
        self.batch.abandon(self.shared.storage());
        self.staged.clear();
        for page in self.owned.drain(..) {
            self.shared.storage().free(page);
        }
    }
}

/// One bulk load into a file-backed tree (see the module docs).
struct Loader<'s> {
    shared: &'s Shared,
    prefix: Prefix,
    pages: Pages<'s>,
    /// Records taken so far.
    count: u64,
    /// The first stored key.
    first: Vec<u8>,
    /// The last stored key.
    last: Vec<u8>,
    /// The exact high bound (`None`: plus infinity) of the leaf that owned `first` when it
    /// was last looked at: a span past it is refused before more is written in vain.
    owner_high: Option<Vec<u8>>,
    /// Records not yet cut into leaves.
    window: Vec<Record>,
    /// Their bytes in a node.
    window_bytes: usize,
    /// The low bound of the window's first leaf. For the first window it is a guess (the
    /// owner's low bound when the first key came), which only shapes the first leaf, and
    /// that one is cut again at the install.
    window_low: Option<Vec<u8>>,
    /// The first leaf's records, held back for the install (`None` until cut).
    head: Option<Vec<Record>>,
    /// The leaves written between the first and the last, each with its low bound.
    middle: Vec<(Vec<u8>, u64)>,
    /// The extents written for values stored out of line.
    extents: Vec<Stored<'static>>,
    /// Whether the tree took the leaves (then nothing is undone).
    installed: bool,
}

impl<'s> Loader<'s> {
    fn new(shared: &'s Shared, store: &'s dyn PageStore, prefix: Prefix) -> Loader<'s> {
        Loader {
            shared,
            prefix,
            pages: Pages {
                shared,
                store,
                batch: PageBatch::default(),
                staged: Vec::with_capacity(BATCH),
                owned: Vec::new(),
            },
            count: 0,
            first: Vec::new(),
            last: Vec::new(),
            owner_high: None,
            window: Vec::new(),
            window_bytes: 0,
            window_low: None,
            head: None,
            middle: Vec::new(),
            extents: Vec::new(),
            installed: false,
        }
    }

    /// Takes the next record.
    fn push(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.shared.limits().check(key, value)?;
        let full = self.prefix.key(key);
        if self.count == 0 {
            self.first.extend_from_slice(&full);
            self.look_at_owner(true);
        } else if *full <= *self.last {
            return Err(refused(NOT_ASCENDING));
        }
        if self.owner_high.as_deref().is_some_and(|h| *full >= *h) {
            // The owner may have grown since (a neighbour removed): look again.
            self.look_at_owner(false);
            if self.owner_high.as_deref().is_some_and(|h| *full >= *h) {
                return Err(refused(SPAN_CROSSES));
            }
        }
        let stored = self.shared.store_value(key, value)?;
        let record = Record {
            key: node::Bytes::from_slice(&full),
            value: node::Bytes::from_slice(stored.bytes()),
            kind: RecordKind::Insert,
        };
        if let Stored::Outline(r, bytes) = stored {
            self.extents.push(Stored::Outline(r, bytes));
        }
        self.last.clear();
        self.last.extend_from_slice(&full);
        self.count += 1;
        self.window_bytes += META + record.key.len() + record.value.len();
        self.window.push(record);
        if self.window_bytes >= WINDOW_PAGES * self.shared.page_size() {
            self.cut(false)?;
        }
        Ok(())
    }

    /// Notes the bounds of the leaf that owns the first key now (a hint: only the install,
    /// under the locks, decides).
    fn look_at_owner(&mut self, first_look: bool) {
        let guard = sync::pin();
        let (low, high) = self
            .shared
            .index()
            .descend(&guard, Seek::Key(&self.first))
            .bounds();
        if first_look {
            self.window_low = low;
        }
        self.owner_high = high;
    }

    /// Cuts the window into leaves and stages all but the last two (`end`: all but the
    /// last, which is the load's last leaf). A leaf's cut depends on the record after it
    /// (the separator), so one ending at the window's end could still change; with two
    /// kept, every leaf staged is cut as if all records had been cut at once.
    fn cut(&mut self, end: bool) -> Result<()> {
        let keep = if end { 1 } else { 2 };
        let groups = self
            .shared
            .leaf_groups(&self.window, self.window_low.as_deref(), None, true);
        if groups.len() <= keep {
            return Ok(());
        }
        let emit = groups.len() - keep;
        for g in 0..emit {
            let (range, low) = &groups[g];
            let records = &self.window[range.clone()];
            if self.head.is_none() {
                self.head = Some(records.to_vec());
                continue;
            }
            self.pages
                .stage(low.as_deref(), groups[g + 1].1.as_deref(), records)?;
            if self.pages.staged.len() >= BATCH {
                self.write_middle()?;
            }
        }
        let (rest, low) = &groups[emit];
        self.window_low.clone_from(low);
        self.window.drain(..rest.start);
        self.window_bytes = self
            .window
            .iter()
            .map(|r| META + r.key.len() + r.value.len())
            .sum();
        Ok(())
    }

    /// Writes the staged leaves, all between the first and the last.
    fn write_middle(&mut self) -> Result<()> {
        for (low, page) in self.pages.write_out()? {
            // Only the first leaf, held back, starts at the old leaf's low bound.
            debug_assert!(low.is_some(), "a middle leaf without a low bound");
            self.middle.push((low.unwrap_or_default(), page));
        }
        Ok(())
    }

    /// The end of the input: writes what is left but the last leaf, and installs.
    fn finish(&mut self) -> Result<()> {
        self.cut(true)?;
        self.write_middle()?;
        self.install()
    }

    /// Replaces the leaf that owns the span by the loaded leaves (see the module docs).
    fn install(&mut self) -> Result<()> {
        let shared = self.shared;
        let smo = shared.index().lock_smo();
        let guard = sync::pin();
        // The structure cannot change while the structure lock is held.
        let path = shared.index().descend(&guard, Seek::Key(&self.first));
        let pid = path.leaf();
        let mut page = shared.pool().write(pid);
        let bounds = path.bounds();
        if bounds
            .1
            .as_deref()
            .is_some_and(|h| self.last.as_slice() >= h)
        {
            return Err(refused(SPAN_CROSSES));
        }
        let (old, old_disk) = self.old_records(&page, &bounds)?;
        let (low, high) = bounds;
        let below = old.partition_point(|r| r.key.as_slice() < self.first.as_slice());
        let above = old.partition_point(|r| r.key.as_slice() <= self.last.as_slice());
        if below < above {
            return Err(refused(SPAN_NOT_EMPTY));
        }
        let (below, above) = old.split_at(below);
        let head = self.head.take().unwrap_or_default();
        let tail = std::mem::take(&mut self.window);
        let (left, right) = if self.middle.is_empty() {
            let records = [below, &head, &tail, above].concat();
            self.pages
                .stage_all(&records, low.as_deref(), high.as_deref())?;
            (self.pages.write_out()?, Vec::new())
        } else {
            let records = [below, &head].concat();
            let next = Some(self.middle[0].0.as_slice());
            self.pages.stage_all(&records, low.as_deref(), next)?;
            let split = self.pages.staged.len();
            let records = [&tail, above].concat();
            self.pages
                .stage_all(&records, self.window_low.as_deref(), high.as_deref())?;
            let mut left = self.pages.write_out()?;
            let right = left.split_off(split);
            (left, right)
        };
        let middle = std::mem::take(&mut self.middle);
        let count = left.len() + middle.len() + right.len();
        // Ids for the new leaves first: running out of them must leave nothing to undo.
        let mut new_leaves = Vec::with_capacity(count - 1);
        for _ in 1..count {
            let Some(leaf) = shared.pool().insert_page(Location::Disk(NO_PAGE)) else {
                new_leaves.into_iter().for_each(WriteGuard::remove);
                return Err(Error::too_many_leaves());
            };
            new_leaves.push(leaf);
        }
        // The old leaf is locked: no write to its range can be logged before it is released.
        let lsn = shared.journal().image_lsn();
        let mut leaves = left
            .into_iter()
            .chain(middle.into_iter().map(|(low, page)| (Some(low), page)))
            .chain(right);
        let Some((_, first_page)) = leaves.next() else {
            return Err(shared.storage().corruption(None, "bulk load built no leaf"));
        };
        let mut entries = Vec::with_capacity(count);
        entries.push(Entry::leaf(low.unwrap_or_default(), pid));
        let tracker = shared.storage().pages();
        for ((leaf_low, page_no), mut leaf) in leaves.zip(new_leaves) {
            drop(leaf.set_location_disk(page_no));
            tracker.written(leaf.page_id(), page_no, lsn);
            entries.push(Entry::leaf(leaf_low.unwrap_or_default(), leaf.page_id()));
        }
        // Snapshots would see the loaded records appear (nothing saves their absence):
        // those open now are made too old instead.
        shared.versions().make_all_too_old();
        // A replacement by leaves never removes the last leaf: this cannot fail.
        let published = shared.publish(&smo, &self.first, pid, entries);
        debug_assert!(published);
        if let Some(old) = page.set_location_disk(first_page) {
            shared.pool().dealloc(old);
        }
        shared.storage().moved(pid, old_disk, first_page, lsn);
        self.pages.owned.clear();
        self.installed = true;
        drop(page);
        drop(smo);
        for stored in &self.extents {
            shared.settle(stored, true);
        }
        Ok(())
    }

    /// Every present record of the write-locked leaf `page` (with `bounds`), as its
    /// write-back would write them, and its disk page. A damaged leaf is `Corruption`: its
    /// lost keys may be in the span.
    fn old_records(
        &self,
        page: &WriteGuard<'_>,
        bounds: &Bounds,
    ) -> Result<(Vec<Record>, Option<u64>)> {
        let shared = self.shared;
        let Some(bytes) = page.mini() else {
            return match page.location() {
                Location::Disk(p) if p != NO_PAGE => {
                    Ok((shared.leaf_records(bounds, None, Some(p))?, Some(p)))
                }
                _ => Ok((Vec::new(), None)),
            };
        };
        let node = NodeRef::from_bytes(bytes);
        let disk = node.disk_page();
        if node.kind() != NodeKind::Leaf {
            return Ok((shared.leaf_records(bounds, Some(node), disk)?, disk));
        }
        // A full-page mirror holds every record of its leaf.
        if node.flags() & FLAG_DAMAGED != 0 {
            return Err(shared
                .storage()
                .corruption(disk, "a damaged leaf cannot take a bulk load"));
        }
        Ok((node_records(node), disk))
    }
}

impl Drop for Loader<'_> {
    fn drop(&mut self) {
        if self.installed {
            return;
        }
        // Failed (or the caller's iterator panicked): nothing references what it wrote.
        self.pages.abandon();
        for stored in &self.extents {
            self.shared.settle(stored, false);
        }
    }
}

impl Shared {
    /// Loads `records` (strictly ascending user keys) into `space`: see
    /// [`Tree::bulk_load`](crate::Tree::bulk_load) for the contract. Returns how many
    /// records were loaded.
    ///
    /// # Errors
    /// `InvalidInput`, `KeyTooLarge` or `ValueTooLarge` for input that breaks the contract;
    /// `Io` or `Corruption` from the store (the tree unchanged); errors of the final
    /// checkpoint (the records loaded, not yet durable).
    pub(crate) fn bulk_load_in<K, V>(
        &self,
        space: &Space,
        records: impl IntoIterator<Item = (K, V)>,
    ) -> Result<u64>
    where
        K: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let count = self.load(space, records)?;
        if count > 0 {
            self.checkpoint()?;
        }
        Ok(count)
    }

    /// [`Shared::bulk_load_in`] without the checkpoint that makes it durable.
    fn load<K, V>(&self, space: &Space, records: impl IntoIterator<Item = (K, V)>) -> Result<u64>
    where
        K: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let Some(store) = self.storage().store() else {
            return self.insert_sorted(space, records);
        };
        // After the log failed the tree refuses every write (`Journal::check`).
        self.journal().check()?;
        let mut loader = Loader::new(self, &**store, space.prefix());
        for (key, value) in records {
            loader.push(key.as_ref(), value.as_ref())?;
        }
        if loader.count > 0 {
            loader.finish()?;
        }
        Ok(loader.count)
    }

    /// The bulk load of an in-memory tree, whose records live in memory anyway: the same
    /// checks, then one insert per record. A failed insert (a full cache) takes back the
    /// records inserted before it that still hold the loaded value.
    fn insert_sorted<K, V>(
        &self,
        space: &Space,
        records: impl IntoIterator<Item = (K, V)>,
    ) -> Result<u64>
    where
        K: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let mut all: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        for (key, value) in records {
            let (key, value) = (key.as_ref(), value.as_ref());
            self.limits().check(key, value)?;
            if all.last().is_some_and(|(prev, _)| key <= prev.as_slice()) {
                return Err(refused(NOT_ASCENDING));
            }
            all.push((key.to_vec(), value.to_vec()));
        }
        let (Some((first, _)), Some((last, _))) = (all.first(), all.last()) else {
            return Ok(0);
        };
        let mut span = Range::new(self, space, first.as_slice()..=last.as_slice());
        if span.next().transpose()?.is_some() {
            return Err(refused(SPAN_NOT_EMPTY));
        }
        for (i, (key, value)) in all.iter().enumerate() {
            if let Err(e) = self.put_in(space, key, value) {
                for (key, value) in &all[..i] {
                    let _ = self.cas_in(space, key, Some(value), None);
                }
                return Err(e);
            }
        }
        Ok(all.len() as u64)
    }
}

#[cfg(all(test, not(shuttle)))]
mod tests {
    use crate::node::{self, NodeKind, Record, RecordKind};
    use crate::tree::keyspace::stored_key;
    use crate::tree::persist::copy_dir;
    use crate::{Config, Durability, Tree};

    /// A checkpoint that took its LSN before the install and its snapshot after it names
    /// the new leaves: replay from it must not apply again a merge the edge leaf folded.
    #[test]
    fn a_checkpoint_around_the_install_replays_each_merge_once() {
        let add = |_: &[u8], old: Option<&[u8]>, operand: &[u8]| {
            let n = |b: Option<&[u8]>| {
                b.and_then(|b| b.try_into().ok())
                    .map_or(0, u64::from_le_bytes)
            };
            Some((n(old) + n(Some(operand))).to_le_bytes().to_vec())
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let config = |d: &std::path::Path| {
            Config::new(d)
                .durability(Durability::Sync)
                .merge_operator(add)
        };
        let tree = Tree::open(config(dir.path())).expect("open");
        let one = 1u64.to_le_bytes();
        tree.insert(b"a", b"below").expect("insert");
        tree.merge(b"z", one).expect("merge");
        tree.checkpoint().expect("checkpoint");
        let shared = tree.shared();
        let space = shared.catalog().default_space();
        let records = (0..5000u32).map(|i| (format!("m{i:05}"), [7u8; 20]));
        shared
            .checkpoint_between(|| {
                tree.merge(b"z", one).expect("merge");
                assert_eq!(shared.load(space, records).expect("load"), 5000);
            })
            .expect("checkpoint");
        // A crash now: the directory as the checkpoint and the synced log left it.
        let copy = tempfile::tempdir().expect("tempdir");
        copy_dir(dir.path(), copy.path());
        drop(tree);
        let tree = Tree::open(config(copy.path())).expect("reopen");
        let two = 2u64.to_le_bytes().to_vec();
        assert_eq!(tree.get(b"z").expect("get"), Some(two));
        assert_eq!(tree.get(b"a").expect("get"), Some(b"below".to_vec()));
        assert_eq!(tree.iter().count(), 5002);
        tree.shared().check_structure().expect("structure");
    }

    /// With no bound to guess (an empty tree), the windows cut exactly as one packed cut
    /// of all the records would.
    #[test]
    fn an_empty_tree_gets_exactly_the_packed_cut_of_all_records() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tree = Tree::open(Config::new(dir.path()).cache_size(1 << 20)).expect("open");
        let key = |i: u32| format!("k{i:06}");
        let value = |i: u32| vec![i as u8; (i as usize * 7) % 90];
        let n = 30_000u32;
        let loaded = tree.bulk_load((0..n).map(|i| (key(i), value(i))));
        assert_eq!(loaded.expect("load"), u64::from(n));
        let shared = tree.shared();
        shared.check_structure().expect("structure");
        let records: Vec<Record> = (0..n)
            .map(|i| Record {
                key: node::Bytes::from_slice(&stored_key(key(i).as_bytes())),
                value: node::Bytes::from_slice(&value(i)),
                kind: RecordKind::Insert,
            })
            .collect();
        let page = shared.page_size();
        let packed = node::split_records_packed(&records, page, NodeKind::Leaf, None, None);
        assert_eq!(shared.index().leaves().len(), packed.len());
    }
}
