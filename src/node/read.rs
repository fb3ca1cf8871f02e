//! Read access to a node: header fields, binary search, record accessors.

use std::cmp::Ordering;

use super::layout::{
    lookahead, meta_at, read_u16, read_u64, Meta, FENCES, FIXED_COST, FLAG_HIGH_INF, FLAG_LOW_INF,
    META_SIZE, OFF_COUNT, OFF_DATA_USED, OFF_DISK_PAGE, OFF_FLAGS, OFF_GARBAGE, OFF_KIND,
    OFF_PREFIX_LEN, TREE_FLAGS,
};
use super::{validate, CorruptNode, NodeKind, RecordKind, Search, HEADER_SIZE};

/// A read-only view of a node.
#[derive(Clone, Copy)]
pub(crate) struct NodeRef<'a> {
    /// The whole node; its length is the node size.
    buf: &'a [u8],
}

impl std::fmt::Debug for NodeRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeRef")
            .field("kind", &self.kind())
            .field("size", &self.size())
            .field("len", &self.len())
            .field("prefix", &self.prefix())
            .finish()
    }
}

impl<'a> NodeRef<'a> {
    /// Full validation of untrusted bytes (a page read from disk): never panics, never reads
    /// out of bounds, checks the header, every meta (bounds, lengths, kinds), prefix vs
    /// fences, keys in strictly ascending order, data accounting. O(n) in the node size.
    ///
    /// # Errors
    /// [`CorruptNode`] naming the first failed check.
    #[allow(dead_code)] // used by unit tests, the structure checker and the fuzz harness
    pub(crate) fn from_bytes_checked(buf: &'a [u8]) -> Result<NodeRef<'a>, CorruptNode> {
        validate::check(buf)?;
        Ok(NodeRef { buf })
    }

    /// A page whose checksum the page store verified: validates what keeps every accessor
    /// in bounds (never a panic, never an out-of-bounds read), O(record count) without
    /// allocating. The deeper invariants [`NodeRef::from_bytes_checked`] also proves (no
    /// overlapping records, key order, look-ahead bytes) hold for every page this code
    /// wrote, which is what a matching checksum establishes.
    pub(crate) fn from_checksummed(buf: &'a [u8]) -> Result<NodeRef<'a>, CorruptNode> {
        validate::check_with(buf, validate::Depth::Bounds)?;
        Ok(NodeRef { buf })
    }

    /// Bytes we built ourselves (mini-pages, inner nodes): cheap debug checks only, so that a
    /// lookup stays O(log n) in debug builds too.
    pub(crate) fn from_bytes(buf: &'a [u8]) -> NodeRef<'a> {
        debug_assert!(super::valid_size(buf.len()));
        let node = NodeRef { buf };
        debug_assert!(
            FIXED_COST + node.len() * META_SIZE + node.data_used() <= buf.len(),
            "node header out of bounds"
        );
        node
    }

    /// The node's bytes.
    #[allow(dead_code)] // used by unit tests and the internals harness
    pub(crate) fn bytes(&self) -> &'a [u8] {
        self.buf
    }

    /// What the node is used as. An unknown kind byte (impossible after validation) reads
    /// as a leaf.
    pub(crate) fn kind(&self) -> NodeKind {
        NodeKind::from_u8(self.buf[OFF_KIND]).unwrap_or(NodeKind::Leaf)
    }

    /// Node size in bytes.
    pub(crate) fn size(&self) -> usize {
        self.buf.len()
    }

    /// Number of records, fences excluded.
    pub(crate) fn len(&self) -> usize {
        self.count().saturating_sub(FENCES)
    }

    /// True if the node holds no record.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// For a mini-page: the disk page of its leaf.
    pub(crate) fn disk_page(&self) -> Option<u64> {
        match read_u64(self.buf, OFF_DISK_PAGE) {
            u64::MAX => None,
            p => Some(p),
        }
    }

    /// The tree's flag bits (bits 2..7 of the flags byte, in place; bits 0..1 read as 0).
    pub(crate) fn flags(&self) -> u8 {
        self.buf[OFF_FLAGS] & TREE_FLAGS
    }

    /// True if the low fence is -inf.
    pub(crate) fn low_is_infinite(&self) -> bool {
        self.buf[OFF_FLAGS] & FLAG_LOW_INF != 0
    }

    /// True if the high fence is +inf.
    pub(crate) fn high_is_infinite(&self) -> bool {
        self.buf[OFF_FLAGS] & FLAG_HIGH_INF != 0
    }

    /// The stored (truncated) low fence; `None` = -inf. A hint, not a bound.
    pub(crate) fn low_fence_stored(&self) -> Option<&'a [u8]> {
        (!self.low_is_infinite()).then(|| self.slot_key(self.meta(0)))
    }

    /// The stored high-fence byte after the prefix (0 or 1 byte); `None` = +inf.
    pub(crate) fn high_fence_stored(&self) -> Option<&'a [u8]> {
        (!self.high_is_infinite()).then(|| self.slot_key(self.meta(1)))
    }

