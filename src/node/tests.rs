//! Unit tests of the node layout, one operation each.

use super::*;
use crate::Limits;

/// A pair of optional bounds.
type Bounds<'a> = (Option<&'a [u8]>, Option<&'a [u8]>);

/// Every record kind.
const KINDS: [RecordKind; 5] = [
    RecordKind::Insert,
    RecordKind::Cache,
    RecordKind::Tombstone,
    RecordKind::Phantom,
    RecordKind::Upsert,
];

/// A node buffer of `size` bytes.
pub(super) fn buf(size: usize) -> Vec<u8> {
    vec![0xEE; size]
}

/// Full keys of all records.
pub(super) fn keys(n: NodeRef<'_>) -> Vec<Vec<u8>> {
    let mut k = Vec::new();
    (0..n.len())
        .map(|i| {
            n.key_into(i, &mut k);
            k.clone()
        })
        .collect()
}

/// Asserts the node validates as untrusted bytes.
pub(super) fn valid(n: NodeRef<'_>) {
    if let Err(e) = NodeRef::from_bytes_checked(n.bytes()) {
        panic!("node we built fails validation: {e:?}");
    }
}

#[test]
fn empty_node_with_infinite_fences() {
    let mut b = buf(64);
    let n = NodeMut::init(&mut b, NodeKind::Mini, None, None);
    let r = n.as_ref();
    assert_eq!(
        (r.kind(), r.size(), r.len(), r.is_empty()),
        (NodeKind::Mini, 64, 0, true)
    );
    assert_eq!((r.prefix(), r.disk_page(), r.flags()), (&b""[..], None, 0));
    assert_eq!(r.used_bytes(), 48);
    assert_eq!(r.free_space(), 16);
    assert_eq!(r.search(b"x"), Search::NotFound(0));
    assert!(
        r.bytes()[..8].iter().all(|&x| x == 0xEE),
        "checksum bytes touched"
    );
    valid(r);
}

#[test]
fn search_with_prefix_and_keys_outside_it() {
    let mut b = buf(4096);
    let mut n = NodeMut::init(
        &mut b,
        NodeKind::Leaf,
        Some(b"user:1000"),
        Some(b"user:2000"),
    );
    assert_eq!(n.as_ref().prefix(), b"user:");
    for k in ["user:1500", "user:1000", "user:1999", "user:1", "user:"] {
        n.upsert(k.as_bytes(), k.as_bytes(), RecordKind::Insert)
            .unwrap();
    }
    let r = n.as_ref();
    assert_eq!(r.key_suffix(0), b"");
    assert_eq!(
        keys(r),
        [
            &b"user:"[..],
            b"user:1",
            b"user:1000",
            b"user:1500",
            b"user:1999"
        ]
    );
    assert_eq!(r.search(b"user:1500"), Search::Found(3));
    assert_eq!(r.search(b"user:15"), Search::NotFound(3));
    assert_eq!(r.search(b"user"), Search::NotFound(0));
    assert_eq!(r.search(b"a"), Search::NotFound(0));
    assert_eq!(r.search(b"usez"), Search::NotFound(5));
    assert_eq!(r.search(b"v"), Search::NotFound(5));
    assert_eq!(
        (r.lower_bound(b"user:1000"), r.upper_bound(b"user:1000")),
        (2, 3)
    );
    assert_eq!(
        r.get(b"user:1999"),
        Some((4, RecordKind::Insert, &b"user:1999"[..]))
    );
    assert_eq!(r.get(b"user:2"), None);
    valid(r);
}

#[test]
fn lookahead_ties_fall_back_to_full_keys() {
    let mut b = buf(4096);
    let mut n = NodeMut::init(&mut b, NodeKind::Leaf, None, None);
    let ks: [&[u8]; 9] = [
        b"ab", b"abc", b"ab\0", b"a", b"a\0", b"", b"\0", b"\0\0\0", b"abd",
    ];
    for k in ks {
        n.upsert(k, b"v", RecordKind::Insert).unwrap();
    }
    let mut sorted: Vec<&[u8]> = ks.to_vec();
    sorted.sort();
    assert_eq!(keys(n.as_ref()), sorted);
    for (i, k) in sorted.iter().enumerate() {
        assert_eq!(n.as_ref().search(k), Search::Found(i));
    }
    assert_eq!(n.as_ref().search(b"ab\0\0"), Search::NotFound(7));
    valid(n.as_ref());
}

