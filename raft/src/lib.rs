//! bfkv-raft: [openraft](https://docs.rs/openraft/0.9) storage on bfkv trees, and a small
//! replicated key-value application over it.
//!
//! openraft (with its `storage-v2` traits) asks two things of storage: a log store
//! ([`RaftLogStorage`](openraft::storage::RaftLogStorage)) that keeps the vote and the log
//! durable, and a state machine
//! ([`RaftStateMachine`](openraft::storage::RaftStateMachine)) that applies committed entries
//! and builds and installs snapshots. [`open`] opens both under one node directory:
//!
//! ```text
//! <node>/log/                 LogStore: a bfkv tree opened with Durability::Sync
//!        keyspace raft_log    big-endian u64 index -> entry (bincode)
//!        keyspace raft_meta   vote, committed log id, last purged log id
//! <node>/vote                 a second copy of the vote, checksummed (vote_file.rs)
//! <node>/sm/CURRENT           names the live generation: "gen-<20 digits>\n"
//! <node>/sm/gen-N/tree/       StateMachine: a bfkv tree opened with Durability::Buffered
//!        keyspace data        the application's keys and values
//!        keyspace sm_meta     last applied log id, last membership
//! <node>/sm/gen-N/snapshot    the current snapshot: metadata + packed tree, checksummed
//! ```
//!
//! - An `append` is one bfkv batch: one log record and one `fdatasync` (and one of the blob
//!   file if an entry is longer than half a page), found whole or not at all after a crash.
//!   The vote is durable before `save_vote` returns, and copied to `<node>/vote` after.
//! - [`open`] refuses a node directory that lost anything synced: a vote older than its
//!   copy, a log with a hole or a damaged page, a state machine missing, emptied or behind
//!   the log's purge point, a log shorter than what the state machine applied (see
//!   `checks.rs`); a node that refuses to start is replaced through a membership change
//!   (`docs/scale-out.md`).
//! - Each applied entry is one batch holding its effect and the new applied log id, so after
//!   any crash the state machine is exactly the state after some prefix of the log.
//! - A snapshot is a [`Tree::backup`](bfkv::Tree::backup) of the state-machine tree, packed
//!   into bytes (`pack.rs`); installing one unpacks it into a new generation directory and
//!   switches `CURRENT` to it with an atomic rename.
//!
//! Limits: an entry is one bfkv value, so a request must pass [`Request::check_size`]
//! (keys up to 1 KiB, values up to 64 MiB less 2 KiB); a snapshot is held in memory whole
//! (openraft 0.9 moves it as a `Cursor<Vec<u8>>`), though zero-filled blocks of the tree's
//! files are left out of it.
//!
//! Above the storage, the crate runs the cluster:
//! - [`node::Node`]: a member (its directory, its `openraft::Raft`) with the client
//!   operations of the replicated map: writes proposed on the leader and linearizable reads
//!   (`Raft::ensure_linearizable`, then the local state machine), following leader hints
//!   ([`client`]); `shutdown` waits until openraft has let go of the trees, so the
//!   directory can be opened again in the same process.
//! - Two transports for openraft's network and for forwarded client requests:
//!   [`router::Router`], in process, which can isolate and kill nodes (the cluster tests),
//!   and [`tcp`], length-prefixed frames over loopback TCP (the example, the node binary
//!   `bfkv-raft-node` and the process-kill test).
//! - [`linearizability`]: a checker for concurrent histories of reads, writes and
//!   compare-and-swaps, which the cluster tests run under leader failures.
//!
//! `docs/scale-out.md` in the repository says how a service shards a key space into many
//! such groups, and what a write costs here.
//!
//! ```
//! use bfkv_raft::{Request, Response, TypeConfig};
//! use openraft::storage::RaftStateMachine;
//! use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
//!
//! # tokio::runtime::Runtime::new()?.block_on(async {
//! let dir = tempfile::tempdir()?;
//! let (_log, mut sm) = bfkv_raft::open(dir.path())?;
//! // openraft applies committed entries; here one is applied by hand.
//! let put = Request::Put { key: b"k".to_vec(), value: b"v".to_vec() };
//! let entry = Entry::<TypeConfig> {
//!     log_id: LogId::new(CommittedLeaderId::new(1, 0), 1),
//!     payload: EntryPayload::Normal(put),
//! };
//! assert_eq!(sm.apply([entry]).await?, [Response::Put { previous: None }]);
//! assert_eq!(sm.reader().get(b"k")?, Some(b"v".to_vec()));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io::Cursor;
use std::path::Path;

