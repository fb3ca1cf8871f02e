//! What a range iterator copied out of a leaf and has not yielded yet, and the copying
//! itself, straight from the nodes (a key is its node's prefix and the record's suffix,
//! compared and copied in those two parts). Either of two forms:
//! - records copied back to back into one buffer reused from leaf to leaf (a leaf read under
//!   its lock, a mini-page merged over its page, folded merges);
//! - a private copy of a whole leaf whose records in range are all present (a lock-free
//!   refill already made one to validate): adopted as it is, its records are read in place
//!   as they are taken, and only the key taken last from each end is written out (prefix
//!   and suffix). Copying every record in range out first was half of the instructions a
//!   short in-memory scan executed, most for records it never took.
//!
//! Neither allocates per record; a record is copied into owned vectors only when the owned
//! iterator yields it.

use std::cmp::Ordering;
use std::collections::VecDeque;
use std::ops::Bound;

use crate::error::Result;
use crate::node::{NodeRef, RecordKind};
use crate::tree::KeyValue;

/// Copied records, in key order, taken from either end.
#[derive(Default)]
pub(in crate::tree) struct Copied {
    bytes: Vec<u8>,
    /// Each record's key offset in `bytes`, key length and value length (the value follows
    /// the key).
    spans: VecDeque<(usize, usize, usize)>,
    /// The key offset and length of the record last taken from the front, and from the
    /// back, since the last `clear` (its bytes stay until then).
    taken_front: Option<(usize, usize)>,
    taken_back: Option<(usize, usize)>,
    /// The adopted leaf, when `adopted`.
    leaf: InPlace,
    adopted: bool,
}

/// An adopted leaf: records `next..end` of `node` are not taken yet; `front` and `back`
/// start with the node's key prefix and hold, once `took_*`, the key taken last from that
/// end.
#[derive(Default)]
struct InPlace {
    node: Vec<u8>,
    next: usize,
    end: usize,
    prefix_len: usize,
    front: Vec<u8>,
    back: Vec<u8>,
    took_front: bool,
    took_back: bool,
}

impl Copied {
    /// Whether every copied record was taken.
    #[inline]
    pub(in crate::tree) fn is_empty(&self) -> bool {
        if self.adopted {
            self.leaf.next >= self.leaf.end
        } else {
            self.spans.is_empty()
        }
    }

    /// Bytes of memory held.
    pub(in crate::tree) fn capacity(&self) -> usize {
        self.bytes.capacity()
            + self.spans.capacity() * std::mem::size_of::<(usize, usize, usize)>()
            + self.leaf.node.capacity()
            + self.leaf.front.capacity()
            + self.leaf.back.capacity()
    }

    /// Forgets the records, keeping the memory for the next leaf.
    pub(in crate::tree) fn clear(&mut self) {
        self.bytes.clear();
        self.spans.clear();
        self.taken_front = None;
        self.taken_back = None;
        self.adopted = false;
        self.leaf.took_front = false;
        self.leaf.took_back = false;
    }

    /// Takes over `node`, a private copy of a leaf, swapping it with a buffer of its own, to
    /// yield its records between `start` and `end` in place. Only when this is empty (just
    /// cleared) and every record in that span is present; otherwise returns false and
    /// changes nothing.
    pub(in crate::tree) fn adopt(
        &mut self,
        node: &mut Vec<u8>,
        start: &Bound<Vec<u8>>,
        end: &Bound<Vec<u8>>,
    ) -> bool {
        if !self.bytes.is_empty() || !self.spans.is_empty() || self.adopted {
            return false;
        }
        let n = NodeRef::from_bytes(node);
        let span = span_of(n, start, end);
        if !n.all_exist(span.clone()) {
            return false;
        }
        let prefix = n.prefix();
        let leaf = &mut self.leaf;
        leaf.prefix_len = prefix.len();
        leaf.front.clear();
        leaf.front.extend_from_slice(prefix);
        leaf.back.clear();
        leaf.back.extend_from_slice(prefix);
        (leaf.next, leaf.end) = (span.start, span.end);
        std::mem::swap(node, &mut leaf.node);
        self.adopted = true;
        true
    }

