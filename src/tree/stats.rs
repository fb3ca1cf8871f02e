//! Counters of what the tree did: cheap relaxed atomics, always on.

use crate::sync::{AtomicU64, Ordering};

use crate::tree::Shared;

/// A snapshot of a tree's counters since it was opened (see [`Tree::stats`](crate::Tree::stats)).
///
/// ```
/// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
/// let before = tree.stats();
/// tree.insert(b"k", b"v")?;
/// tree.get(b"k")?;
/// let after = tree.stats();
/// assert_eq!(after.cache_hits - before.cache_hits, 1);
/// # Ok::<(), bfkv::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Lookups (and scanned leaves) answered from memory: a mini-page record or a mirror.
    pub cache_hits: u64,
    /// Lookups (and scanned leaves) that had to read the leaf from disk.
    pub cache_misses: u64,
    /// Records (or known-absent keys) cached in a mini-page after a disk read.
    pub promotions: u64,
    /// Mini-pages merged with their leaf into a full-page mirror.
    pub merges: u64,
    /// Mini-pages, and mirrors in blocks smaller than a page, moved to a larger block.
    pub mini_grows: u64,
    /// Mini-pages copied to the tail of the buffer from its copy-on-access region.
    pub copied_to_tail: u64,
    /// Clean full-page mirrors that, touched in the copy-on-access region, kept only their
    /// recently read records (as a mini-page) or left memory when none was read.
    pub mirrors_shrunk: u64,
    /// Scanned leaves kept in memory as full-page mirrors.
    pub scan_mirrors: u64,
    /// Leaves a lookup read from disk and kept in memory whole, as mirrors: what a miss
    /// caches while the cache can hold every leaf (otherwise it caches its record, counted
    /// in `promotions`).
    pub leaves_cached: u64,
    /// Leaves written back to disk (by eviction or checkpoint).
    pub write_backs: u64,
    /// Leaf splits.
    pub splits: u64,
    /// Emptied leaves removed from the tree.
    pub leaves_removed: u64,
    /// Leaves rewritten from their cached records because their page failed its checksum
    /// (the leaf stays marked damaged: its other keys answer `Corruption`).
    pub leaves_salvaged: u64,
    /// Blocks evicted from the buffer.
    pub evictions: u64,
    /// Of those, the evictions an operation made on its own thread because it found the
    /// buffer full; the evictor threads made the rest. Many of these mean the evictors do not
    /// keep up (see [`Config::evictor_threads`](crate::Config::evictor_threads)).
    pub foreground_evictions: u64,
    /// Atomic batches applied ([`Batch::commit`](crate::Batch::commit)).
    pub batches: u64,
    /// Merge operands applied ([`Tree::merge`](crate::Tree::merge) and the merges of
    /// batches): buffered blind, or folded at once where the value was in memory.
    pub upserts: u64,
    /// Pages read from the data file.
    pub pages_read: u64,
    /// Pages written to the data file.
    pub pages_written: u64,
    /// Data-file syncs (fdatasync).
    pub data_syncs: u64,
    /// Data-file pages holding leaves or store metadata.
    pub disk_pages_in_use: u64,
    /// Data-file pages free for reuse.
    pub disk_pages_free: u64,
    /// Completed checkpoints.
    pub checkpoints: u64,
    /// Writes (inserts and removes) applied to a mini-page or mirror.
    pub writes_buffered: u64,
    /// Log records appended.
    pub log_appends: u64,
    /// Log syncs (fdatasync): group commit makes this smaller than the writes under `Sync`.
    pub log_syncs: u64,
    /// Log records replayed when the tree was opened.
    pub replayed: u64,
    /// Values written out of line, to the blob file.
    pub blobs_written: u64,
    /// Bytes of those values.
    pub blob_bytes_written: u64,
    /// Values read from the blob file.
    pub blobs_read: u64,
    /// Bytes of those values.
    pub blob_bytes_read: u64,
    /// Blob-file extents in use: values stored out of line, and ones written whose
    /// reference a checkpoint has not yet found unreferenced.
    pub blob_extents: u64,
    /// Bytes of the blob file those extents take (whole 4 KiB blocks).
    pub blob_bytes_in_use: u64,
    /// Bytes of the blob file free for reuse.
    pub blob_bytes_free: u64,
    /// Snapshots and transactions open now.
    pub snapshots_open: u64,
    /// Bytes the old values kept for open snapshots and transactions take now (estimated;
    /// bounded by [`Config::max_snapshot_bytes`](crate::Config::max_snapshot_bytes)).
    pub snapshot_bytes: u64,
    /// Snapshots and transactions made too old, so far, to keep within that bound.
    pub snapshots_too_old: u64,
    /// Transactions committed.
    pub transactions: u64,
    /// Transaction commits refused with [`Error::Conflict`](crate::Error::Conflict).
    pub conflicts: u64,
    /// Transactions [`Tree::transact`](crate::Tree::transact) ran again after a conflict.
    pub retries: u64,
}

