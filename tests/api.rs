//! The public API's answers to bad input and faults (the table in DESIGN.md): empty keys and
//! values, oversized records, a directory opened twice (in this process and from another),
//! invalid settings, a full in-memory tree, a changed page size, bit-flipped data pages and
//! checkpoint files, and a scan over a million removed keys.

use std::path::Path;
use std::process::Command;

use bfkv::{Config, Error, Tree};

type Kv = (Vec<u8>, Vec<u8>);

fn all(tree: &Tree) -> Vec<Kv> {
    tree.iter().collect::<Result<_, _>>().expect("iter")
}

fn key(i: usize) -> Vec<u8> {
    format!("key-{i:07}").into_bytes()
}

fn value(i: usize) -> Vec<u8> {
    format!("value-{i}-").repeat(1 + i % 9).into_bytes()
}

#[test]
fn empty_key_and_empty_value_are_ordinary_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    for config in [Config::in_memory(), Config::new(dir.path())] {
        let tree = Tree::open(config.clone()).expect("open");
        tree.insert(b"", b"empty key").expect("insert empty key");
        tree.insert(b"k", b"").expect("insert empty value");
        assert_eq!(tree.get(b"").expect("get"), Some(b"empty key".to_vec()));
        assert_eq!(tree.get(b"k").expect("get"), Some(Vec::new()));
        let expected = vec![
            (Vec::new(), b"empty key".to_vec()),
            (b"k".to_vec(), Vec::new()),
        ];
        assert_eq!(all(&tree), expected);
        // The empty key is the smallest: an unbounded or `..=""` range starts with it.
        let first: Vec<Kv> = tree
            .range(..=b"".as_slice())
            .collect::<Result<_, _>>()
            .expect("range");
        assert_eq!(first, expected[..1]);
        let back: Vec<Kv> = tree.iter().rev().collect::<Result<_, _>>().expect("rev");
        assert_eq!(back, expected.iter().rev().cloned().collect::<Vec<_>>());
        if config.get_dir().is_some() {
            tree.close().expect("close");
            let tree = Tree::open(config).expect("reopen");
            assert_eq!(all(&tree), expected, "after reopen");
            tree.remove(b"").expect("remove empty key");
            assert_eq!(tree.get(b"").expect("get"), None);
        }
    }
}

#[test]
fn oversized_keys_and_values_are_rejected_and_change_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    for config in [Config::in_memory(), Config::new(dir.path()).page_size(8192)] {
        let tree = Tree::open(config).expect("open");
        let limits = tree.limits();
        let max_key = vec![b'k'; limits.max_key_len];
        let max_val = vec![b'v'; limits.max_record_len - limits.max_key_len];
        tree.insert(&max_key, &max_val)
            .expect("a record exactly at the limits is accepted");
        tree.insert(b"small", b"before").expect("insert");
        let before = all(&tree);

        let long_key = vec![b'k'; limits.max_key_len + 1];
        assert!(matches!(
            tree.insert(&long_key, b"x"),
            Err(Error::KeyTooLarge { len, limit }) if len == limits.max_key_len + 1 && limit == limits.max_key_len
        ));
        assert!(matches!(
            tree.remove(&long_key),
            Err(Error::KeyTooLarge { .. })
        ));
        assert!(matches!(
            tree.get(&long_key),
            Err(Error::KeyTooLarge { .. })
        ));
        // A tree with a directory stores longer values out of line, up to `max_value_len`;
        // an in-memory one stops at what a record holds with the key.
        let out_of_line = limits.max_value_len > limits.max_record_len;
        let (long_val, limit) = if out_of_line {
            (vec![b'v'; limits.max_value_len + 1], limits.max_value_len)
        } else {
            (
                vec![b'v'; limits.max_record_len - 4],
                limits.max_record_len - 5,
            )
        };
        assert!(matches!(
            tree.insert(b"small", &long_val),
            Err(Error::ValueTooLarge { limit: l, .. }) if l == limit
        ));
        let over = if out_of_line {
            long_val
        } else {
            let mut over = max_val.clone();
            over.push(b'v');
            over
        };
        assert!(matches!(
            tree.insert(&max_key, &over),
            Err(Error::ValueTooLarge { .. })
        ));
        assert_eq!(all(&tree), before, "a rejected write changed the tree");
        assert_eq!(tree.get(b"small").expect("get"), Some(b"before".to_vec()));
    }
}

/// Set in a child process: open this directory and report the outcome on stdout.
const CHILD_ENV: &str = "BFKV_API_CHILD_OPEN";

