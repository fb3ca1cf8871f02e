//! An append region: a shared writable mapping that concurrent writers fill front to back
//! without a lock. A writer reserves a range with one compare-and-swap on the cursor and
//! gets it as `&mut [u8]`, disjoint from every other writer's; once its bytes are in, it
//! publishes the range through a second counter, `done`, that only moves over ranges whose
//! bytes are all written. The write-ahead log keeps its active segment in one, so a
//! `Buffered` append takes no lock and no system call (`wal::log`).
//!
//! Positions are not offsets into the mapping but numbers on the caller's scale (the log's
//! LSNs): the region covers positions `base .. base + mapping length`, position `p` is byte
//! `p - base` of the mapping, and the cursor starts wherever the caller says the free part
//! begins.
//!
//! `done` moves in order: a writer publishes only when `done` equals the start of its
//! range, so everything below `done` is written. Each range has one owner, so the move is a
//! load and a store, not a read-modify-write: a whole reservation costs one atomic
//! instruction.

use memmap2::{Advice, MmapMut, UncheckedAdvice};

use super::{AtomicU64, Ordering};

/// Cursor flag: no more reservations (the region is full and being replaced).
const SEALED: u64 = 1 << 63;

/// How far past a new reservation `reserve` prefetches for writing. The region's memory is
/// fresh page cache nobody has touched since it was zeroed, so each new cache line a writer
/// stores into would otherwise miss all the way to memory, and the next atomic instruction
/// (the leaf latch's release) waits for that store to land. A few records ahead, the
/// prefetch has landed by the time the writers get there.
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

/// A mapping filled front to back by concurrent writers (module docs). `Send + Sync`.
#[derive(Debug)]
pub(crate) struct AppendRegion {
    counters: Counters,
    /// Position of the mapping's first byte.
    base: u64,
    /// The mapping's first byte.
    ptr: *mut u8,
    /// Bytes mapped.
    len: u64,
    /// Mapped bytes below this offset were dropped from the page tables (`release_below`).
    released: AtomicU64,
    /// Mapped bytes below this offset were prefaulted (`prefault`).
    prefaulted: AtomicU64,
    /// Owns the mapping `ptr` points into.
    map: MmapMut,
}

