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
use crate::tree::shared::Shared;
use crate::tree::WriteOp;

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

    /// Its name (empty for the default keyspace).
    pub(crate) fn name(&self) -> &str {
        &self.name
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
