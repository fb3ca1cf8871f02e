//! The tree core: which leaf owns a key, the leaves' cached nodes, writing them back,
//! persistence, and the background threads. One folder per component, each with private
//! state and a small set of items its `mod.rs` exposes to the others:
//!
//! | component | folder or file | owns | called through |
//! |---|---|---|---|
//! | index | `index/` | the inner nodes (RCU root), the structure lock and version | `Index::read_leaf` / `write_leaf` (locate and lock a leaf), `try_smo` / `lock_smo`, `Shared::publish` (a split or removal) |
//! | leaf cache | `cache/`, and the pool (`crate::pool`: the buffer and mapping table) | mini-pages and full-page mirrors, lookups in a locked leaf, what a miss caches | `Shared::get_in_leaf`, `write_in_leaf`, `copy_to_tail` |
//! | reads | `read/` | the public [`Range`], scans' copies of leaves, lock-free lookups and refills, `get_many` | `Range::new`, `Shared::get_into`, `get_many_in` |
//! | write-back and eviction | `writeback/` | turning a cached leaf into a disk page | the pool's eviction callback (`Shared::evict_block`), `write_back`, checkpoint passes |
//! | storage | `storage/` | the data file, which pages hold what | `Storage::read_page`, `write_new_page`, `moved`, `supersede`; `PageTracker` |
//! | persistence | `persist/` | the write-ahead log as the tree uses it, open (what a path must hold to be opened) and recovery, the checkpoint file, backups, the directory lock | `Journal::append` (under the leaf lock), `commit`, `replay`; `persist::open`, `Shared::checkpoint`, `Shared::backup` |
//! | batches | `batch/` | a batch's commit under the locks of its leaves | `Shared::commit_checked` |
//! | versions | `versions/` | the write sequence, who reads at which point of it, the old values they need | `Versions::begin_scan` / `rewind` |
//! | large values | `blob/` | the blob file's extents in use (in `Storage`), pins | `Shared::store_value` / `settle` (writes), `resolve_found` / `user_value` (reads), `Blobs::page_written`, `table`, `checkpointed`, `claim` |
//! | keyspaces | `keyspace/` | a keyspace's identity, gate and key prefix | `Space::enter`, `Prefix::key`, `Shared::put_in` / `get_in` ... |
//! | public handles | `api/` | [`Tree`], [`Keyspace`], [`Batch`] | the crate's API |
//! | catalog | `catalog.rs` | which keyspace name has which id, drops | `Shared::keyspace_named`, `drop_keyspace`, `finish_drops` |
//! | merges | `merge.rs` | operand lists, folding them with the merge operator | `Shared::fold`, `merge_in` |
//! | bulk load | `bulk.rs` | nothing between calls | `Shared::bulk_load_in` (writes leaf pages, installs them with `Shared::publish`, checkpoints) |
//! | background | `background.rs` | evictor and checkpointer threads | `Shared::nudge_evictors`, `Background::nudge_checkpointer` |
//! | counters | `stats.rs` | what the tree did | `Counters::count(Event)` |
//!
//! `shared.rs` composes them into `Shared`, the state every handle, iterator and background
//! thread of one open tree shares. Dependencies run one way: a scan depends on keyspaces and
//! on the batch undo, never the reverse, and no two files import each other, directly or
//! around a circle (`Shared`, which every component extends with its methods, aside).
//! `census.rs` and `check.rs` (diagnosis and the structural checker) and `tests/` are built
//! for tests and fuzzing only.
//!
//! Locking, in one place (the invariants every file here relies on):
//! - A leaf and its mini-page are protected by the leaf's lock in the mapping table
//!   (`pool`). Every access to a mini-page's bytes or a leaf's disk page happens under it.
//! - Inner nodes are immutable; structure changes (leaf split, leaf removal) build a new root
//!   and publish it under the structure lock, then bump the structure version before the
//!   leaf lock of the changed leaf is released (`index/root.rs`). A reader reads the version,
//!   walks down, locks the leaf, and re-reads the version: if it moved, it walks the current
//!   root again, and keeps the leaf if that walk reaches it (only a change of the leaf itself,
//!   made under its lock, takes keys from it); otherwise it unlocks and goes to the new one.
//! - Lock order: leaf lock, then the structure lock. A thread that holds a leaf lock only
//!   ever *tries* the structure lock; when that fails it releases everything and restarts.
//!   Only a batch commit (`batch/commit.rs`) waits for a leaf lock while holding others, and it
//!   takes them in key order.
//!   So the holder of the structure lock (a checkpoint) may block on leaf locks without
//!   deadlock.
//! - Nobody evicts while holding a leaf lock: an operation that cannot allocate releases its
//!   locks, evicts one block, and restarts ([`Restart`]).

