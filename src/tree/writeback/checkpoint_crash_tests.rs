//! Tests of `checkpoint.rs` with crashes: checkpoints, fuzzy and full, racing writers that
//! split, evict and remove leaves, cut by power losses; a failed data-file sync; merges a
//! checkpoint's pages already hold, never replayed twice.

use std::collections::BTreeMap;
use std::time::Duration;

use super::tests::{config, key, recovered, recovered_with, tree_on};
use crate::sync::Arc;
use crate::tree::persist::crash;
use crate::Tree;

/// A small xorshift generator: the racing test's operations repeat from run to run (their
/// interleaving does not).
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// One writer's operations in the racing test: `(key, Some(value))` inserts, `(key, None)`
/// removes. The keys end in `-t`, so writers own disjoint keys that interleave in key order.
fn writer_ops(t: u64, ops: u64) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    let mut rng = 0x9e37_79b9 + t;
    (0..ops)
        .map(|op| {
            let r = next(&mut rng);
            // The second half also removes numbers 1000-1599 one by one: every writer does,
            // so the leaves holding them empty out.
            let sweep = op >= ops / 2 && op % 2 == 0;
            let number = if sweep {
                1_000 + (op - ops / 2) / 2 % 600
            } else {
                r % 3_000
            };
            let key = format!("k{number:05}-{t}").into_bytes();
            if sweep || r >> 61 == 0 {
                (key, None)
            } else {
                let len = 8 + (r >> 32) as usize % 300;
                (key, Some(vec![(r >> 8) as u8; len]))
            }
        })
        .collect()
}

/// The records after the first `n` of `ops`.
fn replay(
    ops: &[(Vec<u8>, Option<Vec<u8>>)],
    n: usize,
) -> std::collections::BTreeMap<Vec<u8>, Vec<u8>> {
    let mut model = std::collections::BTreeMap::new();
    for (k, v) in &ops[..n] {
        match v {
            Some(v) => model.insert(k.clone(), v.clone()),
            None => model.remove(k),
        };
    }
    model
}

/// Checkpoints run back to back while three writers insert, update and remove their own
/// keys (interleaved in key order, so the writers share leaves) in a cache small enough that
/// leaves are evicted, split and, once every writer has removed a range, emptied and removed
/// while a checkpoint has them staged. Power is cut at a point of the log's file calls (or
/// not at all); the crash image must hold each writer's acknowledged writes (and perhaps
/// the one in flight), and with no cut so must the tree reopened after a close.
#[test]
fn checkpoints_racing_writes_splits_evictions_and_removals_lose_nothing() {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, Ordering};

    const WRITERS: u64 = 3;
    const OPS: u64 = 3_000;
    let ops: Vec<_> = (0..WRITERS).map(|t| writer_ops(t, OPS)).collect();
    // Cuts at fractions of the log calls the uncut run made (group commit makes that vary
    // from run to run, so a late cut may not come; the checks hold either way).
    let mut calls = 0;
    for cut in [None, Some(15), Some(30), Some(45), Some(60)] {
        let cut = cut.map(|percent| calls * percent / 100);
        let what = format!("power cut at log call {cut:?}");
        let (store, fs) = crash::disks();
        let config = config().cache_size(256 << 10);
        let tree = crash::open_with(config, store.clone(), fs.clone()).expect("open");
        // Writes stay in flight long enough for writers to change the leaves a checkpoint
        // has staged.
        store.slow_writes(Duration::from_micros(200));
        if let Some(n) = cut {
            fs.power_cut_at(n, false);
        }
        let stop = AtomicBool::new(false);
        let (acked, checkpoints) = std::thread::scope(|s| {
            let checkpointer = s.spawn(|| {
                let mut n = 0u32;
                // Alternately fuzzy and full.
                let checkpoint = |n: u32| match n % 2 {
                    0 => tree.shared().checkpoint_fuzzy(),
                    _ => tree.checkpoint(),
                };
                while !stop.load(Ordering::Acquire) && checkpoint(n).is_ok() {
                    n += 1;
                }
                n
            });
            let writers: Vec<_> = ops
                .iter()
                .map(|ops| {
                    let tree = &tree;
                    s.spawn(move || {
                        for (i, (k, v)) in ops.iter().enumerate() {
                            let done = match v {
                                Some(v) => tree.insert(k, v),
                                None => tree.remove(k),
                            };
                            if done.is_err() {
                                return i;
                            }
                        }
                        ops.len()
                    })
                })
                .collect();
            let acked: Vec<usize> = writers
                .into_iter()
                .map(|w| w.join().expect("writer"))
                .collect();
            stop.store(true, Ordering::Release);
            (acked, checkpoints_joined(checkpointer))
        });
        // How many checkpoints fit before a cut depends on how the threads were scheduled:
        // on a loaded 2-core machine a cut at 15 % of the log calls has caught a single one
        // (6-11 when the machine is idle). The uncut run must show them racing.
        let least = if cut.is_none() { 3 } else { 1 };
        assert!(
            checkpoints >= least,
            "{what}: only {checkpoints} checkpoints ran"
        );
        if cut.is_none() {
            // The writers empty whole ranges late in the run; on a loaded machine the racing
            // checkpoints may all have ended before a write-back met an emptied leaf. One
            // more checkpoint writes back what is left, so the removals happen in every run.
            tree.checkpoint().expect("checkpoint after the writers");
            let stats = tree.stats();
            assert!(stats.splits > 0 && stats.leaves_removed > 0, "{stats:?}");
            calls = fs.ops();
        }

        let check = |t: &Tree, whence: &str| {
            if let Err(e) = t.shared().check_structure() {
                panic!("{what}, {whence}: structure: {e}");
            }
            let got: BTreeMap<Vec<u8>, Vec<u8>> = t
                .iter()
                .collect::<crate::Result<_>>()
                .unwrap_or_else(|e| panic!("{what}, {whence}: scan: {e}"));
            for (w, ops) in ops.iter().enumerate() {
                let suffix = format!("-{w}").into_bytes();
                let mine: BTreeMap<_, _> = got
                    .iter()
                    .filter(|(k, _)| k.ends_with(&suffix))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                let n = acked[w];
                assert!(
                    mine == replay(ops, n) || mine == replay(ops, (n + 1).min(ops.len())),
                    "{what}, {whence}: writer {w} acknowledged {n} operations"
                );
            }
        };
        check(&recovered(&store, &fs), "crash image");
        if cut.is_none() {
            drop(tree);
            check(&tree_on(&store, &fs), "reopened");
        }
    }
}

