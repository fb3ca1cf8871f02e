//! The staging ring of a `Buffered` log: records go into a ring of shared memory backed by
//! a tmpfs file (`/dev/shm`), and the background flusher copies them into the segments
//! with `pwrite` before each sync. A tmpfs file is kernel memory that outlives the process,
//! so a record stored into the ring has reached the OS, as `Buffered` promises; and its
//! pages are never written back, so a writer never takes the page fault that each fresh or
//! freshly synced page of a mapped segment file costs (and a sync interrupts no writer to
//! write-protect pages).
//!
//! An append reserves its record's bytes with one compare-and-swap and encodes the record
//! there (`AppendRegion`), then publishes it once every earlier record is in: so when an
//! append returns, every record before it is in the ring too. Positions in the ring are
//! LSNs. A writer that finds the ring full drains it itself.
//!
//! # Files
//! The ring file is `/dev/shm/bfkv-ring-<16 hex digits>`; the log directory's file `ring`
//! names it. A 64-byte header at offset 0 (integers little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `BFKVRING` |
//! | 8 | 4 | version (1) |
//! | 12 | 4 | zero |
//! | 16 | 8 | capacity in bytes (a power of two) |
//! | 24 | 8 | file offset of the ring's first byte (a page multiple) |
//! | 32 | 8 | device of the log directory |
//! | 40 | 8 | inode of the log directory |
//! | 48 | 8 | nonce (the file name's digits) |
//! | 56 | 4 | crc32c of bytes 0..56 |
//!
//! The ring's bytes hold records in the log's own format (`format`): position `p` is byte
//! `p mod capacity`, and each record's checksum covers its LSN, so a record left from an
//! earlier lap never passes for a later one.
//!
//! # Recovery
//! `Wal::open` finds the segments' end `e`, then reads the ring the directory names: if its
//! header is valid and names this very directory (a copy of the directory elsewhere does
//! not take another's ring), the records from position `e` on, as far as they decode, are
//! written to the segments and synced, and then the ring's files are removed. A clean
//! close drains, syncs and removes them too. A machine crash empties tmpfs: what the last
//! sync covered is what is left, as `Buffered` promises.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::format::{self, SegmentHeader, HEADER_SIZE};
use super::Lsn;
use crate::error::{Error, Result};
use crate::store::checksum;
use crate::sync::{AppendRegion, RingMap};

/// The directory of ring files, when it is a tmpfs.
const SHM_DIR: &str = "/dev/shm";
/// Prefix of ring file names.
const PREFIX: &str = "bfkv-ring-";
/// The log directory's file that names the current ring.
pub(super) const NAME_FILE: &str = "ring";
const MAGIC: [u8; 8] = *b"BFKVRING";
const VERSION: u32 = 1;
const HEADER_LEN: usize = 64;
/// Largest capacity a header may claim (bounds what recovery reads).
const MAX_CAPACITY: u64 = 1 << 30;

/// The ring of a running log.
#[derive(Debug)]
pub(super) struct StagingRing {
    /// Where appends go.
    pub(super) region: AppendRegion,
    /// The ring file.
    path: PathBuf,
    /// The log directory's file naming it.
    name_file: PathBuf,
}

/// The identity a ring header carries: the log directory's device and inode.
fn dir_identity(dir: &Path) -> io::Result<(u64, u64)> {
    let meta = fs::metadata(dir)?;
    Ok((meta.dev(), meta.ino()))
}

/// A nonce for a ring's name: distinct across the rings of one machine in practice (time,
/// process, and a per-process counter), which is all a file name needs.
fn nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.finish()
}

/// The header of a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RingHeader {
    capacity: u64,
    data_offset: u64,
    dev: u64,
    ino: u64,
    nonce: u64,
}

