//! The state machine ([`RaftStateMachine`]) on a bfkv tree, its snapshots, and reads.
//!
//! **Apply.** Each entry is one bfkv batch: its effect on keyspace `data` and the new last
//! applied log id (and, for a membership entry, the membership) in `sm_meta`. A crash
//! therefore leaves the tree exactly as after some prefix of the log, and openraft applies
//! the rest again. A CAS (and the previous value a put or delete returns) reads the key
//! before its batch commits; nothing else writes `data` between the two, because openraft
//! applies entries one call at a time (`apply` takes `&mut self`) and `install_snapshot`,
//! the only other writer, takes `&mut self` too. Readers ([`Reader`]) never see half an
//! entry: no `get` sees part of a batch.
//!
//! **Durability.** The tree is opened `Buffered` (see `sm_dir.rs`): an applied entry
//! survives a crash of the process, and one lost to a power cut is applied again from the
//! log. That is only sound while the log still holds it, and openraft purges the log up to
//! a snapshot's last log id once the snapshot is built. So building a snapshot flushes the
//! live tree after copying it: the copy holds only writes acknowledged before the copy,
//! and `flush` makes every acknowledged write durable; the state machine can then never
//! restart behind the snapshot. An installed snapshot's tree is synced before `CURRENT`
//! names it.
//!
//! **Snapshots.** Built by [`Tree::backup`](bfkv::Tree::backup) of the live tree into a
//! scratch directory (writers go on meanwhile), whose applied state becomes the snapshot's
//! metadata, then packed into bytes (`pack.rs`); the backup reads every leaf page it
//! copies, so a live tree with a damaged page builds no snapshot and the damage does not
//! travel to followers. Installed by unpacking into a new generation directory, opening
//! it, checking its applied state against the metadata and reading every record of it
//! (every page's and value's checksum), and only then switching `CURRENT` to it
//! (`sm_dir.rs`); on any failure the new directory goes and the live generation stays.
//! The current snapshot is kept in the live generation's `snapshot` file.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use bfkv::{Batch, Tree};
use openraft::storage::RaftStateMachine;
use openraft::{
    BasicNode, EntryPayload, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftSnapshotBuilder,
    Snapshot, StoredMembership,
};

use crate::error::{blocking, Error, Result, StorageError};
use crate::files::{create_dir, remove_all, sync_dir};
use crate::pack::{pack_dir, unpack};
use crate::sm_dir::{
    applied_state, generation_dir, read_snapshot, scratch_dir, tree_config, write_current,
    write_snapshot, Meta, SmTree, APPLIED, MEMBERSHIP,
};
use crate::{encode, NodeId, Request, Response, TypeConfig};

/// A log entry of this crate's type configuration.
type Entry = openraft::Entry<TypeConfig>;

/// Cache of the short-lived tree that reads a snapshot copy's applied state.
const PEEK_CACHE: usize = 1 << 20;

/// State shared by the state machine, its readers and its snapshot builders.
#[derive(Debug)]
struct Shared {
    /// The state-machine directory (`<node>/sm`).
    root: PathBuf,
    /// Cache size of every generation's tree.
    cache_size: usize,
    /// The live generation. Replaced (under `snapshot`'s lock) by `install_snapshot`; a
    /// reader or builder holding the old one keeps it open until it lets go.
    live: RwLock<Arc<SmTree>>,
    /// The live generation's snapshot metadata. Its lock is held while the snapshot file
    /// or `CURRENT` changes, and while the snapshot file is read.
    snapshot: Mutex<Option<Meta>>,
    /// Numbers scratch directories.
    scratch: AtomicU64,
}

/// The state machine of a node: the replicated key-value map in a bfkv tree. Made by
/// [`open`](crate::open); openraft drives it through [`RaftStateMachine`], the
/// application reads it through [`StateMachine::get`] or a [`Reader`].
#[derive(Debug)]
pub struct StateMachine {
    /// Everything, shared with readers and builders.
    shared: Arc<Shared>,
}

/// A cloneable read handle on the state machine's data, for the application (e.g. reads
/// served after [`Raft::ensure_linearizable`](openraft::Raft::ensure_linearizable)). It
/// follows installed snapshots.
#[derive(Debug, Clone)]
pub struct Reader {
    /// The state machine's shared state.
    shared: Arc<Shared>,
}

/// Builds a snapshot of the state machine ([`RaftSnapshotBuilder`]); openraft runs it
/// beside `apply`.
#[derive(Debug)]
pub struct SnapshotBuilder {
    /// The state machine's shared state.
    shared: Arc<Shared>,
}

impl StateMachine {
    /// Opens the state-machine directory `root`; creates it only for a `new_node` (see
    /// `sm_dir::open`).
    pub(crate) fn open(root: &Path, cache_size: usize, new_node: bool) -> Result<StateMachine> {
        let opened = crate::sm_dir::open(root, cache_size, new_node)?;
        Ok(StateMachine {
            shared: Arc::new(Shared {
                root: root.to_path_buf(),
                cache_size,
                live: RwLock::new(Arc::new(opened.tree)),
                snapshot: Mutex::new(opened.snapshot),
                scratch: AtomicU64::new(0),
            }),
        })
    }

