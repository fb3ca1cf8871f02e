//! Range scans: double-ended iterators that copy out one leaf at a time.
//!
//! An iterator holds no lock between calls: it remembers the next bound on each end, finds
//! the leaf for it from the root, copies out the records in range into one reused buffer
//! (`copied.rs`): from a validated copy of the leaf's mini-page, without its lock, when that
//! decides the whole range (`optimistic.rs`), else under its read lock (`scan_locked.rs`:
//! the mini-page merged over the disk leaf, newest wins, tombstones hide). Moving to the
//! next leaf uses the exact bound from the inner nodes, so a concurrent split or
//! removal never makes it skip or repeat a key. Leaves with nothing to return are passed in
//! a loop, never by recursion. `next_ref` lends records from that buffer; `next` copies
//! them out. A long ascending scan reads the next leaf's page ahead (`readahead.rs`). The
//! buffers pass from a dropped iterator to the next one on its thread (`scan_buffers.rs`).

use std::ops::Bound;

use super::copied::Copied;
use super::readahead::ReadAhead;
use super::scan_buffers::ScanBuffers;
use super::scan_items::{copy_bound, lend, owned, recycle, remember, Held};
use super::scan_locked::Ahead;
use crate::error::{Error, Result};
use crate::sync;
use crate::tree::blob::BlobPin;
use crate::tree::index::Seek;
use crate::tree::keyspace::{is_empty_range, Space};
use crate::tree::versions::ScanStart;
use crate::tree::{KeyValue, Shared};

/// Leaves an ascending scan copies before it reads the next leaf ahead with the one it
/// reads from disk (`readahead.rs`): a scan that long is probably a long one. Short scans
/// (YCSB-E's take up to 100 records, one to three leaves) would mostly read a page ahead
/// for nothing: reading ahead from the third leaf on added 4 % page reads to YCSB-E.
const READ_AHEAD_AFTER: u64 = 3;

/// Iterator over a key range; see [`Tree::range`](crate::Tree::range).
///
/// Yields `Result<(key, value)>`. An I/O or corruption error while reading a leaf is
/// returned once, after which the iterator ends. An error of one record's value alone (a
/// value stored out of line that fails its check, a key whose merges could not be folded)
/// is yielded in that record's place, and the iterator goes on with the keys after it.
///
/// An iterator sees every [`Batch`](crate::Batch) committed before it was created whole,
/// and none committed after. For that, while it lives, each later batch keeps the old
/// values of its keys in memory: drop iterators you are done with rather than keep them
/// idle.
///
/// ```
/// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
/// for i in 0u8..10 {
///     tree.insert([i], [i])?;
/// }
/// // Keys 3..7 in descending order, stopping after two.
/// let last_two: Vec<_> = tree.range([3u8]..[7u8]).rev().take(2).collect::<Result<_, _>>()?;
/// assert_eq!(last_two, [(vec![6], vec![6]), (vec![5], vec![5])]);
/// # Ok::<(), bfkv::Error>(())
/// ```
pub struct Range<'t> {
    tree: Held<'t, Shared>,
    /// The keyspace scanned.
    space: Held<'t, Space>,
    /// Bytes of its prefix in front of every stored key.
    prefix_len: usize,
    lower: Bound<Vec<u8>>,
    upper: Bound<Vec<u8>>,
    /// Where the front continues (initially `lower`).
    front: Bound<Vec<u8>>,
    /// Where the back continues (initially `upper`).
    back: Bound<Vec<u8>>,
    front_buf: Copied,
    back_buf: Copied,
    /// A leaf's bytes as a refill without the leaf's lock copied them (`optimistic.rs`).
    snapshot: Vec<u8>,
    /// Pages the front read ahead (`readahead.rs`).
    ahead: ReadAhead,
    /// Leaves the front has copied so far.
    front_refills: u64,
    /// Keep the extents the buffers' references name from reuse until they are yielded
    /// (taken before a leaf is copied, when the tree stores values out of line).
    front_pin: Option<BlobPin>,
    back_pin: Option<BlobPin>,
    /// What it yields for values stored out of line.
    values: Values,
    /// The last value read from the blob file, lent out by `next_ref`.
    blob_value: Vec<u8>,
    /// A bound's buffer no longer needed, reused for the next one (a refill allocates
    /// nothing once the buffers have grown).
    spare: Vec<u8>,
    /// Key buffers kept from earlier iterators on this thread and not in use (the bounds
    /// take theirs from here, so that making an iterator allocates nothing).
    keys: Vec<Vec<u8>>,
    /// The last key yielded from the front (stored form), once one was: copied here when
    /// the buffer it came from is refilled, until then `front_buf.last_taken_front()`.
    front_last: Option<Vec<u8>>,
    /// The last key yielded from the back, kept the same way.
    back_last: Option<Vec<u8>>,
    front_done: bool,
    back_done: bool,
    finished: bool,
    /// An error to yield before anything else (a scan that could not start).
    error: Option<Error>,
    /// The last write number when the scan (or its snapshot) started: later batches, and
    /// for a snapshot every later write, are kept out of what it yields
    /// (`versions/store.rs`).
    start: ScanStart,
}

