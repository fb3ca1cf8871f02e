//! Applying an atomic batch: every leaf it writes locked at once, in key order, and changed
//! only once nothing can fail any more.
//!
//! A commit attempt runs in three passes, all under the locks:
//! 1. **Lock** the leaves in key order: each lock is taken blocking, after every lower
//!    leaf's, and single-leaf operations never wait for a second leaf, so no cycle can form.
//! 2. **Plan** each leaf (`plan.rs`): the writes go into its node in place when the node has room for
//!    all of them (counted as if every record were new); else a bigger node is built, off
//!    to the side, with the writes in it (a mini-page grown, or the whole leaf as a
//!    full-page mirror). Nothing visible changes in this pass. A leaf that needs a change
//!    of structure first (its records outgrow a page, or its node's prefix no longer covers
//!    the leaf's range) gets it here, content unchanged (a split of its current records at
//!    separators chosen so the batch's records fit too); the attempt then restarts. A full
//!    buffer drops what was built and restarts after eviction.
//! 3. **Apply**: take a ticket in the batch sequence (`versions/store.rs`), save the old values if a
//!    scan may need them, write every node, append the one log record, publish the undo,
//!    release.

use std::ops::Range;

use crate::error::{Error, Result};
use crate::pool::WriteGuard;
use crate::sync;
use crate::tree::blob::Stored;
use crate::tree::blob::REF_LEN;
use crate::tree::index::Path;
use crate::tree::keyspace::user_key;
use crate::tree::stats::Event;
use crate::tree::versions::{Undo, Written};
use crate::tree::{Restart, Shared, Step};

/// A check a commit runs just before its writes take their number (a transaction's
/// validation of its reads, `Versions::record`).
pub(crate) type Check<'c> = dyn Fn(&Written<'_>) -> Result<()> + 'c;

/// One write of a batch: the stored key (keyspace prefix included) and what it does.
pub(crate) type Write = (Vec<u8>, Change);

/// What a batch does to one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// Sets the value.
    Put(Vec<u8>),
    /// Removes the key.
    Delete,
    /// Merges the operands of this encoded list (`merge.rs`) into the value.
    Merge(Vec<u8>),
}

impl Change {
    /// Bytes of its value (or operand list).
    pub(crate) fn len(&self) -> usize {
        match self {
            Change::Put(v) | Change::Merge(v) => v.len(),
            Change::Delete => 0,
        }
    }

    /// How the log's batch record holds it.
    fn logged(&self) -> crate::wal::BatchValue<'_> {
        match self {
            Change::Put(v) => crate::wal::BatchValue::Put(v),
            Change::Delete => crate::wal::BatchValue::Remove,
            Change::Merge(ops) => crate::wal::BatchValue::Merge(ops),
        }
    }
}

/// One leaf a commit attempt holds.
struct Held<'g> {
    path: Path<'g>,
    page: WriteGuard<'g>,
    /// Its writes (indices into the sorted writes).
    writes: Range<usize>,
}

/// What one commit attempt came to.
enum Attempted {
    /// Applied; the log record to wait for, if writes are logged.
    Done(Option<crate::wal::Appended>),
    /// Nothing applied: the buffer was full, with `unplanned` leaves still to plan.
    NeedSpace { unplanned: usize },
    /// Nothing applied (a leaf's structure changed): try again.
    Retry,
}

