//! [`Tree`]'s key-value methods: they act on the default keyspace.

use super::tree::Tree;
use crate::error::Result;
use crate::tree::keyspace::prefix_range;
use crate::tree::read::Range;

impl Tree {
    /// Inserts `key` → `value`, replacing any previous value.
    ///
    /// A value too long for a leaf record with its key (past [`Limits::max_record_len`](crate::Limits::max_record_len))
    /// is written to the blob file first and the leaf holds a reference to it (see the
    /// crate docs); values go up to [`Limits::max_value_len`](crate::Limits::max_value_len), 64 MiB.
    ///
    /// # Errors
    /// [`Error::KeyTooLarge`](crate::Error::KeyTooLarge) / [`Error::ValueTooLarge`](crate::Error::ValueTooLarge) past [`Limits`](crate::Limits) (the tree is
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
    ///   limits of [`insert`](Tree::insert) (values past [`Limits::max_record_len`](crate::Limits::max_record_len) go to
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
    /// [`Error::ValueTooLarge`](crate::Error::ValueTooLarge) past [`Limits`](crate::Limits);
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

    /// The records with keys in `range`, in ascending order (`.rev()` for descending).
    ///
    /// The iterator holds no lock between calls to `next`; it sees every key that is present
    /// for its whole duration and none that is absent for its whole duration.
    ///
    /// Every bound form works (`a..b`, `a..=b`, `a..`, `..b`, `(Bound, Bound)`); for the
    /// whole key space write [`iter`](Self::iter): `range(..)` names no key type to infer.
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
        Range::new(&*self.shared, &**self.default_space(), range)
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
        Range::new::<&[u8], _>(&*self.shared, &**self.default_space(), ..)
    }

    /// The records whose keys start with `prefix`, in ascending key order (`rev` for
    /// descending); an empty prefix gives every record.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// for k in ["user/1", "user/2", "users", "video/1"] {
    ///     tree.insert(k, b"")?;
    /// }
    /// let keys: Vec<Vec<u8>> = tree.prefix(b"user/").map(|r| r.map(|(k, _)| k)).collect::<Result<_, _>>()?;
    /// assert_eq!(keys, [b"user/1".to_vec(), b"user/2".to_vec()]);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn prefix(&self, prefix: impl AsRef<[u8]>) -> Range<'_> {
        self.range(prefix_range(prefix.as_ref()))
    }

    /// The record with the smallest key, if any.
    ///
    /// # Errors
    /// As the first item of [`Tree::iter`].
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// assert_eq!(tree.first()?, None);
    /// tree.insert(b"b", b"2")?;
    /// tree.insert(b"a", b"1")?;
    /// assert_eq!(tree.first()?, Some((b"a".to_vec(), b"1".to_vec())));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn first(&self) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        self.iter().next().transpose()
    }

    /// The record with the largest key, if any.
    ///
    /// # Errors
    /// As the last item of [`Tree::iter`].
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// tree.insert(b"a", b"1")?;
    /// tree.insert(b"b", b"2")?;
    /// assert_eq!(tree.last()?, Some((b"b".to_vec(), b"2".to_vec())));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn last(&self) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        self.iter().next_back().transpose()
    }

    /// The exact number of keys (of the default keyspace), counted by a scan of the keys:
    /// values stored out of line are not read. It takes time in proportion to the keys.
    ///
    /// # Errors
    /// The first error the scan meets.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// assert_eq!(tree.len()?, 0);
    /// tree.insert(b"a", b"1")?;
    /// tree.insert(b"b", b"2")?;
    /// assert_eq!(tree.len()?, 2);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    #[allow(clippy::len_without_is_empty)] // `first()?.is_none()` says whether it is empty
    pub fn len(&self) -> Result<u64> {
        self.iter().count_keys()
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
