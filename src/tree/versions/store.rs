//! The write sequence and the readers registered at points of it: what keeps a scan from
//! seeing part of an atomic batch, and a snapshot or a transaction from seeing any write
//! made after it started.
//!
//! **Scans and batches.** A batch applies under the locks of every leaf it writes, so a
//! lookup, which locks one leaf, sees all of it or none. A scan locks one leaf at a time
//! and holds nothing in between: it could copy a leaf before a batch and the next leaf
//! after it. So each batch takes a sequence number once it holds its locks, and each scan
//! notes the last number taken when it starts. While scans are in progress, a batch also
//! saves what its keys held before it (its *undo*, `saved.rs`), before its locks are
//! released; a scan puts those old values back in every leaf it copies, for each write
//! numbered after its start. Why a batch that saved nothing is never missed (both sides use
//! `SeqCst`): a batch takes its number, then loads the scans' registration slots; a scan
//! fills a slot, then loads the number. If the batch saw no scan, the scan's load comes
//! after the batch's number was taken, so the scan counts the batch as before its start;
//! every leaf the scan copies is then copied after the batch took all its locks, so after
//! it was applied. Single writes take no number for scans: a scan sees every key present
//! for its whole duration, not one moment.
//!
//! **Snapshots and transactions** see one moment: every write acknowledged before they
//! started, none after. While one is registered ([`Versions::versioning`]), *every* write,
//! single or batch, saves the old values of its keys before it applies, and takes its number
//! and saves them in one step under this store's lock ([`Versions::record`]), where a
//! transaction's commit also checks its reads. Registering loads the number under the same
//! lock, after raising the count writers check. A write that saw no registration made its
//! check under its leaf's lock before the registration, and holds that lock until it has
//! applied: every read of its leaf by the snapshot comes after it, so the write is simply
//! part of the snapshot. One that saw it takes a number after the snapshot's and saves what
//! it replaced before anyone can read the leaf. A transaction checking its reads under the
//! lock therefore sees every write numbered before its commit.
//!
//! **Memory** (`Config::max_snapshot_bytes`): saved values are dropped once no reader that
//! started before their write is left. When they outgrow the limit, the oldest reader is
//! made *too old* (its next read answers `Error::SnapshotTooOld`, a transaction's commit
//! `Conflict`) and what only it needed is dropped, until they fit.
//!
//! A checkpoint reads leaves one at a time too. When writes are logged, replay from the
//! checkpoint's LSN completes any batch it caught half-applied. When they are not
//! (`Durability::None`), nothing would: so there a batch applies only while no checkpoint
//! is writing leaves, and a checkpoint waits for the batches applying when it starts.

use std::collections::BTreeMap;
use std::ops::Bound;

use super::saved::{Old, SavedValues, Undo};
use crate::error::{Error, Result};
use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Mutex, Ordering, RwLock};
use crate::sync::{RwLockReadGuard, RwLockWriteGuard};
use crate::tree::blob::BlobPin;
use crate::tree::KeyValue;

/// Registration slots: a scan takes one (by its thread's shard, so two threads rarely share
/// a cache line) instead of a shared lock or counter, which cost YCSB-E's short scans a few
/// percent. Past this many scans at once, the rest register under the lock.
const SLOTS: usize = 64;
/// A slot's value while its scan reads its start number: "may need every saved value".
const REGISTERING: u64 = u64::MAX;

/// One registration slot: 0 free, `REGISTERING`, or the scan's start number + 1.
#[repr(align(64))]
struct Slot(AtomicU64);

/// Where a reader is registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// A scan in this slot.
    Slot(usize),
    /// A scan registered under the lock (every slot was taken).
    Locked,
    /// A snapshot or a transaction ([`Versions::register`]); its scans share it.
    Snapshot,
}

/// A reader's start: the last write number when it started, and where it is registered.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScanStart {
    start: u64,
    place: Place,
}

impl ScanStart {
    /// The last write number when the reader started.
    pub(crate) fn seq(self) -> u64 {
        self.start
    }
}