impl Shared {
    /// Applies `writes` (stored keys, any order; a key's writes apply in order, so a put
    /// or removal replaces the ones before it and a merge folds over them) atomically:
    /// readers see all of them or none, and the log holds them as one record. Waits for
    /// durability like a single write.
    ///
    /// With `check`, it runs under the version store's lock just before the writes take
    /// their number (`Versions::record`): a transaction's validation of its reads.
    ///
    /// # Errors
    /// `BatchTooLarge` past [`Limits::max_batch_len`](crate::Limits::max_batch_len); `Io`
    /// or `Corruption` from a leaf the batch must read, or from the log; the merge
    /// operator's errors (`Shared::fold`); `check`'s. Nothing is applied on any error but a failure of
    /// the log itself, after which the tree refuses every call until reopened (as for a
    /// single write).
    pub(crate) fn commit_checked(
        &self,
        mut writes: Vec<Write>,
        check: Option<&Check<'_>>,
    ) -> Result<()> {
        let merges = writes
            .iter()
            .filter(|(_, c)| matches!(c, Change::Merge(_)))
            .count() as u64;
        // A stable sort keeps a key's writes in order.
        writes.sort_by(|a, b| a.0.cmp(&b.0));
        let mut sorted: Vec<Write> = Vec::with_capacity(writes.len());
        for (key, change) in writes {
            match sorted.last_mut() {
                Some(last) if last.0 == key => {
                    let before = std::mem::replace(&mut last.1, Change::Delete);
                    last.1 = self.combine(&key, before, change)?;
                }
                _ => sorted.push((key, change)),
            }
        }
        let mut writes = sorted;
        if writes.is_empty() {
            return Ok(());
        }
        let len: u64 = writes
            .iter()
            .map(|(k, c)| crate::wal::batch_write_len(k.len(), self.stored_len(k, c)))
            .sum();
        let limit = self.limits().max_batch_len;
        if len > limit as u64 {
            return Err(Error::BatchTooLarge {
                len: usize::try_from(len).unwrap_or(usize::MAX),
                limit,
            });
        }
        self.journal().check()?;
        let extents = self.store_batch_values(&mut writes)?;
        let result = self.commit_stored(&writes, len, merges, check);
        for &start in &extents {
            // Even a failed commit may have applied them (a log that refused its record).
            self.storage().blobs().applied(start);
        }
        result
    }

    /// The bytes a batch write's value takes in the log: a value stored out of line takes
    /// its reference's.
    pub(crate) fn stored_len(&self, key: &[u8], change: &Change) -> usize {
        match change {
            Change::Put(v)
                if self
                    .storage()
                    .blobs()
                    .must_store(v, self.limits().inline_value_len(user_key(key))) =>
            {
                REF_LEN
            }
            c => c.len(),
        }
    }

    /// Writes the batch's values that go out of line to their extents, and puts their
    /// references in their place; returns the extents. On error none stays allocated.
    fn store_batch_values(&self, writes: &mut [Write]) -> Result<Vec<u64>> {
        let mut extents = Vec::new();
        for (key, change) in writes.iter_mut() {
            let Change::Put(value) = change else { continue };
            let outline = match self.store_value(user_key(key), value) {
                Ok(Stored::Inline(_)) => continue,
                Ok(Stored::Outline(r, bytes)) => (r.start, bytes),
                Err(e) => {
                    for &start in &extents {
                        self.storage().blobs().discard(start);
                    }
                    return Err(e);
                }
            };
            extents.push(outline.0);
            *value = outline.1.to_vec();
        }
        Ok(extents)
    }

    /// `commit_checked` once the writes hold what their leaves store (`len` bytes logged).
    fn commit_stored(
        &self,
        writes: &[Write],
        len: u64,
        merges: u64,
        check: Option<&Check<'_>>,
    ) -> Result<()> {
        // The log record's body, when writes are logged.
        let mut body = Vec::new();
        if self.journal().logs_writes() {
            body.reserve(len as usize);
            for (key, change) in writes {
                crate::wal::encode_batch_write(&mut body, key, change.logged());
            }
        }
        let mut spins = 0u32;
        loop {
            match self.try_commit(writes, &body, check)? {
                Attempted::Done(appended) => {
                    if merges > 0 {
                        self.counters().upserts(merges);
                    }
                    if let Some(appended) = appended {
                        self.journal().commit(appended)?;
                    }
                    return Ok(());
                }
                Attempted::NeedSpace { unplanned } => {
                    // Room for the block that was missing and for the leaves not planned
                    // yet, each of which may need one: without it, a large batch would
                    // restart once per block.
                    for _ in 0..=unplanned.min(256) {
                        self.make_room_here()?;
                    }
                }
                Attempted::Retry => self.restart(Restart::Retry, &mut spins)?,
            }
        }
    }

    /// One key's write `before` followed by `after`, as one write.
    fn combine(&self, key: &[u8], before: Change, after: Change) -> Result<Change> {
        let folded = |value: Option<Vec<u8>>| value.map_or(Change::Delete, Change::Put);
        Ok(match (before, after) {
            (_, after @ (Change::Put(_) | Change::Delete)) => after,
            (Change::Merge(mut list), Change::Merge(more)) => {
                list.extend_from_slice(&more);
                Change::Merge(list)
            }
            // A batch holds its users' values: nothing to read out of line.
            (Change::Put(v), Change::Merge(ops)) => folded(self.fold_value(key, Some(&v), &ops)?),
            (Change::Delete, Change::Merge(ops)) => folded(self.fold(key, None, &ops)?),
        })
    }