    /// Makes room for a leaf of a `page_size` tree at once (its records, with the key
    /// prefix the node shares written out in each), instead of growing step by step on
    /// the first leaf of every scan.
    pub(in crate::tree) fn reserve_leaf(&mut self, page_size: usize) {
        if self.bytes.capacity() < page_size {
            self.bytes.reserve(2 * page_size);
            self.spans.reserve(page_size / 32);
        }
    }

    /// The key of the record last taken from the front since the last `clear`.
    #[inline]
    pub(in crate::tree) fn last_taken_front(&self) -> Option<&[u8]> {
        if self.leaf.took_front {
            return Some(&self.leaf.front);
        }
        self.taken_front.map(|(at, k)| &self.bytes[at..at + k])
    }

    /// The key of the record last taken from the back since the last `clear`.
    #[inline]
    pub(in crate::tree) fn last_taken_back(&self) -> Option<&[u8]> {
        if self.leaf.took_back {
            return Some(&self.leaf.back);
        }
        self.taken_back.map(|(at, k)| &self.bytes[at..at + k])
    }

    /// Appends a record (keys ascending).
    pub(in crate::tree) fn push(&mut self, key: &[u8], value: &[u8]) {
        debug_assert!(!self.adopted, "records pushed after a leaf adopted");
        self.spans
            .push_back((self.bytes.len(), key.len(), value.len()));
        self.bytes.extend_from_slice(key);
        self.bytes.extend_from_slice(value);
    }

    /// Appends a node's record: `slot` holds its key suffix (the first `suffix_len` bytes)
    /// and its value back to back, as nodes store them, so it is copied in one piece after
    /// the node's key prefix (keys ascending).
    pub(in crate::tree) fn push_slot(&mut self, prefix: &[u8], slot: &[u8], suffix_len: usize) {
        debug_assert!(!self.adopted, "records pushed after a leaf adopted");
        self.spans.push_back((
            self.bytes.len(),
            prefix.len() + suffix_len,
            slot.len() - suffix_len,
        ));
        if !prefix.is_empty() {
            self.bytes.extend_from_slice(prefix);
        }
        self.bytes.extend_from_slice(slot);
    }

    /// Appends a record whose key is `prefix + suffix` (keys ascending).
    pub(in crate::tree) fn push_joined(&mut self, prefix: &[u8], suffix: &[u8], value: &[u8]) {
        debug_assert!(!self.adopted, "records pushed after a leaf adopted");
        self.spans
            .push_back((self.bytes.len(), prefix.len() + suffix.len(), value.len()));
        self.bytes.extend_from_slice(prefix);
        self.bytes.extend_from_slice(suffix);
        self.bytes.extend_from_slice(value);
    }

    /// Appends records (keys ascending).
    pub(in crate::tree) fn extend(&mut self, records: impl IntoIterator<Item = KeyValue>) {
        for (k, v) in records {
            self.push(&k, &v);
        }
    }

    /// Takes the records out as owned pairs (for the rare changes `versions/saved.rs` makes),
    /// leaving this empty.
    pub(in crate::tree) fn take_all(&mut self) -> Vec<KeyValue> {
        if self.adopted {
            let leaf = &self.leaf;
            let node = NodeRef::from_bytes(&leaf.node);
            let prefix = node.prefix();
            let out = (leaf.next..leaf.end)
                .map(|i| {
                    (
                        [prefix, node.key_suffix(i)].concat(),
                        node.value(i).to_vec(),
                    )
                })
                .collect();
            self.clear();
            return out;
        }
        let out = self
            .spans
            .iter()
            .map(|&(at, k, v)| {
                (
                    self.bytes[at..at + k].to_vec(),
                    self.bytes[at + k..at + k + v].to_vec(),
                )
            })
            .collect();
        self.clear();
        out
    }

    /// Takes the first record: its key and value.
    #[inline]
    pub(in crate::tree) fn pop_front(&mut self) -> Option<(&[u8], &[u8])> {
        if self.adopted {
            let leaf = &mut self.leaf;
            if leaf.next >= leaf.end {
                return None;
            }
            let i = leaf.next;
            leaf.next += 1;
            leaf.took_front = true;
            return Some(lend_record(&leaf.node, i, &mut leaf.front, leaf.prefix_len));
        }
        let (at, k, v) = self.spans.pop_front()?;
        self.taken_front = Some((at, k));
        Some((&self.bytes[at..at + k], &self.bytes[at + k..at + k + v]))
    }

