//! How a tree is opened: where, with how much memory, and with which durability.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod merge;

use crate::error::{Error, Result};
use crate::limits::{max_batch_len, Limits};
pub(crate) use merge::MergeOperator;

/// Smallest leaf page size accepted (bytes).
pub(crate) const MIN_PAGE_SIZE: usize = 4 << 10;
/// Largest leaf page size accepted (bytes).
pub(crate) const MAX_PAGE_SIZE: usize = 64 << 10;
/// Default leaf page size (bytes): two of the SSD's 4 KiB units. With 16-byte records,
/// loads and scans ran faster than with 4 KiB pages both in memory and on direct I/O, and
/// lookups faster in memory (`docs/benchmarks.md`, "Page size").
pub(crate) const DEFAULT_PAGE_SIZE: usize = 8 << 10;
/// Default size of the `Buffered` log's staging ring (bytes; see [`Config::log_staging_size`]).
pub(crate) const DEFAULT_LOG_STAGING_SIZE: usize = 8 << 20;
/// Default log segment size (bytes; see [`Config::log_segment_size`]).
pub(crate) const DEFAULT_LOG_SEGMENT_SIZE: u64 = 16 << 20;
/// Default circular-buffer size (bytes).
pub(crate) const DEFAULT_CACHE_SIZE: usize = 64 << 20;

/// When a write is durable. See [`Config::durability`].
///
/// ```
/// use bfkv::{Config, Durability, Tree};
/// // The default survives a crash of the process, not a power cut between syncs.
/// assert_eq!(Durability::default(), Durability::Buffered);
/// let dir = tempfile::tempdir()?;
/// let tree = Tree::open(Config::new(dir.path()).durability(Durability::None))?;
/// tree.insert(b"k", b"v")?;
/// tree.flush()?; // without a log, durable from here on
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// A write returns after its log record is on stable storage (`fdatasync`); concurrent
    /// writers share one sync (group commit). Survives power loss.
    Sync,
    /// A write returns after its log record reached the operating system; the log is synced
    /// in the background every few milliseconds. Survives a crash of the process.
    ///
    /// On Linux, records are staged first in a memory-mapped file of the log directory,
    /// which outlives the process (a store into memory, no system call; 8 MiB, see
    /// [`Config::log_staging_size`]); the next open writes a crashed process's staged
    /// records into the log. Elsewhere each write copies its record into the log file with
    /// a system call.
    #[default]
    Buffered,
    /// No log. Data is durable after `flush`, `checkpoint` or `close` only; a crash returns
    /// the tree to the last of those, consistent.
    None,
}

/// Which page-store backend a file-backed tree uses.
///
/// ```
/// assert_eq!(bfkv::IoBackend::default(), bfkv::IoBackend::Auto);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum IoBackend {
    /// `io_uring` on Linux, positional I/O elsewhere.
    #[default]
    Auto,
    /// `io_uring` (Linux only; opening fails with `InvalidConfig` elsewhere).
    IoUring,
    /// Portable `pread`/`pwrite`, with `O_DIRECT` where the OS has it.
    Pread,
}

/// Options for [`Tree::open`](crate::Tree::open). Built with chained setters.
///
/// ```
/// use bfkv::{Config, Durability};
/// let config = Config::new("/tmp/my-db").cache_size(32 << 20).durability(Durability::Sync);
/// assert_eq!(config.get_cache_size(), 32 << 20);
/// ```
#[derive(Debug, Clone)]
pub struct Config {
    pub(crate) dir: Option<PathBuf>,
    pub(crate) cache_size: usize,
    pub(crate) page_size: usize,
    /// Whether `page_size` was set: if not, an existing tree keeps its own.
    pub(crate) page_size_set: bool,
    pub(crate) durability: Durability,
    pub(crate) io_backend: IoBackend,
    pub(crate) second_chance_percent: u8,
    pub(crate) promotion_percent: u8,
    /// `None`: the page size.
    pub(crate) merge_threshold: Option<usize>,
    pub(crate) evictor_threads: usize,
    pub(crate) idle_write_back: Option<Duration>,
    pub(crate) flush_interval: Duration,
    pub(crate) checkpoint_log_bytes: u64,
    pub(crate) max_snapshot_bytes: usize,
    pub(crate) log_segment_size: u64,
    pub(crate) log_staging_size: usize,
    pub(crate) merge_operator: Option<MergeOperator>,
    /// Keyspaces with merge operators of their own, by name.
    pub(crate) keyspace_merge_operators: Vec<(String, MergeOperator)>,
}