/// The write sequence, the readers registered, and the old values they may need.
pub(crate) struct Versions {
    /// The number the last write took.
    seq: AtomicU64,
    slots: [Slot; SLOTS],
    /// Scans registered under the lock (every slot was taken).
    overflow: AtomicUsize,
    /// Snapshots and transactions registered: while any is, every write saves its undo.
    open: AtomicUsize,
    /// Whether any undo is saved (so a scan that ends knows whether to prune).
    has_saved: AtomicBool,
    state: Mutex<State>,
    /// Keeps batches and checkpoints apart when writes are not logged (module docs).
    unlogged: RwLock<()>,
    /// The most the saved values may take (`Config::max_snapshot_bytes`).
    limit: usize,
}

#[derive(Default)]
struct State {
    /// The start numbers of the scans registered here rather than in a slot.
    starts: Vec<u64>,
    /// The start numbers of the snapshots and transactions registered, with how many
    /// started at each.
    snapshots: BTreeMap<u64, usize>,
    saved: SavedValues,
    /// Readers that started before this number are too old: what they need was dropped.
    too_old_below: u64,
    /// Snapshots and transactions that started before this number are too old: a change
    /// that saves nothing for them applied since (scans, which see no single moment, go
    /// on).
    snapshots_too_old_below: u64,
    /// Readers made too old so far.
    made_too_old: u64,
}

/// A write's place in the sequence, taken without the lock (no snapshot registered).
pub(crate) struct Ticket {
    seq: u64,
    /// Whether a scan may need the write's undo.
    save: bool,
}

impl Ticket {
    /// Whether the write must save its undo.
    pub(crate) fn save_undo(&self) -> bool {
        self.save
    }
}

/// What [`Versions::record`]'s check may ask of the saved values, under the lock.
pub(crate) struct Written<'a>(&'a State);

impl Written<'_> {
    /// Whether a write numbered after `start` touched `key`.
    pub(crate) fn key_since(&self, key: &[u8], start: u64) -> bool {
        self.0.saved.written_since(key, start)
    }

    /// The first key between `lower` and `upper` that a write numbered after `start`
    /// touched.
    pub(crate) fn in_range_since(
        &self,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        start: u64,
    ) -> Option<&[u8]> {
        self.0.saved.first_written_in(lower, upper, start)
    }

    /// Whether a snapshot or transaction that started at `start` is too old.
    pub(crate) fn too_old(&self, start: u64) -> bool {
        start < self.0.too_old_below.max(self.0.snapshots_too_old_below)
    }
}

/// What [`Versions`] keeps, for `Stats`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct VersionStats {
    /// Snapshots and transactions open.
    pub(crate) open: u64,
    /// Bytes the saved old values take.
    pub(crate) bytes: u64,
    /// Readers made too old so far.
    pub(crate) too_old: u64,
}

