//! bfkv: an embeddable, concurrent, larger-than-memory key-value store built on the Bf-Tree
//! (VLDB 2024).
//!
//! A B-tree caches whole pages although most records on a page are cold. bfkv keeps leaf
//! pages (8 KiB by default, [`Config::page_size`]) on disk and gives each at most one variable-length **mini-page** in memory,
//! holding recent writes, hot records and known-absent keys; mini-pages live in one circular
//! buffer whose size is the memory budget.
//!
//! Values up to half a page with their key live in the leaf records. Longer ones, up to
//! 64 MiB ([`Limits::max_value_len`]), go through the same API to the blob file, written
//! first in large direct-I/O requests; the leaf, the log and the cache hold a 28-byte
//! reference, so large values neither crowd the cache nor pass through the log.
//!
//! ```
//! let dir = tempfile::tempdir()?;
//! let tree = bfkv::Tree::open(bfkv::Config::new(dir.path()))?;
//! let doc = vec![7u8; 3 << 20];
//! tree.insert(b"doc", &doc)?;
//! assert_eq!(tree.get(b"doc")?, Some(doc));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Layers, top to bottom: the public API (this file, [`Config`], [`Error`]), the tree core,
//! the buffer pool (`pool`), the page layout shared by every node (`node`), and the page
//! store (`store`), the only code that touches a data file. `docs/ARCHITECTURE.md` explains
//! each layer and its invariants.

// Page offsets, log positions and counts are `u64` on disk and `usize` in memory; the casts
// between them are lossless only where `usize` is 64 bits wide (see `[lints]` in Cargo.toml).
#[cfg(not(target_pointer_width = "64"))]
compile_error!("bfkv supports 64-bit targets only");

mod config;
mod error;
mod limits;
pub(crate) mod node;
mod pool;
pub(crate) mod store;
pub(crate) mod sync;
mod sys;
mod tree;
mod wal;

pub use config::{Config, Durability, IoBackend};
pub use error::{Error, Result};
pub use limits::Limits;
pub use tree::{Batch, Keyspace, Range, Snapshot, Stats, Transaction, TransactionRange, Tree};

/// Entry points into the lower layers for the fuzz targets (`--cfg fuzzing`, set by `cargo
/// fuzz`) and the layer benches (`--cfg bfkv_internals`). Not a
/// stable API: nothing here is covered by semver.
#[cfg(any(fuzzing, bfkv_internals))]
#[doc(hidden)]
pub mod internals {
    use std::path::Path;

    use crate::error::Result;
    use crate::store::{Backend, FileStore, PageBuf, PageStore, FIRST_DATA_PAGE};

    pub use crate::tree::Census;

    /// A file page store with its own page buffers, for the store benchmark.
    #[derive(Debug)]
    pub struct StoreBench {
        /// The store.
        store: FileStore,
        /// One buffer per request of the largest batch so far.
        bufs: Vec<PageBuf>,
    }

    impl StoreBench {
        /// Opens (or creates) the data file at `path`; `io_uring` picks the backend.
        ///
        /// # Errors
        /// As `FileStore::open`.
        pub fn open(path: &Path, page_size: usize, io_uring: bool) -> Result<StoreBench> {
            let backend = if io_uring {
                Backend::IoUring
            } else {
                Backend::Pread
            };
            Ok(StoreBench {
                store: FileStore::open(path, page_size, backend)?,
                bufs: Vec::new(),
            })
        }

        /// Whether the file is open with `O_DIRECT`.
        pub fn is_direct(&self) -> bool {
            self.store.is_direct()
        }

        /// The data pages are `first_page()..first_page() + data_pages()`.
        pub fn first_page(&self) -> u64 {
            FIRST_DATA_PAGE
        }

        /// Data pages the file holds.
        pub fn data_pages(&self) -> u64 {
            self.store.stats().file_pages - FIRST_DATA_PAGE
        }

