//! [`Wal`]: the append buffer, the writer with its segments, group commit, the background
//! flusher, replay and segment release.

use std::io::{self, BufReader};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::format::{self, HEADER_SIZE};
use super::ring::{self, StagingRing};
use super::segment::{self, Segment, SCAN_BUFFER};
use super::vfs::{LogFs, Reader};
use super::writer::Writer;
use super::{Appended, LogOp, Lsn, ReplayStats, WalConfig, WalStats};
use crate::error::{Error, Result};
use crate::sync::{thread, Arc, AtomicBool, AtomicU64, Mutex, Ordering};
use crate::Durability;

/// Past this many buffered bytes, `append` writes them out itself, so a writer that never
/// commits cannot grow the buffer without bound.
const BUFFER_LIMIT: usize = 8 << 20;

/// Spins on an unpublished earlier record before yielding the processor to its writer.
const PUBLISH_SPINS: u32 = 64;

/// Most yields a group-commit leader makes while more records keep arriving.
const GATHER_YIELDS: u32 = 4;

mod commit;

/// The write-ahead log of one tree. `Send + Sync`; every method takes `&self`.
#[derive(Debug)]
pub(crate) struct Wal {
    /// State shared with the background flusher.
    shared: Arc<Shared>,
    /// The background flusher (`Buffered` only), until `close` joins it.
    flusher: Mutex<Option<thread::JoinHandle<()>>>,
}

/// Everything the appenders, committers and the flusher share.
#[derive(Debug)]
pub(super) struct Shared {
    /// The log directory.
    pub(super) dir: PathBuf,
    /// The file layer the segments live on.
    pub(super) fs: Arc<dyn LogFs>,
    /// The configuration.
    pub(super) config: WalConfig,
    /// Records appended but not yet taken by the writer.
    pub(super) pending: Mutex<Pending>,
    /// The segments and the file position; held while writing.
    pub(super) writer: Mutex<Writer>,
    /// Where `Buffered` appends go, set once at open when a ring could be made (`ring`);
    /// without one, they go through the append buffer and their commit writes them out.
    pub(super) ring: OnceLock<StagingRing>,
    /// Group-commit state: who leads, who waits.
    group: Mutex<Group>,
    /// The LSN the next append through the append buffer gets (moved under its lock).
    /// Once the staging ring is set, its cursor is the next LSN instead
    /// (`Shared::next_lsn`).
    pub(super) appended: AtomicU64,
    /// The next LSN as the flusher last saw it (`Wal::bytes_since`).
    seen_next: AtomicU64,
    /// Every record below this LSN is written to the segments (records in the staging ring
    /// reached the OS too: `Shared::written_lsn` counts those).
    pub(super) written: AtomicU64,
    /// Every record below this LSN is on stable storage.
    synced: AtomicU64,
    /// Set when a write or sync of the log failed (`Shared::fail`): the log was cut at the
    /// last acknowledged record and takes nothing more; every commit fails from then on.
    /// (After a failed `fdatasync` the kernel may have dropped the dirty pages, so no
    /// later sync could vouch for them anyway.)
    failed: Mutex<Option<(PathBuf, io::ErrorKind)>>,
    /// Quick check of `failed`.
    is_failed: AtomicBool,
    /// Why recovery cut the tail at open, if it did.
    torn_tail: Option<&'static str>,
    /// Asks the flusher to stop.
    stop: AtomicBool,
    /// `fdatasync` calls.
    pub(super) syncs: AtomicU64,
    /// The LSN of the last synced mark written into the segment header
    /// (`segment::MARK_EVERY`).
    marked: AtomicU64,
    /// Synced marks written: picks the header slot of the next one.
    pub(super) marks: AtomicU64,
    /// The side file of synced marks (`segment::SIDE_FILE`), written at every sync.
    pub(super) side: Arc<dyn super::vfs::LogFile>,
    /// Marks written to the side file: picks its slot for the next one.
    pub(super) side_marks: AtomicU64,
}

/// Group-commit state.
#[derive(Debug)]
struct Group {
    /// A leader is writing and syncing.
    leading: bool,
    /// Committers parked until the current leader is done.
    waiters: Vec<thread::Thread>,
}

