//! What every peer has: prefix scans (empty prefixes, `FF` prefixes, both directions),
//! first, last and len on empty and filled keyspaces, each keyspace alone, iterators that
//! outlive their handle, and range bounds past the key limit refused as lookups are.

use bfkv::{Config, Error, Range, Tree};

fn keys(range: impl Iterator<Item = bfkv::Result<(Vec<u8>, Vec<u8>)>>) -> Vec<Vec<u8>> {
    range.map(|r| r.expect("item").0).collect()
}

fn trees() -> Vec<(Tree, Option<tempfile::TempDir>)> {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = Tree::open(Config::new(dir.path()).cache_size(256 << 10)).expect("open");
    vec![
        (file, Some(dir)),
        (Tree::open(Config::in_memory()).expect("open"), None),
    ]
}

#[test]
fn prefixes_take_exactly_the_keys_that_start_with_them() {
    for (tree, _dir) in trees() {
        let ks = tree.keyspace("p").unwrap();
        let all: Vec<Vec<u8>> = vec![
            vec![],
            vec![0x00],
            b"a".to_vec(),
            b"ab".to_vec(),
            b"ab\xff".to_vec(),
            b"ab\xff\xff".to_vec(),
            b"ac".to_vec(),
            vec![0xFE, 0xFF],
            vec![0xFF],
            vec![0xFF, 0x00],
            vec![0xFF, 0xFF],
        ];
        for k in &all {
            ks.insert(k, b"v").unwrap();
        }
        // Another keyspace and the default one hold keys with the same prefixes.
        tree.insert(b"ab1", b"v").unwrap();
        tree.keyspace("q").unwrap().insert(b"ab2", b"v").unwrap();
        let starting = |p: &[u8]| -> Vec<Vec<u8>> {
            all.iter().filter(|k| k.starts_with(p)).cloned().collect()
        };
        for p in [
            &b""[..],
            b"a",
            b"ab",
            b"ab\xff",
            b"\xff",
            b"\xff\xff",
            b"\xfe",
            b"zz",
            b"ab\xff\xff\xff",
        ] {
            let want = starting(p);
            assert_eq!(keys(ks.prefix(p)), want, "prefix {p:?}");
            let mut down = keys(ks.prefix(p).rev());
            down.reverse();
            assert_eq!(down, want, "prefix {p:?} descending");
        }
        assert_eq!(keys(tree.prefix(b"ab")), [b"ab1".to_vec()]);
        // Snapshots and transactions take prefixes at their moment.
        let snap = tree.snapshot();
        ks.insert(b"ab7", b"v").unwrap();
        assert_eq!(snap.prefix(&ks, b"ab").count(), 3);
        let mut tx = tree.transaction();
        tx.remove(&ks, b"ab");
        assert_eq!(tx.prefix(&ks, b"ab").count(), 3, "ab7 in, ab out");
    }
}

#[test]
fn first_last_and_len_of_empty_and_filled_keyspaces() {
    for (tree, _dir) in trees() {
        let ks = tree.keyspace("k").unwrap();
        assert_eq!(
            (ks.first().unwrap(), ks.last().unwrap(), ks.len().unwrap()),
            (None, None, 0)
        );
        assert_eq!((tree.first().unwrap(), tree.len().unwrap()), (None, 0));
        for i in 0..5000u32 {
            ks.insert(i.to_be_bytes(), [7u8; 40]).unwrap();
        }
        tree.insert(b"only", b"1").unwrap();
        assert_eq!(
            ks.first().unwrap(),
            Some((0u32.to_be_bytes().to_vec(), vec![7u8; 40]))
        );
        assert_eq!(
            ks.last().unwrap().unwrap().0,
            4999u32.to_be_bytes().to_vec()
        );
        assert_eq!(ks.len().unwrap(), 5000);
        assert_eq!(tree.len().unwrap(), 1, "keyspaces are counted alone");
        assert_eq!(tree.first().unwrap(), tree.last().unwrap());
        let snap = tree.snapshot();
        ks.remove(0u32.to_be_bytes()).unwrap();
        assert_eq!(ks.len().unwrap(), 4999);
        assert_eq!(snap.len(&ks).unwrap(), 5000);
        assert_eq!(
            snap.first(&ks).unwrap().unwrap().0,
            0u32.to_be_bytes().to_vec()
        );
        assert_eq!(
            snap.last(&ks).unwrap().unwrap().0,
            4999u32.to_be_bytes().to_vec()
        );
    }
}

#[test]
fn len_counts_keys_without_reading_large_values() {
    let dir = tempfile::tempdir().unwrap();
    let tree = Tree::open(Config::new(dir.path())).unwrap();
    for i in 0..8u32 {
        tree.insert(i.to_be_bytes(), vec![1u8; 300_000]).unwrap();
    }
    let read = tree.stats().blobs_read;
    assert_eq!(tree.len().unwrap(), 8);
    assert_eq!(tree.stats().blobs_read, read, "no value was read");
}

/// A range that outlives the handle it came from (it borrows the tree).
fn records_of<'t>(tree: &'t Tree, name: &str) -> Range<'t> {
    tree.keyspace(name).expect("keyspace").iter()
}

#[test]
fn an_iterator_outlives_its_keyspace_handle_and_not_the_tree() {
    let dir = tempfile::tempdir().unwrap();
    let tree = Tree::open(Config::new(dir.path())).unwrap();
    tree.keyspace("x").unwrap().insert(b"k", b"v").unwrap();
    assert_eq!(records_of(&tree, "x").count(), 1);
    let outliving = tree.keyspace("x").unwrap().iter();
    tree.close().unwrap();
    let items: Vec<_> = outliving.collect();
    assert!(matches!(items[..], [Err(Error::Closed)]), "{items:?}");
}

#[test]
fn a_bound_past_the_key_limit_is_refused_as_a_lookup_is() {
    let tree = Tree::open(Config::in_memory()).unwrap();
    tree.insert(b"a", b"").unwrap();
    let long = vec![b'a'; tree.limits().max_key_len + 1];
    assert!(matches!(tree.get(&long), Err(Error::KeyTooLarge { .. })));
    let items: Vec<_> = tree.range(long.as_slice()..).collect();
    assert!(
        matches!(items[..], [Err(Error::KeyTooLarge { .. })]),
        "{items:?}"
    );
    let items: Vec<_> = tree.range(..long.as_slice()).rev().collect();
    assert!(
        matches!(items[..], [Err(Error::KeyTooLarge { .. })]),
        "{items:?}"
    );
    assert!(matches!(
        tree.prefix(&long).next(),
        Some(Err(Error::KeyTooLarge { .. }))
    ));
    // At the limit it is a key like any other.
    let at = vec![b'a'; tree.limits().max_key_len];
    assert_eq!(tree.range(..at.as_slice()).count(), 1);
}
