//! Snapshots and transactions: a snapshot is one moment of every keyspace; a transaction
//! reads its start plus its own writes and commits only if nothing it read (keys and whole
//! ranges) changed meanwhile, so committed transactions are serializable: write skew and
//! phantoms are refused, merges never conflict, a refused commit applies nothing. A
//! concurrent ledger keeps its total in every snapshot; a long-lived snapshot under a
//! write-heavy load stays within `max_snapshot_bytes`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bfkv::{Config, Durability, Error, Keyspace, Tree};

fn num(v: Option<Vec<u8>>) -> u64 {
    v.map_or(0, |b| {
        u64::from_le_bytes(b.try_into().expect("8-byte value"))
    })
}

#[allow(clippy::unnecessary_wraps)] // the merge operator's signature
fn add(_key: &[u8], old: Option<&[u8]>, operand: &[u8]) -> Option<Vec<u8>> {
    let n = |b: Option<&[u8]>| {
        b.and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes)
    };
    Some((n(old) + n(Some(operand))).to_le_bytes().to_vec())
}

/// Each configuration the scenarios run on: in memory, and file-backed with a cache small
/// enough that evictions, write-backs and checkpoints run under the snapshots.
fn trees() -> Vec<(&'static str, Tree, Option<tempfile::TempDir>)> {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = Tree::open(
        Config::new(dir.path())
            .cache_size(256 << 10)
            .durability(Durability::None)
            .merge_operator(add),
    )
    .expect("open");
    let memory = Tree::open(Config::in_memory().merge_operator(add)).expect("open");
    vec![("file", file, Some(dir)), ("memory", memory, None)]
}

#[test]
fn reads_see_the_start_plus_the_transactions_own_writes() {
    for (name, tree, _dir) in trees() {
        let ks = tree.keyspace("k").unwrap();
        ks.insert(b"a", 1u64.to_le_bytes()).unwrap();
        ks.insert(b"b", 2u64.to_le_bytes()).unwrap();
        ks.insert(b"c", 3u64.to_le_bytes()).unwrap();
        let mut tx = tree.transaction();
        tx.insert(&ks, b"a", 10u64.to_le_bytes());
        tx.remove(&ks, b"b");
        tx.merge(&ks, b"c", 5u64.to_le_bytes());
        tx.merge(&ks, b"d", 7u64.to_le_bytes());
        ks.insert(b"e", 9u64.to_le_bytes()).unwrap(); // after the start: not seen
        assert_eq!(num(tx.get(&ks, b"a").unwrap()), 10, "{name}");
        assert_eq!(tx.get(&ks, b"b").unwrap(), None, "{name}");
        assert_eq!(
            num(tx.get(&ks, b"c").unwrap()),
            8,
            "{name}: merge folded over 3"
        );
        assert_eq!(
            num(tx.get(&ks, b"d").unwrap()),
            7,
            "{name}: merge over nothing"
        );
        assert_eq!(tx.get(&ks, b"e").unwrap(), None, "{name}");
        let up: Vec<(Vec<u8>, u64)> = tx
            .iter(&ks)
            .map(|r| r.map(|(k, v)| (k, num(Some(v)))).unwrap())
            .collect();
        let want = vec![(b"a".to_vec(), 10), (b"c".to_vec(), 8), (b"d".to_vec(), 7)];
        assert_eq!(up, want, "{name}");
        let mut down: Vec<(Vec<u8>, u64)> = tx
            .iter(&ks)
            .rev()
            .map(|r| r.map(|(k, v)| (k, num(Some(v)))).unwrap())
            .collect();
        down.reverse();
        assert_eq!(down, want, "{name}: descending");
        // Both ends at once meet in the middle without a record twice.
        let mut both = tx.iter(&ks);
        let first = both.next().unwrap().unwrap().0;
        let last = both.next_back().unwrap().unwrap().0;
        let middle: Vec<_> = both.map(|r| r.unwrap().0).collect();
        assert_eq!(
            (first, middle, last),
            (b"a".to_vec(), vec![b"c".to_vec()], b"d".to_vec())
        );
        assert_eq!(
            ks.get(b"a").unwrap(),
            Some(1u64.to_le_bytes().to_vec()),
            "{name}: buffered"
        );
        // It read e as absent and scanned the keyspace; e was inserted since.
        let e = tx.commit().expect_err("the scan saw e absent");
        assert!(
            matches!(&e, Error::Conflict { key, .. } if key == b"e"),
            "{name}: {e:?}"
        );
        assert_eq!(num(ks.get(b"a").unwrap()), 1, "{name}: nothing applied");
        let mut tx = tree.transaction();
        tx.insert(&ks, b"a", 10u64.to_le_bytes());
        tx.remove(&ks, b"b");
        tx.merge(&ks, b"c", 5u64.to_le_bytes());
        tx.merge(&ks, b"d", 7u64.to_le_bytes());
        assert_eq!(tx.iter(&ks).count(), 4, "{name}");
        tx.commit().unwrap();
        assert_eq!(num(ks.get(b"a").unwrap()), 10, "{name}");
        assert_eq!(ks.get(b"b").unwrap(), None, "{name}");
        assert_eq!(num(ks.get(b"c").unwrap()), 8, "{name}");
        assert_eq!(num(ks.get(b"d").unwrap()), 7, "{name}");
        assert_eq!(num(ks.get(b"e").unwrap()), 9, "{name}");
    }
}

