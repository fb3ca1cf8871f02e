//! Tests of fuzzy checkpoints (`checkpoint.rs`): which dirty leaves they leave unwritten,
//! where replay starts and how it moves, and that a crash after one loses nothing and
//! replays no merge twice. The crash sweeps (`crash.rs`)
//! and the racing test (`checkpoint_crash_tests.rs`) run them too.

use super::crash_tests::add;
use super::tests::{self as checkpoint_tests, node_state, recovered_with};
use crate::pool::PageId;
use crate::store::FaultStore;
use crate::sync::{self, Arc};
use crate::tree::index::Seek;
use crate::tree::persist::crash;
use crate::wal::memfs::MemFs;
use crate::wal::Lsn;
use crate::{Config, Durability, Tree};

const KEYS: u32 = 3000;

fn key(i: u32) -> Vec<u8> {
    format!("k{i:06}").into_bytes()
}

/// `checkpoint_tests`' configuration (`Sync` writes, a cache that holds every leaf), with
/// counters added by `add`: merges are not idempotent, so a write replayed twice shows.
fn config() -> Config {
    checkpoint_tests::config().merge_operator(add)
}

/// Counters `0..KEYS` at 0, then a full checkpoint: every leaf is clean, and the next
/// checkpoint may be fuzzy.
fn counters_on(store: &Arc<FaultStore>, fs: &Arc<MemFs>, config: Config) -> Tree {
    let tree = crash::open_with(config, store.clone(), fs.clone())
        .expect("open")
        .without_background();
    for i in 0..KEYS {
        tree.insert(key(i), 0u64.to_le_bytes()).expect("insert");
    }
    tree.checkpoint().expect("checkpoint");
    tree
}

fn add_to_all(tree: &Tree, n: u64) {
    for i in 0..KEYS {
        tree.merge(key(i), n.to_le_bytes()).expect("merge");
    }
}

fn assert_counts(tree: &Tree, want: u64, what: &str) {
    for i in 0..KEYS {
        let v = tree.get(key(i)).expect("get").expect("present");
        assert_eq!(
            u64::from_le_bytes(v.try_into().expect("8 bytes")),
            want,
            "{what}: key {i}"
        );
    }
}

/// The LSN the next checkpoint takes (no writer runs meanwhile).
fn next_lsn(tree: &Tree) -> Lsn {
    tree.shared().journal().wal().expect("log").next_lsn()
}

/// Where replay starts, as the last checkpoint says.
fn replay_from(tree: &Tree) -> Lsn {
    tree.shared().journal().checkpoint_lsn()
}

/// Every leaf of the tree, each named by its first counter's key.
fn leaves(tree: &Tree) -> Vec<PageId> {
    let guard = sync::pin();
    let mut out: Vec<PageId> = (0..KEYS)
        .map(|i| {
            let k = crate::tree::keyspace::stored_key(&key(i));
            tree.shared().index().descend(&guard, Seek::Key(&k)).leaf()
        })
        .collect();
    out.dedup();
    out
}

fn is_dirty(tree: &Tree, pid: PageId) -> bool {
    node_state(tree, pid).0
}

fn recovered(store: &FaultStore, fs: &MemFs, config: Config) -> Tree {
    recovered_with(config, store, fs)
}

/// Adds `n` to keys `keys` round after round until the log grew by at least `bytes`.
fn log_rounds(tree: &Tree, keys: std::ops::Range<u32>, n: u64, bytes: u64) -> u64 {
    let start = next_lsn(tree);
    let mut rounds = 0;
    while next_lsn(tree) - start < bytes {
        for i in keys.clone() {
            tree.merge(key(i), n.to_le_bytes()).expect("merge");
        }
        rounds += 1;
    }
    rounds
}

/// The leaves holding keys `keys`.
fn leaves_of(tree: &Tree, keys: std::ops::Range<u32>) -> Vec<PageId> {
    let mut out: Vec<PageId> = leaves(tree)
        .into_iter()
        .filter(|&pid| {
            keys.clone().any(|i| {
                let guard = sync::pin();
                let k = crate::tree::keyspace::stored_key(&key(i));
                tree.shared().index().descend(&guard, Seek::Key(&k)).leaf() == pid
            })
        })
        .collect();
    out.dedup();
    out
}

