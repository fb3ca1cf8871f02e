//! Merge operators (Bε-tree upserts): a merge buffers its operand in the leaf's mini-page as
//! an `Upsert` record, without reading the key's value, and the operands are folded over
//! that value later: by a read of the key, by a write that meets a known value, and by the
//! write-back that merges the mini-page into its leaf page.
//!
//! An `Upsert` record's value is the key's pending operands, oldest first, each as a LEB128
//! length and its bytes. A merge that finds the key's value decided in the leaf's node (an
//! insert, a cached value, a tombstone, or any key of a full-page mirror) folds at once and
//! writes the result; one that finds an `Upsert` record appends to its list; one that finds
//! nothing there buffers a new list. Only when the list would outgrow a value does a merge
//! read the leaf's page to fold it. Leaf pages on disk never hold an `Upsert` record.
//!
//! **Failed folds.** The operator is the user's code: it may panic, or return a value too
//! long for a record. A fold that fails for a read, or for a write that needs the key's
//! value, fails that call (`Error::MergeFailed`, `Error::ValueTooLarge`). But a leaf is also
//! rebuilt for the sake of other keys: written back by an eviction or a checkpoint, made a
//! full-page mirror or split by another key's write. There the key's operands are replaced
//! by a *failed fold*, a stored value that records the failure ([`FAILED_FOLD`], then the
//! cause), so the leaf can be written and every other key goes on. The key then answers
//! every read with the error the fold gave, keeps it through write-backs, checkpoints and
//! reopening, refuses merges (there is no value to fold them over), and is cleared by an
//! `insert` or a `remove`. A panic never crosses a fold: it would unwind through the
//! thread that called it, an evictor holding a claim on the buffer's head or an
//! unrelated writer, and leave the tree stuck. Recovery folds like a write does, so an
//! operator that panics while the log is replayed fails the open with its error.

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::error::{Error, Result};
use crate::tree::blob::FAILED_FOLD;
use crate::tree::cache::with_page_buf;
use crate::tree::index::Path;
use crate::tree::keyspace::user_key;
use crate::tree::keyspace::Space;
use crate::tree::{Shared, WriteOp, FLAG_DAMAGED, NO_PAGE};

/// Appends `operand` to the encoded operand list `list`.
pub(crate) fn push_operand(list: &mut Vec<u8>, operand: &[u8]) {
    let mut n = operand.len();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            list.push(byte);
            break;
        }
        list.push(byte | 0x80);
    }
    list.extend_from_slice(operand);
}

/// An operand list holding just `operand`.
pub(crate) fn one_operand(operand: &[u8]) -> Vec<u8> {
    let mut list = Vec::with_capacity(operand.len() + 3);
    push_operand(&mut list, operand);
    list
}

/// The operands of an encoded list, oldest first; `Err` at the first one that does not
/// decode (a damaged list).
pub(crate) fn operands(list: &[u8]) -> impl Iterator<Item = std::result::Result<&[u8], ()>> {
    let mut rest = list;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut n = 0usize;
        let mut shift = 0;
        let mut at = 0;
        loop {
            let Some(&b) = rest.get(at).filter(|_| shift < 28) else {
                rest = &[];
                return Some(Err(()));
            };
            n |= usize::from(b & 0x7f) << shift;
            shift += 7;
            at += 1;
            if b & 0x80 == 0 {
                break;
            }
        }
        let Some(operand) = rest.get(at..at + n) else {
            rest = &[];
            return Some(Err(()));
        };
        rest = &rest[at + n..];
        Some(Ok(operand))
    })
}

/// Whether `list` is a well-formed operand list (what replay accepts from the log).
pub(crate) fn is_operand_list(list: &[u8]) -> bool {
    !list.is_empty() && operands(list).all(|o| o.is_ok())
}

impl Shared {
    /// Folds the operand list `list` of stored key `key` over `base`, a stored value (a
    /// value stored out of line is read: the operator sees the whole value), with the
    /// configured merge operator.
    ///
    /// # Errors
    /// As [`Shared::fold_value`], and `Io` or `Corruption` reading an out-of-line base.
    pub(crate) fn fold(
        &self,
        key: &[u8],
        base: Option<&[u8]>,
        list: &[u8],
    ) -> Result<Option<Vec<u8>>> {
        if let Some(failed) = base.and_then(|b| self.failed_fold(b)) {
            return Err(failed);
        }
        match base.and_then(|b| self.storage().blobs().decode(b)) {
            // Callers hold the leaf's lock (or the base is a batch's own write): the
            // reference is current.
            Some(r) => self.fold_value(key, Some(&self.read_blob(&r)?), list),
            None => self.fold_value(key, base, list),
        }
    }