    /// One attempt at a commit (see the module docs).
    fn try_commit(
        &self,
        writes: &[Write],
        body: &[u8],
        check: Option<&Check<'_>>,
    ) -> Result<Attempted> {
        // Without a log, a checkpoint must not catch the batch half-applied (`versions/store.rs`).
        let _unlogged = (!self.journal().logs_writes()).then(|| self.versions().batch_applying());
        let guard = sync::pin();
        let Some(mut held) = self.lock_leaves(&guard, writes) else {
            return Ok(Attempted::Retry);
        };
        let mut plans = Vec::with_capacity(held.len());
        let mut retry = false;
        let count = held.len();
        for (i, h) in held.iter_mut().enumerate() {
            match self.plan_leaf(&h.path, &mut h.page, &writes[h.writes.clone()])? {
                Step::Done(plan) => plans.push(plan),
                // Keep preparing the other leaves: one restart serves them all.
                Step::Restart(Restart::Retry) => retry = true,
                Step::Restart(Restart::NeedSpace) => {
                    return Ok(Attempted::NeedSpace {
                        unplanned: count - i - 1,
                    });
                }
            }
        }
        if retry {
            return Ok(Attempted::Retry);
        }
        let capture = |held: &[Held<'_>]| -> Result<Undo> {
            let mut undo: Undo = Vec::with_capacity(writes.len());
            for h in held {
                for (key, _) in &writes[h.writes.clone()] {
                    undo.push((key.clone(), self.value_in_leaf(&h.path, &h.page, key)?));
                }
            }
            Ok(undo)
        };
        // While a snapshot or a transaction is open, the writes take their number and save
        // what they replace under the version store's lock, where a transaction's commit
        // also checks its reads (`versions/store.rs`); else a lock-free number, and the
        // undo only for scans in progress.
        let (ticket, undo) = if check.is_some() || self.versions().versioning() {
            let undo = capture(&held)?;
            let pin = self.pin_for(&undo);
            self.versions()
                .record(undo, pin, |w| check.map_or(Ok(()), |c| c(w)))?;
            (None, None)
        } else {
            let ticket = self.versions().ticket();
            let undo = ticket.save_undo().then(|| capture(&held)).transpose()?;
            (Some(ticket), undo)
        };
        // Nothing below fails before the log is asked.
        let mut emptied = Vec::new();
        for (i, (h, plan)) in held.iter_mut().zip(plans).enumerate() {
            if self.apply_plan(&mut h.page, plan) {
                emptied.push(i);
            }
        }
        self.counters().writes(writes.len() as u64);
        self.counters().count(Event::Batch);
        let appended = self.journal().append_batch(body);
        if let (Some(ticket), Some(undo)) = (ticket, undo) {
            let pin = self.pin_for(&undo);
            self.versions().publish(&ticket, undo, pin);
        }
        // Emptied mirrors leave the tree, as after a single removal.
        for i in emptied.into_iter().rev() {
            let h = held.swap_remove(i);
            let key = &writes[h.writes.start].0;
            self.remove_empty_leaf(key, h.page);
        }
        drop(held);
        Ok(Attempted::Done(appended?))
    }

    /// Write-locks the leaves that own `writes`, in key order. `None` when a leaf already
    /// held turned out to own more of the keys (a neighbour was removed): the caller starts
    /// again, so every leaf's writes lie within the bounds its path gives.
    fn lock_leaves<'g>(
        &'g self,
        guard: &'g sync::EpochGuard,
        writes: &[Write],
    ) -> Option<Vec<Held<'g>>> {
        let mut held: Vec<Held<'g>> = Vec::new();
        let mut i = 0;
        while i < writes.len() {
            let key = &writes[i].0;
            let (path, page) = match held.last() {
                None => self.index().write_leaf(self.pool(), guard, key),
                Some(last) => {
                    self.index()
                        .write_leaf_unless(self.pool(), guard, key, last.page.page_id())?
                }
            };
            let mut high = Vec::new();
            let end = if path.high_into(&mut high) {
                i + writes[i..].partition_point(|w| w.0 < high)
            } else {
                writes.len()
            };
            held.push(Held {
                path,
                page,
                writes: i..end,
            });
            i = end;
        }
        Some(held)
    }
}
