//! Ascending inserts fill their leaves: a leaf whose new records all went past its end is
//! cut where it is full, not in half. A sequential load then takes about the pages a
//! random-order one does (cut in half, it took twice as many). Not more: the last leaf has
//! no upper fence, so its records share no prefix and it fills up at about 65 % of what the
//! same records take once it is cut (with a fence on both sides).

use bfkv::{Config, Durability, Tree};
use rand::seq::SliceRandom;
use rand::SeedableRng;

const N: u64 = 300_000;

fn key(i: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[8..].copy_from_slice(&i.to_be_bytes());
    k
}

/// Data pages in use after loading `order` into a fresh tree (on disk, or in memory and
/// then checkpointed into a file-backed tree's pages: `in_memory` picks the mirror path).
fn pages_after_load(order: &[u64], cache: usize) -> u64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = Tree::open(
        Config::new(dir.path())
            .cache_size(cache)
            .durability(Durability::None),
    )
    .expect("open");
    for &i in order {
        tree.insert(key(i), [7u8; 16]).expect("insert");
    }
    tree.checkpoint().expect("checkpoint");
    let pages = tree.stats().disk_pages_in_use;
    tree.close().expect("close");
    let tree = Tree::open(Config::new(dir.path())).expect("reopen");
    for i in (0..N).step_by(997) {
        assert_eq!(
            tree.get(key(i)).expect("get"),
            Some(vec![7u8; 16]),
            "key {i}"
        );
    }
    assert_eq!(tree.iter().count() as u64, N);
    pages
}

#[test]
fn ascending_loads_fill_their_leaves() {
    let ascending: Vec<u64> = (0..N).collect();
    let mut shuffled = ascending.clone();
    shuffled.shuffle(&mut rand::rngs::StdRng::seed_from_u64(5));
    let descending: Vec<u64> = (0..N).rev().collect();
    // Evicted mini-pages merged into leaves (small cache), and full-page mirrors split in
    // memory (a cache that holds everything).
    for cache in [1 << 20, 256 << 20] {
        let asc = pages_after_load(&ascending, cache);
        let random = pages_after_load(&shuffled, cache);
        let desc = pages_after_load(&descending, cache);
        eprintln!("cache {cache}: ascending {asc} pages, random {random}, descending {desc}");
        assert!(
            (asc as f64) < 1.25 * random as f64,
            "cache {cache}: ascending {asc} pages vs random {random}"
        );
    }
}