impl Versions {
    /// An empty sequence whose saved values may take `limit` bytes.
    pub(crate) fn new(limit: usize) -> Versions {
        Versions {
            seq: AtomicU64::new(0),
            slots: std::array::from_fn(|_| Slot(AtomicU64::new(0))),
            overflow: AtomicUsize::new(0),
            open: AtomicUsize::new(0),
            has_saved: AtomicBool::new(false),
            state: Mutex::default(),
            unlogged: RwLock::default(),
            limit,
        }
    }

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
                    place: Place::Slot(slot),
                };
            }
        }
        let mut state = self.state.lock();
        self.overflow.fetch_add(1, Ordering::SeqCst);
        let start = self.seq.load(Ordering::SeqCst);
        state.starts.push(start);
        ScanStart {
            start,
            place: Place::Locked,
        }
    }

    /// Unregisters a scan (a snapshot's scans stay registered with the snapshot).
    pub(crate) fn end_scan(&self, scan: ScanStart) {
        match scan.place {
            Place::Slot(slot) => {
                self.slots[slot].0.store(0, Ordering::SeqCst);
                if self.has_saved.load(Ordering::Acquire) {
                    let mut state = self.state.lock();
                    self.prune(&mut state);
                }
            }
            Place::Locked => {
                let mut state = self.state.lock();
                if let Some(i) = state.starts.iter().position(|s| *s == scan.start) {
                    state.starts.swap_remove(i);
                }
                self.overflow.fetch_sub(1, Ordering::SeqCst);
                self.prune(&mut state);
            }
            Place::Snapshot => {}
        }
    }

    /// Registers a snapshot or a transaction: from now on every write saves what it
    /// replaces, until [`Versions::release`].
    pub(crate) fn register(&self) -> ScanStart {
        let mut state = self.state.lock();
        // Raised before the number is read: a write that misses it applied before.
        self.open.fetch_add(1, Ordering::SeqCst);
        let start = self.seq.load(Ordering::SeqCst);
        *state.snapshots.entry(start).or_default() += 1;
        ScanStart {
            start,
            place: Place::Snapshot,
        }
    }

    /// Unregisters a snapshot or a transaction.
    pub(crate) fn release(&self, snapshot: ScanStart) {
        debug_assert_eq!(snapshot.place, Place::Snapshot);
        let mut state = self.state.lock();
        if let Some(n) = state.snapshots.get_mut(&snapshot.start) {
            *n -= 1;
            if *n == 0 {
                state.snapshots.remove(&snapshot.start);
            }
        }
        self.open.fetch_sub(1, Ordering::SeqCst);
        self.prune(&mut state);
    }

    /// Whether a snapshot or a transaction is registered: then every write saves its undo
    /// and records it with [`Versions::record`]. Asked under the leaf lock of the write.
    #[inline]
    pub(crate) fn versioning(&self) -> bool {
        self.open.load(Ordering::SeqCst) > 0
    }

    /// The earliest start number of a reader that is not too old (0 while a scan is
    /// registering: it may need anything); `None` without readers.
    fn earliest_start(&self, state: &State) -> Option<u64> {
        let registering = self
            .slots
            .iter()
            .any(|s| s.0.load(Ordering::SeqCst) == REGISTERING);
        if registering {
            return Some(0);
        }
        self.registered_starts(state)
            .filter(|s| *s >= state.too_old_below)
            .min()
    }

    /// The start numbers of the readers registered (a scan still registering left out),
    /// one for each reader.
    fn registered_starts<'s>(&'s self, state: &'s State) -> impl Iterator<Item = u64> + 's {
        let slots = self
            .slots
            .iter()
            .filter_map(|s| match s.0.load(Ordering::SeqCst) {
                0 | REGISTERING => None,
                v => Some(v - 1),
            });
        let snapshots = state
            .snapshots
            .iter()
            .flat_map(|(start, n)| std::iter::repeat_n(*start, *n));
        slots.chain(state.starts.iter().copied()).chain(snapshots)
    }

    /// Numbers a write that holds the locks of every leaf it writes, while no snapshot is
    /// registered (without the lock).
    pub(crate) fn ticket(&self) -> Ticket {
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        let save = self.overflow.load(Ordering::SeqCst) > 0
            || self.slots.iter().any(|s| s.0.load(Ordering::SeqCst) != 0);
        Ticket { seq, save }
    }

    /// Saves the undo of a write numbered with [`Versions::ticket`] (before its locks are
    /// released), with the pin that keeps its old values' extents, if any.
    pub(crate) fn publish(&self, ticket: &Ticket, undo: Undo, pin: Option<BlobPin>) {
        let mut state = self.state.lock();
        state.saved.insert(ticket.seq, undo, pin);
        self.has_saved.store(true, Ordering::Release);
        self.prune(&mut state);
        if state.saved.bytes() > self.limit {
            self.make_room(&mut state);
        }
    }

    /// While versioning: runs `check` (a transaction's validation of its reads), then numbers
    /// the write and saves its `undo`, all under the lock, before the write applies. Returns
    /// the write's number, or `check`'s error (nothing numbered or saved).
    pub(crate) fn record(
        &self,
        undo: Undo,
        pin: Option<BlobPin>,
        check: impl FnOnce(&Written<'_>) -> Result<()>,
    ) -> Result<u64> {
        let mut state = self.state.lock();
        check(&Written(&state))?;
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        state.saved.insert(seq, undo, pin);
        self.has_saved.store(true, Ordering::Release);
        if state.saved.bytes() > self.limit {
            self.make_room(&mut state);
        }
        Ok(seq)
    }

    /// Makes the oldest readers too old until the saved values fit the limit. Only readers
    /// that started before the last write need anything saved.
    fn make_room(&self, state: &mut State) {
        let last = self.seq.load(Ordering::SeqCst);
        while state.saved.bytes() > self.limit {
            let Some(oldest) = self
                .registered_starts(state)
                .filter(|s| *s >= state.too_old_below && *s < last)
                .min()
            else {
                break;
            };
            state.too_old_below = oldest + 1;
            state.made_too_old += self
                .registered_starts(state)
                .filter(|s| *s == oldest)
                .count() as u64;
            self.prune(state);
        }
        // Readers all too old still make writes save: drop what nobody can use.
        self.prune(state);
    }

    /// Makes every reader registered now too old (a change that saves no undo, such as a
    /// bulk load, is about to apply): later readers see it.
    pub(crate) fn make_all_too_old(&self) {
        let mut state = self.state.lock();
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        let floor = state.too_old_below.max(state.snapshots_too_old_below);
        let older = state
            .snapshots
            .range(floor..seq)
            .map(|(_, n)| *n as u64)
            .sum::<u64>();
        state.made_too_old += older;
        state.snapshots_too_old_below = seq;
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

    /// Whether a write took a number since `scan` (a reader's start).
    #[inline]
    pub(crate) fn batched_since(&self, scan: ScanStart) -> bool {
        self.seq.load(Ordering::SeqCst) != scan.start
    }

    /// Puts back, in `items` (a leaf's records between `start` and `end`, ascending), the
    /// old values of the keys written since `scan` (a reader's start).
    ///
    /// # Errors
    /// `SnapshotTooOld` if what the reader needs was dropped (`items` unchanged).
    pub(crate) fn rewind(
        &self,
        scan: ScanStart,
        items: &mut Vec<KeyValue>,
        start: &Bound<Vec<u8>>,
        end: &Bound<Vec<u8>>,
    ) -> Result<()> {
        let state = self.state.lock();
        self.check_age(&state, scan)?;
        state.saved.rewind(scan.start, items, start, end);
        Ok(())
    }

    /// The value `key` had for the reader that started at `scan`, if a write since replaced
    /// it (`Some(old)`, `old` `None` if it was absent); `None` if none did, so the tree's
    /// value is the reader's.
    ///
    /// # Errors
    /// `SnapshotTooOld` if what the reader needs was dropped.
    pub(crate) fn before(&self, scan: ScanStart, key: &[u8]) -> Result<Option<Old>> {
        let state = self.state.lock();
        self.check_age(&state, scan)?;
        Ok(state.saved.before(key, scan.start))
    }

    /// `SnapshotTooOld` if the reader that started at `scan` is too old.
    fn check_age(&self, state: &State, scan: ScanStart) -> Result<()> {
        let floor = match scan.place {
            Place::Snapshot => state.too_old_below.max(state.snapshots_too_old_below),
            Place::Slot(_) | Place::Locked => state.too_old_below,
        };
        if scan.start < floor {
            return Err(Error::SnapshotTooOld {
                limit: self.limit as u64,
            });
        }
        Ok(())
    }

    /// Drops the undo no reader needs: that of writes numbered at or before the earliest
    /// start of a reader that is not too old.
    fn prune(&self, state: &mut State) {
        if state.saved.is_empty() {
            return;
        }
        match self.earliest_start(state) {
            Some(first) => state.saved.prune(first),
            None => state.saved.clear(),
        }
        if state.saved.is_empty() {
            self.has_saved.store(false, Ordering::Release);
        }
    }

    /// What is kept, for `Stats`.
    pub(crate) fn stats(&self) -> VersionStats {
        let state = self.state.lock();
        VersionStats {
            open: self.open.load(Ordering::Relaxed) as u64,
            bytes: state.saved.bytes() as u64,
            too_old: state.made_too_old,
        }
    }

    /// Saved writes (those no reader needs dropped): for tests.
    #[cfg(all(test, not(shuttle)))]
    pub(crate) fn saved(&self) -> usize {
        self.state.lock().saved.writes()
    }
}

#[cfg(all(test, not(shuttle)))]
#[path = "store_tests.rs"]
mod tests;
