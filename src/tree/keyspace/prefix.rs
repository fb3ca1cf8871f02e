//! Keyspace prefixes: the bytes that start every stored key of one keyspace (`space.rs`
//! says why keyspaces are prefixes), and keys with their prefix.
//!
//! Prefixes (prefix-free, so no two keyspaces share a key): id 0, the default keyspace, is
//! `[0x00]`; ids below `0xF0` are `[id]`; larger ids are `[0xEF + n]` followed by the id in
//! `n` big-endian bytes. `0xFF` starts the catalog's keys (`catalog.rs`).

use std::ops::{Bound, Deref, RangeBounds};

/// Most bytes a keyspace prefix takes.
pub(crate) const MAX_PREFIX: usize = crate::limits::MAX_KEY_PREFIX;

/// First byte of every catalog key; no keyspace prefix starts with it.
pub(crate) const CATALOG_BYTE: u8 = 0xFF;

/// Ids below this take a one-byte prefix.
const SHORT_IDS: u32 = 0xF0;

/// The bytes that start every key of one keyspace.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Prefix {
    len: u8,
    bytes: [u8; MAX_PREFIX],
}

impl Prefix {
    /// The prefix of keyspace `id`.
    pub(crate) fn of(id: u32) -> Prefix {
        let mut bytes = [0u8; MAX_PREFIX];
        if id < SHORT_IDS {
            bytes[0] = id as u8;
            return Prefix { len: 1, bytes };
        }
        let be = id.to_be_bytes();
        let skip = be.iter().take_while(|&&b| b == 0).count();
        let n = 4 - skip;
        bytes[0] = 0xEF + n as u8;
        bytes[1..=n].copy_from_slice(&be[skip..]);
        Prefix {
            len: 1 + n as u8,
            bytes,
        }
    }

    /// The catalog's prefix.
    #[cfg(test)]
    fn catalog() -> Prefix {
        Prefix::raw(&[CATALOG_BYTE])
    }

    /// A prefix of the given bytes (at most [`MAX_PREFIX`]; the catalog's own ranges).
    pub(crate) fn raw(raw: &[u8]) -> Prefix {
        let mut bytes = [0u8; MAX_PREFIX];
        bytes[..raw.len()].copy_from_slice(raw);
        Prefix {
            len: raw.len() as u8,
            bytes,
        }
    }

    /// The prefix bytes (inlined: a scan strips them from every key it lends).
    #[inline]
    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// The smallest key above every key that starts with `end`, made from `end` (`None`: no
    /// such key).
    fn past(mut end: Vec<u8>) -> Option<Vec<u8>> {
        while let Some(last) = end.pop() {
            if last < 0xFF {
                end.push(last + 1);
                return Some(end);
            }
        }
        None
    }

    /// `key` with this prefix in front.
    pub(crate) fn key(self, key: &[u8]) -> FullKey {
        FullKey::new(self.as_slice(), key)
    }

    /// The stored-key form of a range of this keyspace's keys, written into buffers from
    /// `buf` (a scan passes ones kept from earlier scans).
    pub(in crate::tree) fn bounds<K: AsRef<[u8]>>(
        self,
        range: &impl RangeBounds<K>,
        mut buf: impl FnMut() -> Vec<u8>,
    ) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
        let mut full = |parts: [&[u8]; 2]| {
            let mut v = buf();
            v.clear();
            v.extend_from_slice(parts[0]);
            v.extend_from_slice(parts[1]);
            v
        };
        let prefix = self.as_slice();
        let lower = match range.start_bound() {
            Bound::Included(k) => Bound::Included(full([prefix, k.as_ref()])),
            Bound::Excluded(k) => Bound::Excluded(full([prefix, k.as_ref()])),
            Bound::Unbounded => Bound::Included(full([prefix, &[]])),
        };
        let upper = match range.end_bound() {
            Bound::Included(k) => Bound::Included(full([prefix, k.as_ref()])),
            Bound::Excluded(k) => Bound::Excluded(full([prefix, k.as_ref()])),
            Bound::Unbounded => {
                Prefix::past(full([prefix, &[]])).map_or(Bound::Unbounded, Bound::Excluded)
            }
        };
        (lower, upper)
    }
}

/// The range of the keys that start with `prefix`: from it, to the smallest key above all of
/// them (none for an empty prefix or one of `FF` bytes alone).
pub(crate) fn prefix_range(prefix: &[u8]) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let upper = Prefix::past(prefix.to_vec()).map_or(Bound::Unbounded, Bound::Excluded);
    (Bound::Included(prefix.to_vec()), upper)
}

/// Whether no key lies between `lower` and `upper` (inverted bounds, or one key excluded at
/// either end): `BTreeMap::range` panics on those, a scan yields nothing.
pub(crate) fn is_empty_range(lower: Bound<&[u8]>, upper: Bound<&[u8]>) -> bool {
    match (lower, upper) {
        (Bound::Included(l), Bound::Included(u)) => l > u,
        (Bound::Included(l) | Bound::Excluded(l), Bound::Excluded(u))
        | (Bound::Excluded(l), Bound::Included(u)) => l >= u,
        _ => false,
    }
}

/// The user's key inside stored key `key`: without its keyspace prefix (a catalog key, or
/// one too short to carry a prefix, is returned whole).
pub(crate) fn user_key(key: &[u8]) -> &[u8] {
    let len = match key.first() {
        Some(&b) if u32::from(b) < SHORT_IDS => 1,
        Some(&b) if (0xF0..=0xF3).contains(&b) => 1 + usize::from(b - 0xEF),
        _ => 0,
    };
    key.get(len..).unwrap_or(key)
}

