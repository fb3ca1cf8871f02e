//! The public [`Keyspace`] handle: a keyspace's key-value methods over the shared state,
//! each passing the keyspace's gate (`keyspace/space.rs`).

use std::ops::RangeBounds;
use std::sync::Arc;

use crate::error::Result;
use crate::tree::keyspace::prefix_range;
use crate::tree::keyspace::Space;
use crate::tree::read::Range;
use crate::tree::shared::Shared;

/// A handle on one keyspace of a [`Tree`](crate::Tree): an independent key order with the
/// same key-value methods as the tree (whose own methods act on its default keyspace).
///
/// Keyspaces share the tree's cache, log and data file; a key costs nothing extra in a leaf
/// (see `docs/ARCHITECTURE.md`). A handle is cheap to clone and may be sent to other
/// threads. After the tree is closed, or the keyspace dropped, its methods return
/// [`Error::Closed`](crate::Error::Closed) or [`Error::KeyspaceDropped`](crate::Error::KeyspaceDropped); a live handle never keeps the tree from
/// closing.
///
/// ```
/// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
/// let users = tree.keyspace("users")?;
/// let orders = tree.keyspace("orders")?;
/// users.insert(b"42", b"ada")?;
/// orders.insert(b"42", b"3 books")?;
/// assert_eq!(users.get(b"42")?, Some(b"ada".to_vec()));
/// assert_eq!(orders.get(b"42")?, Some(b"3 books".to_vec()));
/// assert_eq!(tree.get(b"42")?, None); // the default keyspace is another one
/// # Ok::<(), bfkv::Error>(())
/// ```
#[derive(Clone)]
pub struct Keyspace {
    shared: std::sync::Arc<Shared>,
    space: Arc<Space>,
}

impl Keyspace {
    /// A handle on `space` of `shared`.
    pub(crate) fn new(shared: std::sync::Arc<Shared>, space: Arc<Space>) -> Keyspace {
        Keyspace { shared, space }
    }

    /// The tree and the keyspace this handle names.
    pub(crate) fn parts(&self) -> (&std::sync::Arc<Shared>, &Arc<Space>) {
        (&self.shared, &self.space)
    }

    /// The keyspace's name (empty for the default keyspace).
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// assert_eq!(tree.keyspace("users")?.name(), "users");
    /// assert_eq!(tree.default_keyspace().name(), "");
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn name(&self) -> &str {
        self.space.name()
    }