        /// Allocates and writes pages (in batches of `batch`) until the file holds `pages`
        /// data pages, then syncs.
        ///
        /// # Errors
        /// Any store error.
        pub fn fill(&mut self, pages: u64, batch: usize) -> Result<()> {
            let size = self.store.page_size();
            while self.data_pages() < pages {
                let n = batch.min((pages - self.data_pages()) as usize);
                let nos = (0..n)
                    .map(|_| self.store.allocate())
                    .collect::<Result<Vec<_>>>()?;
                let mut bufs: Vec<PageBuf> = nos
                    .iter()
                    .map(|&p| {
                        let mut b = PageBuf::new(size);
                        b[crate::store::STORE_RESERVED..].fill(p as u8);
                        b
                    })
                    .collect();
                self.store.write_batch(&nos, &mut bufs)?;
            }
            self.store.sync()
        }

        /// Reads `pages` as one batch (checksums verified).
        ///
        /// # Errors
        /// Any store error.
        pub fn read_batch(&mut self, pages: &[u64]) -> Result<()> {
            let size = self.store.page_size();
            while self.bufs.len() < pages.len() {
                self.bufs.push(PageBuf::new(size));
            }
            self.store.read_batch(pages, &mut self.bufs[..pages.len()])
        }

        /// Reads one page (checksum verified).
        ///
        /// # Errors
        /// Any store error.
        pub fn read(&mut self, page: u64) -> Result<()> {
            self.read_batch(&[page])
        }
    }

    use crate::node::{NodeKind, NodeMut, NodeRef, RecordKind};

    /// Fuzz entry for the node layout: decodes `data` as a node page and, if it validates,
    /// checks search, bounds and iteration against a linear scan (panics on disagreement).
    pub fn node_decode_check(data: &[u8]) {
        crate::node::decode_check(data);
    }

    /// The buffer pool, driven page by page (fuzz target `pool_model`).
    pub use crate::pool::harness::PoolHarness;

    /// Bench entry: formats `buf` as an empty node (`mini` = mini-page, else leaf) with
    /// infinite fences.
    pub fn node_init(buf: &mut [u8], mini: bool) {
        let kind = [NodeKind::Leaf, NodeKind::Mini][usize::from(mini)];
        NodeMut::init(buf, kind, None, None);
    }

    /// Bench entry: upserts an Insert record into a node; false if it does not fit.
    pub fn node_upsert(buf: &mut [u8], key: &[u8], value: &[u8]) -> bool {
        let mut node = NodeMut::from_bytes(buf);
        node.upsert(key, value, RecordKind::Insert).is_ok()
    }

