//! `get_many` answers exactly what `get` answers, key by key: from the cache, from leaf pages
//! read together, with pending merges, damaged input and dropped keyspaces; and under
//! concurrent writes it never returns a value that was never written, nor one older than a
//! write that returned before the call.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};

use bfkv::{Config, Durability, Error, Tree};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn key(i: u32) -> Vec<u8> {
    format!("key-{i:07}").into_bytes()
}

fn add(_key: &[u8], old: Option<&[u8]>, operand: &[u8]) -> Option<Vec<u8>> {
    if operand.is_empty() {
        return None;
    }
    Some([old.unwrap_or_default(), operand].concat())
}

#[test]
fn get_many_equals_get_key_by_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = || {
        Config::new(dir.path())
            .cache_size(1 << 20)
            .durability(Durability::None)
            .merge_operator(add)
    };
    let tree = Tree::open(config()).expect("open");
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let n = 60_000u32;
    for i in 0..n {
        let v = format!("value-{i}").into_bytes();
        tree.insert(key(i), &v).expect("insert");
        model.insert(key(i), v);
    }
    tree.close().expect("close");
    let tree = Tree::open(config()).expect("reopen");
    // Cold: the pages of 50 keys far apart are read once each, together (a key looked up
    // again on its own would read its page a second time).
    let cold: Vec<Vec<u8>> = (0..50).map(|j| key(j * 1_000)).collect();
    let reads = tree.stats().pages_read;
    for (k, g) in cold.iter().zip(tree.get_many(&cold)) {
        assert_eq!(g.expect("get_many"), model.get(k).cloned());
    }
    let read = tree.stats().pages_read - reads;
    assert!(
        (1..=50).contains(&read),
        "{read} pages read for 50 cold keys"
    );
    let mut rng = StdRng::seed_from_u64(3);
    let limit = tree.limits().max_key_len;
    let mut from_disk = 0u64;
    for round in 0..300 {
        // Some writes (cached in mini-pages) and merges (pending over disk pages) first.
        for _ in 0..20 {
            let k = key(rng.gen_range(0..n + 1_000));
            match rng.gen_range(0..4) {
                0 => {
                    tree.remove(&k).expect("remove");
                    model.remove(&k);
                }
                1 => {
                    tree.merge(&k, b"+").expect("merge");
                    model.entry(k).or_default().push(b'+');
                }
                _ => {
                    let v = format!("round-{round}").into_bytes();
                    tree.insert(&k, &v).expect("insert");
                    model.insert(k, v);
                }
            }
        }
        let mut keys: Vec<Vec<u8>> = (0..rng.gen_range(1..100))
            .map(|_| key(rng.gen_range(0..n + 1_000)))
            .collect();
        keys.push(keys[0].clone());
        if round % 10 == 0 {
            keys.push(vec![b'x'; limit + 1]);
        }
        let reads = tree.stats().pages_read;
        let got = tree.get_many(&keys);
        from_disk += tree.stats().pages_read - reads;
        assert_eq!(got.len(), keys.len());
        for (k, g) in keys.iter().zip(got) {
            if k.len() > limit {
                assert!(matches!(g, Err(Error::KeyTooLarge { .. })), "round {round}");
                continue;
            }
            assert_eq!(
                g.expect("get_many"),
                model.get(k).cloned(),
                "round {round} key {}",
                String::from_utf8_lossy(k)
            );
        }
    }
    assert!(
        from_disk > 1_000,
        "the leaves were cached: {from_disk} pages read"
    );
    assert!(tree.get_many::<&[u8]>(&[]).is_empty());
}

