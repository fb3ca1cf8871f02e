//! The log's shared half: group commit (one leader writes and syncs for every waiting
//! committer), the background flusher, appends into the staging ring, and the sticky record
//! of a failed write or `fdatasync`, which cuts the log at its acknowledged end.

use std::io;

use super::super::format;
use super::super::ring::{self, StagingRing};
use super::super::segment;
use super::super::writer::Writer;
use super::super::LogOp;
use super::{Lsn, Shared, GATHER_YIELDS, PUBLISH_SPINS};
use crate::error::{Error, Result};
use crate::sync::{thread, Ordering};
use crate::Durability;

impl Shared {
    /// Fails if an earlier write or sync of the log failed (`Shared::fail`).
    pub(in crate::wal) fn check_failed(&self) -> Result<()> {
        if !self.is_failed.load(Ordering::Acquire) {
            return Ok(());
        }
        let (path, kind) = self
            .failed
            .lock()
            .clone()
            .unwrap_or_else(|| (self.dir.clone(), io::ErrorKind::Other));
        Err(Error::io(
            path,
            io::Error::new(
                kind,
                "an earlier write or sync of the log failed; reopen the tree",
            ),
        ))
    }

    /// Records that a write or sync of the log failed with `err`, and returns `err`.
    ///
    /// The first failure cuts the log at its acknowledged end: under `Sync` the synced
    /// end, else the end written to the OS (what `Buffered` acknowledges; records in the
    /// staging ring stay there, acknowledged, for the next open). Records past the cut are
    /// dropped from the buffer and zeroed in the segments, and nothing is written again:
    /// every writer of a record past the cut gets an error, so none of those writes is
    /// replayed at the next open. Call it holding the writer lock.
    pub(in crate::wal) fn fail(&self, w: &mut Writer, err: Error) -> Error {
        let cut = {
            let mut failed = self.failed.lock();
            if failed.is_some() {
                return err;
            }
            let (path, kind) = match &err {
                Error::Io { path, source } => (path.clone(), source.kind()),
                _ => (self.dir.clone(), io::ErrorKind::Other),
            };
            *failed = Some((path, kind));
            self.is_failed.store(true, Ordering::Release);
            // Under the lock that `synced` only moves under (`write_and_sync`): no record
            // past the cut is acknowledged later.
            match self.config.durability {
                Durability::Sync => self.synced.load(Ordering::Acquire),
                _ => self.written.load(Ordering::Acquire),
            }
        };
        self.pending.lock().bytes.clear();
        w.inflight.clear();
        w.done = 0;
        // Best effort: the error that caused the cut is the one to report. A cut that
        // fails leaves records past it that the next open may replay.
        let _ = w.cut(self, cut);
        err
    }

    /// Returns once every record below `target` reached the OS.
    pub(super) fn write_to(&self, target: Lsn) -> Result<()> {
        while self.written_lsn() < target {
            self.check_failed()?;
            let mut w = self.writer.lock();
            if self.written_lsn() >= target {
                break;
            }
            w.write_out(self)?;
        }
        Ok(())
    }

    /// Returns once every record below `target` is on stable storage.
    ///
    /// Group commit: one committer at a time is the leader; it writes out everything
    /// appended so far and issues one `fdatasync` for it, outside any lock appends need.
    /// The others register and park; the leader wakes all of them at once when its sync is
    /// done, so every waiter whose record it covered returns without touching a lock again,
    /// and one of the rest leads the next round for everything appended meanwhile.
    pub(super) fn sync_to(&self, target: Lsn) -> Result<()> {
        loop {
            if self.synced.load(Ordering::Acquire) >= target {
                return Ok(());
            }
            self.check_failed()?;
            let mut g = self.group.lock();
            if self.synced.load(Ordering::Acquire) >= target {
                return Ok(());
            }
            if g.leading {
                g.waiters.push(thread::current());
                drop(g);
                // The leader unparks after its sync; a stale unpark token only costs a loop.
                thread::park();
                continue;
            }
            g.leading = true;
            drop(g);
            self.gather();
            let res = self.write_and_sync();
            let waiters = {
                let mut g = self.group.lock();
                g.leading = false;
                std::mem::take(&mut g.waiters)
            };
            for w in waiters {
                w.unpark();
            }
            res?;
        }
    }

    /// Lets committers about to append join the leader's sync. The waiters the last leader
    /// woke need a time slice to append their next record; without one, a leader that commits
    /// again at once syncs its own record alone and the batches alternate between 1 and
    /// n - 1 records (measured 0.47 fsyncs/op at 4 threads on 2 cores). So yield while the
    /// buffer keeps growing, a few times at most; alone, this costs one `sched_yield`.
    pub(super) fn gather(&self) {
        let mut seen = self.next_lsn();
        for _ in 0..GATHER_YIELDS {
            crate::sync::yield_now();
            let now = self.next_lsn();
            if now == seen {
                break;
            }
            seen = now;
        }
    }