    /// Bench entry: the value of `key` in a node, if present.
    pub fn node_get<'a>(buf: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
        NodeRef::from_bytes(buf).get(key).map(|(_, _, v)| v)
    }

    /// The write-ahead log driven directly, for the `wal` bench and tests outside the crate.
    #[derive(Debug)]
    pub struct WalBench {
        /// The log.
        wal: crate::wal::Wal,
    }

    /// A record [`WalBench::append`] took.
    #[derive(Debug, Clone, Copy)]
    pub struct WalAppended(crate::wal::Appended);

    impl WalAppended {
        /// The record's LSN.
        pub fn lsn(&self) -> u64 {
            self.0.lsn
        }
    }

    /// Counters of a [`WalBench`] log since open.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct WalBenchStats {
        /// Records appended.
        pub appends: u64,
        /// Bytes of records appended.
        pub bytes: u64,
        /// `pwrite` calls.
        pub writes: u64,
        /// `fdatasync` calls.
        pub syncs: u64,
        /// Segment files in use.
        pub segments: u64,
        /// Why open cut the log's tail, if it did.
        pub torn_tail: Option<&'static str>,
    }

    /// What a [`WalBench::replay`] went through.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct WalBenchReplay {
        /// Records passed to the callback.
        pub applied: u64,
        /// Records below `from`, skipped.
        pub skipped: u64,
        /// Segment files read.
        pub segments: u64,
        /// Where the log continues.
        pub end_lsn: u64,
    }

    impl WalBench {
        /// Opens (or creates) a log in `dir`; `sync` picks `Durability::Sync` over `Buffered`.
        ///
        /// # Errors
        /// As `Wal::open`.
        pub fn open(dir: &Path, sync: bool, segment_size: u64) -> Result<WalBench> {
            let config = crate::wal::WalConfig {
                segment_size,
                durability: if sync {
                    crate::Durability::Sync
                } else {
                    crate::Durability::Buffered
                },
                ..crate::wal::WalConfig::default()
            };
            Ok(WalBench {
                wal: crate::wal::Wal::open(dir, config)?,
            })
        }

        /// Appends an insert (`Some(value)`) or a remove; returns what `commit` takes.
        ///
        /// # Errors
        /// As `Wal::append`.
        pub fn append(&self, key: &[u8], value: Option<&[u8]>) -> Result<WalAppended> {
            self.wal
                .append(match value {
                    Some(value) => crate::wal::LogOp::Insert { key, value },
                    None => crate::wal::LogOp::Remove { key },
                })
                .map(WalAppended)
        }

        /// Waits until the appended record is durable per the configured durability.
        ///
        /// # Errors
        /// As `Wal::commit`.
        pub fn commit(&self, appended: WalAppended) -> Result<()> {
            self.wal.commit(appended.0)
        }

        /// Syncs every appended record.
        ///
        /// # Errors
        /// As `Wal::flush`.
        pub fn flush(&self) -> Result<()> {
            self.wal.flush()
        }

        /// Replays records from `from`, passing (LSN, key, value or None for a remove).
        ///
        /// # Errors
        /// As `Wal::replay`.
        pub fn replay(
            &self,
            from: u64,
            mut apply: impl FnMut(u64, &[u8], Option<&[u8]>),
        ) -> Result<WalBenchReplay> {
            let st = self.wal.replay(from, |lsn, op| {
                match op {
                    crate::wal::LogOp::Insert { key, value } => apply(lsn, key, Some(value)),
                    crate::wal::LogOp::Remove { key } => apply(lsn, key, None),
                    crate::wal::LogOp::Merge { key, operands } => apply(lsn, key, Some(operands)),
                    crate::wal::LogOp::Batch { body } => {
                        for write in crate::wal::batch_writes(body) {
                            let (key, value) = write
                                .map_err(|reason| crate::Error::corruption("wal", None, reason))?;
                            match value {
                                crate::wal::BatchValue::Put(v) => apply(lsn, key, Some(v)),
                                crate::wal::BatchValue::Remove => apply(lsn, key, None),
                                crate::wal::BatchValue::Merge(ops) => apply(lsn, key, Some(ops)),
                            }
                        }
                    }
                }
                Ok(())
            })?;
            Ok(WalBenchReplay {
                applied: st.applied,
                skipped: st.skipped,
                segments: st.segments,
                end_lsn: st.end_lsn,
            })
        }

        /// Deletes segments holding only records below `lsn`.
        ///
        /// # Errors
        /// As `Wal::release_before`.
        pub fn release_before(&self, lsn: u64) -> Result<()> {
            self.wal.release_before(lsn)
        }

        /// The LSN the next append gets.
        pub fn next_lsn(&self) -> u64 {
            self.wal.next_lsn()
        }

        /// Bytes of log since `lsn`.
        pub fn bytes_since(&self, lsn: u64) -> u64 {
            self.wal.bytes_since(lsn)
        }

        /// Counters since open.
        pub fn stats(&self) -> WalBenchStats {
            let s = self.wal.stats();
            WalBenchStats {
                appends: s.appends,
                bytes: s.bytes,
                writes: s.writes,
                syncs: s.syncs,
                segments: s.segments,
                torn_tail: s.torn_tail,
            }
        }
    }

    pub use crate::tree::persist::crash::{CrashCut, CrashOp, CrashOutcome};

    /// Fuzz entry for crash recovery: runs `ops` on a fresh tree (64 KiB cache, 8 KiB log
    /// segments, `Durability::Sync`) over emulated disks that lose power at `cut`, reopens
    /// from what survived, and panics unless the tree equals a model of the acknowledged
    /// operations (or those plus the one in flight), every point lookup agrees, and the
    /// recovered tree accepts a write.
    pub fn crash_recovery_check(ops: &[CrashOp], cut: CrashCut) -> CrashOutcome {
        crate::tree::persist::crash::scenario(ops, cut, 1, "crash_recovery")
    }

    /// Fuzz entry for the log decoder: arbitrary bytes as a segment (or a damaged valid one)
    /// must decode to a prefix of valid records (panics on disagreement).
    pub fn wal_decode_check(data: &[u8]) {
        crate::wal::decode_check(data);
    }
}

/// The README's example, compiled and run by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
