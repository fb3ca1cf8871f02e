//! The tree's side of the write-ahead log: whether writes are logged, the log itself, and the
//! LSN the last durable checkpoint covers (where replay starts).

use crate::error::Result;
use crate::sync::{AtomicU64, Ordering};
use crate::tree::WriteOp;
use crate::wal::{Appended, BatchValue, LogOp, Lsn, ReplayStats, Wal, WalStats};
use crate::Durability;

/// The log of a file-backed tree, and the checkpoint LSN.
pub(crate) struct Journal {
    /// Opened even under `Durability::None`, so that a log left by an earlier session is
    /// replayed; absent for in-memory trees.
    wal: Option<Wal>,
    /// Whether writes are logged (`Sync` and `Buffered`).
    log_writes: bool,
    /// The LSN the last durable checkpoint covers: replay starts there.
    checkpoint_lsn: AtomicU64,
}

impl Journal {
    /// A journal over `wal`, logging writes unless `durability` is `None`; the last
    /// checkpoint covers the log up to `checkpoint_lsn`.
    pub(crate) fn new(wal: Wal, durability: Durability, checkpoint_lsn: Lsn) -> Journal {
        Journal {
            wal: Some(wal),
            log_writes: durability != Durability::None,
            checkpoint_lsn: AtomicU64::new(checkpoint_lsn),
        }
    }

    /// No log (in-memory trees).
    pub(crate) fn none() -> Journal {
        Journal {
            wal: None,
            log_writes: false,
            checkpoint_lsn: AtomicU64::new(0),
        }
    }

    /// Whether writes are logged.
    #[inline]
    pub(crate) fn logs_writes(&self) -> bool {
        self.log_writes
    }

    /// The log, if the tree has one.
    pub(crate) fn wal(&self) -> Option<&Wal> {
        self.wal.as_ref()
    }

    /// Appends the record of a write to `key` (if writes are logged); the caller holds the
    /// leaf's lock, so the log's order for a key is the order its writes were applied.
    ///
    /// # Errors
    /// `Io` if the log cannot take the record.
    #[inline]
    pub(crate) fn append(&self, key: &[u8], op: WriteOp<'_>) -> Result<Option<Appended>> {
        let Some(wal) = self.wal.as_ref().filter(|_| self.log_writes) else {
            return Ok(None);
        };
        let record = match op {
            WriteOp::Put(value) => LogOp::Insert { key, value },
            WriteOp::Delete => LogOp::Remove { key },
            WriteOp::Merge(operands) => LogOp::Merge { key, operands },
        };
        wal.append(record).map(Some)
    }

    /// Appends the record of an atomic batch whose encoded writes are `body` (if writes are
    /// logged); the caller holds the lock of every leaf the batch writes.
    ///
    /// # Errors
    /// `Io` if the log cannot take the record; `BatchTooLarge` if it exceeds a segment.
    pub(crate) fn append_batch(&self, body: &[u8]) -> Result<Option<Appended>> {
        let Some(wal) = self.wal.as_ref().filter(|_| self.log_writes) else {
            return Ok(None);
        };
        wal.append(LogOp::Batch { body }).map(Some)
    }

    /// Fails if the log failed since open (`Wal::check`): the tree holds writes that were
    /// refused, so it must answer nothing until it is reopened.
    ///
    /// # Errors
    /// `Io` naming the log file that failed.
    #[inline]
    pub(crate) fn check(&self) -> Result<()> {
        match &self.wal {
            Some(wal) => wal.check(),
            None => Ok(()),
        }
    }

    /// Waits until `appended` is durable per the configured durability.
    ///
    /// # Errors
    /// `Io` if writing or syncing the log failed.
    pub(crate) fn commit(&self, appended: Appended) -> Result<()> {
        match &self.wal {
            Some(wal) => wal.commit(appended),
            None => Ok(()),
        }
    }

    /// Replays the log from the last checkpoint's LSN, calling `apply` with each write's
    /// record LSN, the writes of a batch one after another (nobody else runs during replay,
    /// and the batch's record is whole: its writes all apply). `apply` gets `Err(reason)`
    /// for a batch record whose writes do not decode.
    ///
    /// # Errors
    /// `Corruption` for damage before the log's tail, or `apply`'s error.
    pub(crate) fn replay(
        &self,
        mut apply: impl FnMut(
            Lsn,
            std::result::Result<(&[u8], WriteOp<'_>), &'static str>,
        ) -> Result<()>,
    ) -> Result<ReplayStats> {
        let Some(wal) = &self.wal else {
            return Ok(ReplayStats::default());
        };
        wal.replay(self.checkpoint_lsn(), |lsn, op| match op {
            LogOp::Insert { key, value } => apply(lsn, Ok((key, WriteOp::Put(value)))),
            LogOp::Remove { key } => apply(lsn, Ok((key, WriteOp::Delete))),
            LogOp::Merge { key, operands } => apply(lsn, Ok((key, WriteOp::Merge(operands)))),
            LogOp::Batch { body } => {
                for write in crate::wal::batch_writes(body) {
                    let write = write.map(|(key, value)| {
                        let op = match value {
                            BatchValue::Put(v) => WriteOp::Put(v),
                            BatchValue::Remove => WriteOp::Delete,
                            BatchValue::Merge(ops) => WriteOp::Merge(ops),
                        };
                        (key, op)
                    });
                    apply(lsn, write)?;
                }
                Ok(())
            }
        })
    }

    /// The LSN a leaf image built now is stamped with (see `PageTracker`): every write to
    /// the leaf was logged below it, and none at or past it yet. The caller holds the leaf's
    /// lock, under which its writes are applied and logged. 0 for a tree without a log.
    pub(crate) fn image_lsn(&self) -> Lsn {
        self.wal.as_ref().map_or(0, Wal::next_lsn)
    }

    /// Whether the log grew past `limit` bytes since the last checkpoint (only when writes
    /// are logged).
    pub(crate) fn grew_past(&self, limit: u64) -> bool {
        match &self.wal {
            Some(wal) if self.log_writes => wal.bytes_since(self.checkpoint_lsn()) > limit,
            _ => false,
        }
    }

    /// Closes the log (`Wal::close`): everything synced, nothing of it left to touch the
    /// directory.
    ///
    /// # Errors
    /// `Io` if the final sync fails.
    pub(crate) fn close(&self) -> Result<()> {
        match &self.wal {
            Some(wal) => wal.close(),
            None => Ok(()),
        }
    }

    /// Syncs the log. `Ok(false)` if writes are not logged: the caller must checkpoint to
    /// make them durable.
    ///
    /// # Errors
    /// `Io` if the sync failed.
    pub(crate) fn flush(&self) -> Result<bool> {
        match &self.wal {
            Some(wal) if self.log_writes => wal.flush().map(|()| true),
            _ => Ok(false),
        }
    }

    /// The LSN the last durable checkpoint covers.
    pub(crate) fn checkpoint_lsn(&self) -> Lsn {
        self.checkpoint_lsn.load(Ordering::Acquire)
    }

    /// A checkpoint covering the log below `lsn` is durable: drops that part of the log.
    ///
    /// # Errors
    /// `Io` if removing old segments failed.
    pub(crate) fn checkpointed(&self, lsn: Lsn) -> Result<()> {
        self.checkpoint_lsn.store(lsn, Ordering::Release);
        match &self.wal {
            Some(wal) => wal.release_before(lsn),
            None => Ok(()),
        }
    }

    /// The log's counters (zero without a log).
    pub(crate) fn stats(&self) -> WalStats {
        self.wal.as_ref().map(Wal::stats).unwrap_or_default()
    }
}
