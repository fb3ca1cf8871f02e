//! Byte-level encoding of the node header and the 8-byte KV metas (see the module docs of
//! `node` for the layout).

use super::HEADER_SIZE;

/// Header offset of `disk_page: u64`.
pub(super) const OFF_DISK_PAGE: usize = 8;
/// Header offset of `size_log2: u8`.
pub(super) const OFF_SIZE_LOG2: usize = 16;
/// Header offset of `kind: u8`.
pub(super) const OFF_KIND: usize = 17;
/// Header offset of `flags: u8`.
pub(super) const OFF_FLAGS: usize = 18;
/// Header offset of `format: u8`.
pub(super) const OFF_FORMAT: usize = 19;
/// Header offset of `count: u16` (metas including the two fences).
pub(super) const OFF_COUNT: usize = 20;
/// Header offset of `prefix_len: u16`.
pub(super) const OFF_PREFIX_LEN: usize = 22;
/// Header offset of `data_used: u16`.
pub(super) const OFF_DATA_USED: usize = 24;
/// Header offset of `garbage: u16`.
pub(super) const OFF_GARBAGE: usize = 26;
/// Start of the reserved, zero header bytes.
pub(super) const OFF_RESERVED: usize = 28;

/// The layout version written in every header.
pub(super) const FORMAT_VERSION: u8 = 1;
/// Flag: the low fence is -inf.
pub(super) const FLAG_LOW_INF: u8 = 1;
/// Flag: the high fence is +inf.
pub(super) const FLAG_HIGH_INF: u8 = 2;
/// Flag bits that belong to the tree.
pub(super) const TREE_FLAGS: u8 = 0xFC;
/// Meta kind value of the two fence slots.
pub(super) const FENCE_KIND: u8 = 5;
/// Number of fence slots before the records.
pub(super) const FENCES: usize = 2;
/// Bytes per KV meta.
pub(super) const META_SIZE: usize = 8;
/// Largest key suffix the 13-bit length field holds.
pub(super) const MAX_KEY_FIELD: usize = (1 << 13) - 1;
/// Largest value the 15-bit length field holds.
pub(super) const MAX_VALUE_FIELD: usize = (1 << 15) - 1;
/// Header plus the two fence metas: the fixed cost of every node.
pub(super) const FIXED_COST: usize = HEADER_SIZE + FENCES * META_SIZE;

/// Reads a little-endian `u16` at `at`.
#[inline]
pub(super) fn read_u16(buf: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([buf[at], buf[at + 1]])
}