/// Stripes of the per-operation counters.
const STRIPES: usize = 8;

/// The counters bumped by (nearly) every operation, one set per stripe on its own cache
/// lines: a single shared counter had every thread's get and write bounce one line between
/// the cores (2-thread in-memory updates ran ~17 % slower when the rest of `Shared` moved
/// next to it).
#[derive(Default)]
#[repr(align(128))]
struct Hot {
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
    promotions: AtomicU64,
    writes_buffered: AtomicU64,
    upserts: AtomicU64,
}

/// Something the tree did, for [`Counters::count`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// A lookup (or scanned leaf) answered from memory.
    CacheHit,
    /// A lookup (or scanned leaf) that read its leaf from disk.
    CacheMiss,
    /// A record or known-absent key cached after a disk read.
    Promotion,
    /// A write applied to a mini-page or mirror.
    WriteBuffered,
    /// A mini-page merged with its leaf into a mirror.
    Merge,
    /// A mini-page moved to a larger block.
    MiniGrow,
    /// A mini-page copied to the tail from the copy-on-access region.
    CopiedToTail,
    /// A clean mirror shrunk to its referenced records (or dropped).
    MirrorShrunk,
    /// A scanned leaf kept as a mirror.
    ScanMirror,
    /// A leaf a lookup read kept whole, as a mirror.
    LeafCached,
    /// A leaf written back to disk.
    WriteBack,
    /// A leaf split.
    Split,
    /// An emptied leaf removed from the tree.
    LeafRemoved,
    /// A damaged leaf rewritten from its cached records.
    Salvage,
    /// A completed checkpoint.
    Checkpoint,
    /// An eviction made by an operation that found the buffer full.
    ForegroundEviction,
    /// An atomic batch applied.
    Batch,
    /// A transaction committed.
    Transaction,
    /// A transaction's commit refused as a conflict.
    Conflict,
    /// A transaction run again after a conflict.
    Retry,
}

/// The live counters behind [`Stats`]: relaxed atomics, bumped through [`Counters::count`].
#[derive(Default)]
pub(crate) struct Counters {
    /// Per-operation counters, striped by thread.
    hot: [Hot; STRIPES],
    merges: AtomicU64,
    mini_grows: AtomicU64,
    copied_to_tail: AtomicU64,
    mirrors_shrunk: AtomicU64,
    scan_mirrors: AtomicU64,
    leaves_cached: AtomicU64,
    write_backs: AtomicU64,
    splits: AtomicU64,
    leaves_removed: AtomicU64,
    leaves_salvaged: AtomicU64,
    checkpoints: AtomicU64,
    replayed: AtomicU64,
    foreground_evictions: AtomicU64,
    batches: AtomicU64,
    transactions: AtomicU64,
    conflicts: AtomicU64,
    retries: AtomicU64,
    blobs_written: AtomicU64,
    blob_bytes_written: AtomicU64,
    blobs_read: AtomicU64,
    blob_bytes_read: AtomicU64,
}

