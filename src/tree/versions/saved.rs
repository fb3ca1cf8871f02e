//! The old values writes replaced, kept for the readers that started before them: each
//! saved under the sequence number of the write that replaced it, indexed by key, so that a
//! reader looks up only the keys it reads (a scan, its leaf's range) however many writes
//! ran since it started.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;

use crate::sync::Arc;
use crate::tree::blob::BlobPin;
use crate::tree::keyspace::is_empty_range;
use crate::tree::KeyValue;

/// What a write's keys held before it: key (keyspace prefix included) and old value
/// (`None`: absent), ascending by key.
pub(crate) type Undo = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// A saved old value (`None`: the key was absent).
pub(crate) type Old = Option<Arc<[u8]>>;

/// Bytes an entry costs besides its key (twice: in the index and in its write's list) and
/// its value: the index's and the list's bookkeeping, measured as about this much.
const ENTRY_OVERHEAD: usize = 64;

/// One write's saved values.
struct Write {
    seq: u64,
    keys: Vec<Vec<u8>>,
    /// What its entries cost (see [`SavedValues::bytes`]).
    bytes: usize,
    /// Keeps the extents of saved values stored out of line from reuse (`blob/extents.rs`)
    /// for as long as a reader may yield them.
    _pin: Option<BlobPin>,
}

/// The saved old values.
#[derive(Default)]
pub(crate) struct SavedValues {
    /// For each key, the writes that replaced its value since the earliest reader that needs
    /// them started (sequence number, old value), ascending by number.
    by_key: BTreeMap<Vec<u8>, Vec<(u64, Old)>>,
    /// The writes saved, in the order they were saved (ascending by number but for a write
    /// numbered without the lock and saved late, `store.rs`).
    writes: VecDeque<Write>,
    /// What the entries take in memory, roughly: their keys, values and bookkeeping.
    bytes: usize,
}

impl SavedValues {
    /// Whether nothing is saved.
    pub(crate) fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// Bytes the saved values take (keys, values and bookkeeping, estimated).
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Saves what write `seq` replaced (`undo`), with the pin that keeps its values'
    /// extents.
    pub(crate) fn insert(&mut self, seq: u64, undo: Undo, pin: Option<BlobPin>) {
        let mut keys = Vec::with_capacity(undo.len());
        let mut bytes = 0;
        for (key, old) in undo {
            bytes += 2 * key.len() + old.as_ref().map_or(0, Vec::len) + ENTRY_OVERHEAD;
            let entries = self.by_key.entry(key.clone()).or_default();
            let at = entries.partition_point(|(s, _)| *s < seq);
            entries.insert(at, (seq, old.map(Arc::from)));
            keys.push(key);
        }
        self.bytes += bytes;
        self.writes.push_back(Write {
            seq,
            keys,
            bytes,
            _pin: pin,
        });
    }

    /// Drops what no reader started after `floor` needs: the values replaced by writes
    /// numbered at or before it (taken in saving order; one saved late waits for the ones
    /// before it).
    pub(crate) fn prune(&mut self, floor: u64) {
        while self.writes.front().is_some_and(|w| w.seq <= floor) {
            let Some(w) = self.writes.pop_front() else {
                break;
            };
            for key in &w.keys {
                if let Some(entries) = self.by_key.get_mut(key) {
                    entries.retain(|(s, _)| *s != w.seq);
                    if entries.is_empty() {
                        self.by_key.remove(key);
                    }
                }
            }
            self.bytes -= w.bytes;
        }
    }

    /// Drops everything (no reader is left).
    pub(crate) fn clear(&mut self) {
        self.by_key.clear();
        self.writes.clear();
        self.bytes = 0;
    }

    /// The value `key` had for a reader that started at `start`, if a write since replaced
    /// it: `Some(old)` (`old` `None`: it was absent); `None` if no write since touched it.
    pub(crate) fn before(&self, key: &[u8], start: u64) -> Option<Old> {
        let entries = self.by_key.get(key)?;
        let first = entries.iter().find(|(seq, _)| *seq > start)?;
        Some(first.1.clone())
    }

    /// Whether a write numbered after `start` touched `key`.
    pub(crate) fn written_since(&self, key: &[u8], start: u64) -> bool {
        self.by_key
            .get(key)
            .and_then(|e| e.last())
            .is_some_and(|(seq, _)| *seq > start)
    }

    /// The first key between `lower` and `upper` that a write numbered after `start`
    /// touched, if any.
    pub(crate) fn first_written_in(
        &self,
        lower: Bound<&[u8]>,
        upper: Bound<&[u8]>,
        start: u64,
    ) -> Option<&[u8]> {
        if is_empty_range(lower, upper) {
            return None;
        }
        self.by_key
            .range::<[u8], _>((lower, upper))
            .find(|(_, e)| e.last().is_some_and(|(seq, _)| *seq > start))
            .map(|(k, _)| k.as_slice())
    }

