//! The raft log and vote on a bfkv tree opened with [`Durability::Sync`].
//!
//! Keyspace `raft_log` maps each entry's index, big-endian (so key order is index order and
//! a range of indexes is a key range), to the entry in bincode. Keyspace `raft_meta` holds
//! `vote`, `committed` and `last_purged`, each a bincode value.
//!
//! Under `Sync` a bfkv write or batch returns after its log record is `fdatasync`ed, and
//! recovery finds a batch whole or not at all (README, "Guarantees"). So:
//! - `append` writes its entries as one batch and then reports them flushed;
//! - `save_vote` is durable when it returns;
//! - `purge` records the new last purged log id in the same batch as the first removals,
//!   and `truncate` removes from the highest index down, so a log split over several
//!   batches (one batch holds at most [`bfkv::Limits::max_batch_len`] bytes) never has a
//!   hole after a crash; entries a crash left below the last purged id are removed at open.
//! - `save_committed` is kept in memory and written with the next batch of any of the
//!   above: openraft only re-applies entries up to the stored committed id at startup, and
//!   an older one re-applies less but is still committed (a lagging value is safe), which
//!   saves one `fdatasync` per commit.
//! - `save_vote` also replaces the vote file beside the tree (`vote_file.rs`) once the
//!   tree's write is durable, and open refuses a tree whose vote is older than the file's.
//!
//! Open reads every entry (so a damaged page of the log is found now, not when openraft
//! first asks for it) and checks that the indexes follow each other from just after the
//! last purged id; what it found ([`AtOpen`]) is checked against the state machine by
//! `crate::checks`.

use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bfkv::{Batch, Config, Durability, Keyspace, Tree};
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, LogId, LogState, OptionalSend, RaftLogReader, Vote};

use crate::error::{blocking, Error, Result, StorageError};
use crate::{decode, encode, vote_file, NodeId, TypeConfig};

/// A log entry of this crate's type configuration.
type Entry = openraft::Entry<TypeConfig>;

/// `raft_meta` key of the vote.
const VOTE: &[u8] = b"vote";
/// `raft_meta` key of the last committed log id.
const COMMITTED: &[u8] = b"committed";
/// `raft_meta` key of the last purged log id.
const LAST_PURGED: &[u8] = b"last_purged";

/// What a write costs in a batch beyond its key and stored value: the keyspace prefix (at
/// most 5 bytes) and the kind and lengths (at most 11), per `bfkv::Batch::len_bytes`.
const WRITE_OVERHEAD: usize = 16;
/// What a value stored out of line costs in a batch: its reference.
const OUT_OF_LINE_REF: usize = 28;

/// The tree and its two keyspaces, shared by the store and its readers.
#[derive(Debug)]
struct Shared {
    /// The node directory: the tree is its `log/`, the vote file beside it.
    node: PathBuf,
    /// Keyspace handles answer `Closed` once the tree is dropped: this keeps it open.
    tree: Tree,
    /// Index (big-endian) → entry.
    log: Keyspace,
    /// Vote, committed, last purged.
    meta: Keyspace,
}

/// The raft log store ([`RaftLogStorage`]) of a node: log entries and the vote in a bfkv
/// tree opened with [`Durability::Sync`]. Made by [`open`](crate::open).
#[derive(Debug)]
pub struct LogStore {
    /// The tree.
    shared: Arc<Shared>,
    /// The committed log id openraft last saved.
    committed: Option<LogId<NodeId>>,
    /// Whether `committed` is newer than what the tree holds (see the module docs).
    committed_unsaved: bool,
    /// What open found.
    at_open: AtOpen,
}

/// The log as open found it, for the checks against the state machine (`crate::checks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AtOpen {
    /// The last purged log id.
    pub(crate) last_purged: Option<LogId<NodeId>>,
    /// The last entry's log id.
    pub(crate) last_entry: Option<LogId<NodeId>>,
    /// The committed log id stored.
    pub(crate) committed: Option<LogId<NodeId>>,
}

/// A reader of the log for openraft's replication tasks
/// ([`RaftLogStorage::get_log_reader`]); it keeps the log tree open while it lives.
#[derive(Debug, Clone)]
pub struct LogReader {
    /// The log store's tree.
    shared: Arc<Shared>,
}