/// Runs this test binary again as a child that tries to open `dir`; returns its report.
fn open_from_child(dir: &Path) -> String {
    let exe = std::env::current_exe().expect("current_exe");
    let out = Command::new(exe)
        .args([
            "--exact",
            "a_directory_is_opened_by_one_tree_at_a_time",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir)
        .output()
        .expect("spawn child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed: {stdout}");
    stdout
        .lines()
        .find_map(|l| l.split_once("CHILD-RESULT: ").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("child gave no result: {stdout}"))
        .to_string()
}

#[test]
fn a_directory_is_opened_by_one_tree_at_a_time() {
    if let Some(dir) = std::env::var_os(CHILD_ENV) {
        let report = match Tree::open(Config::new(&dir)) {
            Ok(tree) => {
                let r = match tree.get(b"written by the parent") {
                    Ok(Some(v)) if v == b"yes" => "opened, data intact".to_string(),
                    other => format!("opened, wrong data: {other:?}"),
                };
                drop(tree);
                r
            }
            Err(Error::Locked { .. }) => "locked".to_string(),
            Err(e) => format!("other error: {e}"),
        };
        println!("\nCHILD-RESULT: {report}");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = Tree::open(Config::new(dir.path())).expect("open");
    tree.insert(b"written by the parent", b"yes")
        .expect("insert");
    assert!(matches!(
        Tree::open(Config::new(dir.path())),
        Err(Error::Locked { .. })
    ));
    assert_eq!(open_from_child(dir.path()), "locked");
    // The rejected opens disturbed nothing.
    assert_eq!(
        tree.get(b"written by the parent").expect("get"),
        Some(b"yes".to_vec())
    );
    tree.close().expect("close");
    assert_eq!(open_from_child(dir.path()), "opened, data intact");
    let tree = Tree::open(Config::new(dir.path())).expect("reopen after close");
    drop(tree);
    // Drop releases the directory as close does.
    let tree = Tree::open(Config::new(dir.path())).expect("reopen after drop");
    assert_eq!(
        tree.get(b"written by the parent").expect("get"),
        Some(b"yes".to_vec())
    );
}

#[test]
fn bad_settings_are_invalid_config() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = || Config::new(dir.path());
    for config in [
        base().page_size(3000),
        base().page_size(2048),
        base().page_size(128 << 10),
        base().page_size(0),
        base().cache_size(0),
        base().cache_size(4096),
        base().second_chance_percent(101),
        base().promotion_percent(101),
        base().merge_threshold(0),
        base().merge_threshold(16384),
        Config::in_memory().cache_size(1),
    ] {
        match Tree::open(config.clone()) {
            Err(Error::InvalidConfig { .. }) => {}
            other => panic!("{config:?}: expected InvalidConfig, got {other:?}"),
        }
    }
    // Nothing was created by the rejected opens.
    assert!(!dir.path().join("data").exists());
}

#[test]
fn a_full_in_memory_tree_says_cache_full_and_keeps_what_it_acknowledged() {
    let tree = Tree::open(Config::in_memory().cache_size(256 << 10)).expect("open");
    let mut acked = Vec::new();
    let mut full_at = None;
    for i in 0..100_000 {
        match tree.insert(key(i), value(i)) {
            Ok(()) => acked.push(i),
            Err(Error::CacheFull { cache_size }) => {
                assert_eq!(cache_size, 256 << 10);
                full_at = Some(i);
                break;
            }
            Err(e) => panic!("insert {i}: unexpected {e}"),
        }
    }
    let full_at = full_at.expect("256 KiB never filled up");
    assert!(acked.len() > 100, "full after only {} records", acked.len());
    // Later writes keep failing cleanly (or succeed where space remains), and every
    // acknowledged record is still there, whole.
    for i in full_at..full_at + 200 {
        match tree.insert(key(i), value(i)) {
            Ok(()) => acked.push(i),
            Err(Error::CacheFull { .. }) => {}
            Err(e) => panic!("insert {i}: unexpected {e}"),
        }
    }
    let expected: Vec<Kv> = acked.iter().map(|&i| (key(i), value(i))).collect();
    assert_eq!(all(&tree), expected);
    for &i in acked.iter().step_by(13) {
        assert_eq!(tree.get(key(i)).expect("get"), Some(value(i)));
    }
}

#[test]
fn reopening_with_another_page_size_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = Tree::open(Config::new(dir.path()).page_size(4096)).expect("open");
    for i in 0..500 {
        tree.insert(key(i), value(i)).expect("insert");
    }
    tree.close().expect("close");
    for size in [8192, 16384, 65536] {
        match Tree::open(Config::new(dir.path()).page_size(size)) {
            Err(Error::InvalidConfig { .. } | Error::Corruption { .. }) => {}
            other => panic!("page size {size}: expected an error, got {other:?}"),
        }
    }
    let tree = Tree::open(Config::new(dir.path()).page_size(4096)).expect("reopen");
    assert_eq!(all(&tree).len(), 500);
}

