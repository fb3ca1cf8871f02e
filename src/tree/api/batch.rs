//! The public [`Batch`]: writes to any keyspaces of one tree, applied all or nothing
//! (`commit.rs` applies them).

use super::keyspace::Keyspace;
use crate::error::{Error, Result};
use crate::sync::Arc;
use crate::tree::batch::{Change, Check, Write};
use crate::tree::keyspace::Space;
use crate::tree::Shared;

/// Writes to one or more keyspaces of a tree, applied together by [`Batch::commit`]: all or
/// nothing, for concurrent readers (no `get`, `range` or `compare_and_swap` sees part of a
/// batch) and after a crash (recovery finds a batch whole or not at all, in every
/// durability mode).
///
/// Adding a write never fails; an invalid one (a key or value over the limits, a keyspace
/// of another tree) makes `commit` return its error and apply nothing. Writes to the same
/// key apply in the order they were added: the last one wins. A batch owns its data and can
/// be built on one thread and committed on another. Its writes, encoded, may take up to
/// [`Limits::max_batch_len`](crate::Limits::max_batch_len) bytes (see
/// [`Batch::len_bytes`]): 4 MiB with the default configuration, so tens of thousands of
/// small writes.
///
/// ```
/// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
/// let users = tree.keyspace("users")?;
/// let by_email = tree.keyspace("users_by_email")?;
/// let mut batch = tree.batch();
/// batch.insert(&users, b"42", b"ada@example.com");
/// batch.insert(&by_email, b"ada@example.com", b"42");
/// batch.remove(&by_email, b"ada@old.example.com");
/// batch.commit()?;
/// assert_eq!(by_email.get(b"ada@example.com")?, Some(b"42".to_vec()));
/// # Ok::<(), bfkv::Error>(())
/// ```
pub struct Batch {
    shared: std::sync::Arc<Shared>,
    /// Stored keys (keyspace prefix in front) and values, in the order added.
    writes: Vec<Write>,
    /// The keyspaces written, each once: their gates are passed for the commit.
    spaces: Vec<Arc<Space>>,
    /// Bytes the writes take encoded (what [`Limits::max_batch_len`](crate::Limits) bounds).
    len_bytes: usize,
    /// The first invalid write's error.
    error: Option<Error>,
}

impl Batch {
    /// An empty batch for the tree `shared`.
    pub(crate) fn new(shared: std::sync::Arc<Shared>) -> Batch {
        Batch {
            shared,
            writes: Vec::new(),
            spaces: Vec::new(),
            len_bytes: 0,
            error: None,
        }
    }

