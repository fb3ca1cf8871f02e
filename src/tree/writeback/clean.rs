//! Write-back in batches outside checkpoints: the idle write-back, and an evictor's run.
//!
//! **Idle write-back**: once writes pause, buffered changes go to their leaf pages in
//! batches and stay cached as clean records (`Config::idle_write_back`).
//!
//! Why: dirty records leave the cache only by a write-back, which eviction does one leaf at a
//! time when the mini-page reaches the head of the buffer. Under skewed reads after a bulk
//! load, nearly every leaf holds some hot record, so its mini-page keeps being grown or
//! copied to the tail and carries the load's cold records along: 5M records loaded into a
//! 32 MiB cache left 425k of them cached after 16 s of Zipf lookups, beside only 141k cached
//! answers. Written back, they become clean records that the next copy or growth of their
//! mini-page drops unless they were read, and that eviction drops without I/O.
//!
//! A pass is a checkpoint's first pass without the log: `BATCH` leaves at a time, read with
//! one `read_batch` and written with one `write_batch` (`checkpoint.rs`), so the device works
//! on many pages at once instead of the one in flight per evictor. It stops between batches
//! as soon as `idle` says writes resumed, and the next pass goes on from where it stopped.
//!
//! **An evictor's run** (`write_back_claimed`): an evictor thread claims `BATCH` blocks at
//! the head (`BufferPool::evict_batch`) and writes their dirty leaves back the same way
//! before it evicts them, so each eviction finds its leaf clean and drops the block
//! without I/O. One leaf at a time, an evictor keeps one read, then one write, in flight,
//! so the device works at a queue depth near the number of evictors; a run keeps 32 in
//! flight. Several evictors' runs go on side by side, but a run gives way to a checkpoint
//! (`PageTracker::write_backs_beside`).

use super::checkpoint::{Candidate, Staged};
use super::page_batch::PageBatch;
use crate::error::Result;
use crate::pool::PageId;
use crate::tree::Shared;

impl Shared {
    /// Writes back every buffered leaf while `idle()` holds, starting at page id `*from`
    /// and wrapping around. Returns `Ok(true)` if it went through every leaf, `Ok(false)`
    /// if `idle` stopped it first, with `*from` where the next pass should go on.
    ///
    /// # Errors
    /// `Io` or `Corruption` from reading or writing a leaf; leaves not written stay dirty.
    pub(crate) fn write_back_idle(
        &self,
        from: &mut PageId,
        idle: &dyn Fn() -> bool,
    ) -> Result<bool> {
        let mut leaves = self.buffered_leaves(*from).peekable();
        let mut staged = Vec::new();
        let mut batch = PageBatch::default();
        loop {
            if !idle() {
                if let Some(&next) = leaves.peek() {
                    *from = next;
                }
                return Ok(false);
            }
            let chunk = self.dirty_chunk(&mut leaves, |_, dirty| dirty);
            if chunk.is_empty() {
                *from = 0;
                return Ok(true);
            }
            // Never interleaved with a checkpoint: a page built before a checkpoint takes its
            // LSN and written after would count as written since the LSN (`is_fresh`) while
            // lacking writes logged before it.
            let _one_at_a_time = self.storage().pages().one_at_a_time();
            self.write_back_chunk(&chunk, &mut staged, &mut batch)?;
        }
    }

    /// Writes back those of `owners` (the leaves of blocks an evictor claimed at the head)
    /// that need it, in one batch, so that their evictions need no I/O. Other evictors'
    /// batches may run beside it (claims are disjoint, and the write tokens settle a leaf
    /// two batches build). It gives way (does nothing) while a checkpoint or an idle pass
    /// runs, and on an error: the evictions then write each leaf themselves, and report
    /// what they meet.
    /// `batch` is the evictor's own, kept from run to run so that its page buffers are
    /// reused rather than allocated for every run.
    pub(in crate::tree) fn write_back_claimed(&self, owners: &[PageId], batch: &mut PageBatch) {
        let Some(_beside) = self.storage().pages().write_backs_beside() else {
            return;
        };
        let chunk = self.dirty_chunk(&mut owners.iter().copied(), |_, dirty| dirty);
        if chunk.is_empty() {
            return;
        }
        let mut staged = Vec::with_capacity(chunk.len());
        let _ = self.write_back_chunk(&chunk, &mut staged, batch);
    }

    /// Stages the leaves of `chunk` and writes them (`checkpoint.rs`); on an error, what
    /// was staged is abandoned (the leaves stay dirty). The caller holds `one_at_a_time`
    /// or `write_backs_beside`.
    fn write_back_chunk(
        &self,
        chunk: &[Candidate],
        staged: &mut Vec<Staged>,
        batch: &mut PageBatch,
    ) -> Result<()> {
        let written = self
            .stage_chunk(chunk, None, staged, batch)
            .and_then(|()| self.write_staged(staged, batch));
        if written.is_err() {
            self.abandon(staged, batch);
        }
        written
    }

    /// Writes applied so far (a pause in this count is what `idle_write_back` waits for).
    pub(crate) fn writes_applied(&self) -> u64 {
        self.counters().writes_buffered()
    }
}

#[cfg(all(test, not(shuttle)))]
#[path = "clean_tests.rs"]
mod tests;
