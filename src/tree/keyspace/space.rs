//! Keyspaces: independent key orders in one tree, sharing its cache, log and data file.
//!
//! **Design decision: one short prefix per keyspace, not one tree per keyspace.** Every
//! stored key starts with its keyspace's prefix (1 byte for the default keyspace and the
//! first 239 named ones, at most 5), so the log, replay, checkpoints, eviction, splits and
//! recovery need nothing new, and a batch spanning keyspaces is a batch over keys. It costs
//! no bytes in a leaf: a leaf's records share the prefix of its two fences (`node`), and
//! only a leaf whose range straddles two keyspaces stores it per record. Keys in the log and
//! the inner nodes carry it (one byte on a 16-byte key). A tree per keyspace would instead
//! need a keyspace id in every log record, leaf map entry and eviction path, and a root per
//! keyspace in every structure change.
//!
//! How keys carry the prefix: `prefix.rs`.

use std::ops::{Bound, RangeBounds};

use super::prefix::Prefix;
use crate::error::{Error, Result};
use crate::tree::read::Range;
use crate::tree::shared::Shared;
use crate::tree::WriteOp;
use std::sync::Arc;

use crate::sync::{self, AtomicU8, AtomicUsize, Ordering};

/// Gate states.
const OPEN: u8 = 0;
const DROPPED: u8 = 1;
const CLOSED: u8 = 2;

/// One keyspace as the tree knows it: its id, name and prefix, and the gate its handles'
/// calls pass, which lets a drop or a close wait out the calls already inside.
#[derive(Debug)]
pub(crate) struct Space {
    /// Its name (empty for the default keyspace).
    name: String,
    /// The prefix of its keys.
    prefix: Prefix,
    /// Calls of its handles now inside the tree.
    active: AtomicUsize,
    /// `OPEN`, `DROPPED` or `CLOSED`.
    state: AtomicU8,
}

/// A call that passed a [`Space`]'s gate; leaves it when dropped.
pub(crate) struct Entered<'s>(&'s Space);

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Space {
    /// Keyspace `id` named `name`.
    pub(crate) fn new(id: u32, name: String) -> Space {
        Space {
            name,
            prefix: Prefix::of(id),
            active: AtomicUsize::new(0),
            state: AtomicU8::new(OPEN),
        }
    }

    /// A space over every key that starts with `prefix` (the catalog's ranges; no handle
    /// names it).
    pub(crate) fn with_prefix(prefix: Prefix) -> Space {
        Space {
            prefix,
            ..Space::new(0, String::new())
        }
    }

    /// Its prefix.
    #[inline]
    pub(crate) fn prefix(&self) -> Prefix {
        self.prefix
    }

    /// Passes the gate: `Closed` once the tree closed, `KeyspaceDropped` once it was dropped.
    ///
    /// The counter is raised before the state is read, and `shut` writes the state before
    /// it reads the counter (all sequentially consistent): either `shut` sees this call and
    /// waits for it, or this call sees the new state and turns back.
    pub(crate) fn enter(&self) -> Result<Entered<'_>> {
        self.active.fetch_add(1, Ordering::SeqCst);
        let entered = Entered(self);
        match self.state.load(Ordering::SeqCst) {
            OPEN => Ok(entered),
            DROPPED => Err(Error::KeyspaceDropped {
                name: self.name.clone(),
            }),
            _ => Err(Error::Closed),
        }
    }

    /// Closes the gate (`dropped`: for a drop, else for the tree's close) and waits until
    /// no call is inside. The caller must not be inside itself.
    pub(crate) fn shut(&self, dropped: bool) {
        let state = if dropped { DROPPED } else { CLOSED };
        // A dropped keyspace stays dropped when the tree closes.
        let _ = self
            .state
            .compare_exchange(OPEN, state, Ordering::SeqCst, Ordering::SeqCst);
        while self.active.load(Ordering::SeqCst) != 0 {
            sync::yield_now();
        }
    }

    /// The stored-key bounds of `range` in this keyspace, written into buffers from `buf`.
    pub(crate) fn bounds<K: AsRef<[u8]>>(
        &self,
        range: &impl RangeBounds<K>,
        buf: impl FnMut() -> Vec<u8>,
    ) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
        self.prefix.bounds(range, buf)
    }
}

impl Shared {
    /// Inserts `key` → `value` in `space`.
    pub(crate) fn put_in(&self, space: &Space, key: &[u8], value: &[u8]) -> Result<()> {
        self.limits().check(key, value)?;
        let stored = self.store_value(key, value)?;
        let written = self.write(&space.prefix.key(key), WriteOp::Put(stored.bytes()));
        // Even a failed write may have been applied (a log that refused its record).
        self.settle(&stored, true);
        written?;
        self.after_write();
        Ok(())
    }

