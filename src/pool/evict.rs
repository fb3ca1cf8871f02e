//! Eviction (paper §4.2-§4.3): evictors claim blocks at the head in order, process them
//! concurrently, and the head advances over finished blocks only, in order.
//!
//! A claim sets the block's `claimed` header bit, after which the block is never
//! free-listed again: when its holder returns it, it becomes a tombstone. Claimed blocks are
//! recorded in `inflight`, oldest first; the head advances over the finished prefix and zeroes
//! it (so a later tail allocation's header slot reads `UNWRITTEN` until written). A live
//! block is evicted under its owner's write lock through the caller's callback; if that
//! fails, the block stays claimed, live and intact, and the next `evict_one` retries it.

use std::collections::VecDeque;

use super::guard::WriteGuard;
use super::ring::header;
use super::stats::bump;
use super::{BlockAddr, BufferPool, Location};
use crate::error::Result;
use crate::sync::{AtomicU64, Mutex, Ordering};

/// What happened to a claimed block.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Status {
    /// An evictor is working on it.
    InProgress,
    /// Finished: the head may pass it.
    Done,
    /// Its callback failed: live and intact, waiting for a retry.
    Failed,
}

/// A claimed block.
struct Claim {
    /// Logical address of the header.
    logical: u64,
    /// Total bytes, header included.
    total: u64,
    /// Progress.
    status: Status,
}

/// The claim frontier, guarded by one mutex (evictions are rare next to allocations; the
/// callbacks run outside it, so evictions still overlap).
pub(super) struct Evictor {
    /// Claims not yet passed by the head, in address order.
    state: Mutex<VecDeque<Claim>>,
    /// Next unclaimed logical address (`head <= cursor <= tail`); written under `state`.
    cursor: AtomicU64,
}

/// How one claimed block ended.
enum Outcome {
    /// A tombstone or free-listed block: nothing to write.
    Passed,
    /// A live block written out and detached by the callback.
    Evicted,
    /// A live block the callback could not write out now and left in place.
    Kept,
}

/// What [`BufferPool::evict_one`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub(crate) enum Evicted {
    /// Evicted a block, or passed dead ones.
    Progress,
    /// Nothing to evict.
    Nothing,
    /// The block at the head could not be written out now (its callback left it attached);
    /// it stays live and a later call retries it.
    Busy,
}

impl Evictor {
    /// No claims, cursor at 0.
    pub(super) fn new(start: u64) -> Evictor {
        Evictor {
            state: Mutex::new(VecDeque::new()),
            cursor: AtomicU64::new(start),
        }
    }

    /// The first unclaimed logical address.
    pub(super) fn cursor(&self) -> u64 {
        self.cursor.load(Ordering::Acquire)
    }
}

/// Handed to the eviction callback: the victim's page, write-locked. It cannot reach the
/// block's bytes mutably (the callback gets them read-only) and its one mutation detaches the
/// block.
pub(crate) struct EvictGuard<'g, 'a> {
    guard: &'g mut WriteGuard<'a>,
    phys: u64,
    detached: bool,
}

impl EvictGuard<'_, '_> {
    /// The victim's page id.
    pub(crate) fn page_id(&self) -> super::PageId {
        self.guard.page_id()
    }

    /// The entry's location (the victim block, until `set_location_disk`).
    #[allow(dead_code)] // used by unit tests and the internals harness
    pub(crate) fn location(&self) -> Location {
        self.guard.location()
    }

    /// Points the entry at disk page `page` (where the callback wrote the data), detaching
    /// the block; the pool turns it into a tombstone the head passes.
    pub(crate) fn set_location_disk(&mut self, page: u64) {
        self.guard.set_location_raw(Location::Disk(page));
        let pool = self.guard.pool();
        let hdr = pool.ring.header(self.phys);
        let mut h = hdr.load(Ordering::Acquire);
        let stripe = &pool.counters.stripes[super::free_list::my_shard()];
        bump(&stripe.released, header::total(h));
        loop {
            let dead = header::with_state(h, header::TOMBSTONE, 0);
            match hdr.compare_exchange_weak(h, dead, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(now) => h = now,
            }
        }
        self.detached = true;
    }
}

/// The callback type of [`BufferPool::evict_one`]: writes the block out and detaches it
/// (`Ok` after `set_location_disk`), leaves it attached because it cannot now (`Ok` without:
/// [`Evicted::Busy`]), or fails.
pub(crate) type EvictFn<'c> = dyn FnMut(&mut EvictGuard<'_, '_>, &[u8]) -> Result<()> + 'c;

