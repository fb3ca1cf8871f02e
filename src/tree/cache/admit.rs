//! Which records a disk read caches: a doorkeeper in front of promotion (the admission
//! filter of `TinyLFU`). A key is promoted on its second miss within a window, never on its
//! first, so the many keys of a skewed workload's long tail that are read once do not fill
//! mini-pages at the expense of the keys read over and over.
//!
//! One bit per hashed key; the filter forgets everything once an eighth of its bits are set
//! (a new key then passes by collision at most one time in eight).

use crate::store::checksum;
use crate::sync::{AtomicU64, AtomicUsize, Ordering};

/// Bits per byte of cache: 1/16 of the cache size in bytes, a window of about a record
/// per 128 bytes of cache before a reset.
const BITS_PER_CACHE_BYTE_SHIFT: u32 = 4;
/// Fewest bits kept, whatever the cache size.
const MIN_BITS: usize = 1 << 12;
/// Most bits kept (8 MiB of filter).
const MAX_BITS: usize = 1 << 26;

/// The doorkeeper. Shared by all threads; relaxed atomics only (a lost update costs one
/// promotion more or less, never a wrong answer).
#[derive(Debug)]
pub(crate) struct Doorkeeper {
    /// The bit set.
    words: Box<[AtomicU64]>,
    /// Bits set since the last reset.
    set: AtomicUsize,
    /// Reset when `set` reaches this.
    limit: usize,
}

impl Doorkeeper {
    /// A doorkeeper sized for a cache of `cache_bytes`.
    pub(crate) fn new(cache_bytes: usize) -> Doorkeeper {
        let bits = (cache_bytes >> BITS_PER_CACHE_BYTE_SHIFT)
            .next_power_of_two()
            .clamp(MIN_BITS, MAX_BITS);
        Doorkeeper {
            words: (0..bits / 64).map(|_| AtomicU64::new(0)).collect(),
            set: AtomicUsize::new(0),
            limit: bits / 8,
        }
    }

    /// True if `key` missed before in the current window (promote it now); otherwise
    /// remembers it and returns false.
    pub(crate) fn admit(&self, key: &[u8]) -> bool {
        let h = u64::from(checksum::crc32c(key));
        let word = &self.words[(h >> 6) as usize & (self.words.len() - 1)];
        let bit = 1u64 << (h & 63);
        if word.load(Ordering::Relaxed) & bit != 0 {
            return true;
        }
        if word.fetch_or(bit, Ordering::Relaxed) & bit != 0 {
            return true;
        }
        if self.set.fetch_add(1, Ordering::Relaxed) + 1 >= self.limit {
            self.reset();
        }
        false
    }

    /// Forgets every key (two threads may both do it: harmless).
    fn reset(&self) {
        self.set.store(0, Ordering::Relaxed);
        for w in &self.words {
            w.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_miss_is_admitted_first_is_not() {
        let d = Doorkeeper::new(1 << 20);
        assert!(!d.admit(b"alpha"));
        assert!(d.admit(b"alpha"));
        assert!(d.admit(b"alpha"));
        assert!(!d.admit(b"beta"));
        assert_eq!(
            d.words.len() * 8,
            (1 << 16) / 8,
            "1 bit per 16 bytes of cache"
        );
    }

    #[test]
    fn forgets_after_a_window_and_rarely_admits_strangers() {
        let d = Doorkeeper::new(0); // the minimum: 4096 bits, reset after 512 set
        assert!(!d.admit(b"first"));
        let mut strangers_admitted = 0;
        for i in 0..600u32 {
            if d.admit(&i.to_le_bytes()) {
                strangers_admitted += 1;
            }
        }
        // At most an eighth of the bits are ever set: collisions stay rare.
        assert!(
            strangers_admitted < 600 / 8,
            "{strangers_admitted} admitted"
        );
        // More than a window of distinct keys went by: "first" was forgotten.
        assert!(!d.admit(b"first"));
    }
}
