//! Validation of untrusted node bytes (pages read from disk).
//!
//! After [`check`] accepts a buffer, every accessor of `NodeRef` stays in bounds: all record
//! ranges lie inside the data region (or are empty), the fence slots hold the prefix, and
//! the records are strictly sorted, so binary search agrees with a linear scan.

use super::layout::{
    lookahead, read_u16, read_u64, Meta, FENCES, FENCE_KIND, FLAG_HIGH_INF, FLAG_LOW_INF,
    FORMAT_VERSION, META_SIZE, OFF_COUNT, OFF_DATA_USED, OFF_FLAGS, OFF_FORMAT, OFF_GARBAGE,
    OFF_KIND, OFF_PREFIX_LEN, OFF_RESERVED, OFF_SIZE_LOG2,
};
use super::{CorruptNode, NodeKind, RecordKind, HEADER_SIZE, MAX_NODE, MIN_NODE};

/// How much of a node [`check_with`] verifies.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Depth {
    /// Every invariant: bounds, no overlapping records, look-ahead bytes, key order,
    /// data accounting. O(size), with a bitmap allocation.
    Full,
    /// What keeps every accessor in bounds (header, record and fence bounds, kinds), for
    /// bytes whose checksum the page store already verified: they are bytes this code
    /// wrote, so the deeper checks would only re-prove what the checksum proves. O(count),
    /// no allocation.
    Bounds,
}

/// Checks every structural invariant of a node; O(size).
#[allow(dead_code)] // used by unit tests, the structure checker and the fuzz harness
pub(super) fn check(buf: &[u8]) -> Result<(), CorruptNode> {
    check_with(buf, Depth::Full)
}

/// Checks a node to the given depth.
pub(super) fn check_with(buf: &[u8], depth: Depth) -> Result<(), CorruptNode> {
    let full = depth == Depth::Full;
    let bad = |why| Err(CorruptNode(why));
    let size = buf.len();
    if !size.is_power_of_two() || !(MIN_NODE..=MAX_NODE).contains(&size) {
        return bad("node size is not a power of two from 64 to 65536");
    }
    if usize::from(buf[OFF_SIZE_LOG2]) != size.trailing_zeros() as usize {
        return bad("size_log2 does not match the page size");
    }
    let Some(kind) = NodeKind::from_u8(buf[OFF_KIND]) else {
        return bad("unknown node kind");
    };
    if buf[OFF_FORMAT] != FORMAT_VERSION {
        return bad("unknown node format version");
    }
    if buf[OFF_RESERVED..HEADER_SIZE].iter().any(|&b| b != 0) {
        return bad("reserved header bytes are not zero");
    }
    let count = usize::from(read_u16(buf, OFF_COUNT));
    let prefix_len = usize::from(read_u16(buf, OFF_PREFIX_LEN));
    let data_used = usize::from(read_u16(buf, OFF_DATA_USED));
    let garbage = usize::from(read_u16(buf, OFF_GARBAGE));
    if count < FENCES {
        return bad("fence slots missing");
    }
    if HEADER_SIZE + count * META_SIZE + data_used > size {
        return bad("metas overlap the data region");
    }
    if garbage > data_used {
        return bad("garbage exceeds the data region");
    }
    let data_start = size - data_used;
    let mut claimed = Claimed::new(if full { size } else { 0 });
    let mut live = 0;
    let mut prev: Option<&[u8]> = None;
    for slot in 0..count {
        let m = Meta(read_u64(buf, HEADER_SIZE + slot * META_SIZE));
        let (off, len) = (m.offset(), m.data_len());
        if len > 0 {
            if off < data_start || off + len > size {
                return bad("record bytes outside the data region");
            }
            if full && !claimed.claim(off, off + len) {
                return bad("records overlap");
            }
        } else if off != 0 && (off < data_start || off > size) {
            return bad("empty record with a stray offset");
        }
        live += len;
        let key = &buf[off..off + m.key_len()];
        if full && m.lookahead() != lookahead(key) {
            return bad("look-ahead bytes do not match the key");
        }
        if slot < FENCES {
            if m.kind() != FENCE_KIND || m.val_len() != 0 || m.ref_bit() {
                return bad("malformed fence slot");
            }
            continue;
        }
        let Some(rk) = RecordKind::from_u8(m.kind()) else {
            return bad("unknown record kind");
        };
        if kind == NodeKind::Inner && (rk != RecordKind::Insert || m.val_len() != 8) {
            return bad("inner-node record is not a child page id");
        }
        if full {
            if prev.is_some_and(|p| p >= key) {
                return bad("keys not in strictly ascending order");
            }
            prev = Some(key);
        }
    }
    if full && live + garbage != data_used {
        return bad("data accounting does not add up");
    }
    check_fences(buf, prefix_len)
}

/// Checks the fence slots against the flags and the prefix length.
fn check_fences(buf: &[u8], prefix_len: usize) -> Result<(), CorruptNode> {
    let bad = |why| Err(CorruptNode(why));
    let fence = |slot: usize| {
        let m = Meta(read_u64(buf, HEADER_SIZE + slot * META_SIZE));
        &buf[m.offset()..m.offset() + m.key_len()]
    };
    let (low, high) = (fence(0), fence(1));
    let flags = buf[OFF_FLAGS];
    let low_inf = flags & FLAG_LOW_INF != 0;
    let high_inf = flags & FLAG_HIGH_INF != 0;
    if (low_inf || high_inf) && prefix_len != 0 {
        return bad("prefix with an infinite fence");
    }
    if low_inf && !low.is_empty() || high_inf && !high.is_empty() {
        return bad("infinite fence with stored bytes");
    }
    if !low_inf && (low.len() < prefix_len || low.len() > prefix_len + 1) {
        return bad("low fence does not hold the prefix");
    }
    if high.len() > 1 {
        return bad("high fence longer than one byte");
    }
    // Equal bytes happen when a small node keeps a shorter prefix than the fences share.
    if let (Some(l), Some(h)) = (low.get(prefix_len), high.first()) {
        if l > h {
            return bad("low fence above high fence");
        }
    }
    Ok(())
}

/// A bitmap of the data bytes already claimed by a record.
struct Claimed {
    /// One bit per node byte.
    words: Vec<u64>,
}

impl Claimed {
    /// An empty map for a node of `size` bytes.
    fn new(size: usize) -> Claimed {
        Claimed {
            words: vec![0; size.div_ceil(64)],
        }
    }

    /// Claims `[start, end)`; false if any byte was claimed before. Word at a time.
    fn claim(&mut self, start: usize, end: usize) -> bool {
        let mut at = start;
        while at < end {
            let (w, bit) = (at / 64, at % 64);
            let n = (end - at).min(64 - bit);
            let mask = if n == 64 {
                u64::MAX
            } else {
                ((1u64 << n) - 1) << bit
            };
            if self.words[w] & mask != 0 {
                return false;
            }
            self.words[w] |= mask;
            at += n;
        }
        true
    }
}