/// The append buffer.
#[derive(Debug)]
pub(super) struct Pending {
    /// Encoded records, back to back, starting at the writer's `end`.
    pub(super) bytes: Vec<u8>,
    /// Records appended since open.
    appends: u64,
    /// Record bytes appended since open.
    bytes_appended: u64,
}

impl Pending {
    /// Encodes `op` (of `len` bytes) at `lsn` at the end of the buffer.
    fn buffer(&mut self, lsn: Lsn, op: &LogOp<'_>, len: u64) {
        format::encode_record(&mut self.bytes, lsn, op);
        self.appends += 1;
        self.bytes_appended += len;
    }
}

impl Wal {
    /// Opens the log in `dir` (creating it), positioned after the last valid record; a torn
    /// or corrupt tail is cut at the last valid record.
    ///
    /// # Errors
    /// `InvalidConfig` for a bad configuration, `Io` on file errors, `Corruption` for a
    /// damaged segment before the tail.
    #[cfg(any(test, fuzzing, bfkv_internals))]
    pub(crate) fn open(dir: &Path, config: WalConfig) -> Result<Wal> {
        Wal::open_on(Arc::new(super::vfs::StdFs), dir, config)
    }

    /// [`Wal::open`] on the file layer `fs` (the power-cut tests pass an in-memory one).
    ///
    /// # Errors
    /// As [`Wal::open`].
    pub(crate) fn open_on(fs: Arc<dyn LogFs>, dir: &Path, config: WalConfig) -> Result<Wal> {
        if !(format::MIN_SEGMENT_SIZE..=format::MAX_SEGMENT_SIZE).contains(&config.segment_size) {
            return Err(Error::InvalidConfig {
                reason: "log segment size must be between 4 KiB and 4 GiB",
            });
        }
        if config.durability == Durability::None {
            return Err(Error::InvalidConfig {
                reason: "a write-ahead log needs Durability::Sync or Durability::Buffered",
            });
        }
        if config.flush_interval.is_zero() {
            return Err(Error::InvalidConfig {
                reason: "log flush interval must be positive",
            });
        }
        let rec = segment::recover(&*fs, dir, config.segment_size)?;
        let end = rec.end_lsn;
        // Whatever this log's durability: an earlier `Buffered` one may have left a ring.
        let left = if fs.stages_in_memory() {
            Some(ring::leftover(dir, end)?)
        } else {
            None
        };
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            fs,
            pending: Mutex::new(Pending {
                bytes: Vec::new(),
                appends: 0,
                bytes_appended: 0,
            }),
            writer: Mutex::new(Writer {
                segments: rec.segments,
                file: rec.file,
                segment_size: rec.segment_size,
                offset: rec.offset,
                end,
                inflight: Vec::new(),
                done: 0,
                writes: 0,
                ring_bytes: 0,
                dirty_to: rec.offset,
            }),
            ring: OnceLock::new(),
            group: Mutex::new(Group {
                leading: false,
                waiters: Vec::new(),
            }),
            // Recovery synced the tail it kept, and older segments were synced when filled.
            appended: AtomicU64::new(end),
            seen_next: AtomicU64::new(end),
            written: AtomicU64::new(end),
            synced: AtomicU64::new(end),
            failed: Mutex::new(None),
            is_failed: AtomicBool::new(false),
            torn_tail: rec.torn_tail,
            stop: AtomicBool::new(false),
            syncs: AtomicU64::new(0),
            marked: AtomicU64::new(end),
            marks: AtomicU64::new(rec.marks),
            side: rec.side,
            side_marks: AtomicU64::new(rec.side_marks),
            config,
        });
        if let Some(left) = left {
            shared.take_leftover(&left)?;
            let start = shared.appended.load(Ordering::Acquire);
            let capacity = match shared.config.durability {
                Durability::Buffered => shared.config.ring_capacity,
                _ => 0,
            };
            if let Some(r) = StagingRing::create(dir, capacity, start)? {
                let _ = shared.ring.set(r);
            }
        }
        let flusher = match shared.config.durability {
            Durability::Buffered => {
                let s = shared.clone();
                let handle = thread::Builder::new()
                    .name("bfkv-wal-flusher".into())
                    .spawn(move || s.flush_loop())
                    .map_err(|e| Error::io(dir, e))?;
                Some(handle)
            }
            _ => None,
        };
        Ok(Wal {
            shared,
            flusher: Mutex::new(flusher),
        })
    }

    /// Calls `apply` for every valid record with LSN >= `from`, in order (recovery replay).
    /// Call it before the first append. If `from` is past the end of the log (the checkpoint
    /// holds everything the log had, and the log lost its tail), the log restarts at `from`
    /// so that later records are not mistaken for ones the checkpoint already holds.
    ///
    /// # Errors
    /// `Io`, `Corruption` (a segment damaged since open, or the log starts after `from`:
    /// records the checkpoint needs are gone), or the first error `apply` returns.
    pub(crate) fn replay(
        &self,
        from: Lsn,
        mut apply: impl FnMut(Lsn, LogOp<'_>) -> Result<()>,
    ) -> Result<ReplayStats> {
        let s = &self.shared;
        let (segments, end) = {
            // Staged records into the segments first: replay reads the segments.
            let mut w = s.writer.lock();
            w.write_out(s)?;
            (w.segments.clone(), w.end)
        };
        let mut stats = ReplayStats {
            end_lsn: end,
            ..ReplayStats::default()
        };
        if from > end {
            self.restart_at(from)?;
            stats.end_lsn = from;
            return Ok(stats);
        }
        let first = segments.first().map_or(end, |seg| seg.first_lsn);
        if from < first {
            return Err(Error::corruption(
                &s.dir,
                None,
                "the log starts after the LSN replay must start from",
            ));
        }
        // The segment holding `from` is the last one starting at or before it.
        let start = segments
            .partition_point(|seg| seg.first_lsn <= from)
            .saturating_sub(1);
        for (i, seg) in segments.iter().enumerate().skip(start) {
            let until = segments.get(i + 1).map_or(end, |next| next.first_lsn);
            let file =
                s.fs.open(&seg.path, false)
                    .map_err(|e| Error::io(&seg.path, e))?;
            let mut r = BufReader::with_capacity(SCAN_BUFFER, Reader::new(file));
            let header = format::read_header(&mut r, &seg.path)?
                .map_err(|reason| Error::corruption(&seg.path, None, reason))?;
            stats.segments += 1;
            let scan = format::scan_records(&mut r, &header, &seg.path, |lsn, op| {
                if lsn >= until {
                    // Written after replay started: not part of what is recovered.
                    return Ok(());
                }
                if lsn < from {
                    stats.skipped += 1;
                    return Ok(());
                }
                stats.applied += 1;
                apply(lsn, op)
            })?;
            if scan.end_lsn < until {
                return Err(Error::corruption(
                    &seg.path,
                    None,
                    "log segment damaged after it was opened",
                ));
            }
        }
        Ok(stats)
    }

    /// Starts the log afresh at `lsn`, which is past every record it holds: old segments go
    /// first (oldest first, so a crash leaves a contiguous suffix or nothing), then the new
    /// segment is created.
    fn restart_at(&self, lsn: Lsn) -> Result<()> {
        let s = &self.shared;
        let mut w = s.writer.lock();
        let pending = s.pending.lock();
        let ring_used = s.ring.get().is_some_and(|r| r.region.cursor() != w.end);
        if !pending.bytes.is_empty() || w.done < w.inflight.len() || ring_used {
            return Err(Error::InvalidConfig {
                reason: "replay must run before the first append",
            });
        }
        while let Some(seg) = w.segments.first().cloned() {
            segment::remove_segment(&*s.fs, &s.dir, &seg)?;
            w.segments.remove(0);
        }
        let (seg, file) = segment::create_segment(&*s.fs, &s.dir, lsn, s.config.segment_size)?;
        w.segments.push(seg);
        w.file = file;
        w.segment_size = s.config.segment_size;
        w.offset = HEADER_SIZE;
        w.dirty_to = HEADER_SIZE;
        w.end = lsn;
        s.appended.store(lsn, Ordering::Release);
        // Max, not store: a sync of the old segment may still be finishing.
        s.written.fetch_max(lsn, Ordering::AcqRel);
        s.synced.fetch_max(lsn, Ordering::AcqRel);
        if let Some(r) = s.ring.get() {
            r.region.restart(lsn);
        }
        Ok(())
    }

    /// Reserves the next LSN and copies the record into the staging ring (`Buffered`, when
    /// there is one: no lock, and the record has reached the OS on return) or else into the
    /// log buffer. No system call unless the ring is full, the buffer passed `BUFFER_LIMIT`
    /// (a writer that does not commit) or a segment filled up.
    ///
    /// # Errors
    /// `KeyTooLarge`/`ValueTooLarge` if the record cannot fit in a segment (or the ring);
    /// `Io` if an earlier sync of the log failed (the log is unusable), or writing out a
    /// full ring failed.
    pub(crate) fn append(&self, op: LogOp<'_>) -> Result<Appended> {
        let s = &self.shared;
        s.check_failed()?;
        if s.stop.load(Ordering::Relaxed) {
            return Err(Error::InvalidConfig {
                reason: "the log is closed",
            });
        }
        let len = format::record_len(&op);
        let ring = s.ring.get();
        let room = (s.config.segment_size - HEADER_SIZE)
            .min(ring.map_or(u64::MAX, |r| r.region.capacity()));
        if len > room {
            let (key, value_len) = match op {
                LogOp::Insert { key, value }
                | LogOp::Merge {
                    key,
                    operands: value,
                } => (key, value.len()),
                LogOp::Remove { key } => (key, 0),
                LogOp::Batch { body } => {
                    return Err(Error::BatchTooLarge {
                        len: body.len(),
                        limit: format::max_value_len(room, 0).unwrap_or(0) as usize,
                    })
                }
            };
            return Err(match format::max_value_len(room, key.len() as u64) {
                Some(limit) => Error::ValueTooLarge {
                    len: value_len,
                    limit: limit as usize,
                },
                None => Error::KeyTooLarge {
                    len: key.len(),
                    limit: format::max_key_len(room) as usize,
                },
            });
        }
        if let Some(ring) = ring {
            return Ok(Appended {
                lsn: s.append_staged(ring, &op, len)?,
                reached_os: true,
            });
        }
        let (lsn, buffered) = {
            let mut p = s.pending.lock();
            let lsn = s.appended.load(Ordering::Acquire);
            p.buffer(lsn, &op, len);
            s.appended.store(lsn + len, Ordering::Release);
            (lsn, p.bytes.len())
        };
        if buffered > BUFFER_LIMIT {
            s.write_to(lsn + len)?;
        }
        Ok(Appended {
            lsn,
            reached_os: false,
        })
    }

    /// Waits until the record at `lsn` is durable per the configured durability: `Buffered`,
    /// it reached the OS; `Sync`, it is `fdatasync`ed, sharing one sync with every record
    /// appended meanwhile. Call it without holding a page lock.
    ///
    /// # Errors
    /// `Io` if writing or syncing the log failed.
    pub(crate) fn commit(&self, appended: Appended) -> Result<()> {
        let s = &self.shared;
        if appended.reached_os && s.config.durability == Durability::Buffered {
            return Ok(());
        }
        let lsn = appended.lsn;
        // Records are at least 7 bytes and written whole, so a durable end past
        // `lsn` covers the whole record; an LSN never appended is clamped, not waited for.
        let target = (lsn + 1).min(s.next_lsn());
        match s.config.durability {
            Durability::Sync => s.sync_to(target),
            _ => s.write_to(target),
        }
    }

    /// Makes every appended record durable (`fdatasync`), whatever the mode.
    ///
    /// # Errors
    /// `Io` if writing or syncing the log failed.
    pub(crate) fn flush(&self) -> Result<()> {
        let s = &self.shared;
        s.check_failed()?;
        let next = s.acknowledged_end();
        s.seen_next.fetch_max(next, Ordering::Relaxed);
        s.sync_to(next)
    }

    /// Makes every record below `lsn` durable (`fdatasync`), whatever the mode: a
    /// checkpoint calls it for the records of the writes its pages hold, so that none of
    /// them can fail after the checkpoint made it permanent.
    ///
    /// # Errors
    /// `Io` if writing or syncing the log failed, now or earlier.
    pub(crate) fn sync_through(&self, lsn: Lsn) -> Result<()> {
        let s = &self.shared;
        s.check_failed()?;
        s.sync_to(lsn.min(s.next_lsn()))
    }

    /// Fails if a write or sync of the log failed since open: the log was cut at its
    /// acknowledged end, and the tree must not show or keep the writes past it.
    ///
    /// # Errors
    /// `Io` naming the file of the first failure.
    #[inline]
    pub(crate) fn check(&self) -> Result<()> {
        self.shared.check_failed()
    }

    /// The LSN the next append will get.
    pub(crate) fn next_lsn(&self) -> Lsn {
        self.shared.next_lsn()
    }

    /// Deletes the segments that hold only records below `lsn` (call it once a checkpoint
    /// covering them is durable). The active segment always stays.
    ///
    /// # Errors
    /// `Io` if a file cannot be removed; the segments not yet removed stay in use.
    pub(crate) fn release_before(&self, lsn: Lsn) -> Result<()> {
        let s = &self.shared;
        let victims: Vec<Segment> = {
            let mut w = s.writer.lock();
            let n = w.segments.partition_point(|seg| seg.first_lsn <= lsn);
            // Segment i ends where segment i + 1 starts; keep the one holding `lsn`.
            let n = n.saturating_sub(1).min(w.segments.len() - 1);
            w.segments.drain(..n).collect()
        };
        for (i, seg) in victims.iter().enumerate() {
            if let Err(e) = segment::remove_segment(&*s.fs, &s.dir, seg) {
                let mut w = s.writer.lock();
                let rest = victims[i..].iter().cloned();
                w.segments.splice(0..0, rest);
                return Err(e);
            }
        }
        Ok(())
    }

    /// The paths of the log's segment files, oldest first (a backup copies them). Only
    /// the last may still change: the others are complete and never written again.
    pub(crate) fn segment_paths(&self) -> Vec<std::path::PathBuf> {
        let w = self.shared.writer.lock();
        w.segments.iter().map(|seg| seg.path.clone()).collect()
    }

    /// The file layer the log (and the checkpoint beside it) lives on.
    pub(crate) fn fs(&self) -> &Arc<dyn LogFs> {
        &self.shared.fs
    }

    /// Bytes of log records since `lsn`, give or take those appended since the last flush
    /// or background sync. For the automatic checkpoint trigger: every write asks, so this
    /// reads two atomics and pins nothing.
    pub(crate) fn bytes_since(&self, lsn: Lsn) -> u64 {
        let s = &self.shared;
        let next = s
            .appended
            .load(Ordering::Relaxed)
            .max(s.seen_next.load(Ordering::Relaxed));
        next.saturating_sub(lsn)
    }

    /// Every record below this LSN is durable per the configured durability.
    #[cfg(test)]
    pub(crate) fn durable_lsn(&self) -> Lsn {
        let s = &self.shared;
        match s.config.durability {
            Durability::Sync => s.synced.load(Ordering::Acquire),
            _ => s.written_lsn(),
        }
    }

    /// Counters since open.
    pub(crate) fn stats(&self) -> WalStats {
        let s = &self.shared;
        let w = s.writer.lock();
        let p = s.pending.lock();
        let ring = s.ring.get();
        WalStats {
            appends: p.appends + ring.map_or(0, |r| r.region.published()),
            bytes: p.bytes_appended
                + w.ring_bytes
                + ring.map_or(0, |r| r.region.done() - r.region.floor()),
            writes: w.writes,
            syncs: s.syncs.load(Ordering::Relaxed),
            segments: w.segments.len() as u64,
            torn_tail: s.torn_tail,
        }
    }
}

impl Wal {
    /// Closes the log: stops the flusher, syncs every record and the synced mark, and
    /// removes the staging ring's file; later appends fail. Call it before the directory
    /// lock is released, so that nothing of this log touches the directory once another
    /// tree may own it. Later calls (and the drop) do nothing.
    ///
    /// # Errors
    /// `Io` if the final sync fails; the ring file then stays for the next open to read.
    pub(crate) fn close(&self) -> Result<()> {
        if self.shared.stop.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        if let Some(h) = self.flusher.lock().take() {
            h.thread().unpark();
            // A panicked flusher has nothing left to clean up.
            let _ = h.join();
        }
        // The ring goes only once its records are synced: else the next open reads them.
        self.flush()?;
        self.shared.mark_closed()?;
        if let Some(ring) = self.shared.ring.get() {
            ring.remove();
        }
        Ok(())
    }
}

impl Drop for Wal {
    fn drop(&mut self) {
        // Errors have no one to go to here; `close` reports them to those who call it.
        let _ = self.close();
    }
}
