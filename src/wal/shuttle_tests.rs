//! Model-checked interleavings (shuttle) of group commit: concurrent appends and commits
//! under `Sync` (leader election, parked waiters, wake-ups) and under `Buffered` with the
//! background flusher and a staging ring small enough to fill, on real files. A lost wake-up shows as a shuttle deadlock; a commit
//! that returns before its record is written or synced fails the checks.

use std::time::Duration;

use super::{LogOp, Lsn, Wal, WalConfig};
use crate::sync::{thread, Arc};
use crate::Durability;

/// Records each thread appends and commits.
const PER_THREAD: u8 = 3;

/// Three writers append and commit; then every committed record must be in the log, in LSN
/// order, and (`Sync`) every commit must have found its record synced.
fn scenario(durability: Durability) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = WalConfig {
        // Small segments: a few switches happen inside the explored interleavings.
        segment_size: 4096,
        durability,
        flush_interval: Duration::from_millis(1),
        // One page: `Buffered` writers fill it and write it out themselves too.
        ring_capacity: crate::sys::page_size() as u64,
    };
    let wal = Arc::new(Wal::open(dir.path(), config.clone()).expect("open"));
    let handles: Vec<_> = (0..3u8)
        .map(|t| {
            let wal = wal.clone();
            thread::spawn(move || {
                let mut mine = Vec::new();
                for i in 0..PER_THREAD {
                    let value = vec![t; 700 + usize::from(i)];
                    let op = if i == 1 {
                        LogOp::Remove { key: &[t, i] }
                    } else {
                        LogOp::Insert {
                            key: &[t, i],
                            value: &value,
                        }
                    };
                    let appended = wal.append(op).expect("append");
                    wal.commit(appended).expect("commit");
                    let lsn = appended.lsn;
                    assert!(
                        wal.durable_lsn() > lsn,
                        "commit returned before its record was durable"
                    );
                    mine.push((lsn, t, i));
                }
                mine
            })
        })
        .collect();
    let mut committed: Vec<(Lsn, u8, u8)> = Vec::new();
    for h in handles {
        committed.extend(h.join().expect("writer"));
    }
    committed.sort_unstable();
    wal.flush().expect("flush");
    assert_eq!(wal.bytes_since(0), wal.next_lsn());
    let mut replayed = Vec::new();
    wal.replay(0, |lsn, op| {
        let key = match op {
            LogOp::Insert { key, .. } | LogOp::Remove { key } | LogOp::Merge { key, .. } => key,
            LogOp::Batch { .. } => panic!("this test writes no batch"),
        };
        replayed.push((lsn, key[0], key[1]));
        Ok(())
    })
    .expect("replay");
    assert_eq!(replayed, committed);
    let last = committed.last().map_or(0, |c| c.0);
    wal.release_before(last).expect("release");
    assert!(wal.stats().segments >= 1);
}

#[test]
fn shuttle_group_commit_sync() {
    shuttle::check_random(|| scenario(Durability::Sync), 200);
}

#[test]
fn shuttle_group_commit_sync_pct() {
    shuttle::check_pct(|| scenario(Durability::Sync), 200, 3);
}

#[test]
fn shuttle_commit_buffered_with_flusher() {
    shuttle::check_random(|| scenario(Durability::Buffered), 200);
}
