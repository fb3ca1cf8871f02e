//! What keeps a scan from seeing part of an atomic batch (`commit.rs`).
//!
//! A batch applies under the locks of every leaf it writes, so a lookup, which locks one
//! leaf, sees all of it or none. A scan locks one leaf at a time and holds nothing in
//! between: it could copy a leaf before a batch and the next leaf after it. So each batch
//! takes a sequence number once it holds its locks, and each scan notes the last number
//! taken when it starts. While scans are in progress, a batch also saves what its keys held
//! before it (its *undo*), published before its locks are released; a scan puts those old
//! values back in every leaf it copies, for each batch numbered after its start. A scan
//! therefore sees the batches that committed before it started whole, and the later ones
//! not at all.
//!
//! Why a batch that saved nothing is never missed (both sides use `SeqCst`): a batch takes
//! its number, then loads the scans' registration slots; a scan fills a slot, then loads the
//! number. If the batch saw no scan, the scan's load comes after the batch's number was
//! taken, so the scan counts the batch as before its start; every leaf the scan copies is
//! then copied after the batch took all its locks, so after the batch was applied.
//!
//! A checkpoint reads leaves one at a time too. When writes are logged, replay from the
//! checkpoint's LSN completes any batch it caught half-applied. When they are not
//! (`Durability::None`), nothing would: so there a batch applies only while no checkpoint
//! is writing leaves, and a checkpoint waits for the batches applying when it starts.
//!
//! Saved undo is dropped once no scan in progress started before its batch. With no scan
//! running, batches save nothing; a scan writes its own slot at each end.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::sync::{Arc, AtomicBool, AtomicU64, AtomicUsize, Mutex, Ordering, RwLock};
use crate::sync::{RwLockReadGuard, RwLockWriteGuard};
use crate::tree::blob::BlobPin;
use crate::tree::KeyValue;

/// What a batch's keys held before it: key (keyspace prefix included) and old value
/// (`None`: absent), ascending by key.
pub(crate) type Undo = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// A saved old value (`None`: the key was absent).
type Old = Option<Arc<[u8]>>;

/// Registration slots: a scan takes one (by its thread's shard, so two threads rarely share
/// a cache line) instead of a shared lock or counter, which cost YCSB-E's short scans a few
/// percent. Past this many scans at once, the rest register under the lock.
const SLOTS: usize = 64;
/// A slot's value while its scan reads its start number: "may need every saved value".
const REGISTERING: u64 = u64::MAX;

/// One registration slot: 0 free, `REGISTERING`, or the scan's start number + 1.
#[repr(align(64))]
struct Slot(AtomicU64);

/// Where a scan in progress is registered (see [`Versions::begin_scan`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScanStart {
    /// The last batch number when the scan started.
    start: u64,
    /// Its slot; `None`: registered under the lock.
    slot: Option<usize>,
}

/// The batch sequence, the scans in progress, and the undo they may need.
pub(crate) struct Versions {
    /// The number the last batch took.
    seq: AtomicU64,
    slots: [Slot; SLOTS],
    /// Scans registered under the lock (every slot was taken).
    overflow: AtomicUsize,
    /// Whether any undo is saved (so a scan that ends knows whether to prune).
    has_saved: AtomicBool,
    state: Mutex<State>,
    /// Keeps batches and checkpoints apart when writes are not logged (below).
    unlogged: RwLock<()>,
}

#[derive(Default)]
struct State {
    /// The start numbers of the scans registered here rather than in a slot.
    starts: Vec<u64>,
    /// Saved old values by key: for each key, the batches that wrote it (number, old value),
    /// ascending by number. Indexed by key so a scan looks up only its leaf's range, however
    /// many batches ran since it started.
    by_key: BTreeMap<Vec<u8>, Vec<(u64, Old)>>,
    /// The numbers of the batches saved, with their keys (for pruning), in publication
    /// order, and the pin that keeps the extents of saved values stored out of line from
    /// reuse (`blob/extents.rs`) for as long as a scan may yield them.
    saved: Vec<(u64, Vec<Vec<u8>>, Option<BlobPin>)>,
}

/// A batch's place in the sequence, taken with its locks held.
pub(crate) struct Ticket {
    seq: u64,
    /// Whether a scan may need the batch's undo.
    save: bool,
}

impl Ticket {
    /// Whether the batch must save its undo.
    pub(crate) fn save_undo(&self) -> bool {
        self.save
    }
}

impl Default for Versions {
    fn default() -> Versions {
        Versions {
            seq: AtomicU64::new(0),
            slots: std::array::from_fn(|_| Slot(AtomicU64::new(0))),
            overflow: AtomicUsize::new(0),
            has_saved: AtomicBool::new(false),
            state: Mutex::default(),
            unlogged: RwLock::default(),
        }
    }
}

