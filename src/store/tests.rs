//! One test suite over [`PageStore`], run against every backend (the file store's own tests
//! are in `tests_file.rs`, the fault-injecting store's in `tests_fault.rs`, the `io_uring`
//! path itself in `uring_tests.rs`).

use crate::sys::FileAt;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64 as StdAtomicU64, Ordering as StdOrdering};

use super::*;
use crate::error::Error;
use crate::sync::{thread, Arc};

pub(super) const P: usize = 4096;

/// How the suite makes, reopens and damages one kind of store.
pub(super) trait Harness {
    /// The store type.
    type S: PageStore;
    /// A fresh, empty store.
    fn make(&self) -> Self::S;
    /// Closes `s` and opens it again (`None` for a store that does not persist).
    fn reopen(&self, s: Self::S) -> Option<Result<Self::S>>;
    /// Applies `f` to the stored bytes of `page`, behind the store's back.
    fn damage(&self, s: &Self::S, page: PageNo, f: &dyn Fn(&mut [u8]));
}

struct Mem;
impl Harness for Mem {
    type S = MemStore;
    fn make(&self) -> MemStore {
        MemStore::new(P)
    }
    fn reopen(&self, _: MemStore) -> Option<Result<MemStore>> {
        None
    }
    fn damage(&self, s: &MemStore, page: PageNo, f: &dyn Fn(&mut [u8])) {
        s.raw_page(page, f);
    }
}

struct Fault;
impl Harness for Fault {
    type S = FaultStore;
    fn make(&self) -> FaultStore {
        FaultStore::new(P)
    }
    fn reopen(&self, s: FaultStore) -> Option<Result<FaultStore>> {
        let image = s.crash_image();
        Some(match image.open_error() {
            Some(e) => Err(e),
            None => Ok(image),
        })
    }
    fn damage(&self, s: &FaultStore, page: PageNo, f: &dyn Fn(&mut [u8])) {
        s.modify_page(page, f);
    }
}

pub(super) struct Files {
    dir: tempfile::TempDir,
    backend: Backend,
    next: StdAtomicU64,
}
impl Files {
    pub(super) fn new(backend: Backend) -> Files {
        Files {
            dir: tempfile::tempdir().unwrap(),
            backend,
            next: StdAtomicU64::new(0),
        }
    }
}
impl Harness for Files {
    type S = FileStore;
    fn make(&self) -> FileStore {
        let n = self.next.fetch_add(1, StdOrdering::Relaxed);
        FileStore::open(&self.dir.path().join(format!("data{n}")), P, self.backend).unwrap()
    }
    fn reopen(&self, s: FileStore) -> Option<Result<FileStore>> {
        let path: PathBuf = s.path().to_path_buf();
        drop(s);
        Some(FileStore::open(&path, P, self.backend))
    }
    fn damage(&self, s: &FileStore, page: PageNo, f: &dyn Fn(&mut [u8])) {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(s.path())
            .unwrap();
        let mut bytes = vec![0; P];
        let offset = page * P as u64;
        let n = file.read_at(&mut bytes, offset).unwrap();
        bytes[n..].fill(0);
        f(&mut bytes);
        file.write_all_at(&bytes, offset).unwrap();
        file.sync_all().unwrap();
    }
}