#[test]
fn empty_keys_and_values() {
    let mut b = buf(128);
    let mut n = NodeMut::init(&mut b, NodeKind::Mini, None, None);
    n.upsert(b"", b"", RecordKind::Insert).unwrap();
    n.upsert(b"k", b"", RecordKind::Tombstone).unwrap();
    let r = n.as_ref();
    assert_eq!(r.get(b""), Some((0, RecordKind::Insert, &b""[..])));
    assert_eq!(r.get(b"k"), Some((1, RecordKind::Tombstone, &b""[..])));
    assert_eq!(r.used_bytes(), 48 + 16 + 1);
    valid(r);
}

#[test]
fn overwrite_in_place_then_relocate() {
    let mut b = buf(256);
    let mut n = NodeMut::init(&mut b, NodeKind::Mini, None, None);
    n.upsert(b"key", b"0123456789", RecordKind::Insert).unwrap();
    let before = n.as_ref().used_bytes();
    // Shorter value: same bytes, the tail becomes garbage.
    assert_eq!(n.upsert(b"key", b"abc", RecordKind::Upsert), Ok(0));
    let r = n.as_ref();
    assert_eq!(r.get(b"key"), Some((0, RecordKind::Upsert, &b"abc"[..])));
    assert_eq!(r.used_bytes(), before - 7);
    assert_eq!(r.garbage(), 7);
    valid(r);
    // Longer value: appended, the old bytes become garbage.
    n.upsert(b"key", b"a much longer value", RecordKind::Insert)
        .unwrap();
    let r = n.as_ref();
    assert_eq!(r.value(0), b"a much longer value");
    assert_eq!(r.garbage(), 7 + 6);
    assert_eq!(r.used_bytes(), 48 + 8 + 3 + 19);
    valid(r);
}

#[test]
fn relocation_compacts_when_only_garbage_makes_room() {
    let mut b = buf(128);
    let mut n = NodeMut::init(&mut b, NodeKind::Mini, None, None);
    n.upsert(b"a", &[1; 30], RecordKind::Insert).unwrap();
    n.upsert(b"b", &[2; 20], RecordKind::Insert).unwrap();
    n.remove_at(0); // "a" is not the lowest data: its 31 bytes become garbage
    assert_eq!(n.as_ref().garbage(), 31);
    assert!(n.as_ref().contiguous_free() < 8 + 1 + 60);
    assert!(n.as_ref().fits(b"b", 60));
    n.upsert(b"b", &[3; 60], RecordKind::Insert).unwrap();
    let r = n.as_ref();
    assert_eq!((r.len(), r.value(0), r.garbage()), (1, &[3u8; 60][..], 0));
    assert_eq!(r.free_space(), 128 - 48 - 8 - 61);
    assert!(!r.fits(b"b", 61 + r.free_space()));
    assert_eq!(n.upsert(b"b", &[4; 128], RecordKind::Insert), Err(NoSpace));
    assert_eq!(n.as_ref().value(0), &[3u8; 60][..]);
    valid(n.as_ref());
}

#[test]
fn nospace_leaves_the_node_unchanged() {
    let mut b = buf(128);
    let mut n = NodeMut::init(&mut b, NodeKind::Mini, None, None);
    n.upsert(b"k", &[1; 60], RecordKind::Insert).unwrap();
    assert_eq!(n.as_ref().free_space(), 11);
    let snapshot = n.as_ref().bytes().to_vec();
    assert!(!n.as_ref().fits(b"x", 3));
    assert_eq!(n.upsert(b"x", b"123", RecordKind::Insert), Err(NoSpace));
    assert_eq!(n.upsert(b"k", &[2; 72], RecordKind::Insert), Err(NoSpace));
    assert_eq!(n.as_ref().bytes(), &snapshot[..]);
    assert!(n.as_ref().fits(b"x", 2));
    n.upsert(b"x", b"12", RecordKind::Insert).unwrap();
    assert_eq!(n.as_ref().free_space(), 0);
    valid(n.as_ref());
}

