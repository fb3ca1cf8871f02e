//! Opening, checkpointing and closing a file-backed tree.
//!
//! A directory (created 0700) holds `LOCK` (an advisory lock), `data` (the page store) and `checkpoint`
//! (the leaf map); before anything is created, `tree_dir.rs` refuses a path that is not a
//! tree's (a file, a directory of other files, a backup that did not complete). A checkpoint writes buffered leaves (shadow-style, to new pages: every
//! dirty one, or for a fuzzy one those the log it keeps does not cover, `checkpoint.rs`),
//! syncs the data file, then replaces `checkpoint` atomically (write a temporary file,
//! fsync, rename, fsync the directory). Pages the last checkpoint references are never
//! freed before the next checkpoint is durable, so after a crash `open` finds a consistent
//! tree: the one of the last completed checkpoint, and the log from where it says replay
//! starts. The checkpoint file's format is in `checkpoint_file.rs`.

use std::collections::HashSet;
use std::fs::{self, File};
use std::path::{Path as FsPath, PathBuf};

use super::checkpoint_file::{decode, encode, write_atomically};
use super::journal::Journal;
use crate::config::{Config, IoBackend};
use crate::error::{Error, Result};
use crate::pool::{BufferPool, PageId};
use crate::store::{Backend, FileStore, PageStore, FIRST_DATA_PAGE};
use crate::sync::{Arc, Mutex};
use crate::tree::blob::Blobs;
use crate::tree::index::inner;
use crate::tree::index::Index;
use crate::tree::stats::Event;
use crate::tree::storage::PageTracker;
use crate::tree::storage::Storage;
use crate::tree::writeback::{Plan, SUPERSEDED_LEAST, SUPERSEDED_SHARE};
use crate::tree::Shared;
use crate::wal::vfs::{self, LogFs, StdFs};
use crate::wal::{Lsn, Wal, WalConfig};
use crate::Durability;

/// Rounds a full checkpoint takes at most before it writes every dirty leaf at once (writers
/// may keep dirtying leaves while it goes).
const ROUNDS: usize = 32;

/// What a checkpoint writes (`checkpoint.rs`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Every dirty leaf.
    Full,
    /// Only the dirty leaves the log it keeps does not cover.
    Fuzzy,
    /// A share of the dirty leaves, as one round of a full checkpoint.
    Round,
}

/// How long `open` keeps trying a directory lock that looks held (`DirLock::acquire`).
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The advisory lock that keeps a directory to one open `Tree`.
pub(crate) struct DirLock {
    file: Mutex<Option<File>>,
}