use openraft::{BasicNode, ErrorSubject, ErrorVerb};
use serde::{Deserialize, Serialize};

mod checks;
pub mod client;
mod error;
mod files;
pub mod linearizability;
mod log_store;
pub mod node;
mod pack;
pub mod router;
mod sm_dir;
mod state_machine;
pub mod tcp;
mod tracked;
mod vote_file;

pub use log_store::{LogReader, LogStore};
pub use state_machine::{Reader, SnapshotBuilder, StateMachine};
pub use tracked::LogStats;

/// The id of a node in the cluster.
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// openraft's type configuration for this crate: `u64` node ids, [`BasicNode`]
    /// addresses, [`Request`]s in the log and [`Response`]s from applying them, snapshots
    /// as bytes in memory, tokio as the runtime.
    pub TypeConfig:
        D = Request,
        R = Response,
        NodeId = NodeId,
        Node = BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A write to the replicated key-value map: what a client proposes with
/// [`Raft::client_write`](openraft::Raft::client_write) and the log stores.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Sets `key` to `value`.
    Put {
        /// The key.
        key: Vec<u8>,
        /// Its new value.
        value: Vec<u8>,
    },
    /// Removes `key` (nothing happens to an absent key).
    Delete {
        /// The key.
        key: Vec<u8>,
    },
    /// Sets `key` to `new` (`None`: removes it) if its value is `expected` (`None`: absent).
    Cas {
        /// The key.
        key: Vec<u8>,
        /// The value the key must hold for the swap; `None` means it must be absent.
        expected: Option<Vec<u8>>,
        /// The value to store; `None` removes the key.
        new: Option<Vec<u8>>,
    },
}

/// The leaf page size of both trees: bfkv's default; fixed, so every node rejects the same
/// requests ([`Request::check_size`]).
pub(crate) const PAGE_SIZE: usize = 4096;

/// Room an entry needs in its stored form beyond the request's keys and values: its log id
/// and the enum tags and lengths (about 50 bytes in bincode), with a margin.
const ENTRY_SLACK: usize = 1024;

impl Request {
    /// Checks the request's sizes; `Err` holds the response applying it would give
    /// ([`Response::KeyTooLarge`] or [`Response::ValueTooLarge`]), and nothing would change.
    ///
    /// Call it before proposing: the log stores each entry as one bfkv value (at most
    /// [`bfkv::Limits::max_value_len`], 64 MiB), and an entry it cannot store fails the
    /// log store, which stops the node. Keys follow the state machine tree's limit
    /// ([`bfkv::Limits::max_key_len`], 1 KiB with the 4 KiB pages both trees use); the
    /// values (`expected` and `new` together, for a CAS) may take 64 MiB less 2 KiB, which
    /// leaves room for the longest key and the entry's own fields.
    ///
    /// # Errors
    /// The [`Response`] for a key or values over the limits.
    ///
    /// ```
    /// use bfkv_raft::{Request, Response};
    /// let put = Request::Put { key: vec![0; 2000], value: b"v".to_vec() };
    /// assert_eq!(put.check_size(), Err(Response::KeyTooLarge { len: 2000, limit: 1024 }));
    /// assert_eq!(Request::Delete { key: b"k".to_vec() }.check_size(), Ok(()));
    /// ```
    pub fn check_size(&self) -> Result<(), Response> {
        let limits = bfkv::Limits::for_page_size(PAGE_SIZE);
        let (key, values) = match self {
            Request::Put { key, value } => (key, value.len()),
            Request::Delete { key } => (key, 0),
            Request::Cas { key, expected, new } => (
                key,
                expected.as_ref().map_or(0, Vec::len) + new.as_ref().map_or(0, Vec::len),
            ),
        };
        if key.len() > limits.max_key_len {
            return Err(Response::KeyTooLarge {
                len: key.len(),
                limit: limits.max_key_len,
            });
        }
        let limit = limits.max_value_len - limits.max_key_len - ENTRY_SLACK;
        if values > limit {
            return Err(Response::ValueTooLarge { len: values, limit });
        }
        Ok(())
    }
}