/// Writes a little-endian `u16` at `at`.
#[inline]
pub(super) fn write_u16(buf: &mut [u8], at: usize, v: u16) {
    buf[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

/// Reads a little-endian `u64` at `at`.
#[inline]
pub(super) fn read_u64(buf: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(b)
}

/// Writes a little-endian `u64` at `at`.
#[inline]
pub(super) fn write_u64(buf: &mut [u8], at: usize, v: u64) {
    buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Byte offset of meta slot `slot`.
#[inline]
pub(super) fn meta_at(slot: usize) -> usize {
    HEADER_SIZE + slot * META_SIZE
}

/// The look-ahead of a key suffix: its first two bytes, big-endian, zero-padded.
#[inline]
pub(super) fn lookahead(suffix: &[u8]) -> u16 {
    match suffix {
        [] => 0,
        [a] => u16::from(*a) << 8,
        [a, b, ..] => (u16::from(*a) << 8) | u16::from(*b),
    }
}

/// Length of the longest common prefix of `a` and `b`.
pub(crate) fn common_prefix_len(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Longest prefix a node of `size` bytes keeps: its fences (at most `prefix + 2` bytes) must
/// fit the node, and the stored low fence (`prefix + 1` bytes) the 13-bit length field. Only
/// nodes smaller than four times the longest key ever hit this cap (mini-pages below 256 B
/// with 4 KiB pages); keeping as much prefix as fits means a copy to a larger node (which
/// keeps the prefix) loses as little as possible.
pub(crate) fn max_prefix_len(size: usize) -> usize {
    size.saturating_sub(FIXED_COST + 2).min(MAX_KEY_FIELD - 1)
}

/// The prefix a node of `size` bytes with these bounds uses.
pub(super) fn effective_prefix(low: Option<&[u8]>, high: Option<&[u8]>, size: usize) -> usize {
    match (low, high) {
        (Some(l), Some(h)) => common_prefix_len(l, h).min(max_prefix_len(size)),
        _ => 0,
    }
}

/// The bytes slots 0 and 1 store for these bounds and prefix length.
pub(super) fn stored_fences<'k>(
    low: Option<&'k [u8]>,
    high: Option<&'k [u8]>,
    prefix_len: usize,
) -> (Option<&'k [u8]>, Option<&'k [u8]>) {
    let low = low.map(|l| &l[..l.len().min(prefix_len + 1)]);
    let high = high.map(|h| &h[h.len().min(prefix_len)..h.len().min(prefix_len + 1)]);
    (low, high)
}

/// One decoded KV meta.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Meta(pub u64);

impl Meta {
    /// Encodes a meta. Lengths must fit their fields (callers check).
    #[inline]
    pub(super) fn new(
        offset: usize,
        key_len: usize,
        val_len: usize,
        kind: u8,
        refb: bool,
        la: u16,
    ) -> Meta {
        debug_assert!(offset <= 0xFFFF && key_len <= MAX_KEY_FIELD && val_len <= MAX_VALUE_FIELD);
        debug_assert!(kind <= FENCE_KIND);
        Meta(
            (offset as u64 & 0xFFFF)
                | ((key_len as u64 & 0x1FFF) << 16)
                | ((val_len as u64 & 0x7FFF) << 29)
                | ((u64::from(kind) & 7) << 44)
                | (u64::from(refb) << 47)
                | (u64::from(la) << 48),
        )
    }

    /// Offset of the record bytes.
    #[inline]
    pub(super) fn offset(self) -> usize {
        (self.0 & 0xFFFF) as usize
    }

    /// Key-suffix length.
    #[inline]
    pub(super) fn key_len(self) -> usize {
        ((self.0 >> 16) & 0x1FFF) as usize
    }

    /// Value length.
    #[inline]
    pub(super) fn val_len(self) -> usize {
        ((self.0 >> 29) & 0x7FFF) as usize
    }

    /// Key-suffix plus value length: the record's bytes in the data region.
    #[inline]
    pub(super) fn data_len(self) -> usize {
        self.key_len() + self.val_len()
    }

    /// Raw kind field.
    #[inline]
    pub(super) fn kind(self) -> u8 {
        ((self.0 >> 44) & 7) as u8
    }

    /// Reference bit.
    #[inline]
    pub(super) fn ref_bit(self) -> bool {
        self.0 & (1 << 47) != 0
    }

    /// Look-ahead bytes.
    #[inline]
    pub(super) fn lookahead(self) -> u16 {
        (self.0 >> 48) as u16
    }

    /// The same meta with another offset.
    #[inline]
    pub(super) fn with_offset(self, offset: usize) -> Meta {
        Meta((self.0 & !0xFFFF) | (offset as u64 & 0xFFFF))
    }

    /// The same meta with another value length.
    #[inline]
    pub(super) fn with_val_len(self, len: usize) -> Meta {
        Meta((self.0 & !(0x7FFF << 29)) | ((len as u64 & 0x7FFF) << 29))
    }

    /// The same meta with another kind.
    #[inline]
    pub(super) fn with_kind(self, kind: u8) -> Meta {
        Meta((self.0 & !(7 << 44)) | ((u64::from(kind) & 7) << 44))
    }

    /// The same meta with the reference bit set or cleared.
    #[inline]
    pub(super) fn with_ref_bit(self, on: bool) -> Meta {
        Meta((self.0 & !(1 << 47)) | (u64::from(on) << 47))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_fields_round_trip_at_their_maxima() {
        let m = Meta::new(
            0xFFFF,
            MAX_KEY_FIELD,
            MAX_VALUE_FIELD,
            FENCE_KIND,
            true,
            0xABCD,
        );
        assert_eq!(
            (
                m.offset(),
                m.key_len(),
                m.val_len(),
                m.kind(),
                m.ref_bit(),
                m.lookahead()
            ),
            (
                0xFFFF,
                MAX_KEY_FIELD,
                MAX_VALUE_FIELD,
                FENCE_KIND,
                true,
                0xABCD
            )
        );
        let m = m
            .with_offset(7)
            .with_val_len(3)
            .with_kind(2)
            .with_ref_bit(false);
        assert_eq!(
            (
                m.offset(),
                m.key_len(),
                m.val_len(),
                m.kind(),
                m.ref_bit(),
                m.lookahead()
            ),
            (7, MAX_KEY_FIELD, 3, 2, false, 0xABCD)
        );
    }

    #[test]
    fn lookahead_pads_with_zero_and_keeps_byte_order() {
        assert_eq!(lookahead(b""), 0);
        assert_eq!(lookahead(b"a"), 0x6100);
        assert_eq!(lookahead(b"ab"), 0x6162);
        assert_eq!(lookahead(b"abc"), 0x6162);
        let keys: [&[u8]; 7] = [b"", b"\0", b"\0\x01", b"a", b"a\0", b"a\x01", b"b"];
        for a in keys {
            for b in keys {
                if lookahead(a) < lookahead(b) {
                    assert!(a < b, "{a:?} {b:?}");
                }
            }
        }
    }

    #[test]
    fn prefix_is_capped_by_node_size() {
        assert_eq!(max_prefix_len(64), 14);
        assert_eq!(max_prefix_len(128), 78);
        assert!(max_prefix_len(4096) >= 1024);
        assert_eq!(max_prefix_len(65536), MAX_KEY_FIELD - 1);
        let (l, h): (&[u8], &[u8]) = (
            b"abcdefghijklmnopqrstuvwxyz1",
            b"abcdefghijklmnopqrstuvwxyz2",
        );
        assert_eq!(effective_prefix(Some(l), Some(h), 4096), 26);
        assert_eq!(effective_prefix(Some(l), Some(h), 64), 14);
        assert_eq!(effective_prefix(None, Some(h), 4096), 0);
        assert_eq!(
            stored_fences(Some(l), Some(h), 26),
            (Some(l), Some(&b"2"[..]))
        );
    }
}
