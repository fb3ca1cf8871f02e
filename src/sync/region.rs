//! An append region: a ring of shared memory that concurrent writers fill front to back
//! without a lock, and one drainer empties behind them. A writer reserves a range with one
//! compare-and-swap on the cursor and gets it as `&mut [u8]`, disjoint from every other
//! writer's; once its bytes are in, it publishes the range through a second counter,
//! `done`, that only moves over ranges whose bytes are all written. The drainer takes the
//! published bytes between the `floor` and `done`, and moving the floor past them frees
//! their room for new reservations. The write-ahead log stages `Buffered` records in one
//! (`wal::ring`), so such an append takes no lock and no system call.
//!
//! Positions are not offsets into the ring but numbers on the caller's scale (the log's
//! LSNs), growing forever: position `p` is byte `p mod capacity` of the ring. The ring is
//! mapped twice in a row (`RingMap`), so every range is one slice even where it wraps.
//!
//! `done` moves in order: a writer publishes only when `done` equals the start of its
//! range, so everything below `done` is written. Each range has one owner, so the move is a
//! load and a store, not a read-modify-write: a whole reservation costs one atomic
//! instruction.

use super::ringmap::RingMap;
use super::{AtomicU64, Mutex, Ordering};

/// Cursor flag: no more reservations (the region is being restarted).
const SEALED: u64 = 1 << 63;

/// A publish that moves `done` across a multiple of this many positions also stores it
/// into the mapping's published word (`RingMap::published_word`), which outlives the
/// process: recovery then knows, within this many bytes, which records were published
/// (whose `append` returned) and must be whole. One store per 4 KiB of records, on a line
/// of its own: nothing measurable beside the store into `done` every publish makes.
const PUBLISHED_STEP_BITS: u32 = 12;

/// How far past a new reservation `reserve` prefetches for writing. The ring's memory was
/// last touched a lap ago, so each new cache line a writer stores into would otherwise miss
/// all the way to memory, and the next atomic instruction (the leaf latch's release) waits
/// for that store to land. A few records ahead, the prefetch has landed by the time the
/// writers get there.
const PREFETCH_AHEAD: u64 = 512;

/// The two counters every writer touches, on one cache line of their own: after the
/// reservation's compare-and-swap a writer owns the line, and its publish a few
/// nanoseconds later usually finds it still there.
#[repr(align(128))]
#[derive(Debug)]
struct Counters {
    /// The next free position, with `SEALED` once sealed.
    cursor: AtomicU64,
    /// Every position below this is written.
    done: AtomicU64,
    /// Slots published. Written only by the publisher that moves `done`, and publishers
    /// take turns in position order through `done` itself, so a load and a store suffice.
    published: AtomicU64,
}

/// A ring filled front to back by concurrent writers and emptied by one drainer (module
/// docs). `Send + Sync`.
#[derive(Debug)]
pub(crate) struct AppendRegion {
    counters: Counters,
    /// Positions below this are drained: their bytes may be overwritten. Reservations end
    /// at most one capacity past it.
    floor: AtomicU64,
    /// Held while draining, so one drainer at a time reads and frees published bytes.
    drain: Mutex<()>,
    /// The ring's first byte; `2 * capacity` bytes from it are mapped (`RingMap`).
    ptr: *mut u8,
    /// Bytes in the ring: a power of two.
    capacity: u64,
    /// Owns the memory `ptr` points into, and the published word.
    map: RingMap,
}

// SAFETY: the raw pointer is into `map`, which lives exactly as long as the region. Bytes
// are only reached through `reserve`, which hands each range to one caller (the cursor only
// moves forward, by compare-and-swap, and never more than a capacity past the floor), and
// through `drain`, which reads only published bytes no reservation can reach until the
// floor moves past them; so sharing the region between threads shares no bytes being
// written. The counters are atomics.
unsafe impl Send for AppendRegion {}
// SAFETY: as for `Send`: every `&self` method either touches atomics, the range its caller
// reserved alone, or (draining, under the drain lock) bytes nobody writes.
unsafe impl Sync for AppendRegion {}