/// A page whose payload is derived from `seed`.
pub(super) fn pattern(seed: u64) -> PageBuf {
    let mut buf = PageBuf::new(P);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in buf[STORE_RESERVED..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    buf
}

pub(super) fn assert_payload(buf: &PageBuf, seed: u64) {
    assert!(
        buf[STORE_RESERVED..] == pattern(seed)[STORE_RESERVED..],
        "payload of seed {seed}"
    );
}

pub(super) fn assert_corrupt(r: Result<()>, page: PageNo) {
    match r {
        Err(Error::Corruption { page: Some(p), .. }) => assert_eq!(p, page),
        other => panic!("expected corruption at page {page}, got {other:?}"),
    }
}

fn round_trip<H: Harness>(h: &H) {
    let s = h.make();
    assert_eq!(s.page_size(), P);
    let pages: Vec<PageNo> = (0..10).map(|_| s.allocate().unwrap()).collect();
    assert!(pages.iter().all(|&p| p >= FIRST_DATA_PAGE));
    for (i, &p) in pages.iter().enumerate() {
        s.write(p, &mut pattern(i as u64)).unwrap();
    }
    s.write(pages[3], &mut pattern(99)).unwrap();
    let mut buf = PageBuf::new(P);
    for (i, &p) in pages.iter().enumerate() {
        s.read(p, &mut buf).unwrap();
        assert_payload(&buf, if i == 3 { 99 } else { i as u64 });
    }
    let st = s.stats();
    assert_eq!((st.reads, st.writes, st.allocated_pages), (10, 11, 10));
    // Never written, reserved, beyond the end, wrong buffer size.
    let fresh = s.allocate().unwrap();
    assert_corrupt(s.read(fresh, &mut buf), fresh);
    assert_corrupt(s.read(0, &mut buf), 0);
    assert_corrupt(s.write(1, &mut buf), 1);
    assert_corrupt(s.read(fresh + 1, &mut buf), fresh + 1);
    let mut small = PageBuf::new(P / 2);
    assert!(matches!(
        s.read(pages[0], &mut small),
        Err(Error::InvalidConfig { .. })
    ));
}

fn batches<H: Harness>(h: &H) {
    let s = h.make();
    let pages: Vec<PageNo> = (0..300).map(|_| s.allocate().unwrap()).collect();
    let mut bufs: Vec<PageBuf> = pages.iter().map(|&p| pattern(p * 7)).collect();
    s.write_batch(&pages, &mut bufs).unwrap();
    let order: Vec<PageNo> = pages.iter().rev().step_by(3).copied().collect();
    let mut out: Vec<PageBuf> = order.iter().map(|_| PageBuf::new(P)).collect();
    s.read_batch(&order, &mut out).unwrap();
    for (&p, buf) in order.iter().zip(&out) {
        assert_payload(buf, p * 7);
    }
    assert!(s.read_batch(&order, &mut out[1..]).is_err());
    s.read_batch(&[], &mut []).unwrap();
    // One bad page fails the whole batch, and names that page.
    let bad = s.allocate().unwrap();
    let mut two = [PageBuf::new(P), PageBuf::new(P)];
    assert_corrupt(s.read_batch(&[pages[0], bad], &mut two), bad);
}

/// `read_streamed`: the k-th page named lands in the k-th buffer, naming stops once every
/// buffer is taken, and a bad page, a refused page or a wrong buffer fails the read.
fn streamed<H: Harness>(h: &H) {
    let s = h.make();
    let pages: Vec<PageNo> = (0..40).map(|_| s.allocate().unwrap()).collect();
    let mut bufs: Vec<PageBuf> = pages.iter().map(|&p| pattern(p * 5)).collect();
    s.write_batch(&pages, &mut bufs).unwrap();
    let order: Vec<PageNo> = pages.iter().rev().step_by(2).copied().collect();
    let mut out: Vec<PageBuf> = (0..32).map(|_| PageBuf::new(P)).collect();
    let (mut named, mut asked) = (order.iter().copied(), 0);
    let reads = s.stats().reads;
    let n = s
        .read_streamed(&mut out, &mut || {
            asked += 1;
            named.next()
        })
        .unwrap();
    assert_eq!((n, asked), (20, 21), "every page named, then one `None`");
    assert_eq!(s.stats().reads - reads, 20);
    for (&p, buf) in order.iter().zip(&out) {
        assert_payload(buf, p * 5);
    }
    // More pages than buffers: naming stops at the last buffer.
    let mut named = pages.iter().copied();
    let n = s
        .read_streamed(&mut out[..7], &mut || named.next())
        .unwrap();
    assert_eq!((n, named.next()), (7, Some(pages[7])));
    for (&p, buf) in pages.iter().zip(&out[..7]) {
        assert_payload(buf, p * 5);
    }
    assert_eq!(s.read_streamed(&mut out, &mut || None).unwrap(), 0);
    // A page never written, a page beyond the end, a buffer of another size.
    let bad = s.allocate().unwrap();
    let mut named = [pages[0], bad].into_iter();
    assert_corrupt(
        s.read_streamed(&mut out, &mut || named.next()).map(drop),
        bad,
    );
    let mut named = [pages[0], bad + 1].into_iter();
    assert!(s.read_streamed(&mut out, &mut || named.next()).is_err());
    let mut odd = [PageBuf::new(P), PageBuf::new(P / 2)];
    let mut named = pages.iter().copied();
    assert!(s.read_streamed(&mut odd, &mut || named.next()).is_err());
}

fn detects_damage<H: Harness>(h: &H) {
    let s = h.make();
    let a = s.allocate().unwrap();
    let b = s.allocate().unwrap();
    let mut buf = PageBuf::new(P);
    // A flipped byte anywhere: checksum, marker, payload start and end.
    for at in [0, 2, 5, 7, STORE_RESERVED, 1000, P - 1] {
        s.write(a, &mut pattern(1)).unwrap();
        h.damage(&s, a, &|bytes: &mut [u8]| bytes[at] ^= 0x10);
        assert_corrupt(s.read(a, &mut buf), a);
    }
    // A torn write: the new first half over the old second half.
    s.write(a, &mut pattern(1)).unwrap();
    let newer = {
        let mut n = pattern(2);
        page::stamp(a, page::Kind::Data, &mut n);
        n
    };
    h.damage(&s, a, &|bytes: &mut [u8]| {
        bytes[..P / 2].copy_from_slice(&newer[..P / 2]);
    });
    assert_corrupt(s.read(a, &mut buf), a);
    // A page copied to the wrong place.
    s.write(a, &mut pattern(3)).unwrap();
    s.write(b, &mut pattern(4)).unwrap();
    let mut image = PageBuf::new(P);
    h.damage(&s, a, &|bytes: &mut [u8]| {
        image.clone().copy_from_slice(bytes);
    });
    let copied = std::sync::Mutex::new(Vec::new());
    h.damage(&s, a, &|bytes: &mut [u8]| {
        *copied.lock().unwrap() = bytes.to_vec();
    });
    let copied = copied.into_inner().unwrap();
    h.damage(&s, b, &|bytes: &mut [u8]| bytes.copy_from_slice(&copied));
    assert_corrupt(s.read(b, &mut buf), b);
    s.read(a, &mut image).unwrap();
    assert_payload(&image, 3);
}

fn allocation<H: Harness>(h: &H) {
    let s = h.make();
    let pages: Vec<PageNo> = (0..20).map(|_| s.allocate().unwrap()).collect();
    let file_pages = s.stats().file_pages;
    assert_eq!(file_pages, FIRST_DATA_PAGE + 20);
    let freed: BTreeSet<PageNo> = pages.iter().step_by(3).copied().collect();
    for &p in &freed {
        s.free(p).unwrap();
    }
    assert_eq!(s.stats().free_pages, freed.len() as u64);
    let again: BTreeSet<PageNo> = freed.iter().map(|_| s.allocate().unwrap()).collect();
    assert_eq!(again, freed);
    assert_eq!(
        s.stats().file_pages,
        file_pages,
        "the file grew while free pages existed"
    );
    assert_eq!(s.allocate().unwrap(), file_pages);
    // Double free, reserved pages, beyond the end.
    s.free(pages[1]).unwrap();
    assert_corrupt(s.free(pages[1]), pages[1]);
    assert_corrupt(s.free(0), 0);
    assert_corrupt(s.free(1), 1);
    assert_corrupt(s.free(file_pages + 5), file_pages + 5);
    // set_free_pages replaces the set and validates it.
    s.set_free_pages(vec![pages[4], pages[2]]).unwrap();
    assert_eq!(s.stats().free_pages, 2);
    assert!(s.set_free_pages(vec![pages[4], pages[4]]).is_err());
    assert!(s.set_free_pages(vec![0]).is_err());
    assert_eq!(
        s.stats().free_pages,
        2,
        "a rejected set changed the free list"
    );
    assert_eq!(s.allocate().unwrap(), pages[2]);
}

fn persistence<H: Harness>(h: &H) {
    let s = h.make();
    // More free pages than a superblock holds inline, so the free-list chain is used.
    let pages: Vec<PageNo> = (0..1500).map(|_| s.allocate().unwrap()).collect();
    let kept: Vec<PageNo> = pages.iter().step_by(2).copied().collect();
    for &p in &kept {
        s.write(p, &mut pattern(p)).unwrap();
    }
    for &p in pages.iter().skip(1).step_by(2) {
        s.free(p).unwrap();
    }
    s.sync().unwrap();
    let before = s.stats();
    let Some(s) = h.reopen(s) else { return };
    let s = s.unwrap();
    let after = s.stats();
    assert_eq!(after.file_pages, before.file_pages);
    assert_eq!(after.free_pages, before.free_pages);
    assert_eq!(after.allocated_pages, before.allocated_pages);
    assert!(
        after.free_pages >= 745,
        "chain pages come from the free list: {after:?}"
    );
    let mut buf = PageBuf::new(P);
    for &p in &kept {
        s.read(p, &mut buf).unwrap();
        assert_payload(&buf, p);
    }
    let odd: BTreeSet<PageNo> = pages.iter().skip(1).step_by(2).copied().collect();
    for _ in 0..after.free_pages {
        assert!(odd.contains(&s.allocate().unwrap()));
    }
    assert_eq!(s.stats().file_pages, after.file_pages);
    // A second sync writes the other slot; both generations reopen.
    s.sync().unwrap();
    let s = h.reopen(s).unwrap().unwrap();
    assert_eq!(s.stats().free_pages, 0);
    assert_eq!(s.stats().file_pages, after.file_pages);
}

fn torn_superblock<H: Harness>(h: &H) {
    let s = h.make();
    let a = s.allocate().unwrap();
    s.write(a, &mut pattern(5)).unwrap();
    s.sync().unwrap();
    let old = s.stats();
    for _ in 0..10 {
        s.allocate().unwrap();
    }
    s.free(a).unwrap();
    s.sync().unwrap();
    // Tear whichever slot is newer: the open must fall back to the older one.
    let seq = |slot: PageNo| {
        let out = StdAtomicU64::new(0);
        h.damage(&s, slot, &|b: &mut [u8]| {
            out.store(page::get_u64(b, 24), StdOrdering::Relaxed);
        });
        out.into_inner()
    };
    let newer = u64::from(seq(0) <= seq(1));
    // A tear whose lost part differs from what was intended: the page count field.
    h.damage(&s, newer, &|b: &mut [u8]| b[32] ^= 0xFF);
    let Some(s) = h.reopen(s) else { return };
    let s = s.unwrap();
    assert_eq!(s.stats().file_pages, old.file_pages);
    assert_eq!(s.stats().free_pages, 0);
    let mut buf = PageBuf::new(P);
    s.read(a, &mut buf).unwrap();
    assert_payload(&buf, 5);
    // Both slots damaged: nothing to open.
    h.damage(&s, 0, &|b: &mut [u8]| b[100] ^= 1);
    h.damage(&s, 1, &|b: &mut [u8]| b[100] ^= 1);
    assert!(matches!(h.reopen(s), Some(Err(Error::Corruption { .. }))));
}

fn concurrent<H: Harness>(h: &H) {
    let s = Arc::new(h.make());
    let handles: Vec<_> = (0..6u64)
        .map(|t| {
            let s = s.clone();
            thread::spawn(move || {
                let mut mine = BTreeMap::new();
                let mut buf = PageBuf::new(P);
                for round in 0..40u64 {
                    let p = s.allocate().unwrap();
                    let seed = t << 32 | round;
                    s.write(p, &mut pattern(seed)).unwrap();
                    mine.insert(p, seed);
                    // Re-check everything so far, one by one and as a batch.
                    for (&q, &seed) in mine.iter().take(8) {
                        s.read(q, &mut buf).unwrap();
                        assert_payload(&buf, seed);
                    }
                    let qs: Vec<PageNo> = mine.keys().copied().collect();
                    let mut bufs: Vec<PageBuf> = qs.iter().map(|_| PageBuf::new(P)).collect();
                    s.read_batch(&qs, &mut bufs).unwrap();
                    for (q, b) in qs.iter().zip(&bufs) {
                        assert_payload(b, mine[q]);
                    }
                    if round % 10 == 9 {
                        let (&q, _) = mine.iter().next().unwrap();
                        mine.remove(&q);
                        s.free(q).unwrap();
                    }
                }
                mine
            })
        })
        .collect();
    let all: Vec<BTreeMap<PageNo, u64>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let mut buf = PageBuf::new(P);
    let mut seen = BTreeSet::new();
    for (&p, &seed) in all.iter().flatten() {
        assert!(seen.insert(p), "page {p} handed to two threads");
        s.read(p, &mut buf).unwrap();
        assert_payload(&buf, seed);
    }
}

/// The whole suite for one backend.
fn suite<H: Harness>(h: &H) {
    round_trip(h);
    batches(h);
    streamed(h);
    detects_damage(h);
    allocation(h);
    persistence(h);
    torn_superblock(h);
    concurrent(h);
}

#[test]
fn suite_mem() {
    suite(&Mem);
}

#[test]
fn suite_fault() {
    suite(&Fault);
}

#[test]
fn suite_file_pread() {
    suite(&Files::new(Backend::Pread));
}

#[cfg(target_os = "linux")]
#[test]
fn suite_file_io_uring() {
    suite(&Files::new(Backend::IoUring));
}

#[cfg(not(target_os = "linux"))]
#[test]
fn io_uring_is_invalid_config_off_linux() {
    let dir = tempfile::tempdir().unwrap();
    let r = FileStore::open(&dir.path().join("d"), P, Backend::IoUring);
    assert!(matches!(r, Err(Error::InvalidConfig { .. })));
}
