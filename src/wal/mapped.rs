//! Lock-free `Buffered` appends. The active segment is mapped whole into an
//! [`AppendRegion`] whose positions stand for LSNs (see below): an append reserves its
//! record's bytes with one
//! compare-and-swap, encodes the record straight into the mapping (so it has reached the
//! OS: a crash of the process keeps the page cache) and publishes it. Publishing waits for
//! the writers of earlier records, which are copying at that moment; so when an append
//! returns, every record before it is in the file too, and recovery, which stops at the
//! first record that is not there, finds every acknowledged one.
//!
//! The region's positions are LSNs plus `HEADER_SIZE`, so that the first segment's header
//! (before LSN 0) has positions too: file offset `o` of the segment starting at LSN `f` is
//! position `f + o`.
//!
//! A record that does not fit in the rest of the segment seals the region: no more
//! reservations, and once the records reserved before are published, the writer (under its
//! lock) takes over at the region's end, syncs the full segment and starts the next one,
//! which is mapped in turn. A segment the file layer cannot map is written through the
//! append buffer with `pwrite`, as under `Sync`; a later segment is tried again.
//!
//! Before each background sync, the pages every writer is done with are dropped from the
//! page tables (`AppendRegion::release_below`): the sync then write-protects almost no
//! mapped page, where each one costs every core of the process a TLB-flush interrupt.

use std::path::PathBuf;

use super::format::{encode_record_into, HEADER_SIZE};
use super::log::Shared;
use super::vfs::LogFile;
use super::writer::Writer;
use super::{LogOp, Lsn};
use crate::error::Result;
use crate::sync::{self, AppendRegion, Arc, Ordering};

/// Spins on an unpublished earlier record before yielding the processor to its writer.
const PUBLISH_SPINS: u32 = 64;

/// How far ahead of the writers the flusher maps the segment's pages: more than the
/// records of one flush interval (at ~2.5M records/s of 39 bytes, 5 ms is ~500 KiB).
const PREFAULT_AHEAD: u64 = 4 << 20;

/// The mapped active segment.
#[derive(Debug)]
pub(super) struct Active {
    /// The mapping; positions are LSNs plus `HEADER_SIZE` (module docs).
    region: AppendRegion,
    /// The segment file (what the background sync syncs).
    pub(super) file: Arc<dyn LogFile>,
    /// Its path, for errors.
    pub(super) path: PathBuf,
    /// LSN of the segment's first record (identifies the segment).
    pub(super) first_lsn: Lsn,
    /// Where the region's free part started (a position): bytes appended through it are
    /// `cursor - start`.
    start: u64,
}

impl Active {
    /// Bytes appended through this region.
    pub(super) fn bytes(&self) -> u64 {
        self.region.cursor() - self.start
    }

    /// Records appended through this region.
    pub(super) fn records(&self) -> u64 {
        self.region.published()
    }

    /// Every record below this LSN is in the segment.
    fn done_lsn(&self) -> Lsn {
        self.region.done() - HEADER_SIZE
    }

    /// The LSN the next record appended here gets.
    fn next_lsn(&self) -> Lsn {
        self.region.cursor() - HEADER_SIZE
    }
}

impl Shared {
    /// Appends `op` (of `len` bytes) through the mapped active segment; `None` when the
    /// active segment is not mapped (the caller uses the append buffer). Returns once the
    /// record and every record before it are in the file.
    ///
    /// # Errors
    /// `Io` if the segment switch this append needed failed.
    pub(super) fn append_mapped(&self, op: &LogOp<'_>, len: u64) -> Result<Option<Lsn>> {
        loop {
            let guard = sync::pin();
            let Some(active) = self.active.load(&guard) else {
                return Ok(None);
            };
            if let Some(slot) = active.region.reserve(len) {
                let (start, end) = (slot.start, slot.end);
                let lsn = start - HEADER_SIZE;
                encode_record_into(slot.bytes, lsn, op);
                let mut spins = 0u32;
                while !active.region.publish(start, end) {
                    // An earlier record's writer is between its reservation and its publish.
                    spins += 1;
                    if spins < PUBLISH_SPINS {
                        sync::spin_hint();
                    } else {
                        sync::yield_now();
                    }
                }
                return Ok(Some(lsn));
            }
            // Full, or sealed by another append switching segments.
            let first = active.first_lsn;
            drop(guard);
            self.switch_full(first)?;
        }
    }

