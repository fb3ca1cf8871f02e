//! What a range iterator copied out of a leaf and has not yielded yet: keys and values back
//! to back in one buffer that is reused from leaf to leaf, so copying a leaf allocates
//! nothing per record (a record is copied into owned vectors only when it is yielded).

use std::collections::VecDeque;

use super::scan::KeyValue;

/// Copied records, in key order, taken from either end.
#[derive(Default)]
pub(super) struct Copied {
    bytes: Vec<u8>,
    /// Each record's key offset in `bytes`, key length and value length (the value follows
    /// the key).
    spans: VecDeque<(usize, usize, usize)>,
}

impl Copied {
    /// Whether every copied record was taken.
    pub(super) fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Forgets the records, keeping the memory for the next leaf.
    pub(super) fn clear(&mut self) {
        self.bytes.clear();
        self.spans.clear();
    }

    /// Appends a record (keys ascending).
    pub(super) fn push(&mut self, key: &[u8], value: &[u8]) {
        self.spans
            .push_back((self.bytes.len(), key.len(), value.len()));
        self.bytes.extend_from_slice(key);
        self.bytes.extend_from_slice(value);
    }

    /// Appends records (keys ascending).
    pub(super) fn extend(&mut self, records: impl IntoIterator<Item = KeyValue>) {
        for (k, v) in records {
            self.push(&k, &v);
        }
    }

    /// Takes the records out as owned pairs (for the rare changes `rewind.rs` makes),
    /// leaving this empty.
    pub(super) fn take_all(&mut self) -> Vec<KeyValue> {
        let out = self
            .spans
            .iter()
            .map(|&(at, k, v)| {
                (
                    self.bytes[at..at + k].to_vec(),
                    self.bytes[at + k..at + k + v].to_vec(),
                )
            })
            .collect();
        self.clear();
        out
    }

    /// Takes the first record: its key and value.
    pub(super) fn pop_front(&mut self) -> Option<(&[u8], &[u8])> {
        let (at, k, v) = self.spans.pop_front()?;
        Some((&self.bytes[at..at + k], &self.bytes[at + k..at + k + v]))
    }

    /// Takes the last record: its key and value.
    pub(super) fn pop_back(&mut self) -> Option<(&[u8], &[u8])> {
        let (at, k, v) = self.spans.pop_back()?;
        Some((&self.bytes[at..at + k], &self.bytes[at + k..at + k + v]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_come_out_from_both_ends_and_round_trip() {
        let mut c = Copied::default();
        assert!(c.is_empty());
        c.push(b"a", b"1");
        c.extend([(b"bb".to_vec(), Vec::new()), (Vec::new(), b"333".to_vec())]);
        assert_eq!(c.pop_front(), Some((&b"a"[..], &b"1"[..])));
        assert_eq!(c.pop_back(), Some((&b""[..], &b"333"[..])));
        assert_eq!(c.take_all(), vec![(b"bb".to_vec(), Vec::new())]);
        assert!(c.is_empty());
        assert_eq!(c.pop_front(), None);
        c.push(b"k", b"v");
        c.clear();
        assert_eq!(c.pop_back(), None);
    }
}