#[test]
fn remove_and_compact() {
    let mut b = buf(1024);
    let mut n = NodeMut::init(&mut b, NodeKind::Leaf, Some(b"k00"), Some(b"k99"));
    for i in 0..20u8 {
        n.upsert(format!("k{i:02}").as_bytes(), &[i; 10], RecordKind::Insert)
            .unwrap();
    }
    let full = n.as_ref().used_bytes();
    for i in (0..20).step_by(3).rev() {
        n.remove_at(i);
    }
    let r = n.as_ref();
    assert_eq!(r.len(), 13);
    assert_eq!(r.used_bytes(), full - 7 * (8 + 2 + 10));
    valid(r);
    n.compact();
    let r = n.as_ref();
    assert_eq!(r.garbage(), 0);
    assert_eq!(r.contiguous_free(), r.free_space());
    assert_eq!(r.used_bytes(), full - 7 * (8 + 2 + 10));
    for i in 0..r.len() {
        let k = r.key_suffix(i)[0] - b'0';
        let want = k * 10 + (r.key_suffix(i)[1] - b'0');
        assert_eq!(r.value(i), &[want; 10]);
        assert_ne!(want % 3, 0);
    }
    valid(r);
}

#[test]
fn all_exist_asks_each_records_kind() {
    let mut b = buf(2048);
    let mut n = NodeMut::init(&mut b, NodeKind::Mini, Some(b"k00"), Some(b"k99"));
    // Runs of existing records between the absent ones, every kind at several places.
    for i in 0..40u8 {
        let kind = if i % 7 == 3 {
            KINDS[2 + usize::from(i) % 2]
        } else {
            KINDS[usize::from(i) % 5]
        };
        n.upsert(format!("k{i:02}").as_bytes(), &[i; 4], kind)
            .unwrap();
    }
    let r = n.as_ref();
    let mut absent = 0;
    for from in 0..=r.len() {
        for to in from..=r.len() {
            let want = (from..to).all(|i| r.record_kind(i).exists());
            assert_eq!(r.all_exist(from..to), want, "{from}..{to}");
            absent += usize::from(!want);
        }
    }
    assert!(absent > 100, "too few ranges with an absent record");
    assert!(r.all_exist(0..0) && r.all_exist(r.len()..r.len() + 5));
    #[allow(clippy::reversed_empty_ranges)]
    let backwards = 5..3;
    assert!(r.all_exist(backwards), "an empty range, however written");
}

#[test]
fn remove_of_the_lowest_bytes_shrinks_the_data_region() {
    let mut b = buf(128);
    let mut n = NodeMut::init(&mut b, NodeKind::Mini, None, None);
    n.upsert(b"a", b"1", RecordKind::Insert).unwrap();
    n.upsert(b"b", b"2", RecordKind::Insert).unwrap();
    n.remove_at(1);
    assert_eq!((n.as_ref().garbage(), n.as_ref().data_used()), (0, 2));
    valid(n.as_ref());
}

