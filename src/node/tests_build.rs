//! Unit tests of `split_records`, build, `shortest_separator` and inner-node routing.

use super::*;
use crate::Limits;

/// A node buffer of `size` bytes.
fn buf(size: usize) -> Vec<u8> {
    vec![0xEE; size]
}

#[test]
fn shortest_separators() {
    assert_eq!(shortest_separator(b"abc", b"abd"), b"abd");
    assert_eq!(shortest_separator(b"abc", b"b"), b"b");
    assert_eq!(shortest_separator(b"abc", b"abzzz"), b"abz");
    assert_eq!(shortest_separator(b"ab", b"abc"), b"abc");
    assert_eq!(shortest_separator(b"", b"\0"), b"\0");
    assert_eq!(shortest_separator(b"a", b"a\0\0"), b"a\0");
}

/// Records `key{i:04}` with `vlen`-byte values.
fn records(n: usize, vlen: usize) -> Vec<Record> {
    (0..n)
        .map(|i| Record {
            key: format!("key{i:04}").into_bytes().into(),
            value: vec![i as u8; vlen].into(),
            kind: RecordKind::Insert,
        })
        .collect()
}

/// Builds every group of a split and checks bounds, separators and fit.
fn check_split(
    recs: &[Record],
    size: usize,
    kind: NodeKind,
    low: Option<&[u8]>,
    high: Option<&[u8]>,
) -> Vec<usize> {
    let groups = split_records(recs, size, kind, low, high);
    assert_eq!(groups[0].0.start, 0);
    assert_eq!(groups.last().unwrap().0.end, recs.len());
    assert_eq!(groups[0].1.as_deref(), low);
    let mut sizes = Vec::new();
    for (g, (range, glow)) in groups.iter().enumerate() {
        assert!(!range.is_empty() || recs.is_empty());
        let ghigh = groups.get(g + 1).map_or(high, |n| n.1.as_deref());
        if g > 0 {
            let sep = glow.as_deref().unwrap();
            let (left, right) = (&recs[range.start - 1].key, &recs[range.start].key);
            assert!(left.as_slice() < sep && sep <= right.as_slice());
            match kind {
                NodeKind::Inner => assert_eq!(sep, right.as_slice()),
                _ => assert_eq!(sep, shortest_separator(left, right)),
            }
            assert_eq!(groups[g - 1].0.end, range.start);
        }
        let mut b = buf(size);
        build(&mut b, kind, glow.as_deref(), ghigh, &recs[range.clone()]).unwrap();
        let r = NodeRef::from_bytes_checked(&b).unwrap();
        assert_eq!(r.len(), range.len());
        sizes.push(r.used_bytes());
    }
    sizes
}

#[test]
fn split_records_is_balanced_and_separators_are_short() {
    let recs = records(100, 50);
    let sizes = check_split(&recs, 4096, NodeKind::Leaf, None, None);
    assert_eq!(sizes.len(), 2);
    assert!(sizes[0].abs_diff(sizes[1]) <= 70, "{sizes:?}");
    let sizes = check_split(&recs, 1024, NodeKind::Leaf, Some(b"key"), Some(b"kez"));
    assert!(
        sizes.len() >= 7 && sizes.iter().all(|&s| s <= 1024 && s > 400),
        "{sizes:?}"
    );
    check_split(&records(300, 8), 4096, NodeKind::Inner, Some(b"k"), None);
    // Each group's prefix compression counts: 40 records with 200-byte shared prefixes need
    // ~9 KB uncompressed but ~1.1 KB compressed.
    let long: Vec<Record> = (0..40)
        .map(|i| Record {
            key: [vec![b'p'; 200], format!("{i:03}").into_bytes()]
                .concat()
                .into(),
            value: vec![1; 10].into(),
            kind: RecordKind::Insert,
        })
        .collect();
    let lo = [vec![b'p'; 200], b"0".to_vec()].concat();
    let hi = [vec![b'p'; 200], b"9".to_vec()].concat();
    let sizes = check_split(&long, 4096, NodeKind::Leaf, Some(&lo), Some(&hi));
    assert_eq!(sizes.len(), 1, "{sizes:?}");
    let sizes = check_split(&long, 1024, NodeKind::Leaf, Some(&lo), Some(&hi));
    assert_eq!(sizes.len(), 2, "{sizes:?}");
    assert_eq!(
        split_records(&[], 4096, NodeKind::Leaf, Some(b"a"), None),
        vec![(0..0, Some(b"a".to_vec()))]
    );
}

