//! The one page layout shared by leaf pages, mini-pages and inner nodes (paper §3.2, §3.5).
//!
//! A node is a byte slice of 64 B to 64 KiB, a multiple of 16 bytes ([`valid_size`]): pages
//! (leaves and inner nodes, on disk or mirrored) are the page size, a power of two;
//! mini-pages take the buffer pool's size classes, four per doubling. All integers are
//! little-endian. `size_log2` is the size's log2 rounded down (exact for pages, which
//! validation checks; mini-pages never leave memory).
//!
//! ```text
//! 0      8          16        17    18     19      20     22          24         26       28     32
//! | ckpt | disk_page | size_log2 | kind | flags | format | count | prefix_len | data_used | garbage | 0 |
//! 32: count KV metas of 8 bytes, growing up ->      free      <- key/value bytes, growing down :size
//! ```
//!
//! * Bytes 0..8 belong to the page store (its checksum); node code never reads or writes them.
//! * `disk_page` is, for a mini-page, the disk page of its leaf (`u64::MAX` = none).
//! * `flags` bit 0: low fence is -inf; bit 1: high fence is +inf; bits 2..7 belong to the tree.
//! * `count` counts metas including the two fence slots; `data_used` counts the bytes of the
//!   data region `[size - data_used, size)`, live and dead; `garbage` counts the dead ones.
//!   `data_used == garbage + Σ live record bytes` always holds.
//!
//! A KV meta is one `u64`: bits 0..16 offset of the record bytes (key suffix then value;
//! a record without bytes has offset 0), 16..29 key-suffix length, 29..44 value length,
//! 44..47 record kind ([`RecordKind`], or 5 for a fence), bit 47 reference bit, 48..64 the
//! look-ahead: the first two bytes of the key suffix, big-endian, zero-padded. Binary search
//! compares look-aheads first and loads the key bytes only on a tie; zero padding keeps a
//! strict look-ahead order consistent with byte order.
//!
//! # Fences and prefix compression
//!
//! Slot 0 is the low fence, slot 1 the high fence. The node prefix is the common prefix of the
//! two fences (empty if either is infinite); records store only the key suffix after it.
//!
//! **Design decision: fences are stored truncated.** Slot 0 holds the low fence cut to
//! `prefix_len + 1` bytes (its first `prefix_len` bytes *are* the stored prefix), slot 1 holds
//! at most one byte, the high fence's byte after the prefix. With 1 KiB keys and 2 KiB records
//! in a 4 KiB page, two full fences plus one record would not fit; truncated, fences cost at
//! most `prefix_len + 2` bytes and the prefix, which is all compression needs, stays exact.
//! Exact separators live in the inner nodes. Consequently the stored fences are hints, not
//! bounds: never use them for range checks.
//!
//! Second consequence, for small nodes: a node of `size` bytes keeps a prefix of at most
//! `size - 50` bytes (see [`max_prefix_len`]: the fences must fit), so that a 64 B mini-page
//! of a leaf with a longer prefix can still be formatted; its records then store longer
//! suffixes. A copy of such a node keeps the shorter prefix (the truncated fences cannot
//! restore it); `init` a node with the exact bounds from the inner node to get it back. With
//! 4 KiB leaf pages this only concerns mini-pages below 256 B and prefixes over 14 bytes.
//!
//! # Capacity guarantee
//!
//! A node of size `S` whose prefix is `p` can always hold any single record with
//! `suffix + value + 8 <= S - 32 - 16 - (p + 2)`. With the limits of [`crate::Limits`] a
//! 1 KiB key and a 2 KiB record always fit a 4 KiB leaf, whatever its fences.

mod build;
#[cfg(any(test, fuzzing, bfkv_internals))]
mod fuzz;
mod layout;
mod racy;
mod read;
mod validate;
mod write;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_build;
#[cfg(test)]
mod tests_merge;
#[cfg(test)]
mod tests_prop;
#[cfg(test)]
mod tests_validate;