#[test]
fn write_skew_is_refused() {
    for (name, tree, _dir) in trees() {
        // Two doctors on call; each may go off call if the other stays on.
        let on_call = tree.keyspace("on_call").unwrap();
        on_call.insert(b"alice", b"1").unwrap();
        on_call.insert(b"bob", b"1").unwrap();
        let mut t1 = tree.transaction();
        let mut t2 = tree.transaction();
        for tx in [&mut t1, &mut t2] {
            let count = tx.iter(&on_call).map_while(Result::ok).count();
            assert_eq!(count, 2, "{name}");
        }
        t1.remove(&on_call, b"alice");
        t2.remove(&on_call, b"bob");
        t1.commit().unwrap();
        let e = t2.commit().expect_err("write skew");
        assert!(
            matches!(&e, Error::Conflict { keyspace, key } if keyspace == "on_call" && key == b"alice"),
            "{name}: {e:?}"
        );
        assert_eq!(
            on_call.get(b"bob").unwrap(),
            Some(b"1".to_vec()),
            "{name}: nothing applied"
        );
        assert!(tree.stats().conflicts >= 1 && tree.stats().transactions >= 1);
    }
}

#[test]
fn phantoms_conflict_and_blind_writes_do_not() {
    for (name, tree, _dir) in trees() {
        let orders = tree.keyspace("orders").unwrap();
        let stock = tree.keyspace("stock").unwrap();
        orders.insert(b"o/1", b"").unwrap();
        // A range read: an insert of a new key in it is a conflict (a phantom).
        let mut tx = tree.transaction();
        let n = tx
            .range(&orders, b"o/".as_slice()..b"o0".as_slice())
            .count();
        assert_eq!(n, 1);
        tx.insert(&stock, b"orders-seen", (n as u64).to_le_bytes());
        orders.insert(b"o/2", b"").unwrap();
        assert!(matches!(tx.commit(), Err(Error::Conflict { .. })), "{name}");
        assert_eq!(stock.get(b"orders-seen").unwrap(), None, "{name}");
        // A write outside the range read is no conflict.
        let mut tx = tree.transaction();
        let n = tx
            .range(&orders, b"o/".as_slice()..b"o0".as_slice())
            .count();
        tx.insert(&stock, b"orders-seen", (n as u64).to_le_bytes());
        orders.insert(b"p/1", b"").unwrap();
        tx.commit().unwrap();
        // Blind writes (no read) to one key: both commit, the later one wins.
        let (mut a, mut b) = (tree.transaction(), tree.transaction());
        a.insert(&stock, b"k", b"a");
        b.insert(&stock, b"k", b"b");
        a.commit().unwrap();
        b.commit().unwrap();
        assert_eq!(stock.get(b"k").unwrap(), Some(b"b".to_vec()), "{name}");
        // Merges are blind: two transactions merging into one key both commit...
        let (mut a, mut b) = (tree.transaction(), tree.transaction());
        a.merge(&stock, b"count", 1u64.to_le_bytes());
        b.merge(&stock, b"count", 2u64.to_le_bytes());
        b.commit().unwrap();
        a.commit().unwrap();
        assert_eq!(num(stock.get(b"count").unwrap()), 3, "{name}");
        // ...but one that read the key conflicts with a merge after its start.
        let mut reader = tree.transaction();
        let seen = num(reader.get(&stock, b"count").unwrap());
        reader.insert(&stock, b"count-copy", seen.to_le_bytes());
        stock.merge(b"count", 1u64.to_le_bytes()).unwrap();
        assert!(
            matches!(reader.commit(), Err(Error::Conflict { .. })),
            "{name}"
        );
        // A transaction that only reads commits whatever changed: it saw one moment.
        let mut ro = tree.transaction();
        let _ = ro.get(&stock, b"count").unwrap();
        stock.insert(b"count", b"x").unwrap();
        ro.commit().unwrap();
    }
}

