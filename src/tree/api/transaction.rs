//! The public [`Transaction`]: reads at its start and its own writes, committed all or
//! nothing if nothing it read changed meanwhile.

use std::collections::BTreeMap;
use std::ops::RangeBounds;

use super::batch::Batch;
use super::keyspace::Keyspace;
use super::transaction_range::TransactionRange;
use crate::error::{Error, Result};
use crate::sync::Arc;
use crate::tree::batch::Change;
use crate::tree::keyspace::{is_empty_range, prefix_range, user_key, Space};
use crate::tree::read::Range;
use crate::tree::shared::Shared;
use crate::tree::stats::Event;
use crate::tree::versions::{ReadSet, ScanStart, Written};

/// A serializable transaction over any keyspaces of one tree.
///
/// Its reads see the tree as it was when the transaction started (a snapshot) plus its own
/// writes, merges folded over the value read. Its writes are buffered, like a
/// [`Batch`]'s, and [`commit`](Transaction::commit) applies them all or nothing (one log
/// record, crash-atomic in every durability mode), but only if no key it read, and no key
/// in a range it scanned, was written by anyone else after it started; otherwise the commit
/// fails with [`Error::Conflict`] and applies nothing. Committed transactions are therefore
/// serializable: write skew and phantoms included. A merge is a blind write: two
/// transactions that only merge into a key never conflict. Dropping a transaction without
/// committing applies nothing. [`Tree::transact`](crate::Tree::transact) runs one again
/// after a conflict. `Transaction` is `Send`.
///
/// ```
/// use bfkv::{Error, Tree};
/// let tree = Tree::open(bfkv::Config::in_memory())?;
/// let accounts = tree.keyspace("accounts")?;
/// accounts.insert(b"alice", 100u64.to_le_bytes())?;
/// let balance = |v: Option<Vec<u8>>| v.map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()));
///
/// let mut tx = tree.transaction();
/// let alice = balance(tx.get(&accounts, b"alice")?);
/// let bob = balance(tx.get(&accounts, b"bob")?);
/// tx.insert(&accounts, b"alice", (alice - 30).to_le_bytes());
/// tx.insert(&accounts, b"bob", (bob + 30).to_le_bytes());
/// // Someone else changes a balance this transaction read: its commit is refused.
/// accounts.insert(b"alice", 500u64.to_le_bytes())?;
/// assert!(matches!(tx.commit(), Err(Error::Conflict { .. })));
/// assert_eq!(accounts.get(b"bob")?, None);
/// # Ok::<(), bfkv::Error>(())
/// ```
pub struct Transaction {
    shared: std::sync::Arc<Shared>,
    at: ScanStart,
    /// Its writes, in order, checked as they are added.
    batch: Batch,
    /// For each stored key written, the indices of its writes in `batch`.
    written: BTreeMap<Vec<u8>, Vec<usize>>,
    reads: ReadSet,
    /// The keyspaces named, to say which one a conflict is in.
    spaces: Vec<Arc<Space>>,
}

impl Transaction {
    /// A transaction on `shared`, starting now.
    pub(crate) fn new(shared: std::sync::Arc<Shared>) -> Transaction {
        let at = shared.versions().register();
        Transaction {
            batch: Batch::new(shared.clone()),
            shared,
            at,
            written: BTreeMap::new(),
            reads: ReadSet::default(),
            spaces: Vec::new(),
        }
    }