impl RingHeader {
    fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        for (i, v) in [
            self.capacity,
            self.data_offset,
            self.dev,
            self.ino,
            self.nonce,
        ]
        .into_iter()
        .enumerate()
        {
            b[16 + 8 * i..24 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        let crc = checksum::crc32c(&b[..56]);
        b[56..60].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// `None` unless the bytes are a valid header of a sane ring.
    fn decode(b: &[u8; HEADER_LEN]) -> Option<RingHeader> {
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let crc = u32::from_le_bytes([b[56], b[57], b[58], b[59]]);
        let h = RingHeader {
            capacity: u64_at(16),
            data_offset: u64_at(24),
            dev: u64_at(32),
            ino: u64_at(40),
            nonce: u64_at(48),
        };
        let sane = b[0..8] == MAGIC
            && crc == checksum::crc32c(&b[..56])
            && b[8..12] == VERSION.to_le_bytes()
            && h.capacity.is_power_of_two()
            && h.capacity <= MAX_CAPACITY
            && h.data_offset >= HEADER_LEN as u64
            && h.data_offset <= 1 << 20;
        sane.then_some(h)
    }
}

impl StagingRing {
    /// A fresh ring of `capacity` bytes for the log in `dir`, whose next record gets LSN
    /// `start`; `None` when `/dev/shm` is not a tmpfs or the ring cannot be made (the log
    /// then appends through its buffer). Call it with no other ring of `dir` in use.
    pub(super) fn create(dir: &Path, capacity: u64, start: Lsn) -> Option<StagingRing> {
        if capacity == 0 || !crate::sync::is_tmpfs(Path::new(SHM_DIR)) {
            return None;
        }
        let (dev, ino) = dir_identity(dir).ok()?;
        let page = crate::sync::page_size() as u64;
        let header = RingHeader {
            capacity,
            data_offset: page.max(HEADER_LEN as u64),
            dev,
            ino,
            nonce: nonce(),
        };
        let path = Path::new(SHM_DIR).join(format!("{PREFIX}{:016x}", header.nonce));
        let made = (|| -> io::Result<RingMap> {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)?;
            file.set_len(header.data_offset + capacity)?;
            file.write_all_at(&header.encode(), 0)?;
            RingMap::new(
                &file,
                header.data_offset,
                usize::try_from(capacity).ok().unwrap_or(0),
            )
        })();
        let name_file = dir.join(NAME_FILE);
        let named = made.and_then(|map| {
            // Named before any record goes in: a crash after this finds the ring.
            let tmp = dir.join(format!("{NAME_FILE}.tmp"));
            fs::write(&tmp, path.as_os_str().as_encoded_bytes())?;
            fs::rename(&tmp, &name_file)?;
            Ok(map)
        });
        if let Ok(map) = named {
            Some(StagingRing {
                region: AppendRegion::new(map, start),
                path,
                name_file,
            })
        } else {
            let _ = fs::remove_file(&path);
            None
        }
    }

    /// Removes the ring's files (a clean close, once every record in it is synced).
    pub(super) fn remove(&self) {
        remove_files(&self.name_file, Some(&self.path));
    }
}

/// What a crashed process left in the ring of the log in `dir`.
#[derive(Debug)]
pub(super) struct Leftover {
    /// Whole records, back to back, from LSN `end` (the segments' end) on.
    pub(super) records: Vec<u8>,
    /// The ring file, to remove once `records` are synced into the segments.
    path: Option<PathBuf>,
    /// The directory's name file.
    name_file: PathBuf,
}

impl Leftover {
    /// Removes the old ring's files: call once its records are durable in the segments.
    pub(super) fn remove(&self) {
        remove_files(&self.name_file, self.path.as_deref());
    }
}

/// Removes a directory's name file, then the ring it named (if it is ours). Failures are
/// left: a name file that stays names a ring that is gone or empty of later records, which
/// the next open reads as nothing.
fn remove_files(name_file: &Path, ring: Option<&Path>) {
    let _ = fs::remove_file(name_file);
    if let Some(p) = ring {
        let _ = fs::remove_file(p);
    }
}

/// Reads the records past LSN `end` that the ring named in `dir` holds (module docs); none
/// if there is no ring, or it belongs to another directory or is damaged.
///
/// # Errors
/// `Io` if the named ring exists but cannot be read.
pub(super) fn leftover(dir: &Path, end: Lsn) -> Result<Leftover> {
    let name_file = dir.join(NAME_FILE);
    let mut left = Leftover {
        records: Vec::new(),
        path: None,
        name_file,
    };
    let Ok(name) = fs::read(&left.name_file) else {
        return Ok(left);
    };
    let path = PathBuf::from(String::from_utf8_lossy(&name).into_owned());
    let ours = path.parent() == Some(Path::new(SHM_DIR))
        && path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(PREFIX));
    if !ours {
        return Ok(left);
    }
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(left),
        Err(e) => return Err(Error::io(&path, e)),
    };
    let mut hb = [0u8; HEADER_LEN];
    if file.read_exact_at(&mut hb, 0).is_err() {
        return Ok(left);
    }
    let Some(h) = RingHeader::decode(&hb) else {
        return Ok(left);
    };
    if dir_identity(dir).map_err(|e| Error::io(dir, e))? != (h.dev, h.ino) {
        // Another directory's ring (this one is a copy): not ours to read or remove.
        return Ok(left);
    }
    left.path = Some(path.clone());
    let mut data = vec![0u8; h.capacity as usize];
    match file.read_exact_at(&mut data, h.data_offset) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(left),
        Err(e) => return Err(Error::io(&path, e)),
    }
    // The ring's bytes from position `end` on, in order.
    data.rotate_left((end % h.capacity) as usize);
    let header = SegmentHeader {
        segment_size: HEADER_SIZE + h.capacity,
        first_lsn: end,
    };
    let scan = format::scan_records(&mut &data[..], &header, &path, |_, _| Ok(()))?;
    data.truncate((scan.end_offset - HEADER_SIZE) as usize);
    left.records = data;
    Ok(left)
}