#[test]
fn a_refused_commit_applies_nothing_and_a_dropped_transaction_neither() {
    for (name, tree, _dir) in trees() {
        let ks = tree.default_keyspace();
        tree.insert(b"x", b"0").unwrap();
        let mut tx = tree.transaction();
        let _ = tx.get(&ks, b"x").unwrap();
        for i in 0..200u32 {
            tx.insert(&ks, i.to_be_bytes(), b"v");
        }
        tree.insert(b"x", b"1").unwrap();
        assert!(tx.commit().is_err());
        assert_eq!(tree.iter().count(), 1, "{name}");
        let mut tx = tree.transaction();
        tx.insert(&ks, b"dropped", b"v");
        drop(tx);
        assert_eq!(tree.get(b"dropped").unwrap(), None, "{name}");
        // An invalid write fails the commit whole, as in a batch.
        let mut tx = tree.transaction();
        tx.insert(&ks, b"fine", b"v");
        tx.insert(&ks, vec![0u8; tree.limits().max_key_len + 1], b"v");
        assert!(
            matches!(tx.commit(), Err(Error::KeyTooLarge { .. })),
            "{name}"
        );
        assert_eq!(tree.get(b"fine").unwrap(), None, "{name}");
        // A keyspace of another tree is invalid input.
        let other = Tree::open(Config::in_memory()).unwrap();
        let mut tx = tree.transaction();
        assert!(matches!(
            tx.get(&other.default_keyspace(), b"k"),
            Err(Error::InvalidInput { .. })
        ));
        let snap = tree.snapshot();
        assert!(matches!(
            snap.iter(&other.default_keyspace()).next(),
            Some(Err(Error::InvalidInput { .. }))
        ));
        assert!(tree.stats().snapshots_open >= 1);
    }
}

#[test]
fn transact_retries_conflicts_and_returns_other_errors_at_once() {
    let tree = Arc::new(Tree::open(Config::in_memory()).unwrap());
    let ks = tree.default_keyspace();
    tree.insert(b"n", 0u64.to_le_bytes()).unwrap();
    // A transaction that loses its first run to an interfering write commits on a retry.
    let mut runs = 0;
    let got = tree
        .transact(|tx| {
            runs += 1;
            let n = num(tx.get(&ks, b"n")?);
            if runs == 1 {
                tree.insert(b"n", 100u64.to_le_bytes())?;
            }
            tx.insert(&ks, b"n", (n + 1).to_le_bytes());
            Ok(n)
        })
        .unwrap();
    assert_eq!((runs, got), (2, 100));
    assert_eq!(num(tree.get(b"n").unwrap()), 101);
    assert!(tree.stats().retries >= 1);
    // Any other error of the closure is returned as it is, nothing applied.
    let e = tree
        .transact(|tx| -> bfkv::Result<()> {
            tx.insert(&ks, b"m", b"1");
            Err(Error::InvalidInput {
                reason: "the caller's own",
            })
        })
        .unwrap_err();
    assert!(matches!(
        e,
        Error::InvalidInput {
            reason: "the caller's own"
        }
    ));
    assert_eq!(tree.get(b"m").unwrap(), None);
}

