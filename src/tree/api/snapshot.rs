//! The public [`Snapshot`]: reads of every keyspace at one moment.

use std::ops::RangeBounds;

use super::keyspace::Keyspace;
use crate::error::{Error, Result};
use crate::tree::keyspace::{prefix_range, Space};
use crate::tree::read::Range;
use crate::tree::shared::Shared;
use crate::tree::versions::ScanStart;

/// One consistent moment of the whole tree, across every keyspace: a snapshot sees exactly
/// the writes acknowledged before [`Tree::snapshot`](crate::Tree::snapshot) returned
/// (batches and transactions whole) and none made after, for as long as it lives,
/// through evictions, write-backs and checkpoints. Every read names its keyspace, as a
/// [`Batch`](crate::Batch)'s writes do ([`Tree::default_keyspace`](crate::Tree::default_keyspace)
/// for the tree's own keys).
///
/// Taking one copies nothing. While any snapshot or transaction is open, each write saves
/// the value it replaces, so that the snapshot can still answer with it; those values are
/// dropped once no snapshot needs them, and bounded by
/// [`Config::max_snapshot_bytes`](crate::Config::max_snapshot_bytes): past it, the oldest
/// snapshot's next read answers [`Error::SnapshotTooOld`]. Drop snapshots you are done
/// with. `Snapshot` is `Send + Sync`.
///
/// ```
/// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
/// let accounts = tree.keyspace("accounts")?;
/// accounts.insert(b"alice", b"100")?;
/// let snap = tree.snapshot();
/// accounts.insert(b"alice", b"90")?;
/// accounts.insert(b"bob", b"10")?;
/// assert_eq!(snap.get(&accounts, b"alice")?, Some(b"100".to_vec()));
/// assert_eq!(snap.get(&accounts, b"bob")?, None);
/// assert_eq!(snap.iter(&accounts).count(), 1);
/// assert_eq!(accounts.get(b"alice")?, Some(b"90".to_vec()));
/// # Ok::<(), bfkv::Error>(())
/// ```
pub struct Snapshot {
    shared: std::sync::Arc<Shared>,
    at: ScanStart,
}

impl Snapshot {
    /// A snapshot of `shared` now.
    pub(crate) fn new(shared: std::sync::Arc<Shared>) -> Snapshot {
        let at = shared.versions().register();
        Snapshot { shared, at }
    }

