//! Batched lookups (`get_many`): every key the cache answers is answered at once, and the
//! leaf pages the rest need are read together with one `read_batch` (up to `BATCH` pages in
//! flight), instead of one read at a time.
//!
//! The keys go in waves of `WAVE`: first hints for the whole wave (`prefetch_leaves`), so
//! that the lookups' misses to memory overlap, then each key as `get` would look it up
//! without a lock (`get_optimistic`). A key that lookup cannot answer from the cache has
//! its leaf looked at once more, under its read lock, to answer from the cache or to note
//! the leaf's bounds, disk page and write token (`PageTracker::write_token`). After the batch
//! read the key is answered from that page if the token is still the same, with no second
//! look at the leaf: the token changes with every write-back, split and removal of the leaf,
//! before its old page is freed, so an unchanged token means the page was the leaf's all
//! along and was never rewritten. The page then holds what the leaf held for the key when it
//! was looked at (its cache did not decide the key), a state within the call, as a `get`
//! running then would have answered. Otherwise, and for a batch that fails, the key is
//! looked up on its own, so each key gets exactly the answer or error a `get` would.
//! Nothing is cached from the batch (no promotion). The page buffers are kept for the
//! thread's next batch (up to `BATCH` of them), so a batch neither allocates nor zeroes them.

use std::cell::RefCell;

use super::checkpoint::BATCH;
use super::inner::{Bounds, Seek};
use super::keyspace::{FullKey, Space};
use super::stats::Event;
use super::{Shared, FLAG_DAMAGED, NO_PAGE};
use crate::error::Result;
use crate::node::{NodeKind, NodeRef, RecordKind};
use crate::pool::{Location, PageId, ReadGuard};
use crate::store::PageBuf;
use crate::sync;

/// Keys whose leaves a batch prefetches together before looking them up
/// (`Shared::prefetch_leaves`): enough misses in flight to cover memory's latency.
const WAVE: usize = 32;

thread_local! {
    /// Page buffers of this thread's last batch, reused by the next.
    static BUFS: RefCell<Vec<PageBuf>> = const { RefCell::new(Vec::new()) };
}

/// What a look at a key's leaf found.
enum Probe {
    /// The cache decides the key.
    Answer(Result<Option<Vec<u8>>>),
    /// The key is decided by the leaf's disk page.
    Disk(Noted),
    /// Looked up on its own (pending merge operands to fold).
    Alone,
}

/// What the look at a key's leaf noted: leaf `pid`'s disk page `page`, read while its
/// write token was `token` and its bounds were `bounds`.
struct Noted {
    pid: PageId,
    page: u64,
    token: u64,
    bounds: Bounds,
}

/// A key waiting for its leaf's page.
struct Miss {
    /// Its position in the caller's keys.
    at: usize,
    /// The stored key.
    key: Vec<u8>,
    leaf: Noted,
}

impl Shared {
    /// The values of `keys` in `space`, in order (see the module docs).
    pub(crate) fn get_many_in<K: AsRef<[u8]>>(
        &self,
        space: &Space,
        keys: &[K],
    ) -> Vec<Result<Option<Vec<u8>>>> {
        let mut out: Vec<Option<Result<Option<Vec<u8>>>>> =
            std::iter::repeat_with(|| None).take(keys.len()).collect();
        let mut misses = Vec::new();
        let mut stored = Vec::with_capacity(WAVE);
        for (w, wave) in keys.chunks(WAVE).enumerate() {
            stored.clear();
            for (j, key) in wave.iter().enumerate() {
                let key = key.as_ref();
                match self.limits().check(key, &[]) {
                    Ok(()) => stored.push((w * WAVE + j, space.prefix().key(key))),
                    Err(e) => out[w * WAVE + j] = Some(Err(e)),
                }
            }
            self.prefetch_leaves(&stored);
            for (at, key) in &stored {
                match self.probe(key) {
                    Probe::Answer(answer) => out[*at] = Some(answer),
                    Probe::Alone => out[*at] = Some(self.get(key)),
                    Probe::Disk(leaf) => misses.push(Miss {
                        at: *at,
                        key: key.to_vec(),
                        leaf,
                    }),
                }
            }
        }
        if misses.is_empty() {
            return self.finish(space, keys, out);
        }
        let mut bufs = BUFS.with(|b| std::mem::take(&mut *b.borrow_mut()));
        bufs.retain(|b| b.len() == self.page_size());
        for chunk in misses.chunks(BATCH) {
            let mut pages: Vec<u64> = chunk.iter().map(|m| m.leaf.page).collect();
            pages.sort_unstable();
            pages.dedup();
            if bufs.len() < pages.len() {
                bufs.resize_with(pages.len(), || PageBuf::new(self.page_size()));
            }
            let read = match self.storage().store() {
                Some(store) => store.read_batch(&pages, &mut bufs[..pages.len()]).is_ok(),
                None => false,
            };
            for m in chunk {
                self.counters().count(Event::CacheMiss);
                let answer = match pages.binary_search(&m.leaf.page) {
                    Ok(i) if read => self.answer_from(m, &bufs[i]),
                    _ => None,
                };
                out[m.at] = Some(answer.unwrap_or_else(|| self.get(&m.key)));
            }
        }
        bufs.truncate(BATCH);
        BUFS.with(|b| *b.borrow_mut() = bufs);
        self.finish(space, keys, out)
    }