/// Leaves dirtied after a checkpoint wrote them stay unwritten through the next, fuzzy, one,
/// which keeps the log from the earlier checkpoint's LSN; a crash then loses nothing and
/// counts no merge twice. Once that log outgrows `checkpoint_log_bytes`, the next fuzzy
/// checkpoint starts replay at a later checkpoint's LSN (within half the limit) and writes
/// the leaves that may lack writes from before it (dirty when that checkpoint looked), not
/// those it found clean.
#[test]
fn a_fuzzy_checkpoint_leaves_to_the_log_what_it_keeps() {
    let (store, fs) = crash::disks();
    let config = || config().checkpoint_log_bytes(1 << 20);
    let tree = counters_on(&store, &fs, config());
    let (half, all) = (0..KEYS / 2, leaves(&tree));
    let (first, second) = (
        leaves_of(&tree, half.clone()),
        leaves_of(&tree, KEYS / 2..KEYS),
    );
    let second: Vec<PageId> = second.into_iter().filter(|p| !first.contains(p)).collect();
    assert!(first.len() > 4 && second.len() > 4, "{first:?} {second:?}");
    let full_lsn = replay_from(&tree);

    // 600 KiB of log on the first half, then a fuzzy checkpoint: the log is within its
    // 1 MiB limit, so replay keeps its start and nothing is written.
    let rounds = log_rounds(&tree, half.clone(), 1, 600 << 10);
    assert!(first.iter().all(|&pid| is_dirty(&tree, pid)));
    let written = tree.stats().write_backs;
    let fuzzy_lsn = next_lsn(&tree);
    tree.shared().checkpoint_fuzzy().expect("fuzzy checkpoint");
    assert_eq!(tree.stats().write_backs, written, "a leaf was written");
    assert!(first.iter().all(|&pid| is_dirty(&tree, pid)));
    assert_eq!(replay_from(&tree), full_lsn, "replay starts where it must");
    assert!(full_lsn < fuzzy_lsn);
    let crashed = recovered(&store, &fs, config());
    for i in 0..KEYS {
        let want = if half.contains(&i) { rounds } else { 0 };
        let v = crashed.get(key(i)).expect("get").expect("present");
        assert_eq!(v, want.to_le_bytes(), "after a crash: key {i}");
    }
    drop(crashed);

    // 450 KiB more on the second half: the log since the full checkpoint is past its
    // limit, so replay moves to the oldest start within half of it, the fuzzy one's LSN.
    let more = log_rounds(&tree, KEYS / 2..KEYS, 1, 450 << 10);
    tree.shared()
        .checkpoint_fuzzy()
        .expect("second fuzzy checkpoint");
    assert_eq!(replay_from(&tree), fuzzy_lsn);
    // Dirty when the fuzzy checkpoint looked: written. Clean then: left dirty.
    assert!(first.iter().all(|&pid| !is_dirty(&tree, pid)));
    assert!(second.iter().all(|&pid| is_dirty(&tree, pid)));
    assert!(all.iter().all(|p| first.contains(p) || second.contains(p)));
    let crashed = recovered(&store, &fs, config());
    for i in 0..KEYS {
        let want = if half.contains(&i) { rounds } else { more };
        let v = crashed.get(key(i)).expect("get").expect("present");
        assert_eq!(v, want.to_le_bytes(), "after a second crash: key {i}");
    }
}

