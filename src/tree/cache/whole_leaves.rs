//! Whether a read that misses caches its whole leaf or only its record.
//!
//! With a cache much smaller than the data (the paper's setting), a miss caches the one
//! record it read in the leaf's mini-page: a page per miss would push out some thirty hot
//! records for each cold one. With a cache that holds every leaf, whole leaves are the
//! better buy: each miss then caches its leaf's other records too, and misses stop once
//! every leaf is in memory. Records cached one by one never get there: 5M records (16-byte
//! keys and values) in a 282 MiB cache settled at 4.5 % misses on Zipf lookups, where the
//! same leaves, each in the smallest size class that holds it, took 213 MiB.
//!
//! The estimate: a leaf mirrored in its size class takes about three quarters of a page
//! (leaves filled by random inserts are about 70 % full), and whole leaves are cached while
//! that many leaves' mirrors take at most four fifths of the buffer, leaving the rest for
//! the mini-pages that buffer writes.

use crate::tree::Shared;

impl Shared {
    /// Whether a read that misses should cache its whole leaf (and a clean mirror near the
    /// head stay whole: `copy_to_tail`). A relaxed count of leaves, read per call.
    pub(crate) fn caches_whole_leaves(&self) -> bool {
        let pool = self.pool();
        fits(pool.pages_in_use(), self.page_size(), pool.capacity())
    }
}

/// Whether `leaves` mirrors of three quarters of a `page_size` page each fit four fifths
/// of a buffer of `capacity` bytes.
fn fits(leaves: usize, page_size: usize, capacity: usize) -> bool {
    let need = (leaves as u128)
        .saturating_mul(page_size as u128)
        .saturating_mul(3)
        / 4;
    need <= (capacity as u128) * 4 / 5
}

#[cfg(all(test, not(shuttle)))]
mod tests {
    use super::*;

    #[test]
    fn whole_leaves_are_cached_while_three_quarter_pages_fit_four_fifths_of_the_buffer() {
        let page = 4096;
        // 282 MiB holds 70k leaves this way (210 MiB of 225.6), not 80k (240 MiB).
        assert!(fits(70_000, page, 282 << 20));
        assert!(!fits(80_000, page, 282 << 20));
        // The paper's setting: 32 MiB against 70k leaves.
        assert!(!fits(70_000, page, 32 << 20));
        assert!(fits(0, page, 0));
        assert!(!fits(1, page, 0));
        assert!(!fits(usize::MAX, usize::MAX, usize::MAX));
    }
}
