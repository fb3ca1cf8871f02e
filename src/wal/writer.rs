//! The writing side of the log: moves records from the append buffer (`Sync`) or the
//! staging ring (`Buffered`, `wal::ring`) into segment files with `pwrite`, switching to a
//! new segment when the next record does not fit.

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
    /// Bytes taken from the staging ring and written.
    pub(super) ring_bytes: u64,
    /// The end of the furthest write attempted in the active segment, failed ones
    /// included: where a cut must zero up to (`Writer::cut`).
    pub(super) dirty_to: u64,
}

impl Writer {
    /// Writes every buffered record, then every record published in the staging ring, to
    /// the segments.
    pub(super) fn write_out(&mut self, s: &Shared) -> Result<()> {
        // After a failure nothing more reaches the segments: what follows the cut stays cut.
        s.check_failed()?;
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
        let inflight = std::mem::take(&mut self.inflight);
        let (n, res) = self.write_records(s, &inflight[self.done..]);
        self.inflight = inflight;
        self.done += n;
        res?;
        if let Some(ring) = s.ring.get() {
            let mut failed = None;
            // Bytes stay in the ring until written: a failed write is retried from there.
            ring.region
                .drain(|at, bytes| {
                    if at != self.end {
                        failed = Some(Error::InvalidConfig {
                            reason: "staging ring out of step with the log",
                        });
                        return Ok::<_, ()>(0);
                    }
                    let (n, res) = self.write_records(s, bytes);
                    self.ring_bytes += n as u64;
                    failed = res.err();
                    Ok(n)
                })
                .unwrap_or(0);
            if let Some(e) = failed {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Writes whole records from the front of `bytes` (which start at LSN `end`) to the
    /// segments, switching to a new segment when the next record does not fit; returns how
    /// many bytes it wrote and the error that stopped it, if one did.
    fn write_records(&mut self, s: &Shared, bytes: &[u8]) -> (usize, Result<()>) {
        let mut at = 0;
        while at < bytes.len() {
            let rest = &bytes[at..];
            let room = self.segment_size.saturating_sub(self.offset);
            let n = if rest.len() as u64 <= room {
                rest.len()
            } else {
                format::fitting_prefix(rest, room)
            };
            if n > 0 {
                let path = self.active_path();
                self.dirty_to = self.dirty_to.max(self.offset + n as u64);
                if let Err(e) = self.file.write_all_at(&rest[..n], self.offset) {
                    return (at, Err(s.fail(self, Error::io(path, e))));
                }
                self.writes += 1;
                self.offset += n as u64;
                self.end += n as u64;
                at += n;
                s.written.fetch_max(self.end, Ordering::AcqRel);
            }
            if at < bytes.len() {
                if let Err(e) = self.next_segment(s) {
                    return (at, Err(s.fail(self, e)));
                }
            }
        }
        (at, Ok(()))
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
        self.file.sync_data().map_err(|e| Error::io(&path, e))?;
        s.syncs.fetch_add(1, Ordering::Relaxed);
        let (seg, file) = segment::create_segment(&*s.fs, &s.dir, self.end, s.config.segment_size)?;
        self.segments.push(seg);
        self.file = file;
        self.segment_size = s.config.segment_size;
        self.offset = HEADER_SIZE;
        self.dirty_to = HEADER_SIZE;
        Ok(())
    }

    /// Cuts the log at `cut` after a failure (`Shared::fail`): removes the segments that
    /// start past it, newest first (a crash midway leaves a contiguous log), and zeroes the
    /// rest of the one holding it, so that no record from `cut` on is replayed at the next
    /// open, whether or not the machine restarts first.
    ///
    /// # Errors
    /// `Io` if a removal, the zeroing or its sync fails: records past the cut may then
    /// come back at the next open.
    pub(super) fn cut(&mut self, s: &Shared, cut: Lsn) -> Result<()> {
        let keep = self
            .segments
            .partition_point(|seg| seg.first_lsn <= cut)
            .max(1);
        let holder = self.segments[keep - 1].clone();
        let from = HEADER_SIZE + cut.saturating_sub(holder.first_lsn);
        let to = match self.segments.get(keep) {
            // A full segment: its records end where the next one's start.
            Some(next) => HEADER_SIZE + (next.first_lsn - holder.first_lsn),
            None => self.dirty_to.max(self.offset),
        };
        let later: Vec<Segment> = self.segments[keep..].iter().rev().cloned().collect();
        // A segment whose creation failed half way is in no list: it would start past the
        // cut, after a gap.
        if self.end != holder.first_lsn && !later.iter().any(|seg| seg.first_lsn == self.end) {
            let stray = Segment {
                first_lsn: self.end,
                path: s.dir.join(segment::segment_name(self.end)),
            };
            segment::remove_segment(&*s.fs, &s.dir, &stray)?;
        }
        for seg in &later {
            segment::remove_segment(&*s.fs, &s.dir, seg)?;
            self.segments.pop();
        }
        if !later.is_empty() {
            self.file =
                s.fs.open(&holder.path, false)
                    .map_err(|e| Error::io(&holder.path, e))?;
        }
        if to > from {
            self.file
                .zero_range(from, to - from)
                .and_then(|()| self.file.sync_data())
                .map_err(|e| Error::io(&holder.path, e))?;
        }
        self.offset = from;
        self.dirty_to = from;
        self.end = cut;
        Ok(())
    }
}