    /// Takes the last record: its key and value.
    #[inline]
    pub(in crate::tree) fn pop_back(&mut self) -> Option<(&[u8], &[u8])> {
        if self.adopted {
            let leaf = &mut self.leaf;
            if leaf.next >= leaf.end {
                return None;
            }
            leaf.end -= 1;
            let i = leaf.end;
            leaf.took_back = true;
            return Some(lend_record(&leaf.node, i, &mut leaf.back, leaf.prefix_len));
        }
        let (at, k, v) = self.spans.pop_back()?;
        self.taken_back = Some((at, k));
        Some((&self.bytes[at..at + k], &self.bytes[at + k..at + k + v]))
    }
}

/// Record `i` of an adopted leaf's `node`: its value in place, its key written into `key`
/// after the node's prefix (the first `prefix_len` bytes of `key`).
#[inline]
fn lend_record<'a>(
    node: &'a [u8],
    i: usize,
    key: &'a mut Vec<u8>,
    prefix_len: usize,
) -> (&'a [u8], &'a [u8]) {
    let (slot, suffix_len) = NodeRef::from_bytes(node).record_slot(i);
    let (suffix, value) = slot.split_at(suffix_len);
    key.truncate(prefix_len);
    key.extend_from_slice(suffix);
    (key, value)
}

/// The indexes of `node`'s records between `start` and `end`.
pub(in crate::tree) fn span_of(
    node: NodeRef<'_>,
    start: &Bound<Vec<u8>>,
    end: &Bound<Vec<u8>>,
) -> std::ops::Range<usize> {
    let from = match start {
        Bound::Unbounded => 0,
        Bound::Included(k) => node.lower_bound(k),
        Bound::Excluded(k) => node.upper_bound(k),
    };
    let to = match end {
        Bound::Unbounded => node.len(),
        Bound::Included(k) => node.upper_bound(k),
        Bound::Excluded(k) => node.lower_bound(k),
    };
    from..to.max(from)
}

/// Orders the key `a.0 + a.1` against the key `b.0 + b.1` (a node's prefix and a record's
/// suffix) without joining either.
pub(in crate::tree) fn cmp_joined(mut a: [&[u8]; 2], mut b: [&[u8]; 2]) -> Ordering {
    let (mut i, mut j) = (0, 0);
    loop {
        while i < 2 && a[i].is_empty() {
            i += 1;
        }
        while j < 2 && b[j].is_empty() {
            j += 1;
        }
        if i == 2 || j == 2 {
            return (i == 2).cmp(&(j == 2)).reverse();
        }
        let n = a[i].len().min(b[j].len());
        match a[i][..n].cmp(&b[j][..n]) {
            Ordering::Equal => {}
            unequal => return unequal,
        }
        a[i] = &a[i][n..];
        b[j] = &b[j][n..];
    }
}

/// Copies the present records of a node that decides every key in its range (a full-page
/// mirror, or a mini-page with no page below and no pending merges) between `start` and
/// `end` into `out`.
pub(in crate::tree) fn copy_present(
    node: NodeRef<'_>,
    start: &Bound<Vec<u8>>,
    end: &Bound<Vec<u8>>,
    out: &mut Copied,
) {
    let prefix = node.prefix();
    for i in span_of(node, start, end) {
        if node.record_kind(i).exists() {
            let (slot, suffix_len) = node.record_slot(i);
            out.push_slot(prefix, slot, suffix_len);
        }
    }
}