/// A reserved range: its bytes, to fill, and its bounds, to publish.
#[derive(Debug)]
pub(crate) struct Slot<'a> {
    /// The range's bytes, this caller's alone.
    pub(crate) bytes: &'a mut [u8],
    /// Position of the first byte.
    pub(crate) start: u64,
    /// Position after the last byte.
    pub(crate) end: u64,
}

impl AppendRegion {
    /// A region over `map` whose next free position is `start` (nothing is published, and
    /// nothing below `start` is waiting to be drained).
    pub(crate) fn new(map: RingMap, start: u64) -> AppendRegion {
        if let Some(word) = map.published_word() {
            word.store(start, std::sync::atomic::Ordering::Release);
        }
        AppendRegion {
            counters: Counters {
                cursor: AtomicU64::new(start),
                done: AtomicU64::new(start),
                published: AtomicU64::new(0),
            },
            floor: AtomicU64::new(start),
            drain: Mutex::new(()),
            ptr: map.ptr(),
            capacity: map.capacity() as u64,
            map,
        }
    }

    /// Bytes in the ring: the most one reservation can take.
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Reserves the next `len` bytes; `None` if they do not fit before the floor comes
    /// round again (drain, then retry) or the region is being restarted.
    pub(crate) fn reserve(&self, len: u64) -> Option<Slot<'_>> {
        let cursor = &self.counters.cursor;
        let mut cur = cursor.load(Ordering::Relaxed);
        loop {
            if cur & SEALED != 0 {
                return None;
            }
            // Acquire: the drainer read the bytes below the floor before it moved it.
            let limit = self.floor.load(Ordering::Acquire) + self.capacity;
            let end = cur.checked_add(len).filter(|&e| e <= limit)?;
            // Relaxed: the range is this caller's alone whatever others do; what it writes
            // is published through `done`.
            match cursor.compare_exchange_weak(cur, end, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    let n = usize::try_from(len).ok()?;
                    // SAFETY: the range starts inside the first copy of the ring and is at
                    // most a capacity long (the floor is at or below `cur`), so it lies in
                    // the `2 * capacity` mapped bytes; the mapping lives as long as `self`,
                    // which the slot borrows. The compare-and-swap gave positions
                    // `cur..end` to this caller alone, and they are within one capacity past
                    // the floor, so no other slot and no drained range maps to these bytes
                    // until the floor moves past `end`, which needs this slot published.
                    let bytes = unsafe { std::slice::from_raw_parts_mut(self.at(cur), n) };
                    self.prefetch(end + PREFETCH_AHEAD);
                    return Some(Slot {
                        bytes,
                        start: cur,
                        end,
                    });
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Address of position `pos` in the first copy of the ring.
    fn at(&self, pos: u64) -> *mut u8 {
        // SAFETY: the offset is below the capacity, inside the mapping.
        unsafe { self.ptr.add((pos & (self.capacity - 1)) as usize) }
    }

    /// Publishes the range `start..end` of a filled slot if everything before it is
    /// published; returns whether `done` is now at or past `end`. A caller that gets `false`
    /// calls again (an earlier writer is still filling its slot).
    pub(crate) fn publish(&self, start: u64, end: u64) -> bool {
        let done = &self.counters.done;
        let now = done.load(Ordering::Acquire);
        if now == start {
            // Only the owner of the range starting at `done` moves it: plain stores.
            let published = &self.counters.published;
            published.store(published.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            done.store(end, Ordering::Release);
            if (start ^ end) >> PUBLISHED_STEP_BITS != 0 {
                self.mark_published(end);
            }
            return true;
        }
        now >= end
    }

    /// Stores `end` into the mapping's published word: every record below it is
    /// published. Publishers take turns in position order, so the word only grows.
    fn mark_published(&self, end: u64) {
        if let Some(word) = self.map.published_word() {
            // Release: the records' bytes are stored before the word says so (after the
            // process dies, everything it stored is in the page cache anyway).
            word.store(end, std::sync::atomic::Ordering::Release);
        }
    }

    /// Slots published so far.
    pub(crate) fn published(&self) -> u64 {
        // Acquire on `done` first: the count stored before the `done` it read is visible.
        let _ = self.done();
        self.counters.published.load(Ordering::Relaxed)
    }

    /// Prefetches the cache line of position `pos` for writing.
    fn prefetch(&self, pos: u64) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch is a hint: it reads or writes nothing and cannot fault, and
        // the address is inside the mapping anyway.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0};
            _mm_prefetch::<_MM_HINT_ET0>(self.at(pos).cast::<i8>());
        }
    }

    /// Every position below this is written (its slot was filled and published).
    pub(crate) fn done(&self) -> u64 {
        self.counters.done.load(Ordering::Acquire)
    }

    /// The next free position.
    pub(crate) fn cursor(&self) -> u64 {
        self.counters.cursor.load(Ordering::Acquire) & !SEALED
    }

    /// Positions below this are drained.
    pub(crate) fn floor(&self) -> u64 {
        self.floor.load(Ordering::Acquire)
    }

    /// Hands the published bytes not drained yet to `take`, with the position of the first;
    /// `take` returns how many of them it consumed (from the front), and the floor moves
    /// past those, freeing their room. One drainer at a time: others wait here.
    pub(crate) fn drain<E>(
        &self,
        take: impl FnOnce(u64, &[u8]) -> Result<usize, E>,
    ) -> Result<usize, E> {
        let _one = self.drain.lock();
        let floor = self.floor.load(Ordering::Relaxed);
        let done = self.done();
        let len = usize::try_from(done - floor).unwrap_or(0);
        // SAFETY: positions `floor..done` are published, so every slot over them is
        // finished and its writer holds no reference any more; no new slot reaches them
        // before the floor moves, which only this drainer does (under the drain lock), after
        // `take` returns. They are at most a capacity long (the cursor never passes the
        // floor by more), so they lie in the mapping, which `self` keeps alive.
        let bytes = unsafe { std::slice::from_raw_parts(self.at(floor), len) };
        let taken = take(floor, bytes)?.min(len);
        self.floor.store(floor + taken as u64, Ordering::Release);
        Ok(taken)
    }

    /// Restarts the region at position `pos`: waits for the slots reserved so far to be
    /// published, then drops everything not drained and makes `pos` the cursor, `done` and
    /// the floor. Reservations meanwhile fail (their callers retry).
    pub(crate) fn restart(&self, pos: u64) {
        let _one = self.drain.lock();
        let sealed = self.counters.cursor.fetch_or(SEALED, Ordering::AcqRel) & !SEALED;
        while self.done() < sealed {
            super::yield_now();
        }
        self.floor.store(pos, Ordering::Release);
        self.counters.done.store(pos, Ordering::Release);
        self.mark_published(pos);
        self.counters.cursor.store(pos, Ordering::Release);
    }
}

/// A ring of `capacity` bytes over a fresh temporary file, for tests.
#[cfg(all(test, target_os = "linux"))]
pub(crate) fn test_ring(capacity: usize) -> RingMap {
    let file = tempfile::tempfile().expect("temporary file");
    file.set_len(capacity as u64).expect("size");
    RingMap::new(&file, 0, capacity).expect("ring")
}

#[cfg(all(test, not(shuttle), target_os = "linux"))]
mod tests {
    use super::*;
    use crate::sync::{thread, Arc};

