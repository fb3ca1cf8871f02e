//! Log tests on real files: torn tails cut, damage reported (below the synced mark, or
//! with records that verify after it on the boot that wrote them), the synced mark's
//! slots and what an open marks.

use crate::sys::FileAt;
use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::format::{self, HEADER_SIZE};
use super::tests::{config, expect_replay, op, random_records, segment_paths, write_all, Rec};
use super::{Lsn, Wal, WalConfig};
use crate::{Durability, Error};

/// A `Buffered` log without a staging ring whose flusher never runs in a test: each commit
/// writes its record to the OS, nothing syncs, so no synced mark covers the records.
fn unsynced(segment_size: u64) -> WalConfig {
    WalConfig {
        ring_capacity: 0,
        flush_interval: Duration::from_secs(3600),
        ..config(segment_size, Durability::Buffered)
    }
}

/// Writes `n` records into one big segment and returns the log's records, LSNs and file,
/// as a crash leaves them (no close, and no sync: the synced mark has not reached the
/// records).
pub(super) fn one_segment_log(dir: &Path, n: usize) -> (Vec<Rec>, Vec<Lsn>, PathBuf) {
    let recs = random_records(3, n, 50);
    let wal = Wal::open(dir, unsynced(1 << 20)).expect("open");
    let lsns = write_all(&wal, &recs);
    std::mem::forget(wal);
    let paths = segment_paths(dir);
    assert_eq!(paths.len(), 1);
    (recs, lsns, paths[0].clone())
}

/// Reopens a damaged log and checks that it holds exactly `keep` of the records, continues
/// right after them, and stays correct after more appends and another reopen.
fn check_cut(dir: &Path, recs: &[Rec], lsns: &[Lsn], keep: usize) {
    let wal = Wal::open(dir, config(1 << 20, Durability::Sync)).expect("open damaged");
    let end = lsns[keep - 1] + format::record_len(&op(&recs[keep - 1]));
    assert_eq!(
        wal.next_lsn(),
        end,
        "positioned after the last valid record"
    );
    expect_replay(&wal, 0, &lsns[..keep], &recs[..keep]);
    let more = random_records(4, 20, 50);
    let more_lsns = write_all(&wal, &more);
    assert_eq!(more_lsns[0], end);
    drop(wal);
    let wal = Wal::open(dir, config(1 << 20, Durability::Sync)).expect("reopen");
    let all_lsns: Vec<Lsn> = lsns[..keep].iter().chain(&more_lsns).copied().collect();
    let all: Vec<Rec> = recs[..keep].iter().chain(&more).cloned().collect();
    expect_replay(&wal, 0, &all_lsns, &all);
}

fn file_offset(lsn: Lsn) -> u64 {
    HEADER_SIZE + lsn
}

#[test]
fn torn_tail_truncated_mid_record_is_cut() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (recs, lsns, path) = one_segment_log(dir.path(), 50);
    let f = OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open file");
    f.set_len(file_offset(lsns[49]) + 11).expect("truncate");
    drop(f);
    check_cut(dir.path(), &recs, &lsns, 49);
}

#[test]
fn garbage_after_the_last_record_is_cut() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (recs, lsns, path) = one_segment_log(dir.path(), 50);
    let end = lsns[49] + format::record_len(&op(&recs[49]));
    let f = OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open file");
    let garbage: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 3) as u8).collect();
    // Garbage right after the end, and further on (after zeros) where a reader that skipped
    // zeros would find it.
    f.write_all_at(&garbage, file_offset(end)).expect("garbage");
    drop(f);
    check_cut(dir.path(), &recs, &lsns, 50);

    let dir = tempfile::tempdir().expect("tempdir");
    let (recs, lsns, path) = one_segment_log(dir.path(), 50);
    let end = lsns[49] + format::record_len(&op(&recs[49]));
    let f = OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open file");
    f.write_all_at(&garbage, file_offset(end) + 100)
        .expect("garbage");
    drop(f);
    check_cut(dir.path(), &recs, &lsns, 50);
}

