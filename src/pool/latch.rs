//! The mapping-table word: a 48-bit location and a 16-bit reader/writer lock in one
//! `AtomicU64` (paper §3.3), so one atomic both finds and locks a leaf.
//!
//! Bits 0..14 count readers, bit 14 says someone is parked on the word, bit 15 is the writer
//! bit, bits 16..64 hold the location: a 2-bit tag (vacant / disk page / block) over a 46-bit
//! payload. A vacant word (a removed or never used id) is all zero. Waiting is a bounded spin,
//! then `parking_lot_core` parking keyed by the word's address (a yield loop under shuttle).

use super::{BlockAddr, Location};
use crate::sync::{AtomicU64, Ordering};

const READERS: u64 = (1 << 14) - 1;
const PARKED: u64 = 1 << 14;
const WRITER: u64 = 1 << 15;
const HOLDERS: u64 = READERS | WRITER;
const LOCK_BITS: u64 = 0xFFFF;
const LOC_SHIFT: u32 = 16;
const PAYLOAD: u64 = (1 << 46) - 1;
const TAG_DISK: u64 = 1 << 46;
const TAG_MINI: u64 = 2 << 46;
/// Spins before parking: long enough to cover a short critical section (a mini-page
/// search), short enough not to burn a core behind an eviction's disk write.
const SPIN_LIMIT: u32 = 100;

/// Largest disk page number a mapping entry can hold (46 bits: 256 PiB of 4 KiB pages).
pub(crate) const MAX_DISK_PAGE: u64 = PAYLOAD;
/// What `location()` reports for a removed (vacant) entry: never a real page number.
pub(crate) const REMOVED_PAGE: u64 = u64::MAX;

/// The 48-bit field for `loc`. Panics on a disk page above [`MAX_DISK_PAGE`]: the page store
/// never hands such numbers out, and loaded tables are validated before they get here.
pub(super) fn encode(loc: Location) -> u64 {
    match loc {
        Location::Disk(REMOVED_PAGE) => 0,
        Location::Disk(page) => {
            assert!(
                page <= MAX_DISK_PAGE,
                "disk page {page} does not fit a mapping entry"
            );
            TAG_DISK | page
        }
        Location::Mini(addr) => TAG_MINI | (addr.0 & PAYLOAD),
    }
}

/// The location held in word `w`.
pub(super) fn decode(w: u64) -> Location {
    let field = w >> LOC_SHIFT;
    match field & !PAYLOAD {
        TAG_MINI => Location::Mini(BlockAddr(field & PAYLOAD)),
        TAG_DISK => Location::Disk(field & PAYLOAD),
        _ => Location::Disk(REMOVED_PAGE),
    }
}

/// Replaces the location in a word whose lock the caller holds for writing.
pub(super) fn set_location(word: &AtomicU64, loc: Location) {
    let field = encode(loc) << LOC_SHIFT;
    update(word, Ordering::Relaxed, |w| (w & LOCK_BITS) | field);
}

/// Takes a read lock, waiting as long as a writer holds it.
pub(super) fn lock_shared(word: &AtomicU64) {
    acquire(word, |w| {
        (w & WRITER == 0 && w & READERS < READERS).then_some(w + 1)
    });
}

/// Takes the write lock, waiting for every holder to leave.
pub(super) fn lock_exclusive(word: &AtomicU64) {
    acquire(word, |w| (w & HOLDERS == 0).then_some(w | WRITER));
}

/// One attempt at the write lock.
pub(super) fn try_lock_exclusive(word: &AtomicU64) -> bool {
    let mut cur = word.load(Ordering::Relaxed);
    while cur & HOLDERS == 0 {
        match word.compare_exchange_weak(cur, cur | WRITER, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(now) => cur = now,
        }
    }
    false
}

/// Read lock to write lock, only when the caller is the sole reader.
pub(super) fn try_upgrade(word: &AtomicU64) -> bool {
    let mut cur = word.load(Ordering::Relaxed);
    while cur & HOLDERS == 1 {
        let next = (cur - 1) | WRITER;
        match word.compare_exchange_weak(cur, next, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(now) => cur = now,
        }
    }
    false
}

/// Write lock to read lock, atomically (no writer can slip in between).
#[allow(dead_code)] // used by unit tests and the internals harness
pub(super) fn downgrade(word: &AtomicU64) {
    let old = update(word, Ordering::Release, |w| (w & !WRITER) + 1);
    if old & PARKED != 0 {
        wake(word);
    }
}