/// What a scan yields for a value stored out of line.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Values {
    /// The value, read from the blob file.
    Read,
    /// Its reference, as the leaf stores it (for a caller that uses the keys only).
    Stored,
}

/// Whether `key` is at or past the end bound `end` (going up).
fn past_end(end: &Bound<Vec<u8>>, key: &[u8]) -> bool {
    match end {
        Bound::Included(e) => key > e.as_slice(),
        Bound::Excluded(e) => key >= e.as_slice(),
        Bound::Unbounded => false,
    }
}

/// Whether every key below `low` is outside a range that starts at `start` (going down).
fn at_or_below_start(start: &Bound<Vec<u8>>, low: &[u8]) -> bool {
    match start {
        Bound::Included(s) | Bound::Excluded(s) => low <= s.as_slice(),
        Bound::Unbounded => false,
    }
}

impl<'t> Range<'t> {
    /// An iterator over the keys of `space` in `range`. Given a keyspace handle's state
    /// (`Held::Owned`), every refill passes its gate: the iterator may outlive the tree.
    pub(crate) fn new<K: AsRef<[u8]>, R: std::ops::RangeBounds<K>>(
        tree: impl Into<Held<'t, Shared>>,
        space: impl Into<Held<'t, Space>>,
        range: R,
    ) -> Range<'t> {
        let tree = tree.into();
        let start = tree.versions().begin_scan();
        Range::from_start(tree, space.into(), range, start)
    }

    /// An iterator over the keys of `space` in `range` as they were when the snapshot or
    /// transaction registered at `at` started (it stays registered: the iterator must not
    /// outlive it).
    pub(crate) fn at<K: AsRef<[u8]>, R: std::ops::RangeBounds<K>>(
        tree: impl Into<Held<'t, Shared>>,
        space: impl Into<Held<'t, Space>>,
        range: R,
        at: ScanStart,
    ) -> Range<'t> {
        Range::from_start(tree.into(), space.into(), range, at)
    }

    /// An iterator that yields `error` and ends (a call that could not start a scan).
    pub(crate) fn failed(
        tree: impl Into<Held<'t, Shared>>,
        space: impl Into<Held<'t, Space>>,
        error: Error,
    ) -> Range<'t> {
        let tree = tree.into();
        let start = tree.versions().begin_scan();
        let mut range = Range::from_start(
            tree,
            space.into(),
            (Bound::Excluded([0u8]), Bound::Excluded([0u8])),
            start,
        );
        range.error = Some(error);
        range.finished = false;
        range
    }

    fn from_start<K: AsRef<[u8]>, R: std::ops::RangeBounds<K>>(
        tree: Held<'t, Shared>,
        space: Held<'t, Space>,
        range: R,
        start: ScanStart,
    ) -> Range<'t> {
        // A bound longer than any key is refused as a lookup of it is.
        let limit = tree.limits().max_key_len;
        let too_long = [range.start_bound(), range.end_bound()]
            .into_iter()
            .find_map(|b| match b {
                Bound::Included(k) | Bound::Excluded(k) if k.as_ref().len() > limit => {
                    Some(Error::KeyTooLarge {
                        len: k.as_ref().len(),
                        limit,
                    })
                }
                _ => None,
            });
        let ScanBuffers {
            front: front_buf,
            back: back_buf,
            snapshot,
            mut keys,
        } = ScanBuffers::take();
        let mut key = || keys.pop().unwrap_or_default();
        let (lower, upper) = space.bounds(&range, &mut key);
        let front = copy_bound(&lower, &mut key);
        let back = copy_bound(&upper, &mut key);
        let spare_key = key();
        let empty = is_empty_range(
            lower.as_ref().map(Vec::as_slice),
            upper.as_ref().map(Vec::as_slice),
        );
        let mut range = Range {
            prefix_len: space.prefix().as_slice().len(),
            tree,
            space,
            front,
            back,
            lower,
            upper,
            front_buf,
            back_buf,
            snapshot,
            ahead: ReadAhead::default(),
            front_refills: 0,
            front_pin: None,
            back_pin: None,
            values: Values::Read,
            blob_value: Vec::new(),
            spare: spare_key,
            keys,
            front_last: None,
            back_last: None,
            front_done: empty,
            back_done: empty,
            finished: empty,
            error: None,
            start,
        };
        if let Some(e) = too_long {
            range.error = Some(e);
            (range.front_done, range.back_done, range.finished) = (true, true, false);
        }
        range
    }

    /// Copies out the next leaf (going up) that has records in range. Out of line, so that
    /// what `next_ref` does for every record stays small enough to inline into the caller.
    #[inline(never)]
    fn fill_front(&mut self) -> Result<()> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        while self.front_buf.is_empty() && !self.front_done {
            // The gate of the keyspace alone is borrowed: the refill fills the rest.
            let _in = self.space.gate().map(Space::enter).transpose()?;
            let guard = sync::pin();
            let seek = match &self.front {
                Bound::Unbounded => Seek::First,
                Bound::Included(k) | Bound::Excluded(k) => Seek::Key(k),
            };
            self.front_pin = self.tree.blob_pin();
            if let Some(k) = self.front_buf.last_taken_front() {
                remember(&mut self.front_last, k, &mut self.keys);
            }
            self.front_buf.clear();
            self.front_buf.reserve_leaf(self.tree.page_size());
            let mut high = std::mem::take(&mut self.spare);
            let copied = self.tree.collect_optimistic(
                &guard,
                seek,
                (&self.front, &self.upper),
                &mut self.snapshot,
                &mut self.front_buf,
            )?;
            // Whether the range goes on past this leaf, into the one its high bound starts.
            let goes_on = if let Some(path) = copied {
                path.high_into(&mut high) && !past_end(&self.upper, &high)
            } else {
                let (path, page) = self.tree.index().read_leaf(self.tree.pool(), &guard, seek);
                let goes_on = path.high_into(&mut high) && !past_end(&self.upper, &high);
                self.tree.collect_leaf(
                    &path,
                    page,
                    &self.front,
                    &self.upper,
                    &mut self.front_buf,
                    Some(Ahead {
                        read: &mut self.ahead,
                        guard: &guard,
                        // Only a scan already past its first leaves reads ahead: a page
                        // read for a scan that ends first is a read the device did for
                        // nothing.
                        next: (self.front_refills >= READ_AHEAD_AFTER && goes_on)
                            .then_some(&high[..]),
                    }),
                )?;
                goes_on
            };
            self.tree.journal().check()?;
            if self.tree.versions().batched_since(self.start) {
                // This leaf's part of the range: from the front to its high bound.
                let end = if goes_on {
                    Bound::Excluded(high.clone())
                } else {
                    self.upper.clone()
                };
                let mut items = self.front_buf.take_all();
                self.tree
                    .versions()
                    .rewind(self.start, &mut items, &self.front, &end)?;
                self.front_buf.extend(items);
            }
            self.front_refills += 1;
            // Making the leaf a full-page mirror may have taken room.
            self.tree.nudge_evictors();
            if goes_on {
                let old = std::mem::replace(&mut self.front, Bound::Included(high));
                recycle(old, &mut self.spare);
            } else {
                self.front_done = true;
                self.spare = high;
            }
        }
        Ok(())
    }

    /// Copies out the next leaf (going down) that has records in range (out of line, as
    /// `fill_front`).
    #[inline(never)]
    fn fill_back(&mut self) -> Result<()> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        while self.back_buf.is_empty() && !self.back_done {
            // The gate of the keyspace alone is borrowed: the refill fills the rest.
            let _in = self.space.gate().map(Space::enter).transpose()?;
            let guard = sync::pin();
            let seek = match &self.back {
                Bound::Unbounded => Seek::Last,
                Bound::Included(k) => Seek::Key(k),
                Bound::Excluded(k) => Seek::Before(k),
            };
            self.back_pin = self.tree.blob_pin();
            if let Some(k) = self.back_buf.last_taken_back() {
                remember(&mut self.back_last, k, &mut self.keys);
            }
            self.back_buf.clear();
            self.back_buf.reserve_leaf(self.tree.page_size());
            let mut low = std::mem::take(&mut self.spare);
            let copied = self.tree.collect_optimistic(
                &guard,
                seek,
                (&self.lower, &self.back),
                &mut self.snapshot,
                &mut self.back_buf,
            )?;
            let has_low = if let Some(path) = copied {
                path.low_into(&mut low)
            } else {
                let (path, page) = self.tree.index().read_leaf(self.tree.pool(), &guard, seek);
                let has_low = path.low_into(&mut low);
                self.tree.collect_leaf(
                    &path,
                    page,
                    &self.lower,
                    &self.back,
                    &mut self.back_buf,
                    None,
                )?;
                has_low
            };
            self.tree.journal().check()?;
            if self.tree.versions().batched_since(self.start) {
                // This leaf's part of the range: from its low bound to the back.
                let start = if has_low && !at_or_below_start(&self.lower, &low) {
                    Bound::Included(low.clone())
                } else {
                    self.lower.clone()
                };
                let mut items = self.back_buf.take_all();
                self.tree
                    .versions()
                    .rewind(self.start, &mut items, &start, &self.back)?;
                self.back_buf.extend(items);
            }
            self.tree.nudge_evictors();
            if !has_low || at_or_below_start(&self.lower, &low) {
                self.back_done = true;
                self.spare = low;
            } else {
                let old = std::mem::replace(&mut self.back, Bound::Excluded(low));
                recycle(old, &mut self.spare);
            }
        }
        Ok(())
    }

    /// Pages read ahead, and those a refill used (tests).
    #[cfg(all(test, not(shuttle)))]
    pub(in crate::tree) fn read_ahead(&self) -> (u64, u64) {
        (self.ahead.issued, self.ahead.used)
    }

    /// How many records it yields, counted from their keys (a value stored out of line is
    /// not read).
    ///
    /// # Errors
    /// The first error a refill meets.
    pub(crate) fn count_keys(self) -> Result<u64> {
        let mut n = 0u64;
        for r in self.keys_only() {
            r?;
            n += 1;
        }
        Ok(n)
    }

    /// This iterator, yielding the stored form of values kept out of line instead of
    /// reading them: for a caller that uses the keys only (a keyspace drop).
    pub(crate) fn keys_only(mut self) -> Self {
        self.values = Values::Stored;
        self
    }

    /// The next record from the front, borrowed from the iterator: what
    /// [`next`](Iterator::next) yields, without copying it into vectors of its own. A leaf
    /// is copied once, into buffers the iterator reuses from leaf to leaf (and leaves to the
    /// next iterator on its thread), and its records are lent from there, so a scan of
    /// records in memory allocates nothing per record (and, once its buffers have grown to
    /// a leaf's size, nothing per leaf). The same iterator can mix
    /// `next_ref`, `next_back_ref` and the owned methods.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// for i in 0u32..100 {
    ///     tree.insert(i.to_be_bytes(), [1u8])?;
    /// }
    /// let mut scan = tree.range(10u32.to_be_bytes()..);
    /// let mut sum = 0u32;
    /// while let Some(record) = scan.next_ref() {
    ///     let (_key, value) = record?;
    ///     sum += u32::from(value[0]);
    /// }
    /// assert_eq!(sum, 90);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    #[allow(clippy::should_implement_trait)]
    #[inline]
    pub fn next_ref(&mut self) -> Option<Result<(&[u8], &[u8])>> {
        if self.finished {
            return None;
        }
        if self.front_buf.is_empty() {
            if let Err(e) = self.fill_front() {
                self.finished = true;
                return Some(Err(e));
            }
        }
        let Some((k, v)) = self.front_buf.pop_front() else {
            self.finished = true;
            return None;
        };
        let back_last = self
            .back_buf
            .last_taken_back()
            .or(self.back_last.as_deref());
        if back_last.is_some_and(|b| k >= b) {
            self.finished = true;
            return None;
        }
        // An error for this record's value alone (a damaged extent, a failed fold) takes
        // its place: the records after it are still yielded.
        Some(lend(
            &self.tree,
            self.prefix_len,
            self.values,
            k,
            v,
            &mut self.blob_value,
        ))
    }

    /// The next record from the back, borrowed from the iterator: as
    /// [`next_ref`](Range::next_ref), for [`next_back`](DoubleEndedIterator::next_back).
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// tree.insert(b"a", b"1")?;
    /// tree.insert(b"b", b"2")?;
    /// let mut scan = tree.iter();
    /// assert_eq!(scan.next_back_ref().transpose()?, Some((&b"b"[..], &b"2"[..])));
    /// assert_eq!(scan.next_ref().transpose()?, Some((&b"a"[..], &b"1"[..])));
    /// assert!(scan.next_back_ref().is_none());
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    #[inline]
    pub fn next_back_ref(&mut self) -> Option<Result<(&[u8], &[u8])>> {
        if self.finished {
            return None;
        }
        if self.back_buf.is_empty() {
            if let Err(e) = self.fill_back() {
                self.finished = true;
                return Some(Err(e));
            }
        }
        let Some((k, v)) = self.back_buf.pop_back() else {
            self.finished = true;
            return None;
        };
        let front_last = self
            .front_buf
            .last_taken_front()
            .or(self.front_last.as_deref());
        if front_last.is_some_and(|f| k <= f) {
            self.finished = true;
            return None;
        }
        // An error for this record's value alone (a damaged extent, a failed fold) takes
        // its place: the records after it are still yielded.
        Some(lend(
            &self.tree,
            self.prefix_len,
            self.values,
            k,
            v,
            &mut self.blob_value,
        ))
    }
}

impl Iterator for Range<'_> {
    type Item = Result<KeyValue>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_ref().map(owned)
    }
}

impl DoubleEndedIterator for Range<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.next_back_ref().map(owned)
    }
}

impl std::iter::FusedIterator for Range<'_> {}

impl Drop for Range<'_> {
    fn drop(&mut self) {
        self.tree.versions().end_scan(self.start);
        let mut keys = std::mem::take(&mut self.keys);
        for bound in [
            &mut self.lower,
            &mut self.upper,
            &mut self.front,
            &mut self.back,
        ] {
            if let Bound::Included(k) | Bound::Excluded(k) =
                std::mem::replace(bound, Bound::Unbounded)
            {
                keys.push(k);
            }
        }
        keys.push(std::mem::take(&mut self.spare));
        keys.extend(self.front_last.take());
        keys.extend(self.back_last.take());
        keys.retain(|k| k.capacity() > 0);
        ScanBuffers::give_back(ScanBuffers {
            front: std::mem::take(&mut self.front_buf),
            back: std::mem::take(&mut self.back_buf),
            snapshot: std::mem::take(&mut self.snapshot),
            keys,
        });
    }
}
