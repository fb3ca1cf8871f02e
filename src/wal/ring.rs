//! The staging ring of a `Buffered` log: records go into a ring of memory mapped from the
//! file `staging` in the log directory, and the background flusher copies them into the
//! segments with `pwrite` before each sync. A store into a shared file mapping is in the
//! kernel's page cache at once and outlives the process, so a record in the ring has reached
//! the OS, as `Buffered` promises, without a system call. The file lives beside the
//! segments: moving or copying the directory takes it along, and nothing outside the
//! directory holds a record.
//!
//! An append reserves its record's bytes with one compare-and-swap and encodes the record
//! there (`AppendRegion`), then publishes it once every earlier record is in: so when an
//! append returns, every record before it is in the ring too. Positions in the ring are
//! LSNs. A writer that finds the ring full drains it itself.
//!
//! # The file
//! `staging`, created 0600, a 64-byte header at offset 0 (integers little-endian), the ring's
//! bytes from `data_offset` on:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `BFKVSTG\0` |
//! | 8 | 4 | version (2) |
//! | 12 | 4 | zero |
//! | 16 | 8 | capacity in bytes (a power of two, at most 1 GiB) |
//! | 24 | 8 | file offset of the ring's first byte (a page multiple, at most 1 MiB) |
//! | 32 | 4 | crc32c of bytes 0..32 |
//! | 40 | 8 | published mark: a hash of the boot id of the machine that wrote it |
//! | 48 | 8 | published mark: every record below this LSN was published |
//! | 56 | 4 | crc32c of bytes 40..56 (zeros: no mark) |
//!
//! The ring's bytes hold records in the log's own format (`format`): position `p` is byte
//! `p mod capacity`, and each record's checksum covers its LSN, so a record left from an
//! earlier lap never passes for a later one.
//!
//! # Recovery
//! `Wal::open` finds the segments' end `e`, then reads the ring: the records from position
//! `e` on, as far as they decode, are written to the segments and synced (`leftover`). Only
//! then is the ring made ready for this run: its bytes are zeroed (by extent where the file
//! system can) and the file synced before the first append. That zeroing is what keeps a
//! power cut safe: the page cache writes ring pages back in any order, so after a machine
//! crash the ring may hold records of this run past a gap, and the next run must not read
//! them as its own; zeroed, the ring holds records of one run only, each at its own LSN. A
//! new file is made under a temporary name and renamed once its header is synced, so a
//! `staging` file with a bad header is damage (`Err(Corruption)`), never a half-made file.
//! A clean close drains and syncs the ring, then removes the file.
//!
//! Damage is told from a torn tail by the published mark, which the flusher rewrites on
//! each tick (one `pwrite` per tick). Without a restart of the machine, a crashed
//! process's ring is exactly as it left it: every record below the mark decodes, and one
//! that does not is `Err(Corruption)` at its offset. After a restart (the boot id differs)
//! the page cache may have reached the file in any order, so the records are read up to the
//! first that fails, as for a log tail: `Buffered` never promised them across a power cut.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use super::format::{self, SegmentHeader, HEADER_SIZE};
use super::Lsn;
use crate::error::{Error, Result};
use crate::store::checksum;
use crate::sync::{AppendRegion, AtomicU64, Ordering, RingMap};
use crate::sys;

/// The ring's file in the log directory.
pub(super) const FILE: &str = "staging";
/// Where a new ring file is made before it is renamed to [`FILE`].
const TMP_FILE: &str = "staging.tmp";
/// The file in which bfkv 0.1 named a ring it kept outside the directory (`/dev/shm`).
const OLD_NAME_FILE: &str = "ring";
const MAGIC: [u8; 8] = *b"BFKVSTG\0";
/// 3 since merge records exist: a bfkv that knows none refuses the ring rather than cut
/// the log at the first one. Version 2 rings (no merges) are still read.
const VERSION: u32 = 3;
const OLDER_VERSION: u32 = 2;
const HEADER_LEN: usize = 64;
/// Largest capacity a header may claim (bounds what recovery reads).
const MAX_CAPACITY: u64 = 1 << 30;
/// Largest data offset a header may claim.
const MAX_DATA_OFFSET: u64 = 1 << 20;

/// Offset of the published mark in the header.
const MARK_AT: u64 = 40;

/// The ring of a running log.
#[derive(Debug)]
pub(super) struct StagingRing {
    /// Where appends go.
    pub(super) region: AppendRegion,
    /// The ring's file.
    path: PathBuf,
    /// The same file, for the published mark.
    file: File,
    /// The LSN of the last mark written.
    marked: AtomicU64,
}

/// A hash of this boot's id, or `None` where there is none: then no mark is trusted to
/// tell damage from a torn tail.
fn boot() -> Option<u64> {
    sys::boot_id()
}