    /// Inserts `key` → `value`, replacing any previous value. As [`Tree::insert`](crate::Tree::insert).
    ///
    /// # Errors
    /// As [`Tree::insert`](crate::Tree::insert), and [`Error::Closed`](crate::Error::Closed) or
    /// [`Error::KeyspaceDropped`](crate::Error::KeyspaceDropped) (nothing written).
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let ks = tree.keyspace("ks")?;
    /// ks.insert(b"k", b"v")?;
    /// assert_eq!(ks.get(b"k")?, Some(b"v".to_vec()));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn insert(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<()> {
        let _in = self.space.enter()?;
        self.shared
            .put_in(&self.space, key.as_ref(), value.as_ref())
    }

    /// Loads `records`, sorted by key, into this keyspace straight into fresh packed leaf
    /// pages. As [`Tree::bulk_load`](crate::Tree::bulk_load), whose contract holds for the
    /// keyspace's keys: the span from the first key to the last must lie within one leaf
    /// and hold no key (a new keyspace's range usually does, unless a leaf boundary of
    /// another keyspace's data falls inside it).
    ///
    /// # Errors
    /// As [`Tree::bulk_load`](crate::Tree::bulk_load), and [`Error::Closed`](crate::Error::Closed) or
    /// [`Error::KeyspaceDropped`](crate::Error::KeyspaceDropped).
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let tree = bfkv::Tree::open(bfkv::Config::new(dir.path()))?;
    /// let users = tree.keyspace("users")?;
    /// let records = (0..1_000u32).map(|i| (i.to_be_bytes(), b"user"));
    /// assert_eq!(users.bulk_load(records)?, 1_000);
    /// assert_eq!(users.get(7u32.to_be_bytes())?.as_deref(), Some(&b"user"[..]));
    /// assert_eq!(tree.get(7u32.to_be_bytes())?, None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bulk_load<K, V, I>(&self, records: I) -> Result<u64>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let _in = self.space.enter()?;
        self.shared.bulk_load_in(&self.space, records)
    }

    /// Removes `key`; removing an absent key is not an error. As [`Tree::remove`](crate::Tree::remove).
    ///
    /// # Errors
    /// As [`Keyspace::insert`].
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let ks = tree.keyspace("ks")?;
    /// ks.insert(b"k", b"v")?;
    /// ks.remove(b"k")?;
    /// assert_eq!(ks.get(b"k")?, None);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn remove(&self, key: impl AsRef<[u8]>) -> Result<()> {
        let _in = self.space.enter()?;
        self.shared.delete_in(&self.space, key.as_ref())
    }

    /// The value stored under `key`, if any. As [`Tree::get`](crate::Tree::get).
    ///
    /// # Errors
    /// As [`Tree::get`](crate::Tree::get), and [`Error::Closed`](crate::Error::Closed) or [`Error::KeyspaceDropped`](crate::Error::KeyspaceDropped).
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let ks = tree.keyspace("ks")?;
    /// assert_eq!(ks.get(b"k")?, None);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>> {
        let _in = self.space.enter()?;
        self.shared.get_in(&self.space, key.as_ref())
    }

    /// Copies the value stored under `key` into `value` and says whether there was one. As
    /// [`Tree::get_into`](crate::Tree::get_into).
    ///
    /// # Errors
    /// As [`Tree::get`](crate::Tree::get), and [`Error::Closed`](crate::Error::Closed) or [`Error::KeyspaceDropped`](crate::Error::KeyspaceDropped).
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let ks = tree.keyspace("ks")?;
    /// ks.insert(b"k", b"v")?;
    /// let mut value = Vec::new();
    /// assert!(ks.get_into(b"k", &mut value)?);
    /// assert_eq!(value, b"v");
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn get_into(&self, key: impl AsRef<[u8]>, value: &mut Vec<u8>) -> Result<bool> {
        value.clear();
        let _in = self.space.enter()?;
        self.shared.get_into_in(&self.space, key.as_ref(), value)
    }

    /// The values of `keys`, in order. As [`Tree::get_many`](crate::Tree::get_many); each
    /// result is [`Error::Closed`](crate::Error::Closed) or [`Error::KeyspaceDropped`](crate::Error::KeyspaceDropped) when the keyspace is gone.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let ks = tree.keyspace("ks")?;
    /// ks.insert(b"k", b"v")?;
    /// let got = ks.get_many(&[b"k".as_slice(), b"missing"]);
    /// assert_eq!(got[0].as_ref().ok(), Some(&Some(b"v".to_vec())));
    /// assert_eq!(got[1].as_ref().ok(), Some(&None));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn get_many<K: AsRef<[u8]>>(&self, keys: &[K]) -> Vec<Result<Option<Vec<u8>>>> {
        let Ok(_in) = self.space.enter() else {
            return keys
                .iter()
                .map(|_| self.space.enter().map(|_| None))
                .collect();
        };
        let got = self.shared.get_many_in(&self.space, keys);
        self.shared.nudge_evictors();
        got
    }

    /// Merges `operand` into the value of `key` with the tree's merge operator, without
    /// reading the value. As [`Tree::merge`](crate::Tree::merge).
    ///
    /// # Errors
    /// As [`Tree::merge`](crate::Tree::merge), and [`Error::Closed`](crate::Error::Closed) or
    /// [`Error::KeyspaceDropped`](crate::Error::KeyspaceDropped) (nothing written).
    ///
    /// ```
    /// let append = |_: &[u8], old: Option<&[u8]>, operand: &[u8]| {
    ///     Some([old.unwrap_or_default(), operand].concat())
    /// };
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory().merge_operator(append))?;
    /// let logs = tree.keyspace("logs")?;
    /// logs.merge(b"job-7", b"started;")?;
    /// logs.merge(b"job-7", b"done;")?;
    /// assert_eq!(logs.get(b"job-7")?, Some(b"started;done;".to_vec()));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn merge(&self, key: impl AsRef<[u8]>, operand: impl AsRef<[u8]>) -> Result<()> {
        let _in = self.space.enter()?;
        self.shared
            .merge_in(&self.space, key.as_ref(), operand.as_ref())
    }

    /// Atomically replaces the value of `key` with `new` if it is `expected`. As
    /// [`Tree::compare_and_swap`](crate::Tree::compare_and_swap).
    ///
    /// # Errors
    /// As [`Keyspace::insert`].
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let locks = tree.keyspace("locks")?;
    /// assert!(locks.compare_and_swap(b"job", None, Some(b"worker-1".as_slice()))?);
    /// assert!(!locks.compare_and_swap(b"job", None, Some(b"worker-2".as_slice()))?);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn compare_and_swap(
        &self,
        key: impl AsRef<[u8]>,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool> {
        let _in = self.space.enter()?;
        self.shared.cas_in(&self.space, key.as_ref(), expected, new)
    }

    /// The records with keys in `range`, ascending (`.rev()` for descending). As
    /// [`Tree::range`](crate::Tree::range); the iterator yields [`Error::Closed`](crate::Error::Closed) or
    /// [`Error::KeyspaceDropped`](crate::Error::KeyspaceDropped) if that happens while it runs.
    /// For the whole keyspace write [`iter`](Self::iter): `range(..)` names no key type to
    /// infer.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let ks = tree.keyspace("ks")?;
    /// for k in [b"a", b"b", b"c"] { ks.insert(k, b"")?; }
    /// tree.insert(b"b2", b"")?; // another keyspace: not in the range below
    /// let keys: Vec<Vec<u8>> = ks.range(b"b".as_slice()..).map(|r| r.map(|(k, _)| k)).collect::<Result<_, _>>()?;
    /// assert_eq!(keys, vec![b"b".to_vec(), b"c".to_vec()]);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn range<K, R>(&self, range: R) -> Range<'static>
    where
        K: AsRef<[u8]>,
        R: RangeBounds<K>,
    {
        Range::new(self.shared.clone(), self.space.clone(), range)
    }

    /// Every record of the keyspace, in ascending key order. The iterator borrows nothing of
    /// the handle: it may outlive it (after the tree is closed it yields
    /// [`Error::Closed`](crate::Error::Closed)).
    ///
    /// ```
    /// fn records_of(tree: &bfkv::Tree, name: &str) -> bfkv::Result<bfkv::Range<'static>> {
    ///     Ok(tree.keyspace(name)?.iter()) // the handle is dropped here
    /// }
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// tree.keyspace("ks")?.insert(b"k", b"v")?;
    /// assert_eq!(records_of(&tree, "ks")?.count(), 1);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn iter(&self) -> Range<'static> {
        Range::new::<&[u8], _>(self.shared.clone(), self.space.clone(), ..)
    }

    /// The records whose keys start with `prefix`, in ascending key order (`rev` for
    /// descending); an empty prefix gives every record.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let tree = tree.keyspace("ks")?;
    /// for k in ["user/1", "user/2", "users", "video/1"] {
    ///     tree.insert(k, b"")?;
    /// }
    /// let keys: Vec<Vec<u8>> = tree.prefix(b"user/").map(|r| r.map(|(k, _)| k)).collect::<Result<_, _>>()?;
    /// assert_eq!(keys, [b"user/1".to_vec(), b"user/2".to_vec()]);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn prefix(&self, prefix: impl AsRef<[u8]>) -> Range<'static> {
        self.range(prefix_range(prefix.as_ref()))
    }

    /// The record with the smallest key, if any.
    ///
    /// # Errors
    /// As the first item of [`Keyspace::iter`].
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let tree = tree.keyspace("ks")?;
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
    /// As the last item of [`Keyspace::iter`].
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let tree = tree.keyspace("ks")?;
    /// tree.insert(b"a", b"1")?;
    /// tree.insert(b"b", b"2")?;
    /// assert_eq!(tree.last()?, Some((b"b".to_vec(), b"2".to_vec())));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn last(&self) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        self.iter().next_back().transpose()
    }

    /// The exact number of keys of the keyspace, counted by a scan of the keys:
    /// values stored out of line are not read. It takes time in proportion to the keys.
    ///
    /// # Errors
    /// The first error the scan meets.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let tree = tree.keyspace("ks")?;
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

/// `for (key, value) in &keyspace` walks its records in key order, as [`Keyspace::iter`].
///
/// ```
/// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
/// let ks = tree.keyspace("ks")?;
/// ks.insert(b"k", b"v")?;
/// for record in &ks {
///     assert_eq!(record?, (b"k".to_vec(), b"v".to_vec()));
/// }
/// # Ok::<(), bfkv::Error>(())
/// ```
impl<'k> IntoIterator for &'k Keyspace {
    type Item = Result<(Vec<u8>, Vec<u8>)>;
    type IntoIter = Range<'k>;

    fn into_iter(self) -> Range<'k> {
        self.iter()
    }
}

impl std::fmt::Debug for Keyspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyspace")
            .field("name", &self.space.name())
            .finish_non_exhaustive()
    }
}
