//! Reading a node a writer may be changing at the same time: an optimistic read
//! (`pool/optimistic.rs`) sees the node only through `load(i)`, the node's `i`-th 8-byte word
//! as memory holds it, which may be torn. So every offset and length here is clamped, every
//! loop is bounded, and every answer is a plain value: garbage gives a wrong answer, never a
//! panic, an endless loop or a huge allocation, and the caller keeps an answer only after the
//! read validated. On a node nobody changes, each answer is exactly [`NodeRef`]'s (the tests
//! compare them on many nodes).
//!
//! Unlike a copy of the whole node, this touches what a locked lookup touches: the header,
//! the metas a binary search visits, the key bytes of look-ahead ties, and the value.
//!
//! [`NodeRef`]: super::NodeRef

use std::cmp::Ordering;

use super::layout::{
    lookahead, Meta, FENCES, META_SIZE, OFF_COUNT, OFF_DATA_USED, OFF_DISK_PAGE, OFF_KIND,
    OFF_PREFIX_LEN,
};
use super::{NodeKind, RecordKind, Search, HEADER_SIZE};

/// How a [`RacyNode`] sees the node's memory.
pub(crate) trait Words {
    /// Word `i` (bytes `8 * i..8 * i + 8`) as memory holds it; 0 past the node.
    fn word(&self, i: usize) -> u64;
    /// Appends bytes `at..at + len` to `out` (the caller keeps them inside the node), each
    /// read once: what a check made of them stays true of the copy.
    fn copy(&self, at: usize, len: usize, out: &mut Vec<u8>);
    /// Starts loading the cache line of byte `at` (a hint; nothing by default).
    #[inline]
    fn prefetch(&self, _at: usize) {}
}

/// A node of `size` bytes read through `load`.
pub(crate) struct RacyNode<L> {
    load: L,
    size: usize,
    /// Records (fences excluded), clamped to what metas the node could hold.
    len: usize,
    kind: Option<NodeKind>,
    disk_page: u64,
    /// Where the prefix's bytes are (the low fence's start) and how many.
    prefix_at: usize,
    prefix_len: usize,
    data_used: usize,
}

impl<L: Words> RacyNode<L> {
    /// Reads the header of the `size`-byte node `load` shows.
    pub(crate) fn new(size: usize, load: L) -> RacyNode<L> {
        let mut node = RacyNode {
            load,
            size,
            len: 0,
            kind: None,
            disk_page: u64::MAX,
            prefix_at: 0,
            prefix_len: 0,
            data_used: 0,
        };
        if size < HEADER_SIZE + FENCES * META_SIZE {
            return node;
        }
        let count = usize::from(node.u16_at(OFF_COUNT));
        node.len = count
            .min((size - HEADER_SIZE) / META_SIZE)
            .saturating_sub(FENCES);
        node.kind = NodeKind::from_u8(node.byte(OFF_KIND));
        node.disk_page = node.word(OFF_DISK_PAGE / 8);
        let low = node.meta(0);
        node.prefix_at = low.offset();
        node.prefix_len = usize::from(node.u16_at(OFF_PREFIX_LEN)).min(low.key_len());
        if node.prefix_at + node.prefix_len > size {
            // Torn: no node holds its prefix outside itself.
            node.prefix_len = 0;
        }
        node.data_used = usize::from(node.u16_at(OFF_DATA_USED)).min(size);
        node
    }

    /// Word `i` of the node as little-endian bytes' value (0 past the end).
    fn word(&self, i: usize) -> u64 {
        if i >= self.size / 8 {
            return 0;
        }
        u64::from_le_bytes(self.load.word(i).to_ne_bytes())
    }

    /// The byte at `at` (0 past the end).
    fn byte(&self, at: usize) -> u8 {
        (self.word(at / 8) >> (8 * (at % 8))) as u8
    }

    /// The little-endian `u16` at `at`.
    fn u16_at(&self, at: usize) -> u16 {
        u16::from(self.byte(at)) | (u16::from(self.byte(at + 1)) << 8)
    }

    /// The meta in slot `slot` (metas are 8-aligned: one word each).
    fn meta(&self, slot: usize) -> Meta {
        Meta(self.word((HEADER_SIZE + slot * META_SIZE) / 8))
    }

