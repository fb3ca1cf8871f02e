//! The staging ring on real files: records left behind come back past the segments' end,
//! damage below what was published is reported on the same boot only, a slot a killed
//! writer left half filled is a torn tail however whole the records after it are, and
//! damaged, planted or old ring files are refused.

use super::*;
use crate::wal::LogOp;

fn put(ring: &StagingRing, key: &[u8], value: &[u8]) -> Lsn {
    let op = LogOp::Insert { key, value };
    let slot = ring.region.reserve(format::record_len(&op)).expect("room");
    let lsn = slot.start;
    format::encode_record_into(slot.bytes, lsn, &op);
    assert!(ring.region.publish(slot.start, slot.end));
    lsn
}

fn ring(dir: &Path, capacity: u64, start: Lsn) -> StagingRing {
    StagingRing::create(dir, capacity, start)
        .expect("create")
        .expect("a ring on this file system")
}

#[test]
fn a_ring_left_behind_gives_back_its_records_past_the_segments_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = ring(dir.path(), 4096, 10_000);
    // Wrap around the ring twice: only the last lap is there to read.
    let mut lsns = Vec::new();
    for i in 0..400u32 {
        lsns.push(put(&r, b"key", &i.to_le_bytes()));
        r.region
            .drain(|_, b| Ok::<_, ()>(b.len().saturating_sub(100)))
            .expect("drain");
    }
    let end = lsns[390];
    let left = leftover(dir.path(), end).expect("read");
    let mut expect = Vec::new();
    for (i, &lsn) in lsns.iter().enumerate().skip(390) {
        let value = (i as u32).to_le_bytes();
        let op = LogOp::Insert {
            key: b"key",
            value: &value,
        };
        format::encode_record(&mut expect, lsn, &op);
    }
    assert_eq!(left.records, expect);
    // Nothing outside the directory, and the file is the owner's alone.
    let meta = fs::metadata(dir.path().join(FILE)).expect("ring file");
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o600
    );
    drop(r);
    // The next run zeroes the ring: its records are not read again, even at their LSNs.
    let next = ring(dir.path(), 4096, end);
    assert!(leftover(dir.path(), end).expect("read").records.is_empty());
    next.remove();
    assert!(!dir.path().join(FILE).exists());
    assert!(leftover(dir.path(), end).expect("read").records.is_empty());
}

#[test]
fn damage_below_the_published_mark_is_reported_on_the_same_boot_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = ring(dir.path(), 1 << 16, 500);
    let lsns: Vec<Lsn> = (0..20u32)
        .map(|i| put(&r, b"key", &[i as u8; 40]))
        .collect();
    r.mark(r.region.done());
    // Two records published after the mark: past it, damage reads as a torn tail.
    put(&r, b"late", b"1");
    put(&r, b"late", b"2");
    let this = boot().expect("a boot id on Linux");
    drop(r);
    let path = dir.path().join(FILE);
    let data_offset = (sys::page_size() as u64).max(HEADER_LEN as u64);
    let pristine = fs::read(&path).expect("ring file");
    let flip = |lsn: Lsn| {
        let mut bytes = pristine.clone();
        bytes[(data_offset + lsn % (1 << 16)) as usize + 9] ^= 0x20;
        fs::write(&path, &bytes).expect("write");
    };
    let whole = leftover_on(dir.path(), 500, Some(this)).expect("undamaged");
    flip(lsns[10]);
    match leftover_on(dir.path(), 500, Some(this)) {
        Err(Error::Corruption { offset, .. }) => {
            assert_eq!(offset, Some(data_offset + lsns[10] % (1 << 16)));
        }
        other => panic!("damage below the mark: {other:?}"),
    }
    // After a restart of the machine, it is cut like a tail.
    let cut = leftover_on(dir.path(), 500, Some(this ^ 1)).expect("another boot");
    assert_eq!(cut.records.len() as u64, lsns[10] - 500);
    assert_eq!(cut.records[..], whole.records[..cut.records.len()]);
    // Past the mark, too: the last record may not have been published.
    // The last record, `late`/`2`, takes 12 bytes.
    let last = whole.records.len() - 12;
    flip(500 + last as u64);
    let cut = leftover_on(dir.path(), 500, Some(this)).expect("past the mark");
    assert_eq!(cut.records[..], whole.records[..last]);
    // The next run's zeroing clears the mark with the records; the new ring marks its
    // own start, with this boot.
    fs::write(&path, &pristine).expect("restore");
    let next = ring(dir.path(), 1 << 16, 2000);
    drop(next);
    let mut hb = [0u8; HEADER_LEN];
    hb.copy_from_slice(&fs::read(&path).expect("ring file")[..HEADER_LEN]);
    assert_eq!(decode_mark(&hb), Some((this, 2000)));
}

#[test]
fn a_ring_of_another_capacity_is_replaced_and_capacity_zero_removes_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = ring(dir.path(), 4096, 0);
    put(&r, b"k", b"v");
    drop(r);
    let r = ring(dir.path(), 8192, 0);
    assert_eq!(r.region.capacity(), 8192);
    assert!(leftover(dir.path(), 0).expect("read").records.is_empty());
    drop(r);
    assert!(StagingRing::create(dir.path(), 0, 0)
        .expect("none")
        .is_none());
    assert!(!dir.path().join(FILE).exists());
}

