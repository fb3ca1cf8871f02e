//! Large values, stored out of line: a value too long for a leaf record goes to an extent of
//! the blob file (`blobs` in the tree's directory, `store/blob.rs`), and the leaf, the log
//! and the checkpoint hold only a [`BlobRef`] to it: where it is, how long, its checksum.
//!
//! **Why a file of its own.** Extents are runs of contiguous blocks, written and read in
//! large requests; the data file's allocator hands out single pages, last freed first, to
//! write-backs that run during recovery. A separate file keeps the two apart: recovery
//! claims the extents the log names before anything else can allocate there.
//!
//! **What is stored in place of the value.** A reference is a 28-byte value: an 8-byte
//! marker, the extent's first block and the value's length (u64 LE each), and the CRC-32C
//! of the first block number followed by the value. A user value that happens to read as a
//! reference (28 bytes starting with the marker) is stored out of line too, so a stored
//! value is a reference exactly when it decodes as one. Folding the block number into the
//! checksum makes a reference to a reused extent fail verification.
//!
//! **Which extents are in use** (so that none leaks, and none is reused while referenced).
//! An extent's life: written (not yet in the tree), applied (its reference written to a
//! leaf, under the leaf's lock), and one day no longer referenced: overwritten or removed,
//! possibly by a blind write whose old value nobody reads. Nothing tracks that moment;
//! checkpoints find it instead. Every leaf page written records the extents its records
//! reference (`page_written`). A checkpoint that took its LSN at checkpoint count `s` holds
//! every write applied before then; so an extent applied before `s` that none of the
//! checkpoint's pages references is referenced by nothing that recovery from this checkpoint
//! or any later state can see, and is freed once the checkpoint is durable. The checkpoint
//! file lists the extents its pages reference (with the page); recovery starts from those,
//! claims the extents of the log records it replays, and every other block is free: an
//! extent written whose record never became durable is reclaimed by the crash itself.
//!
//! **Readers.** A reference read under a leaf's lock stays valid while the lock is held (an
//! extent still referenced is never freed). A `get` reads the extent after releasing the
//! lock and validates: a checksum mismatch is taken for damage only if the key still holds
//! the same reference. A scan that keeps references past its leaf lock holds a [`BlobPin`]:
//! extents freed while a pin older than the free exists wait in limbo.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use crate::error::{Error, Result};
use crate::node::{NodeRef, RecordKind};
use crate::store::{blocks_for, BlobFile, Extents, BLOB_BLOCK};
use crate::sync::{Arc, AtomicBool, AtomicU64, Mutex, Ordering};

pub(crate) use super::reference::{BlobRef, FAILED_FOLD, MARKED, REF_LEN};

/// Why an open fails when the blob file is gone.
const MISSING: &str = "the blob file is missing, and the tree references extents in it";

/// The least the blob file grows by (blocks): 16 MiB.
const GROWTH_BLOCKS: u64 = (16 << 20) / BLOB_BLOCK;

/// Checkpoints are started at least this often by blob writes alone: extents freed by
/// overwrites are reused only after a checkpoint, and large values put little into the log.
const CHECKPOINT_BLOB_BYTES: u64 = 64 << 20;

/// One extent of a checkpoint's table: the page whose records reference it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TableEntry {
    /// The leaf page that references it.
    pub(crate) page: u64,
    /// Its first block.
    pub(crate) start: u64,
    /// Its length in blocks.
    pub(crate) blocks: u64,
}

/// An extent in use.
#[derive(Clone, Copy, Debug)]
struct InUse {
    blocks: u64,
    /// The checkpoint count when its reference was applied; `None` while it is written.
    applied: Option<u64>,
}

