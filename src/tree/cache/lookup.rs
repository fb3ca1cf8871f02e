//! Lookups in a locked leaf (paper §5.1): the answer from the leaf's cached node or its
//! disk page, and what a miss caches there (promotion, through the doorkeeper of
//! `admit.rs` and the choice of `whole_leaves.rs`).

use super::leaf::{percent_roll, with_page_buf};
use crate::error::Result;
use crate::node::{NodeKind, NodeMut, NodeRef, RecordKind};
use crate::pool::{Location, ReadGuard, WriteGuard};
use crate::tree::index::Path;
use crate::tree::stats::Event;
use crate::tree::{Restart, Shared, Step, FLAG_DAMAGED, NO_PAGE};

/// What a lookup in a leaf found (the value itself went to the caller's buffer), and
/// whether a promotion found the buffer full (the caller evicts once the leaf's lock is
/// released).
pub(crate) struct Lookup {
    /// Whether the key is present.
    found: bool,
    /// A promotion found the buffer full.
    wants_room: bool,
}

impl Lookup {
    /// Whether a promotion found the buffer full.
    pub(crate) fn wants_room(&self) -> bool {
        self.wants_room
    }

    /// Whether the key is present (its value is in the caller's buffer).
    pub(crate) fn found(&self) -> bool {
        self.found
    }

    /// An answer that needs no room: `value` copied into `out`, or `out` left empty.
    fn answer(value: Option<&[u8]>, out: &mut Vec<u8>) -> Lookup {
        if let Some(v) = value {
            out.extend_from_slice(v);
        }
        Lookup {
            found: value.is_some(),
            wants_room: false,
        }
    }
}

impl Shared {
    /// Whether a lookup of `key` served from a disk leaf caches its answer: always on the
    /// key's second miss within the doorkeeper's window (`admit.rs`), and on a first miss
    /// with the configured probability, so a cold cache still fills quickly. Never when the
    /// probability is 0 (promotion off).
    fn promotes(&self, key: &[u8]) -> bool {
        let p = self.config().promotion_percent;
        // Every miss is cached at 100: nothing for the doorkeeper to tell apart. Below, the
        // doorkeeper goes first: it must see every miss to count second ones.
        p >= 100 || (p > 0 && (self.doorkeeper().admit(key) || p > percent_roll()))
    }

    /// Looks `key` up in a read-locked leaf, copying its value into `out` (empty on entry):
    /// a value in the cache is copied straight from the node, so a buffer with room for it
    /// is all a lookup needs. Returns whether it was found and whether a promotion found
    /// the buffer full (the caller evicts after releasing the lock).
    pub(in crate::tree) fn get_in_leaf(
        &self,
        path: &Path<'_>,
        page: ReadGuard<'_>,
        key: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Lookup> {
        let mut disk_page = match page.location() {
            Location::Disk(p) => Some(p),
            Location::Mini(_) => None,
        };
        if let (Some(bytes), Location::Mini(addr)) = (page.mini(), page.location()) {
            let node = NodeRef::from_bytes(bytes);
            if let Some((i, kind, value)) = node.get(key) {
                if kind == RecordKind::Upsert {
                    // Pending merges: fold them over the leaf page's value.
                    self.counters().count(Event::CacheMiss);
                    let base = self.disk_value(path, node.disk_page(), key)?;
                    let folded = self.fold(key, base.as_deref(), value)?;
                    return Ok(Lookup::answer(folded.as_deref(), out));
                }
                self.counters().count(Event::CacheHit);
                let lookup = Lookup::answer(kind.exists().then_some(value), out);
                let needs_ref = !node.ref_bit(i);
                let move_to_tail = self.pool().is_copy_on_access(addr);
                if needs_ref || move_to_tail {
                    // Best effort: only when no other reader holds the leaf.
                    if let Ok(mut w) = page.try_upgrade() {
                        self.touch(&mut w, i, move_to_tail);
                    }
                }
                return Ok(lookup);
            }
            if node.kind() == NodeKind::Leaf {
                // A full-page mirror holds every record: absent here means absent.
                self.counters().count(Event::CacheHit);
                return Ok(Lookup::answer(None, out));
            }
            disk_page = node.disk_page();
        }
        let Some(disk) = disk_page.filter(|p| *p != NO_PAGE) else {
            return Ok(Lookup::answer(None, out));
        };
        self.counters().count(Event::CacheMiss);
        with_page_buf(self.page_size(), |buf| {
            self.storage().read_page(disk, buf)?;
            let leaf = self.check_leaf_of(path, disk, buf)?;
            let found = leaf.get(key);
            if found.is_none() && leaf.flags() & FLAG_DAMAGED != 0 {
                return Err(self.storage().corruption(
                    Some(disk),
                    "the key is in a damaged leaf that may have lost it",
                ));
            }
            let value = found.and_then(|(_, kind, v)| kind.exists().then_some(v));
            let mut lookup = Lookup::answer(value, out);
            if self.promotes(key) {
                if let Ok(mut w) = page.try_upgrade() {
                    if self.caches_whole_leaves() && self.mirror_read_leaf(path, &mut w, leaf, disk)
                    {
                        self.counters().count(Event::LeafCached);
                        return Ok(lookup);
                    }
                    let (v, kind) = match value {
                        Some(v) => (v, RecordKind::Cache),
                        None => (&[][..], RecordKind::Phantom),
                    };
                    match self.put_buffered(path, &mut w, key, v, kind)? {
                        Step::Done(_) => {
                            self.counters().count(Event::Promotion);
                        }
                        Step::Restart(Restart::NeedSpace) => lookup.wants_room = true,
                        Step::Restart(Restart::Retry) => {}
                    }
                }
            }
            Ok(lookup)
        })
    }

    /// What a lookup that found record `i` of a mini-page does once it holds the leaf's
    /// write lock: marks the record referenced and, if its block is near the head
    /// (`move_to_tail`), copies the mini-page to the tail.
    pub(in crate::tree) fn touch<'p>(
        &'p self,
        page: &mut WriteGuard<'p>,
        i: usize,
        move_to_tail: bool,
    ) {
        if let Some(bytes) = page.mini_mut() {
            NodeMut::from_bytes(bytes).set_ref_bit(i, true);
        }
        if move_to_tail {
            self.copy_to_tail(page);
        }
    }

    /// The value of `key` in a write-locked leaf, read from its disk page if the buffered
    /// node does not decide it. Caches nothing: the caller is about to write the key.
    pub(in crate::tree) fn value_in_leaf(
        &self,
        path: &Path<'_>,
        page: &WriteGuard<'_>,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>> {
        let Some(bytes) = page.mini() else {
            return match page.location() {
                Location::Disk(p) => self.disk_value(path, Some(p), key),
                Location::Mini(_) => Ok(None),
            };
        };
        let node = NodeRef::from_bytes(bytes);
        match node.get(key) {
            Some((_, RecordKind::Upsert, list)) => {
                let base = self.disk_value(path, node.disk_page(), key)?;
                self.fold_or_mark(key, base.as_deref(), list)
            }
            Some((_, kind, value)) => Ok(kind.exists().then(|| value.to_vec())),
            None if node.kind() == NodeKind::Leaf => Ok(None),
            None => self.disk_value(path, node.disk_page(), key),
        }
    }
}
