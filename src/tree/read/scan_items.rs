//! The parts of a range iterator outside its refills: what it reads from (`Held`), a
//! stored record as it is lent to the caller (`lend`, with the cold path for values that
//! may not be the user's own), and its bounds' buffers, kept for reuse.

use std::ops::Bound;

use crate::error::Result;
use crate::tree::blob::MARKED;
use crate::tree::{KeyValue, Shared};

use super::scan::Values;

/// What a range reads from: borrowed from the `Tree` (or snapshot) that made it, or a
/// clone of a `Keyspace` handle's, so that the iterator borrows the tree, never the handle.
pub(crate) enum Held<'t, T> {
    Borrowed(&'t T),
    Owned(std::sync::Arc<T>),
}

impl<T> Held<'_, T> {
    /// What a refill passes the gate of: the keyspace of a handle's iterator, which may
    /// outlive the tree (one made by the tree, a snapshot or the tree core borrows them).
    pub(super) fn gate(&self) -> Option<&T> {
        match self {
            Held::Borrowed(_) => None,
            Held::Owned(t) => Some(t),
        }
    }
}

impl<T> std::ops::Deref for Held<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        match self {
            Held::Borrowed(t) => t,
            Held::Owned(t) => t,
        }
    }
}

impl<'t, T> From<&'t T> for Held<'t, T> {
    fn from(t: &'t T) -> Self {
        Held::Borrowed(t)
    }
}

impl<T> From<std::sync::Arc<T>> for Held<'_, T> {
    fn from(t: std::sync::Arc<T>) -> Self {
        Held::Owned(t)
    }
}

/// Owned copies of a borrowed record.
pub(super) fn owned(record: Result<(&[u8], &[u8])>) -> Result<KeyValue> {
    record.map(|(k, v)| (k.to_vec(), v.to_vec()))
}

/// A stored record as the caller sees it: the key without the keyspace prefix, the value
/// as stored or, for a value stored out of line, read into `blob_value` (the buffer's pin
/// keeps its extent).
///
/// Inlined into the iterator's methods, so that a record lent as stored is returned in
/// registers, not written out as a `Result` and read back (a store-forwarding stall that
/// took about a tenth of YCSB-E's time in memory).
#[inline]
pub(super) fn lend<'a>(
    tree: &Shared,
    prefix_len: usize,
    values: Values,
    key: &'a [u8],
    value: &'a [u8],
    blob_value: &'a mut Vec<u8>,
) -> Result<(&'a [u8], &'a [u8])> {
    let key = &key[prefix_len..];
    if values == Values::Read && value.first() == Some(&MARKED) {
        return read_marked(tree, key, value, blob_value);
    }
    Ok((key, value))
}

/// A stored value that may not be the user's own (it starts with [`MARKED`]), with its
/// key: the value a reference names, read into `blob_value`; the error a failed fold
/// stands for; else the value as it is. Out of line and marked cold so that `lend` stays
/// small: only values stored out of line come here (and user values that start with that
/// byte), and reading one from the blob file costs far more than the call.
#[cold]
#[inline(never)]
fn read_marked<'a>(
    tree: &Shared,
    key: &'a [u8],
    value: &'a [u8],
    blob_value: &'a mut Vec<u8>,
) -> Result<(&'a [u8], &'a [u8])> {
    if let Some(failed) = tree.failed_fold(value) {
        return Err(failed);
    }
    let Some(r) = tree.storage().blobs().decode(value) else {
        return Ok((key, value));
    };
    *blob_value = tree.read_blob(&r)?;
    Ok((key, blob_value.as_slice()))
}

/// Keeps the buffer of a bound no longer needed in `spare`.
pub(super) fn recycle(bound: Bound<Vec<u8>>, spare: &mut Vec<u8>) {
    if let Bound::Included(v) | Bound::Excluded(v) = bound {
        *spare = v;
    }
}

/// Keeps `key` as the last one yielded from one end, in the buffer kept from the last time
/// (else one from `keys`).
pub(super) fn remember(last: &mut Option<Vec<u8>>, key: &[u8], keys: &mut Vec<Vec<u8>>) {
    let buf = last.get_or_insert_with(|| keys.pop().unwrap_or_default());
    buf.clear();
    buf.extend_from_slice(key);
}

/// `bound`, copied into a buffer from `buf`.
pub(super) fn copy_bound(
    bound: &Bound<Vec<u8>>,
    buf: &mut impl FnMut() -> Vec<u8>,
) -> Bound<Vec<u8>> {
    let mut copy = |k: &[u8]| {
        let mut v = buf();
        v.clear();
        v.extend_from_slice(k);
        v
    };
    match bound {
        Bound::Included(k) => Bound::Included(copy(k)),
        Bound::Excluded(k) => Bound::Excluded(copy(k)),
        Bound::Unbounded => Bound::Unbounded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recycled_bounds_keep_their_buffer() {
        let mut spare = Vec::new();
        recycle(Bound::Included(Vec::with_capacity(32)), &mut spare);
        assert!(spare.capacity() >= 32);
        recycle(Bound::Unbounded, &mut spare);
        assert!(
            spare.capacity() >= 32,
            "an unbounded end leaves the spare alone"
        );
    }
}
