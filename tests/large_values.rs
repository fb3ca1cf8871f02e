//! Values stored out of line (DESIGN.md, "What services build on"): every size from 0 B to
//! the 64 MiB limit through the unchanged API, in every keyspace and durability mode;
//! persistence; space reuse under overwrites and removals; damaged extents; and a
//! differential test against a `BTreeMap` mixing small and large values.

use std::collections::BTreeMap;
use std::path::Path;

use bfkv::{Config, Durability, Error, Tree};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const MIB: usize = 1 << 20;

/// A value of `len` bytes that differs in every position and between seeds.
fn value(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn config(dir: &Path, durability: Durability) -> Config {
    Config::new(dir)
        .durability(durability)
        .cache_size(1 << 20)
        .evictor_threads(0)
        .idle_write_back(None)
        .checkpoint_log_bytes(1 << 30)
}

/// Copies the files of `from` (not its lock) to the new directory `to`.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&path, &to.join(entry.file_name()));
        } else if entry.file_name() != "LOCK" {
            std::fs::copy(&path, to.join(entry.file_name())).unwrap();
        }
    }
}

/// Sizes around every boundary: the inline limit for `key`, block and page multiples ± 1.
fn sizes(tree: &Tree, key: &[u8]) -> Vec<usize> {
    let inline = tree.limits().max_record_len - key.len();
    let mut sizes = vec![0, 1, 28, inline - 1, inline, inline + 1];
    for n in [4096, 8192, 65536, MIB] {
        sizes.extend([n - 1, n, n + 1]);
    }
    sizes.push(16 * MIB);
    sizes
}

#[test]
fn values_of_every_size_round_trip_and_persist_in_every_mode() {
    for durability in [Durability::Sync, Durability::Buffered, Durability::None] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("db");
        let mut expect: BTreeMap<(bool, Vec<u8>), Vec<u8>> = BTreeMap::new();
        {
            let tree = Tree::open(config(&dir, durability)).unwrap();
            let ks = tree.keyspace("docs").unwrap();
            for (i, len) in sizes(&tree, b"size-00").into_iter().enumerate() {
                let key = format!("size-{i:02}").into_bytes();
                let v = value(i as u64, len);
                tree.insert(&key, &v).unwrap();
                assert_eq!(tree.get(&key).unwrap().as_deref(), Some(&v[..]), "{len} B");
                let v2 = value(1000 + i as u64, len);
                ks.insert(&key, &v2).unwrap();
                expect.insert((false, key.clone()), v);
                expect.insert((true, key), v2);
            }
            // Scans and batched lookups see the values too.
            let scanned: Vec<_> = ks.iter().collect::<Result<_, _>>().unwrap();
            let want: Vec<_> = expect
                .iter()
                .filter(|((named, _), _)| *named)
                .map(|((_, k), v)| (k.clone(), v.clone()))
                .collect();
            assert!(scanned == want, "scan of the named keyspace");
            let keys: Vec<Vec<u8>> = expect
                .keys()
                .filter(|(named, _)| !named)
                .map(|(_, k)| k.clone())
                .collect();
            for (k, got) in keys.iter().zip(tree.get_many(&keys)) {
                assert_eq!(got.unwrap(), expect.get(&(false, k.clone())).cloned());
            }
            if durability == Durability::None {
                tree.close().unwrap();
            } else {
                // Recovery from the log alone: a copy of the files as a crash would leave
                // them (no background thread writes: no evictor, no idle write-back, and the
                // log stays below the checkpoint mark).
                tree.flush().unwrap();
                copy_dir(&dir, &tmp.path().join("crashed"));
                drop(tree);
            }
        }
        let dir = if durability == Durability::None {
            dir
        } else {
            tmp.path().join("crashed")
        };
        let tree = Tree::open(config(&dir, durability)).unwrap();
        if durability != Durability::None {
            assert!(
                tree.stats().replayed > 0,
                "{durability:?}: nothing replayed"
            );
        }
        let ks = tree.keyspace("docs").unwrap();
        for ((named, key), v) in &expect {
            let got = if *named { ks.get(key) } else { tree.get(key) }.unwrap();
            assert!(
                got.as_deref() == Some(&v[..]),
                "{durability:?}: {} B after reopen",
                v.len()
            );
        }
        tree.close().unwrap();
    }
}