    /// As [`Shared::fold`], for a leaf rebuilt for the sake of any of its keys (a
    /// write-back, a mirror, a split, a scan's copy): a fold that fails for the key's own
    /// reasons (the operator panicked, or its result is too long) gives a failed fold to
    /// store in place of the value (module docs), not an error.
    ///
    /// # Errors
    /// Those of [`Shared::fold`] that are not the key's own: no merge operator, a list
    /// that does not decode, the base's extent failing to read.
    pub(crate) fn fold_or_mark(
        &self,
        key: &[u8],
        base: Option<&[u8]>,
        list: &[u8],
    ) -> Result<Option<Vec<u8>>> {
        match self.fold(key, base, list) {
            Err(e @ (Error::MergeFailed { .. } | Error::ValueTooLarge { .. }))
                if self.storage().blobs().marks_values() =>
            {
                Ok(Some(failed_fold(&e)))
            }
            folded => folded,
        }
    }

    /// The error a stored value stands for, if it is a failed fold (module docs).
    #[inline]
    pub(crate) fn failed_fold(&self, stored: &[u8]) -> Option<Error> {
        if !stored.starts_with(&FAILED_FOLD) || !self.storage().blobs().marks_values() {
            return None;
        }
        Some(decode_failed_fold(&stored[FAILED_FOLD.len()..]))
    }

    /// Folds the operand list `list` of stored key `key` over the user's value `base`. The
    /// result is stored in the leaf, so it must fit a record.
    ///
    /// # Errors
    /// `InvalidConfig` without a merge operator; `ValueTooLarge` if the operator returns a
    /// value past what a record holds with the key (or one that would read as a reference to
    /// an out-of-line value, which only an out-of-line write may store); `Corruption` for a
    /// list that does not decode.
    pub(crate) fn fold_value(
        &self,
        key: &[u8],
        base: Option<&[u8]>,
        list: &[u8],
    ) -> Result<Option<Vec<u8>>> {
        let Some(op) = self.merge_operator_for(key) else {
            return Err(no_operator());
        };
        let user = user_key(key);
        let mut value = base.map(<[u8]>::to_vec);
        for operand in operands(list) {
            let operand = operand.map_err(|()| {
                Error::corruption(
                    self.config().dir.clone().unwrap_or_default(),
                    None,
                    "a buffered merge operand list does not decode",
                )
            })?;
            let folded = catch_unwind(AssertUnwindSafe(|| (op.0)(user, value.as_deref(), operand)));
            value = folded.map_err(|panic| Error::MergeFailed {
                reason: panic_message(&*panic),
            })?;
        }
        if let Some(v) = &value {
            self.limits().check_inline(user, v)?;
            if self.storage().blobs().decode(v).is_some() || v.starts_with(&FAILED_FOLD) {
                return Err(Error::ValueTooLarge {
                    len: v.len(),
                    limit: v.len() - 1,
                });
            }
        }
        Ok(value)
    }

    /// The value of stored key `key` in leaf page `disk` (`None` or [`NO_PAGE`]: no page) of
    /// the leaf at the end of `path`.
    ///
    /// # Errors
    /// `Io` or `Corruption` reading the page (`Storage::check_leaf_in`); `Corruption` if the
    /// key is absent from a damaged leaf (it may have been lost).
    pub(crate) fn disk_value(
        &self,
        path: &Path<'_>,
        disk: Option<u64>,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>> {
        let Some(disk) = disk.filter(|p| *p != NO_PAGE) else {
            return Ok(None);
        };
        with_page_buf(self.page_size(), |buf| {
            self.storage().read_page(disk, buf)?;
            let leaf = self.check_leaf_of(path, disk, buf)?;
            match leaf.get(key) {
                Some((_, kind, v)) => Ok(kind.exists().then(|| v.to_vec())),
                None if leaf.flags() & FLAG_DAMAGED != 0 => Err(self.storage().corruption(
                    Some(disk),
                    "the key is in a damaged leaf that may have lost it",
                )),
                None => Ok(None),
            }
        })
    }

    /// Merges `operand` into `key` of `space` (see [`Tree::merge`](crate::Tree::merge)).
    pub(crate) fn merge_in(&self, space: &Space, key: &[u8], operand: &[u8]) -> Result<()> {
        self.limits().check_inline(key, operand)?;
        let key = space.prefix().key(key);
        if self.merge_operator_for(&key).is_none() {
            return Err(no_operator());
        }
        let list = one_operand(operand);
        self.write(&key, WriteOp::Merge(&list))?;
        self.counters().upserts(1);
        self.after_write();
        Ok(())
    }
}

/// Longest panic message a failed fold keeps (bytes; cut at a character boundary).
const REASON_MAX: usize = 200;

/// What a panic carried, as text: its message when it is a string.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("");
    let mut end = text.len().min(REASON_MAX);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// The stored value that records fold error `e` (a `MergeFailed` or a `ValueTooLarge`):
/// [`FAILED_FOLD`], then `1` and the panic's message, or `2` and the result's length and
/// the limit (u64 LE each).
fn failed_fold(e: &Error) -> Vec<u8> {
    let mut v = FAILED_FOLD.to_vec();
    match e {
        Error::ValueTooLarge { len, limit } => {
            v.push(2);
            v.extend_from_slice(&(*len as u64).to_le_bytes());
            v.extend_from_slice(&(*limit as u64).to_le_bytes());
        }
        Error::MergeFailed { reason } => {
            v.push(1);
            v.extend_from_slice(reason.as_bytes());
        }
        _ => v.push(1),
    }
    v
}

/// The error a failed fold's bytes after [`FAILED_FOLD`] record.
fn decode_failed_fold(rest: &[u8]) -> Error {
    let u64_at = |at: usize| -> usize {
        rest.get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, |b| u64::from_le_bytes(b) as usize)
    };
    match rest.first() {
        Some(2) => Error::ValueTooLarge {
            len: u64_at(1),
            limit: u64_at(9),
        },
        _ => Error::MergeFailed {
            reason: String::from_utf8_lossy(rest.get(1..).unwrap_or_default()).into_owned(),
        },
    }
}

