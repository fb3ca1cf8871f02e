//! Model-checked interleavings (shuttle): concurrent alloc / dealloc / copy-to-tail / evict
//! (one block, or a batch) with content checks and a final walk proving every freed byte is passed by the head; the
//! entry lock's writer exclusion, including upgrades; and optimistic reads racing writers.

use super::*;
use crate::sync::{thread, Arc, AtomicU64};

/// Writes the pattern of (`pid`, `byte`).
fn stamp(bytes: &mut [u8], pid: PageId, byte: u8) {
    bytes[..4].copy_from_slice(&pid.to_le_bytes());
    bytes[4..].fill(byte);
}

/// Panics unless `bytes` is an untorn pattern of `pid`.
fn check(bytes: &[u8], pid: PageId) {
    assert_eq!(
        bytes[..4],
        pid.to_le_bytes(),
        "a block of page {pid} holds another's bytes"
    );
    assert!(
        bytes[4..].iter().all(|&x| x == bytes[4]),
        "page {pid} is torn"
    );
}

/// The callback every evictor uses: verify, then detach to a dummy page. (It cannot fail,
/// but eviction callbacks return a `Result`.)
#[allow(clippy::unnecessary_wraps)]
fn evict_checked(g: &mut EvictGuard<'_, '_>, bytes: &[u8]) -> Result<()> {
    check(bytes, g.page_id());
    g.set_location_disk(u64::from(g.page_id()) + 100);
    Ok(())
}

/// Makes room: one block at a time, or (odd `seed`) a run of two whose owners are read
/// between the claims and the evictions, as an evictor's batched write-back does.
fn evict(pool: &BufferPool, seed: u64) -> Evicted {
    if seed.is_multiple_of(2) {
        return pool.evict_one(&mut evict_checked).unwrap();
    }
    let mut prepare = |owners: &[PageId]| {
        for &pid in owners {
            if let Some(m) = pool.read(pid).mini() {
                check(m, pid);
            }
        }
    };
    pool.evict_batch(2, &mut prepare, &mut evict_checked)
        .unwrap()
}

/// One thread's work on the shared pool: remaps (possibly a copy-to-tail), reads, evicts.
fn worker(pool: &BufferPool, pids: &[PageId], seed: u64) {
    let mut rng = seed;
    for step in 0..4u64 {
        rng = rng
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let pid = pids[((rng >> 33) % pids.len() as u64) as usize];
        match (rng >> 40) % 3 {
            0 => {
                let r = pool.read(pid);
                if let Some(m) = r.mini() {
                    check(m, pid);
                }
            }
            1 => {
                let size = if step % 2 == 0 { 8 << 10 } else { 16 << 10 };
                let mut block = loop {
                    match pool.alloc(size, pid) {
                        Some(b) => break b,
                        None => {
                            let _ = evict(pool, seed);
                        }
                    }
                };
                stamp(block.bytes_mut(), pid, rng as u8);
                let mut w = pool.write(pid);
                if let Some(old) = w.set_mini(block) {
                    check(old.bytes(), pid);
                    pool.dealloc(old);
                }
            }
            _ => {
                // Touching a page near the head copies it to the tail (paper §5.5).
                let mut w = pool.write(pid);
                let Location::Mini(addr) = w.location() else {
                    continue;
                };
                if !pool.is_copy_on_access(addr) {
                    continue;
                }
                let size = w.mini().map_or(64, <[u8]>::len);
                let Some(mut block) = pool.alloc(size, pid) else {
                    continue;
                };
                if let Some(m) = w.mini() {
                    block.bytes_mut().copy_from_slice(m);
                }
                if let Some(old) = w.set_mini(block) {
                    check(old.bytes(), pid);
                }
            }
        }
    }
    let _ = evict(pool, seed);
}