    /// The 8 bytes at `at` (past the node: zeros) as a big-endian number, so that numbers
    /// order as the bytes do.
    #[inline]
    fn be_at(&self, at: usize) -> u64 {
        let (w, shift) = (at / 8, 8 * (at % 8) as u32);
        let low = self.word(w);
        let le = if shift == 0 {
            low
        } else {
            (low >> shift) | (self.word(w + 1) << (64 - shift))
        };
        le.swap_bytes()
    }

    /// Orders the node's bytes `at..at + len` against `other`, 8 bytes at a time.
    fn cmp_bytes(&self, at: usize, len: usize, other: &[u8]) -> Ordering {
        let len = len.min(self.size.saturating_sub(at));
        let n = len.min(other.len());
        let mut i = 0;
        while i < n {
            let take = (n - i).min(8);
            let mut theirs = 0u64;
            for (k, &b) in other[i..i + take].iter().enumerate() {
                theirs |= u64::from(b) << (56 - 8 * k);
            }
            let mask = u64::MAX << (8 * (8 - take));
            match (self.be_at(at + i) & mask).cmp(&theirs) {
                Ordering::Equal => i += take,
                unequal => return unequal,
            }
        }
        len.cmp(&other.len())
    }

    /// Appends the node's bytes `at..at + len` (clamped to the node) to `out`.
    fn copy_bytes(&self, at: usize, len: usize, out: &mut Vec<u8>) {
        let end = at.saturating_add(len).min(self.size);
        if at < end {
            self.load.copy(at, end - at, out);
        }
    }

    /// What the node is used as (`None` for an unknown kind byte).
    pub(crate) fn kind(&self) -> Option<NodeKind> {
        self.kind
    }

    /// For a mini-page: the disk page of its leaf.
    pub(crate) fn disk_page(&self) -> Option<u64> {
        (self.disk_page != u64::MAX).then_some(self.disk_page)
    }

    /// Searches a full key, as [`NodeRef::search`](super::NodeRef::search).
    pub(crate) fn search(&self, key: &[u8]) -> Search {
        if key.len() >= self.prefix_len {
            // The prefix's bytes sit at the node's far end, on a line of their own: search
            // the suffix while that line loads, then check the prefix (a key routed to this
            // node almost always has it).
            self.load.prefetch(self.prefix_at);
            let found = self.search_suffix(&key[self.prefix_len..]);
            return match self.cmp_bytes(self.prefix_at, self.prefix_len, &key[..self.prefix_len]) {
                Ordering::Equal => found,
                Ordering::Greater => Search::NotFound(0),
                Ordering::Less => Search::NotFound(self.len),
            };
        }
        match self.cmp_bytes(self.prefix_at, key.len(), key) {
            // The key is a proper prefix of the prefix, or sorts below it.
            Ordering::Equal | Ordering::Greater => Search::NotFound(0),
            Ordering::Less => Search::NotFound(self.len),
        }
    }