/// The error for a merge, or a fold, without a merge operator.
pub(crate) fn no_operator() -> Error {
    Error::InvalidConfig {
        reason: "merge needs a merge operator (Config::merge_operator)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operand_lists_round_trip() {
        let ops: Vec<Vec<u8>> = vec![vec![], vec![7], vec![1; 127], vec![2; 128], vec![3; 20_000]];
        let mut list = Vec::new();
        for o in &ops {
            push_operand(&mut list, o);
        }
        let back: Vec<Vec<u8>> = operands(&list).map(|o| o.unwrap().to_vec()).collect();
        assert_eq!(back, ops);
        assert!(is_operand_list(&list));
        assert_eq!(one_operand(b"ab"), vec![2, b'a', b'b']);
    }

    #[test]
    fn failed_folds_round_trip_their_error() {
        let panicked = Error::MergeFailed {
            reason: "boom".into(),
        };
        let marked = failed_fold(&panicked);
        assert!(marked.starts_with(&FAILED_FOLD));
        assert!(matches!(
            decode_failed_fold(&marked[FAILED_FOLD.len()..]),
            Error::MergeFailed { reason } if reason == "boom"
        ));
        let large = Error::ValueTooLarge {
            len: 100_000,
            limit: 4000,
        };
        let marked = failed_fold(&large);
        assert!(matches!(
            decode_failed_fold(&marked[FAILED_FOLD.len()..]),
            Error::ValueTooLarge {
                len: 100_000,
                limit: 4000
            }
        ));
        // Damaged or cut short: still an error, never a panic.
        assert!(matches!(
            decode_failed_fold(&[2, 1]),
            Error::ValueTooLarge { len: 0, limit: 0 }
        ));
        assert!(matches!(decode_failed_fold(&[]), Error::MergeFailed { .. }));
    }

    #[test]
    fn panic_messages_are_kept_short_and_whole() {
        let long = "é".repeat(300);
        let kept = panic_message(&long.clone());
        assert!(kept.len() <= REASON_MAX && long.starts_with(&kept) && !kept.is_empty());
        assert_eq!(panic_message(&"static"), "static");
        assert_eq!(panic_message(&42u32), "");
    }

    #[test]
    fn an_operator_panic_is_the_folds_error_and_marks_only_where_values_can_be() {
        fn refuse(_: &[u8], _: Option<&[u8]>, _: &[u8]) -> Option<Vec<u8>> {
            panic!("refused")
        }
        let tree = crate::Tree::open(crate::Config::in_memory().merge_operator(refuse)).unwrap();
        let shared = tree.shared();
        let list = one_operand(b"x");
        let e = shared.fold(b"\0k", None, &list).unwrap_err();
        assert!(matches!(e, Error::MergeFailed { ref reason } if reason == "refused"));
        // An in-memory tree folds every merge when it is made: nothing to mark.
        assert!(shared.fold_or_mark(b"\0k", None, &list).is_err());
        let dir = tempfile::tempdir().unwrap();
        let tree =
            crate::Tree::open(crate::Config::new(dir.path()).merge_operator(refuse)).unwrap();
        let shared = tree.shared();
        let marked = shared.fold_or_mark(b"\0k", None, &list).unwrap().unwrap();
        assert!(matches!(
            shared.failed_fold(&marked),
            Some(Error::MergeFailed { .. })
        ));
        // A mark folds to itself: the key stays failed under more operands.
        let again = shared
            .fold_or_mark(b"\0k", Some(&marked), &list)
            .unwrap()
            .unwrap();
        assert_eq!(again, marked);
    }

    #[test]
    fn damaged_lists_are_refused() {
        assert!(!is_operand_list(&[]));
        assert!(!is_operand_list(&[5, 1, 2]));
        assert!(!is_operand_list(&[0x80]));
        assert!(!is_operand_list(&[0xff, 0xff, 0xff, 0xff, 0xff, 1]));
        let mut list = one_operand(b"x");
        list.push(3);
        assert!(operands(&list).nth(1).unwrap().is_err());
    }
}
