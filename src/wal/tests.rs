//! Log tests on real files: round trips across segments, reopen, release, the background
//! flusher and group commit (torn tails and damage: `tests_tail.rs`).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::format::{self, HEADER_SIZE};
use super::segment::list_segments;
use super::{LogOp, Lsn, Wal, WalConfig};
use crate::{Durability, Error};

/// An owned record as the tests write and read them: key, `Some(value)` for an insert.
pub(super) type Rec = (Vec<u8>, Option<Vec<u8>>);

pub(super) fn config(segment_size: u64, durability: Durability) -> WalConfig {
    WalConfig {
        segment_size,
        durability,
        flush_interval: Duration::from_millis(5),
        // Small, so that tests go round it often and fill it.
        ring_capacity: 64 << 10,
    }
}

pub(super) fn random_records(seed: u64, n: usize, max_value: usize) -> Vec<Rec> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let key = format!("key-{i:06}-{}", rng.gen::<u16>()).into_bytes();
            let value = if rng.gen_range(0..5) == 0 {
                None
            } else {
                let len = rng.gen_range(0..=max_value);
                Some((0..len).map(|_| rng.gen::<u8>()).collect())
            };
            (key, value)
        })
        .collect()
}

pub(super) fn op(r: &Rec) -> LogOp<'_> {
    match &r.1 {
        Some(v) => LogOp::Insert {
            key: &r.0,
            value: v,
        },
        None => LogOp::Remove { key: &r.0 },
    }
}

/// Appends and commits each record; returns their LSNs.
pub(super) fn write_all(wal: &Wal, recs: &[Rec]) -> Vec<Lsn> {
    recs.iter()
        .map(|r| {
            let appended = wal.append(op(r)).expect("append");
            wal.commit(appended).expect("commit");
            let lsn = appended.lsn;
            assert!(
                wal.durable_lsn() > lsn,
                "commit returned before {lsn} was durable"
            );
            lsn
        })
        .collect()
}

pub(super) fn replay_all(wal: &Wal, from: Lsn) -> Vec<(Lsn, Rec)> {
    let mut out = Vec::new();
    wal.replay(from, |lsn, op| {
        out.push(match op {
            LogOp::Insert { key, value } => (lsn, (key.to_vec(), Some(value.to_vec()))),
            LogOp::Remove { key } => (lsn, (key.to_vec(), None)),
            LogOp::Batch { .. } | LogOp::Merge { .. } => {
                panic!("these tests write no batch or merge")
            }
        });
        Ok(())
    })
    .expect("replay");
    out
}

pub(super) fn expect_replay(wal: &Wal, from: Lsn, lsns: &[Lsn], recs: &[Rec]) {
    let got = replay_all(wal, from);
    let want: Vec<(Lsn, Rec)> = lsns.iter().copied().zip(recs.iter().cloned()).collect();
    assert_eq!(got.len(), want.len(), "record count");
    assert!(got == want, "replayed records differ from the written ones");
}

pub(super) fn segment_paths(dir: &Path) -> Vec<PathBuf> {
    list_segments(&super::vfs::StdFs, dir)
        .expect("list")
        .into_iter()
        .map(|s| s.path)
        .collect()
}

#[test]
fn round_trip_across_segments() {
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = random_records(1, 3000, 300);
    let (lsns, end) = {
        let wal = Wal::open(dir.path(), config(8192, Durability::Buffered)).expect("open");
        let lsns = write_all(&wal, &recs);
        assert!(lsns.windows(2).all(|w| w[0] < w[1]), "LSNs grow");
        // Everything appended since open is readable before reopening, too.
        expect_replay(&wal, 0, &lsns, &recs);
        let st = wal.stats();
        assert_eq!(st.appends, 3000);
        assert_eq!(st.bytes, wal.next_lsn());
        assert!(st.segments > 50, "small segments: {} of them", st.segments);
        (lsns, wal.next_lsn())
    };
    let wal = Wal::open(dir.path(), config(8192, Durability::Sync)).expect("reopen");
    assert_eq!(wal.next_lsn(), end);
    expect_replay(&wal, 0, &lsns, &recs);
    // Replay from the middle starts at that record, wherever its segment is.
    expect_replay(&wal, lsns[1234], &lsns[1234..], &recs[1234..]);
    // An LSN between two records starts at the next one.
    expect_replay(&wal, lsns[1234] + 1, &lsns[1235..], &recs[1235..]);
}