    /// The value of `key` in `keyspace` at the snapshot's moment, as
    /// [`Tree::get`](crate::Tree::get) would have answered then.
    ///
    /// # Errors
    /// As [`Tree::get`](crate::Tree::get); [`Error::SnapshotTooOld`] once what the snapshot
    /// needs was dropped; [`Error::InvalidInput`] for a keyspace of another tree;
    /// [`Error::Closed`] or [`Error::KeyspaceDropped`].
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let snap = tree.snapshot();
    /// tree.insert(b"k", b"v")?;
    /// assert_eq!(snap.get(&tree.default_keyspace(), b"k")?, None);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn get(&self, keyspace: &Keyspace, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>> {
        let mut value = Vec::new();
        Ok(self.get_into(keyspace, key, &mut value)?.then_some(value))
    }

    /// As [`Snapshot::get`], into `value` (cleared first); returns whether the key was
    /// present.
    ///
    /// # Errors
    /// As [`Snapshot::get`].
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// tree.insert(b"k", b"v")?;
    /// let snap = tree.snapshot();
    /// let mut value = Vec::new();
    /// assert!(snap.get_into(&tree.default_keyspace(), b"k", &mut value)?);
    /// assert_eq!(value, b"v");
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn get_into(
        &self,
        keyspace: &Keyspace,
        key: impl AsRef<[u8]>,
        value: &mut Vec<u8>,
    ) -> Result<bool> {
        value.clear();
        let space = self.space_of(keyspace)?;
        let _in = space.enter()?;
        let key = key.as_ref();
        self.shared.limits().check(key, &[])?;
        self.shared.get_at(self.at, &space.prefix().key(key), value)
    }

    /// The values of `keys` in `keyspace` at the snapshot's moment, each as
    /// [`Snapshot::get`] answers it, in the order given.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// tree.insert(b"a", b"1")?;
    /// let snap = tree.snapshot();
    /// tree.insert(b"b", b"2")?;
    /// let got = snap.get_many(&tree.default_keyspace(), &[b"a", b"b"]);
    /// assert_eq!(got[0].as_ref().ok(), Some(&Some(b"1".to_vec())));
    /// assert_eq!(got[1].as_ref().ok(), Some(&None));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn get_many<K: AsRef<[u8]>>(
        &self,
        keyspace: &Keyspace,
        keys: &[K],
    ) -> Vec<Result<Option<Vec<u8>>>> {
        keys.iter().map(|k| self.get(keyspace, k)).collect()
    }

    /// The records of `keyspace` in `range` at the snapshot's moment, ascending (or
    /// descending, with [`rev`](Iterator::rev)), as [`Tree::range`](crate::Tree::range)
    /// would have yielded them then. An error to start with (a keyspace of another tree)
    /// is the iterator's first item.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// for k in [b"a", b"b", b"c"] {
    ///     tree.insert(k, b"")?;
    /// }
    /// let snap = tree.snapshot();
    /// tree.remove(b"b")?;
    /// let keys: Vec<Vec<u8>> = snap
    ///     .range(&tree.default_keyspace(), b"b".as_slice()..)
    ///     .map(|r| r.map(|(k, _)| k))
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(keys, [b"b".to_vec(), b"c".to_vec()]);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn range<K, R>(&self, keyspace: &Keyspace, range: R) -> Range<'_>
    where
        K: AsRef<[u8]>,
        R: RangeBounds<K>,
    {
        let space = keyspace.parts().1.clone();
        match self.space_of(keyspace) {
            Ok(_) => Range::at(&*self.shared, space, range, self.at),
            Err(e) => Range::failed(&*self.shared, space, e),
        }
    }

    /// Every record of `keyspace` at the snapshot's moment, in key order.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// tree.insert(b"k", b"v")?;
    /// let snap = tree.snapshot();
    /// tree.insert(b"later", b"v")?;
    /// assert_eq!(snap.iter(&tree.default_keyspace()).count(), 1);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn iter(&self, keyspace: &Keyspace) -> Range<'_> {
        self.range::<&[u8], _>(keyspace, ..)
    }

    /// The records of `keyspace` whose keys start with `prefix`, at the snapshot's moment.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// tree.insert(b"user/1", b"")?;
    /// let snap = tree.snapshot();
    /// tree.insert(b"user/2", b"")?;
    /// assert_eq!(snap.prefix(&tree.default_keyspace(), b"user/").count(), 1);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn prefix(&self, keyspace: &Keyspace, prefix: impl AsRef<[u8]>) -> Range<'_> {
        self.range(keyspace, prefix_range(prefix.as_ref()))
    }

    /// The record of `keyspace` with the smallest key at the snapshot's moment, if any.
    ///
    /// # Errors
    /// As the first item of [`Snapshot::iter`].
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let snap = tree.snapshot();
    /// tree.insert(b"a", b"1")?;
    /// assert_eq!(snap.first(&tree.default_keyspace())?, None);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn first(&self, keyspace: &Keyspace) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        self.iter(keyspace).next().transpose()
    }

    /// The record of `keyspace` with the largest key at the snapshot's moment, if any.
    ///
    /// # Errors
    /// As the last item of [`Snapshot::iter`].
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// tree.insert(b"a", b"1")?;
    /// let snap = tree.snapshot();
    /// tree.insert(b"b", b"2")?;
    /// assert_eq!(snap.last(&tree.default_keyspace())?, Some((b"a".to_vec(), b"1".to_vec())));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn last(&self, keyspace: &Keyspace) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        self.iter(keyspace).next_back().transpose()
    }

    /// The exact number of keys of `keyspace` at the snapshot's moment (a scan of the keys).
    ///
    /// # Errors
    /// The first error the scan meets.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// tree.insert(b"a", b"1")?;
    /// let snap = tree.snapshot();
    /// tree.insert(b"b", b"2")?;
    /// assert_eq!(snap.len(&tree.default_keyspace())?, 1);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn len(&self, keyspace: &Keyspace) -> Result<u64> {
        self.iter(keyspace).count_keys()
    }

    /// `keyspace`'s state, if it is one of this snapshot's tree.
    fn space_of<'k>(&self, keyspace: &'k Keyspace) -> Result<&'k Space> {
        let (shared, space) = keyspace.parts();
        if !std::sync::Arc::ptr_eq(shared, &self.shared) {
            return Err(Error::InvalidInput {
                reason: "a keyspace of another tree",
            });
        }
        Ok(space)
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        self.shared.versions().release(self.at);
    }
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("at", &self.at.seq())
            .finish_non_exhaustive()
    }
}