    /// Adds an insert of `key` → `value` into `keyspace` (replacing any previous value).
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let mut batch = tree.batch();
    /// batch.insert(&tree.default_keyspace(), b"k", b"v");
    /// batch.commit()?;
    /// assert_eq!(tree.get(b"k")?, Some(b"v".to_vec()));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn insert(&mut self, keyspace: &Keyspace, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
        let value = value.as_ref();
        self.add(keyspace, key.as_ref(), value, || {
            Change::Put(value.to_vec())
        });
    }

    /// Adds a removal of `key` from `keyspace` (nothing happens to an absent key).
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// tree.insert(b"k", b"v")?;
    /// let mut batch = tree.batch();
    /// batch.remove(&tree.default_keyspace(), b"k");
    /// batch.commit()?;
    /// assert_eq!(tree.get(b"k")?, None);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn remove(&mut self, keyspace: &Keyspace, key: impl AsRef<[u8]>) {
        self.add(keyspace, key.as_ref(), &[], || Change::Delete);
    }

    /// Adds a merge of `operand` into the value of `key` in `keyspace`, as
    /// [`Tree::merge`](crate::Tree::merge) does it: blind, folded by the tree's merge operator.
    /// Within the batch it applies after the batch's earlier writes to the key. Without a
    /// merge operator the batch fails whole with `Err(InvalidConfig)` at
    /// [`commit`](Batch::commit).
    ///
    /// ```
    /// let add = |_: &[u8], old: Option<&[u8]>, operand: &[u8]| {
    ///     let n = |b: Option<&[u8]>| b.and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes);
    ///     Some((n(old) + n(Some(operand))).to_le_bytes().to_vec())
    /// };
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory().merge_operator(add))?;
    /// let (orders, totals) = (tree.keyspace("orders")?, tree.keyspace("totals")?);
    /// let mut batch = tree.batch();
    /// batch.insert(&orders, b"order-1", b"3 books");
    /// batch.merge(&totals, b"books", 3u64.to_le_bytes());
    /// batch.commit()?;
    /// assert_eq!(totals.get(b"books")?, Some(3u64.to_le_bytes().to_vec()));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn merge(&mut self, keyspace: &Keyspace, key: impl AsRef<[u8]>, operand: impl AsRef<[u8]>) {
        let stored = keyspace.parts().1.prefix().key(key.as_ref());
        if self.error.is_none() && self.shared.merge_operator_for(&stored).is_none() {
            self.error = Some(crate::tree::merge::no_operator());
        }
        let operand = operand.as_ref();
        self.add(keyspace, key.as_ref(), operand, || {
            Change::Merge(crate::tree::merge::one_operand(operand))
        });
    }

    /// The number of writes added.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let mut batch = tree.batch();
    /// assert!(batch.is_empty());
    /// batch.remove(&tree.default_keyspace(), b"k");
    /// assert_eq!(batch.len(), 1);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn len(&self) -> usize {
        self.writes.len()
    }

    /// Whether no write was added.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let mut batch = tree.batch();
    /// assert!(batch.is_empty());
    /// batch.insert(&tree.default_keyspace(), b"k", b"v");
    /// assert!(!batch.is_empty());
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// The bytes the writes take as the batch's log record, which
    /// [`Limits::max_batch_len`](crate::Limits::max_batch_len) bounds: each write's key and
    /// value, its keyspace's prefix (1 byte for the default keyspace and the first 239
    /// named ones, up to 5) and 3 to 11 bytes of kind and lengths. A value stored out of
    /// line (longer than a leaf record holds) counts as its 28-byte reference: the commit
    /// writes it to the blob file before it applies the batch. Writes the commit collapses
    /// (a key written twice) still count here.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let mut batch = tree.batch();
    /// batch.insert(&tree.default_keyspace(), [0u8; 16], [0u8; 16]);
    /// assert_eq!(batch.len_bytes(), 1 + 1 + 1 + 17 + 16);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    /// Applies every write, all or nothing, and waits for durability like a single write.
    ///
    /// # Errors
    /// The first invalid write's error ([`Error::KeyTooLarge`], [`Error::ValueTooLarge`],
    /// [`Error::InvalidInput`] for a keyspace of another tree, [`Error::InvalidConfig`] for a
    /// merge without a merge operator); [`Error::BatchTooLarge`]
    /// past the limit; [`Error::KeyspaceDropped`] or [`Error::Closed`]; [`Error::Io`] or
    /// [`Error::Corruption`] from a leaf the batch had to read, or [`Error::CacheFull`]
    /// for an in-memory tree without room: then nothing was applied. A failure of the log
    /// ([`Error::Io`]) leaves the tree refusing every call until it is reopened, which
    /// finds the batch whole or not at all.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let limit = tree.limits().max_key_len;
    /// let mut batch = tree.batch();
    /// batch.insert(&tree.default_keyspace(), b"fine", b"v");
    /// batch.insert(&tree.default_keyspace(), vec![0u8; limit + 1], b"v");
    /// assert!(matches!(batch.commit(), Err(bfkv::Error::KeyTooLarge { .. })));
    /// assert_eq!(tree.get(b"fine")?, None, "nothing applied");
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn commit(self) -> Result<()> {
        self.commit_checked(None)
    }

    /// As [`Batch::commit`], with `check` run just before the writes take their number (a
    /// transaction's validation, `Shared::commit_checked`).
    pub(crate) fn commit_checked(self, check: Option<&Check<'_>>) -> Result<()> {
        if let Some(e) = self.error {
            return Err(e);
        }
        // A drop or close waits until the batch is through, or the batch is refused.
        let _inside = self
            .spaces
            .iter()
            .map(|s| s.enter())
            .collect::<Result<Vec<_>>>()?;
        self.shared.commit_checked(self.writes, check)?;
        self.shared.after_write();
        Ok(())
    }

    /// The writes added so far (stored keys), in order.
    pub(crate) fn writes(&self) -> &[Write] {
        &self.writes
    }

    /// Adds one write, or notes why it is invalid.
    fn add(
        &mut self,
        keyspace: &Keyspace,
        key: &[u8],
        value: &[u8],
        change: impl FnOnce() -> Change,
    ) {
        if self.error.is_some() {
            return;
        }
        let (shared, space) = keyspace.parts();
        if !std::sync::Arc::ptr_eq(shared, &self.shared) {
            self.error = Some(Error::InvalidInput {
                reason: "a batch names a keyspace of another tree",
            });
            return;
        }
        let change = change();
        // Merge operands are never stored out of line.
        let checked = match change {
            Change::Merge(_) => self.shared.limits().check_inline(key, value),
            _ => self.shared.limits().check(key, value),
        };
        if let Err(e) = checked {
            self.error = Some(e);
            return;
        }
        if !self.spaces.iter().any(|s| Arc::ptr_eq(s, space)) {
            self.spaces.push(space.clone());
        }
        let key = space.prefix().key(key).to_vec();
        let logged = self.shared.stored_len(&key, &change);
        self.len_bytes += crate::wal::batch_write_len(key.len(), logged) as usize;
        self.writes.push((key, change));
    }
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("writes", &self.writes.len())
            .field("len_bytes", &self.len_bytes)
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}