impl Counters {
    /// Counts one `event`.
    #[inline]
    pub(crate) fn count(&self, event: Event) {
        let counter = match event {
            Event::CacheHit => &self.hot().cache_hits,
            Event::CacheMiss => &self.hot().cache_misses,
            Event::Promotion => &self.hot().promotions,
            Event::WriteBuffered => &self.hot().writes_buffered,
            Event::Merge => &self.merges,
            Event::MiniGrow => &self.mini_grows,
            Event::CopiedToTail => &self.copied_to_tail,
            Event::MirrorShrunk => &self.mirrors_shrunk,
            Event::ScanMirror => &self.scan_mirrors,
            Event::LeafCached => &self.leaves_cached,
            Event::WriteBack => &self.write_backs,
            Event::Split => &self.splits,
            Event::LeafRemoved => &self.leaves_removed,
            Event::Salvage => &self.leaves_salvaged,
            Event::Checkpoint => &self.checkpoints,
            Event::ForegroundEviction => &self.foreground_evictions,
            Event::Batch => &self.batches,
            Event::Transaction => &self.transactions,
            Event::Conflict => &self.conflicts,
            Event::Retry => &self.retries,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `n` merge operands applied.
    pub(crate) fn upserts(&self, n: u64) {
        self.hot().upserts.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts `n` writes applied at once (a batch's).
    pub(crate) fn writes(&self, n: u64) {
        self.hot().writes_buffered.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts `n` log records replayed at open.
    pub(crate) fn replayed(&self, n: u64) {
        self.replayed.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a value of `len` bytes written to the blob file.
    pub(crate) fn blob_written(&self, len: u64) {
        self.blobs_written.fetch_add(1, Ordering::Relaxed);
        self.blob_bytes_written.fetch_add(len, Ordering::Relaxed);
    }

    /// Counts a value of `len` bytes read from the blob file.
    pub(crate) fn blob_read(&self, len: u64) {
        self.blobs_read.fetch_add(1, Ordering::Relaxed);
        self.blob_bytes_read.fetch_add(len, Ordering::Relaxed);
    }

    /// Writes applied so far, over every thread.
    pub(crate) fn writes_buffered(&self) -> u64 {
        self.sum(|h| &h.writes_buffered)
    }

    /// This thread's stripe of the per-operation counters.
    #[inline]
    fn hot(&self) -> &Hot {
        &self.hot[crate::pool::my_shard() % STRIPES]
    }

    /// The sum of one per-operation counter over the stripes.
    fn sum(&self, field: impl Fn(&Hot) -> &AtomicU64) -> u64 {
        self.hot
            .iter()
            .map(|h| field(h).load(Ordering::Relaxed))
            .sum()
    }
}

impl Shared {
    pub(crate) fn stats(&self) -> Stats {
        let c = self.counters();
        let store = self.storage().stats();
        let log = self.journal().stats();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (blocks_used, blocks_free, extents) = self.storage().blobs().usage();
        let block = crate::store::BLOB_BLOCK;
        let versions = self.versions().stats();
        Stats {
            cache_hits: c.sum(|h| &h.cache_hits),
            cache_misses: c.sum(|h| &h.cache_misses),
            promotions: c.sum(|h| &h.promotions),
            merges: get(&c.merges),
            mini_grows: get(&c.mini_grows),
            copied_to_tail: get(&c.copied_to_tail),
            mirrors_shrunk: get(&c.mirrors_shrunk),
            scan_mirrors: get(&c.scan_mirrors),
            leaves_cached: get(&c.leaves_cached),
            write_backs: get(&c.write_backs),
            splits: get(&c.splits),
            leaves_removed: get(&c.leaves_removed),
            leaves_salvaged: get(&c.leaves_salvaged),
            evictions: self.pool().stats().evictions,
            foreground_evictions: get(&c.foreground_evictions),
            batches: get(&c.batches),
            upserts: c.sum(|h| &h.upserts),
            pages_read: store.reads,
            pages_written: store.writes,
            data_syncs: store.syncs,
            disk_pages_in_use: store.allocated_pages,
            disk_pages_free: store.free_pages,
            checkpoints: get(&c.checkpoints),
            writes_buffered: c.writes_buffered(),
            log_appends: log.appends,
            log_syncs: log.syncs,
            replayed: get(&c.replayed),
            blobs_written: get(&c.blobs_written),
            blob_bytes_written: get(&c.blob_bytes_written),
            blobs_read: get(&c.blobs_read),
            blob_bytes_read: get(&c.blob_bytes_read),
            blob_extents: extents as u64,
            blob_bytes_in_use: blocks_used * block,
            blob_bytes_free: blocks_free * block,
            snapshots_open: versions.open,
            snapshot_bytes: versions.bytes,
            snapshots_too_old: versions.too_old,
            transactions: get(&c.transactions),
            conflicts: get(&c.conflicts),
            retries: get(&c.retries),
        }
    }
}