// SAFETY: the raw pointer is into `map`, which lives exactly as long as the region. Bytes
// are only reached through `reserve`, which hands each range to one caller (the cursor only
// moves forward, by compare-and-swap), so sharing the region between threads shares no
// bytes; the counters are atomics.
unsafe impl Send for AppendRegion {}
// SAFETY: as for `Send`: every `&self` method either touches atomics or the range its caller
// reserved alone.
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
    /// A region over `map` whose first byte is position `base`; positions below `start`
    /// hold data already (they count as written), the rest is free.
    pub(crate) fn new(mut map: MmapMut, base: u64, start: u64) -> AppendRegion {
        let len = map.len() as u64;
        let start = start.clamp(base, base + len);
        AppendRegion {
            counters: Counters {
                cursor: AtomicU64::new(start),
                done: AtomicU64::new(start),
                published: AtomicU64::new(0),
            },
            base,
            ptr: map.as_mut_ptr(),
            len,
            released: AtomicU64::new(0),
            prefaulted: AtomicU64::new(0),
            map,
        }
    }

    /// Position after the mapping's last byte.
    pub(crate) fn limit(&self) -> u64 {
        self.base + self.len
    }

    /// Reserves the next `len` bytes; `None` if the region is sealed or they do not fit.
    pub(crate) fn reserve(&self, len: u64) -> Option<Slot<'_>> {
        let cursor = &self.counters.cursor;
        let mut cur = cursor.load(Ordering::Relaxed);
        loop {
            if cur & SEALED != 0 {
                return None;
            }
            let end = cur.checked_add(len).filter(|&e| e <= self.limit())?;
            // Relaxed: the range is this caller's alone whatever others do; what it writes
            // is published through `done`.
            match cursor.compare_exchange_weak(cur, end, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    let from = usize::try_from(cur - self.base).ok()?;
                    let n = usize::try_from(len).ok()?;
                    // SAFETY: `cur - base .. end - base` lies inside the mapping (`end` is at
                    // most `limit`, `cur` at least `base`: the cursor starts at or above it
                    // and only grows), the mapping lives as long as `self`, which the slot
                    // borrows, and the compare-and-swap gave this range to this caller
                    // alone: no other slot overlaps it, ever.
                    let bytes = unsafe { std::slice::from_raw_parts_mut(self.ptr.add(from), n) };
                    self.prefetch(end - self.base + PREFETCH_AHEAD);
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
            return true;
        }
        now >= end
    }

    /// Slots published so far.
    pub(crate) fn published(&self) -> u64 {
        // Acquire on `done` first: the count stored before the `done` it read is visible.
        let _ = self.done();
        self.counters.published.load(Ordering::Relaxed)
    }

    /// Prefetches the cache line at byte `offset` of the mapping for writing, if it is in
    /// the mapping.
    fn prefetch(&self, offset: u64) {
        if offset >= self.len {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch is a hint: it reads or writes nothing and cannot fault, and
        // the address is inside the mapping anyway.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0};
            _mm_prefetch::<_MM_HINT_ET0>(self.ptr.add(offset as usize).cast::<i8>());
        }
    }

    /// Every position below this is written (its slot was filled and published).
    pub(crate) fn done(&self) -> u64 {
        self.counters.done.load(Ordering::Acquire)
    }

    /// The next free position (where the cursor stopped, if sealed).
    pub(crate) fn cursor(&self) -> u64 {
        self.counters.cursor.load(Ordering::Acquire) & !SEALED
    }

    /// Stops all further reservations; returns the final cursor. Slots reserved before keep
    /// filling and publishing: `done` reaches the returned position once they all have.
    pub(crate) fn seal(&self) -> u64 {
        self.counters.cursor.fetch_or(SEALED, Ordering::AcqRel) & !SEALED
    }

    /// Maps the pages of positions `from..to` (those not mapped by an earlier call) the way a
    /// read would: each page is found or created in the page cache and mapped read-only. A
    /// writer reaching such a page then takes only a light write-enable fault; without it,
    /// the writer's fault creates the page too, sleeping on the page lock while it does (a
    /// major fault per 4 KiB of log, and at two writers one of them sleeps on the other's).
    /// Advice only: on failure the writers fault the pages in themselves.
    pub(crate) fn prefault(&self, from: u64, to: u64) {
        let page = page_size();
        let (lo, hi) = (self.offset(from) / page * page, self.offset(to));
        self.advise_once(&self.prefaulted, lo, hi, |map, at, len| {
            map.advise_range(Advice::PopulateRead, at, len)
        });
    }

    /// Drops the whole pages below position `below` from this process's page tables (the
    /// data stays in the file's page cache, dirty until written back). Writing back a page
    /// that is still mapped write-protects it, which interrupts every core running this
    /// process for a TLB flush, page by page; pages released first cost one flush for the
    /// whole range. Meant for positions every writer is done with, though a later store
    /// there would only fault the page back in.
    pub(crate) fn release_below(&self, below: u64) {
        let page = page_size();
        let to = self.offset(below) / page * page;
        self.advise_once(&self.released, 0, to, |map, at, len| {
            // SAFETY: for a shared file mapping, MADV_DONTNEED only unmaps the pages: their
            // contents stay in the page cache (dirty pages stay dirty) and the next access
            // maps them again, so no byte a slot holds or a reader sees changes. An
            // anonymous mapping (tests) would lose its bytes, which is why `new` is only
            // given file mappings outside tests of this file.
            unsafe { map.unchecked_advise_range(UncheckedAdvice::DontNeed, at, len) }
        });
    }

    /// Byte offset in the mapping of position `pos`, clamped to the mapping.
    fn offset(&self, pos: u64) -> u64 {
        pos.saturating_sub(self.base).min(self.len)
    }

    /// Applies `advise` to the mapped bytes `from..to`, less those below `mark` (done by an
    /// earlier call), and moves `mark` to `to` if it worked.
    fn advise_once(
        &self,
        mark: &AtomicU64,
        from: u64,
        to: u64,
        advise: impl FnOnce(&MmapMut, usize, usize) -> std::io::Result<()>,
    ) {
        let from = from.max(mark.load(Ordering::Relaxed));
        if to <= from {
            return;
        }
        if advise(&self.map, from as usize, (to - from) as usize).is_ok() {
            mark.fetch_max(to, Ordering::Relaxed);
        }
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
impl AppendRegion {
    /// The whole mapping; `&mut self` proves no slot is alive.
    fn filled(&mut self) -> &[u8] {
        &self.map[..]
    }
}

/// The system's page size.
fn page_size() -> u64 {
    // SAFETY: sysconf only reads a constant of the system.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;
    use crate::sync::{thread, Arc};

    fn region(len: usize, base: u64, start: u64) -> AppendRegion {
        AppendRegion::new(MmapMut::map_anon(len).expect("anonymous map"), base, start)
    }

    #[test]
    fn reserves_front_to_back_and_refuses_past_the_end_or_once_sealed() {
        let r = region(4096, 1000, 1064);
        assert_eq!((r.cursor(), r.done(), r.limit()), (1064, 1064, 5096));
        let a = r.reserve(100).expect("room");
        assert_eq!((a.start, a.end, a.bytes.len()), (1064, 1164, 100));
        a.bytes.fill(7);
        let b = r.reserve(4096 - 164).expect("room");
        assert_eq!(b.end, 5096);
        assert!(r.reserve(1).is_none(), "reserved past the end");
        // Published out of order: `done` waits for the earlier slot.
        assert!(!r.publish(b.start, b.end));
        assert_eq!(r.done(), 1064);
        assert!(r.publish(a.start, a.end));
        assert!(r.publish(b.start, b.end));
        assert_eq!(r.done(), 5096);
        assert!(r.publish(a.start, a.end), "publishing twice is harmless");
        assert_eq!(r.published(), 2);

        let r = region(4096, 0, 0);
        r.reserve(10).expect("room");
        assert_eq!(r.seal(), 10);
        assert!(r.reserve(1).is_none(), "reserved after the seal");
        assert_eq!((r.cursor(), r.seal()), (10, 10));
        // A start outside the mapping is clamped into it.
        assert_eq!(region(4096, 10, 0).cursor(), 10);
        assert_eq!(region(4096, 10, 1 << 20).cursor(), 4106);
    }

    #[test]
    fn released_and_prefaulted_pages_keep_their_bytes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .expect("file");
        file.set_len(64 << 10).expect("size");
        // SAFETY: a private temporary file nothing else opens or truncates.
        let map = unsafe { MmapMut::map_mut(&file) }.expect("map");
        let r = AppendRegion::new(map, 0, 0);
        let s = r.reserve(20000).expect("room");
        s.bytes
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8);
        assert!(r.publish(s.start, s.end));
        r.release_below(r.done());
        r.prefault(r.cursor(), r.limit());
        let t = r.reserve(100).expect("room");
        t.bytes.fill(9);
        assert!(r.publish(t.start, t.end));
        // The released pages read back through the file, and so does the new slot.
        let on_disk = std::fs::read(&path).expect("read");
        assert!((0..20000).all(|i| on_disk[i] == i as u8));
        assert!(on_disk[20000..20100].iter().all(|&b| b == 9));
    }

    #[test]
    fn concurrent_writers_get_disjoint_ranges_and_done_covers_only_written_bytes() {
        let r = Arc::new(region(64 << 10, 0, 0));
        let start = Arc::new(std::sync::Barrier::new(4));
        let threads: Vec<_> = (1..=4u8)
            .map(|t| {
                let (r, start) = (r.clone(), start.clone());
                thread::spawn(move || {
                    start.wait();
                    let mut n = 0u64;
                    while let Some(s) = r.reserve(u64::from(t) * 7) {
                        s.bytes.fill(t);
                        let (start, end) = (s.start, s.end);
                        while !r.publish(start, end) {
                            // An earlier writer may be preempted (4 threads, 2 cores).
                            thread::yield_now();
                        }
                        assert!(r.done() >= end);
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let counts: Vec<u64> = threads
            .into_iter()
            .map(|h| h.join().expect("join"))
            .collect();
        let mut r = Arc::try_unwrap(r).expect("sole owner");
        let done = r.done();
        assert_eq!(done, r.cursor());
        let total: u64 = (1..=4u64).map(|t| counts[t as usize - 1] * t * 7).sum();
        assert_eq!(total, done, "reserved bytes do not add up to the cursor");
        assert_eq!(r.published(), counts.iter().sum::<u64>());
        // Runs of one writer's byte, each a whole number of that writer's ranges: no two
        // ranges overlapped.
        let bytes = &r.filled()[..done as usize];
        let mut at = 0;
        while at < bytes.len() {
            let t = bytes[at];
            assert!((1..=4).contains(&t), "byte {at} was never written");
            let run = bytes[at..].iter().take_while(|&&b| b == t).count();
            assert_eq!(run % (usize::from(t) * 7), 0, "a torn range at {at}");
            at += run;
        }
    }
}

#[cfg(all(test, feature = "shuttle"))]
mod shuttle_tests {
    use super::*;
    use crate::sync::{thread, Arc};

    /// Two writers reserve, fill and publish while a third thread seals the region and
    /// waits for `done` to reach the seal, as a log segment switch does. Whatever the
    /// interleaving: the ranges handed out are disjoint and tile the region up to the seal,
    /// `done` never passes a range before it is published, and nothing is reserved after
    /// the seal.
    #[test]
    fn shuttle_writers_publish_in_order_and_a_seal_waits_for_them() {
        shuttle::check_random(
            || {
                let map = MmapMut::map_anon(4096).expect("anonymous map");
                let r = Arc::new(AppendRegion::new(map, 100, 100));
                let writers: Vec<_> = (1..=2u8)
                    .map(|t| {
                        let r = r.clone();
                        thread::spawn(move || {
                            let mut mine = Vec::new();
                            for k in 0..3u64 {
                                let Some(s) = r.reserve(8 + k) else { break };
                                s.bytes.fill(t);
                                let (start, end) = (s.start, s.end);
                                assert!(r.done() <= start, "done passed an unpublished range");
                                while !r.publish(start, end) {
                                    thread::yield_now();
                                }
                                assert!(r.done() >= end);
                                mine.push((start, end));
                            }
                            mine
                        })
                    })
                    .collect();
                let sealer = {
                    let r = r.clone();
                    thread::spawn(move || {
                        let sealed = r.seal();
                        while r.done() < sealed {
                            thread::yield_now();
                        }
                        sealed
                    })
                };
                let sealed = sealer.join().expect("sealer");
                let mut ranges: Vec<(u64, u64)> = writers
                    .into_iter()
                    .flat_map(|h| h.join().expect("writer"))
                    .collect();
                ranges.sort_unstable();
                let mut at = 100;
                for (start, end) in ranges {
                    assert_eq!(start, at, "ranges overlap or leave a gap");
                    at = end;
                }
                assert_eq!(at, sealed, "a range was reserved past the seal");
                assert_eq!(r.done(), sealed);
                assert!(r.reserve(1).is_none());
            },
            1000,
        );
    }
}