#[test]
fn a_snapshot_is_one_moment_through_evictions_write_backs_and_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let tree = Tree::open(
        Config::new(dir.path())
            .cache_size(256 << 10)
            .durability(Durability::Buffered),
    )
    .unwrap();
    let (a, b) = (tree.keyspace("a").unwrap(), tree.keyspace("b").unwrap());
    let key = |i: u32| i.to_be_bytes();
    for i in 0..20_000u32 {
        a.insert(key(i), [1u8; 24]).unwrap();
    }
    let snap = tree.snapshot();
    // Overwrite, remove and add around it, in batches and alone, in both keyspaces.
    for i in 0..20_000u32 {
        match i % 4 {
            0 => a.insert(key(i), [2u8; 24]).unwrap(),
            1 => a.remove(key(i)).unwrap(),
            2 => {
                let mut batch = tree.batch();
                batch.insert(&a, key(i), [3u8; 24]);
                batch.insert(&b, key(i), [3u8; 24]);
                batch.commit().unwrap();
            }
            _ => b.insert(key(i), [4u8; 24]).unwrap(),
        }
        if i % 5000 == 0 {
            tree.checkpoint().unwrap();
        }
    }
    assert!(tree.stats().evictions > 0 && tree.stats().write_backs > 0);
    for i in (0..20_000u32).step_by(97) {
        assert_eq!(snap.get(&a, key(i)).unwrap(), Some(vec![1u8; 24]), "a {i}");
        assert_eq!(snap.get(&b, key(i)).unwrap(), None, "b {i}");
    }
    let seen: Vec<_> = snap.iter(&a).map(|r| r.unwrap()).collect();
    assert_eq!(seen.len(), 20_000);
    assert!(seen.iter().all(|(_, v)| v == &[1u8; 24]));
    assert_eq!(snap.iter(&b).count(), 0);
    assert_eq!(snap.iter(&a).rev().count(), 20_000);
    let many = snap.get_many(&a, &[key(0), key(1), key(30_000)]);
    assert_eq!(many[1].as_ref().unwrap(), &Some(vec![1u8; 24]));
    assert_eq!(many[2].as_ref().unwrap(), &None);
    assert!(tree.stats().snapshot_bytes > 0);
    drop(snap);
    assert_eq!(tree.stats().snapshots_open, 0);
    assert_eq!(
        tree.stats().snapshot_bytes,
        0,
        "nothing a snapshot kept outlives it"
    );
}