#[test]
fn past_the_limit_is_refused_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let tree = Tree::open(config(tmp.path(), Durability::None)).unwrap();
    let limit = tree.limits().max_value_len;
    assert_eq!(limit, 64 * MIB);
    let old = value(1, 3 * MIB);
    tree.insert(b"k", &old).unwrap();
    let before = tree.stats();
    match tree.insert(b"k", vec![0u8; limit + 1]) {
        Err(Error::ValueTooLarge { len, limit: l }) => assert_eq!((len, l), (limit + 1, limit)),
        other => panic!("expected ValueTooLarge, got {other:?}"),
    }
    assert_eq!(tree.get(b"k").unwrap(), Some(old));
    assert_eq!(tree.stats().blobs_written, before.blobs_written);
    // The limit itself is accepted.
    tree.insert(b"max", vec![7u8; limit]).unwrap();
    assert_eq!(tree.get(b"max").unwrap().map(|v| v.len()), Some(limit));
    // An in-memory tree stores values in records only.
    let mem = Tree::open(Config::in_memory()).unwrap();
    let inline = mem.limits().max_record_len - 1;
    assert_eq!(mem.limits().max_value_len, mem.limits().max_record_len);
    mem.insert(b"k", vec![1u8; inline]).unwrap();
    assert!(matches!(
        mem.insert(b"k", vec![1u8; inline + 1]),
        Err(Error::ValueTooLarge { .. })
    ));
}

#[test]
fn a_small_value_that_reads_like_a_reference_round_trips() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let tree = Tree::open(config(dir, Durability::Sync)).unwrap();
    // Store a large value, then read the 28-byte reference its leaf holds by making a
    // value with the same bytes: take it from a fresh large write's shape. The marker is
    // not public, so build candidates by flipping bytes of every 28-byte window of the
    // data file's pages: simpler, store values that start like any possible reference.
    let big = value(9, 100_000);
    tree.insert(b"big", &big).unwrap();
    tree.checkpoint().unwrap();
    let data = std::fs::read(dir.join("data")).unwrap();
    let marker_at = data
        .windows(8)
        .position(|w| w == [0xBF, 0xB1, 0x0B, b'r', b'e', b'f', 0x00, 0x01])
        .expect("the leaf holds the reference");
    let lookalike = data[marker_at..marker_at + 28].to_vec();
    let blobs_before = tree.stats().blobs_written;
    tree.insert(b"lookalike", &lookalike).unwrap();
    assert_eq!(
        tree.stats().blobs_written,
        blobs_before + 1,
        "a value that reads as a reference is stored out of line"
    );
    assert_eq!(tree.get(b"lookalike").unwrap(), Some(lookalike.clone()));
    tree.close().unwrap();
    let tree = Tree::open(config(dir, Durability::Sync)).unwrap();
    assert_eq!(tree.get(b"lookalike").unwrap(), Some(lookalike));
    assert_eq!(tree.get(b"big").unwrap(), Some(big));
}

#[test]
fn overwrites_and_removals_reuse_the_blob_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let tree = Tree::open(config(dir, Durability::Buffered)).unwrap();
    // 300 overwrites of 1 MiB over four keys: 300 MiB written, 4 MiB live.
    for round in 0..300u64 {
        let key = format!("doc-{}", round % 4);
        tree.insert(&key, value(round, MIB)).unwrap();
    }
    tree.checkpoint().unwrap();
    tree.checkpoint().unwrap();
    let file = std::fs::metadata(dir.join("blobs")).unwrap().len() as usize;
    let stats = tree.stats();
    assert!(
        file <= 80 * MIB,
        "blob file {} MiB after 300 MiB of overwrites of 4 MiB",
        file / MIB
    );
    assert_eq!(stats.blob_extents, 4, "{stats:?}");
    assert_eq!(stats.blob_bytes_in_use as usize, 4 * MIB);
    for k in 0..4u64 {
        assert_eq!(
            tree.get(format!("doc-{k}")).unwrap(),
            Some(value(296 + k, MIB))
        );
    }
    // Removing every key frees every extent; the file shrinks once they are free, to one
    // growth step (16 MiB) past the last extent in use.
    for k in 0..4 {
        tree.remove(format!("doc-{k}")).unwrap();
    }
    tree.checkpoint().unwrap();
    let stats = tree.stats();
    assert_eq!((stats.blob_extents, stats.blob_bytes_in_use), (0, 0));
    let file = || std::fs::metadata(dir.join("blobs")).unwrap().len() as usize;
    assert!(
        file() <= 16 * MIB,
        "{} MiB with nothing in use",
        file() / MIB
    );
    // It grows again from the start: the freed space is reused, not appended to.
    for i in 0..16u64 {
        tree.insert(format!("again-{i}"), value(i, MIB)).unwrap();
    }
    tree.checkpoint().unwrap();
    assert!(file() <= 32 * MIB, "{} MiB for 16 MiB in use", file() / MIB);
    tree.close().unwrap();
}