    /// The value of `key` in `keyspace` as this transaction sees it: its own writes over
    /// the tree at its start. Unless the transaction wrote the key itself (an insert or a
    /// remove), the read is tracked: a write by anyone else to the key before the commit
    /// makes the commit a conflict.
    ///
    /// # Errors
    /// As [`Snapshot::get`](crate::Snapshot::get); the merge operator's errors for a key the
    /// transaction merged into.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let ks = tree.default_keyspace();
    /// let mut tx = tree.transaction();
    /// tx.insert(&ks, b"k", b"mine");
    /// assert_eq!(tx.get(&ks, b"k")?, Some(b"mine".to_vec())); // its own write
    /// assert_eq!(tree.get(b"k")?, None); // nobody else's yet
    /// tx.commit()?;
    /// assert_eq!(tree.get(b"k")?, Some(b"mine".to_vec()));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn get(&mut self, keyspace: &Keyspace, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>> {
        let space = self.space_of(keyspace)?;
        let _in = space.enter()?;
        let key = key.as_ref();
        self.shared.limits().check(key, &[])?;
        let stored = space.prefix().key(key).to_vec();
        self.value_of(&stored)
    }

    /// The records of `keyspace` in `range` as this transaction sees them (its own writes
    /// over the tree at its start), ascending or, with [`rev`](Iterator::rev), descending.
    /// The whole range is tracked, not only the keys it yields: a write by anyone else
    /// anywhere in it before the commit (an insert of a new key too) makes the commit a
    /// conflict.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let orders = tree.keyspace("orders")?;
    /// orders.insert(b"o/1", b"")?;
    /// let mut tx = tree.transaction();
    /// tx.insert(&orders, b"o/2", b"");
    /// assert_eq!(tx.range(&orders, b"o/".as_slice()..b"o0".as_slice()).count(), 2);
    /// orders.insert(b"o/3", b"")?; // a phantom for the range read above
    /// assert!(matches!(tx.commit(), Err(bfkv::Error::Conflict { .. })));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn range<K, R>(&mut self, keyspace: &Keyspace, range: R) -> TransactionRange<'_>
    where
        K: AsRef<[u8]>,
        R: RangeBounds<K>,
    {
        let space = match self.space_of(keyspace) {
            Ok(space) => space,
            Err(e) => {
                return TransactionRange::new(
                    Range::failed(&*self.shared, keyspace.parts().1.clone(), e),
                    Vec::new(),
                )
            }
        };
        let (lower, upper) = space.bounds(&range, Vec::new);
        self.reads.range(lower.clone(), upper.clone());
        // This transaction's own writes in the range, as it sees them.
        let empty = is_empty_range(
            lower.as_ref().map(Vec::as_slice),
            upper.as_ref().map(Vec::as_slice),
        );
        let keys: Vec<Vec<u8>> = if empty {
            Vec::new()
        } else {
            self.written
                .range::<Vec<u8>, _>((lower, upper))
                .map(|(k, _)| k.clone())
                .collect()
        };
        let mut own = Vec::with_capacity(keys.len());
        for key in keys {
            let value = self.own_value(&key, |tx, k| tx.snapshot_value(k));
            own.push((user_key(&key).to_vec(), value));
        }
        let space = keyspace.parts().1.clone();
        let this: &Transaction = self;
        TransactionRange::new(Range::at(&*this.shared, space, range, this.at), own)
    }

    /// Every record of `keyspace` as this transaction sees it, in key order (tracked as
    /// [`Transaction::range`] tracks the whole keyspace).
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let ks = tree.default_keyspace();
    /// tree.insert(b"a", b"1")?;
    /// let mut tx = tree.transaction();
    /// tx.remove(&ks, b"a");
    /// assert_eq!(tx.iter(&ks).count(), 0);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn iter(&mut self, keyspace: &Keyspace) -> TransactionRange<'_> {
        self.range::<&[u8], _>(keyspace, ..)
    }

    /// The records of `keyspace` whose keys start with `prefix`, as this transaction sees
    /// them, tracked as [`Transaction::range`] tracks a range.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let ks = tree.default_keyspace();
    /// tree.insert(b"o/1", b"")?;
    /// let mut tx = tree.transaction();
    /// tx.insert(&ks, b"o/2", b"");
    /// assert_eq!(tx.prefix(&ks, b"o/").count(), 2);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn prefix(
        &mut self,
        keyspace: &Keyspace,
        prefix: impl AsRef<[u8]>,
    ) -> TransactionRange<'_> {
        self.range(keyspace, prefix_range(prefix.as_ref()))
    }

    /// Adds an insert of `key` → `value` into `keyspace`, applied at commit (an invalid
    /// one, a key or value over the limits, fails the commit).
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let mut tx = tree.transaction();
    /// tx.insert(&tree.default_keyspace(), b"k", b"v");
    /// tx.commit()?;
    /// assert_eq!(tree.get(b"k")?, Some(b"v".to_vec()));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn insert(&mut self, keyspace: &Keyspace, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
        let before = self.batch.len();
        self.batch.insert(keyspace, key, value);
        self.note(keyspace, before);
    }

    /// Adds a removal of `key` from `keyspace`, applied at commit.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// tree.insert(b"k", b"v")?;
    /// let mut tx = tree.transaction();
    /// tx.remove(&tree.default_keyspace(), b"k");
    /// tx.commit()?;
    /// assert_eq!(tree.get(b"k")?, None);
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn remove(&mut self, keyspace: &Keyspace, key: impl AsRef<[u8]>) {
        let before = self.batch.len();
        self.batch.remove(keyspace, key);
        self.note(keyspace, before);
    }

    /// Adds a merge of `operand` into `key` of `keyspace`: a blind write, applied at commit
    /// as [`Tree::merge`](crate::Tree::merge) applies one. It reads nothing, so it never
    /// makes the commit a conflict; a later [`get`](Transaction::get) of the key in this
    /// transaction folds it over the value it reads.
    ///
    /// ```
    /// let add = |_: &[u8], old: Option<&[u8]>, operand: &[u8]| {
    ///     let n = |b: Option<&[u8]>| b.and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes);
    ///     Some((n(old) + n(Some(operand))).to_le_bytes().to_vec())
    /// };
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory().merge_operator(add))?;
    /// let counters = tree.keyspace("counters")?;
    /// let (mut a, mut b) = (tree.transaction(), tree.transaction());
    /// a.merge(&counters, b"views", 1u64.to_le_bytes());
    /// b.merge(&counters, b"views", 1u64.to_le_bytes());
    /// a.commit()?;
    /// b.commit()?; // blind writes to one key: no conflict
    /// assert_eq!(counters.get(b"views")?, Some(2u64.to_le_bytes().to_vec()));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn merge(&mut self, keyspace: &Keyspace, key: impl AsRef<[u8]>, operand: impl AsRef<[u8]>) {
        let before = self.batch.len();
        self.batch.merge(keyspace, key, operand);
        self.note(keyspace, before);
    }

    /// Applies the transaction's writes, all or nothing, if no key it read and no key in a
    /// range it scanned was written by anyone else since it started; waits for durability
    /// like a single write. A transaction that wrote nothing commits at once.
    ///
    /// # Errors
    /// [`Error::Conflict`] (naming the keyspace and key) when something it read changed, or
    /// its snapshot became too old; otherwise as [`Batch::commit`]. Nothing is applied on
    /// any error.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let ks = tree.default_keyspace();
    /// let mut tx = tree.transaction();
    /// assert_eq!(tx.get(&ks, b"seat-12")?, None);
    /// tx.insert(&ks, b"seat-12", b"ada");
    /// tx.commit()?;
    /// assert_eq!(tree.get(b"seat-12")?, Some(b"ada".to_vec()));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn commit(mut self) -> Result<()> {
        let batch = std::mem::replace(&mut self.batch, Batch::new(self.shared.clone()));
        if batch.is_empty() {
            // Its reads saw one moment: a transaction that wrote nothing is serializable
            // there (an invalid write it tried is still its error).
            return batch.commit();
        }
        let start = self.at.seq();
        let (reads, spaces) = (&self.reads, &self.spaces);
        let check = |w: &Written<'_>| -> Result<()> {
            if w.too_old(start) {
                return Err(Error::Conflict {
                    keyspace: String::new(),
                    key: Vec::new(),
                });
            }
            match reads.conflict(w, start) {
                None => Ok(()),
                Some(key) => Err(conflict(spaces, &key)),
            }
        };
        let committed = batch.commit_checked(Some(&check));
        let counters = self.shared.counters();
        match &committed {
            Ok(()) => counters.count(Event::Transaction),
            Err(Error::Conflict { .. }) => counters.count(Event::Conflict),
            Err(_) => {}
        }
        committed
    }

    /// The value of stored key `key` as this transaction sees it (its own writes over its
    /// snapshot), tracking the read of the snapshot where one is made.
    fn value_of(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if !self.written.contains_key(key) {
            self.reads.key(key);
            return self.snapshot_value(key);
        }
        self.own_value(key, |tx, k| {
            tx.reads.key(k);
            tx.snapshot_value(k)
        })
    }

    /// The value this transaction's own writes give stored key `key` (one of them), over
    /// the value `base` reads when a merge needs it.
    fn own_value(
        &mut self,
        key: &[u8],
        base: impl FnOnce(&mut Self, &[u8]) -> Result<Option<Vec<u8>>>,
    ) -> Result<Option<Vec<u8>>> {
        let indices = self.written.get(key).cloned().unwrap_or_default();
        let writes = self.batch.writes();
        let changes: Vec<&Change> = indices.iter().map(|&i| &writes[i].1).collect();
        let decided = changes.iter().rposition(|c| !matches!(c, Change::Merge(_)));
        let merges: Vec<Vec<u8>> = changes[decided.map_or(0, |i| i + 1)..]
            .iter()
            .filter_map(|c| match c {
                Change::Merge(ops) => Some(ops.clone()),
                _ => None,
            })
            .collect();
        let mut value = match decided.map(|i| changes[i]) {
            Some(Change::Put(v)) => Some(v.clone()),
            Some(_) => None,
            None => base(self, key)?,
        };
        for ops in &merges {
            value = self.shared.fold_value(key, value.as_deref(), ops)?;
        }
        Ok(value)
    }

    /// The value of stored key `key` at this transaction's start.
    fn snapshot_value(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut value = Vec::new();
        Ok(self
            .shared
            .get_at(self.at, key, &mut value)?
            .then_some(value))
    }

    /// Indexes the write `batch` just added (if it was valid), and remembers its keyspace.
    fn note(&mut self, keyspace: &Keyspace, before: usize) {
        if self.batch.len() == before {
            return;
        }
        let (key, _) = &self.batch.writes()[before];
        self.written.entry(key.clone()).or_default().push(before);
        let space = keyspace.parts().1;
        if !self.spaces.iter().any(|s| Arc::ptr_eq(s, space)) {
            self.spaces.push(space.clone());
        }
    }

    /// `keyspace`'s state, if it is one of this transaction's tree.
    fn space_of<'k>(&mut self, keyspace: &'k Keyspace) -> Result<&'k Space> {
        let (shared, space) = keyspace.parts();
        if !std::sync::Arc::ptr_eq(shared, &self.shared) {
            return Err(Error::InvalidInput {
                reason: "a keyspace of another tree",
            });
        }
        if !self.spaces.iter().any(|s| Arc::ptr_eq(s, space)) {
            self.spaces.push(space.clone());
        }
        Ok(space)
    }
}

/// The conflict on stored key `key`, naming its keyspace among `spaces`.
fn conflict(spaces: &[Arc<Space>], key: &[u8]) -> Error {
    let user = user_key(key);
    let prefix = &key[..key.len() - user.len()];
    let keyspace = spaces
        .iter()
        .find(|s| s.prefix().as_slice() == prefix)
        .map_or_else(String::new, |s| s.name().to_string());
    Error::Conflict {
        keyspace,
        key: user.to_vec(),
    }
}

impl Drop for Transaction {
    fn drop(&mut self) {
        self.shared.versions().release(self.at);
    }
}

impl std::fmt::Debug for Transaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transaction")
            .field("at", &self.at.seq())
            .field("writes", &self.batch.len())
            .finish_non_exhaustive()
    }
}