#[test]
fn reopen_continues_after_the_last_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = random_records(2, 600, 100);
    let mut lsns = Vec::new();
    for (round, chunk) in recs.chunks(200).enumerate() {
        let durability = [Durability::Sync, Durability::Buffered][round % 2];
        let wal = Wal::open(dir.path(), config(16384, durability)).expect("open");
        assert_eq!(
            wal.next_lsn(),
            lsns.last()
                .map_or(0, |&l| l + format::record_len(&op(&recs[lsns.len() - 1])))
        );
        lsns.extend(write_all(&wal, chunk));
    }
    let wal = Wal::open(dir.path(), config(16384, Durability::Sync)).expect("open");
    expect_replay(&wal, 0, &lsns, &recs);
}

#[test]
fn release_before_deletes_old_segments() {
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = random_records(7, 1000, 100);
    let wal = Wal::open(dir.path(), config(4096, Durability::Sync)).expect("open");
    let lsns = write_all(&wal, &recs);
    let before = segment_paths(dir.path()).len();
    assert!(before > 10);
    let ckpt = lsns[700];
    assert_eq!(wal.bytes_since(ckpt), wal.next_lsn() - ckpt);
    wal.release_before(ckpt).expect("release");
    let after = list_segments(&super::vfs::StdFs, dir.path()).expect("list");
    assert!(after.len() < before / 2, "{before} -> {}", after.len());
    assert!(
        after[0].first_lsn <= ckpt,
        "the segment holding the checkpoint LSN stays"
    );
    assert!(after.len() == 1 || after[1].first_lsn > ckpt);
    assert_eq!(wal.stats().segments, after.len() as u64);
    expect_replay(&wal, ckpt, &lsns[700..], &recs[700..]);
    assert!(matches!(
        wal.replay(0, |_, _| Ok(())),
        Err(Error::Corruption { .. })
    ));
    // Releasing everything keeps the active segment; the log continues.
    wal.release_before(wal.next_lsn()).expect("release all");
    assert_eq!(
        list_segments(&super::vfs::StdFs, dir.path())
            .expect("list")
            .len(),
        1
    );
    let more = random_records(8, 10, 10);
    let more_lsns = write_all(&wal, &more);
    drop(wal);
    let wal = Wal::open(dir.path(), config(4096, Durability::Sync)).expect("reopen");
    expect_replay(&wal, more_lsns[0], &more_lsns, &more);
}

#[test]
fn replay_past_the_end_restarts_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = random_records(9, 50, 10);
    let wal = Wal::open(dir.path(), config(4096, Durability::Sync)).expect("open");
    write_all(&wal, &recs);
    drop(wal);
    let wal = Wal::open(dir.path(), config(4096, Durability::Sync)).expect("open");
    let stats = wal
        .replay(1 << 30, |_, _| panic!("nothing to apply"))
        .expect("replay");
    assert_eq!(stats.applied, 0);
    assert_eq!(wal.next_lsn(), 1 << 30);
    let lsns = write_all(&wal, &recs[..3]);
    assert_eq!(lsns[0], 1 << 30);
    drop(wal);
    let wal = Wal::open(dir.path(), config(4096, Durability::Sync)).expect("reopen");
    expect_replay(&wal, 1 << 30, &lsns, &recs[..3]);
}

#[test]
fn wal_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Wal>();
}