/// What applying one log entry did, returned to the client that proposed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// The entry carried no [`Request`] (a blank or a membership entry).
    Empty,
    /// A [`Request::Put`] was applied; `previous` is the value it replaced.
    Put {
        /// The key's value before the put.
        previous: Option<Vec<u8>>,
    },
    /// A [`Request::Delete`] was applied; `previous` is the value it removed.
    Delete {
        /// The key's value before the delete.
        previous: Option<Vec<u8>>,
    },
    /// A [`Request::Cas`] was applied.
    Cas {
        /// Whether the key held `expected` and now holds `new`.
        swapped: bool,
        /// The key's value after the request (`new` if swapped, else the value it held).
        current: Option<Vec<u8>>,
    },
    /// The request's key was too long ([`Request::check_size`]): nothing changed. Rejected
    /// when applied rather than failed, since the entry is committed on every node alike.
    KeyTooLarge {
        /// The key's length in bytes.
        len: usize,
        /// The longest key accepted.
        limit: usize,
    },
    /// The request's values were too long ([`Request::check_size`]): nothing changed.
    ValueTooLarge {
        /// The length of the request's values (`expected` and `new` added, for a CAS).
        len: usize,
        /// The most accepted.
        limit: usize,
    },
}

/// Memory budgets of the two trees a node opens; see [`open_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Cache of the log tree, in bytes. Default 16 MiB: recent entries are read back by
    /// replication soon after they are written; older ones are read rarely.
    pub log_cache_size: usize,
    /// Cache of the state machine's tree, in bytes. Default 64 MiB, bfkv's default.
    pub sm_cache_size: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            log_cache_size: 16 << 20,
            sm_cache_size: 64 << 20,
        }
    }
}

/// Opens (or creates) the node directory `dir` with default [`Options`]; returns the log
/// store and the state machine to hand to [`openraft::Raft::new`].
///
/// This blocks on file I/O (it opens two trees and may remove a crashed run's leftovers):
/// call it before starting the node, or in `spawn_blocking`.
///
/// # Errors
/// A [`StorageError`](openraft::StorageError) about the store: the directory cannot be
/// created, a tree fails to open (`Locked` if another process has this node open, or
/// `Corruption` for damage bfkv finds), `sm/CURRENT`, the snapshot file or the vote file is
/// damaged, or the parts of the directory disagree in a way that means something synced
/// was lost (a vote older than its copy, entries missing, a state machine missing, emptied
/// or behind the log's purge point, a log that ends before what was applied or committed).
///
/// ```
/// let dir = tempfile::tempdir()?;
/// let (log_store, state_machine) = bfkv_raft::open(dir.path())?;
/// drop((log_store, state_machine));
/// // Reopening finds the same node.
/// let (_log_store, _state_machine) = bfkv_raft::open(dir.path())?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn open(
    dir: impl AsRef<Path>,
) -> Result<(LogStore, StateMachine), openraft::StorageError<NodeId>> {
    open_with(dir, Options::default())
}

/// [`open`] with the given [`Options`].
///
/// # Errors
/// As [`open`].
///
/// ```
/// let dir = tempfile::tempdir()?;
/// let options = bfkv_raft::Options { sm_cache_size: 256 << 20, ..Default::default() };
/// let (_log_store, _state_machine) = bfkv_raft::open_with(dir.path(), options)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn open_with(
    dir: impl AsRef<Path>,
    options: Options,
) -> Result<(LogStore, StateMachine), openraft::StorageError<NodeId>> {
    let dir = dir.as_ref();
    let opened = std::fs::create_dir_all(dir)
        .map_err(|e| error::Error::io(dir, e))
        // The log tree first: its directory lock is held from here on, so a second process
        // opening this node fails before it can touch (and clean up) `sm/`.
        .and_then(|()| LogStore::open(dir, options.log_cache_size))
        .and_then(|log| {
            let at_open = log.at_open();
            let sm = StateMachine::open(&dir.join("sm"), options.sm_cache_size, at_open.is_new())?;
            checks::check(&at_open, &sm.at_open()?)?;
            Ok((log, sm))
        });
    opened.map_err(|e| e.storage(ErrorSubject::Store, ErrorVerb::Read))
}

/// The one bincode encoding of every stored value: fixed-width little-endian integers (as
/// `bincode::serialize`), and on decoding no bytes left over.
fn codec() -> impl bincode::Options {
    use bincode::Options as _;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .reject_trailing_bytes()
}

/// `value` as stored bytes.
pub(crate) fn encode<T: Serialize>(value: &T) -> error::Result<Vec<u8>> {
    use bincode::Options as _;
    Ok(codec().serialize(value)?)
}

/// Stored bytes back as a `T`.
pub(crate) fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> error::Result<T> {
    use bincode::Options as _;
    Ok(codec().deserialize(bytes)?)
}