impl LogStore {
    /// Opens (or creates) the log tree in the node directory `node`, finishes a purge a
    /// crash interrupted, and checks the vote and the entries (module docs).
    pub(crate) fn open(node: &Path, cache_size: usize) -> Result<LogStore> {
        let config = Config::new(node.join("log"))
            .page_size(crate::PAGE_SIZE)
            .cache_size(cache_size)
            .durability(Durability::Sync);
        let tree = Tree::open(config)?;
        let shared = Shared {
            node: node.to_path_buf(),
            log: tree.keyspace("raft_log")?,
            meta: tree.keyspace("raft_meta")?,
            tree,
        };
        let last_purged = shared.read_meta::<LogId<NodeId>>(LAST_PURGED)?;
        if let Some(purged) = last_purged {
            shared.remove_through(purged.index, &[])?;
        }
        shared.check_vote()?;
        let last_entry = shared.check_entries(last_purged)?;
        // Stored as openraft passes it: an `Option`.
        let committed = shared
            .read_meta::<Option<LogId<NodeId>>>(COMMITTED)?
            .flatten();
        Ok(LogStore {
            shared: Arc::new(shared),
            committed,
            committed_unsaved: false,
            at_open: AtOpen {
                last_purged,
                last_entry,
                committed,
            },
        })
    }

    /// What open found.
    pub(crate) fn at_open(&self) -> AtOpen {
        self.at_open
    }

    /// The encoded committed log id if it still has to be written, marking it written.
    fn take_unsaved_committed(&mut self) -> Result<Option<Vec<u8>>> {
        if !self.committed_unsaved {
            return Ok(None);
        }
        let bytes = encode(&self.committed)?;
        self.committed_unsaved = false;
        Ok(Some(bytes))
    }

    /// Runs the blocking `write` on the tree with the unsaved committed id (if any) to add
    /// to its first batch; on failure the committed id stays unsaved.
    async fn write<F>(&mut self, write: F) -> Result<()>
    where
        F: FnOnce(&Shared, Option<Vec<u8>>) -> Result<()> + Send + 'static,
    {
        let committed = self.take_unsaved_committed()?;
        let had_committed = committed.is_some();
        let shared = self.shared.clone();
        let result = blocking(move || write(&shared, committed)).await;
        if result.is_err() && had_committed {
            self.committed_unsaved = true;
        }
        result
    }
}

impl Drop for LogStore {
    fn drop(&mut self) {
        // Best effort: a lost committed id only means less is re-applied at the next open.
        if let Ok(Some(committed)) = self.take_unsaved_committed() {
            let _ = self.shared.meta.insert(COMMITTED, committed);
        }
    }
}

impl Shared {
    /// Refuses a tree whose vote is older than the vote file's, or not comparable with it;
    /// brings a file behind the tree up to date.
    fn check_vote(&self) -> Result<()> {
        let in_tree: Option<Vote<NodeId>> = self.read_meta(VOTE)?;
        let in_file = vote_file::read(&self.node)?;
        let behind = match (&in_file, &in_tree) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(file), Some(tree)) => !matches!(
                file.partial_cmp(tree),
                Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal)
            ),
        };
        if behind {
            return Err(Error::inconsistent(
                "log tree",
                "its vote is older than the one the node saved (vote file): the log lost \
                 records it had synced",
            ));
        }
        match in_tree {
            Some(vote) if in_file != in_tree => vote_file::write(&self.node, &vote),
            _ => Ok(()),
        }
    }

    /// Reads every entry (each must decode and sit under its index) and checks that they
    /// follow each other, from just after `last_purged` if there is one; returns the last
    /// one's log id.
    fn check_entries(&self, last_purged: Option<LogId<NodeId>>) -> Result<Option<LogId<NodeId>>> {
        let mut last: Option<LogId<NodeId>> = None;
        for record in &self.log {
            let id = decode_entry(&record?)?.log_id;
            let follows = match (last, last_purged) {
                (Some(prev), _) => Some(prev.index + 1),
                (None, Some(purged)) => Some(purged.index + 1),
                (None, None) => None,
            };
            if follows.is_some_and(|index| index != id.index) {
                return Err(Error::inconsistent(
                    "log tree",
                    "entries are missing between the last purged one and the last one",
                ));
            }
            last = Some(id);
        }
        Ok(last)
    }

    /// The `raft_meta` value under `key`, decoded.
    fn read_meta<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>> {
        self.meta.get(key)?.map(|bytes| decode(&bytes)).transpose()
    }

    /// The entries with indexes in `range`, in index order.
    fn entries(&self, range: (Bound<u64>, Bound<u64>)) -> Result<Vec<Entry>> {
        let Some((first, last)) = inclusive(range) else {
            return Ok(Vec::new());
        };
        let keys = first.to_be_bytes()..=last.to_be_bytes();
        self.log
            .range(keys)
            .map(|record| decode_entry(&record?))
            .collect()
    }

    /// The entry with the lowest (`back` false) or highest index.
    fn end_entry(&self, back: bool) -> Result<Option<Entry>> {
        let mut all = self.log.iter();
        let record = if back { all.next_back() } else { all.next() };
        record.map(|r| decode_entry(&r?)).transpose()
    }

    /// Removes every entry from index `from` on, highest first, so that each batch leaves
    /// a log without a hole.
    fn remove_from(&self, from: u64, committed: Option<Vec<u8>>) -> Result<()> {
        let mut batches = Batcher::new(&self.tree);
        if let Some(committed) = committed {
            batches.insert(&self.meta, COMMITTED, &committed)?;
        }
        if let Some(last) = self.end_entry(true)? {
            for index in (from..=last.log_id.index).rev() {
                batches.remove(&self.log, &index.to_be_bytes())?;
            }
        }
        batches.finish()
    }

    /// Removes every entry up to index `through`, lowest first; the `meta` writes (the
    /// encoded last purged log id, with the committed id if unsaved) go into the first
    /// batch, so the entries a crash leaves below it are known to be purged (and removed
    /// at open).
    fn remove_through(&self, through: u64, meta: &[(&[u8], Vec<u8>)]) -> Result<()> {
        let mut batches = Batcher::new(&self.tree);
        for (key, value) in meta {
            batches.insert(&self.meta, key, value)?;
        }
        if let (Some(first), Some(last)) = (self.end_entry(false)?, self.end_entry(true)?) {
            // The log has no hole, so these are exactly the keys present.
            for index in first.log_id.index..=through.min(last.log_id.index) {
                batches.remove(&self.log, &index.to_be_bytes())?;
            }
        }
        batches.finish()
    }
}