    /// Removes `key` from `space`.
    pub(crate) fn delete_in(&self, space: &Space, key: &[u8]) -> Result<()> {
        self.limits().check(key, &[])?;
        self.write(&space.prefix.key(key), WriteOp::Delete)?;
        self.after_write();
        Ok(())
    }

    /// The value of `key` in `space`.
    pub(crate) fn get_in(&self, space: &Space, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut value = Vec::new();
        Ok(self.get_into_in(space, key, &mut value)?.then_some(value))
    }

    /// Whether `key` is present in `space`, its value copied into `out` (cleared first;
    /// left empty when absent or on an error).
    pub(crate) fn get_into_in(&self, space: &Space, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        out.clear();
        self.limits().check(key, &[])?;
        let key = space.prefix.key(key);
        let found = self.get_into(&key, out);
        // A promotion or a move to the tail may have taken room.
        self.nudge_evictors();
        self.resolve_found_into(&key, found?, out)
            .inspect_err(|_| out.clear())
    }

    /// Compare-and-swap of `key` in `space` (see [`Tree::compare_and_swap`](crate::Tree::compare_and_swap)).
    pub(crate) fn cas_in(
        &self,
        space: &Space,
        key: &[u8],
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool> {
        self.limits().check(key, new.unwrap_or_default())?;
        let stored = new.map(|v| self.store_value(key, v)).transpose()?;
        let swapped = self.compare_and_swap(
            &space.prefix.key(key),
            expected,
            stored.as_ref().map(crate::tree::blob::Stored::bytes),
        );
        if let Some(s) = &stored {
            // A comparison that failed wrote nothing; an error may have come after the write.
            self.settle(s, !matches!(swapped, Ok(false)));
        }
        let swapped = swapped?;
        self.after_write();
        Ok(swapped)
    }
}

/// A handle on one keyspace of a [`Tree`](crate::Tree): an independent key order with the
/// same key-value methods as the tree (whose own methods act on its default keyspace).
///
/// Keyspaces share the tree's cache, log and data file; a key costs nothing extra in a leaf
/// (see `docs/ARCHITECTURE.md`). A handle is cheap to clone and may be sent to other
/// threads. After the tree is closed, or the keyspace dropped, its methods return
/// [`Error::Closed`] or [`Error::KeyspaceDropped`]; a live handle never keeps the tree from
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
        &self.space.name
    }

    /// Inserts `key` → `value`, replacing any previous value. As [`Tree::insert`](crate::Tree::insert).
    ///
    /// # Errors
    /// As [`Tree::insert`](crate::Tree::insert), and [`Error::Closed`] or
    /// [`Error::KeyspaceDropped`] (nothing written).
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
    /// As [`Tree::bulk_load`](crate::Tree::bulk_load), and [`Error::Closed`] or
    /// [`Error::KeyspaceDropped`].
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
    /// As [`Tree::get`](crate::Tree::get), and [`Error::Closed`] or [`Error::KeyspaceDropped`].
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
    /// As [`Tree::get`](crate::Tree::get), and [`Error::Closed`] or [`Error::KeyspaceDropped`].
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
    /// result is [`Error::Closed`] or [`Error::KeyspaceDropped`] when the keyspace is gone.
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
    /// As [`Tree::merge`](crate::Tree::merge), and [`Error::Closed`] or
    /// [`Error::KeyspaceDropped`] (nothing written).
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
    /// [`Tree::range`](crate::Tree::range); the iterator yields [`Error::Closed`] or
    /// [`Error::KeyspaceDropped`] if that happens while it runs.
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
    pub fn range<K, R>(&self, range: R) -> Range<'_>
    where
        K: AsRef<[u8]>,
        R: RangeBounds<K>,
    {
        Range::new(&self.shared, &self.space, true, range)
    }

    /// Every record of the keyspace, in ascending key order.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let ks = tree.keyspace("ks")?;
    /// ks.insert(b"k", b"v")?;
    /// assert_eq!(ks.iter().count(), 1);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn iter(&self) -> Range<'_> {
        Range::new::<&[u8], _>(&self.shared, &self.space, true, ..)
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
            .field("name", &self.space.name)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shut_gate_turns_calls_back() {
        let s = Space::new(5, "five".into());
        let inside = s.enter().unwrap();
        drop(inside);
        s.shut(true);
        assert!(matches!(s.enter(), Err(Error::KeyspaceDropped { name }) if name == "five"));
        s.shut(false);
        assert!(matches!(s.enter(), Err(Error::KeyspaceDropped { .. })));
        let t = Space::new(0, String::new());
        t.shut(false);
        assert!(matches!(t.enter(), Err(Error::Closed)));
    }
}