#[test]
fn flipped_byte_in_the_last_record_is_cut() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (recs, lsns, path) = one_segment_log(dir.path(), 50);
    let len = format::record_len(&op(&recs[49]));
    for at in [0, 5, 9, len / 2, len - 1] {
        let dir2 = tempfile::tempdir().expect("tempdir");
        let copy = dir2.path().join(path.file_name().expect("name"));
        fs::copy(&path, &copy).expect("copy");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&copy)
            .expect("open");
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, file_offset(lsns[49]) + at)
            .expect("read");
        f.write_all_at(&[b[0] ^ 0x10], file_offset(lsns[49]) + at)
            .expect("flip");
        drop(f);
        check_cut(dir2.path(), &recs, &lsns, 49);
    }
}

/// Makes the segment at `path` look written on another boot of the machine.
fn other_boot(path: &Path) {
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open file");
    let tag = super::vfs::LogFs::boot(&super::vfs::StdFs).expect("a boot id on Linux");
    f.write_all_at(&(tag ^ 0x5a5a).to_le_bytes(), format::BOOT_AT as u64)
        .expect("tag");
}

#[test]
fn stale_records_after_a_cut_never_come_back() {
    // Record 48 torn but 49 intact (out-of-order write-back before a power cut, so on
    // another boot): the cut must erase 49 so that new records of the same sizes cannot
    // make it valid again.
    let dir = tempfile::tempdir().expect("tempdir");
    let (recs, lsns, path) = one_segment_log(dir.path(), 50);
    let f = OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open file");
    f.write_all_at(&[0xff], file_offset(lsns[48]) + 20)
        .expect("flip");
    drop(f);
    other_boot(&path);
    let wal = Wal::open(dir.path(), config(1 << 20, Durability::Sync)).expect("open");
    // Re-log record 48 unchanged: same size, so the old record 49 would line up.
    let again = write_all(&wal, &recs[48..49]);
    assert_eq!(again[0], lsns[48]);
    drop(wal);
    let wal = Wal::open(dir.path(), config(1 << 20, Durability::Sync)).expect("reopen");
    expect_replay(&wal, 0, &lsns[..49], &recs[..49]);
}

/// Flips one byte of `path` at `offset`.
fn flip(path: &Path, offset: u64) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open");
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).expect("read");
    f.write_all_at(&[b[0] ^ 0x01], offset).expect("flip");
}

#[test]
fn damage_in_the_middle_of_the_last_segment_is_reported_not_cut() {
    // After a clean close: every record is below the synced mark.
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = random_records(21, 400, 50);
    let wal = Wal::open(dir.path(), config(1 << 20, Durability::Buffered)).expect("open");
    let lsns = write_all(&wal, &recs);
    drop(wal);
    let path = segment_paths(dir.path()).pop().expect("a segment");
    for victim in [0, 1, 200, 398, 399] {
        let copy = tempfile::tempdir().expect("tempdir");
        fs::copy(&path, copy.path().join(path.file_name().expect("name"))).expect("copy");
        let seg = copy.path().join(path.file_name().expect("name"));
        flip(&seg, file_offset(lsns[victim]) + 6);
        match Wal::open(copy.path(), config(1 << 20, Durability::Sync)) {
            Err(Error::Corruption { file, offset, .. }) => {
                assert_eq!(file, seg);
                assert_eq!(offset, Some(file_offset(lsns[victim])), "record {victim}");
            }
            other => panic!("record {victim} damaged: {other:?}"),
        }
    }
    // After a crash of a `Sync` writer: every sync recorded its end in the side file, so
    // damage to any acknowledged record is reported, the last one's too, on any boot.
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = random_records(22, 3000, 900);
    let wal = Wal::open(dir.path(), config(8 << 20, Durability::Sync)).expect("open");
    let lsns = write_all(&wal, &recs);
    std::mem::forget(wal);
    let path = segment_paths(dir.path()).pop().expect("a segment");
    other_boot(&path);
    let side = dir.path().join(super::segment::SIDE_FILE);
    let damaged = |victim: usize, with_side: bool| {
        let copy = tempfile::tempdir().expect("tempdir");
        let seg = copy.path().join(path.file_name().expect("name"));
        fs::copy(&path, &seg).expect("copy");
        if with_side {
            fs::copy(&side, copy.path().join(super::segment::SIDE_FILE)).expect("copy");
        }
        flip(&seg, file_offset(lsns[victim]) + 6);
        (copy, seg)
    };
    for victim in [10, 1500, 2999] {
        let (copy, seg) = damaged(victim, true);
        match Wal::open(copy.path(), config(8 << 20, Durability::Sync)) {
            Err(Error::Corruption { file, offset, .. }) => {
                assert_eq!(file, seg);
                assert_eq!(offset, Some(file_offset(lsns[victim])), "record {victim}");
            }
            other => panic!("synced record {victim} damaged: {other:?}"),
        }
    }
    // The side file lost (a power cut before the kernel wrote it back): the header's own
    // mark, moved every `MARK_EVERY` bytes, still covers the records below it.
    assert!(
        lsns[2999] > super::segment::MARK_EVERY,
        "the log passed a header mark"
    );
    let (copy, _) = damaged(10, false);
    assert!(matches!(
        Wal::open(copy.path(), config(8 << 20, Durability::Sync)),
        Err(Error::Corruption { .. })
    ));
    let (copy, _) = damaged(2999, false);
    check_cut(copy.path(), &recs, &lsns, 2999);
}