impl DirLock {
    fn acquire(dir: &FsPath) -> Result<DirLock> {
        let path = dir.join("LOCK");
        if let Ok(meta) = fs::symlink_metadata(&path) {
            crate::sys::check_trusted(&meta).map_err(|e| Error::io(&path, e))?;
        }
        let file = crate::sys::private_options()
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        // A child this process forks holds a copy of every descriptor until its `exec`
        // closes them, the lock of a tree closed here a moment ago among them: what looks
        // held may be that, so it is tried again for a short while before `Locked`.
        let deadline = std::time::Instant::now() + LOCK_WAIT;
        while !crate::sys::try_lock(&file).map_err(|e| Error::io(&path, e))? {
            if std::time::Instant::now() >= deadline {
                return Err(Error::Locked {
                    path: dir.to_path_buf(),
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Ok(DirLock {
            file: Mutex::new(Some(file)),
        })
    }

    /// Gives the directory up (closing the descriptor drops the flock).
    pub(crate) fn release(&self) {
        self.file.lock().take();
    }
}

/// Opens or creates the tree `config` describes.
pub(crate) fn open(config: Config) -> Result<Shared> {
    let Some(dir) = config.dir.clone() else {
        let pool = BufferPool::new(config.cache_size, 0)?;
        let index = Index::new(
            Shared::empty_root(&pool, config.page_size)?,
            config.page_size,
        );
        return Ok(Shared::assemble(
            config,
            pool,
            index,
            Storage::in_memory(),
            Journal::none(),
            None,
        ));
    };
    super::tree_dir::check(&dir)?;
    crate::sys::create_private_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let lock = DirLock::acquire(&dir)?;
    let backend = match config.io_backend {
        IoBackend::IoUring => Backend::IoUring,
        IoBackend::Auto if cfg!(target_os = "linux") => Backend::IoUring,
        IoBackend::Pread | IoBackend::Auto => Backend::Pread,
    };
    let data_path = dir.join("data");
    let store: Arc<dyn PageStore> = Arc::new(if config.page_size_set {
        FileStore::open(&data_path, config.page_size, backend)?
    } else {
        FileStore::open_keeping_size(&data_path, config.page_size, backend)?
    });
    let blobs = Some(dir.join("blobs"));
    open_on(
        config,
        &dir,
        store,
        data_path,
        blobs,
        Arc::new(StdFs),
        Some(lock),
    )
}

/// Opens the tree in `dir` over the page store `store` (named `data_path` in errors), with
/// its log and checkpoint file on `fs`: the production `open` passes the data file and
/// [`StdFs`]; the power-cut tests pass a `FaultStore` and an in-memory `MemFs`, and no
/// blob file (`blobs_path`; without one every value is stored inline). Unless `config`
/// sets a page size, the tree takes the store's.
pub(crate) fn open_on(
    mut config: Config,
    dir: &FsPath,
    store: Arc<dyn PageStore>,
    data_path: PathBuf,
    blobs_path: Option<PathBuf>,
    fs: Arc<dyn LogFs>,
    lock: Option<DirLock>,
) -> Result<Shared> {
    if store.page_size() != config.page_size {
        if config.page_size_set {
            return Err(Error::InvalidConfig {
                reason: "page size differs from the one the data file was created with",
            });
        }
        // An existing tree's own page size, which the limits and the cache's minimum follow.
        config.page_size = store.page_size();
        config.validate()?;
    }
    let ckpt_path = dir.join("checkpoint");
    let loaded = match vfs::read_all(&*fs, &ckpt_path) {
        Ok(bytes) => Some(decode(&bytes, &ckpt_path, config.page_size)?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io(&ckpt_path, e)),
    };
    let file_pages = store.stats().file_pages;
    let checkpoint_lsn = loaded.as_ref().map_or(0, |(lsn, _, _)| *lsn);
    // Each checkpointed leaf's low bound and image LSN, for replay.
    let mut floors: Vec<(Vec<u8>, Lsn)> = Vec::new();
    let mut table = Vec::new();
    let (pool, root, tracker) = if let Some((_, leaves, extents)) = loaded {
        let referenced: HashSet<u64> = leaves.iter().map(|l| l.page).collect();
        table = extents;
        for l in &leaves {
            if l.page < FIRST_DATA_PAGE || l.page >= file_pages {
                return Err(Error::corruption(
                    &ckpt_path,
                    None,
                    "leaf page outside the data file",
                ));
            }
        }
        let entries: Vec<(PageId, u64)> = leaves.iter().map(|l| (l.pid, l.page)).collect();
        let tracked: Vec<(PageId, u64, Lsn)> =
            leaves.iter().map(|l| (l.pid, l.page, l.lsn)).collect();
        floors = leaves.iter().map(|l| (l.low.clone(), l.lsn)).collect();
        let pool =
            BufferPool::with_pages(config.cache_size, config.second_chance_percent, &entries)?;
        let root = inner::bulk_load(
            leaves.into_iter().map(|l| (l.low, l.pid)).collect(),
            config.page_size,
        )
        .ok_or_else(|| Error::corruption(&ckpt_path, None, "checkpoint has no leaves"))?;
        store.set_free_pages(
            (FIRST_DATA_PAGE..file_pages)
                .filter(|p| !referenced.contains(p))
                .collect(),
        )?;
        let ids = tracked.iter().map(|&(pid, _, _)| pid as usize + 1).max();
        let pages = PageTracker::from_checkpoint(&tracked);
        (
            pool,
            root,
            pages.replaying_from(checkpoint_lsn, ids.unwrap_or(0)),
        )
    } else {
        // No checkpoint: nothing was ever committed here, so every data page is free.
        store.set_free_pages((FIRST_DATA_PAGE..file_pages).collect())?;
        let pool = BufferPool::new(config.cache_size, config.second_chance_percent)?;
        let root = Shared::empty_root(&pool, config.page_size)?;
        (pool, root, PageTracker::default().replaying_from(0, 0))
    };
    let wal = Wal::open_on(
        fs,
        &dir.join("wal"),
        WalConfig {
            // A tree without logging still opens its log to replay what an earlier session
            // wrote there; it never appends.
            durability: match config.durability {
                Durability::None => Durability::Buffered,
                d => d,
            },
            flush_interval: config.flush_interval,
            segment_size: config.log_segment_size,
            // Nothing to stage without appends (a crashed session's ring is still read).
            ring_capacity: match config.durability {
                Durability::None => 0,
                _ => config.log_staging_size as u64,
            },
        },
    )?;
    let blobs = match blobs_path {
        Some(path) => Blobs::open(&path, &table)?,
        None => Blobs::none(),
    };
    let durability = config.durability;
    let index = Index::new(root, config.page_size);
    let shared = Shared::assemble(
        config,
        pool,
        index,
        Storage::new(store, data_path, tracker, blobs),
        Journal::new(wal, durability, checkpoint_lsn),
        lock,
    );
    shared.load_keyspace_operators()?;
    shared.replay_log(&floors)?;
    // Pages written back during replay are stamped with the log's end, not with how far
    // replay had got: a fuzzy checkpoint must not list one under a leaf dirtied since.
    if let Some(wal) = shared.journal().wal() {
        let end = wal.next_lsn();
        shared.storage().pages().one_at_a_time().replayed_to(end);
    }
    match shared.finish_drops() {
        // A damaged catalog leaf answers its own reads with the error; the rest of the tree
        // opens, and the next open tries the unfinished drops again.
        Ok(()) | Err(Error::Corruption { .. }) => {}
        Err(e) => return Err(e),
    }
    Ok(shared)
}

impl Shared {
    /// Writes every buffered leaf and a new checkpoint file (see the module docs). Where
    /// checkpoints can be fuzzy, it does so in rounds, each a checkpoint that writes a share
    /// of the dirty leaves (`Kind::Round`): the pages they supersede are free for the next
    /// round, so the data file grows by a share of the leaves, not by every dirty one.
    pub(crate) fn checkpoint(&self) -> Result<()> {
        if self.may_checkpoint_fuzzily() {
            for _ in 0..ROUNDS {
                if !self.checkpoint_with(Kind::Round, || {})? {
                    return Ok(());
                }
            }
        }
        self.checkpoint_with(Kind::Full, || {}).map(|_| ())
    }

    /// A checkpoint that leaves unwritten the dirty leaves whose missing writes are all in
    /// the log it keeps (`checkpoint.rs`): the log from where replay starts now. Once that
    /// outgrew `Config::checkpoint_log_bytes`, it is one round of moving the start to
    /// within half of that. A full one when writes are not logged or the tree holds large
    /// values.
    pub(crate) fn checkpoint_fuzzy(&self) -> Result<()> {
        self.checkpoint_with(Kind::Fuzzy, || {}).map(|_| ())
    }

    /// A full checkpoint in one round, running `between` after the first pass (tests write
    /// there).
    #[cfg(all(test, not(shuttle)))]
    pub(in crate::tree) fn checkpoint_between(&self, between: impl FnOnce()) -> Result<()> {
        self.checkpoint_with(Kind::Full, between).map(|_| ())
    }

    /// Whether a checkpoint may leave dirty leaves unwritten in this tree.
    pub(crate) fn may_checkpoint_fuzzily(&self) -> bool {
        self.journal().logs_writes() && !self.storage().blobs().ever_used()
    }

    /// A checkpoint of kind `kind` (`Fuzzy` and `Round` are full where the tree does not
    /// allow fuzzy ones); `between` runs after the first pass. `Ok(true)` if replay still
    /// starts before its LSN: it left unwritten a dirty leaf that may lack an older write.
    fn checkpoint_with(&self, kind: Kind, between: impl FnOnce()) -> Result<bool> {
        let (Some(store), Some(dir), Some(wal)) = (
            self.storage().store(),
            &self.config().dir,
            self.journal().wal(),
        ) else {
            return Ok(false);
        };
        let mut seen = self.storage().pages().one_at_a_time();
        self.drain_orphans();
        // Every write below this LSN was applied before it was logged, so the leaves written
        // below hold it; replay after a crash starts here, or earlier if a dirty leaf is left
        // unwritten.
        let lsn = wal.next_lsn();
        // Every reference applied before now is in the leaves written below (`blob/extents.rs`).
        let blob_count = self.storage().blobs().start_checkpoint();
        // Decided after the blob count is taken: a large value written before would have
        // its extent freed while a dirty leaf this checkpoint leaves unwritten references
        // it (`Blobs::ever_used`).
        let fuzzy = self.may_checkpoint_fuzzily();
        let start = self.journal().checkpoint_lsn();
        let share = || {
            let pages = self.storage().pages().checkpointed_pages();
            (pages / SUPERSEDED_SHARE).max(SUPERSEDED_LEAST)
        };
        // Replay from where it starts now covers every dirty leaf that has a page with its
        // current bounds: the last checkpoint left dirty only leaves it covered, and what was
        // dirtied since was logged after it. What moves the start is written a share at a
        // time: each round supersedes pages the next one reuses, so the file grows by a
        // share of the leaves, not by every dirty one.
        let (from, toward, budget) = match kind {
            // Replay keeps its start until the log since it outgrows the limit; then it
            // moves to the oldest start within half the limit (so the next move is due
            // after as much log again), in rounds (`Inspections::move_start`).
            Kind::Fuzzy if fuzzy => {
                let limit = self.config().checkpoint_log_bytes;
                if self.journal().grew_past(limit) {
                    let earliest = lsn.saturating_sub(limit / 2).max(start);
                    (Some(start), seen.move_start(earliest, lsn), share())
                } else {
                    (Some(start), start, 0)
                }
            }
            Kind::Round if fuzzy => (Some(start), lsn, share()),
            _ => (None, lsn, 0),
        };
        let mut plan = Plan::new(lsn, from, &mut seen).toward(toward, budget);
        // Without a log to replay, the leaves written below must not catch a batch
        // half-applied: batches wait until the snapshot is taken (`versions/store.rs`).
        let batches_held =
            (!self.journal().logs_writes()).then(|| self.versions().checkpoint_writing());
        self.storage().pages().start_checkpoint();
        // First pass, without the structure lock: write back every buffered leaf while
        // writers (splits included) go on. A leaf whose split finds the lock busy is left to
        // the second pass.
        self.checkpoint_pass(None, &mut plan)?;
        between();
        let snapshot = {
            // Second pass, holding the structure lock so the set of leaves stays fixed: only
            // leaves not written since the LSN was taken (dirtied before it and skipped, or
            // split meanwhile) are left to write, so writers that need a split wait
            // briefly. Leaf locks are taken while holding it: safe, because leaf-lock holders
            // only ever try the structure lock.
            let smo = self.index().lock_smo();
            self.checkpoint_pass(Some(&smo), &mut plan)?;
            let leaves = self.index().leaves();
            let snapshot = self.storage().pages().begin_snapshot(leaves);
            drop(smo);
            snapshot.map_err(|_| {
                self.storage()
                    .corruption(None, "leaf without a disk page at checkpoint")
            })?
        };
        drop(batches_held);
        let replay_from = plan.replay_from();
        let held_back = replay_from != lsn;
        let blobs = self.storage().blobs();
        let table = blobs.table(snapshot.iter().map(|l| l.page));
        // The pages hold every write applied before their leaf was written, some logged
        // after `lsn`: their records must be durable before the checkpoint makes those
        // writes permanent, or a log failure could refuse a write the checkpoint kept. So
        // must the extents their references name.
        let result = wal
            .sync_through(wal.next_lsn())
            .and_then(|()| store.sync())
            .and_then(|()| blobs.sync())
            .and_then(|()| {
                let bytes = encode(self.page_size(), replay_from, &snapshot, &table);
                write_atomically(&**wal.fs(), dir, &dir.join("checkpoint"), &bytes)
            });
        for p in self.storage().pages().finish_checkpoint(result.is_ok()) {
            self.storage().free(p);
        }
        if result.is_ok() {
            blobs.checkpointed(blob_count, &table);
            self.counters().count(Event::Checkpoint);
            // The checkpoint is durable: the log below where its replay starts is no longer
            // needed.
            seen.released_before(replay_from);
            self.journal().checkpointed(replay_from)?;
        }
        // The snapshot of every leaf was built and freed here: give its memory back.
        crate::sys::release_free_memory();
        result.map(|()| held_back)
    }
}

#[cfg(all(test, not(shuttle)))]
mod tests {
    use super::*;

    #[test]
    #[cfg(all(not(shuttle), target_os = "linux"))]
    fn a_closed_tree_leaves_the_directory_to_the_next_owner_untouched() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = Config::new(dir.path()).durability(Durability::Buffered);
        let first = open(config.clone()).expect("open");
        first
            .write(
                &crate::tree::keyspace::stored_key(b"a"),
                crate::tree::WriteOp::Put(b"1"),
            )
            .expect("write");
        first.close().expect("close");
        // The directory is free: the next tree opens it while the first still exists.
        let second = open(config.clone()).expect("second open");
        second
            .write(
                &crate::tree::keyspace::stored_key(b"b"),
                crate::tree::WriteOp::Put(b"2"),
            )
            .expect("write");
        let staging = dir.path().join("wal").join("staging");
        assert!(staging.exists());
        drop(first);
        assert!(
            staging.exists(),
            "the closed tree removed its successor's staging file"
        );
        // The second tree crashes (a copy of the directory now is what a crash leaves):
        // its staged write comes back from the directory.
        let copy = tempfile::tempdir().expect("tempdir");
        for sub in ["", "wal"] {
            std::fs::create_dir_all(copy.path().join(sub)).expect("mkdir");
            for e in std::fs::read_dir(dir.path().join(sub)).expect("read_dir") {
                let e = e.expect("entry");
                if e.path().is_file() && e.file_name() != "LOCK" {
                    std::fs::copy(e.path(), copy.path().join(sub).join(e.file_name()))
                        .expect("copy");
                }
            }
        }
        drop(second);
        let third = crate::Tree::open(Config::new(copy.path())).expect("reopen");
        assert_eq!(third.get(b"a").expect("get"), Some(b"1".to_vec()));
        assert_eq!(third.get(b"b").expect("get"), Some(b"2".to_vec()));
    }

    /// A lock that is let go within `LOCK_WAIT` (here by a tree closed on another thread;
    /// in the case it is for, by a forked child's `exec`) is waited for; one that is not
    /// gives `Locked`, after the wait.
    #[test]
    #[cfg(not(shuttle))]
    fn open_waits_briefly_for_a_lock_being_let_go() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = Config::new(dir.path());
        let first = crate::Tree::open(config.clone()).expect("open");
        let started = std::time::Instant::now();
        match crate::Tree::open(config.clone()) {
            Err(Error::Locked { .. }) => assert!(started.elapsed() >= LOCK_WAIT),
            other => panic!("expected Locked, got {other:?}"),
        }
        let closer = std::thread::spawn(move || {
            std::thread::sleep(LOCK_WAIT / 5);
            drop(first);
        });
        let second = crate::Tree::open(config).expect("the lock was let go meanwhile");
        closer.join().expect("closer");
        drop(second);
    }

    #[test]
    #[cfg(not(shuttle))]
    fn a_logged_record_larger_than_the_tree_accepts_fails_open_promptly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = Config::new(dir.path()).durability(Durability::Sync);
        let tree = crate::Tree::open(config.clone()).expect("open");
        tree.insert(b"k", b"v").expect("insert");
        tree.close().expect("close");
        // A record no insert could have made: a 5 KB key, well formed in the log.
        let wal = Wal::open(
            &dir.path().join("wal"),
            WalConfig {
                durability: Durability::Sync,
                ..WalConfig::default()
            },
        )
        .expect("log");
        let key = vec![b'x'; 5000];
        let op = crate::wal::LogOp::Insert {
            key: &key,
            value: b"v",
        };
        let appended = wal.append(op).expect("append");
        wal.commit(appended).expect("commit");
        drop(wal);
        match crate::Tree::open(config) {
            Err(Error::Corruption { .. }) => {}
            other => panic!("expected Corruption, got {other:?}"),
        }
    }

    #[test]
    #[cfg(not(shuttle))]
    fn buffered_trees_stage_in_their_directory_unless_told_not_to() {
        for staging in [crate::config::DEFAULT_LOG_STAGING_SIZE, 64 << 10, 0] {
            let dir = tempfile::tempdir().expect("tempdir");
            let config = Config::new(dir.path()).log_staging_size(staging);
            let tree = crate::Tree::open(config.clone()).expect("open");
            for i in 0..2000u32 {
                tree.insert(i.to_be_bytes(), [7u8; 40]).expect("insert");
            }
            let ring = dir.path().join("wal").join("staging");
            let staged = staging != 0 && cfg!(target_os = "linux");
            assert_eq!(ring.exists(), staged, "staging {staging}");
            tree.close().expect("close");
            // A clean close leaves no ring behind.
            assert!(!ring.exists());
            let tree = crate::Tree::open(config).expect("reopen");
            for i in 0..2000u32 {
                assert_eq!(tree.get(i.to_be_bytes()).expect("get"), Some(vec![7u8; 40]));
            }
        }
    }
}