#[test]
fn bad_config_and_oversized_records_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    for c in [
        config(100, Durability::Sync),
        config((1 << 32) + 1, Durability::Sync),
        config(4096, Durability::None),
        WalConfig {
            flush_interval: Duration::ZERO,
            ..config(4096, Durability::Buffered)
        },
    ] {
        assert!(matches!(
            Wal::open(dir.path(), c),
            Err(Error::InvalidConfig { .. })
        ));
    }
    let wal = Wal::open(dir.path(), config(4096, Durability::Sync)).expect("open");
    let big = vec![1u8; 5000];
    assert!(matches!(
        wal.append(LogOp::Insert {
            key: b"k",
            value: &big
        }),
        Err(Error::ValueTooLarge { len: 5000, .. })
    ));
    assert!(matches!(
        wal.append(LogOp::Remove { key: &big }),
        Err(Error::KeyTooLarge { len: 5000, .. })
    ));
    // The limits an error names are exact: one byte more is refused, the limit itself fits.
    let room = 4096 - HEADER_SIZE;
    let limit = format::max_value_len(room, 1).expect("a one-byte key fits") as usize;
    assert!(matches!(
        wal.append(LogOp::Insert {
            key: b"k",
            value: &vec![2u8; limit + 1]
        }),
        Err(Error::ValueTooLarge { len, limit: l }) if len == limit + 1 && l == limit
    ));
    let key_limit = format::max_key_len(room) as usize;
    assert!(matches!(
        wal.append(LogOp::Remove { key: &vec![1u8; key_limit + 1] }),
        Err(Error::KeyTooLarge { limit, .. }) if limit == key_limit
    ));
    assert_eq!(
        format::record_len(&LogOp::Remove {
            key: &vec![1u8; key_limit]
        }),
        room,
        "the longest key fills a segment"
    );
    let fits = vec![2u8; limit];
    let appended = wal
        .append(LogOp::Insert {
            key: b"k",
            value: &fits,
        })
        .expect("fits");
    wal.commit(appended).expect("commit");
    assert_eq!(wal.next_lsn(), 4096 - HEADER_SIZE);
}

#[test]
fn buffered_commit_writes_and_the_flusher_syncs() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Without a staging ring, committed Buffered records are in the file (the OS has them)
    // before any sync; with one, they are once the flusher has run.
    let unstaged = WalConfig {
        ring_capacity: 0,
        ..config(1 << 20, Durability::Buffered)
    };
    let wal = Wal::open(dir.path(), unstaged).expect("open");
    let recs = random_records(10, 20, 40);
    let lsns = write_all(&wal, &recs);
    let path = segment_paths(dir.path()).pop().expect("segment");
    let bytes = fs::read(&path).expect("read");
    let end = lsns[19] + format::record_len(&op(&recs[19]));
    let mut n = 0;
    let mut r = std::io::Cursor::new(&bytes[..]);
    let header = format::read_header(&mut r, &path)
        .expect("io")
        .expect("header");
    let scan = format::scan_records(&mut r, &header, &path, |_, _| {
        n += 1;
        Ok(())
    })
    .expect("scan");
    assert_eq!((n, scan.end_lsn), (20, end));
    drop(wal);
    let dir = tempfile::tempdir().expect("tempdir");
    let wal = Wal::open(dir.path(), config(1 << 20, Durability::Buffered)).expect("open");
    let lsns = write_all(&wal, &recs);
    let path = segment_paths(dir.path()).pop().expect("segment");
    let end = lsns[19] + format::record_len(&op(&recs[19]));
    // The background flusher writes and syncs without anyone calling flush.
    let deadline = Instant::now() + Duration::from_secs(5);
    while wal.stats().syncs == 0 {
        assert!(Instant::now() < deadline, "no background sync within 5 s");
        std::thread::sleep(Duration::from_millis(2));
    }
    let bytes = fs::read(&path).expect("read");
    let mut r = std::io::Cursor::new(&bytes[..]);
    let header = format::read_header(&mut r, &path)
        .expect("io")
        .expect("header");
    let scan = format::scan_records(&mut r, &header, &path, |_, _| Ok(())).expect("scan");
    assert_eq!((scan.records, scan.end_lsn), (20, end));
    // And stays idle when there is nothing new.
    let syncs = wal.stats().syncs;
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(wal.stats().syncs, syncs, "no sync without new records");
}

/// Four threads append and commit, starting together; returns the fsyncs per operation
/// after checking every committed record is in the log, in LSN order.
fn four_thread_run(durability: Durability, segment_size: u64, per_thread: usize) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let wal = Wal::open(dir.path(), config(segment_size, durability)).expect("open");
    let start = std::sync::Barrier::new(4);
    let written: Vec<Vec<(Lsn, Rec)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                let (wal, start) = (&wal, &start);
                s.spawn(move || {
                    let recs = random_records(100 + t, per_thread, 64);
                    start.wait();
                    let lsns = write_all(wal, &recs);
                    lsns.into_iter().zip(recs).collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("writer"))
            .collect()
    });
    let st = wal.stats();
    let ops = 4 * per_thread as u64;
    assert_eq!(st.appends, ops);
    drop(wal);
    let mut all: Vec<(Lsn, Rec)> = written.into_iter().flatten().collect();
    all.sort_by_key(|(l, _)| *l);
    let wal = Wal::open(dir.path(), config(segment_size, durability)).expect("reopen");
    assert!(
        replay_all(&wal, 0) == all,
        "every committed record is in the log, in LSN order"
    );
    st.syncs as f64 / ops as f64
}