#[derive(Default)]
struct State {
    extents: Extents,
    in_use: HashMap<u64, InUse>,
    /// The extents each leaf page written references (pages without any are absent).
    page_refs: HashMap<u64, Vec<u64>>,
    /// Pins held, by the generation they were taken in.
    pins: BTreeMap<u64, usize>,
    /// The generation of pins taken now; each free that must wait for pins starts a new one.
    generation: u64,
    /// Freed extents waiting for the pins older than their generation: (generation, start,
    /// blocks).
    limbo: Vec<(u64, u64, u64)>,
    /// Blocks of the file: in use, free, or reserved for growth.
    file_blocks: u64,
    /// Whether this open made the file: no extent can be in it, so a logged reference
    /// recovery claims means the file was lost (`Blobs::claim`).
    made_now: bool,
}

impl State {
    /// Returns to the allocator every extent in limbo that no pin can still read.
    fn release_limbo(&mut self) {
        let oldest_pin = self.pins.keys().next().copied().unwrap_or(u64::MAX);
        let extents = &mut self.extents;
        self.limbo.retain(|&(generation, start, blocks)| {
            if generation < oldest_pin {
                // A failure means bookkeeping went wrong; the extent is merely not reused.
                let _ = extents.free(start, blocks);
                false
            } else {
                true
            }
        });
    }
}

/// The blob file and which of its extents are in use (see the module docs).
pub(crate) struct Blobs {
    /// `None` for an in-memory tree: it stores every value inline.
    file: Option<BlobFile>,
    state: Arc<Mutex<State>>,
    /// Whether any extent was ever in use in this tree's life: until then, leaf pages
    /// written are not looked at.
    any: AtomicBool,
    /// Checkpoints started.
    checkpoints: AtomicU64,
    /// Bytes written to extents since the last checkpoint started.
    written: AtomicU64,
    /// Whether extents were written since the file was last synced.
    unsynced: AtomicBool,
}

impl Blobs {
    /// No blob file: every value is stored inline.
    pub(crate) fn none() -> Blobs {
        Blobs {
            file: None,
            state: Arc::new(Mutex::new(State::default())),
            any: AtomicBool::new(false),
            checkpoints: AtomicU64::new(0),
            written: AtomicU64::new(0),
            unsynced: AtomicBool::new(false),
        }
    }

    /// Opens the blob file at `path`, with the extents of the checkpoint's `table` in use;
    /// makes it if absent and nothing references it.
    ///
    /// # Errors
    /// `Io` opening the file; `Corruption` for a table whose extents overlap, or for an
    /// absent file while the table names extents (nothing is made then: every large value
    /// would read `Corruption`, one at a time, and the next open would find an empty file).
    pub(crate) fn open(path: &Path, table: &[TableEntry]) -> Result<Blobs> {
        let made_now = match std::fs::symlink_metadata(path) {
            Ok(_) => false,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(e) => return Err(Error::io(path, e)),
        };
        if made_now && !table.is_empty() {
            return Err(Error::corruption(path, None, MISSING));
        }
        let file = BlobFile::open(path)?;
        let mut state = State {
            file_blocks: file.len_blocks()?,
            made_now,
            ..State::default()
        };
        let mut extents: Vec<(u64, u64)> = Vec::new();
        for e in table {
            state.page_refs.entry(e.page).or_default().push(e.start);
            // One extent per reference: a second page naming it is a stale page's (a
            // checkpoint lists each page once, and a value has one reference).
            if state.in_use.contains_key(&e.start) {
                continue;
            }
            state.in_use.insert(
                e.start,
                InUse {
                    blocks: e.blocks,
                    applied: Some(0),
                },
            );
            extents.push((e.start, e.blocks));
        }
        state.extents =
            Extents::with_used(extents).map_err(|reason| Error::corruption(path, None, reason))?;
        let any = !state.in_use.is_empty();
        Ok(Blobs {
            file: Some(file),
            state: Arc::new(Mutex::new(state)),
            any: AtomicBool::new(any),
            checkpoints: AtomicU64::new(0),
            written: AtomicU64::new(0),
            unsynced: AtomicBool::new(false),
        })
    }

    /// Whether values can be stored out of line here.
    pub(crate) fn enabled(&self) -> bool {
        self.file.is_some()
    }