    /// Drains everything published; returns its first position and its bytes.
    fn drain_all(r: &AppendRegion) -> (u64, Vec<u8>) {
        let mut got = (0, Vec::new());
        r.drain(|at, b| {
            got = (at, b.to_vec());
            Ok::<_, ()>(b.len())
        })
        .expect("drain");
        got
    }

    #[test]
    fn reserves_up_to_a_lap_past_the_floor_and_publishes_in_order() {
        let r = AppendRegion::new(test_ring(4096), 1000);
        assert_eq!(
            (r.cursor(), r.done(), r.floor(), r.capacity()),
            (1000, 1000, 1000, 4096)
        );
        let a = r.reserve(100).expect("room");
        assert_eq!((a.start, a.end, a.bytes.len()), (1000, 1100, 100));
        a.bytes.fill(7);
        let b = r.reserve(4096 - 100).expect("room");
        assert_eq!(b.end, 5096);
        b.bytes.fill(8);
        assert!(r.reserve(1).is_none(), "reserved over bytes not drained");
        // Published out of order: `done` waits for the earlier slot.
        assert!(!r.publish(b.start, b.end));
        assert_eq!(r.done(), 1000);
        assert!(r.publish(a.start, a.end));
        assert!(r.publish(b.start, b.end));
        assert_eq!(r.done(), 5096);
        assert!(r.publish(a.start, a.end), "publishing twice is harmless");
        assert_eq!(r.published(), 2);
        // Draining part of it frees just that much room.
        let taken = r
            .drain(|at, bytes| {
                assert_eq!((at, bytes.len()), (1000, 4096));
                assert!(bytes[..100].iter().all(|&x| x == 7));
                assert!(bytes[100..].iter().all(|&x| x == 8));
                Ok::<_, ()>(150)
            })
            .expect("drain");
        assert_eq!((taken, r.floor()), (150, 1150));
        assert!(r.reserve(151).is_none());
        let c = r.reserve(150).expect("room after the drain");
        assert_eq!((c.start, c.end), (5096, 5246));
        // A failed drain frees nothing.
        assert_eq!(r.drain(|_, _| Err::<usize, _>("no")), Err("no"));
        assert_eq!(r.floor(), 1150);
    }