    /// Binary search for a key suffix, look-ahead first (as `NodeRef::search_suffix`).
    fn search_suffix(&self, suffix: &[u8]) -> Search {
        let la = lookahead(suffix);
        let (mut lo, mut hi) = (0, self.len);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let m = self.meta(mid + FENCES);
            let ord = match m.lookahead().cmp(&la) {
                Ordering::Equal => self.cmp_bytes(m.offset(), m.key_len(), suffix),
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

    /// Record `i`'s meta, loaded once: its kind and reference bit, and where its bytes are.
    #[inline]
    pub(crate) fn record(&self, i: usize) -> RacyRecord {
        RacyRecord(self.meta(i + FENCES))
    }

    /// Appends the value of `record` to `out`.
    pub(crate) fn value_into(&self, record: RacyRecord, out: &mut Vec<u8>) {
        let m = record.0;
        self.copy_bytes(m.offset() + m.key_len(), m.val_len(), out);
    }

    /// Starts loading every line of the node's metas at once, so that a binary search over
    /// them waits on about one load from memory rather than on one per step.
    pub(crate) fn prefetch_metas(&self) {
        let end = (HEADER_SIZE + (self.len + FENCES) * META_SIZE).min(self.size);
        for at in (HEADER_SIZE..end).step_by(64) {
            self.load.prefetch(at);
        }
    }

    /// Starts loading the lines a search for `key` would compare bytes on: the prefix's,
    /// and the first record's whose look-ahead bytes are not below the key's. A hint for a
    /// batch of searches, so that their last misses overlap; it reads only the header and
    /// the metas, and decides nothing.
    pub(crate) fn prefetch_search(&self, key: &[u8]) {
        self.load.prefetch(self.prefix_at);
        let Some(suffix) = key.get(self.prefix_len..) else {
            return;
        };
        let la = lookahead(suffix);
        let (mut lo, mut hi) = (0, self.len);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.meta(mid + FENCES).lookahead() < la {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        if lo < self.len {
            self.load.prefetch(self.meta(lo + FENCES).offset());
        }
    }

    /// Where the metas end and where the data region starts: a copy of the node's bytes
    /// before the first and from the second reads as the whole node (nothing reads the free
    /// space between). Both inside the node.
    pub(crate) fn used_extent(&self) -> (usize, usize) {
        let metas_end = (HEADER_SIZE + (self.len + FENCES) * META_SIZE).min(self.size);
        (metas_end, (self.size - self.data_used).max(metas_end))
    }
}

/// One record's meta as a [`RacyNode`] loaded it.
#[derive(Clone, Copy)]
pub(crate) struct RacyRecord(Meta);

impl RacyRecord {
    /// The record's kind (an invalid kind reads as Insert, as in `NodeRef`).
    #[inline]
    pub(crate) fn kind(self) -> RecordKind {
        RecordKind::from_u8(self.0.kind()).unwrap_or(RecordKind::Insert)
    }

    /// The record's reference bit.
    pub(crate) fn ref_bit(self) -> bool {
        self.0.ref_bit()
    }
}

#[cfg(all(test, not(shuttle)))]
mod tests {
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::node::{NodeMut, NodeRef};

    /// A node's bytes, seen as an optimistic read sees them, and the offsets of the lines
    /// requested from it.
    struct Plain<'a>(&'a [u8], std::cell::RefCell<Vec<usize>>);

    impl Words for Plain<'_> {
        fn prefetch(&self, at: usize) {
            self.1.borrow_mut().push(at);
        }
        fn word(&self, i: usize) -> u64 {
            self.0
                .get(i * 8..i * 8 + 8)
                .map_or(0, |w| u64::from_ne_bytes(w.try_into().unwrap()))
        }
        fn copy(&self, at: usize, len: usize, out: &mut Vec<u8>) {
            out.extend_from_slice(&self.0[at..at + len]);
        }
    }

    fn racy(buf: &[u8]) -> RacyNode<Plain<'_>> {
        RacyNode::new(buf.len(), Plain(buf, std::cell::RefCell::default()))
    }

    /// A node of `size` bytes between `low` and `high` filled with random records.
    fn random_node(rng: &mut SmallRng, size: usize, low: &[u8], high: &[u8]) -> Vec<u8> {
        let mut buf = vec![0; size];
        let kind = if rng.gen_bool(0.5) {
            NodeKind::Leaf
        } else {
            NodeKind::Mini
        };
        let mut n = NodeMut::init(&mut buf, kind, Some(low), Some(high));
        for _ in 0..rng.gen_range(0..200) {
            let mut key = low.to_vec();
            for _ in 0..rng.gen_range(0..6) {
                key.push(rng.gen_range(b'a'..b'e'));
            }
            if key.as_slice() >= high {
                continue;
            }
            let value = vec![rng.gen::<u8>(); rng.gen_range(0..20)];
            let kind =
                [RecordKind::Insert, RecordKind::Cache, RecordKind::Tombstone][rng.gen_range(0..3)];
            let _ = n.upsert(&key, &value, kind);
        }
        buf
    }