#[test]
fn split_records_handles_maximal_records() {
    let lim = Limits::for_page_size(4096);
    let recs: Vec<Record> = (0..5u8)
        .map(|i| {
            let mut key = vec![b'k'; lim.max_key_len];
            key[lim.max_key_len - 1] = i;
            Record {
                key: key.into(),
                value: vec![i; lim.max_record_len - lim.max_key_len].into(),
                kind: RecordKind::Insert,
            }
        })
        .collect();
    // Prefix compression lets the middle groups hold two 2 KiB records each.
    assert_eq!(
        check_split(&recs, 4096, NodeKind::Leaf, None, None).len(),
        4
    );
    let mut lo = vec![b'k'; lim.max_key_len];
    lo.pop();
    check_split(&recs, 4096, NodeKind::Leaf, Some(&lo), Some(b"l"));
}

#[test]
fn inner_nodes_route_by_child_index() {
    let mut b = buf(512);
    let mut n = NodeMut::init(&mut b, NodeKind::Inner, Some(b"m"), Some(b"t"));
    for (k, child) in [(&b""[..], 10u64), (b"n", 11), (b"p", 12), (b"s", 13)] {
        n.push_sorted(k, &child.to_le_bytes(), RecordKind::Insert)
            .unwrap();
    }
    let r = n.as_ref();
    NodeRef::from_bytes_checked(r.bytes()).unwrap();
    let route = |k: &[u8]| r.child(r.child_index(k));
    assert_eq!(route(b"m"), 10);
    assert_eq!(route(b"mzz"), 10);
    assert_eq!(route(b"n"), 11);
    assert_eq!(route(b"o"), 11);
    assert_eq!(route(b"p"), 12);
    assert_eq!(route(b"s"), 13);
    assert_eq!(route(b"szzz"), 13);
    assert_eq!(route(b"a"), 10);
}

#[test]
fn mini_from_mirror_keeps_only_referenced_records_as_cache() {
    let mut lb = buf(1024);
    let mut leaf = NodeMut::init(&mut lb, NodeKind::Leaf, Some(b"key0000"), Some(b"key9"));
    leaf.set_disk_page(Some(42));
    for i in 0..10u8 {
        leaf.upsert(format!("key{i:04}").as_bytes(), &[i; 6], RecordKind::Insert)
            .unwrap();
    }
    leaf.set_ref_bit(2, true);
    leaf.set_ref_bit(7, true);
    let src = leaf.as_ref();
    let need = filtered_len(src, |_, referenced| referenced);
    assert!(need < filtered_len(src, |_, _| true));
    let mut mini = buf(need.next_power_of_two());
    mini_from_mirror(src, &mut mini).unwrap();
    let r = NodeRef::from_bytes_checked(&mini).unwrap();
    assert_eq!(
        (r.kind(), r.len(), r.disk_page()),
        (NodeKind::Mini, 2, Some(42))
    );
    assert_eq!(r.prefix(), src.prefix());
    assert_eq!(r.used_bytes(), need);
    for (i, want) in [(0, 2u8), (1, 7u8)] {
        let mut k = Vec::new();
        r.key_into(i, &mut k);
        assert_eq!(k, format!("key{want:04}").into_bytes());
        assert_eq!(r.value(i), &[want; 6][..]);
        assert_eq!(r.record_kind(i), RecordKind::Cache);
        assert!(!r.ref_bit(i), "reference bits start clear in the copy");
    }
    // Too small a destination is refused and left alone.
    let mut tiny = buf(64);
    assert_eq!(mini_from_mirror(src, &mut tiny), Err(NoSpace));
    assert!(tiny.iter().all(|&b| b == 0xEE));
}