    /// The applied log id and the snapshot's last log id, for the checks at open.
    pub(crate) fn at_open(&self) -> Result<crate::checks::Applied> {
        let (applied, _) = self.shared.live().applied_state()?;
        let snapshot = self
            .shared
            .lock_snapshot()
            .as_ref()
            .and_then(|m| m.last_log_id);
        Ok(crate::checks::Applied { applied, snapshot })
    }

    /// A read handle on the data.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let (_log, sm) = bfkv_raft::open(dir.path())?;
    /// let reader = sm.reader();
    /// assert_eq!(reader.get(b"absent")?, None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reader(&self) -> Reader {
        Reader {
            shared: self.shared.clone(),
        }
    }

    /// The value of `key` in the applied state; as [`Reader::get`].
    ///
    /// # Errors
    /// As [`Reader::get`].
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>, bfkv::Error> {
        self.shared.live().data.get(key)
    }
}

impl Reader {
    /// The value of `key` after the entries applied so far. It reads this node's state
    /// machine, which may lag the cluster: for a linearizable read call
    /// [`Raft::ensure_linearizable`](openraft::Raft::ensure_linearizable) first.
    ///
    /// # Errors
    /// [`bfkv::Error`] from the tree: `KeyTooLarge` for a key no tree holds, `Io` or
    /// `Corruption` reading a leaf.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let (_log, sm) = bfkv_raft::open(dir.path())?;
    /// assert_eq!(sm.reader().get(b"k")?, None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>, bfkv::Error> {
        self.shared.live().data.get(key)
    }
}