/// The `(first, last)` indexes of `range`, both inclusive; `None` if it is empty.
fn inclusive(range: (Bound<u64>, Bound<u64>)) -> Option<(u64, u64)> {
    let first = match range.0 {
        Bound::Included(i) => i,
        Bound::Excluded(i) => i.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let last = match range.1 {
        Bound::Included(i) => i,
        Bound::Excluded(i) => i.checked_sub(1)?,
        Bound::Unbounded => u64::MAX,
    };
    (first <= last).then_some((first, last))
}

/// A stored `(key, value)` of `raft_log` as an entry, checking it sits under its index.
fn decode_entry((key, value): &(Vec<u8>, Vec<u8>)) -> Result<Entry> {
    let entry: Entry = decode(value)?;
    if key.as_slice() != entry.log_id.index.to_be_bytes() {
        return Err(Error::malformed("log entry", "stored under another index"));
    }
    Ok(entry)
}

/// Writes in order, in as few batches as the tree's batch limit allows: a batch is
/// committed when the next write would not fit it.
struct Batcher<'t> {
    /// The tree the batches are for.
    tree: &'t Tree,
    /// The batch being filled.
    batch: Batch,
    /// What the writes in `batch` cost, as `Batch::len_bytes` counts at most.
    bytes: usize,
    /// The most one batch may cost.
    limit: usize,
}

impl<'t> Batcher<'t> {
    /// Batches for `tree`, each up to its `max_batch_len`.
    fn new(tree: &'t Tree) -> Self {
        Self::with_limit(tree, tree.limits().max_batch_len)
    }

    /// Batches for `tree` of at most `limit` bytes each (tests use small ones).
    fn with_limit(tree: &'t Tree, limit: usize) -> Self {
        Batcher {
            tree,
            batch: tree.batch(),
            bytes: 0,
            limit,
        }
    }

    /// Adds an insert.
    fn insert(&mut self, keyspace: &Keyspace, key: &[u8], value: &[u8]) -> Result<()> {
        // A value too long for a leaf record goes to the blob file first; the batch then
        // carries its reference only.
        let stored = if key.len() + value.len() > self.tree.limits().max_record_len {
            OUT_OF_LINE_REF
        } else {
            value.len()
        };
        self.make_room(key.len() + stored + WRITE_OVERHEAD)?;
        self.batch.insert(keyspace, key, value);
        Ok(())
    }

    /// Adds a removal.
    fn remove(&mut self, keyspace: &Keyspace, key: &[u8]) -> Result<()> {
        self.make_room(key.len() + WRITE_OVERHEAD)?;
        self.batch.remove(keyspace, key);
        Ok(())
    }

    /// Commits the batch if a write costing `cost` would take it past the limit.
    fn make_room(&mut self, cost: usize) -> Result<()> {
        if !self.batch.is_empty() && self.bytes + cost > self.limit {
            std::mem::replace(&mut self.batch, self.tree.batch()).commit()?;
            self.bytes = 0;
        }
        self.bytes += cost;
        Ok(())
    }