/// The checkpointer's count of finished checkpoints.
fn checkpoints_joined(h: std::thread::ScopedJoinHandle<'_, u32>) -> u32 {
    h.join().expect("checkpointer")
}

/// fsyncgate: after a failed data-file sync no checkpoint may succeed (the pages it was to
/// make durable may be gone), so the log is never trimmed past them; reopening recovers
/// every acknowledged write from the checkpoint before and the log.
#[test]
fn a_failed_data_sync_fails_every_later_checkpoint_and_loses_nothing() {
    let (store, fs) = crash::disks();
    let config = config().cache_size(128 << 10);
    let tree = crash::open_with(config.clone(), store.clone(), fs.clone()).expect("open");
    let mut model = BTreeMap::new();
    for i in 0..3000u32 {
        let (k, v) = (i.to_be_bytes().to_vec(), vec![(i % 251) as u8; 40]);
        tree.insert(&k, &v).expect("insert");
        model.insert(k, v);
    }
    tree.checkpoint().expect("checkpoint");
    for i in 3000..6000u32 {
        let (k, v) = (i.to_be_bytes().to_vec(), vec![(i % 251) as u8; 40]);
        tree.insert(&k, &v).expect("insert");
        model.insert(k, v);
    }
    store.fail_nth_sync(1);
    assert!(
        tree.checkpoint().is_err(),
        "the failing checkpoint succeeded"
    );
    for _ in 0..3 {
        assert!(
            tree.checkpoint().is_err(),
            "a checkpoint after the failed sync succeeded"
        );
    }
    assert!(tree.close().is_err(), "close claimed a durable checkpoint");
    let tree = crash::open_with(
        config,
        Arc::new(store.crash_image()),
        Arc::new(fs.crash_image()),
    )
    .expect("reopen");
    let got: BTreeMap<Vec<u8>, Vec<u8>> = tree.iter().collect::<crate::Result<_>>().expect("scan");
    assert!(
        got == model,
        "recovered {} of {} keys",
        got.len(),
        model.len()
    );
}

/// The u64 add merge operator.
pub(super) fn add(_key: &[u8], old: Option<&[u8]>, operand: &[u8]) -> Option<Vec<u8>> {
    let n = |b: Option<&[u8]>| {
        b.and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes)
    };
    (!operand.is_empty()).then(|| (n(old) + n(Some(operand))).to_le_bytes().to_vec())
}

fn counts(tree: &Tree, n: u32) -> Vec<u64> {
    (0..n)
        .map(|i| {
            let v = tree.get(key(i)).expect("get").expect("present");
            u64::from_le_bytes(v.try_into().expect("8 bytes"))
        })
        .collect()
}

/// Merges logged after a checkpoint's LSN but folded into the pages it references (here by
/// evictions between its passes) are replayed exactly once after a crash: replay skips a
/// leaf's records below the LSN its page image was built at. Without that every counter
/// recovers with the second round counted twice.
#[test]
fn merges_a_checkpoint_already_holds_are_not_replayed_again() {
    let (store, fs) = crash::disks();
    let config = || config().merge_operator(add);
    let tree = crash::open_with(config(), store.clone(), fs.clone()).expect("open");
    let n = 600;
    for i in 0..n {
        tree.insert(key(i), 0u64.to_le_bytes()).expect("insert");
    }
    tree.checkpoint().expect("checkpoint");
    for i in 0..n {
        tree.merge(key(i), 1u64.to_le_bytes()).expect("merge");
    }
    tree.shared()
        .checkpoint_between(|| {
            for i in 0..n {
                tree.merge(key(i), 10u64.to_le_bytes()).expect("merge");
            }
            for _ in 0..10_000 {
                if tree.shared().pool().stats().bytes_in_use == 0 {
                    return;
                }
                tree.shared().make_room().expect("evict");
            }
            panic!("the buffer never emptied");
        })
        .expect("checkpoint");
    assert_eq!(counts(&tree, n), vec![11; n as usize]);
    let recovered_tree = recovered_with(config(), &store, &fs);
    assert_eq!(
        counts(&recovered_tree, n),
        vec![11; n as usize],
        "after a crash"
    );
    drop(recovered_tree);
    // And merges past the checkpoint, only in the log, are replayed.
    for i in 0..n {
        tree.merge(key(i), 100u64.to_le_bytes()).expect("merge");
    }
    let recovered_tree = recovered_with(config(), &store, &fs);
    assert_eq!(
        counts(&recovered_tree, n),
        vec![111; n as usize],
        "after a second crash"
    );
}