#[test]
fn sync_commits_from_four_threads_share_fsyncs() {
    // Measured 0.26-0.44 fsyncs/op on the loaded 2-core box (with 4 extra CPU hogs); without
    // group commit it is 1.0. Three attempts absorb a run that the scheduler starves.
    let mut ratios = Vec::new();
    for _ in 0..3 {
        let r = four_thread_run(Durability::Sync, 64 << 10, 250);
        eprintln!("4 threads under Sync: {r:.2} fsyncs/op");
        ratios.push(r);
        if r < 0.6 {
            return;
        }
    }
    panic!("group commit did not share fsyncs: {ratios:?} fsyncs/op");
}

#[test]
fn buffered_appends_from_four_threads_across_segment_switches() {
    // Mapped, lock-free appends: with 8 KiB segments a segment fills every ~60 records, so
    // seals happen while other threads are between their reservation and their publish.
    four_thread_run(Durability::Buffered, 8 << 10, 2000);
}

#[test]
fn fuzz_check_accepts_sample_inputs() {
    let mut rng = StdRng::seed_from_u64(11);
    for _ in 0..2000 {
        let len = rng.gen_range(0..600);
        let mut data: Vec<u8> = (0..len).map(|_| rng.gen::<u8>()).collect();
        if let Some(b) = data.first_mut() {
            *b |= 1; // model mode: raw random bytes almost never pass the header
        }
        super::fuzz::decode_check(&data);
    }
    // Raw mode with a valid segment built by the writer.
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, _, path) = super::tests_tail::one_segment_log(dir.path(), 30);
    let mut data = vec![0u8];
    data.extend(fs::read(&path).expect("read"));
    super::fuzz::decode_check(&data);
    data.truncate(data.len() / 3);
    super::fuzz::decode_check(&data);
}

/// The staging ring file of the log in `dir`, if there is one.
#[cfg(target_os = "linux")]
pub(super) fn ring_file(dir: &Path) -> Option<PathBuf> {
    let path = dir.join(super::ring::FILE);
    path.exists().then_some(path)
}

#[test]
#[cfg(target_os = "linux")]
fn buffered_records_are_staged_in_the_ring_and_survive_a_lost_process() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The flusher sleeps through the test: only full rings and `flush` write records out.
    let quiet = WalConfig {
        flush_interval: Duration::from_secs(3600),
        ..config(4096, Durability::Buffered)
    };
    let wal = Wal::open(dir.path(), quiet.clone()).expect("open");
    let ring = ring_file(dir.path()).expect("a Buffered log has a ring");
    let recs = random_records(11, 6000, 60);
    let mut lsns = write_all(&wal, &recs[..1]);
    assert_eq!(wal.stats().writes, 0, "a staged record went through pwrite");
    // Several times the ring: full rings are written out by the writers themselves, over
    // many segment switches.
    lsns.extend(write_all(&wal, &recs[1..4000]));
    assert!(wal.next_lsn() > 2 * quiet.ring_capacity);
    assert!(segment_paths(dir.path()).len() > 10);
    // The process "dies": nothing drains the ring, nothing is synced, nothing is removed.
    std::mem::forget(wal);
    let wal = Wal::open(dir.path(), quiet.clone()).expect("reopen");
    expect_replay(&wal, 0, &lsns, &recs[..4000]);
    // The same file serves the new run, zeroed.
    assert_eq!(ring_file(dir.path()), Some(ring));
    // Appends go on after the recovered records; a clean close removes the ring.
    lsns.extend(write_all(&wal, &recs[4000..]));
    drop(wal);
    assert!(ring_file(dir.path()).is_none());
    let wal = Wal::open(dir.path(), quiet).expect("reopen");
    expect_replay(&wal, 0, &lsns, &recs);
    drop(wal);

    // `Sync` stages nothing.
    let dir = tempfile::tempdir().expect("tempdir");
    let wal = Wal::open(dir.path(), config(4096, Durability::Sync)).expect("open");
    write_all(&wal, &recs[..10]);
    assert!(ring_file(dir.path()).is_none(), "a Sync log has a ring");
}