#[test]
fn mini_pages_of_any_size_class_hold_search_and_copy_their_records() {
    // The pool's size classes between 64 B and 1 KiB, four per doubling.
    let sizes = [
        64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896,
    ];
    for &size in &sizes {
        assert!(valid_size(size));
        let mut b = buf(size);
        let mut node = NodeMut::init(&mut b, NodeKind::Mini, Some(b"key0000"), Some(b"key9999"));
        assert_eq!(node.as_ref().size(), size);
        let mut n = 0;
        while node
            .upsert(
                format!("key{n:04}").as_bytes(),
                &[n as u8; 5],
                RecordKind::Insert,
            )
            .is_ok()
        {
            n += 1;
        }
        assert!(n > 0 || size < 96, "a {size}-byte node holds no record");
        let view = node.as_ref();
        assert!(view.used_bytes() <= size);
        for i in 0..n {
            let key = format!("key{i:04}");
            let (_, kind, value) = view.get(key.as_bytes()).expect("stored record");
            assert_eq!((kind, value), (RecordKind::Insert, &[i as u8; 5][..]));
        }
        // Copy into every other size: the copy succeeds exactly when the records fit.
        for &to in &sizes {
            let mut dst = buf(to);
            let need = filtered_len(view, |_, _| true);
            let copied = copy_filtered(view, &mut dst, |_, _| true, false);
            assert_eq!(copied.is_ok(), need <= to, "{size} -> {to}, need {need}");
            if copied.is_ok() {
                let c = NodeRef::from_bytes(&dst);
                assert_eq!(c.len(), n);
                assert_eq!(c.size(), to);
            }
        }
    }
    assert!(!valid_size(72) && !valid_size(48) && !valid_size(65552));
}

#[test]
fn packed_splits_fill_every_group_but_the_last() {
    let recs = records(300, 40);
    let groups = split_records_packed(&recs, 4096, NodeKind::Leaf, None, None);
    assert!(groups.len() > 2);
    assert_eq!(groups[0].0.start, 0);
    assert_eq!(groups.last().unwrap().0.end, recs.len());
    for (g, (range, glow)) in groups.iter().enumerate() {
        let ghigh = groups.get(g + 1).and_then(|n| n.1.as_deref());
        let mut b = buf(4096);
        build(
            &mut b,
            NodeKind::Leaf,
            glow.as_deref(),
            ghigh,
            &recs[range.clone()],
        )
        .expect("each group fits");
        if g + 1 < groups.len() {
            // One record more and it would not: the group is as full as it can be.
            let more = &recs[range.start..=range.end];
            let mut b = buf(4096);
            let next_high = groups.get(g + 2).and_then(|n| n.1.as_deref());
            let high = if range.end + 1 == groups[g + 1].0.end {
                next_high
            } else {
                ghigh
            };
            assert!(
                build(&mut b, NodeKind::Leaf, glow.as_deref(), high, more).is_err(),
                "group {g} could take one more record"
            );
        }
    }
    // A balanced split of the same records spreads them over as many groups or more.
    let balanced = split_records(&recs, 4096, NodeKind::Leaf, None, None);
    assert!(balanced.len() >= groups.len());
    assert!(groups[0].0.len() > balanced[0].0.len());
}

#[test]
fn built_len_is_exactly_what_a_built_leaf_uses() {
    let (k0, k1, k00): (&[u8], &[u8], &[u8]) = (b"key0", b"key1", b"key00");
    let bounds = [(None, None), (Some(k0), Some(k1)), (Some(k00), None)];
    for (low, high) in bounds {
        for (n, vlen) in [(0, 0), (1, 16), (40, 16), (90, 16), (12, 200)] {
            let recs = records(n, vlen);
            let need = built_len(&recs, 4096, low, high);
            let mut page = buf(4096);
            build(&mut page, NodeKind::Leaf, low, high, &recs).unwrap();
            assert_eq!(NodeRef::from_bytes(&page).used_bytes(), need, "{n} records");
            // The smallest size class holding `need` holds the leaf; 16 bytes less does not.
            let size = crate::pool::block_size_for(need).unwrap();
            build(&mut buf(size), NodeKind::Leaf, low, high, &recs).unwrap();
            let tight = need.next_multiple_of(16).max(crate::node::MIN_NODE);
            build(&mut buf(tight), NodeKind::Leaf, low, high, &recs).unwrap();
            if n > 0 && tight - 16 >= crate::node::MIN_NODE {
                assert!(build(&mut buf(tight - 16), NodeKind::Leaf, low, high, &recs).is_err());
            }
        }
    }
}