/// Newest-wins merge of a leaf page's records (`base`, all present) with a mini-page's
/// (`over`), between `start` and `end`, into `out`: a mini-page record replaces the leaf's
/// record with the same key, and hides it when it is a tombstone or phantom; pending merges
/// (Upsert records) go to `fold` with the leaf's value. Records are copied straight from
/// both nodes, so nothing is allocated but what a fold returns.
pub(in crate::tree) fn overlay(
    base: NodeRef<'_>,
    over: Option<NodeRef<'_>>,
    start: &Bound<Vec<u8>>,
    end: &Bound<Vec<u8>>,
    out: &mut Copied,
    fold: impl Fn(&[u8], Option<&[u8]>, &[u8]) -> Result<Option<Vec<u8>>>,
) -> Result<()> {
    let mut b = span_of(base, start, end).peekable();
    // Without a mini-page the span over it is empty (`base` only stands in for the node).
    let (over, over_span) = match over {
        Some(o) => (o, span_of(o, start, end)),
        None => (base, 0..0),
    };
    let (bp, op) = (base.prefix(), over.prefix());
    for j in over_span {
        let ok = [op, over.key_suffix(j)];
        while let Some(&i) = b.peek() {
            if cmp_joined([bp, base.key_suffix(i)], ok) != Ordering::Less {
                break;
            }
            let (slot, suffix_len) = base.record_slot(i);
            out.push_slot(bp, slot, suffix_len);
            b.next();
        }
        let below = b
            .next_if(|&i| cmp_joined([bp, base.key_suffix(i)], ok) == Ordering::Equal)
            .map(|i| base.value(i));
        let kind = over.record_kind(j);
        if kind == RecordKind::Upsert {
            let key = [ok[0], ok[1]].concat();
            if let Some(v) = fold(&key, below, over.value(j))? {
                out.push_joined(&key, &[], &v);
            }
        } else if kind.exists() {
            let (slot, suffix_len) = over.record_slot(j);
            out.push_slot(op, slot, suffix_len);
        }
    }
    for i in b {
        let (slot, suffix_len) = base.record_slot(i);
        out.push_slot(bp, slot, suffix_len);
    }
    Ok(())
}