/// A fuzzy checkpoint that finds the log past `checkpoint_log_bytes` keeps no more than half
/// of that: with no earlier checkpoint that recent, it writes the dirty leaves (all of them,
/// in a tree of fewer than a round's) and replay starts at its own LSN.
/// Once that start is recent, dirty leaves written since it, by that checkpoint or by an
/// eviction, need no write.
#[test]
fn a_fuzzy_checkpoint_without_a_recent_start_writes_every_dirty_leaf() {
    let (store, fs) = crash::disks();
    let config = || config().checkpoint_log_bytes(1 << 20);
    let tree = counters_on(&store, &fs, config());
    let leaves = leaves(&tree);
    let rounds = log_rounds(&tree, 0..KEYS, 1, 1100 << 10);
    let lsn = next_lsn(&tree);
    tree.shared().checkpoint_fuzzy().expect("fuzzy checkpoint");
    assert_eq!(replay_from(&tree), lsn);
    assert!(leaves.iter().all(|&pid| !is_dirty(&tree, pid)));

    // Dirty again, some written back (evicted) and dirtied once more.
    add_to_all(&tree, 1);
    let written = tree.stats().write_backs;
    while tree.stats().write_backs == written {
        tree.shared().make_room().expect("evict");
    }
    let evicted = (tree.stats().write_backs - written) as usize;
    add_to_all(&tree, 1);
    let before = tree.stats().write_backs;
    // The log since `lsn` is short: replay keeps its start, and nothing needs writing.
    tree.shared().checkpoint_fuzzy().expect("fuzzy checkpoint");
    assert_eq!(tree.stats().write_backs, before);
    assert_eq!(replay_from(&tree), lsn);
    let dirty = leaves.iter().filter(|&&p| is_dirty(&tree, p)).count();
    assert_eq!(dirty, leaves.len(), "{evicted} evicted");
    let crashed = recovered(&store, &fs, config());
    assert_counts(&crashed, rounds + 2, "after a crash");
}

/// Pages written back while the log is replayed (a small cache evicts) carry the log's end
/// as their image LSN, though replay goes on to apply later records to their leaves: the
/// next checkpoint writes such a leaf rather than listing that page, and a crash after it
/// counts every merge once.
#[test]
fn a_leaf_written_back_during_replay_is_not_left_to_the_log() {
    let (store, fs) = crash::disks();
    let small = || config().cache_size(64 << 10);
    let tree = counters_on(&store, &fs, small());
    for _ in 0..3 {
        add_to_all(&tree, 1);
    }
    let (store, fs) = (Arc::new(store.crash_image()), Arc::new(fs.crash_image()));
    let reopened = crash::open_with(small(), store.clone(), fs.clone())
        .expect("reopen")
        .without_background();
    let stats = reopened.stats();
    assert!(stats.replayed > 0 && stats.write_backs > 0, "{stats:?}");
    reopened
        .shared()
        .checkpoint_fuzzy()
        .expect("fuzzy checkpoint");
    let crashed = recovered(&store, &fs, small());
    assert_counts(&crashed, 3, "after replay, a fuzzy checkpoint and a crash");
}

/// What cannot be fuzzy is not: a tree that does not log writes, one holding large values
/// (an extent only a dirty leaf references would be in no checkpoint's table), and
/// `checkpoint`.
#[test]
fn full_checkpoints_where_the_log_cannot_stand_in() {
    for what in ["no log", "explicit"] {
        let (store, fs) = crash::disks();
        let durability = match what {
            "no log" => Durability::None,
            _ => Durability::Sync,
        };
        let tree = counters_on(&store, &fs, config().durability(durability));
        add_to_all(&tree, 1);
        if what == "explicit" {
            tree.checkpoint().expect("checkpoint");
        } else {
            tree.shared().checkpoint_fuzzy().expect("checkpoint");
        }
        assert!(
            leaves(&tree).iter().all(|&pid| !is_dirty(&tree, pid)),
            "{what}: a dirty leaf was left"
        );
    }
    // Large values live in the blob file, which the crash disks do not have.
    let dir = tempfile::tempdir().expect("tempdir");
    let config = Config::new(dir.path())
        .durability(Durability::Sync)
        .evictor_threads(0)
        .idle_write_back(None)
        .merge_operator(add);
    let tree = Tree::open(config).expect("open").without_background();
    for i in 0..KEYS {
        tree.insert(key(i), 0u64.to_le_bytes()).expect("insert");
    }
    tree.insert(b"large", vec![7u8; 100 << 10])
        .expect("large value");
    tree.checkpoint().expect("checkpoint");
    add_to_all(&tree, 1);
    tree.shared().checkpoint_fuzzy().expect("checkpoint");
    assert!(
        leaves(&tree).iter().all(|&pid| !is_dirty(&tree, pid)),
        "large values: a dirty leaf was left"
    );
}