    /// The reference `stored` is, if this tree stores values out of line and it is one.
    /// Inlined: a scan asks it of every value it lends, and most trees have no blob file.
    #[inline]
    pub(crate) fn decode(&self, stored: &[u8]) -> Option<BlobRef> {
        self.file.as_ref()?;
        BlobRef::decode(stored)
    }

    /// Whether a user value must be stored out of line: too long for a record with its key
    /// (`inline_limit` bytes of value), or one that would read as a reference or a failed
    /// fold (so that a stored value is one of those exactly when it reads as one).
    pub(crate) fn must_store(&self, value: &[u8], inline_limit: usize) -> bool {
        self.file.is_some()
            && (value.len() > inline_limit
                || BlobRef::decode(value).is_some()
                || value.starts_with(&FAILED_FOLD))
    }

    /// Whether stored values may be other than the user's own (references, failed folds):
    /// only where values can be stored out of line, since an in-memory tree stores every
    /// user value as it is and folds every merge when it is made.
    #[inline]
    pub(crate) fn marks_values(&self) -> bool {
        self.file.is_some()
    }

    /// Writes `value` to a new extent (synced first when `sync`: its reference may become
    /// durable in the log before the next checkpoint) and returns its reference. The
    /// extent counts as written, not yet referenced, until [`Blobs::applied`].
    ///
    /// # Errors
    /// `Io` writing or syncing; the extent is freed again.
    pub(crate) fn store(&self, value: &[u8], sync: bool) -> Result<BlobRef> {
        let Some(file) = &self.file else {
            return Err(Error::InvalidConfig {
                reason: "an in-memory tree stores no value out of line",
            });
        };
        let blocks = blocks_for(value.len() as u64).max(1);
        let start = {
            let mut s = self.state.lock();
            let start = s.extents.allocate(blocks);
            let end = s.extents.end();
            if end > s.file_blocks {
                // Grow in steps: writes into reserved blocks do not extend the file, and
                // the step keeps consecutive extents contiguous on disk.
                let to = end.max(s.file_blocks + (s.file_blocks / 8).max(GROWTH_BLOCKS));
                if let Err(e) = file.reserve_blocks(s.file_blocks, to) {
                    let _ = s.extents.free(start, blocks);
                    return Err(e);
                }
                s.file_blocks = to;
            }
            s.in_use.insert(
                start,
                InUse {
                    blocks,
                    applied: None,
                },
            );
            start
        };
        // `SeqCst`, with `ever_used` and the checkpoint count: see `ever_used`.
        self.any.store(true, Ordering::SeqCst);
        let written = file.write(start, value).and_then(|crc| {
            if sync {
                file.sync().map(|()| crc)
            } else {
                Ok(crc)
            }
        });
        let crc = match written {
            Ok(crc) => crc,
            Err(e) => {
                self.discard(start);
                return Err(e);
            }
        };
        if !sync {
            self.unsynced.store(true, Ordering::Release);
        }
        self.written
            .fetch_add(blocks * BLOB_BLOCK, Ordering::Relaxed);
        Ok(BlobRef {
            start,
            len: value.len() as u64,
            crc: BlobRef::checksum_of(start, crc, value.len()),
        })
    }

    /// The reference to the extent at `start` was written to a leaf (or may have been: a
    /// write that failed after it was applied). From the next checkpoint on, it is freed
    /// when no page of a checkpoint references it.
    pub(crate) fn applied(&self, start: u64) {
        let now = self.checkpoints.load(Ordering::SeqCst);
        if let Some(e) = self.state.lock().in_use.get_mut(&start) {
            e.applied = Some(now);
        }
    }

    /// The extent at `start` was written but its reference certainly never reached a leaf
    /// (a compare-and-swap that did not match, a write refused before it was applied):
    /// free it now.
    pub(crate) fn discard(&self, start: u64) {
        let mut s = self.state.lock();
        if let Some(e) = s.in_use.remove(&start) {
            let _ = s.extents.free(start, e.blocks);
        }
    }

