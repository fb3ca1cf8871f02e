//! Reads at a registered moment (a snapshot's, a transaction's start), and what a
//! transaction read, for its commit to check.
//!
//! A read at moment `at` takes the value a write since `at` saved, if one did; else the
//! tree's value, read now, and then asks again: a write may have replaced it meanwhile, in
//! which case the value it saved is the one `at` had (`store.rs` says why every write after
//! `at` saves what it replaced before anyone reads its leaf).

use std::collections::BTreeSet;
use std::ops::Bound;

use super::saved::Old;
use super::store::{ScanStart, Written};
use crate::error::Result;
use crate::tree::Shared;

impl Shared {
    /// The user's value of stored key `key` at moment `at`, into `out`; whether the key was
    /// present.
    ///
    /// # Errors
    /// `SnapshotTooOld` once what `at` needs was dropped; those of a lookup; those of the
    /// saved value (a damaged extent, a failed fold).
    pub(crate) fn get_at(&self, at: ScanStart, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        out.clear();
        if let Some(old) = self.versions().before(at, key)? {
            return self.old_into(old, out);
        }
        let found = self.get_into(key, out);
        // A promotion or a move to the tail may have taken room.
        self.nudge_evictors();
        let found = found?;
        if let Some(old) = self.versions().before(at, key)? {
            return self.old_into(old, out);
        }
        self.resolve_found_into(key, found, out)
    }

    /// The user's value of a saved old value, into `out`: whether the key was present. The
    /// extent of a value stored out of line is pinned for as long as it is saved.
    fn old_into(&self, old: Old, out: &mut Vec<u8>) -> Result<bool> {
        out.clear();
        let Some(stored) = old else {
            return Ok(false);
        };
        *out = self.user_value(stored.to_vec())?;
        Ok(true)
    }
}

/// The stored keys and key ranges a transaction read: any of them written by someone else
/// after its start makes its commit a conflict (serializable reads, phantoms included: a
/// range counts whole, not only the keys it returned).
#[derive(Default, Debug)]
pub(crate) struct ReadSet {
    keys: BTreeSet<Vec<u8>>,
    ranges: Vec<KeyRange>,
}

/// A range of stored keys: its lower and upper bound.
type KeyRange = (Bound<Vec<u8>>, Bound<Vec<u8>>);

impl ReadSet {
    /// Notes a read of stored key `key`.
    pub(crate) fn key(&mut self, key: &[u8]) {
        if !self.keys.contains(key) {
            self.keys.insert(key.to_vec());
        }
    }

    /// Notes a scan of the stored keys between `lower` and `upper`.
    pub(crate) fn range(&mut self, lower: Bound<Vec<u8>>, upper: Bound<Vec<u8>>) {
        self.ranges.push((lower, upper));
    }

    /// The first stored key read that a write numbered after `start` touched, if any.
    pub(crate) fn conflict(&self, written: &Written<'_>, start: u64) -> Option<Vec<u8>> {
        if let Some(k) = self.keys.iter().find(|k| written.key_since(k, start)) {
            return Some(k.clone());
        }
        self.ranges.iter().find_map(|(lower, upper)| {
            written
                .in_range_since(as_slice(lower), as_slice(upper), start)
                .map(<[u8]>::to_vec)
        })
    }
}

fn as_slice(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k.as_slice()),
        Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}
