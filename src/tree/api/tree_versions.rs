//! [`Tree`]'s snapshots and transactions.

use super::snapshot::Snapshot;
use super::transaction::Transaction;
use super::tree::Tree;
use crate::error::{Error, Result};
use crate::tree::stats::Event;

/// How many times [`Tree::transact`] runs a transaction that conflicts before it gives up.
const RETRIES: u32 = 100;

impl Tree {
    /// A snapshot of the whole tree, every keyspace, as it is now: it sees exactly the
    /// writes acknowledged before this returns, and none made later (see [`Snapshot`]).
    /// Cheap: nothing is copied.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// tree.insert(b"k", b"old")?;
    /// let snap = tree.snapshot();
    /// tree.insert(b"k", b"new")?;
    /// assert_eq!(snap.get(&tree.default_keyspace(), b"k")?, Some(b"old".to_vec()));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn snapshot(&self) -> Snapshot {
        Snapshot::new(self.shared.clone())
    }

    /// A serializable transaction starting now (see [`Transaction`]).
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let ks = tree.default_keyspace();
    /// let mut tx = tree.transaction();
    /// if tx.get(&ks, b"lease")?.is_none() {
    ///     tx.insert(&ks, b"lease", b"worker-a");
    /// }
    /// tx.commit()?;
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn transaction(&self) -> Transaction {
        Transaction::new(self.shared.clone())
    }

    /// Runs `f` in a new transaction and commits it; on a conflict (or a snapshot made too
    /// old) runs it again in a fresh one, with a growing pause between tries, up to 100
    /// times. Returns what `f` returned for the run that committed. `f` may run more than
    /// once, so it should do nothing but read and write through the transaction.
    ///
    /// # Errors
    /// The last [`Error::Conflict`] after 100 retries; any other error of `f` or of the
    /// commit at once. Nothing is applied but by the run that committed.
    ///
    /// ```
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory())?;
    /// let accounts = tree.keyspace("accounts")?;
    /// accounts.insert(b"alice", 100u64.to_le_bytes())?;
    /// let read = |v: Option<Vec<u8>>| v.map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()));
    /// // Move 30 from alice to bob, refusing an overdraft.
    /// let moved = tree.transact(|tx| {
    ///     let alice = read(tx.get(&accounts, b"alice")?);
    ///     if alice < 30 {
    ///         return Ok(false);
    ///     }
    ///     let bob = read(tx.get(&accounts, b"bob")?);
    ///     tx.insert(&accounts, b"alice", (alice - 30).to_le_bytes());
    ///     tx.insert(&accounts, b"bob", (bob + 30).to_le_bytes());
    ///     Ok(true)
    /// })?;
    /// assert!(moved);
    /// assert_eq!(accounts.get(b"bob")?, Some(30u64.to_le_bytes().to_vec()));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    pub fn transact<T>(&self, mut f: impl FnMut(&mut Transaction) -> Result<T>) -> Result<T> {
        let mut tries = 0;
        loop {
            let mut tx = self.transaction();
            let outcome = f(&mut tx).and_then(|value| tx.commit().map(|()| value));
            match outcome {
                Err(Error::Conflict { .. } | Error::SnapshotTooOld { .. }) if tries < RETRIES => {
                    tries += 1;
                    self.shared.counters().count(Event::Retry);
                    pause(tries);
                }
                outcome => return outcome,
            }
        }
    }
}

/// Waits before try `n` of a transaction that conflicted: a yield for the first few, then
/// a sleep that doubles from 2 µs up to 1 ms, jittered, so that transactions that keep
/// colliding spread out.
fn pause(n: u32) {
    if n <= 3 {
        std::thread::yield_now();
        return;
    }
    let ceiling = 2u64 << (n - 4).min(9);
    let micros = 1 + ceiling * u64::from(crate::tree::cache::percent_roll()) / 100;
    std::thread::sleep(std::time::Duration::from_micros(micros.min(1000)));
}
