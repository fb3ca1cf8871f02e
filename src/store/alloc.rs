//! Page allocation: the free list and the page count, shared by every backend.
//!
//! Not thread-safe by itself; each store keeps it behind a small mutex (allocation is not on
//! the read path).

use std::collections::BTreeSet;

use super::{PageNo, FIRST_DATA_PAGE};

/// The largest page count: page offsets must fit in an `off_t` (i64) for any page size.
const MAX_PAGES: u64 = (i64::MAX as u64) >> 16;

/// Which pages are free, which the store keeps for itself, and how many pages exist.
#[derive(Debug, Clone)]
pub(super) struct Allocator {
    /// Pages in the file, the superblock slots included.
    page_count: u64,
    /// Free pages; `allocate` pops from the end, so reuse is last-freed-first.
    free: Vec<PageNo>,
    /// One bit per page, set when the page is in `free` (double-free detection in O(1)).
    free_bits: Vec<u64>,
    /// Pages holding the store's own free-list chains: never free, never allocatable.
    owned: BTreeSet<PageNo>,
}

impl Allocator {
    /// An allocator for a file of `page_count` pages (at least [`FIRST_DATA_PAGE`]) where
    /// every data page is in use.
    pub(super) fn new(page_count: u64) -> Allocator {
        Allocator {
            page_count: page_count.max(FIRST_DATA_PAGE),
            free: Vec::new(),
            free_bits: Vec::new(),
            owned: BTreeSet::new(),
        }
    }

    /// Pages in the file, the superblock slots included.
    pub(super) fn page_count(&self) -> u64 {
        self.page_count
    }

    /// The free pages, in no particular order.
    pub(super) fn free_list(&self) -> &[PageNo] {
        &self.free
    }

    /// Pages handed out and not freed (the store's own pages excluded).
    pub(super) fn allocated(&self) -> u64 {
        self.page_count - FIRST_DATA_PAGE - self.free.len() as u64 - self.owned.len() as u64
    }

    /// Whether `page` is a free page.
    fn is_free(&self, page: PageNo) -> bool {
        let (word, bit) = ((page / 64) as usize, page % 64);
        self.free_bits
            .get(word)
            .is_some_and(|w| w & (1 << bit) != 0)
    }

    /// Sets or clears the free bit of `page`.
    fn set_bit(&mut self, page: PageNo, free: bool) {
        let (word, bit) = ((page / 64) as usize, page % 64);
        if word >= self.free_bits.len() {
            self.free_bits.resize(word + 1, 0);
        }
        if free {
            self.free_bits[word] |= 1 << bit;
        } else {
            self.free_bits[word] &= !(1 << bit);
        }
    }

    /// A page to write to: the last freed page, else a new one at the end. `None` when the
    /// file has reached the largest page count an `off_t` can address.
    pub(super) fn allocate(&mut self) -> Option<PageNo> {
        if let Some(page) = self.free.pop() {
            self.set_bit(page, false);
            return Some(page);
        }
        if self.page_count >= MAX_PAGES {
            return None;
        }
        self.page_count += 1;
        Some(self.page_count - 1)
    }

    /// Allocates a page for the store's own use (a free-list chain page): a free page that
    /// `durable_free` also lists as free, else a new page at the end. Never a page that
    /// is free now but in use in the durable state: a crash before the next superblock
    /// lands would bring that page's old contents back into use.
    pub(super) fn allocate_owned(&mut self, durable_free: &FreeSet) -> Option<PageNo> {
        let page = match self.free.iter().rposition(|&p| durable_free.contains(p)) {
            Some(i) => {
                let page = self.free.swap_remove(i);
                self.set_bit(page, false);
                page
            }
            None if self.page_count < MAX_PAGES => {
                self.page_count += 1;
                self.page_count - 1
            }
            None => return None,
        };
        self.owned.insert(page);
        Some(page)
    }

    /// Marks `page` as the store's own (found in a superblock's chain on open).
    pub(super) fn mark_owned(&mut self, page: PageNo) {
        self.owned.insert(page);
    }

    /// Whether `page` is one of the store's own pages.
    #[allow(dead_code)] // used by unit tests and the internals harness
    pub(super) fn is_owned(&self, page: PageNo) -> bool {
        self.owned.contains(&page)
    }