    #[test]
    fn answers_as_the_node_does() {
        let mut rng = SmallRng::seed_from_u64(7);
        for round in 0..300 {
            let size = [64, 128, 512, 4096][round % 4];
            let buf = random_node(&mut rng, size, b"pre:a", b"pre:e");
            let (node, r) = (NodeRef::from_bytes(&buf), racy(&buf));
            assert_eq!(r.len, node.len());
            assert_eq!(r.kind(), Some(node.kind()));
            assert_eq!(r.disk_page(), node.disk_page());
            for probe in [
                &b""[..],
                b"pre",
                b"pre:",
                b"pre:a",
                b"pre:ab",
                b"pre:dd",
                b"q",
                b"pre:e",
                // As long as the prefix or longer, outside it: below and above.
                b"pra:zz",
                b"pre9",
                b"pre;",
                b"pre;ab",
            ]
            .into_iter()
            .map(<[u8]>::to_vec)
            .chain((0..node.len()).map(|i| {
                let mut k = Vec::new();
                node.key_into(i, &mut k);
                k
            })) {
                assert_eq!(r.search(&probe), node.search(&probe), "{probe:?}");
            }
            let (metas_end, data_start) = r.used_extent();
            let mut copy = vec![0x5A; size];
            copy[..metas_end].copy_from_slice(&buf[..metas_end]);
            copy[data_start..].copy_from_slice(&buf[data_start..]);
            let seen = NodeRef::from_bytes(&copy);
            for i in 0..node.len() {
                assert_eq!(seen.record_slot(i), node.record_slot(i), "used extent");
                assert_eq!(r.record(i).kind(), node.record_kind(i));
                assert_eq!(r.record(i).ref_bit(), node.ref_bit(i));
                let mut v = Vec::new();
                r.value_into(r.record(i), &mut v);
                assert_eq!(v, node.value(i));
            }
        }
    }

    #[test]
    fn a_search_hint_requests_the_prefix_and_the_record_compared() {
        let mut rng = SmallRng::seed_from_u64(8);
        let mut checked = 0;
        for round in 0..300 {
            let size = [128, 512, 4096][round % 3];
            let buf = random_node(&mut rng, size, b"pre:a", b"pre:e");
            let (node, r) = (NodeRef::from_bytes(&buf), racy(&buf));
            let suffixes: Vec<&[u8]> = (0..node.len()).map(|i| node.key_suffix(i)).collect();
            for (i, suffix) in suffixes.iter().enumerate() {
                let mut key = Vec::new();
                node.key_into(i, &mut key);
                r.load.1.borrow_mut().clear();
                r.prefetch_search(&key);
                let asked = r.load.1.borrow().clone();
                assert!(
                    asked.iter().all(|&at| at < size),
                    "{asked:?} outside the node"
                );
                assert_eq!(asked.first(), Some(&r.prefix_at), "the prefix's line first");
                // Where no other record shares its look-ahead bytes, the record found is the
                // one whose bytes the hint requested.
                let la = lookahead(suffix);
                if suffixes.iter().filter(|s| lookahead(s) == la).count() == 1 {
                    let at = r.meta(i + FENCES).offset();
                    assert_eq!(asked.get(1), Some(&at), "record {i} of {}", node.len());
                    checked += 1;
                }
            }
            // A key shorter than the prefix requests only the prefix's line.
            r.load.1.borrow_mut().clear();
            r.prefetch_search(b"pr");
            assert_eq!(*r.load.1.borrow(), [r.prefix_at]);
        }
        assert!(checked > 200, "only {checked} records checked");
    }

    #[test]
    fn garbage_never_panics_and_stays_bounded() {
        let mut rng = SmallRng::seed_from_u64(9);
        for round in 0..2000 {
            let size = [64, 256, 4096][round % 3];
            let mut buf = random_node(&mut rng, size, b"k", b"l");
            // Tear it: overwrite random words (header and metas included) with noise.
            for _ in 0..rng.gen_range(1..16) {
                let w = rng.gen_range(0..size / 8);
                let noise: u64 = rng.gen();
                buf[w * 8..w * 8 + 8].copy_from_slice(&noise.to_ne_bytes());
            }
            let r = racy(&buf);
            assert!(r.len <= size / 8);
            let _ = (r.kind(), r.disk_page(), r.search(b"kab"), r.search(b"z"));
            r.prefetch_search(b"kab");
            r.prefetch_metas();
            let (metas_end, data_start) = r.used_extent();
            assert!(metas_end <= data_start && data_start <= size);
            for i in 0..r.len {
                let record = r.record(i);
                let _ = (record.kind(), record.ref_bit());
                let mut value = Vec::new();
                r.value_into(record, &mut value);
                assert!(value.len() <= size);
            }
        }
    }
}
