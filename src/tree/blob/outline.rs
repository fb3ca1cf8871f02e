//! The tree's side of values stored out of line (`extents.rs`): turning a user's value into
//! what a leaf stores (itself, or a reference to an extent written first), and a stored
//! value back into the user's.
//!
//! The extent is written (and, when writes are logged, synced) before the write that
//! references it is applied and logged, so a reference that reaches the log or a leaf
//! always names a whole extent: the log carries 28 bytes, never the value. A crash between
//! the two leaves an extent nothing references, which recovery does not count as in use.

use super::extents::{BlobPin, BlobRef, REF_LEN};
use crate::error::{Error, Result};
use crate::tree::Shared;

/// A value as a leaf stores it.
pub(crate) enum Stored<'v> {
    /// The user's value itself.
    Inline(&'v [u8]),
    /// A reference to the extent the value was written to.
    Outline(BlobRef, [u8; REF_LEN]),
}

impl Stored<'_> {
    /// The bytes the leaf and the log hold.
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Stored::Inline(v) => v,
            Stored::Outline(_, bytes) => bytes,
        }
    }

    /// The extent written for it, if any.
    pub(crate) fn extent(&self) -> Option<u64> {
        match self {
            Stored::Inline(_) => None,
            Stored::Outline(r, _) => Some(r.start),
        }
    }
}

impl Shared {
    /// What a leaf stores for `value` under user key `key` (checked against the limits by
    /// the caller): the value, or a reference to an extent written now. The caller reports
    /// the extent with [`Shared::settle`] once its write was applied or refused.
    ///
    /// # Errors
    /// `Io` writing the extent (nothing stays allocated).
    pub(crate) fn store_value<'v>(&self, key: &[u8], value: &'v [u8]) -> Result<Stored<'v>> {
        let blobs = self.storage().blobs();
        if !blobs.must_store(value, self.limits().inline_value_len(key)) {
            return Ok(Stored::Inline(value));
        }
        // Logged writes may reach stable storage in the log before the next checkpoint:
        // their extent must be there first.
        let r = blobs.store(value, self.journal().logs_writes())?;
        self.counters().blob_written(value.len() as u64);
        Ok(Stored::Outline(r, r.encode()))
    }

    /// The write of `stored` is over: `applied` if its reference may be in a leaf (the
    /// next checkpoint frees the extent if it is not), else the extent is freed now.
    pub(crate) fn settle(&self, stored: &Stored<'_>, applied: bool) {
        if let Some(start) = stored.extent() {
            if applied {
                self.storage().blobs().applied(start);
            } else {
                self.storage().blobs().discard(start);
            }
        }
    }

    /// The user's value of a stored value read under its leaf's lock (or under a pin): the
    /// value itself, or the extent it references, read and verified.
    ///
    /// # Errors
    /// `Io` or `Corruption` reading the extent; the error a failed fold stands for
    /// (`merge.rs`).
    pub(crate) fn user_value(&self, stored: Vec<u8>) -> Result<Vec<u8>> {
        if let Some(failed) = self.failed_fold(&stored) {
            return Err(failed);
        }
        match self.storage().blobs().decode(&stored) {
            None => Ok(stored),
            Some(r) => self.read_blob(&r),
        }
    }

    /// A pin for saved old values (`versions/`) if any of `undo`'s is stored out of line:
    /// read under the leaves' locks, their references are current, and the pin keeps
    /// their extents from reuse for as long as the values are kept.
    pub(crate) fn pin_for(&self, undo: &crate::tree::versions::Undo) -> Option<BlobPin> {
        let blobs = self.storage().blobs();
        let outline = undo
            .iter()
            .any(|(_, old)| old.as_deref().is_some_and(|v| blobs.decode(v).is_some()));
        outline.then(|| blobs.pin())
    }

    /// A pin for a scan about to copy a leaf, if the tree has values stored out of line.
    pub(crate) fn blob_pin(&self) -> Option<BlobPin> {
        let blobs = self.storage().blobs();
        blobs.any().then(|| blobs.pin())
    }

    /// Reads the extent `r` names, counted.
    pub(crate) fn read_blob(&self, r: &BlobRef) -> Result<Vec<u8>> {
        let value = self.storage().blobs().read(r)?;
        self.counters().blob_read(r.len);
        Ok(value)
    }

    /// The user's value of stored key `key`, `found` being its stored value as a lookup
    /// returned it after releasing the leaf's lock. An extent can be freed and reused once
    /// no leaf references it, so a reference read earlier is checked again when its extent
    /// fails verification: the error stands only if the key still holds that reference.
    ///
    /// # Errors
    /// As [`Shared::user_value`], and those of looking the key up again.
    pub(crate) fn resolve_found(
        &self,
        key: &[u8],
        found: Option<Vec<u8>>,
    ) -> Result<Option<Vec<u8>>> {
        let present = found.is_some();
        let mut value = found.unwrap_or_default();
        Ok(self
            .resolve_found_into(key, present, &mut value)?
            .then_some(value))
    }

    /// As [`Shared::resolve_found`], for a stored value in `out` (`found` tells whether the
    /// key was present): on success `out` holds the user's value.
    ///
    /// # Errors
    /// As [`Shared::resolve_found`].
    pub(crate) fn resolve_found_into(
        &self,
        key: &[u8],
        mut found: bool,
        out: &mut Vec<u8>,
    ) -> Result<bool> {
        loop {
            if !found {
                return Ok(false);
            }
            if let Some(failed) = self.failed_fold(out) {
                return Err(failed);
            }
            let Some(r) = self.storage().blobs().decode(out) else {
                return Ok(true);
            };
            match self.read_blob(&r) {
                Ok(value) => {
                    *out = value;
                    return Ok(true);
                }
                Err(e @ Error::Corruption { .. }) => {
                    let stored = out.clone();
                    found = self.get_into(key, out)?;
                    if found && *out == stored {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
}
