//! Keyspaces and compare-and-swap through the public API: independence, persistence,
//! names, drops that free their pages, handles that outlive their tree, and swaps that
//! lose no update under concurrency.

use bfkv::{Config, Durability, Error, Tree};

fn names(tree: &Tree) -> Vec<String> {
    tree.keyspaces().expect("keyspaces")
}

#[test]
fn keyspaces_are_independent_and_persist() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = || Config::new(dir.path()).durability(Durability::Sync);
    {
        let tree = Tree::open(config()).expect("open");
        let a = tree.keyspace("a").expect("a");
        let b = tree.keyspace("b").expect("b");
        for i in 0u32..3000 {
            let k = i.to_be_bytes();
            tree.insert(k, b"default").expect("insert");
            a.insert(k, b"a").expect("insert");
            if i % 2 == 0 {
                b.insert(k, b"b").expect("insert");
            }
        }
        a.remove(7u32.to_be_bytes()).expect("remove");
        assert_eq!(a.iter().count(), 2999);
        assert_eq!(b.iter().count(), 1500);
        assert_eq!(tree.iter().count(), 3000);
        // Unbounded ends stay inside the keyspace, both ways.
        let last = b.iter().next_back().expect("last").expect("item");
        assert_eq!(last, (2998u32.to_be_bytes().to_vec(), b"b".to_vec()));
        let first = a
            .range::<&[u8], _>(..)
            .next()
            .expect("first")
            .expect("item");
        assert_eq!(first.0, 0u32.to_be_bytes());
        assert_eq!(names(&tree), ["a", "b"]);
        // Same name, same keyspace.
        assert_eq!(
            tree.keyspace("a")
                .expect("a")
                .get(1u32.to_be_bytes())
                .expect("get"),
            Some(b"a".to_vec())
        );
        tree.close().expect("close");
    }
    // Without a checkpoint too: the creation is in the log.
    {
        let tree = Tree::open(config()).expect("reopen");
        let c = tree.keyspace("c").expect("c");
        c.insert(b"x", b"y").expect("insert");
        std::mem::forget(tree); // no close: the reopen replays the log
    }
    // The leaked tree still holds the directory lock; a copy of the directory is what a
    // crash would leave.
    let copy = tempfile::tempdir().expect("tempdir");
    copy_dir(dir.path(), copy.path());
    let tree = Tree::open(Config::new(copy.path())).expect("recover");
    assert_eq!(names(&tree), ["a", "b", "c"]);
    let a = tree.keyspace("a").expect("a");
    assert_eq!(a.get(7u32.to_be_bytes()).expect("get"), None);
    assert_eq!(a.get(8u32.to_be_bytes()).expect("get"), Some(b"a".to_vec()));
    assert_eq!(tree.keyspace("b").expect("b").iter().count(), 1500);
    assert_eq!(
        tree.keyspace("c").expect("c").get(b"x").expect("get"),
        Some(b"y".to_vec())
    );
    assert_eq!(tree.iter().count(), 3000);
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            std::fs::create_dir_all(&target).expect("mkdir");
            copy_dir(&entry.path(), &target);
        } else if entry.file_name() != "LOCK" {
            std::fs::copy(entry.path(), target).expect("copy");
        }
    }
}

#[test]
fn names_are_checked() {
    let tree = Tree::open(Config::in_memory()).expect("open");
    assert!(matches!(
        tree.keyspace(""),
        Err(Error::InvalidConfig { .. })
    ));
    let long = "n".repeat(256);
    assert!(matches!(
        tree.keyspace(&long),
        Err(Error::InvalidConfig { .. })
    ));
    assert!(matches!(
        tree.drop_keyspace(""),
        Err(Error::InvalidConfig { .. })
    ));
    let ok = "é".repeat(127); // 254 bytes
    tree.keyspace(&ok).expect("254-byte name");
    tree.keyspace(&"n".repeat(255)).expect("255-byte name");
    assert_eq!(names(&tree).len(), 2);
    // Dropping one that does not exist is not an error.
    tree.drop_keyspace("never").expect("drop absent");
}

#[test]
fn dropping_a_keyspace_removes_its_keys_and_frees_their_pages() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = Tree::open(Config::new(dir.path()).cache_size(1 << 20)).expect("open");
    let big = tree.keyspace("big").expect("big");
    let keep = tree.keyspace("keep").expect("keep");
    for i in 0u32..20_000 {
        big.insert(i.to_be_bytes(), [7u8; 100]).expect("insert");
    }
    keep.insert(b"k", b"v").expect("insert");
    tree.checkpoint().expect("checkpoint");
    let before = tree.stats().disk_pages_in_use;
    tree.drop_keyspace("big").expect("drop");
    assert!(
        matches!(big.insert(b"x", b"y"), Err(Error::KeyspaceDropped { name }) if name == "big")
    );
    assert!(matches!(
        big.iter().next(),
        Some(Err(Error::KeyspaceDropped { .. }))
    ));
    assert_eq!(names(&tree), ["keep"]);
    // Pages the last checkpoint referenced are freed once the next one is durable.
    tree.checkpoint().expect("checkpoint");
    tree.checkpoint().expect("checkpoint");
    let after = tree.stats().disk_pages_in_use;
    assert!(
        after * 10 < before,
        "{before} pages in use before the drop, {after} after"
    );
    assert_eq!(keep.get(b"k").expect("get"), Some(b"v".to_vec()));
    let again = tree.keyspace("big").expect("again");
    assert!(again.iter().next().is_none());
    tree.close().expect("close");
    let tree = Tree::open(Config::new(dir.path())).expect("reopen");
    assert_eq!(names(&tree), ["big", "keep"]);
    assert!(tree.keyspace("big").expect("big").iter().next().is_none());
}