/// Folds the pending merges of a mini-page with no page below over nothing, copying its
/// records between `start` and `end` into `out`.
pub(in crate::tree) fn fold_alone(
    node: NodeRef<'_>,
    start: &Bound<Vec<u8>>,
    end: &Bound<Vec<u8>>,
    out: &mut Copied,
    fold: impl Fn(&[u8], Option<&[u8]>, &[u8]) -> Result<Option<Vec<u8>>>,
) -> Result<()> {
    let prefix = node.prefix();
    for i in span_of(node, start, end) {
        match node.record_kind(i) {
            RecordKind::Upsert => {
                let key = [prefix, node.key_suffix(i)].concat();
                if let Some(v) = fold(&key, None, node.value(i))? {
                    out.push_joined(&key, &[], &v);
                }
            }
            kind if kind.exists() => {
                let (slot, suffix_len) = node.record_slot(i);
                out.push_slot(prefix, slot, suffix_len);
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joined_keys_order_as_their_concatenations() {
        let keys: [&[u8]; 8] = [b"", b"a", b"ab", b"abc", b"abd", b"b", b"ba", b"\xffa"];
        for a in keys {
            for b in keys {
                let want = a.cmp(b);
                for i in 0..=a.len() {
                    for j in 0..=b.len() {
                        let got = cmp_joined([&a[..i], &a[i..]], [&b[..j], &b[j..]]);
                        assert_eq!(got, want, "{a:?} split at {i} vs {b:?} split at {j}");
                    }
                }
            }
        }
    }

    /// A node of kind `kind` between "k" and "l" holding `records`.
    fn node(kind: crate::node::NodeKind, records: &[(&[u8], &[u8], RecordKind)]) -> Vec<u8> {
        let mut buf = vec![0; 4096];
        let mut n = crate::node::NodeMut::init(&mut buf, kind, Some(b"k"), Some(b"l"));
        for &(k, v, kind) in records {
            n.upsert(k, v, kind).unwrap();
        }
        buf
    }

    #[test]
    fn an_adopted_leaf_yields_its_span_in_place_from_both_ends() {
        use crate::node::NodeKind;
        let records: [(&[u8], &[u8], RecordKind); 4] = [
            (b"ka", b"1", RecordKind::Insert),
            (b"kb", b"22", RecordKind::Insert),
            (b"kc", b"", RecordKind::Insert),
            (b"kd", b"4444", RecordKind::Insert),
        ];
        let mut buf = node(NodeKind::Leaf, &records);
        let original = buf.clone();
        let mut c = Copied::default();
        let (from, to) = (
            Bound::Excluded(b"ka".to_vec()),
            Bound::Included(b"kd".to_vec()),
        );
        assert!(c.adopt(&mut buf, &from, &to));
        assert!(
            buf.is_empty(),
            "the caller gets the copier's old buffer back"
        );
        assert!(!c.is_empty());
        assert_eq!(c.last_taken_front(), None);
        assert_eq!(c.pop_front(), Some((&b"kb"[..], &b"22"[..])));
        assert_eq!(c.pop_back(), Some((&b"kd"[..], &b"4444"[..])));
        assert_eq!(c.last_taken_front(), Some(&b"kb"[..]));
        assert_eq!(c.last_taken_back(), Some(&b"kd"[..]));
        // A second adoption needs a clear first.
        let mut other = original.clone();
        assert!(!c.adopt(&mut other, &Bound::Unbounded, &Bound::Unbounded));
        assert_eq!(other, original);
        assert_eq!(c.take_all(), vec![(b"kc".to_vec(), Vec::new())]);
        assert!(c.is_empty());
        assert_eq!(c.pop_front(), None);
        assert_eq!(c.last_taken_front(), None);
        // Once cleared it copies again, and adopts again.
        c.push(b"x", b"y");
        assert_eq!(c.pop_back(), Some((&b"x"[..], &b"y"[..])));
        c.clear();
        assert!(c.adopt(
            &mut other,
            &Bound::Unbounded,
            &Bound::Excluded(b"kb".to_vec())
        ));
        assert_eq!(c.pop_back(), Some((&b"ka"[..], &b"1"[..])));
        assert_eq!(c.pop_front(), None);
        assert!(c.is_empty());
    }

    #[test]
    fn a_span_with_an_absent_record_is_not_adopted() {
        use crate::node::NodeKind;
        let mut buf = node(
            NodeKind::Mini,
            &[
                (b"ka", b"1", RecordKind::Insert),
                (b"kb", b"", RecordKind::Tombstone),
            ],
        );
        let original = buf.clone();
        let mut c = Copied::default();
        assert!(!c.adopt(&mut buf, &Bound::Unbounded, &Bound::Unbounded));
        assert_eq!(buf, original);
        assert!(c.is_empty());
        // The span without the tombstone is.
        assert!(c.adopt(
            &mut buf,
            &Bound::Unbounded,
            &Bound::Excluded(b"kb".to_vec())
        ));
        assert_eq!(c.take_all(), vec![(b"ka".to_vec(), b"1".to_vec())]);
    }

    #[test]
    fn records_come_out_from_both_ends_and_round_trip() {
        let mut c = Copied::default();
        assert!(c.is_empty());
        c.push(b"a", b"1");
        c.extend([(b"bb".to_vec(), Vec::new()), (Vec::new(), b"333".to_vec())]);
        assert_eq!(c.pop_front(), Some((&b"a"[..], &b"1"[..])));
        assert_eq!(c.pop_back(), Some((&b""[..], &b"333"[..])));
        assert_eq!(c.take_all(), vec![(b"bb".to_vec(), Vec::new())]);
        assert!(c.is_empty());
        assert_eq!(c.pop_front(), None);
        c.push(b"k", b"v");
        c.clear();
        assert_eq!(c.pop_back(), None);
        assert_eq!(c.last_taken_front(), None);
        c.push_slot(b"p", b"kkvalue", 2);
        c.push_slot(b"", b"zv", 1);
        assert_eq!(c.last_taken_back(), None);
        assert_eq!(c.pop_back(), Some((&b"z"[..], &b"v"[..])));
        assert_eq!(c.pop_front(), Some((&b"pkk"[..], &b"value"[..])));
        assert_eq!(c.last_taken_front(), Some(&b"pkk"[..]));
        assert_eq!(c.last_taken_back(), Some(&b"z"[..]));
        c.clear();
        assert_eq!((c.last_taken_front(), c.last_taken_back()), (None, None));
    }
}
