//! Batched lookups (`get_many`): every key the cache answers is answered at once, and the
//! leaf pages the rest need are read together (up to `BATCH` pages in flight), instead of
//! one read at a time.
//!
//! The keys go in waves of `WAVE`: first hints for the whole wave (`prefetch_leaves`), so
//! that the lookups' misses to memory overlap, then each key as `get` would look it up
//! without a lock (`get_optimistic`). A key that lookup cannot answer from the cache has
//! its leaf looked at once more, under its read lock, to answer from the cache or to note
//! the leaf's bounds, disk page and write token (`PageTracker::write_token`). Those looks
//! run inside a streamed read (`PageStore::read_streamed`): each new page is named as its
//! key is looked at, and the store starts reading the first pages while the later keys
//! are still being looked at. The looks therefore do no I/O; a key with merge operands
//! pending is looked up on its own after the reads.
//!
//! After its read, a key is answered from the page if the token is still the same, with no
//! second look at the leaf: the token changes with every write-back, split and removal of
//! the leaf, before its old page is freed, so an unchanged token means the page was the
//! leaf's all along and was never rewritten. Two keys share one read of a page only if they
//! noted the same leaf and token: the read may then come before the second key's look, and
//! the token, unchanged from the first look to the answer, still means the page was never
//! rewritten over that whole span. The page then holds what the leaf held for the key when
//! it was looked at (its cache did not decide the key), a state within the call, as a `get`
//! running then would have answered. Otherwise, and for a read that fails, the key is
//! looked up on its own, so each key gets exactly the answer or error a `get` would.
//! Nothing is cached from the reads (no promotion). The page buffers are kept for the
//! thread's next call (up to `BATCH` of them), so a read neither allocates nor zeroes them;
//! a thread starts with `FIRST_BUFS` and doubles them whenever a read uses all it has.

use std::cell::RefCell;

use crate::error::Result;
use crate::node::{NodeKind, NodeRef, RecordKind};
use crate::pool::{Location, PageId, ReadGuard};
use crate::store::PageBuf;
use crate::sync;
use crate::tree::index::{Bounds, Seek};
use crate::tree::keyspace::FullKey;
use crate::tree::keyspace::Space;
use crate::tree::stats::Event;
use crate::tree::writeback::BATCH;
use crate::tree::{Shared, FLAG_DAMAGED, NO_PAGE};

/// Keys whose leaves a batch prefetches together before looking them up
/// (`Shared::prefetch_leaves`): enough misses in flight to cover memory's latency.
const WAVE: usize = 32;

/// Page buffers a thread's first read is offered (see `get_many_in`).
const FIRST_BUFS: usize = 4;

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
    /// The buffer its batch reads the page into.
    buf: usize,
}

/// The keys of a `get_many` call and how far their probes got.
struct Walk<'k, K> {
    keys: &'k [K],
    space: &'k Space,
    /// Keys taken into waves so far.
    done: usize,
    /// The current wave's stored keys, with their positions in `keys`.
    wave: Vec<(usize, FullKey)>,
    /// The current wave's keys probed so far.
    probed: usize,
    /// Keys to look up on their own after the batches.
    alone: Vec<(usize, Vec<u8>)>,
}

impl<K: AsRef<[u8]>> Walk<'_, K> {
    /// Whether every key was probed.
    fn finished(&self) -> bool {
        self.done == self.keys.len() && self.probed == self.wave.len()
    }

    /// Takes the next `WAVE` keys, answering those the limits refuse.
    fn next_wave(&mut self, tree: &Shared, out: &mut [Option<Result<Option<Vec<u8>>>>]) {
        self.wave.clear();
        self.probed = 0;
        let end = (self.done + WAVE).min(self.keys.len());
        for (at, key) in self.keys.iter().enumerate().take(end).skip(self.done) {
            let key = key.as_ref();
            match tree.limits().check(key, &[]) {
                Ok(()) => self.wave.push((at, self.space.prefix().key(key))),
                Err(e) => out[at] = Some(Err(e)),
            }
        }
        self.done = end;
    }
}

/// The misses of one streamed read and the pages it reads for them.
#[derive(Default)]
struct Batch {
    /// The misses the read answers; `buf` indexes `pages`.
    misses: Vec<Miss>,
    /// The pages named to the read, in order, with the leaf and write token each was
    /// named for.
    pages: Vec<(u64, PageId, u64)>,
}

impl Batch {
    /// Empties the batch for the next read.
    fn start(&mut self) {
        self.misses.clear();
        self.pages.clear();
    }

