//! The blocks full-page mirrors made for writes take, and their growth.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::node::{NodeKind, NodeRef};
use crate::pool::PageId;
use crate::tree::index::Seek;
use crate::tree::keyspace::stored_key;
use crate::{Config, Durability, Tree};

fn key(i: u32) -> Vec<u8> {
    format!("k{i:07}").into_bytes()
}

fn value(i: u32) -> Vec<u8> {
    i.to_le_bytes().repeat(4)
}

/// A file-backed tree with a cache of `cache` bytes, holding the keys `0, 2, 4, ...` below
/// `2 * n`, inserted in a random order (leaves about 70 % full).
fn loaded(dir: &std::path::Path, cache: usize, n: u32) -> Tree {
    let config = Config::new(dir)
        .cache_size(cache)
        .durability(Durability::None);
    let tree = Tree::open(config).expect("open");
    let mut order: Vec<u32> = (0..n).map(|i| 2 * i).collect();
    order.shuffle(&mut StdRng::seed_from_u64(7));
    for &i in &order {
        tree.insert(key(i), value(i)).expect("insert");
    }
    tree
}

/// The leaf holding user key `k`, and its cached node's kind and block length.
fn leaf_of(tree: &Tree, k: &[u8]) -> (PageId, Option<(NodeKind, usize)>) {
    let guard = crate::sync::pin();
    let stored = stored_key(k);
    let pid = tree
        .shared()
        .index()
        .descend(&guard, Seek::Key(&stored))
        .leaf();
    let page = tree.shared().pool().read(pid);
    let node = page
        .mini()
        .map(|b| (NodeRef::from_bytes(b).kind(), b.len()));
    (pid, node)
}

/// The block length of every cached full-page mirror.
fn mirror_blocks(tree: &Tree) -> Vec<usize> {
    let pool = tree.shared().pool();
    (0..pool.page_id_limit())
        .filter_map(|pid| {
            let page = pool.read(pid);
            let block = page.mini()?;
            (NodeRef::from_bytes(block).kind() == NodeKind::Leaf).then_some(block.len())
        })
        .collect()
}

fn check(tree: &Tree, keys: impl Iterator<Item = u32>) {
    if let Err(e) = tree.shared().check_structure() {
        panic!("{e}");
    }
    let want: Vec<(Vec<u8>, Vec<u8>)> = keys.map(|i| (key(i), value(i))).collect();
    let got: Vec<(Vec<u8>, Vec<u8>)> = tree.iter().map(|kv| kv.expect("iter")).collect();
    assert_eq!(got, want);
}

#[test]
fn written_mirrors_take_their_size_class_while_every_leaf_fits_the_cache() {
    // About 150 leaves of 8 KiB, whole in 8 MiB.
    let n = 20_000;
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = loaded(dir.path(), 8 << 20, n);
    assert!(tree.shared().caches_whole_leaves());
    let page = tree.page_size();
    let blocks = mirror_blocks(&tree);
    assert!(blocks.len() > 100, "{} mirrors", blocks.len());
    // Page-sized blocks would average a page; leaves filled by random inserts are about
    // 70 % full.
    let mean = blocks.iter().sum::<usize>() / blocks.len();
    assert!(
        mean * 10 < page * 9,
        "mean block {mean} of {} mirrors",
        blocks.len()
    );
    assert!(blocks.iter().all(|&b| b <= page));
    check(&tree, (0..n).map(|i| 2 * i));
}

#[test]
fn written_mirrors_take_a_page_while_the_cache_cannot_hold_every_leaf() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = Config::new(dir.path())
        .cache_size(256 << 10)
        .durability(Durability::None);
    let tree = Tree::open(config).expect("open");
    // Ascending: the last leaf takes every write, stays cached, and splits as it fills.
    let n = 20_000;
    for i in 0..n {
        tree.insert(key(i), value(i)).expect("insert");
    }
    assert!(!tree.shared().caches_whole_leaves());
    let page = tree.page_size();
    assert_eq!(leaf_of(&tree, &key(n - 1)).1, Some((NodeKind::Leaf, page)));
    let blocks = mirror_blocks(&tree);
    assert!(blocks.iter().all(|&b| b == page), "{blocks:?}");
    check(&tree, 0..n);
}

#[test]
fn a_mirror_below_a_page_grows_by_a_quarter_when_a_write_does_not_fit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let n = 20_000;
    let tree = loaded(dir.path(), 8 << 20, n);
    let page = tree.page_size();
    // A leaf whose mirror grows by a quarter and stays below a page.
    let (start, pid, before) = (0..n)
        .map(|i| 2 * i)
        .find_map(|i| match leaf_of(&tree, &key(i)) {
            (pid, Some((NodeKind::Leaf, len))) if len * 5 / 4 < page * 7 / 8 => Some((i, pid, len)),
            _ => None,
        })
        .expect("a mirror with room to grow below a page");
    // Odd keys after `start` land in its leaf until it splits, which it must not do first.
    let mut written = Vec::new();
    let mut next = start + 1;
    let grown = loop {
        tree.insert(key(next), value(next)).expect("insert");
        written.push(next);
        let (now, node) = leaf_of(&tree, &key(start));
        assert_eq!(now, pid, "the leaf split before its mirror grew");
        let (kind, len) = node.expect("the mirror stays cached");
        assert_eq!(kind, NodeKind::Leaf);
        if len != before {
            break len;
        }
        next += 2;
    };
    assert!(
        grown > before && grown < page,
        "{before} -> {grown} after {} writes",
        written.len()
    );
    let mut keys: Vec<u32> = (0..n).map(|i| 2 * i).chain(written).collect();
    keys.sort_unstable();
    check(&tree, keys.into_iter());
}
