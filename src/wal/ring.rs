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
//! | `data_offset - 8` | 8 | published word: an LSN below which every record was published, in the machine's byte order, stored through the mapping (`sync::region`) |
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
//! Damage is told from a torn tail by what was published: the published mark, which the
//! ring's creation writes (with this boot's hash) and the flusher rewrites on each tick
//! (one `pwrite` per tick), and the published word, which a publish stores into the
//! mapping whenever `done` crosses a 4 KiB multiple (no system call). Without a restart
//! of the machine, a crashed process's ring is exactly as it left it: every record below
//! the later of the two decodes, and one that does not is `Err(Corruption)` at its offset.
//! Past them, within 4 KiB of published records, a record that fails its check is cut
//! like a torn tail, and records that verify after it prove nothing here: a writer killed
//! while it filled its slot leaves one, and later writers' whole records (which wait to
//! publish behind it) follow it. After a restart (the boot id differs) the page cache may
//! have reached the file in any order, so the records are read up to the first that fails,
//! as for a log tail: `Buffered` never promised them across a power cut.

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
        let ring = StagingRing {
            region: AppendRegion::new(map, start),
            path,
            file,
            marked: AtomicU64::new(start),
        };
        // Tags the ring with this boot at once, so that its published word is trusted
        // after a crash before the first tick. Best effort, as every mark.
        if let Some(boot) = boot() {
            let _ = sys::write_all_at(&ring.file, &encode_mark(boot, start), MARK_AT);
        }
        Ok(Some(ring))
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
    // The old run's mark and published word go with its records.
    sys::write_all_at(&file, &[0u8; 20], MARK_AT)?;
    sys::write_all_at(&file, &[0u8; 8], header.data_offset - 8)?;
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
    let mut word = [0u8; 8];
    sys::read_exact_at(&file, &mut word, h.data_offset - 8).map_err(|e| Error::io(&path, e))?;
    if let Some((marked_boot, marked)) = decode_mark(&hb) {
        // The same boot: the page cache still holds every byte the crashed process wrote,
        // so a record below what was published that does not decode is damage, not a
        // torn tail.
        let marked = marked.max(u64::from_ne_bytes(word));
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
#[path = "ring_tests.rs"]
mod tests;
