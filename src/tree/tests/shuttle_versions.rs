//! Model-checked interleavings of transactions and snapshots (shuttle): transfers between
//! two accounts committed as transactions race a blind writer of the same leaf, a plain
//! incrementer using compare-and-swap, and a snapshot reader. Every snapshot sums to the
//! total, no increment is lost, and a transaction that read a balance changed before its
//! commit took its number never commits.

use crate::sync::{thread, Arc};
use crate::{Config, Error, Tree};

fn num(v: Option<Vec<u8>>) -> u64 {
    v.map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// One transfer of 1 from `from` to `to` as a transaction, tried until it commits (at most
/// a few times: shuttle explores schedules, not endurance).
fn transfer(tree: &Tree, from: &[u8], to: &[u8]) {
    let ks = tree.default_keyspace();
    for _ in 0..8 {
        let mut tx = tree.transaction();
        let a = num(tx.get(&ks, from).expect("get"));
        let b = num(tx.get(&ks, to).expect("get"));
        tx.insert(&ks, from, (a - 1).to_le_bytes());
        tx.insert(&ks, to, (b + 1).to_le_bytes());
        match tx.commit() {
            Ok(()) => return,
            Err(Error::Conflict { .. }) => thread::yield_now(),
            Err(e) => panic!("commit: {e}"),
        }
    }
    panic!("a transfer conflicted eight times in a row");
}

fn transfers_race_writers_and_snapshots() {
    let tree = Arc::new(Tree::open(Config::in_memory().cache_size(1 << 20)).expect("open"));
    tree.insert(b"a", 10u64.to_le_bytes()).expect("insert");
    tree.insert(b"b", 10u64.to_le_bytes()).expect("insert");
    tree.insert(b"n", 0u64.to_le_bytes()).expect("insert");
    let t1 = {
        let tree = tree.clone();
        thread::spawn(move || transfer(&tree, b"a", b"b"))
    };
    let t2 = {
        let tree = tree.clone();
        thread::spawn(move || transfer(&tree, b"b", b"a"))
    };
    // A plain read-modify-write of another key of the same leaf, by compare-and-swap.
    let cas = {
        let tree = tree.clone();
        thread::spawn(move || loop {
            let n = tree.get(b"n").expect("get");
            let next = (num(n.clone()) + 1).to_le_bytes();
            if tree
                .compare_and_swap(b"n", n.as_deref(), Some(next.as_slice()))
                .expect("cas")
            {
                break;
            }
        })
    };
    // A blind writer and a transaction incrementing the same counter.
    let blind = {
        let tree = tree.clone();
        thread::spawn(move || {
            tree.insert(b"c", b"x").expect("insert");
            let ks = tree.default_keyspace();
            loop {
                let mut tx = tree.transaction();
                let n = num(tx.get(&ks, b"n").expect("get"));
                tx.insert(&ks, b"n", (n + 1).to_le_bytes());
                if tx.commit().is_ok() {
                    break;
                }
            }
        })
    };
    let reader = {
        let tree = tree.clone();
        thread::spawn(move || {
            let snap = tree.snapshot();
            let ks = tree.default_keyspace();
            let a = num(snap.get(&ks, b"a").expect("get"));
            let b = num(snap.get(&ks, b"b").expect("get"));
            assert_eq!(a + b, 20, "a snapshot saw a transfer half done");
            let sum: u64 = snap
                .iter(&ks)
                .filter(|r| matches!(r, Ok((k, _)) if k == b"a" || k == b"b"))
                .map(|r| num(Some(r.expect("scan").1)))
                .sum();
            assert_eq!(sum, 20, "a snapshot scan saw a transfer half done");
        })
    };
    for t in [t1, t2, cas, blind, reader] {
        t.join().expect("thread");
    }
    assert_eq!(num(tree.get(b"a").expect("get")), 10);
    assert_eq!(num(tree.get(b"b").expect("get")), 10);
    assert_eq!(
        num(tree.get(b"n").expect("get")),
        2,
        "an increment was lost"
    );
    assert_eq!(tree.stats().snapshot_bytes, 0);
}

#[test]
fn shuttle_transfers_race_writers_and_snapshots() {
    shuttle::check_random(transfers_race_writers_and_snapshots, 500);
    shuttle::check_pct(transfers_race_writers_and_snapshots, 500, 3);
}