#[test]
fn a_damaged_extent_answers_corruption_and_nothing_else_breaks() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    {
        let tree = Tree::open(config(dir, Durability::Sync)).unwrap();
        for i in 0..8u64 {
            tree.insert(format!("k{i}"), value(i, 200_000)).unwrap();
        }
        tree.close().unwrap();
    }
    let path = dir.join("blobs");
    let mut bytes = std::fs::read(&path).unwrap();
    // Flip one bit inside the extents written (the file is reserved past them): one
    // extent is damaged.
    let at = 4 * 200_000;
    bytes[at] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let tree = Tree::open(config(dir, Durability::Sync)).unwrap();
    let mut damaged = 0;
    for i in 0..8u64 {
        match tree.get(format!("k{i}")) {
            Ok(v) => assert_eq!(v, Some(value(i, 200_000))),
            Err(Error::Corruption { file, .. }) => {
                assert_eq!(file, path);
                damaged += 1;
            }
            Err(e) => panic!("k{i}: {e}"),
        }
    }
    assert_eq!(damaged, 1);
    // A scan reports it as its error; an overwrite replaces the damaged value.
    assert!(tree.iter().any(|r| r.is_err()));
    for i in 0..8u64 {
        tree.insert(format!("k{i}"), value(50 + i, 5000)).unwrap();
    }
    for i in 0..8u64 {
        assert_eq!(
            tree.get(format!("k{i}")).unwrap(),
            Some(value(50 + i, 5000))
        );
    }
    // A file cut short: the extents past its end are damaged too, never a panic.
    tree.close().unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(0).unwrap();
    drop(f);
    let tree = Tree::open(config(dir, Durability::Sync)).unwrap();
    for i in 0..8u64 {
        assert!(matches!(
            tree.get(format!("k{i}")),
            Err(Error::Corruption { .. })
        ));
    }
}

#[test]
fn batches_compare_and_swap_and_merges_take_large_values() {
    let tmp = tempfile::tempdir().unwrap();
    let append = |_: &[u8], old: Option<&[u8]>, op: &[u8]| {
        // Keeps the last 8 bytes of the old value followed by the operand: the operator
        // sees the whole old value even when it is stored out of line.
        let mut v = old.map_or_else(Vec::new, |o| {
            let mut tail = (o.len() as u64).to_le_bytes().to_vec();
            tail.extend_from_slice(&o[o.len().saturating_sub(8)..]);
            tail
        });
        v.extend_from_slice(op);
        Some(v)
    };
    let tree = Tree::open(config(tmp.path(), Durability::Sync).merge_operator(append)).unwrap();
    let ks = tree.keyspace("blobs").unwrap();
    let big = value(1, 3 * MIB);
    let mut batch = tree.batch();
    batch.insert(&ks, b"a", &big);
    batch.insert(&ks, b"b", b"small");
    batch.insert(&tree.default_keyspace(), b"c", value(2, MIB));
    assert!(batch.len_bytes() < 200, "large values count as references");
    batch.commit().unwrap();
    assert_eq!(ks.get(b"a").unwrap(), Some(big.clone()));
    assert_eq!(tree.get(b"c").unwrap(), Some(value(2, MIB)));
    // A batch with one invalid write applies nothing and leaves no extent behind.
    let extents = tree.stats().blob_extents;
    let mut batch = tree.batch();
    batch.insert(&ks, b"d", value(3, MIB));
    batch.insert(&ks, vec![0u8; 5000], b"key too long");
    assert!(batch.commit().is_err());
    assert_eq!(ks.get(b"d").unwrap(), None);
    tree.checkpoint().unwrap();
    assert_eq!(tree.stats().blob_extents, extents);

    // Compare-and-swap compares whole values, large ones included.
    let other = value(4, 2 * MIB);
    assert!(!ks
        .compare_and_swap(b"a", Some(&other[..]), Some(&other[..]))
        .unwrap());
    assert!(ks
        .compare_and_swap(b"a", Some(&big[..]), Some(&other[..]))
        .unwrap());
    assert_eq!(ks.get(b"a").unwrap(), Some(other.clone()));
    assert!(ks.compare_and_swap(b"a", Some(&other[..]), None).unwrap());
    assert_eq!(ks.get(b"a").unwrap(), None);
    // A failed comparison frees the extent its new value took.
    tree.checkpoint().unwrap();
    let extents = tree.stats().blob_extents;
    assert!(!ks
        .compare_and_swap(b"b", Some(b"x"), Some(&big[..]))
        .unwrap());
    assert_eq!(tree.stats().blob_extents, extents);

    // A merge folds over a large value: the operator sees all of it.
    tree.merge(b"c", b"+tail").unwrap();
    let mut want = (MIB as u64).to_le_bytes().to_vec();
    want.extend_from_slice(&value(2, MIB)[MIB - 8..]);
    want.extend_from_slice(b"+tail");
    assert_eq!(tree.get(b"c").unwrap(), Some(want));
}

