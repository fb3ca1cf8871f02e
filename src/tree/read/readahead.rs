//! Read-ahead for long ascending scans: when a scan past its first three leaves has to read
//! its leaf from disk and the range goes on into the next leaf, which is on disk too, both
//! pages are read with one `read_batch`, so the scan waits for one read per two leaves.
//!
//! The next leaf is found without locking it (a scan holds one leaf lock at a time): its id
//! from the inner nodes, its disk page from its mapping word (`location_hint`) and its write
//! token (`PageTracker::write_token`, which changes whenever the leaf is written back, split
//! or removed). The page read ahead is used only if, under the next leaf's lock, the leaf
//! still has that disk page and that token: then the page holds the leaf's image (a leaf's
//! page is never rewritten in place, and a page it left is reused only after its token
//! changed). Anything else, and any failure of the batch (a stale hint can name a page
//! since freed, trimmed or half rewritten), falls back to reading the one page needed.

use crate::pool::{Location, PageId};
use crate::store::PageBuf;
use crate::sync::EpochGuard;
use crate::tree::index::Seek;
use crate::tree::{Shared, NO_PAGE};

/// A leaf on disk the scan will probably read next: its id, disk page and write token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::tree) struct NextLeaf {
    pid: PageId,
    disk: u64,
    token: u64,
}

/// One end's read-ahead state: two page buffers (the leaf read now and the next one),
/// allocated at the first read ahead, and which leaf the second holds.
#[derive(Default)]
pub(in crate::tree) struct ReadAhead {
    bufs: Vec<PageBuf>,
    next: Option<NextLeaf>,
    /// Pages read ahead, and those a later refill used (tests).
    #[cfg(test)]
    pub(in crate::tree) issued: u64,
    #[cfg(test)]
    pub(in crate::tree) used: u64,
}

impl ReadAhead {
    /// The page read ahead for leaf `pid`, whose disk page is `disk` under the lock the
    /// caller holds, if it still is that leaf's image.
    pub(in crate::tree) fn take(
        &mut self,
        tree: &Shared,
        pid: PageId,
        disk: u64,
    ) -> Option<&PageBuf> {
        let next = self.next.take()?;
        let current = next.pid == pid
            && next.disk == disk
            && tree.storage().pages().write_token(pid) == next.token;
        if !current {
            return None;
        }
        #[cfg(test)]
        {
            self.used += 1;
        }
        Some(&self.bufs[1])
    }

    /// Reads `disk` (the locked leaf's page) and `next`'s page with one batch; the first
    /// buffer holds `disk`'s page. `None` if the batch failed: the caller reads `disk` alone.
    pub(in crate::tree) fn read_both(
        &mut self,
        tree: &Shared,
        disk: u64,
        next: NextLeaf,
    ) -> Option<&PageBuf> {
        let store = tree.storage().store()?;
        if self.bufs.is_empty() {
            self.bufs = vec![
                PageBuf::new(tree.page_size()),
                PageBuf::new(tree.page_size()),
            ];
        }
        self.next = None;
        store.read_batch(&[disk, next.disk], &mut self.bufs).ok()?;
        self.next = Some(next);
        #[cfg(test)]
        {
            self.issued += 1;
        }
        Some(&self.bufs[0])
    }
}

impl Shared {
    /// The leaf that owns `key` (the high bound of the leaf a scan is in), if it is on disk
    /// with no cached node: a hint for [`ReadAhead::read_both`].
    pub(in crate::tree) fn next_on_disk(&self, guard: &EpochGuard, key: &[u8]) -> Option<NextLeaf> {
        let pid = self.index().descend(guard, Seek::Key(key)).leaf();
        // The token first: a write-back that moves the leaf between the two reads then shows
        // as a changed token or a changed page when the read ahead is checked.
        let token = self.storage().pages().write_token(pid);
        match self.pool().location_hint(pid) {
            Location::Disk(disk) if disk < NO_PAGE => Some(NextLeaf { pid, disk, token }),
            _ => None,
        }
    }
}

#[cfg(all(test, not(shuttle)))]
mod tests {
    use crate::sync;
    use crate::{Config, Durability, Tree};

    fn key(i: u32) -> [u8; 8] {
        let mut k = [0u8; 8];
        k[..4].copy_from_slice(b"key-");
        k[4..].copy_from_slice(&i.to_be_bytes());
        k
    }

