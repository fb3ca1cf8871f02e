//! One test suite over [`PageStore`], run against every backend, plus the backend-specific
//! tests (fault injection, page-size checks; the `io_uring` path itself is in `uring_tests.rs`).

use crate::sys::FileAt;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64 as StdAtomicU64, Ordering as StdOrdering};

use super::*;
use crate::error::Error;
use crate::sync::{thread, Arc};

const P: usize = 4096;

/// How the suite makes, reopens and damages one kind of store.
trait Harness {
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

struct Files {
    dir: tempfile::TempDir,
    backend: Backend,
    next: StdAtomicU64,
}
impl Files {
    fn new(backend: Backend) -> Files {
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
fn pattern(seed: u64) -> PageBuf {
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

fn assert_payload(buf: &PageBuf, seed: u64) {
    assert!(
        buf[STORE_RESERVED..] == pattern(seed)[STORE_RESERVED..],
        "payload of seed {seed}"
    );
}

fn assert_corrupt(r: Result<()>, page: PageNo) {
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

#[test]
fn page_size_is_checked_and_fixed_at_creation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d");
    assert!(matches!(
        FileStore::open(&path, 3000, Backend::Pread),
        Err(Error::InvalidConfig { .. })
    ));
    assert!(matches!(
        FileStore::open(&path, 128 << 10, Backend::Pread),
        Err(Error::InvalidConfig { .. })
    ));
    let s = FileStore::open(&path, 16384, Backend::Pread).unwrap();
    let p = s.allocate().unwrap();
    let mut buf = PageBuf::new(16384);
    buf[16383] = 7;
    s.write(p, &mut buf).unwrap();
    s.sync().unwrap();
    drop(s);
    let r = FileStore::open(&path, 4096, Backend::Pread);
    assert!(matches!(r, Err(Error::InvalidConfig { .. })), "{r:?}");
    let s = FileStore::open(&path, 16384, Backend::Pread).unwrap();
    s.read(p, &mut buf).unwrap();
    assert_eq!(buf[16383], 7);
}

/// `open_keeping_size` takes an existing file's page size, from slot 0 or, when slot 0 is
/// damaged, from slot 1; a new file gets the size given.
#[test]
fn an_existing_file_keeps_its_page_size_even_with_slot_0_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d");
    let s = FileStore::open(&path, 16384, Backend::Pread).unwrap();
    let mut buf = PageBuf::new(16384);
    buf[16383] = 7;
    let p = s.allocate().unwrap();
    s.write(p, &mut buf).unwrap();
    s.sync().unwrap();
    // A second superblock, so that both slots name page `p`.
    let q = s.allocate().unwrap();
    s.write(q, &mut buf).unwrap();
    s.sync().unwrap();
    drop(s);
    let s = FileStore::open_keeping_size(&path, 8192, Backend::Pread).unwrap();
    assert_eq!(s.page_size(), 16384);
    drop(s);
    let pristine = std::fs::read(&path).unwrap();
    // Slot 0's checksum broken (its size field intact), then its size field garbage.
    for (at, flip) in [(100, 0xff), (21, 0x5a)] {
        let mut bytes = pristine.clone();
        bytes[at] ^= flip;
        std::fs::write(&path, &bytes).unwrap();
        let s = FileStore::open_keeping_size(&path, 8192, Backend::Pread).unwrap();
        assert_eq!(s.page_size(), 16384, "byte {at} damaged");
        let mut back = PageBuf::new(16384);
        s.read(p, &mut back).unwrap();
        assert_eq!(back[16383], 7);
    }
    let fresh = FileStore::open_keeping_size(&dir.path().join("e"), 8192, Backend::Pread);
    assert_eq!(fresh.unwrap().page_size(), 8192);
}

/// A data file of the format before keyspaces (bare keys) is refused with a reason that
/// says so, not read as keys of some keyspace.
#[test]
fn a_data_file_of_the_previous_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d");
    drop(FileStore::open(&path, P, Backend::Pread).unwrap());
    let mut bytes = std::fs::read(&path).unwrap();
    for slot in 0..2 {
        let sb = &mut bytes[slot * P..(slot + 1) * P];
        if &sb[8..16] == b"BFKVSTOR" {
            sb[16..20].copy_from_slice(&1u32.to_le_bytes());
            page::stamp(slot as PageNo, page::Kind::Superblock, sb);
        } else {
            sb.fill(0); // never written: the reason comes from the other slot
        }
    }
    std::fs::write(&path, &bytes).unwrap();
    match FileStore::open(&path, P, Backend::Pread) {
        Err(Error::Corruption { reason, .. }) => {
            assert!(reason.contains("before keyspaces"), "{reason}");
        }
        other => panic!("expected Corruption, got {other:?}"),
    }
}

#[test]
fn falls_back_to_buffered_io_where_o_direct_is_refused() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        return;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    // Older kernels' tmpfs refuses O_DIRECT (EINVAL) and the store falls back to buffered
    // I/O; newer ones accept it. Either way the store must work.
    let s = FileStore::open(&dir.path().join("d"), P, Backend::Pread).unwrap();
    let p = s.allocate().unwrap();
    s.write(p, &mut pattern(1)).unwrap();
    let mut buf = PageBuf::new(P);
    s.read(p, &mut buf).unwrap();
    assert_payload(&buf, 1);
}

/// The data file is extended ahead of the pages written (so new pages are written inside
/// it), the store's page count, not the file's length, says which pages exist, and a
/// reopened store neither hands out nor reads the preallocated tail as data.
#[test]
fn the_file_grows_ahead_of_the_pages_in_use() {
    for backend in [Backend::Pread, Backend::IoUring] {
        if backend == Backend::IoUring && !cfg!(target_os = "linux") {
            continue;
        }
        let h = Files::new(backend);
        let s = h.make();
        let mut written = Vec::new();
        for i in 0..300u64 {
            let p = s.allocate().unwrap();
            s.write(p, &mut pattern(i)).unwrap();
            written.push((p, i));
        }
        s.sync().unwrap();
        let len = std::fs::metadata(s.path()).unwrap().len();
        let pages = s.stats().file_pages;
        assert!(
            len >= pages * P as u64,
            "{backend:?}: file shorter than its pages"
        );
        assert_eq!(
            len % super::file::GROW_MIN,
            0,
            "{backend:?}: grown in chunks"
        );
        assert!(len > pages * P as u64, "{backend:?}: nothing preallocated");
        let s = h.reopen(s).unwrap().unwrap();
        assert_eq!(
            s.stats().file_pages,
            pages,
            "{backend:?}: page count from superblock"
        );
        let mut buf = PageBuf::new(P);
        for &(p, i) in &written {
            s.read(p, &mut buf).unwrap();
            assert_payload(&buf, i);
        }
        // A page of the preallocated tail was never written: corrupt, not data.
        assert_corrupt(s.read(pages, &mut buf), pages);
        // New pages continue after the page count, not after the file's end.
        assert_eq!(s.allocate().unwrap(), pages);
    }
}

#[test]
fn fault_nth_write_and_sync_fail_once_with_eio() {
    let s = FaultStore::new(P);
    let pages: Vec<PageNo> = (0..3).map(|_| s.allocate().unwrap()).collect();
    let mut bufs: Vec<PageBuf> = pages.iter().map(|&p| pattern(p)).collect();
    s.fail_nth_write(2);
    let eio = |r: Result<()>| match r {
        Err(Error::Io { source, .. }) => assert!(crate::sys::is_injected_fault(&source)),
        other => panic!("expected EIO, got {other:?}"),
    };
    eio(s.write_batch(&pages, &mut bufs));
    s.write_batch(&pages, &mut bufs).unwrap();
    s.sync().unwrap();
    let image = s.crash_image();
    let mut buf = PageBuf::new(P);
    for &p in &pages {
        image.read(p, &mut buf).unwrap();
        assert_payload(&buf, p);
    }
    // A failed flush is sticky: the data it was to write may be gone, so no later sync may
    // claim it is durable (fsyncgate).
    s.write_batch(&pages, &mut bufs).unwrap();
    s.fail_nth_sync(1);
    eio(s.sync());
    for _ in 0..3 {
        assert!(
            matches!(s.sync(), Err(Error::Io { .. })),
            "a later sync succeeded"
        );
    }
}

#[test]
fn fault_flip_bit_on_read_is_detected_once() {
    let s = FaultStore::new(P);
    let p = s.allocate().unwrap();
    s.write(p, &mut pattern(9)).unwrap();
    s.flip_bit_on_read(p, 8 * 700 + 3);
    let mut buf = PageBuf::new(P);
    assert_corrupt(s.read(p, &mut buf), p);
    s.read(p, &mut buf).unwrap();
    assert_payload(&buf, 9);
}

/// The state a crash image must show: pages → seeds, free pages, file pages.
type State = (BTreeMap<PageNo, u64>, u64, u64);

/// Runs a fixed workload. Returns the state at the last sync that finished with power on,
/// and the state the sync during which power failed was writing (if it failed in one).
fn workload(s: &FaultStore, sync_writes: &mut Vec<(u64, u64)>) -> (State, Option<State>) {
    let mut live = BTreeMap::new();
    let mut durable = (BTreeMap::new(), 0, FIRST_DATA_PAGE);
    let mut pages = Vec::new();
    for step in 0..6u64 {
        for i in 0..[5, 400, 700, 300, 5, 5][step as usize] {
            let p = s.allocate().unwrap();
            s.write(p, &mut pattern(step * 1000 + i)).unwrap();
            live.insert(p, step * 1000 + i);
            pages.push(p);
        }
        // Free every third live page, later every second, so the free list outgrows a
        // superblock and its chain grows at several syncs.
        let stride = if step < 3 { 3 } else { 2 };
        // Oldest pages last: the most recently freed page is then one the durable state uses.
        let doomed: Vec<PageNo> = pages
            .iter()
            .skip(step as usize)
            .step_by(stride)
            .copied()
            .collect();
        for p in doomed.into_iter().rev() {
            if live.remove(&p).is_some() {
                s.free(p).unwrap();
            }
        }
        pages.retain(|p| live.contains_key(p));
        if let Some(&p) = live.keys().next() {
            s.write(p, &mut pattern(step + 77)).unwrap();
            live.insert(p, step + 77);
        }
        let was_on = !s.is_powered_off();
        let before = s.disk_writes();
        s.sync().unwrap();
        sync_writes.push((before, s.disk_writes()));
        let st = s.stats();
        let state = (live.clone(), st.free_pages, st.file_pages);
        if !s.is_powered_off() {
            durable = state;
        } else if was_on {
            // Power failed inside this sync: with a torn superblock write whose lost half
            // equals what was meant, the new state may have made it, whole.
            return (durable, Some(state));
        }
    }
    (durable, None)
}

/// Whether `image` holds the pages of `state`, each as `state` has it or, if `newer` is
/// given, as `newer` has it (the data flush of the sync that power interrupted happened).
/// With `torn`, one page may fail its checksum: the in-place write that power tore.
fn has_pages(image: &FaultStore, state: &State, newer: Option<&State>, torn: bool) -> bool {
    let mut buf = PageBuf::new(P);
    let is = |buf: &PageBuf, seed: u64| buf[STORE_RESERVED..] == pattern(seed)[STORE_RESERVED..];
    let mut damaged = 0;
    for (&p, &seed) in &state.0 {
        match image.read(p, &mut buf) {
            Ok(()) if is(&buf, seed) => {}
            Ok(())
                if newer
                    .and_then(|n| n.0.get(&p))
                    .is_some_and(|&s| is(&buf, s)) => {}
            Err(Error::Corruption { page: Some(q), .. }) if q == p && torn => damaged += 1,
            _ => return false,
        }
    }
    damaged <= 1
}

/// Whether `image` has the allocation state (free and file pages) of `state`.
fn has_counts(image: &FaultStore, state: &State) -> bool {
    let st = image.stats();
    (st.free_pages, st.file_pages) == (state.1, state.2)
}

#[test]
fn fault_power_cut_loses_exactly_the_unsynced_writes() {
    let mut syncs = Vec::new();
    let total = {
        let s = FaultStore::new(P);
        let base = s.disk_writes();
        workload(&s, &mut syncs);
        for (a, b) in &mut syncs {
            (*a, *b) = (*a - base, *b - base);
        }
        s.disk_writes() - base
    };
    assert!(total > 1000 && syncs.len() == 6);
    // A torn cut may destroy the page it overwrites in place (detected, not repaired).
    // Every cut point in and just before each sync, and a stride through the rest.
    let near_sync = |n: u64| syncs.iter().any(|&(a, b)| n + 3 > a && n <= b);
    let cuts = (1..=total).filter(|&n| n % 29 == 0 || n < 8 || near_sync(n));
    for n in cuts {
        for torn in [false, true] {
            let s = FaultStore::new(P);
            s.power_cut_at_write(n, torn);
            let (durable, in_flight) = workload(&s, &mut Vec::new());
            assert!(s.is_powered_off());
            let image = s.crash_image();
            assert!(
                image.open_error().is_none(),
                "cut at write {n}: {:?}",
                image.open_error()
            );
            // A cut inside a sync: the data flush may have happened (new page contents),
            // and a torn superblock write may still be whole (new allocation state).
            let ok = match &in_flight {
                None => has_counts(&image, &durable) && has_pages(&image, &durable, None, torn),
                Some(new) if has_counts(&image, &durable) => {
                    has_pages(&image, &durable, Some(new), torn)
                }
                Some(new) => torn && has_counts(&image, new) && has_pages(&image, new, None, torn),
            };
            assert!(ok, "cut at write {n} (torn: {torn}): {:?}", image.stats());
        }
    }
}