    /// The answers of [`Shared::get_many_in`], each checked against the log and with a
    /// value stored out of line read.
    fn finish<K: AsRef<[u8]>>(
        &self,
        space: &Space,
        keys: &[K],
        out: Vec<Option<Result<Option<Vec<u8>>>>>,
    ) -> Vec<Result<Option<Vec<u8>>>> {
        // After the log failed the leaves may hold refused writes (`Journal::check`).
        out.into_iter()
            .zip(keys)
            .map(|(answer, key)| {
                self.journal().check()?;
                let found = answer.unwrap_or(Ok(None))?;
                // A value stored out of line is read now (checked again if its extent
                // fails verification, as for `get`).
                self.resolve_found(&space.prefix().key(key.as_ref()), found)
            })
            .collect()
    }

    /// Hints for a wave of lookups: walks to each key's leaf and starts loading its mapping
    /// entry; once all are on their way, each mini-page's header line; then the lines a
    /// search of each mini-page compares bytes on. The lookups that follow find those lines
    /// in cache, so the keys' misses to memory overlap instead of each waiting in turn.
    /// Reads nothing it decides on and stores nothing.
    fn prefetch_leaves(&self, keys: &[(usize, FullKey)]) {
        let keys = &keys[..keys.len().min(WAVE)];
        let guard = sync::pin();
        let mut pids = [0 as PageId; WAVE];
        for ((_, key), pid) in keys.iter().zip(&mut pids) {
            *pid = self.index().walk(&guard, Seek::Key(key)).1.leaf();
            self.pool().prefetch_entry(*pid);
        }
        let pids = &pids[..keys.len()];
        for &pid in pids {
            self.pool().prefetch_header(pid);
        }
        for ((_, key), &pid) in keys.iter().zip(pids) {
            self.prefetch_search(pid, key);
        }
    }

    /// Looks at the leaf of stored key `key` (see the module docs).
    fn probe(&self, key: &[u8]) -> Probe {
        let guard = sync::pin();
        let mut value = Vec::new();
        if let Some(found) = self.get_optimistic(&guard, key, &mut value) {
            return Probe::Answer(Ok(found.then_some(value)));
        }
        let (path, page) = self.index().read_leaf(self.pool(), &guard, Seek::Key(key));
        match cached(&page, key) {
            Cached::Decided(answer) => {
                self.counters().count(Event::CacheHit);
                Probe::Answer(Ok(answer))
            }
            Cached::OnDisk => match leaf_disk_page(&page) {
                Some(disk) => Probe::Disk(Noted {
                    pid: page.page_id(),
                    page: disk,
                    token: self.storage().pages().write_token(page.page_id()),
                    bounds: path.bounds(),
                }),
                None => Probe::Answer(Ok(None)),
            },
            Cached::Pending => Probe::Alone,
        }
    }

    /// The answer the leaf's page `buf` (read after the look at the leaf) gives for `m`, if
    /// the leaf's write token is unchanged (see the module docs); `None` if the key must be
    /// looked up again.
    fn answer_from(&self, m: &Miss, buf: &PageBuf) -> Option<Result<Option<Vec<u8>>>> {
        let Noted {
            pid,
            page,
            token,
            bounds: (low, high),
        } = &m.leaf;
        if self.storage().pages().write_token(*pid) != *token {
            return None;
        }
        let leaf = match self
            .storage()
            .check_leaf_in(*page, buf, low.as_deref(), high.as_deref())
        {
            Ok(leaf) => leaf,
            Err(e) => return Some(Err(e)),
        };
        Some(match leaf.get(&m.key) {
            Some((_, kind, v)) => Ok(kind.exists().then(|| v.to_vec())),
            None if leaf.flags() & FLAG_DAMAGED != 0 => Err(self.storage().corruption(
                Some(*page),
                "the key is in a damaged leaf that may have lost it",
            )),
            None => Ok(None),
        })
    }
}

/// What a read-locked leaf's cached node says of a key.
enum Cached {
    /// It decides the key: its value, or absent.
    Decided(Option<Vec<u8>>),
    /// The leaf's disk page decides it.
    OnDisk,
    /// Merge operands are pending over the page's value.
    Pending,
}

/// What `page`'s cached node says of `key`.
fn cached(page: &ReadGuard<'_>, key: &[u8]) -> Cached {
    let Some(bytes) = page.mini() else {
        return Cached::OnDisk;
    };
    let node = NodeRef::from_bytes(bytes);
    match node.get(key) {
        Some((_, RecordKind::Upsert, _)) => Cached::Pending,
        Some((_, kind, v)) => Cached::Decided(kind.exists().then(|| v.to_vec())),
        None if node.kind() == NodeKind::Leaf => Cached::Decided(None),
        None => Cached::OnDisk,
    }
}

/// A read-locked leaf's disk page, if it has one.
fn leaf_disk_page(page: &ReadGuard<'_>) -> Option<u64> {
    let disk = match (page.mini(), page.location()) {
        (Some(bytes), _) => NodeRef::from_bytes(bytes).disk_page(),
        (None, Location::Disk(p)) => Some(p),
        (None, Location::Mini(_)) => None,
    };
    disk.filter(|p| *p != NO_PAGE)
}