impl Versions {
    /// Registers a scan; returns where, with its start number (see [`Versions::end_scan`]).
    pub(crate) fn begin_scan(&self) -> ScanStart {
        let home = crate::pool::my_shard() % SLOTS;
        for i in 0..SLOTS {
            let slot = (home + i) % SLOTS;
            let word = &self.slots[slot].0;
            if word
                .compare_exchange(0, REGISTERING, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                let start = self.seq.load(Ordering::SeqCst);
                word.store(start + 1, Ordering::SeqCst);
                return ScanStart {
                    start,
                    slot: Some(slot),
                };
            }
        }
        let mut state = self.state.lock();
        self.overflow.fetch_add(1, Ordering::SeqCst);
        let start = self.seq.load(Ordering::SeqCst);
        state.starts.push(start);
        ScanStart { start, slot: None }
    }

    /// Unregisters a scan.
    pub(crate) fn end_scan(&self, scan: ScanStart) {
        if let Some(slot) = scan.slot {
            self.slots[slot].0.store(0, Ordering::SeqCst);
            if self.has_saved.load(Ordering::Acquire) {
                self.state.lock().prune(self);
            }
            return;
        }
        let mut state = self.state.lock();
        if let Some(i) = state.starts.iter().position(|s| *s == scan.start) {
            state.starts.swap_remove(i);
        }
        self.overflow.fetch_sub(1, Ordering::SeqCst);
        state.prune(self);
    }

    /// The earliest start number of a scan in progress (0 while one is registering: it
    /// may need anything); `None` without scans.
    fn earliest_start(&self, state: &State) -> Option<u64> {
        let slots = self
            .slots
            .iter()
            .filter_map(|s| match s.0.load(Ordering::SeqCst) {
                0 => None,
                REGISTERING => Some(0),
                v => Some(v - 1),
            });
        slots.chain(state.starts.iter().copied()).min()
    }

    /// Numbers a batch that holds the locks of every leaf it writes.
    pub(crate) fn ticket(&self) -> Ticket {
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        let save = self.overflow.load(Ordering::SeqCst) > 0
            || self.slots.iter().any(|s| s.0.load(Ordering::SeqCst) != 0);
        Ticket { seq, save }
    }

    /// Publishes a batch's undo (before its locks are released), with the pin that keeps
    /// its old values' extents, if any, from reuse.
    pub(crate) fn publish(&self, ticket: &Ticket, undo: Undo, pin: Option<BlobPin>) {
        let mut state = self.state.lock();
        let mut keys = Vec::with_capacity(undo.len());
        for (key, old) in undo {
            let entries = state.by_key.entry(key.clone()).or_default();
            let at = entries.partition_point(|(seq, _)| *seq < ticket.seq);
            entries.insert(at, (ticket.seq, old.map(Arc::from)));
            keys.push(key);
        }
        state.saved.push((ticket.seq, keys, pin));
        self.has_saved.store(true, Ordering::Release);
        state.prune(self);
    }

    /// Held by a batch applying while writes are not logged: no checkpoint writes leaves
    /// meanwhile.
    pub(crate) fn batch_applying(&self) -> RwLockReadGuard<'_, ()> {
        self.unlogged.read()
    }

    /// Held by a checkpoint writing leaves while writes are not logged: no batch applies
    /// meanwhile.
    pub(crate) fn checkpoint_writing(&self) -> RwLockWriteGuard<'_, ()> {
        self.unlogged.write()
    }

    /// Whether a batch took a number since `scan` (a scan's start).
    #[inline]
    pub(crate) fn batched_since(&self, scan: ScanStart) -> bool {
        self.seq.load(Ordering::SeqCst) != scan.start
    }

    /// Puts back, in `items` (a leaf's records between `start` and `end`, ascending), the
    /// old values of the keys written by batches numbered after `scan` (a scan's start).
    pub(crate) fn rewind(
        &self,
        scan: ScanStart,
        items: &mut Vec<KeyValue>,
        start: &Bound<Vec<u8>>,
        end: &Bound<Vec<u8>>,
    ) {
        if is_empty(start, end) {
            return;
        }
        // For each key written since the scan started, its value before the first of those
        // batches.
        let old: Vec<(Vec<u8>, Old)> = {
            let state = self.state.lock();
            state
                .by_key
                .range::<Vec<u8>, _>((start.as_ref(), end.as_ref()))
                .filter_map(|(key, entries)| {
                    let first = entries.iter().find(|(seq, _)| *seq > scan.start)?;
                    Some((key.clone(), first.1.clone()))
                })
                .collect()
        };
        if old.is_empty() {
            return;
        }
        let mut out = Vec::with_capacity(items.len() + old.len());
        let mut old = old.into_iter().peekable();
        for (key, value) in items.drain(..) {
            while let Some((k, v)) = old.next_if(|(k, _)| *k < key) {
                if let Some(v) = v {
                    out.push((k, v.to_vec()));
                }
            }
            match old.next_if(|(k, _)| *k == key) {
                Some((_, Some(v))) => out.push((key, v.to_vec())),
                Some((_, None)) => {}
                None => out.push((key, value)),
            }
        }
        out.extend(old.filter_map(|(k, v)| v.map(|v| (k, v.to_vec()))));
        *items = out;
    }

    /// Saved undo (batches saved since no scan needed them dropped): for tests.
    #[cfg(all(test, not(shuttle)))]
    pub(crate) fn saved(&self) -> usize {
        let state = self.state.lock();
        debug_assert_eq!(state.by_key.is_empty(), state.saved.is_empty());
        state.saved.len()
    }
}

