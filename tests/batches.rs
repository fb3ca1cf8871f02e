//! Atomic batches through the public API: all or nothing for readers and for errors, large
//! batches under a small cache, persistence.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bfkv::{Config, Durability, Error, Tree};

/// Key `i` of a batch: spread over the key space with filler between, so a batch spans
/// many leaves.
fn spread(i: u32) -> Vec<u8> {
    format!("{:05}-batch", i * 97).into_bytes()
}

/// A tree with 20,000 filler records around the batch keys.
fn filled(config: Config) -> Tree {
    let tree = Tree::open(config).expect("open");
    for i in 0..20_000u32 {
        tree.insert(format!("{i:05}-fill"), [7u8; 40])
            .expect("fill");
    }
    tree
}

#[test]
fn concurrent_readers_never_see_part_of_a_batch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = Arc::new(filled(Config::new(dir.path()).cache_size(512 << 10)));
    let other = tree.keyspace("other").expect("keyspace");
    let keys: Vec<Vec<u8>> = (0..150).map(spread).collect();
    {
        // Round 0: every key holds 0, in both keyspaces.
        let mut b = tree.batch();
        for k in &keys {
            b.insert(&tree.default_keyspace(), k, 0u64.to_be_bytes());
            b.insert(&other, k, 0u64.to_be_bytes());
        }
        b.commit().expect("first batch");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (tree, other, keys, stop) = (tree.clone(), other.clone(), keys.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                let mut b = tree.batch();
                for k in &keys {
                    b.insert(&tree.default_keyspace(), k, round.to_be_bytes());
                    b.insert(&other, k, round.to_be_bytes());
                }
                // Single writes to the filler go on meanwhile: splits, evictions.
                for i in 0..20u32 {
                    let _ = tree.insert(
                        format!("{:05}-fill", (round as u32 * 31 + i) % 20_000),
                        [round as u8; 60],
                    );
                }
                b.commit().expect("batch");
            }
            round
        })
    };
    // Every batch key, as a scan saw it: all one round, or the scan saw part of a batch.
    let check = |rows: Vec<(Vec<u8>, Vec<u8>)>, what: &str| {
        let values: Vec<&Vec<u8>> = rows
            .iter()
            .filter(|(k, _)| k.ends_with(b"-batch"))
            .map(|(_, v)| v)
            .collect();
        assert_eq!(values.len(), keys.len(), "{what}: a batch key missing");
        assert!(
            values.windows(2).all(|w| w[0] == w[1]),
            "{what}: a scan saw part of a batch"
        );
        u64::from_be_bytes(values[0].as_slice().try_into().expect("8 bytes"))
    };
    let mut scans = 0;
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(3) {
        let forward: Vec<_> = tree.iter().map(|r| r.expect("scan")).collect();
        let a = check(forward, "forward");
        let mut backward: Vec<_> = other.iter().rev().map(|r| r.expect("scan")).collect();
        backward.reverse();
        // The other keyspace's keys have no filler: all of them are batch keys.
        let b = check(backward, "backward");
        assert!(b >= a, "a later scan saw an older batch");
        scans += 2;
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = writer.join().expect("writer");
    assert!(rounds > 10 && scans > 4, "rounds {rounds}, scans {scans}");
}

/// A way to spoil a batch, and the error it must give.
type Case<'a> = (Box<dyn Fn(&mut bfkv::Batch) + 'a>, fn(&Error) -> bool);

#[test]
fn an_invalid_write_fails_the_whole_batch() {
    let tree = Tree::open(Config::in_memory()).expect("open");
    let ks = tree.keyspace("k").expect("keyspace");
    let limits = tree.limits();
    let cases: Vec<Case<'_>> = vec![
        (
            Box::new(|b| b.insert(&ks, vec![1u8; limits.max_key_len + 1], b"v")),
            |e| matches!(e, Error::KeyTooLarge { .. }),
        ),
        (
            Box::new(|b| b.insert(&ks, b"k", vec![1u8; limits.max_value_len + 1])),
            |e| matches!(e, Error::ValueTooLarge { .. }),
        ),
        (
            Box::new(|b| b.remove(&ks, vec![1u8; limits.max_key_len + 1])),
            |e| matches!(e, Error::KeyTooLarge { .. }),
        ),
    ];
    for (i, (bad, is)) in cases.iter().enumerate() {
        let mut b = tree.batch();
        b.insert(&ks, b"before", b"1");
        bad(&mut b);
        b.insert(&ks, b"after", b"1");
        let err = b.commit().expect_err("invalid batch");
        assert!(is(&err), "case {i}: {err:?}");
        assert_eq!(ks.iter().count(), 0, "case {i}: something was applied");
    }
    // A keyspace of another tree.
    let stranger = Tree::open(Config::in_memory()).expect("open");
    let mut b = tree.batch();
    b.insert(&ks, b"mine", b"1");
    b.insert(&stranger.default_keyspace(), b"theirs", b"1");
    assert!(matches!(b.commit(), Err(Error::InvalidInput { .. })));
    assert_eq!(ks.get(b"mine").expect("get"), None);
    assert_eq!(stranger.get(b"theirs").expect("get"), None);
}