    /// The next page the read should fetch, taking misses from `next_miss` until one needs
    /// a page not named yet (the read asks only while it has a buffer for one). A miss
    /// shares a page already named only if it was noted for the same leaf with the same
    /// write token: the page may have been read before this miss was probed, and an
    /// unchanged token from the first naming to the answer is what makes that read the
    /// leaf's page all along (see the module docs).
    fn next_page(&mut self, mut next_miss: impl FnMut() -> Option<Miss>) -> Option<u64> {
        loop {
            let mut m = next_miss()?;
            let named = (m.leaf.page, m.leaf.pid, m.leaf.token);
            if let Some(i) = self.pages.iter().position(|p| *p == named) {
                m.buf = i;
                self.misses.push(m);
                continue;
            }
            m.buf = self.pages.len();
            self.pages.push(named);
            self.misses.push(m);
            return Some(named.0);
        }
    }
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
        let mut walk = Walk {
            keys,
            space,
            done: 0,
            wave: Vec::with_capacity(WAVE),
            probed: 0,
            alone: Vec::new(),
        };
        match self.storage().store() {
            Some(store) => {
                let mut bufs = BUFS.with(|b| std::mem::take(&mut *b.borrow_mut()));
                bufs.retain(|b| b.len() == self.page_size());
                let mut batch = Batch::default();
                // The buffers grow with the misses, so a thread whose keys the cache
                // answers keeps few: a read that took all it was offered offers twice as
                // many next time, up to `BATCH`.
                let mut cap = bufs.len().clamp(FIRST_BUFS, BATCH);
                loop {
                    // At most one page per key left.
                    let left = keys.len() - walk.done + walk.wave.len() - walk.probed;
                    let want = left.min(cap);
                    if want == 0 {
                        break;
                    }
                    if bufs.len() < cap {
                        bufs.resize_with(cap, || PageBuf::new(self.page_size()));
                    }
                    batch.start();
                    let before = (walk.done, walk.probed);
                    let read = store
                        .read_streamed(&mut bufs[..want], &mut || {
                            batch.next_page(|| self.next_miss(&mut walk, &mut out))
                        })
                        .is_ok();
                    // A read that failed, or took no key, may do so again: the rest is
                    // looked up key by key, so the call always ends.
                    let stuck = !read || (walk.done, walk.probed) == before;
                    for m in batch.misses.drain(..) {
                        self.counters().count(Event::CacheMiss);
                        let answer = read.then(|| self.answer_from(&m, &bufs[m.buf]));
                        out[m.at] = Some(answer.flatten().unwrap_or_else(|| self.get(&m.key)));
                    }
                    if stuck {
                        while let Some(m) = self.next_miss(&mut walk, &mut out) {
                            self.counters().count(Event::CacheMiss);
                            out[m.at] = Some(self.get(&m.key));
                        }
                    }
                    if walk.finished() {
                        break;
                    }
                    if batch.pages.len() == cap {
                        cap = (cap * 2).min(BATCH);
                    }
                }
                bufs.truncate(BATCH);
                BUFS.with(|b| *b.borrow_mut() = bufs);
            }
            // Nothing is on a disk: every miss is looked up on its own.
            None => {
                while let Some(m) = self.next_miss(&mut walk, &mut out) {
                    self.counters().count(Event::CacheMiss);
                    out[m.at] = Some(self.get(&m.key));
                }
            }
        }
        for (at, key) in walk.alone {
            out[at] = Some(self.get(&key));
        }
        self.finish(space, keys, out)
    }

    /// Probes `walk`'s keys in turn, answering in `out` those the cache decides, up to the
    /// next whose leaf's disk page decides it. Does no I/O: a key with merge operands
    /// pending is set aside in `walk.alone`, for a lookup of its own after the batches.
    fn next_miss<K: AsRef<[u8]>>(
        &self,
        walk: &mut Walk<'_, K>,
        out: &mut [Option<Result<Option<Vec<u8>>>>],
    ) -> Option<Miss> {
        loop {
            if walk.probed == walk.wave.len() {
                if walk.done == walk.keys.len() {
                    return None;
                }
                walk.next_wave(self, out);
                self.prefetch_leaves(&walk.wave);
                continue;
            }
            let (at, key) = &walk.wave[walk.probed];
            walk.probed += 1;
            match self.probe(key) {
                Probe::Answer(answer) => out[*at] = Some(answer),
                Probe::Alone => walk.alone.push((*at, key.to_vec())),
                Probe::Disk(leaf) => {
                    return Some(Miss {
                        at: *at,
                        key: key.to_vec(),
                        leaf,
                        buf: 0,
                    })
                }
            }
        }
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

#[cfg(test)]
mod tests {
    use super::{Batch, Miss, Noted};

    fn miss(at: usize, page: u64, pid: u32, token: u64) -> Miss {
        Miss {
            at,
            key: vec![at as u8],
            leaf: Noted {
                pid,
                page,
                token,
                bounds: (None, None),
            },
            buf: usize::MAX,
        }
    }

    /// A miss shares a page already named only when it noted the same leaf and write token;
    /// a page number noted for another leaf or token is read again, into its own buffer.
    #[test]
    fn a_batch_shares_a_read_only_for_the_same_leaf_and_token() {
        let mut batch = Batch::default();
        let mut misses = vec![
            miss(0, 10, 1, 5),
            miss(1, 10, 1, 5),
            miss(2, 11, 2, 5),
            miss(3, 10, 1, 6),
            miss(4, 10, 3, 5),
            miss(5, 11, 2, 5),
        ]
        .into_iter();
        let mut named = Vec::new();
        while let Some(page) = batch.next_page(|| misses.next()) {
            named.push(page);
        }
        assert_eq!(named, [10, 11, 10, 10]);
        let bufs: Vec<(usize, usize)> = batch.misses.iter().map(|m| (m.at, m.buf)).collect();
        assert_eq!(bufs, [(0, 0), (1, 0), (2, 1), (3, 2), (4, 3), (5, 1)]);
        batch.start();
        assert!(batch.misses.is_empty() && batch.next_page(|| None).is_none());
    }
}
