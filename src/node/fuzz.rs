//! The `node_decode` fuzz check: untrusted bytes through `from_bytes_checked`, and every
//! accepted node cross-checked against a linear scan of its records.

use super::{NodeKind, NodeMut, NodeRef, RecordKind, Search};

/// Decodes fuzz input as a node and checks it.
///
/// `data[0]` picks the node size (`64 << (b % 11)`) and the mode. Raw mode (bit 7 clear):
/// the rest is the page itself (zero-padded or cut), and whatever follows the page are probe
/// keys. Mutate mode (bit 7 set): the rest describes records to upsert into a fresh node
/// (which must validate), then byte edits to apply to it, so that the fuzzer explores pages
/// close to valid ones. Panics on any inconsistency.
pub(crate) fn decode_check(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let size = super::MIN_NODE << (sel % 11);
    let (page, probes) = if sel & 0x80 == 0 {
        let mut page = vec![0u8; size];
        let n = rest.len().min(size);
        page[..n].copy_from_slice(&rest[..n]);
        (page, &rest[n..])
    } else {
        (built_then_mutated(size, sel & 0x40 != 0, rest), &[][..])
    };
    if let Ok(node) = NodeRef::from_bytes_checked(&page) {
        check_consistent(node, probes);
    }
}

/// Reads fuzz input byte by byte, zeros once exhausted.
struct Cursor<'d> {
    /// What is left.
    rest: &'d [u8],
}

impl Cursor<'_> {
    /// The next byte, or 0.
    fn byte(&mut self) -> u8 {
        match self.rest.split_first() {
            Some((&b, rest)) => {
                self.rest = rest;
                b
            }
            None => 0,
        }
    }
}

/// Builds a node from `input` (record descriptions, then 3-byte edits) and applies the edits.
fn built_then_mutated(size: usize, infinite: bool, input: &[u8]) -> Vec<u8> {
    let mut cur = Cursor { rest: input };
    let prefix = vec![b'p'; usize::from(cur.byte() % 8)];
    let high = [prefix.clone(), vec![0xFF]].concat();
    let (low, high) = if infinite {
        (None, None)
    } else {
        (Some(&prefix[..]), Some(&high[..]))
    };
    let kind = NodeKind::from_u8(cur.byte() % 3 + 1).unwrap_or(NodeKind::Leaf);
    let mut page = vec![0u8; size];
    let mut node = NodeMut::init(&mut page, kind, low, high);
    let records = cur.byte();
    let mut key = Vec::new();
    for _ in 0..records {
        let (klen, vlen, code) = (cur.byte() % 24, cur.byte() % 64, cur.byte());
        key.clear();
        key.extend_from_slice(&prefix);
        key.extend((0..klen).map(|_| cur.byte()));
        let mut value: Vec<u8> = (0..vlen).map(|_| cur.byte()).collect();
        let mut rk = RecordKind::from_u8(code % 5).unwrap_or(RecordKind::Insert);
        if kind == NodeKind::Inner {
            value.resize(8, 0);
            rk = RecordKind::Insert;
        }
        if code >= 0xF0 {
            // Removal exercises remove_at and garbage accounting.
            if let Search::Found(i) = node.as_ref().search(&key) {
                node.remove_at(i);
            }
        } else if code >= 0xE0 {
            node.compact();
        } else {
            let _ = node.upsert(&key, &value, rk);
        }
    }
    if let Err(e) = NodeRef::from_bytes_checked(&page) {
        panic!("a node built by NodeMut fails validation: {e:?}");
    }
    for edit in cur.rest.chunks_exact(3) {
        let at = usize::from(u16::from_le_bytes([edit[0], edit[1]])) % size;
        page[at] ^= edit[2];
    }
    page
}

/// Cross-checks an accepted node against a linear scan of its records.
fn check_consistent(node: NodeRef<'_>, probes: &[u8]) {
    let mut keys: Vec<Vec<u8>> = Vec::with_capacity(node.len());
    let mut key = Vec::new();
    for i in 0..node.len() {
        node.key_into(i, &mut key);
        let _ = (node.value(i), node.record_kind(i), node.ref_bit(i));
        if let Some(p) = keys.last() {
            assert!(*p < key, "records not sorted");
        }
        keys.push(key.clone());
    }
    for i in (0..node.len()).rev() {
        node.key_into(i, &mut key);
        assert_eq!(key, keys[i]);
        assert_eq!(node.search(&key), Search::Found(i));
        assert_eq!(node.get(&key).map(|g| g.0), Some(i));
    }
    let mut probe_keys: Vec<Vec<u8>> = probes.chunks(5).map(<[u8]>::to_vec).collect();
    for k in &keys {
        probe_keys.push([k.as_slice(), &[0]].concat());
        probe_keys.push(k[..k.len() / 2].to_vec());
        if let Some((last, head)) = k.split_last() {
            probe_keys.push([head, &[last.wrapping_add(1)]].concat());
        }
    }
    probe_keys.push(Vec::new());
    for p in &probe_keys {
        let lower = keys.iter().filter(|k| *k < p).count();
        let upper = keys.iter().filter(|k| *k <= p).count();
        assert_eq!(
            node.lower_bound(p),
            lower,
            "lower_bound disagrees with a scan"
        );
        assert_eq!(
            node.upper_bound(p),
            upper,
            "upper_bound disagrees with a scan"
        );
        let expect = if upper > lower {
            Search::Found(lower)
        } else {
            Search::NotFound(lower)
        };
        assert_eq!(node.search(p), expect);
        assert_eq!(node.child_index(p), upper.saturating_sub(1));
    }
    let _ = (
        node.disk_page(),
        node.flags(),
        node.dirty_count(),
        node.prefix(),
    );
    let _ = (
        node.low_fence_stored(),
        node.high_fence_stored(),
        node.fits(b"k", 3),
    );
    if node.kind() == NodeKind::Inner {
        for i in 0..node.len() {
            let _ = node.child(i);
        }
    }
    assert!(node.used_bytes() <= node.size());
    assert_eq!(node.used_bytes() + node.free_space(), node.size());
}
