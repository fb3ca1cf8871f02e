//! The public handle, [`Tree`]: a thin facade over the shared state (`shared.rs`) and the
//! background threads (`background.rs`).

use super::background::Background;
use super::keyspace::{Keyspace, Space};
use super::persist;
use super::scan::Range;
use super::shared::Shared;
use super::stats::Stats;
use crate::config::Config;
use crate::error::Result;
use crate::limits::Limits;

/// A concurrent, persistent ordered key-value map. See the crate docs for an overview.
///
/// `Tree` is `Send + Sync`; every method takes `&self`, so share it with `Arc<Tree>` or
/// scoped threads.
///
/// ```
/// use bfkv::{Config, Tree};
/// let tree = Tree::open(Config::in_memory())?;
/// tree.insert(b"apple", b"red")?;
/// assert_eq!(tree.get(b"apple")?, Some(b"red".to_vec()));
/// tree.remove(b"apple")?;
/// assert_eq!(tree.get(b"apple")?, None);
/// # Ok::<(), bfkv::Error>(())
/// ```
pub struct Tree {
    shared: std::sync::Arc<Shared>,
    background: Background,
}

impl Tree {
    /// Opens the tree described by `config`: creates the directory and an empty tree if
    /// absent or empty, otherwise loads its last checkpoint. A path that is not a tree's is
    /// refused before anything is created there.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for bad settings (or a page size that differs from the
    /// existing tree's), [`Error::Locked`](crate::Error::Locked) if another `Tree` (in this or another process)
    /// has the directory open, [`Error::Corruption`](crate::Error::Corruption) if the checkpoint or data file is
    /// damaged, [`Error::Io`](crate::Error::Io) for operating-system failures, and of kind `NotADirectory` for a
    /// path that is a file, `DirectoryNotEmpty` for a directory holding files but no tree.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let tree = bfkv::Tree::open(bfkv::Config::new(dir.path()))?;
    /// // A second handle on the same directory is refused while the first is open.
    /// let second = bfkv::Tree::open(bfkv::Config::new(dir.path()));
    /// assert!(matches!(second, Err(bfkv::Error::Locked { .. })));
    /// # drop(tree);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(config: Config) -> Result<Tree> {
        config.validate()?;
        // Shuttle explores the foreground paths only: no background threads in its models.
        let threads = if cfg!(shuttle) {
            0
        } else {
            config.evictor_threads
        };
        let shared = std::sync::Arc::new(persist::open(config)?);
        Ok(Tree {
            background: Background::start(&shared, threads),
            shared,
        })
    }

    /// Inserts `key` → `value`, replacing any previous value.
    ///
    /// A value too long for a leaf record with its key (past [`Limits::max_record_len`])
    /// is written to the blob file first and the leaf holds a reference to it (see the
    /// crate docs); values go up to [`Limits::max_value_len`], 64 MiB.
    ///
    /// # Errors
    /// [`Error::KeyTooLarge`](crate::Error::KeyTooLarge) / [`Error::ValueTooLarge`](crate::Error::ValueTooLarge) past [`Limits`] (the tree is
    /// unchanged), [`Error::CacheFull`](crate::Error::CacheFull) for a full in-memory tree, [`Error::Io`](crate::Error::Io) or
    /// [`Error::Corruption`](crate::Error::Corruption) if making room needed the disk and it failed.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// tree.insert(b"k", b"one")?;
    /// tree.insert(b"k", b"two")?; // replaces
    /// assert_eq!(tree.get(b"k")?, Some(b"two".to_vec()));
    /// // Too large a key: an error, and the tree is unchanged.
    /// assert!(tree.insert(vec![0u8; 4096], b"").is_err());
    /// // An in-memory tree keeps values in records: half a page at most.
    /// assert!(tree.insert(b"k", vec![0u8; 4096]).is_err());
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn insert(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<()> {
        self.shared
            .put_in(self.default_space(), key.as_ref(), value.as_ref())
    }

    /// Loads `records`, sorted by key, straight into fresh leaf pages packed full, instead of
    /// inserting them one by one, and returns how many records were loaded. The input is
    /// streamed: it may be larger than memory (leaves are written as they fill, 32 pages per
    /// write); only each leaf's low key and page are kept until the end.
    ///
    /// The contract:
    /// - keys are strictly ascending (no key twice), and every key and value obeys the
    ///   limits of [`insert`](Tree::insert) (values past [`Limits::max_record_len`] go to
    ///   the blob file as `insert` sends them there);
    /// - the span from the first key to the last lies within one leaf of the tree, and no
    ///   key in that span is present. Keys outside it may be: they join the first and last
    ///   new leaves. An empty tree, or a key range no write has reached and no leaf boundary
    ///   crosses, is always such a span;
    /// - the load is not logged: before this returns a checkpoint makes it durable, whatever
    ///   the [`Durability`](crate::Durability). A crash before that checkpoint is written
    ///   leaves the tree as it was before the call (with the other writes acknowledged
    ///   meanwhile): all of the records or none of them survive;
    /// - other threads may read and write meanwhile. They see none of the records until
    ///   all of them are in the tree; a write into the span that lands first makes the load
    ///   fail, and one that comes after it wins.
    ///
    /// An in-memory tree (`Config::in_memory()`) makes the same checks (its span is checked
    /// for present keys with a range scan, and its leaves cut no span), then inserts the
    /// records one by one; a write into the span meanwhile is overwritten by the load, and
    /// an insert that fails (a full cache) takes back the records it loaded.
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for keys out of order or
    /// repeated, or a span that holds a key or crosses a leaf boundary;
    /// [`Error::KeyTooLarge`](crate::Error::KeyTooLarge) /
    /// [`Error::ValueTooLarge`](crate::Error::ValueTooLarge) past [`Limits`];
    /// [`Error::Io`](crate::Error::Io) or [`Error::Corruption`](crate::Error::Corruption)
    /// from the disk. Each of these leaves the tree exactly as it was (pages and blob
    /// extents already written are freed for reuse), except an error of the final
    /// checkpoint, after which the records are loaded but not yet durable (as after a
    /// failed [`checkpoint`](Tree::checkpoint)).
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let tree = bfkv::Tree::open(bfkv::Config::new(dir.path()))?;
    /// let records = (0..10_000u32).map(|i| (i.to_be_bytes(), format!("value {i}")));
    /// assert_eq!(tree.bulk_load(records)?, 10_000);
    /// assert_eq!(tree.get(7u32.to_be_bytes())?, Some(b"value 7".to_vec()));
    /// // Keys out of order: an error, and nothing is loaded.
    /// let unsorted = tree.bulk_load([(b"b", b"1"), (b"a", b"2")]);
    /// assert!(matches!(unsorted, Err(bfkv::Error::InvalidInput { .. })));
    /// assert_eq!(tree.get(b"b")?, None);
    /// // A span that already holds a key is refused too.
    /// let taken = tree.bulk_load([(5u32.to_be_bytes(), b"x")]);
    /// assert!(matches!(taken, Err(bfkv::Error::InvalidInput { .. })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bulk_load<K, V, I>(&self, records: I) -> Result<u64>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        self.shared.bulk_load_in(self.default_space(), records)
    }

    /// Removes `key`. Removing an absent key is not an error.
    ///
    /// # Errors
    /// As [`Tree::insert`].
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// tree.insert(b"k", b"v")?;
    /// tree.remove(b"k")?;
    /// tree.remove(b"never there")?; // not an error
    /// assert_eq!(tree.get(b"k")?, None);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn remove(&self, key: impl AsRef<[u8]>) -> Result<()> {
        self.shared.delete_in(self.default_space(), key.as_ref())
    }

    /// The value stored under `key`, if any.
    ///
    /// # Errors
    /// [`Error::KeyTooLarge`](crate::Error::KeyTooLarge) for a key no tree could hold, [`Error::Io`](crate::Error::Io) or
    /// [`Error::Corruption`](crate::Error::Corruption) when reading the leaf from disk fails.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// assert_eq!(tree.get(b"k")?, None);
    /// tree.insert(b"k", b"v")?;
    /// assert_eq!(tree.get(b"k")?.as_deref(), Some(&b"v"[..]));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>> {
        self.shared.get_in(self.default_space(), key.as_ref())
    }

    /// Copies the value stored under `key` into `value` (cleared first) and says whether
    /// there was one: [`get`](Tree::get) without allocating. A value in the cache is copied
    /// straight from its node while the leaf is locked, so once `value` has room for it a
    /// lookup answered from memory allocates nothing; reuse one buffer across lookups. On
    /// `Ok(false)` and on an error `value` is left empty.
    ///
    /// # Errors
    /// As [`get`](Tree::get).
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// tree.insert(b"a", b"1")?;
    /// let mut value = Vec::with_capacity(64);
    /// assert!(tree.get_into(b"a", &mut value)?);
    /// assert_eq!(value, b"1");
    /// assert!(!tree.get_into(b"b", &mut value)?);
    /// assert!(value.is_empty());
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn get_into(&self, key: impl AsRef<[u8]>, value: &mut Vec<u8>) -> Result<bool> {
        self.shared
            .get_into_in(self.default_space(), key.as_ref(), value)
    }

    /// The values of `keys`, in order: what [`get`](Tree::get) would return for each. The
    /// keys the cache answers are answered at once; the leaf pages the others need are read
    /// together, up to 32 at a time, so the device works on many reads at once instead of
    /// one (a lookup of many cold keys is limited by the device's throughput, not by its
    /// latency). Nothing read here is cached; the calling thread keeps the page buffers of
    /// its last read (up to 32 pages) for its next call.
    ///
    /// Each key has its own result: one key's error (too long a key, a damaged leaf) does
    /// not fail the others. Each answer is its key's value at some moment during the call,
    /// and the keys are not read at one moment together: under concurrent writes, two keys
    /// may show writes from different moments.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// tree.insert(b"a", b"1")?;
    /// tree.insert(b"c", b"3")?;
    /// let got = tree.get_many(&[b"a", b"b", b"c"]);
    /// assert_eq!(got.len(), 3);
    /// assert_eq!(got[0].as_ref().ok(), Some(&Some(b"1".to_vec())));
    /// assert_eq!(got[1].as_ref().ok(), Some(&None));
    /// assert_eq!(got[2].as_ref().ok(), Some(&Some(b"3".to_vec())));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn get_many<K: AsRef<[u8]>>(&self, keys: &[K]) -> Vec<Result<Option<Vec<u8>>>> {
        let got = self.shared.get_many_in(self.default_space(), keys);
        self.shared.nudge_evictors();
        got
    }

    /// Merges `operand` into the value of `key` with the merge operator configured by
    /// [`Config::merge_operator`](crate::Config::merge_operator), without reading the value: a
    /// blind upsert (Bε-tree), buffered in the key's mini-page and folded over the value when
    /// the key is read or its leaf is written back. A counter or an append costs one buffered
    /// write instead of a read and a write. Operands apply in the order their merges were
    /// acknowledged, and each exactly once, after a crash too. Durable like an
    /// [`insert`](Tree::insert).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) without a merge operator (nothing
    /// written); otherwise as [`Tree::insert`] (the limits apply to `key` and `operand`), and
    /// `ValueTooLarge` if the fold this merge triggers returns a value past the limit.
    ///
    /// ```
    /// let add = |_key: &[u8], old: Option<&[u8]>, operand: &[u8]| {
    ///     let n = |b: Option<&[u8]>| b.and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes);
    ///     Some((n(old) + n(Some(operand))).to_le_bytes().to_vec())
    /// };
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory().merge_operator(add))?;
    /// for _ in 0..3 {
    ///     tree.merge(b"hits", 1u64.to_le_bytes())?;
    /// }
    /// assert_eq!(tree.get(b"hits")?, Some(3u64.to_le_bytes().to_vec()));
    /// // Without an operator a merge is refused.
    /// let plain = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// assert!(matches!(plain.merge(b"hits", b"1"), Err(bfkv::Error::InvalidConfig { .. })));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn merge(&self, key: impl AsRef<[u8]>, operand: impl AsRef<[u8]>) -> Result<()> {
        self.shared
            .merge_in(self.default_space(), key.as_ref(), operand.as_ref())
    }

    /// Atomically replaces the value of `key` with `new` if its current value is
    /// `expected`, and returns whether it was. `None` as `expected` means "absent" (an
    /// empty value is present); `None` as `new` removes the key. The comparison and the
    /// write happen under the key's leaf lock, so concurrent swaps of one key serialize; a
    /// successful swap is durable like an [`insert`](Tree::insert).
    ///
    /// # Errors
    /// As [`Tree::insert`] (the limits apply to `key` and `new`).
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// // Take a lease only if nobody holds it.
    /// assert!(tree.compare_and_swap(b"lease", None, Some(b"a".as_slice()))?);
    /// assert!(!tree.compare_and_swap(b"lease", None, Some(b"b".as_slice()))?);
    /// // Hand it over, then release it.
    /// assert!(tree.compare_and_swap(b"lease", Some(b"a".as_slice()), Some(b"b".as_slice()))?);
    /// assert!(tree.compare_and_swap(b"lease", Some(b"b".as_slice()), None)?);
    /// assert_eq!(tree.get(b"lease")?, None);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn compare_and_swap(
        &self,
        key: impl AsRef<[u8]>,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool> {
        self.shared
            .cas_in(self.default_space(), key.as_ref(), expected, new)
    }

    /// A handle on the keyspace named `name`, created (durably, per the tree's
    /// [`Durability`](crate::Durability)) if it does not exist yet. Names are 1 to 255 bytes.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for an empty or too long name;
    /// as [`Tree::insert`] when the creation is written.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let tree = bfkv::Tree::open(bfkv::Config::new(dir.path()))?;
    /// tree.keyspace("users")?.insert(b"1", b"ada")?;
    /// tree.close()?;
    /// let tree = bfkv::Tree::open(bfkv::Config::new(dir.path()))?;
    /// assert_eq!(tree.keyspaces()?, ["users"]);
    /// assert_eq!(tree.keyspace("users")?.get(b"1")?, Some(b"ada".to_vec()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn keyspace(&self, name: &str) -> Result<Keyspace> {
        let space = self.shared.keyspace_named(name)?;
        Ok(Keyspace::new(self.shared.clone(), space))
    }

    /// An empty [`Batch`](crate::Batch) of writes to this tree's keyspaces, applied all or
    /// nothing by [`Batch::commit`](crate::Batch::commit).
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let accounts = tree.keyspace("accounts")?;
    /// accounts.insert(b"alice", 100u64.to_le_bytes())?;
    /// let mut batch = tree.batch();
    /// batch.insert(&accounts, b"alice", 60u64.to_le_bytes());
    /// batch.insert(&accounts, b"bob", 40u64.to_le_bytes());
    /// batch.commit()?;
    /// assert_eq!(accounts.get(b"bob")?, Some(40u64.to_le_bytes().to_vec()));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn batch(&self) -> crate::Batch {
        crate::Batch::new(self.shared.clone())
    }

    /// A handle on the default keyspace, the one the tree's own methods act on (so a batch
    /// can name it).
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// tree.default_keyspace().insert(b"k", b"v")?;
    /// assert_eq!(tree.get(b"k")?, Some(b"v".to_vec()));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn default_keyspace(&self) -> Keyspace {
        Keyspace::new(self.shared.clone(), self.default_space().clone())
    }

    /// The names of the tree's keyspaces, in byte order (the default keyspace has none).
    ///
    /// # Errors
    /// [`Error::Io`](crate::Error::Io) or [`Error::Corruption`](crate::Error::Corruption)
    /// reading the catalog.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// tree.keyspace("b")?;
    /// tree.keyspace("a")?;
    /// assert_eq!(tree.keyspaces()?, ["a", "b"]);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn keyspaces(&self) -> Result<Vec<String>> {
        self.shared.keyspace_names()
    }

    /// Removes the keyspace named `name` and every key in it (nothing if it does not
    /// exist). Its handles answer [`Error::KeyspaceDropped`](crate::Error::KeyspaceDropped)
    /// from then on; a keyspace created later under the same name starts empty. The keys
    /// are removed before this returns (a crash part way is finished by the next `open`);
    /// their pages are freed as the emptied leaves are written back.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for an invalid name; as
    /// [`Tree::remove`] for the removals.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let tmp = tree.keyspace("tmp")?;
    /// tmp.insert(b"k", b"v")?;
    /// tree.drop_keyspace("tmp")?;
    /// assert!(matches!(tmp.get(b"k"), Err(bfkv::Error::KeyspaceDropped { .. })));
    /// assert_eq!(tree.keyspace("tmp")?.get(b"k")?, None);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn drop_keyspace(&self, name: &str) -> Result<()> {
        self.shared.drop_keyspace(name)
    }

    /// Copies the tree into the new directory `target`, online: writers go on during the
    /// copy (only checkpoints wait for it). The copy is an independent tree that
    /// [`Tree::open`] opens (while this one is open too) and holds every write acknowledged
    /// before the call. The data file is copied (the kernel shares blocks where the file
    /// system can, as on XFS and Btrfs), complete log segments are hard-linked, and the
    /// copy is opened and closed once before this returns, so it is checked and needs no
    /// recovery. With a log (`Sync`, `Buffered`) the copy is the tree after a prefix of the
    /// acknowledged writes; under `Durability::None`, which keeps no order of writes, each
    /// write made while the backup runs may be in it or not. Until the copy is complete
    /// `target` holds the file `BACKUP-INCOMPLETE`, so what a crash, a kill or a full disk
    /// leaves of it is refused by [`Tree::open`] (`Corruption` naming that file).
    ///
    /// # Errors
    /// [`Error::Io`](crate::Error::Io) of kind `AlreadyExists` if anything is at `target`
    /// (nothing there is touched); [`Error::InvalidInput`](crate::Error::InvalidInput) for a
    /// target inside the tree's own directory, however the path reaches it (`..`, links;
    /// nothing is written); [`Error::InvalidConfig`](crate::Error::InvalidConfig) for
    /// an in-memory tree; I/O errors of the copy, after which `target` is removed again.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let tree = bfkv::Tree::open(bfkv::Config::new(dir.path().join("db")))?;
    /// tree.insert(b"k", b"v")?;
    /// tree.backup(dir.path().join("copy"))?;
    /// let copy = bfkv::Tree::open(bfkv::Config::new(dir.path().join("copy")))?;
    /// assert_eq!(copy.get(b"k")?, Some(b"v".to_vec()));
    /// assert!(tree.backup(dir.path().join("copy")).is_err()); // never overwrites
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn backup(&self, target: impl AsRef<std::path::Path>) -> Result<()> {
        self.shared.backup(target.as_ref())
    }

    /// The default keyspace's state.
    fn default_space(&self) -> &std::sync::Arc<Space> {
        self.shared.catalog().default_space()
    }

    /// The records with keys in `range`, in ascending order (`.rev()` for descending).
    ///
    /// The iterator holds no lock between calls to `next`; it sees every key that is present
    /// for its whole duration and none that is absent for its whole duration.
    ///
    /// ```
    /// # let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// for k in [b"a", b"b", b"c"] { tree.insert(k, b"")?; }
    /// let keys: Vec<Vec<u8>> = tree.range(b"b".as_slice()..).map(|r| r.map(|(k, _)| k)).collect::<Result<_, _>>()?;
    /// assert_eq!(keys, vec![b"b".to_vec(), b"c".to_vec()]);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn range<K, R>(&self, range: R) -> Range<'_>
    where
        K: AsRef<[u8]>,
        R: std::ops::RangeBounds<K>,
    {
        Range::new(&self.shared, self.default_space(), false, range)
    }

    /// Every record, in ascending key order.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// for k in [b"b", b"a", b"c"] {
    ///     tree.insert(k, b"")?;
    /// }
    /// let keys: Vec<Vec<u8>> = tree.iter().map(|r| r.map(|(k, _)| k)).collect::<Result<_, _>>()?;
    /// assert_eq!(keys, [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn iter(&self) -> Range<'_> {
        Range::new::<&[u8], _>(&self.shared, self.default_space(), false, ..)
    }

    /// Makes every write acknowledged so far durable, whatever the [`Durability`]: syncs the
    /// write-ahead log, or (under `Durability::None`) writes a checkpoint.
    ///
    /// [`Durability`]: crate::Durability
    ///
    /// # Errors
    /// [`Error::Io`](crate::Error::Io) if writing or syncing fails; acknowledged data stays intact.
    ///
    /// ```
    /// use bfkv::{Config, Durability, Tree};
    /// let dir = tempfile::tempdir()?;
    /// let tree = Tree::open(Config::new(dir.path()).durability(Durability::Buffered))?;
    /// tree.insert(b"k", b"v")?;
    /// tree.flush()?; // now on stable storage, as if written with `Durability::Sync`
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn flush(&self) -> Result<()> {
        self.shared.flush()
    }

    /// Writes a checkpoint: dirty mini-pages are merged into their leaves and written, then
    /// the leaf map is saved atomically. A no-op for in-memory trees.
    ///
    /// # Errors
    /// [`Error::Io`](crate::Error::Io) if writing or syncing fails.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let tree = bfkv::Tree::open(bfkv::Config::new(dir.path()))?;
    /// tree.insert(b"k", b"v")?;
    /// tree.checkpoint()?;
    /// assert!(tree.stats().checkpoints >= 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn checkpoint(&self) -> Result<()> {
        self.shared.checkpoint()
    }

    /// Checkpoints and closes the tree. Dropping the tree does the same, ignoring errors.
    ///
    /// # Errors
    /// As [`Tree::checkpoint`].
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let tree = bfkv::Tree::open(bfkv::Config::new(dir.path()))?;
    /// tree.insert(b"k", b"v")?;
    /// tree.close()?; // errors surface here; dropping the tree would ignore them
    /// let tree = bfkv::Tree::open(bfkv::Config::new(dir.path()))?;
    /// assert_eq!(tree.get(b"k")?, Some(b"v".to_vec()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn close(mut self) -> Result<()> {
        self.stop_background();
        self.shared.close()
    }

    fn stop_background(&mut self) {
        self.background.stop();
    }

    /// This tree with its background threads stopped: checkpoints and evictions then run
    /// only when a test calls them.
    #[cfg(all(test, not(shuttle)))]
    pub(crate) fn without_background(mut self) -> Tree {
        self.stop_background();
        self
    }

    /// Counters describing what the tree has done so far (cheap to read).
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// tree.insert(b"k", b"v")?;
    /// tree.get(b"k")?;
    /// assert_eq!(tree.stats().cache_hits, 1);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// Where the cache's bytes are right now (diagnosis; walks every leaf).
    #[cfg(any(fuzzing, bfkv_internals))]
    #[doc(hidden)]
    pub fn census(&self) -> super::census::Census {
        self.shared.census()
    }

    /// A tree over already opened state with `threads` evictor threads (tests that open over
    /// fault-injecting disks or watch the evictors' bell).
    #[cfg(any(all(test, not(shuttle)), fuzzing, bfkv_internals))]
    pub(crate) fn from_shared(shared: std::sync::Arc<Shared>, threads: usize) -> Tree {
        Tree {
            background: Background::start(&shared, threads),
            shared,
        }
    }

    /// The shared state, for tests that look inside.
    #[cfg(any(test, fuzzing, bfkv_internals))]
    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// The key and value size limits of this tree.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let limits = tree.limits();
    /// assert!(tree.insert(vec![0u8; limits.max_key_len], b"").is_ok());
    /// assert!(tree.insert(vec![0u8; limits.max_key_len + 1], b"").is_err());
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn limits(&self) -> Limits {
        self.shared.limits()
    }

    /// The size of this tree's leaf pages in bytes: the one it was created with
    /// ([`Config::page_size`](crate::Config::page_size)).
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let tree = bfkv::Tree::open(bfkv::Config::new(dir.path()).page_size(16 << 10))?;
    /// tree.close()?;
    /// // Reopened without a page size, it keeps its own.
    /// let tree = bfkv::Tree::open(bfkv::Config::new(dir.path()))?;
    /// assert_eq!(tree.page_size(), 16 << 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn page_size(&self) -> usize {
        self.shared.page_size()
    }
}

/// `for (key, value) in &tree` walks every record in key order, as [`Tree::iter`].
///
/// ```
/// # let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
/// tree.insert(b"k", b"v")?;
/// for record in &tree {
///     let (key, value) = record?;
///     assert_eq!((key.as_slice(), value.as_slice()), (&b"k"[..], &b"v"[..]));
/// }
/// # Ok::<(), bfkv::Error>(())
/// ```
impl<'t> IntoIterator for &'t Tree {
    type Item = Result<(Vec<u8>, Vec<u8>)>;
    type IntoIter = Range<'t>;

    fn into_iter(self) -> Range<'t> {
        self.iter()
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        self.stop_background();
        let _ = self.shared.close();
    }
}

impl std::fmt::Debug for Tree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tree")
            .field("dir", &self.shared.config().dir)
            .finish_non_exhaustive()
    }
}