    /// The value `r` refers to, verified against its checksum.
    ///
    /// # Errors
    /// `Io` reading; `Corruption` if the extent fails its checksum or lies past the end of
    /// the file.
    pub(crate) fn read(&self, r: &BlobRef) -> Result<Vec<u8>> {
        let Some(file) = &self.file else {
            return Err(Error::InvalidConfig {
                reason: "an in-memory tree stores no value out of line",
            });
        };
        let len = usize::try_from(r.len)
            .map_err(|_| Error::corruption(file.path(), Some(r.start), "blob length too large"))?;
        let (value, crc) = file.read_vec(r.start, len)?;
        if BlobRef::checksum_of(r.start, crc, len) != r.crc {
            return Err(Error::corruption(
                file.path(),
                Some(r.start),
                "blob extent checksum mismatch",
            ));
        }
        Ok(value)
    }

    /// The blob file's path (for errors).
    pub(crate) fn path(&self) -> Option<&Path> {
        self.file.as_ref().map(BlobFile::path)
    }

    /// Leaf page `page` was written with the records of `node`: remember the extents they
    /// reference, for the checkpoint that may name the page.
    pub(crate) fn page_written(&self, page: u64, node: NodeRef<'_>) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut refs = Vec::new();
        for i in 0..node.len() {
            if matches!(node.record_kind(i), RecordKind::Insert | RecordKind::Cache) {
                if let Some(r) = BlobRef::decode(node.value(i)) {
                    refs.push(r.start);
                }
            }
        }
        let mut s = self.state.lock();
        if refs.is_empty() {
            s.page_refs.remove(&page);
        } else {
            s.page_refs.insert(page, refs);
        }
    }

    /// A checkpoint takes its LSN: returns its count, which [`Blobs::checkpointed`] needs.
    pub(crate) fn start_checkpoint(&self) -> u64 {
        self.written.store(0, Ordering::Relaxed);
        self.checkpoints.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Whether any extent was ever in use in this tree's life (since the last open that
    /// found none). False after `start_checkpoint` returned means every extent is applied
    /// at a count past it (the flag is set before an extent is written, the count read when
    /// it is applied, all in one `SeqCst` order), so that checkpoint frees none of them.
    pub(crate) fn ever_used(&self) -> bool {
        self.any.load(Ordering::SeqCst)
    }

    /// The extents the checkpoint whose leaves live in `pages` references.
    pub(crate) fn table(&self, pages: impl Iterator<Item = u64>) -> Vec<TableEntry> {
        if !self.any.load(Ordering::Acquire) {
            return Vec::new();
        }
        let s = self.state.lock();
        let mut table = Vec::new();
        for page in pages {
            for &start in s.page_refs.get(&page).into_iter().flatten() {
                if let Some(e) = s.in_use.get(&start) {
                    table.push(TableEntry {
                        page,
                        start,
                        blocks: e.blocks,
                    });
                }
            }
        }
        table
    }

    /// Makes every extent written so far durable (before a checkpoint that references them).
    ///
    /// # Errors
    /// `Io` from the sync.
    pub(crate) fn sync(&self) -> Result<()> {
        match &self.file {
            Some(file) if self.unsynced.swap(false, Ordering::AcqRel) => {
                file.sync().inspect_err(|_| {
                    self.unsynced.store(true, Ordering::Release);
                })
            }
            _ => Ok(()),
        }
    }

    /// The checkpoint numbered `count`, whose pages reference the extents of `table`, is
    /// durable: every extent applied before it took its LSN and not in `table` is freed
    /// (once no pin older than now remains), and the file shrinks if it is mostly unused
    /// (`shrink`).
    pub(crate) fn checkpointed(&self, count: u64, table: &[TableEntry]) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let referenced: HashSet<u64> = table.iter().map(|e| e.start).collect();
        let mut s = self.state.lock();
        let dropped: Vec<(u64, u64)> = s
            .in_use
            .iter()
            .filter(|(start, e)| {
                e.applied.is_some_and(|a| a < count) && !referenced.contains(start)
            })
            .map(|(&start, e)| (start, e.blocks))
            .collect();
        if !dropped.is_empty() {
            let generation = s.generation;
            s.generation += 1;
            for (start, blocks) in dropped {
                s.in_use.remove(&start);
                s.limbo.push((generation, start, blocks));
            }
            s.release_limbo();
        }
        self.shrink(&mut s);
    }