    /// The leader's work: write out the buffer and sync the active segment.
    pub(super) fn write_and_sync(&self) -> Result<()> {
        let (file, path, first, end) = {
            let mut w = self.writer.lock();
            w.write_out(self)?;
            let first = w.segments.last().map_or(0, |s| s.first_lsn);
            (w.file.clone(), w.active_path(), first, w.end)
        };
        // Outside the writer lock: appends and Buffered writes go on during the sync.
        if let Err(e) = file.sync_data() {
            let mut w = self.writer.lock();
            return Err(self.fail(&mut w, Error::io(&path, e)));
        }
        self.syncs.fetch_add(1, Ordering::Relaxed);
        // A failure recorded meanwhile cut the log at the old synced end: these records
        // are gone, so they must not be acknowledged, nor marked.
        let failed = self.failed.lock();
        if failed.is_some() {
            drop(failed);
            return self.check_failed();
        }
        // Every sync records its end in the side file before its records count as synced,
        // so when a commit returns its record is below the mark: after a crash of the
        // process, damage to any acknowledged record is reported at open, never cut as a
        // torn tail (`segment::SIDE_FILE`). Under the failure lock: a cut recorded later
        // starts at or past `end`, never below a mark. A mark that fails to be written
        // only narrows what recovery can tell apart from a torn tail: nothing to report.
        let slot = self.side_marks.fetch_add(1, Ordering::Relaxed);
        let _ = segment::write_side_mark(&*self.side, slot, first, end);
        if end >= self.marked.load(Ordering::Relaxed) + segment::MARK_EVERY {
            // The next sync makes this one durable with the segment.
            let slot = self.marks.fetch_add(1, Ordering::Relaxed);
            if segment::write_mark(&*file, slot, first, end).is_ok() {
                self.marked.fetch_max(end, Ordering::Relaxed);
            }
        }
        self.synced.fetch_max(end, Ordering::AcqRel);
        drop(failed);
        Ok(())
    }

    /// At a clean close, after every record is synced: writes the active segment's synced
    /// mark at the log's end and syncs it, so damage anywhere in the log is reported at the
    /// next open.
    pub(super) fn mark_closed(&self) -> Result<()> {
        let mut w = self.writer.lock();
        let first = w.segments.last().map_or(0, |s| s.first_lsn);
        let end = w.end.min(self.synced.load(Ordering::Acquire));
        let path = w.active_path();
        let slot = self.marks.fetch_add(1, Ordering::Relaxed);
        segment::write_mark(&*w.file, slot, first, end).map_err(|e| Error::io(&path, e))?;
        match w.file.sync_data() {
            Ok(()) => Ok(()),
            Err(e) => Err(self.fail(&mut w, Error::io(&path, e))),
        }
    }

    /// The background flusher of `Buffered` logs.
    pub(super) fn flush_loop(&self) {
        while !self.stop.load(Ordering::Acquire) {
            thread::park_timeout(self.config.flush_interval);
            if self.stop.load(Ordering::Acquire) {
                break;
            }
            let appended = self.acknowledged_end();
            if let Some(ring) = self.ring.get() {
                ring.mark(appended);
            }
            self.seen_next.fetch_max(appended, Ordering::Relaxed);
            if self.synced.load(Ordering::Acquire) < appended {
                // A failure is sticky (sync) or reported to the next committer (write).
                let _ = self.sync_to(appended);
            }
        }
    }

    /// Appends `op` (of `len` bytes) through the staging ring; returns its LSN once the
    /// record and every record before it are in the ring.
    ///
    /// # Errors
    /// `Io` if the ring was full and writing it out failed.
    pub(super) fn append_staged(
        &self,
        ring: &StagingRing,
        op: &LogOp<'_>,
        len: u64,
    ) -> Result<Lsn> {
        let region = &ring.region;
        loop {
            if let Some(slot) = region.reserve(len) {
                let (start, end) = (slot.start, slot.end);
                format::encode_record_into(slot.bytes, start, op);
                let mut spins = 0u32;
                while !region.publish(start, end) {
                    // An earlier record's writer is between its reservation and its publish.
                    spins += 1;
                    if spins < PUBLISH_SPINS {
                        crate::sync::spin_hint();
                    } else {
                        crate::sync::yield_now();
                    }
                }
                return Ok(start);
            }
            // Full: write out what is published (the flusher fell behind), or wait for the
            // writers of what is not.
            self.check_failed()?;
            let before = region.floor();
            self.writer.lock().write_out(self)?;
            if region.floor() == before {
                crate::sync::yield_now();
            }
        }
    }

    /// Every record below this LSN reached the OS (is in the staging ring or written).
    pub(super) fn written_lsn(&self) -> Lsn {
        let staged = self.ring.get().map_or(0, |r| r.region.done());
        staged.max(self.written.load(Ordering::Acquire))
    }

    /// The LSN the next append gets.
    pub(super) fn next_lsn(&self) -> Lsn {
        match self.ring.get() {
            Some(r) => r.region.cursor(),
            None => self.appended.load(Ordering::Acquire),
        }
    }

    /// The end of every acknowledged record: what `flush` must make durable. Records in
    /// the ring past its `done` are still being copied, and none is acknowledged yet.
    pub(super) fn acknowledged_end(&self) -> Lsn {
        match self.ring.get() {
            Some(r) => r.region.done(),
            None => self.appended.load(Ordering::Acquire),
        }
    }

    /// Writes the records a crashed process left in its staging ring to the segments and
    /// syncs them (`ring::leftover`). Call it at open, before any append and before the
    /// new ring is set.
    pub(super) fn take_leftover(&self, left: &ring::Leftover) -> Result<()> {
        if !left.records.is_empty() {
            let end = {
                let mut p = self.pending.lock();
                p.bytes.extend_from_slice(&left.records);
                let end = self.appended.load(Ordering::Acquire) + left.records.len() as u64;
                self.appended.store(end, Ordering::Release);
                end
            };
            self.sync_to(end)?;
        }
        Ok(())
    }
}