fn pool_scenario() {
    let pool = Arc::new(BufferPool::new(MIN_POOL_SIZE, 30).unwrap());
    let pids: Arc<Vec<PageId>> = Arc::new(
        (0..4)
            .map(|i| {
                pool.insert_page(Location::Disk(i))
                    .expect("page id")
                    .page_id()
            })
            .collect(),
    );
    let handles: Vec<_> = (0..3u64)
        .map(|t| {
            let (pool, pids) = (pool.clone(), pids.clone());
            thread::spawn(move || worker(&pool, &pids, t * 7919 + 17))
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let a = pool.audit();
    assert_eq!(a.live_bytes, pool.stats().bytes_in_use);
    for &pid in pids.iter() {
        if let Some(m) = pool.read(pid).mini() {
            check(m, pid);
        }
    }
    // Every freed byte is reused or passed: draining leaves nothing between head and tail.
    while pool.evict_one(&mut evict_checked).unwrap() == Evicted::Progress {}
    let s = pool.stats();
    assert_eq!(
        (s.ring_bytes, s.bytes_in_use, s.free_listed),
        (0, 0, 0),
        "{s:?}"
    );
}

#[test]
fn shuttle_alloc_dealloc_copy_evict_random() {
    shuttle::check_random(pool_scenario, 300);
}

#[test]
fn shuttle_alloc_dealloc_copy_evict_pct() {
    shuttle::check_pct(pool_scenario, 300, 3);
}

fn lock_scenario() {
    let pool = Arc::new(BufferPool::new(MIN_POOL_SIZE, 0).unwrap());
    let pid = pool
        .insert_page(Location::Disk(0))
        .expect("page id")
        .page_id();
    // Readers count in the low half, writers in the high half.
    let inside = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..3u64)
        .map(|t| {
            let (pool, inside) = (pool.clone(), inside.clone());
            thread::spawn(move || {
                for i in 0..3u64 {
                    match (t + i) % 3 {
                        0 => {
                            let mut w = pool.write(pid);
                            assert_eq!(inside.fetch_add(1 << 32, Ordering::SeqCst), 0);
                            w.set_location_disk(t * 10 + i);
                            inside.fetch_sub(1 << 32, Ordering::SeqCst);
                        }
                        1 => {
                            let r = pool.read(pid);
                            assert_eq!(inside.fetch_add(1, Ordering::SeqCst) >> 32, 0);
                            inside.fetch_sub(1, Ordering::SeqCst);
                            if let Ok(w) = r.try_upgrade() {
                                assert_eq!(inside.fetch_add(1 << 32, Ordering::SeqCst), 0);
                                inside.fetch_sub(1 << 32, Ordering::SeqCst);
                                let r = w.downgrade();
                                assert_eq!(inside.fetch_add(1, Ordering::SeqCst) >> 32, 0);
                                inside.fetch_sub(1, Ordering::SeqCst);
                                drop(r);
                            }
                        }
                        _ => {
                            if let Some(_w) = pool.try_write(pid) {
                                assert_eq!(inside.fetch_add(1 << 32, Ordering::SeqCst), 0);
                                inside.fetch_sub(1 << 32, Ordering::SeqCst);
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert!(pool.try_write(pid).is_some(), "a lock was leaked");
}

#[test]
fn shuttle_entry_lock_excludes_writers() {
    shuttle::check_random(lock_scenario, 1000);
}

#[test]
fn shuttle_entry_lock_excludes_writers_pct() {
    shuttle::check_pct(lock_scenario, 1000, 3);
}

/// One page whose mini-page a writer rewrites in place, moves to new blocks and evicts, while
/// a reader reads it optimistically: every read that validates saw one untorn stamp of the
/// page (the reader's loads are scheduling points, so the model tears copies at will).
fn optimistic_scenario() {
    let pool = Arc::new(BufferPool::new(MIN_POOL_SIZE, 0).unwrap());
    let pid = pool
        .insert_page(Location::Disk(0))
        .expect("page id")
        .page_id();
    let mut first = pool.alloc(64, pid).expect("room");
    stamp(first.bytes_mut(), pid, 0);
    drop(pool.write(pid).set_mini(first));
    let writer = {
        let pool = pool.clone();
        thread::spawn(move || {
            for byte in 1..4u8 {
                match byte {
                    1 => {
                        let mut w = pool.write(pid);
                        stamp(w.mini_mut().expect("mapped"), pid, byte);
                    }
                    2 => {
                        let mut block = pool.alloc(128, pid).expect("room");
                        stamp(block.bytes_mut(), pid, byte);
                        if let Some(old) = pool.write(pid).set_mini(block) {
                            pool.dealloc(old);
                        }
                    }
                    _ => {
                        let _ = pool.evict_one(&mut evict_checked).unwrap();
                    }
                }
            }
        })
    };
    let reader = {
        let pool = pool.clone();
        thread::spawn(move || {
            for _ in 0..3 {
                let Some(read) = pool.read_optimistic(pid) else {
                    continue;
                };
                let Some(block) = read.block() else {
                    continue;
                };
                // Half word by word, half in one copy.
                let mut seen = vec![0u8; block.len()];
                let half = block.len() / 16 * 8;
                for i in 0..half / 8 {
                    seen[i * 8..i * 8 + 8].copy_from_slice(&block.load_word(i).to_ne_bytes());
                }
                block.copy_to(half, &mut seen[half..]);
                if read.validate() {
                    check(&seen, pid);
                }
            }
        })
    };
    writer.join().unwrap();
    reader.join().unwrap();
}

#[test]
fn shuttle_optimistic_reads_validate_only_whole_pages() {
    shuttle::check_random(optimistic_scenario, 1000);
    shuttle::check_pct(optimistic_scenario, 1000, 3);
}