impl BufferPool {
    /// Makes room from the head: passes tombstones and free-listed blocks (taking the latter
    /// off their lists first) and evicts at most one live block: locks its owner page for
    /// writing (blocking), checks the entry still maps the block, and calls
    /// `cb(&mut guard, bytes)`, which writes the bytes out and calls
    /// `guard.set_location_disk(n)`. If `cb` fails, or returns without detaching the block,
    /// the block stays live and intact, and a later call retries it. Several threads may
    /// evict at once.
    ///
    /// Returns what happened ([`Evicted`]), or `cb`'s error. Must not be called while holding
    /// a page lock or a block token.
    pub(crate) fn evict_one(&self, cb: &mut EvictFn<'_>) -> Result<Evicted> {
        let mut progress = false;
        let mut waits = 0u32;
        loop {
            let Some((logical, total)) = self.claim_next() else {
                if progress {
                    return Ok(Evicted::Progress);
                }
                if self.evict.state.lock().is_empty() {
                    return Ok(Evicted::Nothing);
                }
                // Others are evicting the rest; wait for them rather than report an empty
                // buffer that is merely busy.
                backoff(&mut waits);
                continue;
            };
            let phys = logical % self.ring.size();
            let outcome = self.process(phys, total, cb);
            let status = match outcome {
                Ok(Outcome::Passed | Outcome::Evicted) => Status::Done,
                Ok(Outcome::Kept) | Err(_) => Status::Failed,
            };
            self.finish(logical, status);
            match outcome {
                Ok(Outcome::Passed) => progress = true,
                Ok(Outcome::Evicted) => return Ok(Evicted::Progress),
                Ok(Outcome::Kept) => return Ok(Evicted::Busy),
                Err(e) => return Err(e),
            }
        }
    }

    /// Evicts up to `n` blocks from the head at once: claims them, calls `prepare` with
    /// the owners of the live ones (nothing locked, the claims held: the caller may write
    /// their leaves back in one batch, so that the evictions that follow find them clean and
    /// need no I/O), then evicts each as [`BufferPool::evict_one`] does. Claiming a run
    /// keeps the head from passing any of it until the whole run is processed, so `n`
    /// should stay small next to the buffer.
    ///
    /// Returns [`Evicted::Progress`] if any block was evicted or passed, else
    /// [`Evicted::Busy`] if one was left in place; with nothing claimable it behaves as
    /// `evict_one`. On an error from `cb`, the blocks not yet processed stay claimed,
    /// live and intact, for later calls to retry. Must not be called while holding a page
    /// lock or a block token, and `prepare` must not wait for room in the buffer.
    pub(crate) fn evict_batch(
        &self,
        n: usize,
        prepare: &mut dyn FnMut(&[super::PageId]),
        cb: &mut EvictFn<'_>,
    ) -> Result<Evicted> {
        let mut claims = Vec::with_capacity(n);
        while claims.len() < n {
            match self.claim_next() {
                Some(claim) => claims.push(claim),
                None => break,
            }
        }
        if claims.is_empty() {
            return self.evict_one(cb);
        }
        let owners: Vec<super::PageId> = claims
            .iter()
            .filter_map(|&(logical, _)| {
                let h = self
                    .ring
                    .header(logical % self.ring.size())
                    .load(Ordering::Acquire);
                (header::state(h) == header::READY).then(|| header::owner(h))
            })
            .collect();
        if !owners.is_empty() {
            prepare(&owners);
        }
        let mut progress = false;
        let mut claims = claims.into_iter();
        while let Some((logical, total)) = claims.next() {
            let outcome = self.process(logical % self.ring.size(), total, cb);
            let status = match outcome {
                Ok(Outcome::Passed | Outcome::Evicted) => Status::Done,
                Ok(Outcome::Kept) | Err(_) => Status::Failed,
            };
            self.finish(logical, status);
            match outcome {
                Ok(Outcome::Passed | Outcome::Evicted) => progress = true,
                Ok(Outcome::Kept) => {}
                Err(e) => {
                    // The rest were not touched: leave them for a retry.
                    for (logical, _) in claims {
                        self.finish(logical, Status::Failed);
                    }
                    return Err(e);
                }
            }
        }
        // Every claim was processed, so without progress one was kept.
        Ok(if progress {
            Evicted::Progress
        } else {
            Evicted::Busy
        })
    }

