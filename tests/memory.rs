//! Memory stays bounded by the cache: 2 million records (16-byte keys, 64-byte values, about
//! 160 MB of data) go through a file-backed tree with a 16 MiB cache; resident memory may
//! grow by at most the cache plus 56 MiB (inner nodes, the leaf map, the `Buffered` log's
//! 8 MiB staging file, and what the allocator keeps per thread: here the growth is 58-61
//! MiB in all, and varies by a few MiB from run to run with the threads' timing), and every
//! record reads back.
//!
//! One test in this file on purpose: resident memory is per process, and another test
//! running beside it would be counted too.

use std::time::Instant;

use bfkv::{Config, Tree};

const RECORDS: u64 = 2_000_000;
const CACHE: usize = 16 << 20;
const SLACK: usize = 56 << 20;

/// Resident set size of this process in bytes (`VmRSS` in `/proc/self/status`).
fn rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let kib: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS line");
    kib << 10
}

fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Key of record `i`: a scrambled prefix (so inserts land all over the tree), then `i`.
fn key(i: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&mix(i).to_be_bytes());
    k[8..].copy_from_slice(&i.to_be_bytes());
    k
}

fn value(i: u64) -> [u8; 64] {
    let mut v = [0u8; 64];
    for (j, chunk) in v.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&mix(i ^ ((j as u64) << 56)).to_le_bytes());
    }
    v
}

#[test]
fn two_million_records_fit_a_16_mib_cache_plus_a_small_constant() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = rss();
    let mut peak = base;
    let t0 = Instant::now();
    let tree = Tree::open(Config::new(dir.path()).cache_size(CACHE)).expect("open");
    for i in 0..RECORDS {
        tree.insert(key(i), value(i)).expect("insert");
        if i % 100_000 == 0 {
            peak = peak.max(rss());
        }
    }
    let inserted = t0.elapsed();
    peak = peak.max(rss());

    let t1 = Instant::now();
    let mut seen = vec![false; RECORDS as usize];
    let mut prev: Option<Vec<u8>> = None;
    let mut count = 0u64;
    for (n, item) in tree.iter().enumerate() {
        let (k, v) = item.expect("scan");
        assert_eq!(k.len(), 16, "record {n}: key of {} bytes", k.len());
        let mut idx = [0u8; 8];
        idx.copy_from_slice(&k[8..]);
        let i = u64::from_be_bytes(idx);
        assert!(i < RECORDS && k == key(i), "record {n}: unknown key {k:?}");
        assert_eq!(v, value(i), "record {i}: wrong value");
        assert!(
            prev.as_ref().is_none_or(|p| p < &k),
            "record {n} out of order"
        );
        assert!(!seen[i as usize], "record {i} returned twice");
        seen[i as usize] = true;
        prev = Some(k);
        count += 1;
        if n % 100_000 == 0 {
            peak = peak.max(rss());
        }
    }
    assert_eq!(count, RECORDS, "the scan returned {count} records");
    let scanned = t1.elapsed();

    let t2 = Instant::now();
    for i in (0..RECORDS).step_by(37) {
        assert_eq!(
            tree.get(key(i)).expect("get"),
            Some(value(i).to_vec()),
            "get {i}"
        );
    }
    let got = t2.elapsed();
    peak = peak.max(rss());
    // The bitmap of seen records is the test's own memory, not the tree's.
    let own = seen.capacity();
    let growth = peak.saturating_sub(base).saturating_sub(own);
    let stats = tree.stats();
    eprintln!(
        "rss base {} MiB, peak {} MiB, growth {} MiB (minus {} MiB test bookkeeping); \
         insert {:.1} s, scan {:.1} s, {} gets {:.1} s; {stats:?}",
        base >> 20,
        peak >> 20,
        growth >> 20,
        own >> 20,
        inserted.as_secs_f64(),
        scanned.as_secs_f64(),
        RECORDS / 37 + 1,
        got.as_secs_f64()
    );
    assert!(
        growth < CACHE + SLACK,
        "resident memory grew by {} MiB, limit {} MiB",
        growth >> 20,
        (CACHE + SLACK) >> 20
    );
    tree.close().expect("close");
}
