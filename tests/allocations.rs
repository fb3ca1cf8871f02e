//! Heap allocations on the read paths, counted by a global allocator: a lookup answered
//! from memory with `get_into` allocates nothing, and a scan with `next_ref` allocates
//! nothing per record (only while its buffers grow to a leaf's size, which the next scan
//! on the thread reuses).
//!
//! The counter is per thread, so the tree's background threads do not disturb it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use bfkv::{Config, Tree};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count_one() {
    // `try_with`: a thread being torn down may still free or allocate.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: every call is passed to `System` unchanged; counting touches only a
// thread-local `Cell` with a const initializer, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: the caller's contract for `alloc` is `System::alloc`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: `ptr` came from this allocator, that is from `System`, with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations this thread made while running `f`.
fn allocations_in<R>(f: impl FnOnce() -> R) -> (u64, R) {
    let before = ALLOCATIONS.with(Cell::get);
    let out = f();
    (ALLOCATIONS.with(Cell::get) - before, out)
}

fn key(i: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes());
    k[8..].copy_from_slice(&i.to_be_bytes());
    k
}

fn value(i: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&i.to_le_bytes());
    v
}

const RECORDS: u64 = 100_000;

fn filled(config: Config) -> Tree {
    let tree = Tree::open(config).expect("open");
    for i in 0..RECORDS {
        tree.insert(key(i), value(i)).expect("insert");
    }
    // Some keys overwritten and removed, so nodes hold more than inserts.
    for i in (0..RECORDS).step_by(7) {
        tree.insert(key(i), value(i + 1)).expect("overwrite");
    }
    for i in (0..RECORDS).step_by(11) {
        tree.remove(key(i)).expect("remove");
    }
    tree
}

fn expected(i: u64) -> Option<[u8; 16]> {
    if i.is_multiple_of(11) {
        None
    } else if i.is_multiple_of(7) {
        Some(value(i + 1))
    } else {
        Some(value(i))
    }
}

fn lookups_allocate_nothing(tree: &Tree) {
    let mut buf = Vec::with_capacity(64);
    // One pass to let every thread-local and the epoch registration settle.
    for i in 0..1_000 {
        tree.get_into(key(i), &mut buf).expect("get");
    }
    let (allocations, checked) = allocations_in(|| {
        let mut checked = 0u64;
        for i in 0..RECORDS + 1_000 {
            let found = tree.get_into(key(i), &mut buf).expect("get");
            let want = if i < RECORDS { expected(i) } else { None };
            assert_eq!(found, want.is_some(), "key {i}");
            if let Some(v) = want {
                assert_eq!(buf, v, "key {i}");
            }
            checked += 1;
        }
        checked
    });
    assert_eq!(checked, RECORDS + 1_000);
    assert_eq!(allocations, 0, "allocations in {checked} lookups");
    // The counter counts: `get` returns a vector of its own.
    let (owned, got) = allocations_in(|| tree.get(key(1)).expect("get"));
    assert_eq!(got.as_deref(), expected(1).as_ref().map(|v| &v[..]));
    assert_eq!(owned, 1, "get allocates its value");
}

fn scans_allocate_nothing_per_record(tree: &Tree) {
    let present = (0..RECORDS).filter(|&i| expected(i).is_some()).count() as u64;
    // Short scans, each from a new iterator, grow nothing: count what one costs.
    let (short, ()) = allocations_in(|| {
        let mut scan = tree.range(key(3)..);
        for _ in 0..10 {
            scan.next_ref().expect("record").expect("read");
        }
    });
    // The next iterators on this thread take the buffers the last one left (its records'
    // and leaf's copies, its bounds): once those grew (a leaf's copy is swapped between two
    // of them, so after two scans), a scan allocates nothing.
    let short_scan = || {
        let mut scan = tree.range(key(3)..);
        for _ in 0..10 {
            scan.next_ref().expect("record").expect("read");
        }
    };
    short_scan();
    let (again, ()) = allocations_in(short_scan);
    assert!(
        short > 0 && again == 0,
        "a 10-record scan after another made {again} allocations (the first {short})"
    );
    let (whole, seen) = allocations_in(|| {
        let mut scan = tree.iter();
        let mut seen = 0u64;
        let mut last = Vec::new();
        while let Some(record) = scan.next_ref() {
            let (k, v) = record.expect("scan");
            assert!(k > last.as_slice(), "keys ascend");
            last.clear();
            last.extend_from_slice(k);
            let i = u64::from_be_bytes(k[8..].try_into().expect("8 bytes"));
            assert_eq!(Some(v), expected(i).as_ref().map(|v| &v[..]), "key {i}");
            seen += 1;
        }
        seen
    });
    assert_eq!(seen, present);
    // A whole scan crosses over a thousand leaves; what it allocates beyond a short scan
    // is its buffers growing to the largest leaf, a handful of times.
    assert!(
        whole <= short + 16,
        "a scan of {seen} records made {whole} allocations (a 10-record scan {short})"
    );
    // Backwards too.
    let (back, seen) = allocations_in(|| {
        let mut scan = tree.iter();
        let mut seen = 0u64;
        while let Some(record) = scan.next_back_ref() {
            record.expect("scan");
            seen += 1;
        }
        seen
    });
    assert_eq!(seen, present);
    assert!(back <= short + 16, "a reverse scan made {back} allocations");
    // The counter counts: the owned iterator allocates a key and a value per record.
    let (owned, seen) = allocations_in(|| {
        let mut seen = 0u64;
        for record in tree {
            record.expect("scan");
            seen += 1;
        }
        seen
    });
    assert_eq!(seen, present);
    assert!(
        owned >= 2 * present,
        "{owned} allocations for {present} owned records"
    );
}

#[test]
fn in_memory_reads_allocate_nothing_per_lookup_or_record() {
    let tree = filled(Config::in_memory().cache_size(256 << 20));
    lookups_allocate_nothing(&tree);
    scans_allocate_nothing_per_record(&tree);
}

#[test]
fn cached_reads_of_a_file_backed_tree_allocate_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = filled(Config::new(dir.path()).cache_size(256 << 20));
    // The idle write-back may give any leaf a disk page at any moment, after which a key the
    // mini-page does not hold is read from disk (and the thread's page buffer allocated on
    // first use). So write every leaf back first, then look every key up once: the misses
    // are cached, and then every answer is in memory and no page is read.
    tree.checkpoint().expect("checkpoint");
    let mut buf = Vec::new();
    for i in 0..RECORDS + 1_000 {
        tree.get_into(key(i), &mut buf).expect("get");
    }
    let reads = tree.stats().pages_read;
    lookups_allocate_nothing(&tree);
    assert_eq!(
        tree.stats().pages_read,
        reads,
        "a cached lookup read a page"
    );
    scans_allocate_nothing_per_record(&tree);
    tree.close().expect("close");
}

#[test]
fn scans_reading_leaves_from_disk_allocate_nothing_per_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    // No promotion: a scan keeping a leaf it read as a mirror builds that mirror (a cache
    // admission, measured with the cache, not with the scan).
    let tree = filled(
        Config::new(dir.path())
            .cache_size(1 << 20)
            .promotion_percent(0),
    );
    tree.checkpoint().expect("checkpoint");
    // Most leaves are on disk now; a scan reads them and overlays what is cached.
    scans_allocate_nothing_per_record(&tree);
    tree.close().expect("close");
}