#[test]
fn damage_past_the_mark_with_records_after_it_is_reported_on_the_boot_that_wrote_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (recs, lsns, path) = one_segment_log(dir.path(), 400);
    let damaged = |how: &dyn Fn(&Path), boot_changed: bool| {
        let copy = tempfile::tempdir().expect("tempdir");
        let seg = copy.path().join(path.file_name().expect("name"));
        fs::copy(&path, &seg).expect("copy");
        how(&seg);
        if boot_changed {
            other_boot(&seg);
        }
        (copy, seg)
    };
    let flipped = |seg: &Path| flip(seg, file_offset(lsns[100]) + 7);
    let zeroed = |seg: &Path| {
        let f = OpenOptions::new().write(true).open(seg).expect("open");
        let at = file_offset(lsns[100]);
        f.write_all_at(&vec![0u8; (lsns[103] - lsns[100]) as usize], at)
            .expect("zero");
    };
    let ones = |seg: &Path| {
        let f = OpenOptions::new().write(true).open(seg).expect("open");
        f.write_all_at(&[0xffu8; 100], file_offset(lsns[100]) + 3)
            .expect("garble");
    };
    for how in [&flipped as &dyn Fn(&Path), &zeroed, &ones] {
        let (copy, seg) = damaged(how, false);
        match Wal::open(copy.path(), unsynced(1 << 20)) {
            Err(Error::Corruption { file, offset, .. }) => {
                assert_eq!(file, seg);
                assert_eq!(offset, Some(file_offset(lsns[100])));
            }
            other => panic!("damage with records after it: {other:?}"),
        }
        // Written on another boot, past the mark: a power cut may have written the
        // segment's pages in any order, so it reads as a torn tail.
        let (copy, _seg) = damaged(how, true);
        check_cut(copy.path(), &recs, &lsns, 100);
    }
    // The tail itself damaged: a torn-tail look-alike, cut on any boot.
    let (copy, _seg) = damaged(&|seg: &Path| flip(seg, file_offset(lsns[399]) + 7), false);
    check_cut(copy.path(), &recs, &lsns, 399);
}

#[test]
fn an_open_marks_what_it_kept() {
    // Records no sync covered, then an open: it synced them and moved the mark, so damage
    // to them is reported at every later open, on any boot.
    let dir = tempfile::tempdir().expect("tempdir");
    let (_recs, lsns, path) = one_segment_log(dir.path(), 50);
    drop(Wal::open(dir.path(), unsynced(1 << 20)).expect("open"));
    let wal = Wal::open(dir.path(), unsynced(1 << 20)).expect("open");
    std::mem::forget(wal);
    other_boot(&path);
    flip(&path, file_offset(lsns[49]) + 6);
    assert!(matches!(
        Wal::open(dir.path(), unsynced(1 << 20)),
        Err(Error::Corruption {
            offset: Some(_),
            ..
        })
    ));
}