    /// Puts back, in `items` (a leaf's records between `lower` and `upper`, ascending), the
    /// values the keys had for a reader that started at `start`.
    pub(crate) fn rewind(
        &self,
        start: u64,
        items: &mut Vec<KeyValue>,
        lower: &Bound<Vec<u8>>,
        upper: &Bound<Vec<u8>>,
    ) {
        let (lower, upper) = (as_slices(lower), as_slices(upper));
        if is_empty_range(lower, upper) {
            return;
        }
        // For each key written since the reader started, its value before the first of
        // those writes.
        let old: Vec<(Vec<u8>, Old)> = self
            .by_key
            .range::<[u8], _>((lower, upper))
            .filter_map(|(key, entries)| {
                let first = entries.iter().find(|(seq, _)| *seq > start)?;
                Some((key.clone(), first.1.clone()))
            })
            .collect();
        if old.is_empty() {
            return;
        }
        let mut out = Vec::with_capacity(items.len() + old.len());
        let mut old = old.into_iter().peekable();
        for (key, value) in items.drain(..) {
            while let Some((k, v)) = old.next_if(|(k, _)| *k < key) {
                if let Some(v) = v {
                    out.push((k, v.to_vec()));
                }
            }
            match old.next_if(|(k, _)| *k == key) {
                Some((_, Some(v))) => out.push((key, v.to_vec())),
                Some((_, None)) => {}
                None => out.push((key, value)),
            }
        }
        out.extend(old.filter_map(|(k, v)| v.map(|v| (k, v.to_vec()))));
        *items = out;
    }

    /// Writes saved (tests).
    #[cfg(all(test, not(shuttle)))]
    pub(crate) fn writes(&self) -> usize {
        debug_assert_eq!(self.by_key.is_empty(), self.writes.is_empty());
        self.writes.len()
    }
}

fn as_slices(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k.as_slice()),
        Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

#[cfg(all(test, not(shuttle)))]
mod tests {
    use super::*;

    fn undo(pairs: &[(&str, Option<&str>)]) -> Undo {
        pairs
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.map(|v| v.as_bytes().to_vec())))
            .collect()
    }

    /// A lookup's answer as text: "untouched", "absent" or the old value.
    fn old(v: Option<Old>) -> String {
        match v {
            None => "untouched".into(),
            Some(None) => "absent".into(),
            Some(Some(b)) => String::from_utf8(b.to_vec()).unwrap(),
        }
    }

    #[test]
    fn the_first_write_after_a_start_gives_the_old_value() {
        let mut s = SavedValues::default();
        s.insert(3, undo(&[("k", Some("v0"))]), None);
        s.insert(5, undo(&[("k", Some("v1")), ("n", None)]), None);
        assert_eq!(old(s.before(b"k", 2)), "v0");
        assert_eq!(old(s.before(b"k", 3)), "v1");
        assert_eq!(old(s.before(b"k", 5)), "untouched");
        assert_eq!(old(s.before(b"n", 4)), "absent", "absent before write 5");
        assert!(s.written_since(b"k", 4) && !s.written_since(b"k", 5));
        assert!(!s.written_since(b"other", 0));
        let range = |lo: &'static [u8], hi: &'static [u8], start| {
            s.first_written_in(Bound::Included(lo), Bound::Excluded(hi), start)
                .map(<[u8]>::to_vec)
        };
        assert_eq!(range(b"a", b"z", 4), Some(b"k".to_vec()));
        assert_eq!(range(b"l", b"z", 4), Some(b"n".to_vec()));
        assert_eq!(range(b"l", b"z", 5), None);
        assert_eq!(range(b"z", b"a", 0), None, "an empty range");
    }

    #[test]
    fn pruning_drops_what_no_reader_needs_and_its_bytes() {
        let mut s = SavedValues::default();
        s.insert(1, undo(&[("a", Some("x"))]), None);
        s.insert(2, undo(&[("a", Some("y")), ("b", None)]), None);
        let both = s.bytes();
        s.prune(1);
        assert_eq!(s.writes(), 1);
        assert!(s.bytes() < both && s.bytes() > 0);
        assert_eq!(old(s.before(b"a", 0)), "y", "write 1 is gone");
        s.prune(2);
        assert!(s.is_empty());
        assert_eq!(s.bytes(), 0);
    }

    #[test]
    fn rewinding_puts_back_values_replaced_removed_and_inserted() {
        let mut s = SavedValues::default();
        s.insert(
            7,
            undo(&[("b", Some("b0")), ("c", None), ("d", Some("d0"))]),
            None,
        );
        let kv = |k: &str, v: &str| (k.as_bytes().to_vec(), v.as_bytes().to_vec());
        let mut items = vec![kv("a", "a1"), kv("b", "b1"), kv("c", "c1"), kv("e", "e1")];
        s.rewind(6, &mut items, &Bound::Unbounded, &Bound::Unbounded);
        assert_eq!(
            items,
            vec![kv("a", "a1"), kv("b", "b0"), kv("d", "d0"), kv("e", "e1")]
        );
        let mut items = vec![kv("e", "e1")];
        s.rewind(
            6,
            &mut items,
            &Bound::Included(b"d1".to_vec()),
            &Bound::Unbounded,
        );
        assert_eq!(
            items,
            vec![kv("e", "e1")],
            "only keys in the range come back"
        );
        let mut items = vec![kv("b", "b1")];
        s.rewind(7, &mut items, &Bound::Unbounded, &Bound::Unbounded);
        assert_eq!(items, vec![kv("b", "b1")], "a reader from after the write");
    }
}