impl State {
    /// Drops the undo no scan in progress needs: that of batches numbered at or before the
    /// earliest start.
    fn prune(&mut self, rewind: &Versions) {
        if self.saved.is_empty() {
            return;
        }
        let Some(first) = rewind.earliest_start(self) else {
            self.by_key.clear();
            self.saved.clear();
            rewind.has_saved.store(false, Ordering::Release);
            return;
        };
        let by_key = &mut self.by_key;
        self.saved.retain(|(seq, keys, _)| {
            if *seq > first {
                return true;
            }
            for key in keys {
                if let Some(entries) = by_key.get_mut(key) {
                    entries.retain(|(s, _)| s != seq);
                    if entries.is_empty() {
                        by_key.remove(key);
                    }
                }
            }
            false
        });
        if self.saved.is_empty() {
            rewind.has_saved.store(false, Ordering::Release);
        }
    }
}

/// Whether no key lies between `start` and `end` (`BTreeMap::range` panics on such bounds).
fn is_empty(start: &Bound<Vec<u8>>, end: &Bound<Vec<u8>>) -> bool {
    match (start, end) {
        (Bound::Included(s), Bound::Included(e)) => s > e,
        (Bound::Included(s) | Bound::Excluded(s), Bound::Excluded(e))
        | (Bound::Excluded(s), Bound::Included(e)) => s >= e,
        _ => false,
    }
}

#[cfg(all(test, not(shuttle)))]
mod tests {
    use super::*;

    fn kv(k: &str, v: &str) -> KeyValue {
        (k.as_bytes().to_vec(), v.as_bytes().to_vec())
    }

    fn undo(pairs: &[(&str, Option<&str>)]) -> Undo {
        pairs
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.map(|v| v.as_bytes().to_vec())))
            .collect()
    }

    #[test]
    fn a_scan_sees_batches_from_before_its_start_and_not_after() {
        let r = Versions::default();
        let before = r.ticket();
        assert!(!before.save_undo(), "no scan: nothing to save");
        let scan = r.begin_scan();
        let after = r.ticket();
        assert!(after.save_undo());
        // The batch after the scan's start changed b, added c, removed d.
        r.publish(
            &after,
            undo(&[("b", Some("b0")), ("c", None), ("d", Some("d0"))]),
            None,
        );
        let mut items = vec![kv("a", "a1"), kv("b", "b1"), kv("c", "c1"), kv("e", "e1")];
        r.rewind(scan, &mut items, &Bound::Unbounded, &Bound::Unbounded);
        assert_eq!(
            items,
            vec![kv("a", "a1"), kv("b", "b0"), kv("d", "d0"), kv("e", "e1")]
        );
        // Only keys inside the copied range are put back.
        let mut items = vec![kv("e", "e1")];
        r.rewind(
            scan,
            &mut items,
            &Bound::Included(b"d1".to_vec()),
            &Bound::Unbounded,
        );
        assert_eq!(items, vec![kv("e", "e1")]);
        // A scan that starts now sees the batch.
        let later = r.begin_scan();
        let mut items = vec![kv("b", "b1")];
        r.rewind(later, &mut items, &Bound::Unbounded, &Bound::Unbounded);
        assert_eq!(items, vec![kv("b", "b1")]);
        r.end_scan(scan);
        assert_eq!(r.saved(), 0, "the remaining scan does not need it");
        r.end_scan(later);
    }

    #[test]
    fn scans_past_the_slots_register_under_the_lock() {
        let r = Versions::default();
        let scans: Vec<ScanStart> = (0..SLOTS + 6).map(|_| r.begin_scan()).collect();
        assert_eq!(scans.iter().filter(|s| s.slot.is_none()).count(), 6);
        let t = r.ticket();
        assert!(t.save_undo());
        r.publish(&t, undo(&[("k", None)]), None);
        // Ending all but one overflowed scan keeps the undo it needs.
        let (last, rest) = scans.split_last().unwrap();
        assert!(last.slot.is_none());
        for s in rest {
            r.end_scan(*s);
        }
        assert_eq!(r.saved(), 1);
        let mut items = vec![kv("k", "v")];
        r.rewind(*last, &mut items, &Bound::Unbounded, &Bound::Unbounded);
        assert!(items.is_empty());
        r.end_scan(*last);
        assert_eq!(r.saved(), 0);
        assert!(!r.ticket().save_undo(), "no scan left");
    }

    #[test]
    fn the_earliest_later_batch_gives_the_old_value() {
        let r = Versions::default();
        let scan = r.begin_scan();
        let first = r.ticket();
        let second = r.ticket();
        // Published in the other order.
        r.publish(&second, undo(&[("k", Some("v1"))]), None);
        r.publish(&first, undo(&[("k", Some("v0"))]), None);
        let mut items = vec![kv("k", "v2")];
        r.rewind(scan, &mut items, &Bound::Unbounded, &Bound::Unbounded);
        assert_eq!(items, vec![kv("k", "v0")]);
        r.end_scan(scan);
        assert_eq!(r.saved(), 0);
    }
}