    /// Returns `page` for reuse; the error says why it was not allocated.
    pub(super) fn free(&mut self, page: PageNo) -> Result<(), &'static str> {
        self.check_data_page(page)?;
        if self.is_free(page) {
            return Err("double free: the page is already free");
        }
        self.free.push(page);
        self.set_bit(page, true);
        Ok(())
    }

    /// Why `page` cannot be a caller's page, if it cannot.
    fn check_data_page(&self, page: PageNo) -> Result<(), &'static str> {
        if page < FIRST_DATA_PAGE {
            return Err("page is a superblock slot, reserved by the store");
        }
        if page >= self.page_count {
            return Err("page is beyond the end of the file");
        }
        if self.owned.contains(&page) {
            return Err("page holds the store's free list");
        }
        Ok(())
    }

    /// Replaces the free set by `pages`, skipping the store's own pages. On error (a
    /// reserved page, a page beyond the end, a duplicate) nothing changes and the offending
    /// page is returned with the reason.
    pub(super) fn set_free(&mut self, pages: Vec<PageNo>) -> Result<(), (PageNo, &'static str)> {
        let mut next = Allocator {
            free: Vec::with_capacity(pages.len()),
            ..self.clone()
        };
        next.free_bits.clear();
        for page in pages {
            if self.owned.contains(&page) {
                continue;
            }
            next.check_data_page(page)
                .map_err(|reason| (page, reason))?;
            if next.is_free(page) {
                return Err((page, "page listed twice in the free set"));
            }
            next.set_bit(page, true);
            next.free.push(page);
        }
        // Descending, so `allocate` hands out low pages first and the file stays compact.
        next.free.sort_unstable_by(|a, b| b.cmp(a));
        *self = next;
        Ok(())
    }
}

/// A set of page numbers as a bitmap (the free set of the durable superblock).
#[derive(Debug, Clone, Default)]
pub(super) struct FreeSet {
    /// Bit `p % 64` of word `p / 64` is set when page `p` is in the set.
    bits: Vec<u64>,
}

impl FreeSet {
    /// The set of `pages`.
    pub(super) fn of(pages: &[PageNo]) -> FreeSet {
        let mut bits = Vec::new();
        for &p in pages {
            let word = (p / 64) as usize;
            if word >= bits.len() {
                bits.resize(word + 1, 0);
            }
            bits[word] |= 1 << (p % 64);
        }
        FreeSet { bits }
    }

    /// Whether `page` is in the set.
    pub(super) fn contains(&self, page: PageNo) -> bool {
        self.bits
            .get((page / 64) as usize)
            .is_some_and(|w| w & (1 << (page % 64)) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_freed_pages_before_growing() {
        let mut a = Allocator::new(FIRST_DATA_PAGE);
        let p = a.allocate().unwrap();
        let q = a.allocate().unwrap();
        assert_eq!((p, q), (2, 3));
        a.free(p).unwrap();
        assert_eq!(a.free(p), Err("double free: the page is already free"));
        assert_eq!(a.allocate(), Some(p));
        assert_eq!(a.page_count(), 4);
        assert!(a.free(0).is_err() && a.free(1).is_err() && a.free(4).is_err());
        assert_eq!(a.allocated(), 2);
    }

    #[test]
    fn set_free_validates_and_skips_owned_pages() {
        let mut a = Allocator::new(10);
        let owned = a.allocate_owned(&FreeSet::default()).unwrap();
        assert_eq!(owned, 10);
        assert!(a.set_free(vec![3, 3]).is_err());
        assert!(a.set_free(vec![3, 11]).is_err());
        assert!(a.set_free(vec![1]).is_err());
        assert_eq!(a.free_list(), &[] as &[PageNo]);
        a.set_free(vec![5, 3, owned, 9]).unwrap();
        assert_eq!(
            [a.allocate(), a.allocate(), a.allocate()],
            [Some(3), Some(5), Some(9)]
        );
        assert_eq!(a.free(owned), Err("page holds the store's free list"));
    }

    #[test]
    fn owned_pages_come_only_from_durably_free_pages() {
        let mut a = Allocator::new(10);
        a.set_free(vec![4, 5, 6]).unwrap();
        assert_eq!(a.allocate_owned(&FreeSet::of(&[5, 9])), Some(5));
        assert_eq!(a.allocate_owned(&FreeSet::of(&[5, 9])), Some(10));
        assert_eq!(a.page_count(), 11);
        assert_eq!(a.free_list().len(), 2);
        assert_eq!(a.allocated(), 11 - 2 - 2 - 2);
    }
}