#[test]
fn fences_finite_infinite_and_truncated() {
    let cases: [(Bounds<'_>, &[u8]); 5] = [
        ((None, None), b""),
        ((Some(b"abc"), None), b""),
        ((None, Some(b"abc")), b""),
        ((Some(b"prefix/aaaa"), Some(b"prefix/b")), b"prefix/"),
        ((Some(b"pre"), Some(b"prefix")), b"pre"),
    ];
    for ((low, high), prefix) in cases {
        let mut b = buf(256);
        let n = NodeMut::init(&mut b, NodeKind::Leaf, low, high);
        let r = n.as_ref();
        assert_eq!(r.prefix(), prefix);
        let p = prefix.len();
        assert_eq!(r.low_fence_stored(), low.map(|l| &l[..l.len().min(p + 1)]));
        assert_eq!(
            r.high_fence_stored(),
            high.map(|h| &h[p..h.len().min(p + 1)])
        );
        assert!(r.used_bytes() <= 48 + p + 2);
        valid(r);
    }
}

#[test]
fn small_nodes_keep_a_shorter_prefix() {
    let (low, high) = (
        b"0123456789abcdefghij-a".as_slice(),
        b"0123456789abcdefghij-z".as_slice(),
    );
    let mut b = buf(64);
    let n = NodeMut::init(&mut b, NodeKind::Mini, Some(low), Some(high));
    assert_eq!(n.as_ref().prefix(), b"0123456789abcd");
    assert_eq!(n.as_ref().free_space(), 0);
    assert!(!n.as_ref().fits(low, 0));
    valid(n.as_ref());
    // Growing keeps the shorter prefix; a fresh init at the larger size gets all of it.
    let mut big = buf(128);
    copy_filtered(n.as_ref(), &mut big, |_, _| true, false).unwrap();
    let mut g = NodeMut::from_bytes(&mut big);
    assert_eq!(g.as_ref().prefix(), b"0123456789abcd");
    g.upsert(b"0123456789abcdefghij-m", b"v", RecordKind::Insert)
        .unwrap();
    assert_eq!(g.as_ref().key_suffix(0), b"efghij-m");
    valid(g.as_ref());
    let mut b = buf(128);
    let n = NodeMut::init(&mut b, NodeKind::Mini, Some(low), Some(high));
    assert_eq!(n.as_ref().prefix(), b"0123456789abcdefghij-");
    valid(n.as_ref());
}

#[test]
fn limits_max_key_and_record_fit_a_leaf_with_any_fences() {
    for page in [4096usize, 8192, 65536] {
        let lim = Limits::for_page_size(page);
        let mut low = vec![b'x'; lim.max_key_len];
        let mut high = low.clone();
        *low.last_mut().unwrap() = b'a';
        *high.last_mut().unwrap() = b'z';
        let mut key = low.clone();
        *key.last_mut().unwrap() = b'm';
        let fences: [Bounds<'_>; 4] = [
            (None, None),
            (Some(&low), None),
            (None, Some(&high)),
            (Some(&low), Some(&high)),
        ];
        for (l, h) in fences {
            let mut b = buf(page);
            let mut n = NodeMut::init(&mut b, NodeKind::Leaf, l, h);
            let value = vec![7u8; lim.max_record_len - key.len()];
            assert!(n.as_ref().fits(&key, value.len()));
            n.upsert(&key, &value, RecordKind::Insert).unwrap();
            // Overwrite with a value of the same size relocates nothing; a one-byte longer
            // overwrite must still fit after compaction when limits allow it.
            n.upsert(&key, &value, RecordKind::Insert).unwrap();
            valid(n.as_ref());
            let p = n.as_ref().prefix_len();
            let suffix_plus_value = key.len() - p + value.len();
            assert!(suffix_plus_value + 8 <= page - 32 - 16 - (p + 2));
        }
    }
}

#[test]
fn kinds_ref_bits_and_tree_flags() {
    let mut b = buf(256);
    let mut n = NodeMut::init(&mut b, NodeKind::Mini, None, None);
    for (i, k) in KINDS.iter().enumerate() {
        n.upsert(&[i as u8], b"v", *k).unwrap();
    }
    n.set_ref_bit(1, true);
    n.set_record_kind(0, RecordKind::Cache);
    n.set_disk_page(Some(42));
    n.set_flags(0xFF);
    let r = n.as_ref();
    assert_eq!(r.record_kind(0), RecordKind::Cache);
    assert!(r.ref_bit(1) && !r.ref_bit(0));
    assert_eq!(r.dirty_count(), 2);
    assert_eq!(r.disk_page(), Some(42));
    assert_eq!(r.flags(), 0xFC);
    assert!(r.low_is_infinite() && r.high_is_infinite());
    valid(r);
    n.set_flags(0);
    n.set_disk_page(None);
    assert_eq!((n.as_ref().flags(), n.as_ref().disk_page()), (0, None));
    assert!(n.as_ref().low_is_infinite());
    assert!(
        RecordKind::Insert.is_dirty()
            && RecordKind::Upsert.is_dirty()
            && RecordKind::Tombstone.is_dirty()
    );
    assert!(!RecordKind::Cache.is_dirty() && !RecordKind::Phantom.is_dirty());
    assert!(
        RecordKind::Cache.exists()
            && !RecordKind::Tombstone.exists()
            && !RecordKind::Phantom.exists()
    );
}
