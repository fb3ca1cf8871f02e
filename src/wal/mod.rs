//! The write-ahead log: every insert and remove is appended here before it is acknowledged,
//! so that recovery can replay what the last checkpoint does not hold (DESIGN.md,
//! Durability).
//!
//! # Use
//! A writer calls [`Wal::append`] while it holds the page lock (so the log order of a key's
//! operations is their apply order), releases the lock, then calls [`Wal::commit`] with
//! what `append` returned; under `Durability::Sync` commit returns once the record is `fdatasync`ed,
//! under `Durability::Buffered` once it reached the OS (a background thread syncs every
//! `flush_interval`). Recovery: [`Wal::open`], then [`Wal::replay`] from the checkpoint
//! LSN, before any append. After a checkpoint covering LSNs below `c` is durable,
//! [`Wal::release_before`]`(c)` deletes the segments it made useless.
//!
//! # LSNs
//! An LSN is the logical byte offset of a record in the log: the sum of the lengths of all
//! records before it (segment headers and the unused end of a full segment do not count).
//! LSNs grow strictly but are not dense; `next_lsn() - lsn` is the log's size since `lsn`.
//! A record's LSN is not stored, only checksummed: the reader knows the LSN of the position
//! it reads at, so a record copied to the wrong place (a stale one in a reused file, say)
//! never decodes.
//!
//! # Group commit
//! Under `Sync`, appends only copy the record into a shared buffer (one short mutex, no
//! system call), and one committer at a time is the leader: it writes the whole buffer with
//! `pwrite` and issues one `fdatasync` covering every record appended so far, holding no
//! lock appends need. The other committers park; the leader wakes them all when its sync is
//! done, those it covered return at once, and one of the rest leads the next round for
//! everything appended meanwhile. Under `Buffered`, an append reserves room in the staging
//! ring, a file of the log directory mapped into memory, with one compare-and-swap and
//! encodes the record there, with no lock (`ring`): the record has reached the OS when
//! `append` returns (the page cache outlives the process), and its commit does nothing. The
//! background flusher writes the ring's records into the segments with `pwrite` and syncs
//! them every `flush_interval`; recovery writes what a crashed process left in its ring into
//! the segments first. Without a ring (off Linux, `log_staging_size(0)`, or on the test
//! file system), records go through the buffer and their commit writes them out. Nothing
//! under `Buffered` waits for a sync.
//!
//! # On-disk format (all integers little-endian)
//! Segment files `wal-<first LSN as 16 lowercase hex digits>.log`, each preallocated to its
//! segment size. Header, 64 bytes at offset 0:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `BFKVWAL\0` |
//! | 8 | 4 | format version (2) |
//! | 12 | 4 | zero |
//! | 16 | 8 | segment size in bytes, header included (4 KiB ..= 4 GiB) |
//! | 24 | 8 | LSN of the segment's first record |
//! | 32 | 4 | crc32c of bytes 0..32 |
//! | 36 | 12 | synced mark slot 0: an LSN below which the records were synced (8 bytes) and a crc32c of the first LSN and that LSN (4); zeros for none |
//! | 48 | 12 | synced mark slot 1, the same; marks go to the slots in turn, and the higher valid one counts, so a torn mark write loses only itself |
//! | 60 | 4 | boot tag of the run that created the segment or last opened it (`LogFs::boot`; 0 for none) |
//!
//! Beside the segments, the file `synced` holds the active segment's synced end as of the
//! last sync: two 12-byte slots at offsets 0 and 16, each a mark as in the header (which
//! names its segment through the first LSN its checksum covers), written in turn.
//!
//! Records follow from offset 64, back to back, never across segments:
//!
//! | size | field |
//! |---|---|
//! | 4 | crc32c of the record's LSN (8 bytes, little-endian) followed by the rest of the record |
//! | 1 | operation: 1 insert, 2 remove (never 0, so zeros are never a record) |
//! | 1..=5 | key length `k`, LEB128 (7 bits a byte, low bits first) |
//! | 1..=5 | value length `v`, LEB128 (0 for remove) |
//! | k | key |
//! | v | value |
//!
//! A 16-byte key with a 16-byte value takes 39 bytes. Every byte counts because the log's
//! bytes are what a `Buffered` write pays for: version 1 stored a fixed 25-byte head, the
//! LSN included, 57 bytes for the same record, and YCSB-A in memory ran at 0.825 of `None`'s
//! throughput with it against 0.861 with this (measured in commit `1a93466`).
//!
//! A record advances the LSN by the bytes it takes. The log ends at the first
//! position holding zeros (preallocated space), the end of the file, too little room for a
//! record, or bytes that fail any check above. Every segment is synced before the next one
//! is created, so damage before the last segment is `Error::Corruption`, never cut. In the
//! last segment, open tells a torn tail (cut there, durably) from damage (`Corruption` with
//! the file and the byte offset of the record that failed):
//! - **Below the synced mark** a record that fails is damage: its records were synced. Every
//!   sync writes the mark into the side file `synced` (one `pwrite`, never synced itself:
//!   within a boot the page cache holds it, so after a crash of the process the mark covers
//!   every record a `Sync` commit acknowledged), and every 1 MiB of log into the segment
//!   header, where the next sync makes it durable with the records; a mark is only ever
//!   written after its sync, so any mark found is true, after a power cut too. A clean close
//!   and every open mark the log's end and sync it. Writing the header at every sync would
//!   add a page to every `fdatasync` (4-12 % on each sync here).
//! - **Past the mark**, records that verify after the failed one prove damage when the
//!   segment was written on this boot (its header's boot tag): a record's LSN is folded into
//!   its checksum, so one that verifies was written there, and within a boot a crash leaves
//!   only a prefix of its last write, never written bytes after a torn record. What counts
//!   as proof, and why a torn tail almost never shows one (below 2^-18 for a 1 MiB torn
//!   record), is in `damage`. Across a restart unsynced pages may have reached the disk in
//!   any order, so past the mark the first failure is cut.
//! - A damaged last record, with nothing after it that could verify, reads as a torn tail
//!   unless a mark covers it.
//!
//! The `Buffered` staging ring tells the two apart by what was published (`ring`).