    /// A tree of `n` records whose leaves are all on disk with nothing cached (reopened).
    fn on_disk(dir: &std::path::Path, n: u32) -> Tree {
        let config = || {
            Config::new(dir)
                .cache_size(1 << 20)
                .durability(Durability::None)
                .promotion_percent(0)
        };
        let tree = Tree::open(config()).expect("open");
        for i in 0..n {
            tree.insert(key(i), [i as u8; 24]).expect("insert");
        }
        tree.close().expect("close");
        Tree::open(config()).expect("reopen")
    }

    #[test]
    fn an_ascending_scan_reads_every_other_leaf_ahead() {
        let dir = tempfile::tempdir().expect("tempdir");
        let n = 20_000;
        let tree = on_disk(dir.path(), n);
        let leaves = tree.shared().index().leaves().len() as u64;
        assert!(leaves > 50, "{leaves} leaves");
        let mut scan = tree.iter();
        let mut i = 0u32;
        while let Some(record) = scan.next_ref() {
            let (k, v) = record.expect("scan");
            assert_eq!((k, v), (&key(i)[..], &[i as u8; 24][..]));
            i += 1;
        }
        assert_eq!(i, n);
        // Past the first leaves, each read of two pages serves the next refill: half the
        // other leaves come read ahead.
        let (issued, used) = scan.read_ahead();
        assert!(
            issued >= used && issued <= used + 1,
            "{issued} read ahead, {used} used"
        );
        assert!(
            used * 2 + 6 >= leaves && used * 2 <= leaves,
            "{used} of {leaves} leaves read ahead"
        );
        // A scan of three leaves reads nothing ahead.
        let mut short = tree.iter();
        let per_leaf = u64::from(n) / leaves;
        for _ in 0..per_leaf * 5 / 2 {
            short.next_ref().expect("record").expect("scan");
        }
        assert_eq!(short.read_ahead(), (0, 0));
        // A descending scan reads nothing ahead.
        let mut back = tree.iter();
        while back.next_back_ref().is_some() {}
        assert_eq!(back.read_ahead(), (0, 0));
    }

    #[test]
    fn a_page_read_ahead_is_used_only_while_it_is_the_leafs_image() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tree = on_disk(dir.path(), 5_000);
        let shared = tree.shared();
        let leaves = shared.index().leaves();
        let (first_low, first) = (&leaves[0].0, leaves[0].1);
        let (second_low, second) = (&leaves[1].0, leaves[1].1);
        let disk = |pid| match shared.pool().location_hint(pid) {
            crate::pool::Location::Disk(p) => p,
            crate::pool::Location::Mini(_) => panic!("leaf {pid} is cached, not on disk"),
        };
        let guard = sync::pin();
        let mut ahead = super::ReadAhead::default();
        let next = shared
            .next_on_disk(&guard, second_low)
            .expect("second leaf on disk");
        let read = ahead
            .read_both(shared, disk(first), next)
            .expect("read both");
        assert!(shared.storage().check_leaf(disk(first), read).is_ok());
        assert_eq!(
            shared
                .index()
                .descend(&guard, super::Seek::Key(first_low))
                .leaf(),
            first
        );
        // Unchanged: the page read ahead is the second leaf's image.
        let page = ahead
            .take(shared, second, disk(second))
            .expect("read ahead");
        let mut direct = crate::store::PageBuf::new(shared.page_size());
        shared
            .storage()
            .read_page(disk(second), &mut direct)
            .expect("read");
        assert_eq!(&page[..], &direct[..]);
        assert!(
            ahead.take(shared, second, disk(second)).is_none(),
            "used once"
        );
        // Read ahead again, then write the second leaf back: the page is stale.
        let old = disk(second);
        ahead
            .read_both(shared, disk(first), next)
            .expect("read both");
        let mut k = second_low.clone();
        k.push(0);
        drop(guard);
        tree.insert(&k[1..], b"new").expect("insert");
        tree.checkpoint().expect("checkpoint");
        assert!(
            ahead.take(shared, second, old).is_none(),
            "a rewritten leaf"
        );
        // Neither is a page read ahead for another leaf used.
        let guard = sync::pin();
        let third_low = &leaves[2].0;
        let next = shared
            .next_on_disk(&guard, third_low)
            .expect("third leaf on disk");
        ahead
            .read_both(shared, disk(first), next)
            .expect("read both");
        assert!(
            ahead.take(shared, first, disk(first)).is_none(),
            "another leaf"
        );
    }
}
