//! The state machine's directory: generations of its tree, the `CURRENT` file that names
//! the live one, and the snapshot file.
//!
//! ```text
//! sm/CURRENT            "gen-<generation, 20 digits>\n", replaced atomically
//! sm/gen-N/tree/        the bfkv tree of generation N
//! sm/gen-N/snapshot     generation N's current snapshot (absent until one is built)
//! sm/tmp-K/             scratch for building a snapshot
//! ```
//!
//! Installing a snapshot makes generation N+1 complete (tree unpacked and synced, snapshot
//! file written) before it renames `CURRENT` to name it: a crash before the rename leaves
//! generation N live with its own snapshot, one after it generation N+1 with the installed
//! snapshot, never a tree from one and a snapshot from the other. Opening removes whatever
//! `CURRENT` does not name: a half-written generation, a stale `CURRENT.tmp`, old scratch.
//!
//! Snapshot file format, integers little-endian:
//!
//! ```text
//! magic     8 bytes  "BFKVSNAP"
//! version   u32      1
//! meta_len  u32      then the snapshot's metadata (openraft's SnapshotMeta, bincode)
//! data_len  u64      then the snapshot's bytes (a pack, see pack.rs)
//! crc       u32      CRC-32C of every byte before it
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use bfkv::{Config, Durability, Keyspace, Tree};
use openraft::{BasicNode, LogId, SnapshotMeta, StoredMembership};

use crate::error::{Error, Result};
use crate::files::{
    create_dir, read_if_present, remove_all, remove_file_if_present, sync_dir, write_atomic,
};
use crate::{decode, encode, NodeId};

/// Snapshot metadata of this crate's node types.
pub(crate) type Meta = SnapshotMeta<NodeId, BasicNode>;

/// The last applied log id and the last applied membership.
pub(crate) type AppliedState = (Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>);

/// The file naming the live generation.
const CURRENT: &str = "CURRENT";
/// A generation's snapshot file.
const SNAPSHOT: &str = "snapshot";
/// The snapshot file's first bytes.
const SNAPSHOT_MAGIC: &[u8; 8] = b"BFKVSNAP";
/// The snapshot file format this code writes and reads.
const SNAPSHOT_VERSION: u32 = 1;
/// `sm_meta` key of the last applied log id.
pub(crate) const APPLIED: &[u8] = b"applied";
/// `sm_meta` key of the last applied membership.
pub(crate) const MEMBERSHIP: &[u8] = b"membership";
/// The file every bfkv tree directory holds from its creation on: its page store.
const TREE_DATA: &str = "data";

/// One generation's open tree and its keyspaces.
#[derive(Debug)]
pub(crate) struct SmTree {
    /// The tree, closed when the last handle on this generation drops.
    pub(crate) tree: Tree,
    /// The application's keys and values.
    pub(crate) data: Keyspace,
    /// Last applied log id and membership.
    pub(crate) meta: Keyspace,
    /// Which generation this is.
    pub(crate) generation: u64,
    /// Declared last, so it drops after `tree` has closed.
    retire: Retire,
}

/// Removes a replaced generation's directory once its tree is closed.
#[derive(Debug)]
struct Retire {
    /// The generation's directory.
    dir: PathBuf,
    /// Set when another generation replaced this one.
    retired: AtomicBool,
}

impl Drop for Retire {
    fn drop(&mut self) {
        // Best effort: a directory left behind is removed by the next open.
        if *self.retired.get_mut() {
            let _ = remove_all(&self.dir);
        }
    }
}

impl SmTree {
    /// Opens the tree of generation `generation` under `root`; `create` allows an absent
    /// one to be made (a fresh node), otherwise it must exist.
    pub(crate) fn open(
        root: &Path,
        generation: u64,
        cache_size: usize,
        create: bool,
    ) -> Result<SmTree> {
        let dir = generation_dir(root, generation);
        let tree_dir = dir.join("tree");
        if !tree_dir.is_dir() {
            if !create {
                return Err(Error::malformed(
                    "sm/CURRENT",
                    "names a generation without a tree",
                ));
            }
            if !dir.is_dir() {
                create_dir(&dir)?;
            }
        } else if !create && !tree_dir.join(TREE_DATA).is_file() {
            // bfkv would make an empty tree there: the applied state would be lost.
            return Err(Error::inconsistent(
                "state machine",
                "the live generation's tree directory holds no tree (its files are gone)",
            ));
        }
        let tree = Tree::open(tree_config(&tree_dir, cache_size))?;
        Ok(SmTree {
            data: tree.keyspace("data")?,
            meta: tree.keyspace("sm_meta")?,
            tree,
            generation,
            retire: Retire {
                dir,
                retired: AtomicBool::new(false),
            },
        })
    }