#[cfg(test)]
pub(crate) use build::shortest_separator;
pub(crate) use build::{
    build, built_len, copy_filtered, filtered_len, merge_sorted, mini_from_mirror, split_records,
    split_records_packed, Bytes, Record,
};
#[cfg(any(fuzzing, bfkv_internals))]
pub(crate) use fuzz::decode_check;
pub(crate) use racy::{RacyNode, Words};
pub(crate) use read::NodeRef;
pub(crate) use write::NodeMut;

/// Size of the node header in bytes.
pub(crate) const HEADER_SIZE: usize = 32;
/// Smallest node size (a fresh mini-page).
pub(crate) const MIN_NODE: usize = 64;
/// Largest node size (bounded by the 16-bit offsets).
pub(crate) const MAX_NODE: usize = 65536;

/// Asks the CPU to start loading the cache line that holds `p`, so that loads which would
/// each wait for the one before miss together instead. A hint: it changes nothing any load
/// returns, and does nothing on targets without one.
#[inline]
pub(crate) fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint that reads nothing the program observes and never
    // faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Whether `len` bytes can hold a node: 64 B to 64 KiB, a multiple of 16.
pub(crate) fn valid_size(len: usize) -> bool {
    len.is_multiple_of(16) && (MIN_NODE..=MAX_NODE).contains(&len)
}

/// What a node is used as; stored in the header byte 17.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub(crate) enum NodeKind {
    /// A leaf page (on disk, or its full-page image in memory).
    Leaf = 1,
    /// A mini-page: the in-memory write buffer and cache of one leaf.
    Mini = 2,
    /// An inner node: separators with child page ids (8-byte little-endian values).
    Inner = 3,
}

impl NodeKind {
    /// Decodes the header byte; `None` for an unknown kind.
    pub(crate) fn from_u8(b: u8) -> Option<NodeKind> {
        match b {
            1 => Some(NodeKind::Leaf),
            2 => Some(NodeKind::Mini),
            3 => Some(NodeKind::Inner),
            _ => None,
        }
    }
}

/// The type of one record (paper Table 1, plus buffered upserts).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub(crate) enum RecordKind {
    /// A write not yet on disk.
    Insert = 0,
    /// A clean copy of a record read from disk.
    Cache = 1,
    /// A delete not yet on disk.
    Tombstone = 2,
    /// A cached negative lookup: the key is known to be absent.
    Phantom = 3,
    /// A buffered merge (Bε upsert): its value is the key's pending merge operands, which
    /// the tree folds over the value below it (`tree/merge.rs`). Never in a leaf page.
    Upsert = 4,
}

impl RecordKind {
    /// Decodes the 3-bit meta field; `None` for fences (5) and unknown kinds.
    pub(crate) fn from_u8(b: u8) -> Option<RecordKind> {
        match b {
            0 => Some(RecordKind::Insert),
            1 => Some(RecordKind::Cache),
            2 => Some(RecordKind::Tombstone),
            3 => Some(RecordKind::Phantom),
            4 => Some(RecordKind::Upsert),
            _ => None,
        }
    }

    /// True if the record must reach the leaf page before the mini-page is dropped.
    pub(crate) fn is_dirty(self) -> bool {
        matches!(
            self,
            RecordKind::Insert | RecordKind::Tombstone | RecordKind::Upsert
        )
    }

    /// True if the record says the key exists (false: known deleted or absent).
    pub(crate) fn exists(self) -> bool {
        matches!(
            self,
            RecordKind::Insert | RecordKind::Cache | RecordKind::Upsert
        )
    }
}

/// Why a node from disk was rejected (the caller turns it into `Error::Corruption` with the
/// file and page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CorruptNode(pub &'static str);

/// The node has no room for the requested change; the node is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NoSpace;

/// Result of a search by key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Search {
    /// The key is record `i` (0-based, fences excluded).
    Found(usize),
    /// The key is absent; `i` is where it would be inserted.
    NotFound(usize),
}