/// The published-mark bytes: `boot`, `lsn`, their checksum.
fn encode_mark(boot: u64, lsn: Lsn) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[..8].copy_from_slice(&boot.to_le_bytes());
    b[8..16].copy_from_slice(&lsn.to_le_bytes());
    let crc = checksum::crc32c(&b[..16]);
    b[16..].copy_from_slice(&crc.to_le_bytes());
    b
}

/// The published mark in a header, if one is there and intact: (boot hash, LSN).
fn decode_mark(h: &[u8; HEADER_LEN]) -> Option<(u64, Lsn)> {
    let b = &h[MARK_AT as usize..MARK_AT as usize + 20];
    let crc = u32::from_le_bytes([b[16], b[17], b[18], b[19]]);
    if crc != checksum::crc32c(&b[..16]) {
        return None;
    }
    let mut boot = [0u8; 8];
    let mut lsn = [0u8; 8];
    boot.copy_from_slice(&b[..8]);
    lsn.copy_from_slice(&b[8..16]);
    Some((u64::from_le_bytes(boot), u64::from_le_bytes(lsn)))
}

/// The header of a ring file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RingHeader {
    capacity: u64,
    data_offset: u64,
}

impl RingHeader {
    fn encode(self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[16..24].copy_from_slice(&self.capacity.to_le_bytes());
        b[24..32].copy_from_slice(&self.data_offset.to_le_bytes());
        let crc = checksum::crc32c(&b[..32]);
        b[32..36].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// `None` unless the bytes are a valid header of a sane ring.
    fn decode(b: &[u8; HEADER_LEN]) -> Option<RingHeader> {
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let crc = u32::from_le_bytes([b[32], b[33], b[34], b[35]]);
        let h = RingHeader {
            capacity: u64_at(16),
            data_offset: u64_at(24),
        };
        let sane = b[0..8] == MAGIC
            && crc == checksum::crc32c(&b[..32])
            && (b[8..12] == VERSION.to_le_bytes() || b[8..12] == OLDER_VERSION.to_le_bytes())
            && h.capacity.is_power_of_two()
            && h.capacity <= MAX_CAPACITY
            && h.data_offset >= HEADER_LEN as u64
            && h.data_offset <= MAX_DATA_OFFSET;
        sane.then_some(h)
    }
}

impl StagingRing {
    /// Makes the ring of `capacity` bytes for the log in `dir`, whose next record gets LSN
    /// `start`: reuses the `staging` file if it has that capacity, else makes a new one;
    /// zeroes its bytes and syncs it (module docs). Call it after [`leftover`]'s records
    /// are synced into the segments. `Ok(None)` when `capacity` is 0 (any old file is
    /// removed), off Linux, or when the file system cannot map the file: the log then
    /// appends through its buffer.
    ///
    /// # Errors
    /// `Io` if an old ring file cannot be removed or the directory synced.
    pub(super) fn create(dir: &Path, capacity: u64, start: Lsn) -> Result<Option<StagingRing>> {
        let path = dir.join(FILE);
        if capacity == 0 || !cfg!(target_os = "linux") {
            return remove_file(dir, &path).map(|()| None);
        }
        let header = RingHeader {
            capacity,
            data_offset: (sys::page_size() as u64).max(HEADER_LEN as u64),
        };
        let Ok(len) = usize::try_from(capacity) else {
            return Ok(None);
        };
        let reused = reuse(&path, header).ok().flatten();
        let file = if let Some(file) = reused {
            file
        } else {
            remove_file(dir, &path)?;
            match make(dir, &path, header) {
                Ok(file) => file,
                Err(_) => return Ok(None),
            }
        };
        let Ok(map) = RingMap::new(&file, header.data_offset, len) else {
            return Ok(None);
        };
        Ok(Some(StagingRing {
            region: AppendRegion::new(map, start),
            path,
            file,
            marked: AtomicU64::new(start),
        }))
    }

    /// Records that every record below `lsn` is published (the flusher calls it each
    /// tick). Best effort: a mark that is not written only leaves more of the ring to be
    /// read like a log tail.
    pub(super) fn mark(&self, lsn: Lsn) {
        if self.marked.load(Ordering::Relaxed) == lsn {
            return;
        }
        if let Some(boot) = boot() {
            if sys::write_all_at(&self.file, &encode_mark(boot, lsn), MARK_AT).is_ok() {
                self.marked.store(lsn, Ordering::Relaxed);
            }
        }
    }