#[test]
fn backups_carry_large_values() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let tree = Tree::open(config(&dir, Durability::Buffered)).unwrap();
    for i in 0..20u64 {
        tree.insert(format!("k{i:02}"), value(i, 300_000 + i as usize))
            .unwrap();
    }
    tree.backup(tmp.path().join("copy")).unwrap();
    // Writes after the backup are not in it.
    tree.insert(b"k00", b"changed").unwrap();
    tree.close().unwrap();
    let copy = Tree::open(config(&tmp.path().join("copy"), Durability::Buffered)).unwrap();
    for i in 0..20u64 {
        assert_eq!(
            copy.get(format!("k{i:02}")).unwrap(),
            Some(value(i, 300_000 + i as usize))
        );
    }
}

#[test]
fn reading_many_large_values_keeps_memory_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let tree = Tree::open(config(tmp.path(), Durability::None)).unwrap();
    for i in 0..8u64 {
        tree.insert(format!("k{i}"), value(i, 8 * MIB)).unwrap();
    }
    let rss = || {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
            })
            .map(|kib| kib << 10)
    };
    let Some(start) = rss() else {
        return; // No /proc: nothing to measure here.
    };
    // 512 MiB read through gets and scans: none of it stays in memory.
    for round in 0..4u64 {
        for i in 0..8u64 {
            let v = tree.get(format!("k{i}")).unwrap().unwrap();
            assert_eq!(v.len(), 8 * MIB);
            assert_eq!(v[..64], value(i, 64)[..], "round {round}");
        }
        for item in &tree {
            assert_eq!(item.unwrap().1.len(), 8 * MIB);
        }
    }
    let grown = rss().unwrap_or(start).saturating_sub(start);
    assert!(grown < 64 * MIB, "RSS grew {} MiB", grown / MIB);
}

#[test]
fn differential_with_small_and_large_values_under_a_tiny_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let cfg = || {
        Config::new(dir)
            .durability(Durability::Buffered)
            .cache_size(256 << 10)
            .checkpoint_log_bytes(1 << 20)
    };
    let mut tree = Tree::open(cfg()).unwrap();
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut rng = StdRng::seed_from_u64(23);
    for step in 0..6000u64 {
        let key = format!("key-{:04}", rng.gen_range(0..400)).into_bytes();
        match rng.gen_range(0..100) {
            0..=49 => {
                let len = match rng.gen_range(0..10) {
                    0..=5 => rng.gen_range(0..64),
                    6..=7 => rng.gen_range(1500..4000),
                    _ => rng.gen_range(4000..200_000),
                };
                let v = value(step, len);
                tree.insert(&key, &v).unwrap();
                model.insert(key, v);
            }
            50..=64 => {
                tree.remove(&key).unwrap();
                model.remove(&key);
            }
            65..=89 => assert_eq!(tree.get(&key).unwrap(), model.get(&key).cloned()),
            90..=97 => {
                let n = rng.gen_range(1..30);
                let got: Vec<_> = tree
                    .range(key.clone()..)
                    .take(n)
                    .collect::<Result<_, _>>()
                    .unwrap();
                let want: Vec<_> = model
                    .range(key.clone()..)
                    .take(n)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                assert!(got == want, "step {step}: scan from {key:?}");
            }
            // Checkpoints free the extents of overwritten and removed values.
            98 => tree.checkpoint().unwrap(),
            _ => {
                tree.close().unwrap();
                tree = Tree::open(cfg()).unwrap();
            }
        }
    }
    let all: Vec<_> = tree.iter().collect::<Result<_, _>>().unwrap();
    let want: Vec<_> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert!(all == want, "final scan");
    // After a checkpoint only the values stored out of line hold extents.
    tree.checkpoint().unwrap();
    let inline = tree.limits().max_record_len;
    let outline = model
        .iter()
        .filter(|(k, v)| v.len() > inline - k.len())
        .count() as u64;
    assert_eq!(tree.stats().blob_extents, outline);
    tree.close().unwrap();
}
