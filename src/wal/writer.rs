//! The writing side of the log: moves buffered records into segment files, switching to a
//! new segment when the next record does not fit. Under `Buffered`, a segment the file layer
//! can map is written with a copy into the mapping (no system call; see `vfs`); anything
//! else with `pwrite`.

use std::path::PathBuf;

use memmap2::MmapMut;

use super::format::{self, HEADER_SIZE};
use super::log::Shared;
use super::segment::{self, Segment};
use super::vfs::{LogFile, MAP_ALIGN};
use super::Lsn;
use crate::error::{Error, Result};
use crate::sync::{Arc, Ordering};

/// Bytes of the active segment mapped at a time, the smallest window `MAP_ALIGN` allows.
/// A background sync write-protects every dirty page still mapped, one TLB-shootdown
/// interrupt of the writing threads per page; pages of a window already left are unmapped
/// and cost nothing. With 1 MiB windows nearly every page synced was still mapped:
/// 64 KiB windows took YCSB-A in memory under `Buffered`, 1 thread, from 0.77 to 0.81 of
/// `None` (`examples/durability.rs ycsb 1`), and made the flush interval's cost vanish
/// (5 ms and 50 ms alike). Each window's `mmap` is still shared by ~1,000 records.
const MAP_WINDOW: u64 = 1 << 16;

/// A mapped part of the active segment.
#[derive(Debug)]
pub(crate) struct Window {
    /// Its file offset (a multiple of `MAP_ALIGN`).
    start: u64,
    /// The mapping.
    bytes: MmapMut,
}

/// The writing side: segments and where the next byte goes.
#[derive(Debug)]
pub(crate) struct Writer {
    /// Every segment, oldest first; the last is the active one.
    pub(super) segments: Vec<Segment>,
    /// The active segment (shared with a leader that syncs it outside this lock).
    pub(super) file: Arc<dyn LogFile>,
    /// The part of the active segment mapped for writing, if any (`LogFile::map`).
    pub(super) window: Option<Window>,
    /// Whether to try mapping the active segment: only under `Buffered` (under `Sync`, each
    /// `fdatasync` write-protects the mapped pages again and the next copy takes a page
    /// fault under the writer lock: measured 20-25 % fewer commits/s at 2 and 4 threads than
    /// `pwrite`), and false once `LogFile::map` refused the file, so an unmappable file
    /// costs no further attempts.
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
    /// Writes to the OS (`pwrite` calls or copies into a mapped segment). The counters live
    /// here, not in shared atomics, because every write holds this lock anyway.
    pub(super) writes: u64,
    /// Records appended straight into the mapped segment (not through the append buffer).
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
                let dst = mapped(
                    &mut self.window,
                    &mut self.mappable,
                    &*self.file,
                    self.segment_size,
                    self.offset,
                    n,
                );
                match dst {
                    Some(dst) => dst.copy_from_slice(&rest[..n]),
                    None => {
                        let path = self.active_path();
                        self.file
                            .write_all_at(&rest[..n], self.offset)
                            .map_err(|e| Error::io(path, e))?;
                    }
                }
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

    /// Where a record of `len` bytes goes if it can be written straight into the mapped
    /// active segment: nothing taken from the buffer is still unwritten (so it is the next
    /// record of the file) and the record fits in the mapped window, mapping the window if
    /// needed. `lsn` is the record's: with the append buffer empty it is the writer's end.
    /// The caller encodes into the slice, then calls [`Writer::advance`].
    pub(super) fn mapped_slot(&mut self, lsn: Lsn, len: u64) -> Option<&mut [u8]> {
        if self.done < self.inflight.len() || lsn != self.end {
            return None;
        }
        mapped(
            &mut self.window,
            &mut self.mappable,
            &*self.file,
            self.segment_size,
            self.offset,
            usize::try_from(len).ok()?,
        )
    }

    /// Accounts for a record of `len` bytes written into the slot [`Writer::mapped_slot`]
    /// returned: it reached the OS.
    pub(super) fn advance(&mut self, s: &Shared, len: u64) {
        self.writes += 1;
        self.offset += len;
        self.end += len;
        // Only writers holding this lock move `written`, and `end` never goes back.
        s.written.store(self.end, Ordering::Release);
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
    fn next_segment(&mut self, s: &Shared) -> Result<()> {
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
        // Its pages stay in the page cache, and the sync above already wrote them back.
        self.window = None;
        self.mappable = s.config.durability == crate::Durability::Buffered;
        self.file = file;
        self.segment_size = s.config.segment_size;
        self.offset = HEADER_SIZE;
        Ok(())
    }
}

/// The `n` bytes at `offset` in the active segment as mapped memory, mapping the window
/// that holds them if needed; `None` if the file cannot be mapped or they do not fit in
/// one window (then `pwrite` writes them). A function of the writer's fields it needs, not
/// a method, so the records being copied can stay borrowed.
fn mapped<'a>(
    window: &'a mut Option<Window>,
    mappable: &mut bool,
    file: &dyn LogFile,
    segment_size: u64,
    offset: u64,
    n: usize,
) -> Option<&'a mut [u8]> {
    let end = offset.checked_add(n as u64)?;
    let covered = window
        .as_ref()
        .is_some_and(|w| w.start <= offset && end <= w.start + w.bytes.len() as u64);
    if !covered {
        *window = None;
        if !*mappable {
            return None;
        }
        let start = offset - offset % MAP_ALIGN;
        let len = MAP_WINDOW.min(segment_size.saturating_sub(start));
        if end > start + len {
            return None;
        }
        match file.map(start, len) {
            Some(bytes) => *window = Some(Window { start, bytes }),
            None => {
                *mappable = false;
                return None;
            }
        }
    }
    let w = window.as_mut()?;
    let from = usize::try_from(offset - w.start).ok()?;
    w.bytes.get_mut(from..from.checked_add(n)?)
}
