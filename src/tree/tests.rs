//! Tree-core tests that need the internals: the structure checker after every operation.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{Config, Tree};

fn key(rng: &mut StdRng) -> Vec<u8> {
    let prefix = ["", "p/", "tenant-0042/orders/aaaaaaaaaaaaaaaaaaaaaa/"][rng.gen_range(0..3)];
    format!("{prefix}{:x}", rng.gen_range(0..2048u32)).into_bytes()
}

fn checked_workload(seed: u64, ops: usize, cache: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = Tree::open(Config::new(dir.path()).cache_size(cache)).expect("open");
    let mut model = BTreeMap::new();
    let mut rng = StdRng::seed_from_u64(seed);
    for op in 0..ops {
        let k = key(&mut rng);
        let before = tree.stats();
        let roll = rng.gen_range(0..10);
        match roll {
            0..=5 => {
                let v = vec![op as u8; rng.gen_range(0..400)];
                tree.insert(&k, &v).expect("insert");
                model.insert(k.clone(), v);
            }
            6..=7 => {
                tree.remove(&k).expect("remove");
                model.remove(&k);
            }
            _ => assert_eq!(
                tree.get(&k).expect("get").as_ref(),
                model.get(&k),
                "seed {seed} op {op}"
            ),
        }
        if let Err(e) = tree.shared.check_structure() {
            panic!(
                "seed {seed} op {op} (roll {roll}, key {:?}): {e}\nbefore {before:?}\nafter {:?}",
                String::from_utf8_lossy(&k),
                tree.stats()
            );
        }
    }
    let all: Vec<_> = tree.iter().map(|r| r.expect("iter")).collect();
    let expected: Vec<_> = model.into_iter().collect();
    assert_eq!(all, expected, "seed {seed}");
}

#[test]
fn structure_holds_after_every_operation_with_a_tiny_cache() {
    for seed in 0..3 {
        checked_workload(seed, 4000, 256 << 10);
    }
}