    #[test]
    fn a_slot_that_wraps_is_one_slice_and_drains_whole() {
        let r = AppendRegion::new(test_ring(4096), 4000);
        let s = r.reserve(200).expect("room");
        s.bytes
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8);
        assert!(r.publish(s.start, s.end));
        let (at, bytes) = drain_all(&r);
        assert_eq!(at, 4000);
        assert!(bytes.iter().enumerate().all(|(i, &b)| b == i as u8));
        assert_eq!(r.floor(), 4200);
    }

    #[test]
    fn restart_waits_for_slots_and_moves_every_counter() {
        let r = Arc::new(AppendRegion::new(test_ring(4096), 0));
        let s = r.reserve(10).expect("room");
        let (start, end) = (s.start, s.end);
        let restarter = {
            let r = r.clone();
            thread::spawn(move || r.restart(1 << 40))
        };
        // The restart is waiting for this slot; reservations fail meanwhile.
        while r.counters.cursor.load(Ordering::Acquire) & SEALED == 0 {
            thread::yield_now();
        }
        assert!(r.reserve(1).is_none(), "reserved during a restart");
        assert!(r.publish(start, end));
        restarter.join().expect("restart");
        assert_eq!(
            (r.cursor(), r.done(), r.floor()),
            (1 << 40, 1 << 40, 1 << 40)
        );
        assert_eq!(r.reserve(5).expect("room").start, 1 << 40);
    }