#[cfg(all(test, not(shuttle)))]
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

    #[test]
    fn a_ring_left_behind_gives_back_its_records_past_the_segments_end() {
        let dir = tempfile::tempdir().expect("tempdir");
        let Some(ring) = StagingRing::create(dir.path(), 4096, 10_000) else {
            eprintln!("no tmpfs at {SHM_DIR}: skipped");
            return;
        };
        // Wrap around the ring twice: only the last lap is there to read.
        let mut lsns = Vec::new();
        for i in 0..400u32 {
            let value = i.to_le_bytes();
            lsns.push(put(&ring, b"key", &value));
            ring.region
                .drain(|_, b| Ok::<_, ()>(b.len().saturating_sub(100)))
                .expect("drain");
        }
        let end = lsns[390];
        let left = leftover(dir.path(), end).expect("read");
        let mut expect = Vec::new();
        for (i, &lsn) in lsns.iter().enumerate().skip(390) {
            let value = (i as u32).to_le_bytes();
            format::encode_record(
                &mut expect,
                lsn,
                &LogOp::Insert {
                    key: b"key",
                    value: &value,
                },
            );
        }
        assert_eq!(left.records, expect);
        // A directory with another identity (a copy) does not take the ring.
        let other = tempfile::tempdir().expect("tempdir");
        fs::copy(dir.path().join(NAME_FILE), other.path().join(NAME_FILE)).expect("copy");
        assert!(leftover(other.path(), end)
            .expect("read")
            .records
            .is_empty());
        left.remove();
        assert!(!ring.path.exists() && !dir.path().join(NAME_FILE).exists());
        assert!(leftover(dir.path(), end).expect("read").records.is_empty());
    }

    #[test]
    fn damaged_or_foreign_ring_names_give_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        for name in [
            &b"/etc/passwd"[..],
            b"/dev/shm/not-a-ring",
            b"\xff\xfe",
            b"",
        ] {
            fs::write(dir.path().join(NAME_FILE), name).expect("write");
            let left = leftover(dir.path(), 0).expect("read");
            assert!(left.records.is_empty() && left.path.is_none());
        }
        let Some(ring) = StagingRing::create(dir.path(), 4096, 0) else {
            return;
        };
        put(&ring, b"k", b"v");
        // A damaged header: the ring is not trusted.
        let f = OpenOptions::new()
            .write(true)
            .open(&ring.path)
            .expect("open");
        f.write_all_at(&[0xee], 20).expect("damage");
        assert!(leftover(dir.path(), 0).expect("read").records.is_empty());
        ring.remove();
    }

    #[test]
    fn header_round_trips_and_rejects_damage() {
        let h = RingHeader {
            capacity: 1 << 20,
            data_offset: 4096,
            dev: 7,
            ino: 9,
            nonce: 0xabc,
        };
        let b = h.encode();
        assert_eq!(RingHeader::decode(&b), Some(h));
        for i in 0..60 {
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