/// A full checkpoint of a tree that allows fuzzy ones writes its dirty leaves in rounds of
/// a share of them, each a checkpoint that frees the pages the round before superseded: the
/// data file grows by about a round's pages, not by a page per dirty leaf.
#[test]
fn a_full_checkpoint_goes_in_rounds_that_bound_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    // 4 KiB pages: 420k records make enough leaves for several rounds.
    let config = Config::new(dir.path())
        .page_size(4096)
        .cache_size(64 << 20)
        .durability(Durability::Buffered)
        .evictor_threads(0)
        .idle_write_back(None);
    let tree = Tree::open(config).expect("open").without_background();
    let n = 420_000u32;
    let put = |round: u8| {
        for i in 0..n {
            let k = (i.wrapping_mul(2_654_435_761)).to_be_bytes();
            tree.insert(k, [round; 16]).expect("insert");
        }
    };
    put(1);
    // Leaves without a page are written in the first round, whatever its share (and split
    // as they are written).
    tree.checkpoint().expect("checkpoint");
    let leaves = tree.shared().index().leaves().len();
    assert!(leaves > 3 * super::SUPERSEDED_LEAST, "{leaves} leaves");
    let data = || {
        std::fs::metadata(dir.path().join("data"))
            .expect("data")
            .len()
            / 4096
    };
    let before = data();
    put(2);
    let checkpoints = tree.stats().checkpoints;
    tree.checkpoint().expect("checkpoint");
    // Rounds of the least share: an eighth of the pages is less.
    let rounds = tree.stats().checkpoints - checkpoints;
    assert_eq!(rounds as usize, leaves.div_ceil(super::SUPERSEDED_LEAST));
    let grown = (data() - before) as usize;
    assert!(
        grown <= super::SUPERSEDED_LEAST + leaves / 8,
        "the file grew by {grown} pages for {leaves} leaves"
    );
    assert!(tree.shared().index().leaves().iter().all(|&(_, pid)| tree
        .shared()
        .pool()
        .read(pid)
        .mini()
        .is_none()
        || !is_dirty(&tree, pid)));
    let tree_dir = dir.path().to_path_buf();
    drop(tree);
    let tree = Tree::open(Config::new(&tree_dir)).expect("reopen");
    for i in (0..n).step_by(97) {
        let k = (i.wrapping_mul(2_654_435_761)).to_be_bytes();
        assert_eq!(tree.get(k).expect("get"), Some(vec![2u8; 16]));
    }
}

/// A tree of 420k counters at 0, checkpointed, then 1 added to each: every leaf is dirty
/// and the log is past the 4 MiB limit `moving_config` sets. Returns the tree, its key
/// function's count, and replay's start.
fn dirty_past_the_log_limit(dir: &std::path::Path) -> (Tree, u32, Lsn) {
    let tree = Tree::open(moving_config(dir))
        .expect("open")
        .without_background();
    let n = 420_000u32;
    for i in 0..n {
        tree.insert(spread(i), 0u64.to_le_bytes()).expect("insert");
    }
    tree.checkpoint().expect("checkpoint");
    let start = replay_from(&tree);
    for i in 0..n {
        tree.merge(spread(i), 1u64.to_le_bytes()).expect("merge");
    }
    tree.flush().expect("flush");
    assert!(
        next_lsn(&tree) - start > 4 << 20,
        "the log is past its limit"
    );
    (tree, n, start)
}

fn moving_config(dir: &std::path::Path) -> Config {
    // 4 KiB pages, as `data` counts them: 420k records make enough leaves for several rounds.
    Config::new(dir)
        .page_size(4096)
        .cache_size(64 << 20)
        .durability(Durability::Buffered)
        .checkpoint_log_bytes(4 << 20)
        .evictor_threads(0)
        .idle_write_back(None)
        .merge_operator(add)
}

/// Counter `i`'s key, spread over the key space.
fn spread(i: u32) -> [u8; 4] {
    (i.wrapping_mul(2_654_435_761)).to_be_bytes()
}