    /// Commits what is left.
    fn finish(self) -> Result<()> {
        if !self.batch.is_empty() {
            self.batch.commit()?;
        }
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB>(&mut self, range: RB) -> Result<Vec<Entry>, StorageError>
    where
        RB: RangeBounds<u64> + Clone + std::fmt::Debug + OptionalSend,
    {
        let range = (range.start_bound().cloned(), range.end_bound().cloned());
        read_entries(&self.shared, range).await
    }
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB>(&mut self, range: RB) -> Result<Vec<Entry>, StorageError>
    where
        RB: RangeBounds<u64> + Clone + std::fmt::Debug + OptionalSend,
    {
        let range = (range.start_bound().cloned(), range.end_bound().cloned());
        read_entries(&self.shared, range).await
    }
}

/// Reads the entries in `range` off the async workers: a range may need leaves from disk.
async fn read_entries(
    shared: &Arc<Shared>,
    range: (Bound<u64>, Bound<u64>),
) -> Result<Vec<Entry>, StorageError> {
    let shared = shared.clone();
    blocking(move || shared.entries(range))
        .await
        .map_err(|e| e.storage(ErrorSubject::Logs, ErrorVerb::Read))
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let state = || -> Result<_> {
            let last_purged: Option<LogId<NodeId>> = self.shared.read_meta(LAST_PURGED)?;
            let last = self.shared.end_entry(true)?.map(|e| e.log_id);
            // With every entry purged, the last log id is the last purged one.
            let last_log_id = match (last, last_purged) {
                (Some(last), Some(purged)) if purged.index >= last.index => Some(purged),
                (None, purged) => purged,
                (last, _) => last,
            };
            Ok(LogState {
                last_purged_log_id: last_purged,
                last_log_id,
            })
        };
        state().map_err(|e| e.storage(ErrorSubject::Logs, ErrorVerb::Read))
    }

    async fn get_log_reader(&mut self) -> LogReader {
        LogReader {
            shared: self.shared.clone(),
        }
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        let copy = *vote;
        let vote = encode(vote).map_err(|e| e.storage(ErrorSubject::Vote, ErrorVerb::Write))?;
        self.write(move |shared, committed| {
            let mut batch = shared.tree.batch();
            batch.insert(&shared.meta, VOTE, vote);
            if let Some(committed) = committed {
                batch.insert(&shared.meta, COMMITTED, committed);
            }
            // Durable on return: the tree is `Sync`. The file second: it is never ahead
            // of the tree unless the tree lost the vote.
            batch.commit()?;
            vote_file::write(&shared.node, &copy)
        })
        .await
        .map_err(|e| e.storage(ErrorSubject::Vote, ErrorVerb::Write))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        self.shared
            .read_meta(VOTE)
            .map_err(|e| e.storage(ErrorSubject::Vote, ErrorVerb::Read))
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError> {
        if committed != self.committed {
            self.committed = committed;
            self.committed_unsaved = true;
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError> {
        Ok(self.committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let records = entries
            .into_iter()
            .map(|e| Ok((e.log_id.index.to_be_bytes(), encode(&e)?)))
            .collect::<Result<Vec<_>>>()
            .map_err(|e| e.storage(ErrorSubject::Logs, ErrorVerb::Write))?;
        let result = self
            .write(move |shared, committed| {
                // One batch unless the entries outgrow one: then consecutive batches in
                // index order, each a longer prefix of the append.
                let mut batches = Batcher::new(&shared.tree);
                if let Some(committed) = committed {
                    batches.insert(&shared.meta, COMMITTED, &committed)?;
                }
                for (key, entry) in &records {
                    batches.insert(&shared.log, key, entry)?;
                }
                batches.finish()
            })
            .await;
        match result {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(e.storage(ErrorSubject::Logs, ErrorVerb::Write))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError> {
        self.write(move |shared, committed| shared.remove_from(log_id.index, committed))
            .await
            .map_err(|e| e.storage(ErrorSubject::Log(log_id), ErrorVerb::Delete))
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError> {
        let purged =
            encode(&log_id).map_err(|e| e.storage(ErrorSubject::Log(log_id), ErrorVerb::Delete))?;
        self.write(move |shared, committed| {
            let mut meta = Vec::new();
            // Never back: entries below the stored id are gone, whatever openraft asks.
            let stored: Option<LogId<NodeId>> = shared.read_meta(LAST_PURGED)?;
            if stored.is_none_or(|stored| stored.index < log_id.index) {
                meta.push((LAST_PURGED, purged));
            }
            meta.extend(committed.map(|c| (COMMITTED, c)));
            shared.remove_through(log_id.index, &meta)
        })
        .await
        .map_err(|e| e.storage(ErrorSubject::Log(log_id), ErrorVerb::Delete))
    }
}

#[cfg(test)]
#[path = "log_store_tests.rs"]
mod tests;