    /// Removes the ring's file (a clean close, once every record in it is synced). A file
    /// left behind holds only synced records, which the next open skips.
    pub(super) fn remove(&self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// The existing ring file at `path`, zeroed and synced, if it has `header`'s geometry.
fn reuse(path: &Path, header: RingHeader) -> std::io::Result<Option<File>> {
    let Some(file) = sys::open_trusted(path, &sys::private_options())? else {
        return Ok(None);
    };
    let mut hb = [0u8; HEADER_LEN];
    sys::read_exact_at(&file, &mut hb, 0)?;
    if RingHeader::decode(&hb) != Some(header) {
        return Ok(None);
    }
    sys::zero_range(&file, header.data_offset, header.capacity)?;
    // The old run's mark goes with its records.
    sys::write_all_at(&file, &[0u8; 20], MARK_AT)?;
    file.sync_data()?;
    Ok(Some(file))
}

/// A new ring file at `path` with `header`, its bytes allocated and zero, synced and named.
fn make(dir: &Path, path: &Path, header: RingHeader) -> std::io::Result<File> {
    let tmp = dir.join(TMP_FILE);
    let _ = fs::remove_file(&tmp);
    let file = sys::private_options().create_new(true).open(&tmp)?;
    let made = (|| {
        sys::preallocate(&file, 0, header.data_offset + header.capacity)?;
        sys::write_all_at(&file, &header.encode(), 0)?;
        file.sync_all()?;
        fs::rename(&tmp, path)?;
        sys::sync_dir(dir)
    })();
    match made {
        Ok(()) => Ok(file),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Removes the ring file at `path` if there is one, durably.
fn remove_file(dir: &Path, path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => sys::sync_dir(dir).map_err(|e| Error::io(dir, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// What a crashed process left in the ring of the log in `dir`.
#[derive(Debug, Default)]
pub(super) struct Leftover {
    /// Whole records, back to back, from LSN `end` (the segments' end) on.
    pub(super) records: Vec<u8>,
}

/// Reads the records past LSN `end` that the ring file in `dir` holds (module docs); none
/// if there is no ring file.
///
/// # Errors
/// `Io` if the ring file cannot be read or must not be trusted (not a regular file of this
/// user, or writable by others); `Corruption` if its header is damaged, or if a ring of
/// bfkv 0.1 (kept outside the directory) is named there.
pub(super) fn leftover(dir: &Path, end: Lsn) -> Result<Leftover> {
    leftover_on(dir, end, boot())
}

/// [`leftover`] as if this were boot `boot` (tests pass another).
fn leftover_on(dir: &Path, end: Lsn, boot: Option<u64>) -> Result<Leftover> {
    let old = dir.join(OLD_NAME_FILE);
    if fs::symlink_metadata(&old).is_ok() {
        return Err(Error::corruption(
            old,
            None,
            "a staging ring of bfkv 0.1 outside the directory may hold acknowledged writes: \
             open and close the database with that version first",
        ));
    }
    let path = dir.join(FILE);
    let mut read = fs::OpenOptions::new();
    read.read(true);
    let Some(file) = sys::open_trusted(&path, &read).map_err(|e| Error::io(&path, e))? else {
        return Ok(Leftover::default());
    };
    let mut hb = [0u8; HEADER_LEN];
    let h = sys::read_exact_at(&file, &mut hb, 0)
        .ok()
        .and_then(|()| RingHeader::decode(&hb))
        .ok_or_else(|| Error::corruption(&path, None, "staging ring header damaged"))?;
    let len = file.metadata().map_err(|e| Error::io(&path, e))?.len();
    if len < h.data_offset + h.capacity {
        return Err(Error::corruption(
            &path,
            None,
            "staging ring file cut short",
        ));
    }
    let mut data = vec![0u8; h.capacity as usize];
    sys::read_exact_at(&file, &mut data, h.data_offset).map_err(|e| Error::io(&path, e))?;
    // The ring's bytes from position `end` on, in order.
    data.rotate_left((end % h.capacity) as usize);
    let header = SegmentHeader {
        segment_size: HEADER_SIZE + h.capacity,
        first_lsn: end,
    };
    let scan = format::scan_records(&mut &data[..], &header, &path, |_, _| Ok(()))?;
    if let Some((marked_boot, marked)) = decode_mark(&hb) {
        // The same boot: the page cache still holds every byte the crashed process wrote,
        // so a record below the mark that does not decode is damage, not a torn tail.
        if Some(marked_boot) == boot && scan.end_lsn < marked && marked - end <= h.capacity {
            return Err(Error::corruption_at(
                &path,
                h.data_offset + scan.end_lsn % h.capacity,
                "staging ring record damaged below the published mark",
            ));
        }
    }
    data.truncate((scan.end_offset - HEADER_SIZE) as usize);
    Ok(Leftover { records: data })
}

#[cfg(all(test, not(shuttle), target_os = "linux"))]
mod tests {
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
        // The next run's zeroing clears the mark with the records.
        fs::write(&path, &pristine).expect("restore");
        let next = ring(dir.path(), 1 << 16, 2000);
        drop(next);
        let mut hb = [0u8; HEADER_LEN];
        hb.copy_from_slice(&fs::read(&path).expect("ring file")[..HEADER_LEN]);
        assert_eq!(decode_mark(&hb), None);
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
}