#[test]
fn trees_of_different_page_sizes_on_one_thread_each_read_their_batch() {
    // `get_many` keeps its page buffers for the thread's next batch: a tree of another page
    // size must not read into them (the batch would fail, and every key be looked up again
    // on its own: a second cache miss each).
    let dirs: Vec<_> = (0..3)
        .map(|_| tempfile::tempdir().expect("tempdir"))
        .collect();
    let config = |dir: &tempfile::TempDir, page: usize| {
        Config::new(dir.path())
            .page_size(page)
            .cache_size(1 << 20)
            .durability(Durability::None)
    };
    let sizes = [16384, 4096, 8192];
    for (dir, page) in dirs.iter().zip(sizes) {
        let tree = Tree::open(config(dir, page)).expect("open");
        for i in 0..40_000u32 {
            tree.insert(key(i), i.to_be_bytes()).expect("insert");
        }
        tree.close().expect("close");
    }
    for round in 0..2 {
        for (dir, page) in dirs.iter().zip(sizes) {
            let tree = Tree::open(config(dir, page)).expect("reopen");
            let keys: Vec<Vec<u8>> = (0..20u32).map(|j| key(j * 1_999 + round)).collect();
            let (reads, misses_before) = (tree.stats().pages_read, tree.stats().cache_misses);
            for (j, got) in (0..20u32).zip(tree.get_many(&keys)) {
                let i = j * 1_999 + round;
                assert_eq!(got.expect("get_many"), Some(i.to_be_bytes().to_vec()));
            }
            let read = tree.stats().pages_read - reads;
            let missed = tree.stats().cache_misses - misses_before;
            assert!(
                (1..=20).contains(&read) && missed == 20,
                "{read} pages read and {missed} misses for 20 cold keys, {page}-byte pages"
            );
        }
    }
}

#[test]
fn a_keyspace_gets_many_and_a_dropped_one_answers_errors() {
    let tree = Tree::open(Config::in_memory()).expect("open");
    let ks = tree.keyspace("ks").expect("keyspace");
    ks.insert(b"a", b"1").expect("insert");
    tree.insert(b"a", b"default").expect("insert");
    let got = ks.get_many(&[b"a", b"b"]);
    assert_eq!(got[0].as_ref().ok(), Some(&Some(b"1".to_vec())));
    assert_eq!(got[1].as_ref().ok(), Some(&None));
    tree.drop_keyspace("ks").expect("drop");
    let got = ks.get_many(&[b"a", b"b"]);
    assert!(got
        .iter()
        .all(|g| matches!(g, Err(Error::KeyspaceDropped { .. }))));
}

/// Every answer is a value written to its key, and none older than the last write to it
/// that returned before the call began: with a small cache (most keys read from their
/// leaves' pages in batches) and in memory (every key answered without a leaf lock, while
/// the writer rewrites the mini-pages read).
#[test]
fn concurrent_writers_never_show_get_many_a_value_not_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    concurrent_writers_against(
        Config::new(dir.path())
            .cache_size(512 << 10)
            .durability(Durability::None),
    );
    concurrent_writers_against(Config::in_memory().cache_size(64 << 20));
}

fn concurrent_writers_against(config: Config) {
    let tree = Tree::open(config).expect("open");
    let n = 20_000u32;
    let value = |i: u32, v: u32| format!("{i}:{v}:{}", "p".repeat((i % 40) as usize)).into_bytes();
    for i in 0..n {
        tree.insert(key(i), value(i, 0)).expect("insert");
    }
    // The newest version of each key whose insert has returned.
    let done: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
    std::thread::scope(|s| {
        let (tree, done) = (&tree, &done);
        s.spawn(move || {
            let mut rng = StdRng::seed_from_u64(1);
            for v in 1..40_000u32 {
                let i = rng.gen_range(0..n);
                tree.insert(key(i), value(i, v)).expect("insert");
                done[i as usize].store(v, Ordering::Release);
            }
        });
        s.spawn(move || {
            let mut rng = StdRng::seed_from_u64(2);
            for _ in 0..2_000 {
                let ids: Vec<u32> = (0..32).map(|_| rng.gen_range(0..n)).collect();
                let keys: Vec<Vec<u8>> = ids.iter().map(|&i| key(i)).collect();
                let floors: Vec<u32> = ids
                    .iter()
                    .map(|&i| done[i as usize].load(Ordering::Acquire))
                    .collect();
                for ((&i, floor), got) in ids.iter().zip(floors).zip(tree.get_many(&keys)) {
                    let got = got.expect("get_many").expect("every key is present");
                    let text = String::from_utf8(got).expect("utf8");
                    let mut parts = text.splitn(3, ':');
                    let (id, version) = (parts.next(), parts.next());
                    assert_eq!(id, Some(i.to_string().as_str()), "another key's value");
                    let version: u32 = version.and_then(|v| v.parse().ok()).expect("version");
                    assert_eq!(text, String::from_utf8(value(i, version)).expect("utf8"));
                    assert!(
                        version >= floor,
                        "key {i}: version {version}, older than {floor}, written before the call"
                    );
                }
            }
        });
    });
}