impl Config {
    /// A tree stored in directory `dir` (created if absent), with default settings.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let tree = bfkv::Tree::open(bfkv::Config::new(dir.path()))?;
    /// tree.insert(b"k", b"v")?;
    /// tree.close()?;
    /// // The directory now holds the tree; opening it again finds the record.
    /// let tree = bfkv::Tree::open(bfkv::Config::new(dir.path()))?;
    /// assert_eq!(tree.get(b"k")?, Some(b"v".to_vec()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(dir: impl AsRef<Path>) -> Self {
        Config {
            dir: Some(dir.as_ref().to_path_buf()),
            ..Self::in_memory()
        }
    }

    /// A tree with no files: the cache is the whole store, and writes beyond it fail with
    /// [`Error::CacheFull`].
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory().cache_size(8 << 20))?;
    /// tree.insert(b"k", b"v")?;
    /// assert_eq!(tree.get(b"k")?, Some(b"v".to_vec()));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn in_memory() -> Self {
        Config {
            dir: None,
            cache_size: DEFAULT_CACHE_SIZE,
            page_size: DEFAULT_PAGE_SIZE,
            page_size_set: false,
            durability: Durability::default(),
            io_backend: IoBackend::default(),
            second_chance_percent: 10,
            promotion_percent: 100,
            merge_threshold: None,
            evictor_threads: 2,
            idle_write_back: Some(Duration::from_millis(50)),
            flush_interval: Duration::from_millis(5),
            checkpoint_log_bytes: 128 << 20,
            max_snapshot_bytes: 64 << 20,
            log_segment_size: DEFAULT_LOG_SEGMENT_SIZE,
            log_staging_size: DEFAULT_LOG_STAGING_SIZE,
            merge_operator: None,
            keyspace_merge_operators: Vec::new(),
        }
    }

    /// Bytes of memory for mini-pages (the circular buffer). Default 64 MiB.
    ///
    /// ```
    /// let config = bfkv::Config::in_memory().cache_size(256 << 20);
    /// assert_eq!(config.get_cache_size(), 256 << 20);
    /// ```
    #[must_use]
    pub fn cache_size(mut self, bytes: usize) -> Self {
        self.cache_size = bytes;
        self
    }

    /// Leaf page size: a power of two from 4 KiB to 64 KiB. Default 8 KiB. Fixed when the
    /// directory is created: reopening a tree without this setting keeps the size it was
    /// created with, and with it the size must match (else `Error::InvalidConfig`). Key and
    /// value limits follow from it (see [`Limits`]; [`Tree::limits`](crate::Tree::limits)
    /// gives an open tree's).
    ///
    /// ```
    /// let config = bfkv::Config::in_memory().page_size(16 << 10);
    /// assert_eq!(config.limits().max_key_len, 4096);
    /// assert!(bfkv::Config::in_memory().page_size(5000).validate().is_err());
    /// ```
    #[must_use]
    pub fn page_size(mut self, bytes: usize) -> Self {
        self.page_size = bytes;
        self.page_size_set = true;
        self
    }

    /// When writes become durable. Default [`Durability::Buffered`].
    ///
    /// ```
    /// use bfkv::{Config, Durability, Tree};
    /// let dir = tempfile::tempdir()?;
    /// let tree = Tree::open(Config::new(dir.path()).durability(Durability::Sync))?;
    /// tree.insert(b"order/1", b"paid")?; // on stable storage when this returns
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Which I/O backend a file-backed tree uses. Default [`IoBackend::Auto`].
    ///
    /// ```
    /// use bfkv::{Config, IoBackend, Tree};
    /// let dir = tempfile::tempdir()?;
    /// let tree = Tree::open(Config::new(dir.path()).io_backend(IoBackend::Pread))?;
    /// tree.insert(b"k", b"v")?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn io_backend(mut self, backend: IoBackend) -> Self {
        self.io_backend = backend;
        self
    }

    /// Share of the circular buffer, in percent (0 to 100), nearest the head where a touched
    /// mini-page is copied to the tail instead of being updated in place. Default 10.
    ///
    /// ```
    /// assert!(bfkv::Config::in_memory().second_chance_percent(50).validate().is_ok());
    /// assert!(bfkv::Config::in_memory().second_chance_percent(101).validate().is_err());
    /// ```
    #[must_use]
    pub fn second_chance_percent(mut self, percent: u8) -> Self {
        self.second_chance_percent = percent;
        self
    }

    /// Chance, in percent (0 to 100), that a read served from a disk page caches the record
    /// (or a phantom record for an absent key) in the page's mini-page on the key's first
    /// miss. A key that misses again soon after (a small filter of recently missed keys
    /// remembers it, 1 bit per 16 bytes of cache) is cached on that second miss whatever
    /// this is, unless it is 0, which turns caching of reads off. A scan that reads a leaf
    /// from disk keeps it as a full-page mirror with this chance, at most 50 %. Default 100:
    /// every miss is cached. Measured against 50 on 5M records in a 32 MiB cache, it did as
    /// many page reads and writes in all right after a load and on uniform keys, and 20-25 %
    /// fewer reads once Zipf lookups had warmed the cache for 8 s, with 20-35 % more lookups
    /// a second (`git show fa6ea1c:docs/benchmarks.md`, "Every miss").
    ///
    /// ```
    /// // Cache every record read from disk (the most memory for reads, the fewest disk reads).
    /// assert!(bfkv::Config::in_memory().promotion_percent(100).validate().is_ok());
    /// assert!(bfkv::Config::in_memory().promotion_percent(101).validate().is_err());
    /// ```
    #[must_use]
    pub fn promotion_percent(mut self, percent: u8) -> Self {
        self.promotion_percent = percent;
        self
    }

    /// Mini-page size in bytes past which buffered writes are merged into the leaf page.
    /// Default: the page size. (The paper uses 2 KiB; with 4 KiB pages, a load of 5M 16-byte
    /// records into a 32 MiB cache did 7-8 % fewer page reads and writes per insert and ran
    /// 12 % faster with the threshold at the page size than at 2 KiB, and lookups were no
    /// worse.)
    ///
    /// ```
    /// let config = bfkv::Config::in_memory().merge_threshold(2048);
    /// assert!(config.validate().is_ok());
    /// ```
    #[must_use]
    pub fn merge_threshold(mut self, bytes: usize) -> Self {
        self.merge_threshold = Some(bytes);
        self
    }

    /// The merge threshold in effect (the page size unless set).
    pub(crate) fn merge_threshold_bytes(&self) -> usize {
        self.merge_threshold.unwrap_or(self.page_size)
    }

    /// Background threads that write cold mini-pages back to disk ahead of need, so writers
    /// seldom wait for it and several writes are in flight at once. Default 2; 0 makes every
    /// eviction happen in the thread that needs the room. File-backed trees only.
    /// [`Stats::foreground_evictions`](crate::Stats::foreground_evictions) counts the
    /// evictions the evictors left to the operations themselves.
    ///
    /// ```
    /// // Writers evict for themselves: no background threads.
    /// let config = bfkv::Config::in_memory().evictor_threads(0);
    /// assert!(config.validate().is_ok());
    /// ```
    #[must_use]
    pub fn evictor_threads(mut self, threads: usize) -> Self {
        self.evictor_threads = threads;
        self
    }

    /// Once writes have paused for this long, the first evictor thread writes the buffered
    /// changes back to their leaf pages, many pages per batched read and write, and keeps
    /// them cached as clean records. Clean records leave the cache without I/O when it
    /// needs room, and cold ones are dropped as their mini-pages move, so after a burst of
    /// writes (a bulk load) the cache goes to the records being read, instead of holding
    /// the written ones until each reaches the head of the buffer. It stops as soon as a
    /// write arrives. Default 50 ms; from 1 ms to 1 hour, or `None` to turn it off (changes
    /// then reach disk only when evicted, at a checkpoint, or at close). File-backed trees
    /// with at least one evictor thread only.
    ///
    /// ```
    /// use std::time::Duration;
    /// let config = bfkv::Config::new("db").idle_write_back(Some(Duration::from_millis(200)));
    /// # let _ = config;
    /// ```
    #[must_use]
    pub fn idle_write_back(mut self, after: Option<Duration>) -> Self {
        self.idle_write_back = after;
        self
    }

    /// How often the log is synced in the background under [`Durability::Buffered`].
    /// Default 5 ms: the most a machine crash can lose.
    ///
    /// ```
    /// use std::time::Duration;
    /// let config = bfkv::Config::in_memory().flush_interval(Duration::from_millis(1));
    /// assert!(config.validate().is_ok());
    /// ```
    #[must_use]
    pub fn flush_interval(mut self, interval: Duration) -> Self {
        self.flush_interval = interval;
        self
    }

    /// Log bytes written since the last checkpoint that trigger a new one in the background,
    /// bounding the log's size and recovery time. Default 128 MiB.
    ///
    /// ```
    /// // Checkpoint once 64 MiB of log has accumulated: faster recovery, more page writes.
    /// let config = bfkv::Config::in_memory().checkpoint_log_bytes(64 << 20);
    /// assert!(config.validate().is_ok());
    /// ```
    #[must_use]
    pub fn checkpoint_log_bytes(mut self, bytes: u64) -> Self {
        self.checkpoint_log_bytes = bytes;
        self
    }

    /// The most memory the old values kept for open snapshots and transactions may take
    /// (estimated: keys, values and their bookkeeping). Past it, writers go on, and the
    /// oldest snapshot or transaction that needs them is made too old: its next read
    /// returns [`Error::SnapshotTooOld`](crate::Error::SnapshotTooOld), a transaction's
    /// commit [`Error::Conflict`](crate::Error::Conflict). Any value is accepted. Default
    /// 64 MiB.
    ///
    /// ```
    /// let config = bfkv::Config::in_memory().max_snapshot_bytes(256 << 20);
    /// assert!(config.validate().is_ok());
    /// ```
    #[must_use]
    pub fn max_snapshot_bytes(mut self, bytes: usize) -> Self {
        self.max_snapshot_bytes = bytes;
        self
    }

    /// Bytes of the file that stages log records under [`Durability::Buffered`]: `staging`
    /// in the log directory, mapped into memory, so that a write stores its record into
    /// memory that outlives the process instead of making a system call. A power of two
    /// from 64 KiB to 1 GiB, or 0 to stage nothing: each write then copies its record into
    /// the log file with `pwrite`. Default 8 MiB. Off Linux, or where the file cannot be
    /// allocated or mapped (a full disk), the tree opens without staging.
    ///
    /// ```
    /// let config = bfkv::Config::new("db").log_staging_size(0);
    /// assert!(config.validate().is_ok());
    /// assert!(bfkv::Config::new("db").log_staging_size(1000).validate().is_err());
    /// ```
    #[must_use]
    pub fn log_staging_size(mut self, bytes: usize) -> Self {
        self.log_staging_size = bytes;
        self
    }

    /// Size of each write-ahead log segment file (4 KiB to 4 GiB). Default 16 MiB. Hidden:
    /// the damaged-file tests and benchmarks use small segments to have many of them.
    ///
    /// ```
    /// let config = bfkv::Config::in_memory().log_segment_size(4 << 20);
    /// assert!(config.validate().is_ok());
    /// ```
    #[doc(hidden)]
    #[must_use]
    pub fn log_segment_size(mut self, bytes: u64) -> Self {
        self.log_segment_size = bytes;
        self
    }

    /// The configured cache size in bytes.
    ///
    /// ```
    /// assert_eq!(bfkv::Config::in_memory().cache_size(1 << 20).get_cache_size(), 1 << 20);
    /// ```
    pub fn get_cache_size(&self) -> usize {
        self.cache_size
    }

    /// The page size a new tree gets from this configuration (an existing tree opened
    /// without [`Config::page_size`] keeps its own: [`Tree::page_size`](crate::Tree::page_size)).
    ///
    /// ```
    /// assert_eq!(bfkv::Config::in_memory().get_page_size(), 8192);
    /// assert_eq!(bfkv::Config::in_memory().page_size(4096).get_page_size(), 4096);
    /// ```
    pub fn get_page_size(&self) -> usize {
        self.page_size
    }

    /// The configured directory, or `None` for an in-memory tree.
    ///
    /// ```
    /// use std::path::Path;
    /// assert_eq!(bfkv::Config::new("db").get_dir(), Some(Path::new("db")));
    /// assert_eq!(bfkv::Config::in_memory().get_dir(), None);
    /// ```
    pub fn get_dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The key and value limits that follow from the page size and from whether the tree
    /// has a directory (an in-memory tree stores no value out of line).
    ///
    /// ```
    /// let limits = bfkv::Config::in_memory().limits();
    /// assert_eq!((limits.max_key_len, limits.max_record_len), (2048, 4096));
    /// ```
    pub fn limits(&self) -> Limits {
        let limits = Limits {
            max_batch_len: max_batch_len(
                self.cache_size,
                self.log_segment_size,
                self.log_staging_size,
            ),
            ..Limits::for_page_size(self.page_size)
        };
        if self.dir.is_none() {
            return limits.inline_only();
        }
        limits
    }

    /// Checks every setting; `Tree::open` calls this first.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first bad setting.
    ///
    /// ```
    /// let err = bfkv::Config::in_memory().cache_size(0).validate().unwrap_err();
    /// assert!(matches!(err, bfkv::Error::InvalidConfig { .. }));
    /// ```
    pub fn validate(&self) -> Result<()> {
        let bad = |reason| Err(Error::InvalidConfig { reason });
        if !self.page_size.is_power_of_two()
            || !(MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&self.page_size)
        {
            return bad("page size must be a power of two from 4 KiB to 64 KiB");
        }
        if self.cache_size < 16 * self.page_size {
            return bad("cache size must be at least 16 pages");
        }
        if self.second_chance_percent > 100 {
            return bad("second-chance share must be 0 to 100 percent");
        }
        if self.promotion_percent > 100 {
            return bad("promotion chance must be 0 to 100 percent");
        }
        if !(64..=self.page_size).contains(&self.merge_threshold_bytes()) {
            return bad("merge threshold must be from 64 bytes to the page size");
        }
        if self.evictor_threads > 64 {
            return bad("at most 64 evictor threads");
        }
        if let Some(pause) = self.idle_write_back {
            if pause < Duration::from_millis(1) || pause > Duration::from_secs(3600) {
                return bad("idle write-back pause must be from 1 ms to 1 hour");
            }
        }
        if self.flush_interval.is_zero() || self.flush_interval > Duration::from_secs(60) {
            return bad("flush interval must be from 1 ns to 60 s");
        }
        if self.checkpoint_log_bytes < 1 << 20 {
            return bad("checkpoint log size must be at least 1 MiB");
        }
        if self.log_segment_size < self.page_size as u64 {
            // The largest record (half a page) must fit in a segment.
            return bad("log segment size must be at least the page size");
        }
        let staging = self.log_staging_size;
        if staging != 0 && !(staging.is_power_of_two() && (64 << 10..=1 << 30).contains(&staging)) {
            return bad("log staging size must be 0 or a power of two from 64 KiB to 1 GiB");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        Config::in_memory().validate().unwrap();
        Config::in_memory()
            .idle_write_back(None)
            .validate()
            .unwrap();
        Config::new("/nonexistent").validate().unwrap();
    }

    #[test]
    fn the_merge_threshold_follows_the_page_size_unless_set() {
        let c = Config::in_memory();
        assert_eq!(c.merge_threshold_bytes(), 8192);
        for page in [4 << 10, 16 << 10] {
            let c = Config::in_memory().page_size(page);
            assert_eq!(c.merge_threshold_bytes(), page);
            c.validate().unwrap();
        }
        let c = Config::in_memory().merge_threshold(16 << 10);
        assert!(matches!(c.validate(), Err(Error::InvalidConfig { .. })));
        assert_eq!(
            Config::in_memory()
                .merge_threshold(1000)
                .merge_threshold_bytes(),
            1000
        );
    }

    #[test]
    fn bad_settings_are_invalid_config() {
        for c in [
            Config::in_memory().page_size(3000),
            Config::in_memory().page_size(2048),
            Config::in_memory().page_size(128 << 10),
            Config::in_memory().cache_size(4096),
            Config::in_memory().cache_size(64 << 10),
            Config::in_memory().second_chance_percent(101),
            Config::in_memory().promotion_percent(200),
            Config::in_memory().merge_threshold(8),
            Config::in_memory().merge_threshold(16384),
            Config::in_memory().log_staging_size(4096),
            Config::in_memory().log_staging_size(3 << 20),
            Config::in_memory().log_staging_size(2 << 30),
            Config::in_memory().idle_write_back(Some(Duration::ZERO)),
            Config::in_memory().idle_write_back(Some(Duration::from_secs(7200))),
        ] {
            assert!(
                matches!(c.validate(), Err(Error::InvalidConfig { .. })),
                "{c:?}"
            );
        }
    }
}
