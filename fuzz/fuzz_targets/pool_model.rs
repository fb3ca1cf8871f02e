//! The buffer pool against a model: which pages have a mini-page and what bytes it holds.
//! Every read, eviction and final drain must agree with the model; the pool's own walk
//! (`audit`) must find every byte between head and tail in exactly one block.
#![no_main]

use std::collections::HashMap;

use arbitrary::Arbitrary;
use bfkv::internals::PoolHarness;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    /// New mini-page of size class `class` with this pattern (evicting until it fits).
    Remap {
        page: u8,
        class: u8,
        pattern: Vec<u8>,
    },
    /// Copy to the tail if near the head.
    Touch { page: u8 },
    /// Drop the mini-page (merged to disk).
    DropMini { page: u8 },
    /// One eviction, possibly with a failing callback.
    Evict { fail: bool },
    /// Compare one page with the model.
    Read { page: u8 },
}

#[derive(Arbitrary, Debug)]
struct Input {
    capacity_kib: u8,
    second_chance: u8,
    pages: u8,
    ops: Vec<Op>,
}

fn expected(size: usize, pattern: &[u8]) -> Vec<u8> {
    if pattern.is_empty() {
        return vec![0; size];
    }
    pattern.iter().copied().cycle().take(size).collect()
}

fuzz_target!(|input: Input| {
    let capacity = (64 + usize::from(input.capacity_kib)) << 10;
    let Some(pool) = PoolHarness::new(capacity, input.second_chance % 101) else {
        return;
    };
    let pids: Vec<u32> = (0..input.pages % 16 + 1)
        .map(|i| pool.add_page(u64::from(i)).expect("a few pages always get ids"))
        .collect();
    let mut model: HashMap<u32, Vec<u8>> = HashMap::new();
    for op in input.ops.iter().take(400) {
        match op {
            Op::Remap {
                page,
                class,
                pattern,
            } => {
                let pid = pids[usize::from(*page) % pids.len()];
                // Classes up to 28 (8 KiB): several blocks fit in every capacity.
                let class = class % 29;
                let mut tries = 0;
                while !pool.remap(pid, class, pattern) {
                    match pool.evict(false) {
                        Ok(Some((victim, bytes))) => {
                            assert_eq!(model.remove(&victim).as_deref(), Some(&bytes[..]));
                        }
                        Ok(None) => {}
                        Err(()) => unreachable!("eviction without failure failed"),
                    }
                    tries += 1;
                    assert!(tries < 10_000, "the buffer never made room");
                }
                model.insert(pid, expected(PoolHarness::class_size(class), pattern));
            }
            Op::Touch { page } => {
                let pid = pids[usize::from(*page) % pids.len()];
                pool.touch(pid);
            }
            Op::DropMini { page } => {
                let pid = pids[usize::from(*page) % pids.len()];
                pool.drop_mini(pid, 7);
                model.remove(&pid);
            }
            Op::Evict { fail } => match pool.evict(*fail) {
                Ok(Some((victim, bytes))) => {
                    assert!(!fail);
                    assert_eq!(model.remove(&victim).as_deref(), Some(&bytes[..]));
                }
                Ok(None) | Err(()) => {}
            },
            Op::Read { page } => {
                let pid = pids[usize::from(*page) % pids.len()];
                assert_eq!(pool.read(pid), model.get(&pid).cloned());
            }
        }
    }
    for &pid in &pids {
        assert_eq!(pool.read(pid), model.get(&pid).cloned(), "page {pid}");
    }
    pool.audit(&pids);
    pool.drain();
});