    /// The prefix every record key starts with (stored as the start of the low fence).
    pub(crate) fn prefix(&self) -> &'a [u8] {
        &self.slot_key(self.meta(0))[..self.prefix_len()]
    }

    /// Length of [`Self::prefix`].
    pub(crate) fn prefix_len(&self) -> usize {
        usize::from(read_u16(self.buf, OFF_PREFIX_LEN))
    }

    /// Number of metas, fences included.
    pub(super) fn count(&self) -> usize {
        usize::from(read_u16(self.buf, OFF_COUNT))
    }

    /// Bytes of the data region, live and dead.
    pub(super) fn data_used(&self) -> usize {
        usize::from(read_u16(self.buf, OFF_DATA_USED))
    }

    /// Dead bytes in the data region.
    pub(super) fn garbage(&self) -> usize {
        usize::from(read_u16(self.buf, OFF_GARBAGE))
    }

    /// Contiguous free bytes between the metas and the data region.
    pub(super) fn contiguous_free(&self) -> usize {
        self.size()
            .saturating_sub(HEADER_SIZE + self.count() * META_SIZE + self.data_used())
    }

    /// The meta in slot `slot` (0 and 1 are the fences).
    #[inline]
    pub(super) fn meta(&self, slot: usize) -> Meta {
        Meta(read_u64(self.buf, meta_at(slot)))
    }

    /// The key suffix a meta points to.
    #[inline]
    pub(super) fn slot_key(&self, m: Meta) -> &'a [u8] {
        let off = m.offset();
        &self.buf[off..off + m.key_len()]
    }

    /// The value a meta points to.
    #[inline]
    fn slot_value(&self, m: Meta) -> &'a [u8] {
        let off = m.offset() + m.key_len();
        &self.buf[off..off + m.val_len()]
    }

    /// The meta of record `i`.
    #[inline]
    fn rec_meta(&self, i: usize) -> Meta {
        debug_assert!(
            i < self.len(),
            "record index {i} out of range {}",
            self.len()
        );
        self.meta(i + FENCES)
    }

    /// Binary search for a key suffix (the prefix already stripped), look-ahead first.
    #[inline]
    pub(super) fn search_suffix(&self, suffix: &[u8]) -> Search {
        let la = lookahead(suffix);
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let m = self.meta(mid + FENCES);
            let ord = match m.lookahead().cmp(&la) {
                Ordering::Equal => self.slot_key(m).cmp(suffix),
                o => o,
            };
            match ord {
                Ordering::Less => lo = mid + 1,
                Ordering::Greater => hi = mid,
                Ordering::Equal => return Search::Found(mid),
            }
        }
        Search::NotFound(lo)
    }

    /// Splits `key` into prefix and suffix, or says where a key outside the prefix sorts.
    #[inline]
    pub(super) fn strip_prefix<'k>(&self, key: &'k [u8]) -> Result<&'k [u8], Search> {
        let prefix = self.prefix();
        if let Some(suffix) = key.strip_prefix(prefix) {
            Ok(suffix)
        } else {
            let n = key.len().min(prefix.len());
            // Unequal on the common length decides; equal means key is a proper prefix
            // of the prefix, hence smaller than every record.
            if key[..n] > prefix[..n] {
                Err(Search::NotFound(self.len()))
            } else {
                Err(Search::NotFound(0))
            }
        }
    }

    /// Searches a full key. Keys not sharing the prefix sort before or after all records.
    #[inline]
    pub(crate) fn search(&self, key: &[u8]) -> Search {
        let prefix_len = self.prefix_len();
        if key.len() >= prefix_len {
            // As `RacyNode::search`: the suffix search runs while the prefix's line loads.
            let prefix = self.prefix();
            super::prefetch(prefix.as_ptr());
            let found = self.search_suffix(&key[prefix_len..]);
            return match prefix.cmp(&key[..prefix_len]) {
                Ordering::Equal => found,
                Ordering::Greater => Search::NotFound(0),
                Ordering::Less => Search::NotFound(self.len()),
            };
        }
        match self.strip_prefix(key) {
            Ok(suffix) => self.search_suffix(suffix),
            Err(s) => s,
        }
    }

    /// Whether every record's key lies within `low` (inclusive) and `high` (exclusive);
    /// `None` is unbounded.
    pub(crate) fn keys_within(&self, low: Option<&[u8]>, high: Option<&[u8]>) -> bool {
        low.is_none_or(|l| self.lower_bound(l) == 0)
            && high.is_none_or(|h| self.lower_bound(h) == self.len())
    }

    /// Index of the first record whose key is `>= key`.
    pub(crate) fn lower_bound(&self, key: &[u8]) -> usize {
        match self.search(key) {
            Search::Found(i) | Search::NotFound(i) => i,
        }
    }

    /// Index of the first record whose key is `> key`.
    pub(crate) fn upper_bound(&self, key: &[u8]) -> usize {
        match self.search(key) {
            Search::Found(i) => i + 1,
            Search::NotFound(i) => i,
        }
    }

    /// Record `i`'s key suffix and value, which a node stores back to back, as one slice,
    /// and the suffix's length.
    #[inline]
    pub(crate) fn record_slot(&self, i: usize) -> (&'a [u8], usize) {
        let m = self.rec_meta(i);
        let off = m.offset();
        (&self.buf[off..off + m.key_len() + m.val_len()], m.key_len())
    }

    /// Key suffix of record `i` (after the prefix).
    pub(crate) fn key_suffix(&self, i: usize) -> &'a [u8] {
        self.slot_key(self.rec_meta(i))
    }

    /// Clears `out` and writes the full key of record `i` into it.
    pub(crate) fn key_into(&self, i: usize, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(self.prefix());
        out.extend_from_slice(self.key_suffix(i));
    }

    /// Value of record `i`.
    pub(crate) fn value(&self, i: usize) -> &'a [u8] {
        self.slot_value(self.rec_meta(i))
    }

    /// Kind of record `i`. An invalid kind (impossible after validation) reads as Insert.
    pub(crate) fn record_kind(&self, i: usize) -> RecordKind {
        RecordKind::from_u8(self.rec_meta(i).kind()).unwrap_or(RecordKind::Insert)
    }

    /// Whether every record in `range` exists (`RecordKind::exists`, an invalid kind
    /// reading as Insert as in `record_kind`). One branch-free pass over the metas' kind
    /// fields, which the compiler vectorizes: a scan asks this of most of a leaf.
    pub(crate) fn all_exist(&self, range: std::ops::Range<usize>) -> bool {
        let end = range.end.min(self.len());
        let start = range.start.min(end);
        let metas = &self.buf[meta_at(start + FENCES)..meta_at(end + FENCES)];
        // Tombstone (2) and Phantom (3) are the kinds that do not exist: kind & 0b110 == 2.
        !metas.chunks_exact(META_SIZE).fold(false, |absent, m| {
            absent | (Meta(read_u64(m, 0)).kind() & 0b110 == 2)
        })
    }

    /// Reference bit of record `i` (second-chance eviction of cache records).
    pub(crate) fn ref_bit(&self, i: usize) -> bool {
        self.rec_meta(i).ref_bit()
    }

    /// Looks a key up: its index, kind and value.
    #[inline]
    pub(crate) fn get(&self, key: &[u8]) -> Option<(usize, RecordKind, &'a [u8])> {
        match self.search(key) {
            Search::Found(i) => Some((i, self.record_kind(i), self.value(i))),
            Search::NotFound(_) => None,
        }
    }

    /// Inner nodes: index of the child whose range holds `key` (the last record with key
    /// `<= key`, or 0). Record 0 is keyed by the node's low bound (typically the bare prefix),
    /// so every key routed here lands at index 0 or later.
    pub(crate) fn child_index(&self, key: &[u8]) -> usize {
        self.upper_bound(key).saturating_sub(1)
    }

    /// Inner nodes: the child page id of record `i` (its value as `u64` little-endian).
    pub(crate) fn child(&self, i: usize) -> u64 {
        let v = self.value(i);
        debug_assert_eq!(v.len(), 8, "inner-node value is not a page id");
        let mut b = [0u8; 8];
        let n = v.len().min(8);
        b[..n].copy_from_slice(&v[..n]);
        u64::from_le_bytes(b)
    }

    /// Bytes available for new metas and data once garbage is compacted.
    pub(crate) fn free_space(&self) -> usize {
        self.size().saturating_sub(self.used_bytes())
    }

    /// Header + metas + live data: the smallest node size that could hold this content.
    pub(crate) fn used_bytes(&self) -> usize {
        HEADER_SIZE + self.count() * META_SIZE + self.data_used().saturating_sub(self.garbage())
    }

    /// Would `upsert(key, value)` succeed (possibly after compaction)? Counts the bytes an
    /// existing record for `key` gives back.
    #[allow(dead_code)] // used by unit tests and the internals harness
    pub(crate) fn fits(&self, key: &[u8], value_len: usize) -> bool {
        let Ok(suffix) = self.strip_prefix(key) else {
            return false;
        };
        if suffix.len() > super::layout::MAX_KEY_FIELD || value_len > super::layout::MAX_VALUE_FIELD
        {
            return false;
        }
        match self.search_suffix(suffix) {
            Search::Found(i) => {
                value_len.saturating_sub(self.rec_meta(i).val_len()) <= self.free_space()
            }
            Search::NotFound(_) => META_SIZE + suffix.len() + value_len <= self.free_space(),
        }
    }

    /// Would upserts of all of `records` (key, value length) succeed one after another? A
    /// bound that ignores what records already present give back: true only if each record
    /// could be new.
    pub(crate) fn fits_all<'k>(
        &self,
        records: impl IntoIterator<Item = (&'k [u8], usize)>,
    ) -> bool {
        let mut need = 0usize;
        for (key, value_len) in records {
            let Ok(suffix) = self.strip_prefix(key) else {
                return false;
            };
            if suffix.len() > super::layout::MAX_KEY_FIELD
                || value_len > super::layout::MAX_VALUE_FIELD
            {
                return false;
            }
            need += META_SIZE + suffix.len() + value_len;
        }
        need <= self.free_space()
    }

    /// Number of dirty records (insert, tombstone, upsert).
    pub(crate) fn dirty_count(&self) -> usize {
        (0..self.len())
            .filter(|&i| self.record_kind(i).is_dirty())
            .count()
    }
}