mod damage;
mod format;
#[cfg(any(all(test, not(shuttle)), fuzzing, bfkv_internals))]
mod fuzz;
mod log;
#[cfg(any(all(test, not(shuttle)), fuzzing, bfkv_internals))]
pub(crate) mod memfs;
mod ring;
mod segment;
pub(crate) mod vfs;
mod writer;

#[cfg(all(test, shuttle))]
mod shuttle_tests;
#[cfg(all(test, not(shuttle)))]
mod tests;
#[cfg(all(test, not(shuttle)))]
mod tests_crash;
#[cfg(all(test, not(shuttle)))]
mod tests_tail;

pub(crate) use format::{batch_write_len, batch_writes, encode_batch_write, BatchValue};
#[cfg(any(fuzzing, bfkv_internals))]
pub(crate) use fuzz::decode_check;
pub(crate) use log::Wal;
pub(crate) use segment::clear_boot_tag;

/// A log sequence number: the logical byte offset of a record in the log.
pub(crate) type Lsn = u64;

/// A record [`Wal::append`] took: its LSN, for [`Wal::commit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "an appended record is acknowledged only after `Wal::commit`"]
pub(crate) struct Appended {
    /// The record's LSN.
    pub(crate) lsn: Lsn,
    /// The record and every one before it reached the OS already (a `Buffered` append
    /// through the staging ring): a `Buffered` commit has nothing left to do, and checks
    /// nothing shared.
    pub(super) reached_os: bool,
}

/// One logged operation, borrowed from the caller (append) or from the log (replay).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogOp<'a> {
    /// The key now has this value.
    Insert {
        /// The key.
        key: &'a [u8],
        /// Its new value.
        value: &'a [u8],
    },
    /// The key is absent.
    Remove {
        /// The key.
        key: &'a [u8],
    },
    /// Writes applied together, all or none (`format::encode_batch_write` builds the body,
    /// `format::batch_writes` reads it).
    Batch {
        /// The encoded writes.
        body: &'a [u8],
    },
    /// Merge operands for the key (blind: applied over whatever value the key has).
    Merge {
        /// The key.
        key: &'a [u8],
        /// Its operand list (`tree/merge.rs` encodes it).
        operands: &'a [u8],
    },
}

/// How the log is kept.
#[derive(Debug, Clone)]
pub(crate) struct WalConfig {
    /// Size of each segment file, header included (default 64 MiB; 4 KiB ..= 4 GiB).
    pub(crate) segment_size: u64,
    /// `Sync` or `Buffered` (`None` has no log and is refused by [`Wal::open`]).
    pub(crate) durability: crate::Durability,
    /// How often the background thread syncs the log under `Buffered` (default 5 ms).
    pub(crate) flush_interval: std::time::Duration,
    /// Bytes of the `Buffered` staging ring (a power of two, a multiple of the page size;
    /// default 8 MiB; 0 for none: appends then go through the append buffer).
    pub(crate) ring_capacity: u64,
}

impl Default for WalConfig {
    fn default() -> Self {
        WalConfig {
            segment_size: 64 << 20,
            durability: crate::Durability::Buffered,
            flush_interval: std::time::Duration::from_millis(5),
            // At ~3M records a second of 39 bytes, about 70 ms of records: many flush
            // intervals.
            ring_capacity: crate::config::DEFAULT_LOG_STAGING_SIZE as u64,
        }
    }
}

/// Counters of a log since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WalStats {
    /// Records appended.
    pub(crate) appends: u64,
    /// Bytes of records appended.
    pub(crate) bytes: u64,
    /// `pwrite` calls writing records into segments (from the buffer or the ring).
    pub(crate) writes: u64,
    /// `fdatasync` calls (commits, flushes, background syncs and segment switches).
    pub(crate) syncs: u64,
    /// Segment files in use.
    pub(crate) segments: u64,
    /// Why open cut the tail of the log, if it did (torn or damaged last record).
    pub(crate) torn_tail: Option<&'static str>,
}

/// What a replay went through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ReplayStats {
    /// Records passed to `apply`.
    pub(crate) applied: u64,
    /// Valid records below the `from` LSN, skipped.
    pub(crate) skipped: u64,
    /// Segment files read.
    pub(crate) segments: u64,
    /// The LSN after the last record replayed (where appending continues).
    pub(crate) end_lsn: Lsn,
}