    /// Every record below this LSN reached the OS (mapped or written).
    pub(super) fn written_lsn(&self) -> Lsn {
        let guard = sync::pin();
        // The region first: a segment switch raises `written` to the region's end before it
        // takes the region down, so `written`, read after, covers whatever region this saw
        // (or the lack of one).
        let mapped = self
            .active
            .load(&guard)
            .as_ref()
            .map_or(0, Active::done_lsn);
        mapped.max(self.written.load(Ordering::Acquire))
    }

    /// The LSN the next append gets.
    pub(super) fn next_lsn(&self) -> Lsn {
        let guard = sync::pin();
        match self.active.load(&guard) {
            Some(a) => a.next_lsn(),
            None => self.appended.load(Ordering::Acquire),
        }
    }

    /// Ends the mapped segment starting at `first` (an append found it full): seals it,
    /// waits for the records reserved in it, and moves to the next segment, mapped if it
    /// can be. Nothing if another append already did.
    fn switch_full(&self, first: Lsn) -> Result<()> {
        let mut w = self.writer.lock();
        let guard = sync::pin();
        let Some(active) = self.active.load(&guard) else {
            return Ok(());
        };
        if active.first_lsn != first {
            return Ok(());
        }
        let sealed = active.region.seal();
        while active.region.done() < sealed {
            sync::yield_now();
        }
        let end = sealed - HEADER_SIZE;
        w.end = end;
        w.offset = HEADER_SIZE + (end - first);
        w.mapped_bytes += active.bytes();
        w.mapped_appends += active.records();
        {
            // Under the append-buffer lock, so no append can buffer a record between the
            // region's end and the writer taking over there.
            let _p = self.pending.lock();
            self.appended.store(end, Ordering::Release);
            self.written.fetch_max(end, Ordering::AcqRel);
            self.active.replace(None, &guard);
        }
        drop(guard);
        w.next_segment(self)?;
        self.activate(&mut w);
        Ok(())
    }

    /// Maps the writer's active segment for lock-free appends, if it can be and nothing is
    /// waiting in the append buffer (its records go first; the next write-out tries again).
    /// Call with the writer lock held.
    pub(super) fn activate(&self, w: &mut Writer) {
        if !w.mappable || w.done < w.inflight.len() {
            return;
        }
        let Some(seg) = w.segments.last() else { return };
        let (first, path) = (seg.first_lsn, seg.path.clone());
        let p = self.pending.lock();
        let guard = sync::pin();
        if !p.bytes.is_empty() || self.active.load(&guard).is_some() {
            return;
        }
        let Some(map) = w.file.map(0, w.segment_size) else {
            w.mappable = false;
            return;
        };
        // File offset 0 is position `first` (module docs).
        let start = w.end + HEADER_SIZE;
        let region = AppendRegion::new(map, first, start);
        self.active.replace(
            Some(Active {
                region,
                file: w.file.clone(),
                path,
                first_lsn: first,
                start,
            }),
            &guard,
        );
    }

    /// Stops lock-free appends (before the log restarts at another LSN). Call with the
    /// writer and append-buffer locks held, before any append.
    pub(super) fn deactivate(&self) -> bool {
        let guard = sync::pin();
        match self.active.load(&guard) {
            Some(a) if a.bytes() > 0 => false,
            Some(_) => {
                self.active.replace(None, &guard);
                true
            }
            None => true,
        }
    }

    /// Maps the pages the next `PREFAULT_AHEAD` bytes of records will go to, ahead of the
    /// writers (`AppendRegion::prefault`). The background flusher calls it after each sync.
    pub(super) fn prefault_ahead(&self) {
        let guard = sync::pin();
        if let Some(a) = self.active.load(&guard) {
            let at = a.region.cursor();
            a.region.prefault(at, at + PREFAULT_AHEAD);
        }
    }

    /// What a background sync of a mapped segment covers: the segment file, its path, and
    /// the LSN below which every record is in it. Drops the pages below that LSN from the
    /// page tables first (module docs). `None` when no segment is mapped.
    pub(super) fn mapped_sync_target(&self) -> Option<(Arc<dyn LogFile>, PathBuf, Lsn)> {
        let guard = sync::pin();
        let a = self.active.load(&guard).as_ref()?;
        a.region.release_below(a.region.done());
        Some((a.file.clone(), a.path.clone(), a.done_lsn()))
    }
}