#[test]
fn damaged_planted_or_old_rings_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(FILE);
    let r = ring(dir.path(), 4096, 0);
    put(&r, b"k", b"v");
    // A damaged header: damage, not an empty ring.
    let f = fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open");
    sys::write_all_at(&f, &[0xee], 20).expect("damage");
    assert!(matches!(
        leftover(dir.path(), 0),
        Err(Error::Corruption { .. })
    ));
    drop(r);
    // Writable by others, a link, a FIFO: refused at once, never read.
    fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).expect("chmod");
    assert!(matches!(leftover(dir.path(), 0), Err(Error::Io { .. })));
    fs::remove_file(&path).expect("rm");
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let target = elsewhere.path().join("planted");
    fs::write(&target, [0u8; 8192]).expect("plant");
    std::os::unix::fs::symlink(&target, &path).expect("symlink");
    assert!(matches!(leftover(dir.path(), 0), Err(Error::Io { .. })));
    fs::remove_file(&path).expect("rm");
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: mkfifo reads the NUL-terminated path only.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    assert!(matches!(leftover(dir.path(), 0), Err(Error::Io { .. })));
    fs::remove_file(&path).expect("rm");
    // A name file of bfkv 0.1: its ring may hold writes, so open refuses to go on.
    fs::write(dir.path().join(OLD_NAME_FILE), b"/dev/shm/bfkv-ring-0").expect("old");
    assert!(matches!(
        leftover(dir.path(), 0),
        Err(Error::Corruption { .. })
    ));
}

#[test]
fn header_round_trips_and_rejects_damage() {
    let h = RingHeader {
        capacity: 1 << 20,
        data_offset: 4096,
    };
    let b = h.encode();
    assert_eq!(RingHeader::decode(&b), Some(h));
    for i in 0..36 {
        let mut d = b;
        d[i] ^= 1;
        assert_eq!(RingHeader::decode(&d), None, "byte {i}");
    }
    let huge = RingHeader {
        capacity: MAX_CAPACITY * 2,
        ..h
    };
    assert_eq!(RingHeader::decode(&huge.encode()), None);
}

/// The ring file's bytes with one byte flipped at position `lsn`'s record, 9 bytes in.
fn flipped(pristine: &[u8], capacity: u64, lsn: Lsn) -> Vec<u8> {
    let data_offset = (sys::page_size() as u64).max(HEADER_LEN as u64);
    let mut bytes = pristine.to_vec();
    bytes[(data_offset + lsn % capacity) as usize + 9] ^= 0x20;
    bytes
}

#[test]
fn damage_below_the_published_word_is_reported_without_a_tick() {
    // No flusher tick wrote a mark since the ring's creation: what a publish stored into
    // the mapping still tells which records were acknowledged.
    let dir = tempfile::tempdir().expect("tempdir");
    let capacity = 1 << 16;
    let r = ring(dir.path(), capacity, 100);
    let lsns: Vec<Lsn> = (0..300u32)
        .map(|i| put(&r, b"key", &[i as u8; 40]))
        .collect();
    let this = boot().expect("a boot id on Linux");
    drop(r);
    let path = dir.path().join(FILE);
    let pristine = fs::read(&path).expect("ring file");
    let whole = leftover_on(dir.path(), 100, Some(this)).expect("undamaged");
    let last_len = whole.records.len() as u64 - (lsns[299] - 100);
    assert_eq!(
        last_len, 50,
        "the last record, as the others, takes 50 bytes"
    );
    // Record 50 is far below the last 4 KiB multiple the publishes passed.
    fs::write(&path, flipped(&pristine, capacity, lsns[50])).expect("write");
    assert!(matches!(
        leftover_on(dir.path(), 100, Some(this)),
        Err(Error::Corruption {
            offset: Some(_),
            ..
        })
    ));
    let cut = leftover_on(dir.path(), 100, Some(this ^ 1)).expect("another boot");
    assert_eq!(cut.records.len() as u64, lsns[50] - 100);
    // The last record, past the last multiple: a torn-tail look-alike, cut.
    fs::write(&path, flipped(&pristine, capacity, lsns[299])).expect("write");
    let cut = leftover_on(dir.path(), 100, Some(this)).expect("the last record");
    assert_eq!(cut.records[..], whole.records[..cut.records.len()]);
    assert_eq!(cut.records.len() as u64, lsns[299] - 100);
}

#[test]
fn a_slot_left_half_filled_is_a_torn_tail_whatever_follows_it() {
    // A writer killed while it filled its slot, and a later writer's whole record waiting
    // to be published behind it: not acknowledged, so cut, never reported as damage.
    let dir = tempfile::tempdir().expect("tempdir");
    let r = ring(dir.path(), 1 << 16, 0);
    for i in 0..10u32 {
        put(&r, b"key", &i.to_le_bytes());
    }
    let op = LogOp::Insert {
        key: b"half",
        value: &[7u8; 30],
    };
    let half = r.region.reserve(format::record_len(&op)).expect("room");
    let start = half.start;
    half.bytes[4..20].fill(0x55);
    let op2 = LogOp::Insert {
        key: b"whole",
        value: b"v",
    };
    let next = r.region.reserve(format::record_len(&op2)).expect("room");
    format::encode_record_into(next.bytes, next.start, &op2);
    assert!(
        !r.region.publish(next.start, next.end),
        "published past a hole"
    );
    let this = boot().expect("a boot id on Linux");
    drop(r);
    let left = leftover_on(dir.path(), 0, Some(this)).expect("a hole is a torn tail");
    assert_eq!(left.records.len() as u64, start);
}
