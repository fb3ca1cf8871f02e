//! A scan's refill under the leaf's read lock, for what a refill without it
//! (`optimistic.rs`) leaves: a leaf being written, a mini-page over a page on disk (merged
//! newest-wins, `copied.rs`), a leaf on disk alone. A leaf read from disk may be kept as a
//! full-page mirror, and an ascending scan past its first leaves reads the next leaf's page
//! with it (`readahead.rs`).

use std::ops::Bound;

use super::copied::{copy_present, fold_alone, overlay, Copied};
use super::readahead::ReadAhead;
use crate::error::Result;
use crate::node::{NodeKind, NodeRef};
use crate::pool::{Location, ReadGuard};
use crate::store::PageBuf;
use crate::sync;
use crate::tree::cache::with_page_buf;
use crate::tree::index::Path;
use crate::tree::stats::Event;
use crate::tree::{Shared, FLAG_DAMAGED, NO_PAGE};

/// Most chance, in percent, that a scan keeps a leaf it read from disk as a mirror: scans
/// were measured (YCSB-E) with the promotion default at 50 %, and a whole page for every
/// scanned leaf was not, so raising the default for lookups did not raise this.
const SCAN_MIRROR_MAX_PERCENT: u8 = 50;

/// What an ascending refill passes for read-ahead: its state, the epoch guard it walked the
/// inner nodes under, and the next leaf's low bound when the range goes on past this leaf.
pub(in crate::tree) struct Ahead<'a, 'g> {
    pub(in crate::tree) read: &'a mut ReadAhead,
    pub(in crate::tree) guard: &'g sync::EpochGuard,
    pub(in crate::tree) next: Option<&'a [u8]>,
}

impl Shared {
    /// Copies out a read-locked leaf's records between `start` and `end`, ascending, into
    /// `out`.
    pub(in crate::tree) fn collect_leaf(
        &self,
        path: &Path<'_>,
        page: ReadGuard<'_>,
        start: &Bound<Vec<u8>>,
        end: &Bound<Vec<u8>>,
        out: &mut Copied,
        ahead: Option<Ahead<'_, '_>>,
    ) -> Result<()> {
        let (over, disk) = match page.mini() {
            Some(bytes) => {
                let node = NodeRef::from_bytes(bytes);
                if node.kind() == NodeKind::Leaf {
                    self.counters().count(Event::CacheHit);
                    copy_present(node, start, end, out);
                    return Ok(());
                }
                (Some(node), node.disk_page())
            }
            None => match page.location() {
                Location::Disk(p) => (None, Some(p)),
                Location::Mini(_) => (None, None),
            },
        };
        let Some(disk) = disk.filter(|p| *p != NO_PAGE) else {
            if let Some(node) = over {
                fold_alone(node, start, end, out, |k, b, ops| {
                    self.fold_or_mark(k, b, ops)
                })?;
            }
            return Ok(());
        };
        self.counters().count(Event::CacheMiss);
        let pid = page.page_id();
        let copy = |buf: &PageBuf| {
            let leaf = self.check_leaf_of(path, disk, buf)?;
            if leaf.flags() & FLAG_DAMAGED != 0 {
                return Err(self
                    .storage()
                    .corruption(Some(disk), "the scan crosses a damaged leaf"));
            }
            // The mini-page again: `page` moves into the upgrade below.
            let over = page.mini().map(NodeRef::from_bytes);
            overlay(leaf, over, start, end, out, |k, b, ops| {
                self.fold_or_mark(k, b, ops)
            })?;
            if self.config().promotion_percent.min(SCAN_MIRROR_MAX_PERCENT)
                > crate::tree::cache::percent_roll()
            {
                if let Ok(mut w) = page.try_upgrade() {
                    if self.mirror_read_leaf(path, &mut w, leaf, disk) {
                        self.counters().count(Event::ScanMirror);
                    }
                }
            }
            Ok(())
        };
        if let Some(Ahead { read, guard, next }) = ahead {
            if let Some(buf) = read.take(self, pid, disk) {
                return copy(buf);
            }
            if let Some(next) = next.and_then(|key| self.next_on_disk(guard, key)) {
                if let Some(buf) = read.read_both(self, disk, next) {
                    return copy(buf);
                }
            }
        }
        with_page_buf(self.page_size(), |buf| {
            self.storage().read_page(disk, buf)?;
            copy(buf)
        })
    }
}