#[test]
fn a_handle_that_outlives_its_tree_answers_closed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = Tree::open(Config::new(dir.path())).expect("open");
    let ks = tree.keyspace("ks").expect("ks");
    let default = tree.default_keyspace();
    for i in 0u32..5000 {
        ks.insert(i.to_be_bytes(), [1u8; 64]).expect("insert");
    }
    let mut it = ks.iter();
    it.next().expect("first").expect("item");
    // A live handle and an unfinished iterator do not keep the tree from closing.
    tree.close().expect("close");
    assert!(matches!(ks.insert(b"a", b"b"), Err(Error::Closed)));
    assert!(matches!(ks.get(b"a"), Err(Error::Closed)));
    assert!(matches!(default.remove(b"a"), Err(Error::Closed)));
    assert!(matches!(
        ks.compare_and_swap(b"a", None, None),
        Err(Error::Closed)
    ));
    // The iterator hands out what it already copied, then the error, then nothing.
    let rest: Vec<_> = it.by_ref().collect();
    assert!(
        matches!(rest.last(), Some(Err(Error::Closed))),
        "{}",
        rest.len()
    );
    assert!(it.next().is_none());
    // The directory is free for the next tree, which has every write.
    let tree = Tree::open(Config::new(dir.path())).expect("reopen");
    assert_eq!(tree.keyspace("ks").expect("ks").iter().count(), 5000);
}

#[test]
fn compare_and_swap_follows_its_contract() {
    let tree = Tree::open(Config::in_memory()).expect("open");
    // Absent expected absent: removing nothing succeeds and changes nothing.
    assert!(tree.compare_and_swap(b"k", None, None).expect("cas"));
    assert_eq!(tree.get(b"k").expect("get"), None);
    // An empty value is present.
    assert!(tree
        .compare_and_swap(b"k", None, Some(b"".as_slice()))
        .expect("cas"));
    assert!(!tree
        .compare_and_swap(b"k", None, Some(b"x".as_slice()))
        .expect("cas"));
    assert_eq!(tree.get(b"k").expect("get"), Some(Vec::new()));
    assert!(tree
        .compare_and_swap(b"k", Some(b"".as_slice()), Some(b"x".as_slice()))
        .expect("cas"));
    assert!(!tree
        .compare_and_swap(b"k", Some(b"y".as_slice()), None)
        .expect("cas"));
    assert!(tree
        .compare_and_swap(b"k", Some(b"x".as_slice()), None)
        .expect("cas"));
    assert_eq!(tree.get(b"k").expect("get"), None);
    // Limits as for insert; nothing changes.
    let limits = tree.limits();
    let long_key = vec![0u8; limits.max_key_len + 1];
    assert!(matches!(
        tree.compare_and_swap(&long_key, None, None),
        Err(Error::KeyTooLarge { .. })
    ));
    let long_value = vec![0u8; limits.max_value_len + 1];
    assert!(matches!(
        tree.compare_and_swap(b"k", None, Some(long_value.as_slice())),
        Err(Error::ValueTooLarge { .. })
    ));
    assert_eq!(tree.get(b"k").expect("get"), None);
}

/// Threads counting with compare-and-swap lose no increment, with a cache small enough
/// that the swaps read leaves from disk.
#[test]
fn concurrent_swaps_lose_no_increment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = Tree::open(Config::new(dir.path()).cache_size(256 << 10)).expect("open");
    let counters = tree.keyspace("counters").expect("ks");
    // Filler, so that the counters' leaves leave the cache now and then.
    for i in 0u32..20_000 {
        tree.insert(i.to_be_bytes(), [3u8; 48]).expect("insert");
    }
    let (threads, per_thread, keys) = (4, 1500, 3u8);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (counters, tree) = (&counters, &tree);
            s.spawn(move || {
                for i in 0..per_thread {
                    let key = [(i % keys as usize) as u8];
                    loop {
                        let old = counters.get(key).expect("get");
                        let n = old
                            .as_deref()
                            .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("u64")));
                        let new = (n + 1).to_le_bytes();
                        if counters
                            .compare_and_swap(key, old.as_deref(), Some(new.as_slice()))
                            .expect("cas")
                        {
                            break;
                        }
                    }
                    // Unrelated writes keep eviction busy.
                    tree.insert(
                        ((20_000 + t * per_thread + i) as u32).to_be_bytes(),
                        [5u8; 48],
                    )
                    .expect("insert");
                }
            });
        }
    });
    let total: u64 = (0..keys)
        .map(|k| {
            let v = counters.get([k]).expect("get").expect("counter");
            u64::from_le_bytes(v.try_into().expect("u64"))
        })
        .sum();
    assert_eq!(total, (threads * per_thread) as u64);
}