/// The id of the keyspace stored key `key` belongs to (`None` for a catalog key, or one
/// too short to carry a prefix).
pub(crate) fn prefix_id(key: &[u8]) -> Option<u32> {
    match key.first() {
        Some(&b) if u32::from(b) < SHORT_IDS => Some(u32::from(b)),
        Some(&b) if (0xF0..=0xF3).contains(&b) => {
            let n = usize::from(b - 0xEF);
            let bytes = key.get(1..=n)?;
            Some(bytes.iter().fold(0u32, |id, &b| id << 8 | u32::from(b)))
        }
        _ => None,
    }
}

/// `key` as the default keyspace stores it (tests that look inside the tree).
#[cfg(all(test, not(shuttle)))]
pub(crate) fn stored_key(key: &[u8]) -> Vec<u8> {
    Prefix::of(0).key(key).to_vec()
}

/// Bytes of a prefixed key kept on the stack.
const INLINE_KEY: usize = 64;

/// A prefixed key: on the stack when short (every key of the paper's workloads), so the
/// prefix costs a copy of the key, not an allocation.
pub(crate) enum FullKey {
    /// `len` bytes of `bytes`.
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    /// A longer key.
    Heap(Vec<u8>),
}

impl FullKey {
    /// `prefix` followed by `key`.
    pub(crate) fn new(prefix: &[u8], key: &[u8]) -> FullKey {
        let len = prefix.len() + key.len();
        if len > INLINE_KEY {
            return FullKey::Heap([prefix, key].concat());
        }
        let mut bytes = [0u8; INLINE_KEY];
        bytes[..prefix.len()].copy_from_slice(prefix);
        bytes[prefix.len()..len].copy_from_slice(key);
        FullKey::Inline {
            len: len as u8,
            bytes,
        }
    }
}

impl Deref for FullKey {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            FullKey::Inline { len, bytes } => &bytes[..usize::from(*len)],
            FullKey::Heap(v) => v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_keys_drop_exactly_the_prefix() {
        for id in [0u32, 1, 0xEF, 0xF0, 0x1234, 0xFF_FFFF, u32::MAX] {
            let key = Prefix::of(id).key(b"user key");
            assert_eq!(user_key(&key), b"user key", "id {id}");
        }
        assert_eq!(user_key(b""), b"");
        assert_eq!(user_key(&[CATALOG_BYTE, 1]), &[CATALOG_BYTE, 1]);
    }

    #[test]
    fn prefixes_are_prefix_free_and_bounded() {
        let ids = [
            0u32,
            1,
            0xEF,
            0xF0,
            0xFF,
            0x100,
            0xFFFF,
            0x1_0000,
            0xFF_FFFF,
            0x100_0000,
            u32::MAX,
        ];
        let prefixes: Vec<Prefix> = ids.iter().map(|&i| Prefix::of(i)).collect();
        for (a, pa) in ids.iter().zip(&prefixes) {
            assert!(pa.as_slice().len() <= MAX_PREFIX);
            assert_ne!(pa.as_slice()[0], CATALOG_BYTE, "id {a}");
            for (b, pb) in ids.iter().zip(&prefixes) {
                if a != b {
                    assert!(
                        !pb.as_slice().starts_with(pa.as_slice()),
                        "{a} is a prefix of {b}"
                    );
                }
            }
        }
        assert_eq!(Prefix::of(0).as_slice(), [0]);
        assert_eq!(Prefix::of(0xEF).as_slice(), [0xEF]);
        assert_eq!(Prefix::of(0xF0).as_slice(), [0xF0, 0xF0]);
        assert_eq!(
            Prefix::of(u32::MAX).as_slice(),
            [0xF3, 0xFF, 0xFF, 0xFF, 0xFF]
        );
    }

    #[test]
    fn bounds_cover_exactly_the_keyspace() {
        for id in [0u32, 7, 0xEF, 0xF0, 0x1FF, u32::MAX] {
            let p = Prefix::of(id);
            // Buffers kept from an earlier scan still hold its bytes.
            let (lo, hi) = p.bounds::<&[u8]>(&(..), || b"stale".to_vec());
            let inside = |k: &[u8]| {
                let above = match &lo {
                    Bound::Included(l) => k >= l.as_slice(),
                    _ => unreachable!(),
                };
                let below = match &hi {
                    Bound::Excluded(h) => k < h.as_slice(),
                    Bound::Unbounded => true,
                    Bound::Included(_) => unreachable!(),
                };
                above && below
            };
            for key in [&b""[..], b"\x00", b"\xff\xff\xff", b"abc"] {
                assert!(inside(&p.key(key)), "id {id}");
            }
            for other in [0u32, 7, 0xEF, 0xF0, 0x1FF, u32::MAX]
                .into_iter()
                .filter(|&o| o != id)
            {
                for key in [&b""[..], b"\x00", b"\xff\xff\xff"] {
                    assert!(!inside(&Prefix::of(other).key(key)), "{other} inside {id}");
                }
            }
            assert!(!inside(&Prefix::catalog().key(b"x")));
        }
        assert_eq!(Prefix::past(Prefix::catalog().as_slice().to_vec()), None);
        let (lo, hi) = Prefix::of(7).bounds(&(&b"a"[..]..=&b"b"[..]), || b"stale".to_vec());
        assert_eq!(lo, Bound::Included(vec![7, b'a']));
        assert_eq!(hi, Bound::Included(vec![7, b'b']));
    }

    #[test]
    fn full_keys_spill_to_the_heap_only_when_long() {
        let short = FullKey::new(&[3], &[9; 63]);
        assert!(matches!(short, FullKey::Inline { .. }));
        assert_eq!(short.len(), 64);
        let long = FullKey::new(&[3], &[9; 64]);
        assert!(matches!(long, FullKey::Heap(_)));
        assert_eq!(&long[..2], [3, 9]);
        assert_eq!(long.len(), 65);
    }
}
