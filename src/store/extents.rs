//! Which blocks of the blob file (`blob.rs`) are in use: the extent allocator.

use std::collections::{BTreeMap, BTreeSet};

use super::BLOB_BLOCK;

/// Which blocks of the blob file are in use: free runs coalesced, allocation best-fit,
/// growth at the end.
///
/// Not persisted: recovery rebuilds it from the extents the tree references
/// ([`with_used`](Self::with_used), [`claim`](Self::claim)). Invariants: free runs never
/// overlap or touch (they are coalesced), none reaches `end` (a run freed there lowers
/// `end` instead, so the file can shrink), and `by_len` indexes exactly the runs of `free`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Extents {
    /// Free runs below `end`: start -> length (> 0).
    free: BTreeMap<u64, u64>,
    /// The same runs as (length, start), for best-fit: the first entry at or after
    /// `(blocks, 0)` is the smallest run that holds `blocks`, lowest start among equals.
    by_len: BTreeSet<(u64, u64)>,
    /// One past the last block in use.
    end: u64,
    /// Blocks in use.
    used: u64,
}

impl Extents {
    /// Nothing allocated, end 0.
    pub(crate) fn new() -> Extents {
        Extents::default()
    }

    /// The allocator of a file in which exactly the `used` (start, blocks) runs are in use,
    /// in any order, and everything else below the highest end is free: what recovery
    /// knows once it has collected the tree's references.
    ///
    /// # Errors
    /// A reason if two runs overlap or a run is empty or beyond any block number.
    pub(crate) fn with_used(
        used: impl IntoIterator<Item = (u64, u64)>,
    ) -> Result<Extents, &'static str> {
        let mut extents = Extents::new();
        for (start, blocks) in used {
            extents
                .claim(start, blocks)
                .map_err(|reason| match reason {
                    IN_USE => "overlapping blob runs",
                    other => other,
                })?;
        }
        Ok(extents)
    }

    /// `blocks` (> 0) contiguous blocks: the smallest free run that holds them (lowest
    /// start among equals), which keeps large runs whole for large values; else at the
    /// end, which grows. Returns the start.
    ///
    /// # Panics
    /// If `blocks` is 0 (a caller bug: an empty value needs no extent). The end cannot
    /// overflow: claimed runs end within [`MAX_BLOCKS`] (`run_end`), and an allocation is
    /// far smaller than the room above it.
    pub(crate) fn allocate(&mut self, blocks: u64) -> u64 {
        assert!(blocks > 0, "allocating an empty blob run");
        if let Some(&(len, start)) = self.by_len.range((blocks, 0)..).next() {
            self.remove_run(start, len);
            if len > blocks {
                self.insert_run(start + blocks, len - blocks);
            }
            self.used += blocks;
            return start;
        }
        let start = self.end;
        self.end = start + blocks;
        self.used += blocks;
        start
    }

    /// Returns the run `start..start + blocks`, coalescing it with free neighbours; a run
    /// that reaches the end lowers the end, so the file can shrink.
    ///
    /// # Errors
    /// A reason if the run is empty, reaches beyond the end, or any block of it is free
    /// already (a double free); nothing is changed then.
    pub(crate) fn free(&mut self, start: u64, blocks: u64) -> Result<(), &'static str> {
        let stop = run_end(start, blocks)?;
        if stop > self.end {
            return Err("blob run beyond the end of the blob file");
        }
        if self.free_overlapping(start, stop).is_some() {
            return Err("blob run already free (double free)");
        }
        let (mut lo, mut hi) = (start, stop);
        if let Some((&s, &len)) = self.free.range(..start).next_back() {
            if s + len == start {
                self.remove_run(s, len);
                lo = s;
            }
        }
        if let Some(&len) = self.free.get(&stop) {
            self.remove_run(stop, len);
            hi = stop + len;
        }
        self.used -= blocks;
        if hi == self.end {
            self.end = lo;
        } else {
            self.insert_run(lo, hi - lo);
        }
        Ok(())
    }

    /// Marks in use a run that recovery found referenced. It must be entirely free or
    /// beyond the end; a run beyond the end grows the end and makes the gap below it free.
    /// Claiming a run already claimed is an error too: a reference found twice is a
    /// fault the caller must judge (the same value seen again, or two values sharing
    /// blocks), not something to absorb here.
    ///
    /// # Errors
    /// A reason if the run is empty, beyond any block number, or any block of it is in use
    /// already; nothing is changed then.
    pub(crate) fn claim(&mut self, start: u64, blocks: u64) -> Result<(), &'static str> {
        let stop = run_end(start, blocks)?;
        if start >= self.end {
            if start > self.end {
                self.insert_run(self.end, start - self.end);
            }
            self.end = stop;
            self.used += blocks;
            return Ok(());
        }
        // Free runs are coalesced and never reach the end, so an entirely free run lies
        // inside one free run, below the end.
        let Some((s, len)) = self.free_containing(start) else {
            return Err(IN_USE);
        };
        if s + len < stop {
            return Err(IN_USE);
        }
        self.remove_run(s, len);
        if s < start {
            self.insert_run(s, start - s);
        }
        if stop < s + len {
            self.insert_run(stop, s + len - stop);
        }
        self.used += blocks;
        Ok(())
    }

    /// One past the last block in use (the file need not be longer).
    pub(crate) fn end(&self) -> u64 {
        self.end
    }

    /// Blocks in use.
    pub(crate) fn used_blocks(&self) -> u64 {
        self.used
    }

    /// Free blocks below the end: space the file holds but no value uses.
    pub(crate) fn free_blocks(&self) -> u64 {
        self.end - self.used
    }

    /// The free runs, (start, length) in order of start, for tests to check the invariants.
    #[cfg(test)]
    pub(super) fn free_runs(&self) -> Vec<(u64, u64)> {
        self.free.iter().map(|(&s, &l)| (s, l)).collect()
    }

    /// Panics unless the best-fit index matches the free runs exactly.
    #[cfg(test)]
    pub(super) fn assert_index_consistent(&self) {
        let index: Vec<(u64, u64)> = self.by_len.iter().map(|&(l, s)| (s, l)).collect();
        let mut runs = self.free_runs();
        runs.sort_by_key(|&(s, l)| (l, s));
        assert_eq!(index, runs, "best-fit index out of step with the free runs");
    }

    /// The free run that holds block `block`, if any.
    fn free_containing(&self, block: u64) -> Option<(u64, u64)> {
        let (&s, &len) = self.free.range(..=block).next_back()?;
        (block < s + len).then_some((s, len))
    }

    /// A free run overlapping `start..stop`, if any: the last run starting before `stop`
    /// is the only candidate, since runs do not overlap each other.
    fn free_overlapping(&self, start: u64, stop: u64) -> Option<(u64, u64)> {
        let (&s, &len) = self.free.range(..stop).next_back()?;
        (s + len > start).then_some((s, len))
    }

    /// Adds a free run to both maps.
    fn insert_run(&mut self, start: u64, len: u64) {
        debug_assert!(len > 0);
        self.free.insert(start, len);
        self.by_len.insert((len, start));
    }

    /// Removes a free run from both maps.
    fn remove_run(&mut self, start: u64, len: u64) {
        self.free.remove(&start);
        self.by_len.remove(&(len, start));
    }
}

/// Why a claim is refused: some block of the run is in use.
const IN_USE: &str = "blob run already in use";

/// Blocks a file offset (`off_t`) can address: no run ends past this.
const MAX_BLOCKS: u64 = (i64::MAX as u64) / BLOB_BLOCK;

/// One past the run `start..start + blocks`, or why there is no such run. Runs end within
/// [`MAX_BLOCKS`], so the end of the file (at most that) plus any allocation fits a `u64`.
fn run_end(start: u64, blocks: u64) -> Result<u64, &'static str> {
    if blocks == 0 {
        return Err("zero-length blob run");
    }
    start
        .checked_add(blocks)
        .filter(|&stop| stop <= MAX_BLOCKS)
        .ok_or("blob run beyond any block number")
}
