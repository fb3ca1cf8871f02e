//! The storage handles a [`Node`](crate::node::Node) gives openraft, wrapped so the node
//! knows when the last of them is gone (and with it the bfkv trees, which close on drop).
//!
//! `Raft::shutdown` returns once the core task has ended, but openraft lets go of storage
//! later: replication tasks (each holding a log reader) are joined in the background, and
//! the state machine worker ends when its command channel closes. Reopening the directory
//! before then finds the trees locked. Every wrapper here holds a clone of one
//! [`mpsc::Sender`] that never sends; [`Closed::wait`] returns when the channel reports all
//! of them dropped, which is exactly when no handle on the trees is left.
//!
//! The log store wrapper also counts its durable writes ([`LogStats`]): under
//! `Durability::Sync` each is at least one `fdatasync` of the log tree.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::{LogFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    BasicNode, LogId, LogState, OptionalSend, RaftLogReader, RaftSnapshotBuilder, Snapshot,
    SnapshotMeta, StorageError, StoredMembership, Vote,
};
use tokio::sync::mpsc;

use crate::TypeConfig;
use crate::{LogReader, LogStore, NodeId, Reader, Response, SnapshotBuilder, StateMachine};

/// A log entry of this crate's type configuration.
type Entry = openraft::Entry<TypeConfig>;

/// Held by every storage handle; dropping the last one closes the channel.
#[derive(Debug, Clone)]
pub(crate) struct Open(#[allow(dead_code)] mpsc::Sender<()>);

/// Learns when every [`Open`] is dropped.
#[derive(Debug)]
pub(crate) struct Closed(mpsc::Receiver<()>);

/// A new pair: hand out clones of the [`Open`], keep the [`Closed`].
pub(crate) fn open_closed() -> (Open, Closed) {
    let (tx, rx) = mpsc::channel(1);
    (Open(tx), Closed(rx))
}

impl Closed {
    /// Waits until no [`Open`] is left.
    pub(crate) async fn wait(&mut self) {
        // Nothing is ever sent: `recv` returns `None` once all senders are gone.
        while self.0.recv().await.is_some() {}
    }
}

/// Durable writes a node's log store made since it opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    /// `append` calls: one batch (so one `fdatasync`) each, however many entries they hold.
    pub appends: u64,
    /// Entries those appends held.
    pub entries: u64,
    /// Other durable writes: votes, truncations and purges (each at least one batch).
    pub other_writes: u64,
}

/// The counters behind [`LogStats`], shared with the node.
#[derive(Debug, Default)]
pub(crate) struct LogCounters {
    appends: AtomicU64,
    entries: AtomicU64,
    other_writes: AtomicU64,
}

impl LogCounters {
    /// The counts so far.
    pub(crate) fn stats(&self) -> LogStats {
        LogStats {
            appends: self.appends.load(Ordering::Relaxed),
            entries: self.entries.load(Ordering::Relaxed),
            other_writes: self.other_writes.load(Ordering::Relaxed),
        }
    }
}

/// [`LogStore`] that keeps the node's [`Open`] and counts writes.
pub(crate) struct TrackedLog {
    inner: LogStore,
    open: Open,
    counters: Arc<LogCounters>,
}

/// [`LogReader`] that keeps the node's [`Open`].
pub(crate) struct TrackedLogReader {
    inner: LogReader,
    _open: Open,
}

/// [`StateMachine`] that keeps the node's [`Open`].
pub(crate) struct TrackedSm {
    inner: StateMachine,
    open: Open,
}

/// [`SnapshotBuilder`] that keeps the node's [`Open`].
pub(crate) struct TrackedBuilder {
    inner: SnapshotBuilder,
    _open: Open,
}

/// [`Reader`] that keeps the node's [`Open`].
#[derive(Debug, Clone)]
pub(crate) struct TrackedReader {
    inner: Reader,
    _open: Open,
}

impl TrackedReader {
    /// As [`Reader::get`].
    pub(crate) fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, bfkv::Error> {
        self.inner.get(key)
    }
}

/// Wraps a freshly opened node's storage; all handles share `open`.
pub(crate) fn track(
    log: LogStore,
    sm: StateMachine,
    open: &Open,
    counters: Arc<LogCounters>,
) -> (TrackedLog, TrackedSm, TrackedReader) {
    let reader = TrackedReader {
        inner: sm.reader(),
        _open: open.clone(),
    };
    let log = TrackedLog {
        inner: log,
        open: open.clone(),
        counters,
    };
    let sm = TrackedSm {
        inner: sm,
        open: open.clone(),
    };
    (log, sm, reader)
}

impl TrackedLog {
    /// Counts one durable write that is not an append.
    fn other_write(&self) {
        self.counters.other_writes.fetch_add(1, Ordering::Relaxed);
    }
}

impl RaftLogReader<TypeConfig> for TrackedLog {
    async fn try_get_log_entries<RB>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError<NodeId>>
    where
        RB: std::ops::RangeBounds<u64> + Clone + std::fmt::Debug + OptionalSend,
    {
        self.inner.try_get_log_entries(range).await
    }
}

impl RaftLogReader<TypeConfig> for TrackedLogReader {
    async fn try_get_log_entries<RB>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError<NodeId>>
    where
        RB: std::ops::RangeBounds<u64> + Clone + std::fmt::Debug + OptionalSend,
    {
        self.inner.try_get_log_entries(range).await
    }
}

impl RaftLogStorage<TypeConfig> for TrackedLog {
    type LogReader = TrackedLogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        self.inner.get_log_state().await
    }

    async fn get_log_reader(&mut self) -> TrackedLogReader {
        TrackedLogReader {
            inner: self.inner.get_log_reader().await,
            _open: self.open.clone(),
        }
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.other_write();
        self.inner.save_vote(vote).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        self.inner.read_vote().await
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError<NodeId>> {
        self.inner.save_committed(committed).await
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        self.inner.read_committed().await
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        self.counters.appends.fetch_add(1, Ordering::Relaxed);
        let count = entries.len() as u64;
        self.counters.entries.fetch_add(count, Ordering::Relaxed);
        self.inner.append(entries, callback).await
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.other_write();
        self.inner.truncate(log_id).await
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.other_write();
        self.inner.purge(log_id).await
    }
}

impl RaftStateMachine<TypeConfig> for TrackedSm {
    type SnapshotBuilder = TrackedBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>), StorageError<NodeId>>
    {
        self.inner.applied_state().await
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        self.inner.apply(entries).await
    }

    async fn get_snapshot_builder(&mut self) -> TrackedBuilder {
        TrackedBuilder {
            inner: self.inner.get_snapshot_builder().await,
            _open: self.open.clone(),
        }
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<std::io::Cursor<Vec<u8>>>, StorageError<NodeId>> {
        self.inner.begin_receiving_snapshot().await
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<std::io::Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        self.inner.install_snapshot(meta, snapshot).await
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        self.inner.get_current_snapshot().await
    }
}

impl RaftSnapshotBuilder<TypeConfig> for TrackedBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        self.inner.build_snapshot().await
    }
}