/// Releases a read lock.
pub(super) fn unlock_shared(word: &AtomicU64) {
    let old = word.fetch_sub(1, Ordering::Release);
    if old & PARKED != 0 && (old - 1) & HOLDERS == 0 {
        wake(word);
    }
}

/// Releases the write lock.
pub(super) fn unlock_exclusive(word: &AtomicU64) {
    let old = word.fetch_and(!WRITER, Ordering::Release);
    if old & PARKED != 0 {
        wake(word);
    }
}

/// Applies `f` atomically, returning the previous word.
fn update(word: &AtomicU64, order: Ordering, f: impl Fn(u64) -> u64) -> u64 {
    let mut cur = word.load(Ordering::Relaxed);
    loop {
        match word.compare_exchange_weak(cur, f(cur), order, Ordering::Relaxed) {
            Ok(old) => return old,
            Err(now) => cur = now,
        }
    }
}

/// Acquires with `next` (the locked word from the current one, or `None` if it must wait).
fn acquire(word: &AtomicU64, next: impl Fn(u64) -> Option<u64>) {
    let mut spins = 0;
    let mut cur = word.load(Ordering::Relaxed);
    loop {
        if let Some(locked) = next(cur) {
            match word.compare_exchange_weak(cur, locked, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => {
                    cur = now;
                    continue;
                }
            }
        }
        if spins < SPIN_LIMIT {
            spins += 1;
            crate::sync::spin_hint();
        } else {
            park(word, cur, &next);
            spins = 0;
        }
        cur = word.load(Ordering::Relaxed);
    }
}

/// Sleeps until the word's holders change (a releaser sees `PARKED` and wakes everyone).
#[cfg(not(shuttle))]
fn park(word: &AtomicU64, cur: u64, next: &impl Fn(u64) -> Option<u64>) {
    if cur & PARKED == 0
        && word
            .compare_exchange(cur, cur | PARKED, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    let key = std::ptr::from_ref::<AtomicU64>(word) as usize;
    let validate = || {
        let w = word.load(Ordering::Relaxed);
        w & PARKED != 0 && next(w).is_none()
    };
    // SAFETY: `validate` and the other callbacks only read the word; none of them calls back
    // into parking_lot_core, which is the contract of `park`.
    unsafe {
        parking_lot_core::park(
            key,
            validate,
            || {},
            |_, _| {},
            parking_lot_core::DEFAULT_PARK_TOKEN,
            None,
        );
    }
}

/// Under shuttle a blocked thread yields, so the scheduler can run the holder.
#[cfg(shuttle)]
fn park(_word: &AtomicU64, _cur: u64, _next: &impl Fn(u64) -> Option<u64>) {
    crate::sync::yield_now();
}

/// Clears `PARKED` and wakes every thread parked on the word; they retry and re-park.
fn wake(word: &AtomicU64) {
    word.fetch_and(!PARKED, Ordering::Relaxed);
    #[cfg(not(shuttle))]
    // SAFETY: unparking with a plain token; no callback runs inside parking_lot_core.
    unsafe {
        parking_lot_core::unpark_all(
            std::ptr::from_ref::<AtomicU64>(word) as usize,
            parking_lot_core::DEFAULT_UNPARK_TOKEN,
        );
    }
}

#[cfg(all(test, not(shuttle)))]
mod tests {
    use super::*;

    #[test]
    fn location_round_trips() {
        for loc in [
            Location::Disk(0),
            Location::Disk(MAX_DISK_PAGE),
            Location::Disk(REMOVED_PAGE),
            Location::Mini(BlockAddr(0)),
            Location::Mini(BlockAddr(PAYLOAD)),
        ] {
            let w = (encode(loc) << LOC_SHIFT) | 3;
            assert_eq!(decode(w), loc);
        }
        assert_eq!(decode(0), Location::Disk(REMOVED_PAGE));
    }

    #[test]
    fn readers_share_writers_exclude() {
        let w = AtomicU64::new(encode(Location::Disk(9)) << LOC_SHIFT);
        lock_shared(&w);
        lock_shared(&w);
        assert!(!try_lock_exclusive(&w));
        assert!(!try_upgrade(&w), "two readers: no upgrade");
        unlock_shared(&w);
        assert!(try_upgrade(&w));
        assert!(!try_lock_exclusive(&w));
        set_location(&w, Location::Disk(5));
        downgrade(&w);
        assert!(!try_lock_exclusive(&w));
        unlock_shared(&w);
        assert!(try_lock_exclusive(&w));
        unlock_exclusive(&w);
        assert_eq!(w.load(Ordering::Relaxed) & LOCK_BITS, 0);
        assert_eq!(decode(w.load(Ordering::Relaxed)), Location::Disk(5));
    }
}
