//! Unit tests of merging into a leaf: dirty records merged in place, pending merges folded
//! (and refused by the in-place merge), all or nothing, and filtered copies.

use super::tests::{buf, keys, valid};
use super::*;

/// A leaf with keys k00..k(n-1) valued by their index.
pub(super) fn leaf(b: &mut [u8], n: u8) -> NodeMut<'_> {
    let mut node = NodeMut::init(b, NodeKind::Leaf, None, None);
    for i in 0..n {
        node.push_sorted(format!("k{i:02}").as_bytes(), &[i], RecordKind::Insert)
            .unwrap();
    }
    node
}

#[test]
fn merge_from_applies_dirty_records_only() {
    let mut lb = buf(4096);
    let mut l = leaf(&mut lb, 10);
    let mut mb = buf(512);
    let mut m = NodeMut::init(&mut mb, NodeKind::Mini, None, None);
    m.upsert(b"k01", b"new", RecordKind::Insert).unwrap();
    m.upsert(b"k02", b"", RecordKind::Tombstone).unwrap();
    m.upsert(b"k03", b"cached", RecordKind::Cache).unwrap();
    m.upsert(b"k04", b"upserted", RecordKind::Insert).unwrap();
    m.upsert(b"k50", b"", RecordKind::Phantom).unwrap();
    m.upsert(b"k51", b"", RecordKind::Tombstone).unwrap();
    m.upsert(b"k52", b"fresh", RecordKind::Insert).unwrap();
    l.merge_from(m.as_ref()).unwrap();
    let r = l.as_ref();
    assert_eq!(r.len(), 10);
    assert_eq!(r.get(b"k01"), Some((1, RecordKind::Insert, &b"new"[..])));
    assert_eq!(r.get(b"k02"), None);
    assert_eq!(r.get(b"k03").map(|g| g.2), Some(&[3u8][..]));
    assert_eq!(r.get(b"k04").map(|g| g.2), Some(&b"upserted"[..]));
    assert_eq!(r.get(b"k50"), None);
    assert_eq!(r.get(b"k52"), Some((9, RecordKind::Insert, &b"fresh"[..])));
    valid(r);
    let merged = merge_sorted(leaf(&mut buf(4096), 10).as_ref(), m.as_ref(), &mut no_fold).unwrap();
    let want: Vec<Vec<u8>> = keys(r);
    assert_eq!(
        merged.iter().map(|x| x.key.to_vec()).collect::<Vec<_>>(),
        want
    );
    for (i, rec) in merged.iter().enumerate() {
        assert_eq!(
            (rec.value.as_slice(), rec.kind),
            (r.value(i), RecordKind::Insert)
        );
    }
}

/// A fold for mini-pages without Upsert records.
fn no_fold(_: &[u8], _: Option<&[u8]>, _: &[u8]) -> Result<Option<Vec<u8>>, ()> {
    Err(())
}

#[test]
fn upserts_fold_over_the_leaf_value_and_are_refused_by_merge_from() {
    let mut lb = buf(4096);
    let mut l = leaf(&mut lb, 3);
    let mut mb = buf(512);
    let mut m = NodeMut::init(&mut mb, NodeKind::Mini, None, None);
    m.upsert(b"k00", b"+a", RecordKind::Upsert).unwrap();
    m.upsert(b"k01", b"", RecordKind::Upsert).unwrap();
    m.upsert(b"k07", b"+b", RecordKind::Upsert).unwrap();
    let before = l.as_ref().bytes().to_vec();
    assert_eq!(l.merge_from(m.as_ref()), Err(NoSpace));
    assert_eq!(l.as_ref().bytes(), &before[..]);
    // Append the operand to the old value; an empty operand deletes.
    let mut seen = Vec::new();
    let mut fold = |k: &[u8], old: Option<&[u8]>, ops: &[u8]| {
        seen.push((k.to_vec(), old.map(<[u8]>::to_vec)));
        Ok::<_, ()>((!ops.is_empty()).then(|| [old.unwrap_or_default(), ops].concat()))
    };
    let merged = merge_sorted(l.as_ref(), m.as_ref(), &mut fold).unwrap();
    let got: Vec<(Vec<u8>, Vec<u8>)> = merged
        .iter()
        .map(|r| (r.key.to_vec(), r.value.to_vec()))
        .collect();
    assert_eq!(
        got,
        vec![
            (b"k00".to_vec(), b"\0+a".to_vec()),
            (b"k02".to_vec(), vec![2]),
            (b"k07".to_vec(), b"+b".to_vec()),
        ]
    );
    assert_eq!(
        seen,
        vec![
            (b"k00".to_vec(), Some(vec![0])),
            (b"k01".to_vec(), Some(vec![1])),
            (b"k07".to_vec(), None)
        ]
    );
    let mut failing = |_: &[u8], _: Option<&[u8]>, _: &[u8]| Err::<Option<Vec<u8>>, _>("no");
    assert_eq!(
        merge_sorted(l.as_ref(), m.as_ref(), &mut failing),
        Err("no")
    );
}