#[test]
fn reopening_without_a_page_size_keeps_the_trees_own() {
    for size in [4096, 8192, 16384] {
        let dir = tempfile::tempdir().expect("tempdir");
        let tree = Tree::open(Config::new(dir.path()).page_size(size)).expect("open");
        for i in 0..2000 {
            tree.insert(key(i), value(i)).expect("insert");
        }
        tree.close().expect("close");
        // The default page size differs from two of the three: the tree's own wins, and
        // with it the limits.
        let tree = Tree::open(Config::new(dir.path())).expect("reopen with the default");
        assert_eq!(tree.limits().max_key_len, size / 4, "page size {size}");
        assert_eq!(all(&tree).len(), 2000);
        for i in 2000..4000 {
            tree.insert(key(i), value(i)).expect("insert after reopen");
        }
        tree.close().expect("close");
        let tree = Tree::open(Config::new(dir.path()).page_size(size)).expect("reopen");
        let mut expected: Vec<Kv> = (0..4000).map(|i| (key(i), value(i))).collect();
        expected.sort();
        assert_eq!(all(&tree), expected, "page size {size}");
    }
}

/// A closed tree of `n` records in `dir` with a small cache (so later reads go to disk).
fn build_closed_tree(dir: &Path, n: usize) -> Config {
    let config = Config::new(dir).cache_size(256 << 10).promotion_percent(0);
    let tree = Tree::open(config.clone()).expect("open");
    for i in 0..n {
        tree.insert(key(i), value(i)).expect("insert");
    }
    tree.close().expect("close");
    config
}

/// Opens `config` and reads everything back, by scan and by key. Every answer must be the
/// right data or `Err(Corruption)`; returns how many `Corruption` errors were seen.
fn read_back_damaged(config: &Config, n: usize, what: &str) -> usize {
    let tree = match Tree::open(config.clone()) {
        Ok(t) => t,
        Err(Error::Corruption { .. }) => return 1,
        Err(e) => panic!("{what}: open failed with {e}, expected Corruption"),
    };
    let mut corrupt = 0;
    for rev in [false, true] {
        let mut expected_next: Box<dyn Iterator<Item = usize>> = if rev {
            Box::new((0..n).rev())
        } else {
            Box::new(0..n)
        };
        let it = if rev {
            Box::new(tree.iter().rev()) as Box<dyn Iterator<Item = _>>
        } else {
            Box::new(tree.iter())
        };
        for item in it {
            match item {
                Ok((k, v)) => {
                    // A damaged leaf may hide a whole run of keys, but never invent or
                    // alter one: what is returned is a correct record, in order.
                    let i = expected_next
                        .by_ref()
                        .find(|&i| key(i) == k)
                        .unwrap_or_else(|| panic!("{what}: scan returned unexpected {k:?}"));
                    assert_eq!(v, value(i), "{what}: wrong value for key {i}");
                }
                Err(Error::Corruption { .. }) => corrupt += 1,
                Err(e) => panic!("{what}: scan failed with {e}, expected Corruption"),
            }
        }
    }
    for i in 0..n {
        match tree.get(key(i)) {
            Ok(Some(v)) => assert_eq!(v, value(i), "{what}: wrong value for key {i}"),
            Ok(None) => panic!("{what}: key {i} silently lost"),
            Err(Error::Corruption { .. }) => corrupt += 1,
            Err(e) => panic!("{what}: get {i} failed with {e}, expected Corruption"),
        }
    }
    corrupt
}