#[test]
fn damage_before_the_tail_is_corruption() {
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = random_records(5, 400, 100);
    let wal = Wal::open(dir.path(), config(4096, Durability::Sync)).expect("open");
    write_all(&wal, &recs);
    drop(wal);
    let paths = segment_paths(dir.path());
    assert!(paths.len() > 3);
    // A flipped byte in a record of the second segment.
    let f = OpenOptions::new()
        .write(true)
        .open(&paths[1])
        .expect("open");
    f.write_all_at(&[0xee], HEADER_SIZE + 30).expect("flip");
    drop(f);
    match Wal::open(dir.path(), config(4096, Durability::Sync)) {
        Err(Error::Corruption { file, .. }) => assert_eq!(file, paths[1]),
        other => panic!("expected corruption, got {other:?}"),
    }
    // A damaged header of a middle segment.
    let dir = tempfile::tempdir().expect("tempdir");
    let wal = Wal::open(dir.path(), config(4096, Durability::Sync)).expect("open");
    write_all(&wal, &recs);
    drop(wal);
    let paths = segment_paths(dir.path());
    let f = OpenOptions::new()
        .write(true)
        .open(&paths[2])
        .expect("open");
    f.write_all_at(&[0xee], 20).expect("flip");
    drop(f);
    match Wal::open(dir.path(), config(4096, Durability::Sync)) {
        Err(Error::Corruption { file, .. }) => assert_eq!(file, paths[2]),
        other => panic!("expected corruption, got {other:?}"),
    }
}

#[test]
fn damaged_header_of_the_last_segment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = random_records(6, 400, 100);
    let wal = Wal::open(dir.path(), config(4096, Durability::Sync)).expect("open");
    let lsns = write_all(&wal, &recs);
    let end = wal.next_lsn();
    drop(wal);
    // A crash while creating a segment: a file whose header never reached the disk.
    let empty = dir.path().join(super::segment::segment_name(end));
    fs::write(&empty, [0u8; 100]).expect("write");
    let wal = Wal::open(dir.path(), config(4096, Durability::Sync)).expect("open");
    assert!(!empty.exists(), "the half-created segment is removed");
    assert_eq!(wal.next_lsn(), end);
    expect_replay(&wal, 0, &lsns, &recs);
    drop(wal);
    // A last segment with a damaged header but records in it is not a half-created one.
    let last = segment_paths(dir.path()).pop().expect("segments");
    let f = OpenOptions::new().write(true).open(&last).expect("open");
    f.write_all_at(&[0xee], 3).expect("flip");
    drop(f);
    assert!(matches!(
        Wal::open(dir.path(), config(4096, Durability::Sync)),
        Err(Error::Corruption { .. })
    ));
}

#[test]
fn a_torn_synced_mark_loses_only_itself() {
    let first = 4096;
    let mut b = [0u8; HEADER_SIZE as usize];
    assert_eq!(format::decode_mark(&b, first), None);
    let put = |b: &mut [u8; HEADER_SIZE as usize], slot: usize, synced| {
        let at = format::MARK_SLOTS[slot] as usize;
        b[at..at + 12].copy_from_slice(&format::encode_mark(first, synced));
    };
    put(&mut b, 0, first + 1000);
    put(&mut b, 1, first + 2000);
    assert_eq!(format::decode_mark(&b, first), Some(first + 2000));
    // The newer slot torn half way: the older mark still holds.
    let at = format::MARK_SLOTS[1] as usize;
    b[at + 6..at + 12].fill(0);
    assert_eq!(format::decode_mark(&b, first), Some(first + 1000));
    // A mark copied from another segment (another first LSN) does not count.
    assert_eq!(format::decode_mark(&b, first + 1), None);
}

#[test]
fn a_segment_copied_while_written_cuts_at_its_first_failure_past_the_mark() {
    // A backup's copy raced the writer: a record torn by the copy, whole records after it.
    let dir = tempfile::tempdir().expect("tempdir");
    let (recs, lsns, path) = one_segment_log(dir.path(), 50);
    let f = OpenOptions::new().write(true).open(&path).expect("open");
    f.write_all_at(&[0u8; 8], file_offset(lsns[45]) + 6)
        .expect("tear");
    drop(f);
    super::clear_boot_tag(&path).expect("clear");
    check_cut(dir.path(), &recs, &lsns, 45);
}