#[test]
fn merge_from_is_all_or_nothing() {
    let mut lb = buf(4096);
    let mut l = NodeMut::init(&mut lb, NodeKind::Leaf, None, None);
    for i in 1..4u8 {
        l.push_sorted(&[i], &[i; 1000], RecordKind::Insert).unwrap();
    }
    let before = l.as_ref().bytes().to_vec();
    let mut mb = buf(8192);
    let mut m = NodeMut::init(&mut mb, NodeKind::Mini, None, None);
    m.upsert(&[1], &[9; 2040], RecordKind::Insert).unwrap();
    m.upsert(&[9], &[9; 1000], RecordKind::Insert).unwrap();
    assert_eq!(l.merge_from(m.as_ref()), Err(NoSpace));
    assert_eq!(l.as_ref().bytes(), &before[..]);
    // With a later tombstone instead it fits, but only if the removal is applied before the
    // growth of key 1 (in key order the growth alone would overflow the page).
    m.remove_at(1);
    m.upsert(&[3], b"", RecordKind::Tombstone).unwrap();
    l.merge_from(m.as_ref()).unwrap();
    assert_eq!(keys(l.as_ref()), [vec![1u8], vec![2]]);
    assert_eq!(l.as_ref().value(0), &[9u8; 2040][..]);
    valid(l.as_ref());
}

#[test]
fn copy_filtered_grows_shrinks_and_drops() {
    let mut sb = buf(256);
    let mut s = NodeMut::init(&mut sb, NodeKind::Mini, Some(b"ab1"), Some(b"ab9"));
    s.set_disk_page(Some(7));
    s.set_flags(0x10);
    s.upsert(b"ab2", b"cold", RecordKind::Cache).unwrap();
    s.upsert(b"ab3", b"hot", RecordKind::Cache).unwrap();
    s.upsert(b"ab4", b"dirty", RecordKind::Insert).unwrap();
    s.upsert(b"ab5", b"x", RecordKind::Phantom).unwrap();
    s.set_ref_bit(1, true);
    let src = s.as_ref();
    let mut big = buf(1024);
    copy_filtered(src, &mut big, |_, _| true, false).unwrap();
    let r = NodeRef::from_bytes_checked(&big).unwrap();
    assert_eq!(
        (r.len(), r.prefix(), r.disk_page(), r.flags()),
        (4, &b"ab"[..], Some(7), 0x10)
    );
    assert_eq!(keys(r), keys(src));
    assert!(r.ref_bit(1));
    let mut small = buf(128);
    copy_filtered(src, &mut small, |k, rb| k.is_dirty() || rb, true).unwrap();
    let r = NodeRef::from_bytes_checked(&small).unwrap();
    assert_eq!(keys(r), [b"ab3".to_vec(), b"ab4".to_vec()]);
    assert!(!r.ref_bit(0));
    assert_eq!(r.used_bytes(), 48 + 3 + 1 + 2 * 8 + 1 + 3 + 1 + 5);
    let mut tiny = buf(64);
    assert_eq!(
        copy_filtered(src, &mut tiny, |_, _| true, false),
        Err(NoSpace)
    );
}