#[test]
fn a_bit_flipped_data_page_is_corruption_never_wrong_data() {
    let n = 1500;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = build_closed_tree(dir.path(), n);
    let (data, ckpt) = (dir.path().join("data"), dir.path().join("checkpoint"));
    let pristine = std::fs::read(&data).expect("read data");
    let pristine_ckpt = std::fs::read(&ckpt).expect("read checkpoint");
    // The file grows ahead of the pages in use (preallocated, reading as zeros); pages past
    // the last one ever written hold nothing a flip could damage.
    let pages = pristine
        .chunks(4096)
        .rposition(|p| p.iter().any(|&b| b != 0))
        .map_or(0, |last| last + 1);
    assert!(pages > 5, "only {pages} pages");
    let mut detected = 0;
    for page in 0..pages {
        // Header, body and last byte of successive pages.
        let offset = [9, 2048 + page % 7, 4095][page % 3];
        let mut bytes = pristine.clone();
        bytes[page * 4096 + offset] ^= 1 << (page % 8);
        std::fs::write(&data, &bytes).expect("write data");
        std::fs::write(&ckpt, &pristine_ckpt).expect("write checkpoint");
        let what = format!("flip at page {page} byte {offset}");
        if read_back_damaged(&config, n, &what) > 0 {
            detected += 1;
        }
    }
    eprintln!("{detected} of {pages} flipped pages detected");
    // Every page holding a live leaf must be caught; a superblock slot has a twin, and a
    // few pages may be free.
    assert!(
        detected + 4 >= pages,
        "only {detected} of {pages} flips were detected"
    );
    std::fs::write(&data, &pristine).expect("restore");
    std::fs::write(&ckpt, &pristine_ckpt).expect("restore");
    assert_eq!(read_back_damaged(&config, n, "pristine"), 0);
}

#[test]
fn a_bit_flipped_or_truncated_checkpoint_is_corruption() {
    let n = 3000;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = build_closed_tree(dir.path(), n);
    let ckpt = dir.path().join("checkpoint");
    let pristine = std::fs::read(&ckpt).expect("read checkpoint");
    for at in (0..pristine.len()).step_by(3).chain([pristine.len() - 1]) {
        let mut bytes = pristine.clone();
        bytes[at] ^= 0x20;
        std::fs::write(&ckpt, &bytes).expect("write checkpoint");
        match Tree::open(config.clone()) {
            Err(Error::Corruption { .. }) => {}
            other => panic!("flip at byte {at}: expected Corruption, got {other:?}"),
        }
    }
    for len in [0, 10, pristine.len() / 2, pristine.len() - 1] {
        std::fs::write(&ckpt, &pristine[..len]).expect("write checkpoint");
        match Tree::open(config.clone()) {
            Err(Error::Corruption { .. }) => {}
            other => panic!("truncated to {len}: expected Corruption, got {other:?}"),
        }
    }
    std::fs::write(&ckpt, &pristine).expect("restore");
    assert_eq!(read_back_damaged(&config, n, "pristine"), 0);
}

#[test]
fn a_million_removed_keys_scan_without_deep_recursion() {
    const N: usize = 1_000_000;
    let dir = tempfile::tempdir().expect("tempdir");
    // 4 KiB pages: the most leaves for the records.
    let config = Config::new(dir.path()).page_size(4096).cache_size(8 << 20);
    let tree = Tree::open(config).expect("open");
    let k = |i: usize| (i as u64 * 2).to_be_bytes();
    for i in 0..N {
        tree.insert(k(i), [b'v'; 16]).expect("insert");
    }
    // On disk as full leaves; the removals below become tombstones over them, then empty
    // leaves as eviction merges the tombstones in.
    tree.checkpoint().expect("checkpoint");
    tree.insert(k(N), b"last").expect("insert");
    for i in 0..N {
        tree.remove(k(i)).expect("remove");
    }
    let before = tree.stats();
    // A small stack: a scan that recursed per empty leaf or per tombstone would overflow it.
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .stack_size(128 << 10)
            .spawn_scoped(s, || {
                let fwd: Vec<Kv> = tree.iter().collect::<Result<_, _>>().expect("iter");
                assert_eq!(fwd, vec![(k(N).to_vec(), b"last".to_vec())]);
                let back: Vec<Kv> = tree.iter().rev().collect::<Result<_, _>>().expect("rev");
                assert_eq!(back, fwd);
                let below: Vec<Kv> = tree
                    .range(..k(N).to_vec())
                    .collect::<Result<_, _>>()
                    .expect("range");
                assert!(below.is_empty());
                assert_eq!(tree.range(..k(N).to_vec()).rev().count(), 0);
            })
            .expect("spawn")
            .join()
            .expect("scan thread");
    });
    let s = tree.stats();
    let leaves_scanned = s.cache_hits + s.cache_misses - before.cache_hits - before.cache_misses;
    eprintln!("{leaves_scanned} leaves visited by 4 scans; {s:?}");
    assert!(
        leaves_scanned >= 4000,
        "the scans passed only {leaves_scanned} leaves: too few empty leaves to test anything"
    );
}