    #[test]
    fn concurrent_writers_and_a_drainer_see_every_range_once_in_order() {
        let r = Arc::new(AppendRegion::new(test_ring(8192), 0));
        let stop = Arc::new(crate::sync::AtomicBool::new(false));
        let writers: Vec<_> = (1..=3u8)
            .map(|t| {
                let r = r.clone();
                thread::spawn(move || {
                    for _ in 0..3000 {
                        let len = u64::from(t) * 7;
                        let s = loop {
                            if let Some(s) = r.reserve(len) {
                                break s;
                            }
                            // Full: the drainer frees room.
                            thread::yield_now();
                        };
                        // A range: its writer, then its start position's low byte.
                        s.bytes.fill(t);
                        s.bytes[1] = s.start as u8;
                        let (start, end) = (s.start, s.end);
                        while !r.publish(start, end) {
                            // An earlier writer may be preempted (4 threads, 2 cores).
                            thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let drainer = {
            let (r, stop) = (r.clone(), stop.clone());
            thread::spawn(move || {
                let mut all = Vec::new();
                let mut next = 0u64;
                loop {
                    let finished = stop.load(Ordering::Acquire);
                    r.drain(|at, bytes| {
                        assert_eq!(at, next, "drained ranges are contiguous");
                        next += bytes.len() as u64;
                        all.extend_from_slice(bytes);
                        Ok::<_, ()>(bytes.len())
                    })
                    .expect("drain");
                    if finished {
                        return all;
                    }
                    thread::yield_now();
                }
            })
        };
        for w in writers {
            w.join().expect("writer");
        }
        stop.store(true, Ordering::Release);
        let all = drainer.join().expect("drainer");
        assert_eq!(all.len() as u64, r.cursor());
        assert_eq!(all.len(), 3000 * (7 + 14 + 21));
        assert_eq!(r.published(), 9000);
        // Each range whole, in place: its writer's byte, its own start.
        let mut at = 0;
        while at < all.len() {
            let t = all[at];
            assert!((1..=3).contains(&t), "byte {at} was never written");
            let len = usize::from(t) * 7;
            assert_eq!(all[at + 1], at as u8, "range at {at} is not its own");
            assert!(
                all[at + 2..at + len].iter().all(|&b| b == t),
                "torn range at {at}"
            );
            at += len;
        }
    }
}

#[cfg(all(test, shuttle))]
mod shuttle_tests {
    use super::*;
    use crate::sync::{thread, Arc};

    /// Two writers reserve, fill and publish in a ring one and a half records long while a
    /// third thread drains. Whatever the interleaving: the drained bytes are exactly the
    /// writers' ranges, contiguous and each whole (a slot never overlaps bytes not drained
    /// yet, and `done` never passes a range before it is published).
    #[test]
    fn shuttle_writers_and_a_drainer_never_overlap() {
        let page = crate::sys::page_size();
        shuttle::check_random(
            move || {
                let r = Arc::new(AppendRegion::new(test_ring(page), 100));
                let rec = page as u64 * 2 / 3;
                let writers: Vec<_> = (1..=2u8)
                    .map(|t| {
                        let r = r.clone();
                        thread::spawn(move || {
                            for _ in 0..2 {
                                let s = loop {
                                    if let Some(s) = r.reserve(rec) {
                                        break s;
                                    }
                                    thread::yield_now();
                                };
                                s.bytes.fill(t);
                                let (start, end) = (s.start, s.end);
                                assert!(r.done() <= start, "done passed an unpublished range");
                                while !r.publish(start, end) {
                                    thread::yield_now();
                                }
                            }
                        })
                    })
                    .collect();
                let mut drained = Vec::new();
                let mut next = 100;
                while drained.len() < 4 * rec as usize {
                    r.drain(|at, bytes| {
                        assert_eq!(at, next);
                        next += bytes.len() as u64;
                        drained.extend_from_slice(bytes);
                        Ok::<_, ()>(bytes.len())
                    })
                    .expect("drain");
                    thread::yield_now();
                }
                for w in writers {
                    w.join().expect("writer");
                }
                for (i, range) in drained.chunks(rec as usize).enumerate() {
                    assert!(
                        range.iter().all(|&b| b == range[0]) && range[0] != 0,
                        "range {i} torn or unwritten"
                    );
                }
            },
            1000,
        );
    }
}