mod api;
mod background;
mod batch;
mod blob;
mod bulk;
mod cache;
mod catalog;
#[cfg(any(test, fuzzing, bfkv_internals))]
mod census;
#[cfg(any(test, fuzzing, bfkv_internals))]
mod check;
mod index;
mod keyspace;
mod merge;
pub(crate) mod persist;
mod read;
mod shared;
mod stats;
mod storage;
#[cfg(test)]
mod tests;
mod versions;
mod writeback;

pub use api::{Batch, Keyspace, Snapshot, Transaction, TransactionRange, Tree};
#[cfg(any(fuzzing, bfkv_internals))]
pub use census::Census;
pub use read::Range;
pub use stats::Stats;

use crate::error::Result;
use shared::Shared;

/// The disk page of a leaf that has never been written (the largest a mapping entry holds;
/// the store never allocates it).
const NO_PAGE: u64 = crate::pool::MAX_DISK_PAGE;

/// Node flag (tree-owned bit of the node header): a full-page mirror that differs from disk.
const FLAG_DIRTY: u8 = 1 << 2;

/// Node flag of a leaf page: written in place of a page that failed its checksum, so it
/// holds only the records that were cached when the damage was found (`evict.rs`,
/// "salvage"). A key it lacks may have been lost: a lookup that misses it, and any scan
/// through it, answer `Corruption`. The flag passes to every later version of the leaf.
const FLAG_DAMAGED: u8 = 1 << 3;

/// A key and its value, as a scan copies and yields them.
pub(crate) type KeyValue = (Vec<u8>, Vec<u8>);

/// What a write does to its key.
#[derive(Clone, Copy)]
pub(crate) enum WriteOp<'a> {
    /// Sets the value.
    Put(&'a [u8]),
    /// Removes the key.
    Delete,
    /// Merges the operands of this encoded list (`merge.rs`) into the value, in order.
    Merge(&'a [u8]),
}

/// Why an attempt at an operation must be restarted after releasing every lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Restart {
    /// The buffer is full: evict, then retry.
    NeedSpace,
    /// The structure lock is busy or the structure changed: retry.
    Retry,
}

/// What one attempt under a leaf lock came to, when it did not fail: done with `T`, or to be
/// restarted from the root once every lock is released. Failures a caller can act on are the
/// `Err` of the [`Attempt`] around it.
#[must_use]
pub(crate) enum Step<T> {
    /// The operation is done.
    Done(T),
    /// Nothing changed; release the locks, deal with the reason, and try again.
    Restart(Restart),
}

impl<T> Step<T> {
    /// After a change of structure that kept the content (a split, a rebuild): the
    /// operation it served must restart from the root, whose route may have changed.
    pub(crate) fn then_retry<U>(self) -> Step<U> {
        match self {
            Step::Done(_) => Step::Restart(Restart::Retry),
            Step::Restart(r) => Step::Restart(r),
        }
    }
}

/// Result of one attempt: an error, or a [`Step`].
pub(crate) type Attempt<T> = Result<Step<T>>;