    /// Claims a failed block for a retry, or the block at the cursor. `None` if there is
    /// nothing claimable right now (buffer empty, everything in flight, or the block at the
    /// cursor is still having its header written).
    fn claim_next(&self) -> Option<(u64, u64)> {
        let mut inflight = self.evict.state.lock();
        if let Some(c) = inflight.iter_mut().find(|c| c.status == Status::Failed) {
            c.status = Status::InProgress;
            return Some((c.logical, c.total));
        }
        let cursor = self.evict.cursor.load(Ordering::Relaxed);
        if cursor >= self.tail.load(Ordering::Acquire) {
            return None;
        }
        let hdr = self.ring.header(cursor % self.ring.size());
        let mut h = hdr.load(Ordering::Acquire);
        loop {
            if header::state(h) == header::UNWRITTEN {
                // A tail allocation between its CAS and its header store: nothing blocks in
                // that window, so the caller retries shortly.
                return None;
            }
            match hdr.compare_exchange_weak(
                h,
                header::with_claimed(h),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(now) => h = now,
            }
        }
        let total = header::total(h);
        inflight.push_back(Claim {
            logical: cursor,
            total,
            status: Status::InProgress,
        });
        self.evict.cursor.store(cursor + total, Ordering::Release);
        Some((cursor, total))
    }

    /// Brings one claimed block to an end: passable (tombstone) or failed (still live).
    fn process(&self, phys: u64, total: u64, cb: &mut EvictFn<'_>) -> Result<Outcome> {
        let hdr = self.ring.header(phys);
        let addr = BlockAddr(phys / 8);
        let mut waits = 0u32;
        match header::state(hdr.load(Ordering::Acquire)) {
            header::TOMBSTONE => bump(&self.counters.tombstones_passed, 1),
            header::FREE => bump(&self.counters.free_listed_passed, 1),
            _ => {}
        }
        loop {
            let h = hdr.load(Ordering::Acquire);
            match header::state(h) {
                header::TOMBSTONE => return Ok(Outcome::Passed),
                header::FREE => self.free.remove_claimed(&self.ring, phys),
                header::READY => {
                    let owner = header::owner(h);
                    let mut guard = self.write(owner);
                    let h = hdr.load(Ordering::Acquire);
                    if header::state(h) == header::READY
                        && header::owner(h) == owner
                        && guard.location() == Location::Mini(addr)
                    {
                        let size = total as usize - 8;
                        // SAFETY: the block is READY and mapped by `owner`, whose write lock
                        // we hold, so nobody else reads or writes it; the callback gets it
                        // read-only and `EvictGuard` offers no other way to the bytes. It
                        // stays claimed and unpassed until `finish`, after the callback.
                        let bytes =
                            unsafe { std::slice::from_raw_parts(self.ring.payload(phys), size) };
                        let mut eg = EvictGuard {
                            guard: &mut guard,
                            phys,
                            detached: false,
                        };
                        cb(&mut eg, bytes)?;
                        if eg.detached {
                            bump(&self.counters.evictions, 1);
                            return Ok(Outcome::Evicted);
                        }
                        return Ok(Outcome::Kept);
                    }
                }
                // Held by a token (allocating or detached): its holder will map it or give it
                // back soon; it cannot be passed before.
                _ => backoff(&mut waits),
            }
        }
    }

    /// Records how a claim ended and moves the head over the finished prefix.
    fn finish(&self, logical: u64, status: Status) {
        let mut inflight = self.evict.state.lock();
        if let Some(c) = inflight.iter_mut().find(|c| c.logical == logical) {
            c.status = status;
        }
        let mut head = self.head.load(Ordering::Relaxed);
        while let Some(c) = inflight.front() {
            if c.status != Status::Done {
                break;
            }
            debug_assert_eq!(c.logical, head);
            let phys = c.logical % self.ring.size();
            debug_assert_eq!(
                header::state(self.ring.header(phys).load(Ordering::Acquire)),
                header::TOMBSTONE
            );
            // SAFETY: the block is a claimed tombstone whose processing finished: no token,
            // guard or list refers to it, and no one will until the head is past it.
            unsafe { self.ring.zero(phys, c.total) };
            head = c.logical + c.total;
            inflight.pop_front();
        }
        self.head.store(head, Ordering::Release);
    }
}

/// Waits a little: spin, then yield, then sleep, so a long wait does not burn a core.
fn backoff(waits: &mut u32) {
    *waits += 1;
    if *waits < 10 {
        crate::sync::spin_hint();
    } else if *waits < 100 || cfg!(shuttle) {
        crate::sync::yield_now();
    } else {
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
}
