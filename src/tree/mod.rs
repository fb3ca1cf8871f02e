//! The tree core: which leaf owns a key, the leaves' cached nodes, writing them back,
//! persistence, and the background threads. The components, each in its own file with
//! private state and a small set of methods, and how they meet:
//!
//! | component | files | owns | called through |
//! |---|---|---|---|
//! | index | `index.rs`, `inner.rs` | the inner nodes (RCU root), the structure lock and version | `Index::read_leaf` / `write_leaf` (locate and lock a leaf), `try_smo` / `lock_smo`, `Shared::publish` (a split or removal) |
//! | leaf cache | `pool/` (the buffer and mapping table), `leaf.rs`, `mirror.rs`, `admit.rs` | mini-pages and full-page mirrors, what a miss caches | `Shared::get_in_leaf`, `write_in_leaf`, `copy_to_tail` |
//! | write-back and eviction | `evict.rs`, `page_batch.rs`, `checkpoint.rs`, `clean.rs` | turning a cached leaf into a disk page | the pool's eviction callback (`Shared::evict_block`), `write_back`, checkpoint passes |
//! | storage | `storage.rs`, `pages.rs` | the data file, which pages hold what | `Storage::read_page`, `write_new_page`, `moved`, `supersede`; `PageTracker` |
//! | journal | `journal.rs` | the write-ahead log, the checkpoint LSN | `Journal::append` (under the leaf lock), `commit`, `replay` |
//! | persistence | `persist.rs`, `tree_dir.rs` | open (what a path must hold to be opened), recovery, the checkpoint file, the directory lock | `persist::open`, `Shared::checkpoint` |
//! | background | `background.rs` | evictor and checkpointer threads | `Shared::nudge_evictors`, `Background::nudge_checkpointer` |
//! | counters | `stats.rs` | what the tree did | `Counters::count(Event)` |
//! | batches | `batch.rs`, `commit.rs`, `rewind.rs` | the public `Batch`, its commit, the batch sequence | `Shared::commit_batch`, `Rewind::begin_scan` / `rewind` |
//! | large values | `blob.rs`, `outline.rs` | the blob file's extents in use (in `Storage`), pins | `Shared::store_value` / `settle` (writes), `resolve_found` / `user_value` (reads), `Blobs::page_written`, `table`, `checkpointed`, `claim` |
//! | bulk load | `bulk.rs` | nothing between calls | `Shared::bulk_load_in` (writes leaf pages, installs them with `Shared::publish`, checkpoints) |
//!
//! `shared.rs` composes them into `Shared`, the state every handle, iterator and background
//! thread of one open tree shares; `api.rs` is the public [`Tree`] over it, `scan.rs` the
//! public [`Range`].
//!
//! Locking, in one place (the invariants every file here relies on):
//! - A leaf and its mini-page are protected by the leaf's lock in the mapping table
//!   (`pool`). Every access to a mini-page's bytes or a leaf's disk page happens under it.
//! - Inner nodes are immutable; structure changes (leaf split, leaf removal) build a new root
//!   and publish it under the structure lock, then bump the structure version before the
//!   leaf lock of the changed leaf is released (`index.rs`). A reader reads the version,
//!   walks down, locks the leaf, and re-reads the version: if it moved, it walks the current
//!   root again, and keeps the leaf if that walk reaches it (only a change of the leaf itself,
//!   made under its lock, takes keys from it); otherwise it unlocks and goes to the new one.
//! - Lock order: leaf lock, then the structure lock. A thread that holds a leaf lock only
//!   ever *tries* the structure lock; when that fails it releases everything and restarts.
//!   Only a batch commit (`commit.rs`) waits for a leaf lock while holding others, and it
//!   takes them in key order.
//!   So the holder of the structure lock (a checkpoint) may block on leaf locks without
//!   deadlock.
//! - Nobody evicts while holding a leaf lock: an operation that cannot allocate releases its
//!   locks, evicts one block, and restarts ([`Restart`]).

mod admit;
mod api;
mod background;
mod backup;
mod backup_target;
mod batch;
mod blob;
mod bulk;
mod catalog;
#[cfg(any(test, fuzzing, bfkv_internals))]
mod census;
#[cfg(any(test, fuzzing, bfkv_internals))]
mod check;
mod checkpoint;
mod checkpoint_file;
mod clean;
mod commit;
mod copied;
#[cfg(any(all(test, not(shuttle)), fuzzing, bfkv_internals))]
pub(crate) mod crash;
mod evict;
#[cfg(all(test, not(shuttle)))]
mod fault_tests;
mod index;
mod inner;
mod journal;
mod keyspace;
mod leaf;
#[cfg(all(test, not(shuttle)))]
mod lost_write_tests;
mod merge;
mod mirror;
mod multi;
mod optimistic;
mod outline;
mod page_batch;
mod pages;
mod persist;
#[cfg(all(test, not(shuttle)))]
mod power_tests;
mod prefix;
mod readahead;
mod rewind;
mod scan;
mod scan_buffers;
mod scan_locked;
mod shared;
#[cfg(all(test, shuttle))]
mod shuttle_mirror_tests;
#[cfg(all(test, shuttle))]
mod shuttle_tests;
mod stats;
mod storage;
#[cfg(test)]
mod tests;
mod tree_dir;
mod whole_leaves;

pub use api::Tree;
pub use batch::Batch;
#[cfg(any(fuzzing, bfkv_internals))]
pub use census::Census;
pub use keyspace::Keyspace;
pub use scan::Range;
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
