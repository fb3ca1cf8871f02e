//! The iterator over a range of a [`Transaction`](crate::Transaction): the tree's records at
//! the transaction's start with the transaction's own writes laid over them.

use std::collections::VecDeque;

use crate::error::Result;
use crate::tree::read::Range;
use crate::tree::KeyValue;

/// A transaction's own value of a key: `Ok(None)` for a key it removed.
type Own = (Vec<u8>, Result<Option<Vec<u8>>>);

/// Iterator over a key range as a [`Transaction`](crate::Transaction) sees it: the
/// records of the tree at its start, with its own inserts, removals and merges applied; see
/// [`Transaction::range`](crate::Transaction::range). Double-ended; yields
/// `Result<(key, value)>` as [`Range`] does.
pub struct TransactionRange<'t> {
    /// The tree's records at the transaction's start.
    inner: Range<'t>,
    /// The transaction's own keys in the range (user keys), ascending, with their values.
    own: VecDeque<Own>,
    /// The record `inner` yielded last from the front and not yet passed on.
    front: Option<KeyValue>,
    /// The same from the back.
    back: Option<KeyValue>,
}

impl<'t> TransactionRange<'t> {
    /// `inner` with `own` (ascending) laid over it.
    pub(crate) fn new(inner: Range<'t>, own: Vec<Own>) -> TransactionRange<'t> {
        TransactionRange {
            inner,
            own: own.into(),
            front: None,
            back: None,
        }
    }

    /// The next record of the tree from the front, peeked: the one `inner` yields, or, once
    /// it has none left, the one the back peeked.
    fn peek_front(&mut self) -> Option<Result<&KeyValue>> {
        if self.front.is_none() {
            match self.inner.next() {
                Some(Ok(kv)) => self.front = Some(kv),
                Some(Err(e)) => return Some(Err(e)),
                None => self.front = self.back.take(),
            }
        }
        self.front.as_ref().map(Ok)
    }

    /// As [`TransactionRange::peek_front`], from the back.
    fn peek_back(&mut self) -> Option<Result<&KeyValue>> {
        if self.back.is_none() {
            match self.inner.next_back() {
                Some(Ok(kv)) => self.back = Some(kv),
                Some(Err(e)) => return Some(Err(e)),
                None => self.back = self.front.take(),
            }
        }
        self.back.as_ref().map(Ok)
    }

    /// The transaction's own value of `key` replaces the tree's: drops the tree's record of
    /// it from whichever end holds it.
    fn shadow(&mut self, key: &[u8]) {
        for peeked in [&mut self.front, &mut self.back] {
            if peeked.as_ref().is_some_and(|(k, _)| k == key) {
                *peeked = None;
            }
        }
    }
}

impl Iterator for TransactionRange<'_> {
    type Item = Result<KeyValue>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let tree_key = match self.peek_front() {
                Some(Err(e)) => return Some(Err(e)),
                Some(Ok((k, _))) => Some(k.clone()),
                None => None,
            };
            let own_first = match (&tree_key, self.own.front()) {
                (_, None) => false,
                (None, Some(_)) => true,
                (Some(t), Some((o, _))) => o <= t,
            };
            if !own_first {
                return self.front.take().map(Ok);
            }
            let (key, value) = self.own.pop_front()?;
            self.shadow(&key);
            match value {
                Ok(Some(v)) => return Some(Ok((key, v))),
                Ok(None) => {}
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

impl DoubleEndedIterator for TransactionRange<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        loop {
            let tree_key = match self.peek_back() {
                Some(Err(e)) => return Some(Err(e)),
                Some(Ok((k, _))) => Some(k.clone()),
                None => None,
            };
            let own_last = match (&tree_key, self.own.back()) {
                (_, None) => false,
                (None, Some(_)) => true,
                (Some(t), Some((o, _))) => o >= t,
            };
            if !own_last {
                return self.back.take().map(Ok);
            }
            let (key, value) = self.own.pop_back()?;
            self.shadow(&key);
            match value {
                Ok(Some(v)) => return Some(Ok((key, v))),
                Ok(None) => {}
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

impl std::iter::FusedIterator for TransactionRange<'_> {}

impl std::fmt::Debug for TransactionRange<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionRange")
            .field("own", &self.own.len())
            .finish_non_exhaustive()
    }
}