    /// This generation's directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.retire.dir
    }

    /// Marks this generation replaced: its directory goes when its last handle drops.
    pub(crate) fn retire(&self) {
        self.retire.retired.store(true, Ordering::Release);
    }

    /// The last applied log id and membership.
    pub(crate) fn applied_state(&self) -> Result<AppliedState> {
        applied_state(&self.meta)
    }
}

/// The last applied log id and membership stored in the `sm_meta` keyspace `meta`.
pub(crate) fn applied_state(meta: &Keyspace) -> Result<AppliedState> {
    let applied = meta.get(APPLIED)?.map(|b| decode(&b)).transpose()?;
    let membership = meta.get(MEMBERSHIP)?.map(|b| decode(&b)).transpose()?;
    Ok((applied, membership.unwrap_or_default()))
}

/// How every state-machine tree is opened. `Buffered`: an applied entry survives a crash
/// of the process, and one lost to a power cut is applied again from the log (whose
/// entries are kept until a snapshot covering them is durable; see `state_machine.rs`).
pub(crate) fn tree_config(dir: &Path, cache_size: usize) -> Config {
    Config::new(dir)
        .page_size(crate::PAGE_SIZE)
        .cache_size(cache_size)
        .durability(Durability::Buffered)
}

/// The directory of generation `generation`.
pub(crate) fn generation_dir(root: &Path, generation: u64) -> PathBuf {
    root.join(format!("gen-{generation:020}"))
}

/// The live generation `CURRENT` names; `None` if there is no `CURRENT` yet.
fn read_current(root: &Path) -> Result<Option<u64>> {
    let Some(bytes) = read_if_present(&root.join(CURRENT))? else {
        return Ok(None);
    };
    let generation = std::str::from_utf8(&bytes)
        .ok()
        .and_then(|s| s.strip_prefix("gen-"))
        .and_then(|s| s.strip_suffix('\n'))
        .filter(|digits| digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|digits| digits.parse().ok())
        .ok_or(Error::malformed("sm/CURRENT", "not \"gen-<20 digits>\\n\""))?;
    Ok(Some(generation))
}

/// Makes `generation` the live one, atomically and durably.
pub(crate) fn write_current(root: &Path, generation: u64) -> Result<()> {
    write_atomic(
        root,
        CURRENT,
        &[format!("gen-{generation:020}\n").as_bytes()],
    )
}

/// What [`open`] found.
#[derive(Debug)]
pub(crate) struct Opened {
    /// The live generation's tree.
    pub(crate) tree: SmTree,
    /// Its snapshot's metadata, if it has a snapshot.
    pub(crate) snapshot: Option<Meta>,
}

/// Opens the state-machine directory `root` and removes everything `CURRENT` does not
/// name. If there is no state machine there, a first generation is created only with
/// `new_node` (the log is empty too); else it is refused: the log holds entries the
/// state machine applied.
pub(crate) fn open(root: &Path, cache_size: usize, new_node: bool) -> Result<Opened> {
    std::fs::create_dir_all(root).map_err(|e| Error::io(root, e))?;
    let Some(generation) = read_current(root)? else {
        return open_without_current(root, cache_size, new_node);
    };
    // Opened before anything is removed: a `CURRENT` naming no generation fails here.
    let tree = SmTree::open(root, generation, cache_size, false)?;
    clean(root, Some(generation))?;
    remove_file_if_present(&tree.dir().join(format!("{SNAPSHOT}.tmp")))?;
    let snapshot = read_snapshot(tree.dir())?.map(|(meta, _)| meta);
    Ok(Opened { tree, snapshot })
}

/// [`open`] of a directory without `CURRENT`. The first open creates generation 1 and
/// then writes `CURRENT`; an install writes a generation's snapshot file before `CURRENT`
/// names it. So without `CURRENT`:
/// - no generation: a new node if `new_node`, else a state machine that is gone;
/// - generation 1 alone, without a snapshot file: a first open that crashed, or `CURRENT`
///   lost before any snapshot; taken up again;
/// - one generation alone with a snapshot file that reads back and matches its tree's
///   applied state: the live one, whose `CURRENT` was lost; taken up with its snapshot;
/// - anything else (several generations, or one that is not complete): it cannot be told
///   which was live, so the open is refused and the directory left for an operator.
fn open_without_current(root: &Path, cache_size: usize, new_node: bool) -> Result<Opened> {
    let found = generations(root)?;
    let generation = match found.as_slice() {
        [] if new_node => 1,
        [] => {
            return Err(Error::inconsistent(
                "state machine",
                "sm/ holds no state machine, but the log holds entries: it was lost",
            ))
        }
        [only] => *only,
        _ => {
            return Err(Error::inconsistent(
                "sm/CURRENT",
                "missing, and several generations exist: which was live cannot be told",
            ))
        }
    };
    let dir = generation_dir(root, generation);
    let snapshot = read_snapshot(&dir)?.map(|(meta, _)| meta);
    if generation != 1 && snapshot.is_none() {
        return Err(Error::inconsistent(
            "sm/CURRENT",
            "missing, and the only generation has no snapshot: it may be half made",
        ));
    }
    let tree = SmTree::open(root, generation, cache_size, generation == 1)?;
    if let Some(meta) = &snapshot {
        let (applied, membership) = tree.applied_state()?;
        if applied < meta.last_log_id || membership.log_id() < meta.last_membership.log_id() {
            return Err(Error::inconsistent(
                "sm/CURRENT",
                "missing, and the only generation's tree is behind its snapshot",
            ));
        }
    }
    clean(root, Some(generation))?;
    remove_file_if_present(&tree.dir().join(format!("{SNAPSHOT}.tmp")))?;
    sync_dir(tree.dir())?;
    sync_dir(root)?;
    write_current(root, generation)?;
    Ok(Opened { tree, snapshot })
}