/// What a process crash of the tree in `dir` leaves, reopened.
fn crash_copy(dir: &std::path::Path) -> (tempfile::TempDir, Tree) {
    let copy = tempfile::tempdir().expect("tempdir");
    crash::copy_dir(dir, copy.path());
    let tree = Tree::open(moving_config(copy.path())).expect("reopen");
    (copy, tree)
}

/// Once the log outgrows its limit with no recent start to move to, fuzzy checkpoints move
/// replay's start to the first one's LSN in rounds: each writes a share of the leaves that
/// may lack older writes and keeps the old start until none is left, so the data file grows
/// by about a round's pages. A crash in the middle of the move loses nothing and replays no
/// merge twice.
#[test]
fn a_fuzzy_checkpoint_moves_the_start_in_rounds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = || {
        std::fs::metadata(dir.path().join("data"))
            .expect("data")
            .len()
            / 4096
    };
    let (tree, n, start) = dirty_past_the_log_limit(dir.path());
    let leaves = tree.shared().index().leaves().len();
    assert!(leaves > 2 * super::SUPERSEDED_LEAST, "{leaves} leaves");
    let (before, target) = (data(), next_lsn(&tree));
    let written = tree.stats().write_backs;
    let mut rounds = 0;
    while replay_from(&tree) == start {
        tree.shared().checkpoint_fuzzy().expect("fuzzy checkpoint");
        rounds += 1;
        assert!(rounds <= leaves, "the start never moved");
        if rounds == 1 {
            let (_copy, crashed) = crash_copy(dir.path());
            for i in (0..n).step_by(89) {
                let v = crashed.get(spread(i)).expect("get").expect("present");
                assert_eq!(v, 1u64.to_le_bytes(), "mid-move crash: key {i}");
            }
        }
    }
    assert_eq!(replay_from(&tree), target);
    assert_eq!(rounds, leaves.div_ceil(super::SUPERSEDED_LEAST));
    assert_eq!((tree.stats().write_backs - written) as usize, leaves);
    let grown = (data() - before) as usize;
    assert!(
        grown <= super::SUPERSEDED_LEAST + leaves / 8,
        "the file grew by {grown} pages for {leaves} leaves"
    );
}

/// The rounds of a move race a writer: leaves dirtied again while a round looks at them,
/// builds them or writes them stay covered, the move ends, and a crash after it loses no
/// acknowledged merge and counts none twice.
#[test]
fn a_move_of_the_start_races_a_writer_without_losing_a_merge() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().expect("tempdir");
    let (tree, n, start) = dirty_past_the_log_limit(dir.path());
    let stop = AtomicBool::new(false);
    let mut rounds = 0;
    let added = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut added = vec![0u64; n as usize];
            let mut i = 0u32;
            while !stop.load(Ordering::Acquire) {
                let k = i.wrapping_mul(7919) % n;
                tree.merge(spread(k), 1u64.to_le_bytes()).expect("merge");
                added[k as usize] += 1;
                i += 1;
            }
            added
        });
        while replay_from(&tree) == start {
            tree.shared().checkpoint_fuzzy().expect("fuzzy checkpoint");
            rounds += 1;
            assert!(rounds < 100, "the start never moved");
        }
        stop.store(true, Ordering::Release);
        writer.join().expect("writer")
    });
    assert!(rounds >= 2, "{rounds} rounds");
    assert!(added.iter().sum::<u64>() > 0);
    tree.flush().expect("flush");
    let (_copy, crashed) = crash_copy(dir.path());
    // One scan reads each leaf once; a lookup per key would read its leaf per key.
    let mut want: Vec<([u8; 4], u64)> =
        (0..n).map(|i| (spread(i), 1 + added[i as usize])).collect();
    want.sort_unstable();
    let got: Vec<([u8; 4], u64)> = crashed
        .iter()
        .map(|r| {
            let (k, v) = r.expect("scan");
            let k: [u8; 4] = k[..].try_into().expect("4-byte key");
            (k, u64::from_le_bytes(v[..].try_into().expect("8 bytes")))
        })
        .collect();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g, w, "after the move and a crash");
    }
}