    /// Cuts the file down to the blocks in use plus one growth step once it is more than
    /// twice that. Blocks past the end are kept otherwise: a block written before is
    /// rewritten at the device's full rate, while the first write to a block reserved anew
    /// (or appended) costs the file system an extent conversion, which on ext4 halved the
    /// rate of 1 MiB direct writes.
    fn shrink(&self, s: &mut State) {
        let Some(file) = &self.file else { return };
        let keep = s.extents.end() + GROWTH_BLOCKS;
        if keep.saturating_mul(2) < s.file_blocks && file.set_len_blocks(keep).is_ok() {
            s.file_blocks = keep;
        }
    }

    /// Recovery replays a record that references `r`: it is in use (already, if the
    /// checkpoint's table has it).
    ///
    /// # Errors
    /// `Corruption` if it overlaps another extent in use, or if this open made the file
    /// (an extent is written before its record is logged: the file was lost). The file
    /// made is removed again, so the next open finds it absent too.
    pub(crate) fn claim(&self, r: &BlobRef) -> Result<()> {
        let mut s = self.state.lock();
        if s.made_now {
            let path = self.path().unwrap_or(Path::new("blobs"));
            let _ = std::fs::remove_file(path);
            return Err(Error::corruption(path, Some(r.start), MISSING));
        }
        if let Some(e) = s.in_use.get(&r.start) {
            if e.blocks == r.blocks() {
                return Ok(());
            }
        } else if s.extents.claim(r.start, r.blocks()).is_ok() {
            s.in_use.insert(
                r.start,
                InUse {
                    blocks: r.blocks(),
                    applied: Some(0),
                },
            );
            self.any.store(true, Ordering::Release);
            return Ok(());
        }
        Err(Error::corruption(
            self.path().unwrap_or(Path::new("blobs")),
            Some(r.start),
            "a logged reference overlaps another blob extent",
        ))
    }

    /// Whether blob writes alone call for a checkpoint (to reuse what overwrites freed).
    pub(crate) fn wants_checkpoint(&self) -> bool {
        let written = self.written.load(Ordering::Relaxed);
        if written < CHECKPOINT_BLOB_BYTES {
            return false;
        }
        let used = self.state.lock().extents.used_blocks() * BLOB_BLOCK;
        written >= used / 4
    }

    /// A pin: extents freed while it lives are not reused until it is dropped.
    pub(crate) fn pin(&self) -> BlobPin {
        let mut s = self.state.lock();
        let generation = s.generation;
        *s.pins.entry(generation).or_default() += 1;
        BlobPin {
            state: Arc::clone(&self.state),
            generation,
        }
    }

    /// Whether any extent was ever in use (a scan pins only then).
    pub(crate) fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// Blocks in use and blocks free below the end, and extents in use (for tests and
    /// stats).
    pub(crate) fn usage(&self) -> (u64, u64, usize) {
        let s = self.state.lock();
        (
            s.extents.used_blocks(),
            s.extents.free_blocks(),
            s.in_use.len(),
        )
    }
}

/// Keeps extents freed after it was taken from being reused while it lives (see
/// [`Blobs::pin`]).
pub(crate) struct BlobPin {
    state: Arc<Mutex<State>>,
    generation: u64,
}

impl Drop for BlobPin {
    fn drop(&mut self) {
        let mut s = self.state.lock();
        if let Some(n) = s.pins.get_mut(&self.generation) {
            *n -= 1;
            if *n == 0 {
                s.pins.remove(&self.generation);
            }
        }
        s.release_limbo();
    }
}

#[cfg(test)]
#[path = "extents_tests.rs"]
mod tests;