/// Accounts, Zipf-free but skewed enough to collide: transfers between them (refusing
/// overdrafts) on four threads, while two threads sum every balance in snapshots and in
/// read-only transactions: every sum is the total.
fn ledger(tree: &Arc<Tree>, accounts: u32, transfers: u32) {
    const START: u64 = 1000;
    let ks = tree.keyspace("accounts").unwrap();
    let history = tree.keyspace("history").unwrap();
    for i in 0..accounts {
        ks.insert(i.to_be_bytes(), START.to_le_bytes()).unwrap();
    }
    let total = START * u64::from(accounts);
    let stop = Arc::new(AtomicBool::new(false));
    let audits = Arc::new(AtomicU64::new(0));
    let auditors: Vec<_> = (0..2)
        .map(|t| {
            let (tree, ks, stop, audits) = (tree.clone(), ks.clone(), stop.clone(), audits.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) || audits.load(Ordering::Relaxed) < 4 {
                    let sum: u64 = if t == 0 {
                        let snap = tree.snapshot();
                        snap.iter(&ks).map(|r| num(Some(r.unwrap().1))).sum()
                    } else {
                        tree.transact(|tx| Ok(tx.iter(&ks).map(|r| num(Some(r.unwrap().1))).sum()))
                            .unwrap()
                    };
                    assert_eq!(sum, total, "an audit saw money in flight");
                    audits.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let refused = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..4u32)
        .map(|t| {
            let (tree, ks, history, refused) =
                (tree.clone(), ks.clone(), history.clone(), refused.clone());
            std::thread::spawn(move || {
                let mut x = u64::from(t) * 7919 + 1;
                for n in 0..transfers {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Half the transfers touch the first 8 accounts: they collide.
                    let span = if x % 2 == 0 { 8 } else { accounts };
                    let from = (x >> 8) as u32 % span;
                    let to = (from + 1 + (x >> 32) as u32 % (span - 1)) % span;
                    let amount = 1 + x % 600;
                    let done = tree
                        .transact(|tx| {
                            let a = num(tx.get(&ks, from.to_be_bytes())?);
                            if a < amount {
                                return Ok(false);
                            }
                            let b = num(tx.get(&ks, to.to_be_bytes())?);
                            tx.insert(&ks, from.to_be_bytes(), (a - amount).to_le_bytes());
                            tx.insert(&ks, to.to_be_bytes(), (b + amount).to_le_bytes());
                            tx.insert(
                                &history,
                                [t.to_be_bytes(), n.to_be_bytes()].concat(),
                                amount.to_le_bytes(),
                            );
                            Ok(true)
                        })
                        .unwrap();
                    if !done {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for a in auditors {
        a.join().unwrap();
    }
    let sum: u64 = ks.iter().map(|r| num(Some(r.unwrap().1))).sum();
    assert_eq!(sum, total);
    let moved = 4 * u64::from(transfers) - refused.load(Ordering::Relaxed);
    assert_eq!(
        history.iter().count() as u64,
        moved,
        "every committed transfer is in the history"
    );
    assert!(
        ks.iter().all(|r| num(Some(r.unwrap().1)) <= total),
        "no overdraft"
    );
    assert!(tree.stats().conflicts > 0, "the hot accounts collided");
}

#[test]
fn a_concurrent_ledger_keeps_its_total_in_memory() {
    let tree = Arc::new(Tree::open(Config::in_memory()).unwrap());
    ledger(&tree, 200, 2000);
}

#[test]
fn a_concurrent_ledger_keeps_its_total_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let tree = Arc::new(
        Tree::open(
            Config::new(dir.path())
                .cache_size(512 << 10)
                .durability(Durability::Buffered),
        )
        .unwrap(),
    );
    ledger(&tree, 2000, 1500);
}

#[test]
fn a_long_lived_snapshot_is_bounded_by_max_snapshot_bytes() {
    const LIMIT: usize = 2 << 20;
    let dir = tempfile::tempdir().unwrap();
    let tree = Tree::open(
        Config::new(dir.path())
            .cache_size(4 << 20)
            .durability(Durability::None)
            .max_snapshot_bytes(LIMIT),
    )
    .unwrap();
    let ks: Keyspace = tree.default_keyspace();
    tree.insert(b"k", b"before").unwrap();
    let old = tree.snapshot();
    let mut tx = tree.transaction();
    let _ = tx.get(&ks, b"k").unwrap();
    tx.insert(&ks, b"other", b"v");
    let mut peak = 0;
    for i in 0..200_000u32 {
        tree.insert(i.to_be_bytes(), [7u8; 64]).unwrap();
        if i % 1000 == 0 {
            peak = peak.max(tree.stats().snapshot_bytes);
        }
    }
    assert!(
        peak <= LIMIT as u64 + (64 << 10),
        "kept {peak} bytes past the {LIMIT} limit"
    );
    assert!(matches!(
        old.get(&ks, b"k"),
        Err(Error::SnapshotTooOld { .. })
    ));
    assert!(matches!(
        old.iter(&ks).next(),
        Some(Err(Error::SnapshotTooOld { .. }))
    ));
    assert!(
        matches!(tx.commit(), Err(Error::Conflict { .. })),
        "too old to commit"
    );
    assert!(tree.stats().snapshots_too_old >= 2);
    // Writers went on; a new snapshot reads at its moment.
    let fresh = tree.snapshot();
    tree.insert(b"k", b"after").unwrap();
    assert_eq!(fresh.get(&ks, b"k").unwrap(), Some(b"before".to_vec()));
    drop((old, fresh));
    assert_eq!(tree.stats().snapshot_bytes, 0);
}
