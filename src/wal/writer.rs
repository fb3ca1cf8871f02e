//! The writing side of the log: moves buffered records into segment files with `pwrite`,
//! switching to a new segment when the next record does not fit. (`Buffered` appends go
//! around it, straight into the mapped active segment, whenever the segment can be mapped:
//! see `wal::mapped`.)

use std::path::PathBuf;

use super::format::{self, HEADER_SIZE};
use super::log::Shared;
use super::segment::{self, Segment};
use super::vfs::LogFile;
use super::Lsn;
use crate::error::{Error, Result};
use crate::sync::{Arc, Ordering};

/// The writing side: segments and where the next byte goes.
#[derive(Debug)]
pub(crate) struct Writer {
    /// Every segment, oldest first; the last is the active one.
    pub(super) segments: Vec<Segment>,
    /// The active segment (shared with a leader that syncs it outside this lock).
    pub(super) file: Arc<dyn LogFile>,
    /// Whether to try mapping the active segment for lock-free appends: only under
    /// `Buffered` (under `Sync`, each `fdatasync` write-protects the mapped pages again and
    /// the next copy takes a page fault: measured 20-25 % fewer commits/s at 2 and 4
    /// threads than `pwrite`), and false once `LogFile::map` refused the file, so an
    /// unmappable file costs no further attempts.
    pub(super) mappable: bool,
    /// Size of the active segment.
    pub(super) segment_size: u64,
    /// File offset of the next write in the active segment.
    pub(super) offset: u64,
    /// LSN after the last written record.
    pub(super) end: Lsn,
    /// Records taken from the buffer, written up to `done` (kept across a failed write so
    /// the next attempt writes them again at the same place).
    pub(super) inflight: Vec<u8>,
    /// How much of `inflight` is written.
    pub(super) done: usize,
    /// `pwrite` calls. The counters live here, not in shared atomics, because every write
    /// holds this lock anyway.
    pub(super) writes: u64,
    /// Records appended through mapped segments no longer active.
    pub(super) mapped_appends: u64,
    /// Bytes of those records.
    pub(super) mapped_bytes: u64,
}

impl Writer {
    /// Writes every buffered record to the segments, switching to a new segment when the
    /// next record does not fit in the active one.
    pub(super) fn write_out(&mut self, s: &Shared) -> Result<()> {
        {
            let mut p = s.pending.lock();
            if self.done == self.inflight.len() {
                self.inflight.clear();
                self.done = 0;
                // Swapping keeps both allocations alive: no copy, no reallocation.
                std::mem::swap(&mut self.inflight, &mut p.bytes);
            } else {
                self.inflight.extend_from_slice(&p.bytes);
                p.bytes.clear();
            }
        }
        while self.done < self.inflight.len() {
            let rest = &self.inflight[self.done..];
            let room = self.segment_size.saturating_sub(self.offset);
            let n = if rest.len() as u64 <= room {
                rest.len()
            } else {
                format::fitting_prefix(rest, room)
            };
            if n > 0 {
                let path = self.active_path();
                self.file
                    .write_all_at(&rest[..n], self.offset)
                    .map_err(|e| Error::io(path, e))?;
                self.writes += 1;
                self.offset += n as u64;
                self.done += n;
                self.end += n as u64;
                s.written.store(self.end, Ordering::Release);
            }
            if self.done < self.inflight.len() {
                self.next_segment(s)?;
            }
        }
        Ok(())
    }

    /// Path of the active segment.
    pub(super) fn active_path(&self) -> PathBuf {
        self.segments
            .last()
            .map(|s| s.path.clone())
            .unwrap_or_default()
    }

    /// Syncs the full active segment and starts a new one at the current end. The sync comes
    /// first so that only the last segment can ever hold a torn tail.
    pub(super) fn next_segment(&mut self, s: &Shared) -> Result<()> {
        if self.offset == HEADER_SIZE && self.segment_size >= s.config.segment_size {
            // `append` refuses records larger than a segment; this cannot loop.
            return Err(Error::InvalidConfig {
                reason: "log record larger than a segment",
            });
        }
        let path = self.active_path();
        self.file.sync_data().map_err(|e| s.fail_sync(&path, e))?;
        s.syncs.fetch_add(1, Ordering::Relaxed);
        let (seg, file) = segment::create_segment(&*s.fs, &s.dir, self.end, s.config.segment_size)?;
        self.segments.push(seg);
        self.mappable = s.config.durability == crate::Durability::Buffered;
        self.file = file;
        self.segment_size = s.config.segment_size;
        self.offset = HEADER_SIZE;
        Ok(())
    }
}