#[test]
fn a_batch_past_the_limit_is_refused_and_one_at_it_commits() {
    let tree = Tree::open(Config::in_memory().cache_size(4 << 20)).expect("open");
    let limit = tree.limits().max_batch_len;
    assert_eq!(limit, 1 << 20, "a quarter of the cache");
    let ks = tree.default_keyspace();
    // Writes of 1,000-byte values until the next one would pass the limit.
    let mut b = tree.batch();
    let mut i = 0u32;
    loop {
        let mut next = tree.batch();
        next.insert(&ks, format!("{i:08}"), [3u8; 1000]);
        if b.len_bytes() + next.len_bytes() > limit {
            break;
        }
        b.insert(&ks, format!("{i:08}"), [3u8; 1000]);
        i += 1;
    }
    let mut over = tree.batch();
    for j in 0..=i {
        over.insert(&ks, format!("{j:08}"), [4u8; 1000]);
    }
    match over.commit() {
        Err(Error::BatchTooLarge { len, limit: l }) => assert!(len > l && l == limit),
        other => panic!("expected BatchTooLarge, got {other:?}"),
    }
    assert_eq!(tree.iter().count(), 0);
    b.commit().expect("a batch at the limit");
    assert_eq!(tree.iter().count(), i as usize);
}

#[test]
fn a_thousand_key_batch_applies_under_a_small_cache_and_persists() {
    for durability in [Durability::Sync, Durability::Buffered, Durability::None] {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = || {
            // A 1 MiB cache: the data does not fit, and a batch may take 256 KiB.
            Config::new(dir.path())
                .cache_size(1 << 20)
                .durability(durability)
        };
        let tree = Tree::open(config()).expect("open");
        for i in 0..30_000u32 {
            tree.insert(format!("{:08}", i * 3), [1u8; 24])
                .expect("fill");
        }
        let ks = tree.keyspace("index").expect("keyspace");
        for round in 0..5u32 {
            let mut b = tree.batch();
            for i in 0..1_000u32 {
                // Every 90th record of the filler (about one per leaf), and a key in the
                // other keyspace for each.
                let k = format!("{:08}", i * 90 + round);
                if round % 2 == 1 && i % 3 == 0 {
                    b.remove(&tree.default_keyspace(), &k);
                } else {
                    b.insert(
                        &tree.default_keyspace(),
                        &k,
                        format!("round-{round}-{i:0200}"),
                    );
                }
                b.insert(&ks, &k, round.to_le_bytes());
            }
            b.commit().expect("1,000-key batch");
        }
        assert!(tree.stats().batches >= 5);
        tree.close().expect("close");
        let tree = Tree::open(config()).expect("reopen");
        let ks = tree.keyspace("index").expect("keyspace");
        assert_eq!(ks.iter().count(), 5 * 1_000);
        for i in 0..1_000u32 {
            let k = format!("{:08}", i * 90 + 4);
            let want = format!("round-4-{i:0200}");
            assert_eq!(
                tree.get(&k).expect("get"),
                Some(want.into_bytes()),
                "{durability:?} {k}"
            );
            let k3 = format!("{:08}", i * 90 + 3);
            let got = tree.get(&k3).expect("get");
            if i % 3 == 0 {
                assert_eq!(got, None, "{durability:?} {k3} removed by round 3");
            } else {
                assert_eq!(got, Some(format!("round-3-{i:0200}").into_bytes()));
            }
        }
        // Rounds 0 and 3 write filler keys (multiples of 3), rounds 1, 2 and 4 new ones;
        // the removals of round 1 hit nothing, those of round 3 remove 334 filler keys.
        assert_eq!(tree.iter().count(), 30_000 + 1_000 - 334 + 2 * 1_000 - 334);
    }
}

#[test]
fn a_batch_after_close_or_drop_is_refused() {
    let tree = Tree::open(Config::in_memory()).expect("open");
    let ks = tree.keyspace("gone").expect("keyspace");
    let mut b = tree.batch();
    b.insert(&ks, b"k", b"v");
    tree.drop_keyspace("gone").expect("drop");
    assert!(matches!(b.commit(), Err(Error::KeyspaceDropped { .. })));
    let mut b = tree.batch();
    b.insert(&tree.default_keyspace(), b"k", b"v");
    tree.close().expect("close");
    assert!(matches!(b.commit(), Err(Error::Closed)));
}

#[test]
fn the_last_write_of_a_key_in_a_batch_wins() {
    let tree = Tree::open(Config::in_memory()).expect("open");
    let ks = tree.default_keyspace();
    let mut b = tree.batch();
    b.insert(&ks, b"a", b"1");
    b.remove(&ks, b"a");
    b.insert(&ks, b"b", b"1");
    b.insert(&ks, b"b", b"2");
    b.remove(&ks, b"c");
    b.insert(&ks, b"c", b"3");
    assert_eq!(b.len(), 6);
    b.commit().expect("commit");
    let all: Vec<_> = tree.iter().map(|r| r.expect("iter")).collect();
    assert_eq!(
        all,
        vec![
            (b"b".to_vec(), b"2".to_vec()),
            (b"c".to_vec(), b"3".to_vec())
        ]
    );
    // An empty batch commits and changes nothing.
    tree.batch().commit().expect("empty batch");
}

#[test]
fn a_batch_is_built_on_one_thread_and_committed_on_another() {
    fn assert_send<T: Send + 'static>(_: &T) {}
    let tree = Tree::open(Config::in_memory()).expect("open");
    let mut b = tree.batch();
    b.insert(&tree.default_keyspace(), b"k", b"v");
    assert_send(&b);
    std::thread::spawn(move || b.commit())
        .join()
        .expect("thread")
        .expect("commit");
    assert_eq!(tree.get(b"k").expect("get"), Some(b"v".to_vec()));
}
