//! Mutation of a node: formatting, upsert, remove, compaction, sorted append, merge.

use std::cell::RefCell;

use super::layout::{
    effective_prefix, lookahead, meta_at, stored_fences, write_u16, write_u64, Meta, FENCES,
    FENCE_KIND, FIXED_COST, FLAG_HIGH_INF, FLAG_LOW_INF, FORMAT_VERSION, MAX_KEY_FIELD,
    MAX_VALUE_FIELD, META_SIZE, OFF_COUNT, OFF_DATA_USED, OFF_DISK_PAGE, OFF_FLAGS, OFF_FORMAT,
    OFF_GARBAGE, OFF_KIND, OFF_PREFIX_LEN, OFF_RESERVED, OFF_SIZE_LOG2, TREE_FLAGS,
};
use super::{NoSpace, NodeKind, NodeRef, RecordKind, Search, HEADER_SIZE};

thread_local! {
    /// Compaction copies the data region here first; reused so compaction does not allocate
    /// after a thread's first one.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// A mutable view of a node.
pub(crate) struct NodeMut<'a> {
    /// The whole node; its length is the node size.
    buf: &'a mut [u8],
}

impl<'a> NodeMut<'a> {
    /// Formats `buf` as an empty node; `low`/`high` `None` = infinite.
    ///
    /// # Panics
    /// If `buf.len()` is not a valid node size ([`super::valid_size`]: a caller bug); in debug builds
    /// also if `low >= high`.
    pub(crate) fn init(
        buf: &'a mut [u8],
        kind: NodeKind,
        low: Option<&[u8]>,
        high: Option<&[u8]>,
    ) -> NodeMut<'a> {
        assert!(
            super::valid_size(buf.len()),
            "node size {} is not a multiple of 16 from 64 to 65536",
            buf.len()
        );
        if let (Some(l), Some(h)) = (low, high) {
            debug_assert!(l < h, "low fence {l:?} >= high fence {h:?}");
        }
        let prefix_len = effective_prefix(low, high, buf.len());
        let (low, high) = stored_fences(low, high, prefix_len);
        let mut node = NodeMut { buf };
        // Cannot fail: effective_prefix keeps the fences within the node.
        node.format(kind, prefix_len, low, high);
        node
    }

    /// A view of bytes we built ourselves.
    pub(crate) fn from_bytes(buf: &'a mut [u8]) -> NodeMut<'a> {
        debug_assert!(super::valid_size(buf.len()));
        NodeMut { buf }
    }

    /// Read access.
    pub(crate) fn as_ref(&self) -> NodeRef<'_> {
        NodeRef::from_bytes(self.buf)
    }

    /// Writes the header and the two fence slots (already truncated). Returns false, leaving
    /// the bytes partly written, if the fences do not fit.
    pub(super) fn format(
        &mut self,
        kind: NodeKind,
        prefix_len: usize,
        low: Option<&[u8]>,
        high: Option<&[u8]>,
    ) -> bool {
        let size = self.buf.len();
        let fence_bytes = low.map_or(0, <[u8]>::len) + high.map_or(0, <[u8]>::len);
        if FIXED_COST + fence_bytes > size || low.is_some_and(|l| l.len() < prefix_len) {
            return false;
        }
        write_u64(self.buf, OFF_DISK_PAGE, u64::MAX);
        self.buf[OFF_SIZE_LOG2] = size.ilog2() as u8;
        self.buf[OFF_KIND] = kind as u8;
        self.buf[OFF_FLAGS] = if low.is_none() { FLAG_LOW_INF } else { 0 }
            | if high.is_none() { FLAG_HIGH_INF } else { 0 };
        self.buf[OFF_FORMAT] = FORMAT_VERSION;
        write_u16(self.buf, OFF_COUNT, FENCES as u16);
        write_u16(self.buf, OFF_PREFIX_LEN, prefix_len as u16);
        write_u16(self.buf, OFF_DATA_USED, 0);
        write_u16(self.buf, OFF_GARBAGE, 0);
        self.buf[OFF_RESERVED..HEADER_SIZE].fill(0);
        for (slot, fence) in [(0, low.unwrap_or(&[])), (1, high.unwrap_or(&[]))] {
            let off = self.append_data(fence, &[]);
            self.set_meta(
                slot,
                Meta::new(off, fence.len(), 0, FENCE_KIND, false, lookahead(fence)),
            );
        }
        true
    }

    /// Sets the disk page of a mini-page's leaf.
    pub(crate) fn set_disk_page(&mut self, page: Option<u64>) {
        write_u64(self.buf, OFF_DISK_PAGE, page.unwrap_or(u64::MAX));
    }

    /// Sets the tree's flag bits (2..7, in place); bits 0..1 of `bits` are ignored.
    pub(crate) fn set_flags(&mut self, bits: u8) {
        let fences = self.buf[OFF_FLAGS] & !TREE_FLAGS;
        self.buf[OFF_FLAGS] = fences | (bits & TREE_FLAGS);
    }

    /// Inserts or overwrites `key` and returns its record index. Overwrites in place when
    /// the new value fits the old slot; otherwise appends new bytes and counts the old ones as
    /// garbage, compacting when that makes room.
    ///
    /// # Errors
    /// [`NoSpace`], with the node unchanged, if the record does not fit even after
    /// compaction. A key that does not start with the node prefix is a caller bug: it is
    /// refused with `NoSpace` (and a debug assertion) rather than corrupting the order.
    pub(crate) fn upsert(
        &mut self,
        key: &[u8],
        value: &[u8],
        kind: RecordKind,
    ) -> Result<usize, NoSpace> {
        let node = self.as_ref();
        let Ok(suffix) = node.strip_prefix(key) else {
            debug_assert!(
                false,
                "key {key:?} outside the node prefix {:?}",
                node.prefix()
            );
            return Err(NoSpace);
        };
        if suffix.len() > MAX_KEY_FIELD || value.len() > MAX_VALUE_FIELD {
            return Err(NoSpace);
        }
        let (contiguous, free) = (node.contiguous_free(), node.free_space());
        match node.search_suffix(suffix) {
            Search::Found(i) => {
                let slot = i + FENCES;
                let old = node.meta(slot);
                if value.len() <= old.val_len() {
                    let start = old.offset() + old.key_len();
                    self.buf[start..start + value.len()].copy_from_slice(value);
                    self.add_garbage(old.val_len() - value.len());
                    let mut m = old.with_val_len(value.len()).with_kind(kind as u8);
                    if m.data_len() == 0 {
                        m = m.with_offset(0);
                    }
                    self.set_meta(slot, m);
                    return Ok(i);
                }
                let need = suffix.len() + value.len();
                if need <= contiguous {
                    self.add_garbage(old.data_len());
                } else if need <= free + old.data_len() {
                    self.compact_except(Some(slot));
                } else {
                    return Err(NoSpace);
                }
                let off = self.append_data(suffix, value);
                let m = Meta::new(
                    off,
                    suffix.len(),
                    value.len(),
                    kind as u8,
                    old.ref_bit(),
                    lookahead(suffix),
                );
                self.set_meta(slot, m);
                Ok(i)
            }
            Search::NotFound(i) => {
                let need = META_SIZE + suffix.len() + value.len();
                if need > contiguous {
                    if need > free {
                        return Err(NoSpace);
                    }
                    self.compact();
                }
                self.insert_meta_at(i + FENCES, suffix, value, kind as u8, false);
                Ok(i)
            }
        }
    }

    /// Removes record `i`. Its bytes become garbage, or shrink the data region when they are
    /// its lowest bytes.
    pub(crate) fn remove_at(&mut self, i: usize) {
        let node = self.as_ref();
        let (count, data_used) = (node.count(), node.data_used());
        let slot = i + FENCES;
        if slot >= count {
            debug_assert!(false, "remove_at({i}) out of range");
            return;
        }
        let m = node.meta(slot);
        if m.data_len() > 0 {
            if m.offset() == self.buf.len() - data_used {
                write_u16(self.buf, OFF_DATA_USED, (data_used - m.data_len()) as u16);
            } else {
                self.add_garbage(m.data_len());
            }
        }
        self.buf
            .copy_within(meta_at(slot + 1)..meta_at(count), meta_at(slot));
        write_u16(self.buf, OFF_COUNT, (count - 1) as u16);
    }

    /// Sets or clears the reference bit of record `i`.
    pub(crate) fn set_ref_bit(&mut self, i: usize, on: bool) {
        let slot = i + FENCES;
        debug_assert!(i < self.as_ref().len());
        let m = self.as_ref().meta(slot);
        self.set_meta(slot, m.with_ref_bit(on));
    }

    /// Changes the kind of record `i` (e.g. insert -> cache after a merge).
    pub(crate) fn set_record_kind(&mut self, i: usize, kind: RecordKind) {
        let slot = i + FENCES;
        debug_assert!(i < self.as_ref().len());
        let m = self.as_ref().meta(slot);
        self.set_meta(slot, m.with_kind(kind as u8));
    }

    /// Reclaims all garbage in place.
    pub(crate) fn compact(&mut self) {
        self.compact_except(None);
    }

    /// Compacts, dropping the bytes of `skip` (whose meta the caller rewrites right after).
    fn compact_except(&mut self, skip: Option<usize>) {
        let node = self.as_ref();
        let (size, count, data_used) = (node.size(), node.count(), node.data_used());
        let start = size - data_used;
        let mut run = |scratch: &mut Vec<u8>| {
            scratch.clear();
            scratch.extend_from_slice(&self.buf[start..]);
            let mut end = size;
            for slot in 0..count {
                if Some(slot) == skip {
                    continue;
                }
                let m = NodeRef::from_bytes(self.buf).meta(slot);
                let len = m.data_len();
                if len == 0 {
                    self.set_meta(slot, m.with_offset(0));
                    continue;
                }
                let src = m.offset() - start;
                end -= len;
                self.buf[end..end + len].copy_from_slice(&scratch[src..src + len]);
                self.set_meta(slot, m.with_offset(end));
            }
            write_u16(self.buf, OFF_DATA_USED, (size - end) as u16);
            write_u16(self.buf, OFF_GARBAGE, 0);
        };
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => run(&mut scratch),
            Err(_) => run(&mut Vec::new()),
        });
    }

    /// Appends a record whose key is greater than every key present.
    ///
    /// # Errors
    /// [`NoSpace`] if it does not fit even after compaction (node unchanged).
    pub(crate) fn push_sorted(
        &mut self,
        key: &[u8],
        value: &[u8],
        kind: RecordKind,
    ) -> Result<(), NoSpace> {
        let node = self.as_ref();
        let Ok(suffix) = node.strip_prefix(key) else {
            debug_assert!(
                false,
                "key {key:?} outside the node prefix {:?}",
                node.prefix()
            );
            return Err(NoSpace);
        };
        debug_assert!(
            node.is_empty() || node.key_suffix(node.len() - 1) < suffix,
            "push_sorted out of order"
        );
        self.push_suffix(suffix, value, kind, false)
    }

    /// Appends a record given its key suffix (sorted input).
    pub(super) fn push_suffix(
        &mut self,
        suffix: &[u8],
        value: &[u8],
        kind: RecordKind,
        refb: bool,
    ) -> Result<(), NoSpace> {
        if suffix.len() > MAX_KEY_FIELD || value.len() > MAX_VALUE_FIELD {
            return Err(NoSpace);
        }
        let node = self.as_ref();
        let need = META_SIZE + suffix.len() + value.len();
        let count = node.count();
        if need > node.contiguous_free() {
            if need > node.free_space() {
                return Err(NoSpace);
            }
            self.compact();
        }
        self.insert_meta_at(count, suffix, value, kind as u8, refb);
        Ok(())
    }

    /// Applies a mini-page's dirty records: inserts are stored as Insert (newest wins),
    /// tombstones remove the key; cache and phantom records are skipped.
    ///
    /// # Errors
    /// [`NoSpace`], with the leaf unchanged, if the result would not fit (or a mini-page key
    /// lies outside this node's prefix, or the mini-page holds Upsert records, which need
    /// the merge operator); the caller rebuilds with `merge_sorted` and `split_records`.
    pub(crate) fn merge_from(&mut self, mini: NodeRef<'_>) -> Result<(), NoSpace> {
        let mut key = Vec::new();
        // Space check first, against the unchanged leaf: each mini key is touched once.
        let leaf = self.as_ref();
        let mut used = leaf.used_bytes() as isize;
        for j in 0..mini.len() {
            let kind = mini.record_kind(j);
            if !kind.is_dirty() {
                continue;
            }
            if kind == RecordKind::Upsert {
                return Err(NoSpace);
            }
            mini.key_into(j, &mut key);
            let Ok(suffix) = leaf.strip_prefix(&key) else {
                return Err(NoSpace);
            };
            let found = match leaf.search_suffix(suffix) {
                Search::Found(i) => Some(leaf.meta(i + FENCES)),
                Search::NotFound(_) => None,
            };
            let vlen = mini.value(j).len();
            used += match (kind, found) {
                (RecordKind::Tombstone, Some(m)) => -((META_SIZE + m.data_len()) as isize),
                (RecordKind::Tombstone, None) => 0,
                (_, Some(m)) => vlen as isize - m.val_len() as isize,
                (_, None) => {
                    if suffix.len() > MAX_KEY_FIELD || vlen > MAX_VALUE_FIELD {
                        return Err(NoSpace);
                    }
                    (META_SIZE + suffix.len() + vlen) as isize
                }
            };
        }
        if used > self.buf.len() as isize {
            return Err(NoSpace);
        }
        // Apply removals, then overwrites that shrink (in place), then growth: every step of
        // the last pass only adds bytes, so each one fits because the total does.
        for pass in 0..3 {
            for j in 0..mini.len() {
                let kind = mini.record_kind(j);
                if !kind.is_dirty() {
                    continue;
                }
                mini.key_into(j, &mut key);
                let value = mini.value(j);
                let node = self.as_ref();
                let found = match node.search(&key) {
                    Search::Found(i) => Some((i, node.meta(i + FENCES).val_len())),
                    Search::NotFound(_) => None,
                };
                let apply = match (pass, kind, found) {
                    (0, RecordKind::Tombstone, Some((i, _))) => {
                        self.remove_at(i);
                        false
                    }
                    (1, RecordKind::Insert, Some((_, old))) => value.len() <= old,
                    (2, RecordKind::Insert, Some((_, old))) => value.len() > old,
                    (2, RecordKind::Insert, None) => true,
                    _ => false,
                };
                if apply && self.upsert(&key, value, RecordKind::Insert).is_err() {
                    debug_assert!(false, "merge_from: space check passed but upsert failed");
                    return Err(NoSpace);
                }
            }
        }
        Ok(())
    }

    /// Shifts metas from `slot` up by one and writes a new record there.
    fn insert_meta_at(&mut self, slot: usize, suffix: &[u8], value: &[u8], kind: u8, refb: bool) {
        let count = self.as_ref().count();
        self.buf
            .copy_within(meta_at(slot)..meta_at(count), meta_at(slot + 1));
        write_u16(self.buf, OFF_COUNT, (count + 1) as u16);
        let off = self.append_data(suffix, value);
        self.set_meta(
            slot,
            Meta::new(
                off,
                suffix.len(),
                value.len(),
                kind,
                refb,
                lookahead(suffix),
            ),
        );
    }

    /// Writes `a` then `b` just below the data region and returns their offset (0 if both
    /// are empty). The caller has checked the space.
    fn append_data(&mut self, a: &[u8], b: &[u8]) -> usize {
        let len = a.len() + b.len();
        if len == 0 {
            return 0;
        }
        let data_used = self.as_ref().data_used() + len;
        let off = self.buf.len() - data_used;
        self.buf[off..off + a.len()].copy_from_slice(a);
        self.buf[off + a.len()..off + len].copy_from_slice(b);
        write_u16(self.buf, OFF_DATA_USED, data_used as u16);
        off
    }

    /// Counts `n` more dead bytes.
    fn add_garbage(&mut self, n: usize) {
        let g = self.as_ref().garbage() + n;
        write_u16(self.buf, OFF_GARBAGE, g as u16);
    }

    /// Writes meta slot `slot`.
    #[inline]
    fn set_meta(&mut self, slot: usize, m: Meta) {
        write_u64(self.buf, meta_at(slot), m.0);
    }
}