impl Shared {
    /// The live generation.
    fn live(&self) -> Arc<SmTree> {
        self.live
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Locks the snapshot metadata (the data under it stays consistent if a holder
    /// panicked: it is only ever replaced whole).
    fn lock_snapshot(&self) -> std::sync::MutexGuard<'_, Option<Meta>> {
        self.snapshot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Builds a snapshot of the live generation and keeps it as the current one.
    fn build(&self) -> Result<Snapshot<TypeConfig>> {
        let live = self.live();
        let scratch = scratch_dir(&self.root, self.scratch.fetch_add(1, Ordering::Relaxed));
        let built = copy_tree(&live, &scratch);
        // Best effort: scratch left behind is removed by the next open.
        let _ = remove_all(&scratch);
        let (meta, data) = built?;
        let mut current = self.lock_snapshot();
        // Keep it unless a snapshot was installed meanwhile (the live generation changed)
        // or a newer one was kept.
        let newer_kept = current
            .as_ref()
            .is_some_and(|m| m.last_log_id > meta.last_log_id);
        if self.live().generation == live.generation && !newer_kept {
            write_snapshot(live.dir(), &meta, &data)?;
            *current = Some(meta.clone());
        }
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }

    /// Installs the snapshot `data` described by `meta` as a new live generation.
    fn install(&self, meta: &Meta, data: &[u8]) -> Result<()> {
        let generation = self.live().generation + 1;
        let dir = generation_dir(&self.root, generation);
        // A failed install of this process may have left it.
        remove_all(&dir)?;
        let tree = match self.make_generation(generation, &dir, meta, data) {
            Ok(tree) => tree,
            Err(e) => {
                let _ = remove_all(&dir);
                return Err(e);
            }
        };
        let mut current = self.lock_snapshot();
        // The switch: from here on a restart finds the new generation.
        write_current(&self.root, generation)?;
        let old = std::mem::replace(
            &mut *self.live.write().unwrap_or_else(PoisonError::into_inner),
            Arc::new(tree),
        );
        *current = Some(meta.clone());
        drop(current);
        // Its directory goes when the last reader or builder using it lets go (now, if
        // none does: closing it then waits for its checkpoint, outside the lock).
        old.retire();
        drop(old);
        Ok(())
    }

    /// Unpacks `data` into generation `generation`'s directory `dir`, checks it against
    /// `meta`, and writes the snapshot file beside it: everything durable, the tree open.
    fn make_generation(
        &self,
        generation: u64,
        dir: &Path,
        meta: &Meta,
        data: &[u8],
    ) -> Result<SmTree> {
        create_dir(dir)?;
        unpack(data, &dir.join("tree"))?;
        let tree = SmTree::open(&self.root, generation, self.cache_size, false)?;
        let (applied, membership) = tree.applied_state()?;
        if applied != meta.last_log_id || membership != meta.last_membership {
            return Err(Error::malformed(
                "snapshot",
                "the applied state in its tree differs from its metadata",
            ));
        }
        read_every_record(&tree.tree)?;
        write_snapshot(dir, meta, data)?;
        sync_dir(&self.root)?;
        Ok(tree)
    }

    /// The current snapshot, read from the live generation's snapshot file.
    fn current_snapshot(&self) -> Result<Option<Snapshot<TypeConfig>>> {
        let current = self.lock_snapshot();
        let Some(meta) = current.clone() else {
            return Ok(None);
        };
        let Some((stored, data)) = read_snapshot(self.live().dir())? else {
            return Err(Error::malformed("snapshot file", "missing"));
        };
        if stored != meta {
            return Err(Error::malformed("snapshot file", "holds another snapshot"));
        }
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

/// Copies `live` into `scratch` and packs the copy; the metadata is the copy's applied
/// state, so it describes exactly the bytes.
fn copy_tree(live: &SmTree, scratch: &Path) -> Result<(Meta, Vec<u8>)> {
    live.tree.backup(scratch)?;
    // See the module docs: the copy must never be ahead of what the live tree has durable.
    live.tree.flush()?;
    let (last_log_id, last_membership) = {
        let copy = Tree::open(tree_config(scratch, PEEK_CACHE))?;
        let state = applied_state(&copy.keyspace("sm_meta")?)?;
        copy.close()?;
        state
    };
    let data = pack_dir(scratch)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let snapshot_id = match &last_log_id {
        Some(id) => format!("{}-{}-{nanos}", id.leader_id.term, id.index),
        None => format!("empty-{nanos}"),
    };
    let meta = Meta {
        last_log_id,
        last_membership,
        snapshot_id,
    };
    Ok((meta, data))
}

/// Reads every record of every keyspace of `tree`, values included: every leaf page and
/// every out-of-line value passes its checksum, or the first that does not is the error.
/// An installed snapshot is read whole before it can replace the live generation, so a
/// pack damaged before it was sealed (its checksum then vouches for the damage) is
/// refused and the old generation kept.
fn read_every_record(tree: &Tree) -> Result<()> {
    for record in tree {
        record?;
    }
    for name in tree.keyspaces()? {
        for record in &tree.keyspace(&name)? {
            record?;
        }
    }
    Ok(())
}

/// Applies `entry` to `sm` as one batch.
fn apply_entry(sm: &SmTree, entry: &Entry) -> Result<Response> {
    let mut batch = sm.tree.batch();
    let response = match &entry.payload {
        EntryPayload::Blank => Response::Empty,
        EntryPayload::Normal(request) => execute(sm, &mut batch, request)?,
        EntryPayload::Membership(membership) => {
            let stored = StoredMembership::new(Some(entry.log_id), membership.clone());
            batch.insert(&sm.meta, MEMBERSHIP, encode(&stored)?);
            Response::Empty
        }
    };
    batch.insert(&sm.meta, APPLIED, encode(&entry.log_id)?);
    batch.commit()?;
    Ok(response)
}

/// Adds `request`'s writes to `batch`; what it did.
fn execute(sm: &SmTree, batch: &mut Batch, request: &Request) -> Result<Response> {
    if let Err(rejected) = request.check_size() {
        return Ok(rejected);
    }
    Ok(match request {
        Request::Put { key, value } => {
            let previous = sm.data.get(key)?;
            batch.insert(&sm.data, key, value);
            Response::Put { previous }
        }
        Request::Delete { key } => {
            let previous = sm.data.get(key)?;
            batch.remove(&sm.data, key);
            Response::Delete { previous }
        }
        Request::Cas { key, expected, new } => {
            let current = sm.data.get(key)?;
            if current != *expected {
                return Ok(Response::Cas {
                    swapped: false,
                    current,
                });
            }
            match new {
                Some(value) => batch.insert(&sm.data, key, value),
                None => batch.remove(&sm.data, key),
            }
            Response::Cas {
                swapped: true,
                current: new.clone(),
            }
        }
    })
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>), StorageError> {
        self.shared
            .live()
            .applied_state()
            .map_err(|e| e.storage(ErrorSubject::StateMachine, ErrorVerb::Read))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let sm = self.shared.live();
        let applied = blocking(move || {
            Ok(entries
                .iter()
                .map(|entry| {
                    apply_entry(&sm, entry)
                        .map_err(|e| e.storage(ErrorSubject::Apply(entry.log_id), ErrorVerb::Write))
                })
                .collect::<Result<Vec<_>, _>>())
        })
        .await;
        applied.map_err(|e| e.storage(ErrorSubject::StateMachine, ErrorVerb::Write))?
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder {
            shared: self.shared.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let shared = self.shared.clone();
        let data = snapshot.into_inner();
        let owned = meta.clone();
        blocking(move || shared.install(&owned, &data))
            .await
            .map_err(|e| {
                e.storage(
                    ErrorSubject::Snapshot(Some(meta.signature())),
                    ErrorVerb::Write,
                )
            })
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let shared = self.shared.clone();
        blocking(move || shared.current_snapshot())
            .await
            .map_err(|e| e.storage(ErrorSubject::Snapshot(None), ErrorVerb::Read))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let shared = self.shared.clone();
        blocking(move || shared.build())
            .await
            .map_err(|e| e.storage(ErrorSubject::Snapshot(None), ErrorVerb::Write))
    }
}

#[cfg(test)]
#[path = "state_machine_tests.rs"]
mod tests;
