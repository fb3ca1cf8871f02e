//! Real-thread stress: threads remap, read, write, copy and evict pages of one small pool
//! at once, checking that no mini-page is ever torn or overwritten by another block.

use std::time::{Duration, Instant};

use super::*;
use crate::sync::AtomicU64;

const PAGES: u32 = 64;

/// Fills `bytes` with the pattern of (`pid`, `byte`): the id, then `byte` everywhere else.
fn stamp(bytes: &mut [u8], pid: PageId, byte: u8) {
    bytes[..4].copy_from_slice(&pid.to_le_bytes());
    bytes[4..].fill(byte);
}

/// Panics unless `bytes` holds a pattern of `pid`.
fn check(bytes: &[u8], pid: PageId) {
    assert_eq!(
        bytes[..4],
        pid.to_le_bytes(),
        "a block of page {pid} holds another page's bytes"
    );
    let b = bytes[4];
    assert!(bytes[4..].iter().all(|&x| x == b), "page {pid} is torn");
}

fn run(threads: usize, secs: u64, capacity: usize) {
    let pool = BufferPool::new(capacity, 10).unwrap();
    let pids: Vec<PageId> = (0..PAGES)
        .map(|i| {
            pool.insert_page(Location::Disk(i.into()))
                .expect("page id")
                .page_id()
        })
        .collect();
    let next_disk = AtomicU64::new(1 << 20);
    let deadline = Instant::now() + Duration::from_secs(secs);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (pool, pids, next_disk) = (&pool, &pids, &next_disk);
            s.spawn(move || {
                let mut rng = 0x9E37_79B9_7F4A_7C15_u64 ^ ((t as u64 + 1) * 0x1234_5678);
                let mut evict = |g: &mut EvictGuard<'_, '_>, bytes: &[u8]| -> Result<()> {
                    check(bytes, g.page_id());
                    g.set_location_disk(next_disk.fetch_add(1, Ordering::Relaxed));
                    Ok(())
                };
                let mut ops = 0u64;
                while Instant::now() < deadline {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let pid = pids[(rng % u64::from(PAGES)) as usize];
                    match (rng >> 8) % 8 {
                        0..=2 => {
                            let r = pool.read(pid);
                            if let Some(m) = r.mini() {
                                check(m, pid);
                            }
                        }
                        3 => {
                            let mut w = pool.write(pid);
                            if let Some(m) = w.mini_mut() {
                                check(m, pid);
                                stamp(m, pid, rng as u8);
                            }
                        }
                        4..=6 => {
                            // Grow, shrink or copy to the tail: the tree's read-copy-update.
                            let size = 64 << ((rng >> 16) % 7);
                            let block = loop {
                                match pool.alloc(size, pid) {
                                    Some(b) => break b,
                                    None => {
                                        let _ = pool.evict_one(&mut evict).unwrap();
                                    }
                                }
                            };
                            let mut block = block;
                            stamp(block.bytes_mut(), pid, rng as u8);
                            let mut w = pool.write(pid);
                            if let Some(m) = w.mini() {
                                check(m, pid);
                            }
                            if let Some(old) = w.set_mini(block) {
                                check(old.bytes(), pid);
                                pool.dealloc(old);
                            }
                        }
                        _ => {
                            let _ = pool.evict_one(&mut evict).unwrap();
                        }
                    }
                    ops += 1;
                }
                assert!(ops > 1000, "thread {t} made only {ops} operations");
            });
        }
    });
    let a = pool.audit();
    let s = pool.stats();
    assert_eq!(a.live_bytes, s.bytes_in_use, "{a:?} {s:?}");
    let mapped: u64 = pids
        .iter()
        .filter_map(|&p| pool.read(p).mini().map(|m| m.len() as u64 + 8))
        .sum();
    assert_eq!(
        mapped, a.live_bytes,
        "a live block is not mapped by any page"
    );
    assert!(s.evictions > 0 && s.allocs_free_list > 0, "{s:?}");
    let mut drain = |g: &mut EvictGuard<'_, '_>, b: &[u8]| -> Result<()> {
        check(b, g.page_id());
        g.set_location_disk(1);
        Ok(())
    };
    while pool.evict_one(&mut drain).unwrap() == Evicted::Progress {}
    assert_eq!(pool.stats().ring_bytes, 0);
}

#[test]
fn stress_two_threads() {
    run(2, 2, 256 << 10);
}

#[test]
fn stress_four_threads() {
    run(4, 2, 256 << 10);
}

#[test]
fn stress_locks_exclude_writers() {
    let pool = BufferPool::new(MIN_POOL_SIZE, 0).unwrap();
    let pid = pool
        .insert_page(Location::Disk(0))
        .expect("page id")
        .page_id();
    let inside = AtomicU64::new(0);
    let deadline = Instant::now() + Duration::from_secs(2);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (pool, inside) = (&pool, &inside);
            s.spawn(move || {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    n += 1;
                    if (n + t).is_multiple_of(3) {
                        let _w = pool.write(pid);
                        assert_eq!(inside.fetch_add(1 << 32, Ordering::SeqCst), 0);
                        inside.fetch_sub(1 << 32, Ordering::SeqCst);
                    } else {
                        let r = pool.read(pid);
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst) >> 32, 0);
                        inside.fetch_sub(1, Ordering::SeqCst);
                        if let Ok(_w) = r.try_upgrade() {
                            assert_eq!(inside.fetch_add(1 << 32, Ordering::SeqCst), 0);
                            inside.fetch_sub(1 << 32, Ordering::SeqCst);
                        }
                    }
                }
            });
        }
    });
}