/// The generations that have a directory under `root`.
fn generations(root: &Path) -> Result<Vec<u64>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(root).map_err(|e| Error::io(root, e))? {
        let name = entry.map_err(|e| Error::io(root, e))?.file_name();
        if let Some(n) = name.to_str().and_then(|n| n.strip_prefix("gen-")) {
            found.push(n.parse().unwrap_or(u64::MAX));
        }
    }
    Ok(found)
}

/// Removes every entry of `root` but `CURRENT` and the directory of generation `keep`.
fn clean(root: &Path, keep: Option<u64>) -> Result<()> {
    let keep = keep.map(|g| generation_dir(root, g));
    let entries = std::fs::read_dir(root).map_err(|e| Error::io(root, e))?;
    let mut removed = false;
    for entry in entries {
        let path = entry.map_err(|e| Error::io(root, e))?.path();
        if path.file_name().is_some_and(|n| n == CURRENT) || keep.as_ref() == Some(&path) {
            continue;
        }
        remove_all(&path)?;
        removed = true;
    }
    if removed {
        sync_dir(root)?;
    }
    Ok(())
}

/// A scratch directory under `root` for building a snapshot; `n` makes it unique.
pub(crate) fn scratch_dir(root: &Path, n: u64) -> PathBuf {
    root.join(format!("tmp-{n}"))
}

/// Writes (replacing atomically) the snapshot file of the generation in `dir`.
pub(crate) fn write_snapshot(dir: &Path, meta: &Meta, data: &[u8]) -> Result<()> {
    let meta = encode(meta)?;
    let meta_len = u32::try_from(meta.len())
        .map_err(|_| Error::malformed("snapshot file", "metadata longer than 4 GiB"))?;
    let mut head = SNAPSHOT_MAGIC.to_vec();
    head.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
    head.extend_from_slice(&meta_len.to_le_bytes());
    head.extend_from_slice(&meta);
    head.extend_from_slice(&(data.len() as u64).to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&head), data);
    write_atomic(dir, SNAPSHOT, &[&head, data, &crc.to_le_bytes()])
}

/// The snapshot of the generation in `dir`, checked; `None` if it has none.
pub(crate) fn read_snapshot(dir: &Path) -> Result<Option<(Meta, Vec<u8>)>> {
    read_if_present(&dir.join(SNAPSHOT))?
        .map(decode_snapshot)
        .transpose()
}

/// A snapshot file's bytes as metadata and data.
fn decode_snapshot(mut bytes: Vec<u8>) -> Result<(Meta, Vec<u8>)> {
    let bad = |reason| Error::malformed("snapshot file", reason);
    let body_len = bytes.len().checked_sub(4).ok_or(bad("truncated"))?;
    let crc = u32::from_le_bytes(bytes[body_len..].try_into().map_err(|_| bad("truncated"))?);
    if !bytes.starts_with(SNAPSHOT_MAGIC) {
        return Err(bad("bad magic"));
    }
    if crc != crc32c::crc32c(&bytes[..body_len]) {
        return Err(bad("checksum mismatch"));
    }
    let field = |at: usize, len: usize| bytes.get(at..at + len).ok_or(bad("truncated"));
    if u32::from_le_bytes(field(8, 4)?.try_into().map_err(|_| bad("truncated"))?)
        != SNAPSHOT_VERSION
    {
        return Err(bad("unknown version"));
    }
    let meta_len =
        u32::from_le_bytes(field(12, 4)?.try_into().map_err(|_| bad("truncated"))?) as usize;
    let meta: Meta = decode(field(16, meta_len)?)?;
    let data_at = 16 + meta_len + 8;
    let data_len = u64::from_le_bytes(
        field(16 + meta_len, 8)?
            .try_into()
            .map_err(|_| bad("truncated"))?,
    );
    if (data_at as u64).checked_add(data_len) != Some(body_len as u64) {
        return Err(bad("data length does not match the file"));
    }
    bytes.truncate(body_len);
    bytes.drain(..data_at);
    Ok((meta, bytes))
}
