//! Single-threaded unit tests of the pool: allocation, free lists, the copy-on-access
//! region, eviction (including failures and wrap-around), the table and its locks.

use std::collections::HashMap;

use super::*;
use crate::error::Error;

/// Largest usable block size (bytes): a 64 KiB leaf.
const MAX_BLOCK: usize = 64 << 10;

/// Gives `pid` a new mini-page of `size` bytes filled with `byte`; the old one is returned.
fn remap(pool: &BufferPool, pid: PageId, size: usize, byte: u8) -> bool {
    let Some(mut b) = pool.alloc(size, pid) else {
        return false;
    };
    b.bytes_mut().fill(byte);
    let mut g = pool.write(pid);
    drop(g.set_mini(b));
    true
}

/// A new page table entry for a leaf on disk page `disk`.
fn page(pool: &BufferPool, disk: u64) -> PageId {
    pool.insert_page(Location::Disk(disk))
        .expect("page id")
        .page_id()
}

/// An eviction callback that stores the bytes in `disk` under a fresh page number.
fn to_disk(
    disk: &mut HashMap<u64, Vec<u8>>,
) -> impl FnMut(&mut EvictGuard<'_, '_>, &[u8]) -> Result<()> + '_ {
    move |g, bytes| {
        let page = disk.len() as u64 + 1000;
        disk.insert(page, bytes.to_vec());
        g.set_location_disk(page);
        Ok(())
    }
}

#[test]
fn config_is_checked() {
    assert!(matches!(
        BufferPool::new(MIN_POOL_SIZE - 1, 10),
        Err(Error::InvalidConfig { .. })
    ));
    assert!(matches!(
        BufferPool::new(1 << 20, 101),
        Err(Error::InvalidConfig { .. })
    ));
    let pool = BufferPool::new(100_003, 0).unwrap();
    assert_eq!(pool.capacity(), 100_003);
}

#[test]
fn mapped_block_keeps_its_bytes_and_free_list_reuses_memory() {
    let pool = BufferPool::new(1 << 20, 0).unwrap();
    let pid = page(&pool, 7);
    assert!(remap(&pool, pid, 256, 0xAB));
    let r = pool.read(pid);
    let Location::Mini(first) = r.location() else {
        panic!("not mapped")
    };
    assert_eq!(r.mini().unwrap(), &[0xAB; 256][..]);
    drop(r);
    // Growing frees the old block onto a free list; the next 256-byte block reuses it.
    assert!(remap(&pool, pid, 512, 0xCD));
    let other = page(&pool, 8);
    let b = pool.alloc(256, other).unwrap();
    assert_eq!(b.addr(), first);
    let s = pool.stats();
    assert_eq!((s.allocs_tail, s.allocs_free_list), (2, 1));
    assert_eq!(s.bytes_in_use, (512 + 8) + (256 + 8));
    drop(b);
    assert_eq!(pool.stats().bytes_in_use, 512 + 8);
    assert_eq!(pool.read(pid).mini().unwrap(), &[0xCD; 512][..]);
    let a = pool.audit();
    assert_eq!((a.live_bytes, a.free_bytes), (520, 264));
}

#[test]
fn frees_in_copy_on_access_region_become_tombstones() {
    let pool = BufferPool::new(1 << 20, 50).unwrap();
    let b = pool.alloc(1024, 0).unwrap();
    assert!(pool.is_copy_on_access(b.addr()));
    drop(b);
    let s = pool.stats();
    assert_eq!((s.copy_on_access_frees, s.free_listed), (1, 0));
    assert_eq!(pool.audit().dead_bytes, 1032);
    // Past the region, frees go to the free lists.
    let mut held = Vec::new();
    while pool.stats().ring_bytes < (1 << 20) * 6 / 10 {
        held.push(pool.alloc(4096, 0).unwrap());
    }
    let last = held.pop().unwrap();
    assert!(!pool.is_copy_on_access(last.addr()));
    drop(last);
    assert_eq!(pool.stats().free_listed, 1);
}

#[test]
fn full_buffer_evicts_in_order_and_contents_reach_the_callback() {
    let pool = BufferPool::new(64 << 10, 10).unwrap();
    let pids: Vec<PageId> = (0..40).map(|i| page(&pool, i)).collect();
    let mut disk = HashMap::new();
    let mut mapped = Vec::new();
    for (i, &pid) in pids.iter().enumerate() {
        while !remap(&pool, pid, 4096, i as u8) {
            assert_eq!(
                pool.evict_one(&mut to_disk(&mut disk)).unwrap(),
                Evicted::Progress
            );
        }
        mapped.push(pid);
    }
    // Oldest first: the evicted pages are a prefix of the insertion order.
    let evicted: Vec<PageId> = mapped
        .iter()
        .copied()
        .filter(|&pid| matches!(pool.read(pid).location(), Location::Disk(_)))
        .collect();
    assert_eq!(evicted, mapped[..evicted.len()].to_vec());
    assert!(evicted.len() >= 40 - 15);
    for (page, bytes) in &disk {
        let pid = pids
            .iter()
            .position(|&p| pool.read(p).location() == Location::Disk(*page));
        let pid = pid.expect("every written page is mapped by its owner");
        assert!(bytes.iter().all(|&b| b == pid as u8));
    }
    for &pid in &pids[evicted.len()..] {
        assert!(pool
            .read(pid)
            .mini()
            .unwrap()
            .iter()
            .all(|&b| b == pid as u8));
    }
    assert_eq!(pool.stats().evictions, evicted.len() as u64);
    while pool.evict_one(&mut to_disk(&mut disk)).unwrap() == Evicted::Progress {}
    let a = pool.audit();
    assert_eq!(a.blocks, 0);
    assert_eq!(pool.stats().bytes_in_use, 0);
}

#[test]
fn failed_eviction_keeps_the_block_and_is_retried() {
    let pool = BufferPool::new(64 << 10, 0).unwrap();
    let pid = page(&pool, 1);
    assert!(remap(&pool, pid, 1024, 0x5A));
    let mut fail = |_: &mut EvictGuard<'_, '_>, _: &[u8]| -> Result<()> {
        Err(Error::io(
            "/dev/full",
            std::io::Error::from(std::io::ErrorKind::StorageFull),
        ))
    };
    assert!(matches!(pool.evict_one(&mut fail), Err(Error::Io { .. })));
    assert_eq!(pool.read(pid).mini().unwrap(), &[0x5A; 1024][..]);
    // Still live and mapped: the page can even be modified before the retry.
    pool.write(pid).mini_mut().unwrap()[0] = 1;
    let mut seen = Vec::new();
    let mut ok = |g: &mut EvictGuard<'_, '_>, b: &[u8]| -> Result<()> {
        seen.push(b[0]);
        g.set_location_disk(9);
        Ok(())
    };
    assert_eq!(pool.evict_one(&mut ok).unwrap(), Evicted::Progress);
    assert_eq!(pool.evict_one(&mut ok).unwrap(), Evicted::Nothing);
    assert_eq!(seen, vec![1]);
    assert_eq!(pool.read(pid).location(), Location::Disk(9));
}

#[test]
fn a_block_its_callback_leaves_attached_is_kept_and_retried() {
    let pool = BufferPool::new(64 << 10, 0).unwrap();
    let pid = page(&pool, 1);
    assert!(remap(&pool, pid, 1024, 0x5A));
    let mut busy = |_: &mut EvictGuard<'_, '_>, _: &[u8]| -> Result<()> { Ok(()) };
    assert_eq!(pool.evict_one(&mut busy).unwrap(), Evicted::Busy);
    assert_eq!(pool.read(pid).mini().unwrap(), &[0x5A; 1024][..]);
    assert_eq!(pool.stats().evictions, 0);
    let mut ok = |g: &mut EvictGuard<'_, '_>, _: &[u8]| -> Result<()> {
        g.set_location_disk(9);
        Ok(())
    };
    assert_eq!(pool.evict_one(&mut ok).unwrap(), Evicted::Progress);
    assert_eq!(pool.read(pid).location(), Location::Disk(9));
}

#[test]
fn a_batch_prepares_its_live_owners_unlocked_then_evicts_the_run_in_order() {
    let pool = BufferPool::new(64 << 10, 0).unwrap();
    let pids: Vec<PageId> = (0..8).map(|i| page(&pool, i)).collect();
    for (i, &pid) in pids.iter().enumerate() {
        assert!(remap(&pool, pid, 1024, i as u8));
    }
    // The third block becomes free-listed: claimed with the run, passed, not prepared.
    let old = pool.write(pids[2]).set_location_disk(2);
    assert!(old.is_some());
    drop(old); // free-listed (no copy-on-access region)
    let mut prepared = Vec::new();
    let mut prepare = |owners: &[PageId]| {
        prepared.extend_from_slice(owners);
        // Nothing is locked: the preparation may write the pages it is given.
        for &pid in owners {
            pool.write(pid).mini_mut().unwrap()[0] = 0xEE;
        }
    };
    let mut seen = Vec::new();
    let mut cb = |g: &mut EvictGuard<'_, '_>, b: &[u8]| -> Result<()> {
        seen.push((g.page_id(), b[0]));
        g.set_location_disk(100 + u64::from(g.page_id()));
        Ok(())
    };
    assert_eq!(
        pool.evict_batch(4, &mut prepare, &mut cb).unwrap(),
        Evicted::Progress
    );
    assert_eq!(prepared, vec![pids[0], pids[1], pids[3]]);
    assert_eq!(
        seen,
        vec![(pids[0], 0xEE), (pids[1], 0xEE), (pids[3], 0xEE)]
    );
    for (i, &pid) in pids.iter().enumerate() {
        let location = pool.read(pid).location();
        match i {
            0 | 1 | 3 => assert_eq!(location, Location::Disk(100 + u64::from(pid))),
            2 => assert_eq!(location, Location::Disk(2)),
            _ => assert!(matches!(location, Location::Mini(_)), "page {i} evicted"),
        }
    }
    let s = pool.stats();
    assert_eq!((s.evictions, s.free_listed_passed), (3, 1));
    assert_eq!(pool.audit().blocks, 4);
}

#[test]
fn a_failed_batch_leaves_its_unprocessed_blocks_for_a_retry() {
    let pool = BufferPool::new(64 << 10, 0).unwrap();
    let pids: Vec<PageId> = (0..4).map(|i| page(&pool, i)).collect();
    for (i, &pid) in pids.iter().enumerate() {
        assert!(remap(&pool, pid, 1024, i as u8));
    }
    let mut calls = 0;
    let mut second_fails = |g: &mut EvictGuard<'_, '_>, _: &[u8]| -> Result<()> {
        calls += 1;
        if calls == 2 {
            return Err(Error::io(
                "/dev/full",
                std::io::Error::from(std::io::ErrorKind::StorageFull),
            ));
        }
        g.set_location_disk(100 + u64::from(g.page_id()));
        Ok(())
    };
    assert!(matches!(
        pool.evict_batch(3, &mut |_| {}, &mut second_fails),
        Err(Error::Io { .. })
    ));
    assert_eq!(calls, 2, "the batch went on past an error");
    assert_eq!(pool.read(pids[0]).location(), Location::Disk(100));
    for (i, &pid) in pids.iter().enumerate().skip(1) {
        assert_eq!(pool.read(pid).mini().unwrap(), &[i as u8; 1024][..]);
    }
    // The failed block and the one after it are retried, in order, before the rest.
    let mut order = Vec::new();
    let mut ok = |g: &mut EvictGuard<'_, '_>, _: &[u8]| -> Result<()> {
        order.push(g.page_id());
        g.set_location_disk(100 + u64::from(g.page_id()));
        Ok(())
    };
    while pool.evict_one(&mut ok).unwrap() == Evicted::Progress {}
    assert_eq!(order, pids[1..].to_vec());
    assert_eq!(pool.audit().blocks, 0);
    assert_eq!(pool.stats().bytes_in_use, 0);
}

#[test]
fn free_listed_and_dead_blocks_are_passed_not_evicted() {
    let pool = BufferPool::new(1 << 20, 0).unwrap();
    let a = pool.alloc(128, 1).unwrap();
    let b = pool.alloc(128, 2).unwrap();
    drop(a); // free-listed (no copy-on-access region)
    drop(b);
    assert_eq!(pool.stats().free_listed, 2);
    let mut never =
        |_: &mut EvictGuard<'_, '_>, _: &[u8]| -> Result<()> { panic!("nothing live to evict") };
    assert_eq!(pool.evict_one(&mut never).unwrap(), Evicted::Progress);
    let s = pool.stats();
    assert_eq!(
        (s.free_listed, s.free_listed_passed, s.ring_bytes),
        (0, 2, 0)
    );
    // The passed memory is handed out again from the tail, not from a stale list entry.
    let c = pool.alloc(128, 3).unwrap();
    assert_eq!(pool.stats().allocs_tail, 3);
    drop(c);
}

#[test]
fn wrap_around_with_odd_capacity_keeps_every_mapped_page_intact() {
    let pool = BufferPool::new(100_003, 10).unwrap();
    let pids: Vec<PageId> = (0..64).map(|i| page(&pool, i)).collect();
    let mut disk = HashMap::new();
    let mut rng = 0x1234_5678_u64;
    let mut expect: HashMap<PageId, (usize, u8)> = HashMap::new();
    for round in 0..20_000u32 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let pid = pids[(rng % 64) as usize];
        let size = 64 << ((rng >> 8) % 8);
        let byte = round as u8;
        while !remap(&pool, pid, size, byte) {
            assert_eq!(
                pool.evict_one(&mut to_disk(&mut disk)).unwrap(),
                Evicted::Progress
            );
        }
        expect.insert(pid, (size, byte));
        if round % 1000 == 0 {
            for (&pid, &(size, byte)) in &expect {
                let g = pool.read(pid);
                if let Some(m) = g.mini() {
                    assert_eq!(m.len(), size);
                    assert!(m.iter().all(|&b| b == byte), "page {pid} lost its bytes");
                }
            }
            pool.audit();
        }
    }
    let s = pool.stats();
    assert!(
        s.evictions > 0 && s.tombstones_passed > 0 && s.allocs_free_list > 0,
        "{s:?}"
    );
}

#[test]
fn block_that_cannot_fit_is_refused() {
    let pool = BufferPool::new(MIN_POOL_SIZE, 0).unwrap();
    assert!(pool.alloc(MAX_BLOCK, 0).is_none());
    assert!(pool.alloc(MAX_BLOCK / 2, 0).is_some());
}

#[test]
fn ids_are_reused_and_tables_round_trip() {
    let pool = BufferPool::new(1 << 20, 10).unwrap();
    let a = page(&pool, 10);
    let b = page(&pool, 11);
    assert!(remap(&pool, b, 64, 1));
    pool.write(a).remove();
    assert!(pool.read(a).is_removed());
    let c = page(&pool, 12);
    assert_eq!(c, a);
    let mut entries = pool.page_entries();
    entries.sort_by_key(|e| e.0);
    assert_eq!(entries[0], (a, Location::Disk(12)));
    assert!(matches!(entries[1], (pid, Location::Mini(_)) if pid == b));

    let loaded = BufferPool::with_pages(1 << 20, 10, &[(5, 50), (2, 20)]).unwrap();
    let mut got = loaded.page_entries();
    got.sort_by_key(|e| e.0);
    assert_eq!(got, vec![(2, Location::Disk(20)), (5, Location::Disk(50))]);
    let fresh: Vec<PageId> = (0..5).map(|_| page(&loaded, 1)).collect();
    assert_eq!(fresh, vec![0, 1, 3, 4, 6]);
    assert!(matches!(
        BufferPool::with_pages(1 << 20, 10, &[(1, 1), (1, 2)]),
        Err(Error::Corruption { .. })
    ));
    assert!(matches!(
        BufferPool::with_pages(1 << 20, 10, &[(1, u64::MAX)]),
        Err(Error::Corruption { .. })
    ));
}

#[test]
fn guards_lock_the_entry() {
    let pool = BufferPool::new(1 << 20, 10).unwrap();
    let pid = page(&pool, 3);
    let r1 = pool.read(pid);
    let r2 = pool.read(pid);
    assert!(pool.try_write(pid).is_none());
    let Err(r1) = r1.try_upgrade() else {
        panic!("upgraded with two readers")
    };
    drop(r2);
    let mut w = r1.try_upgrade().ok().unwrap();
    assert!(w.set_location_disk(4).is_none());
    let r = w.downgrade();
    assert!(pool.try_write(pid).is_none());
    assert_eq!(r.location(), Location::Disk(4));
    drop(r);
    assert!(pool.try_write(pid).is_some());
}

#[test]
fn dropped_new_block_is_not_leaked() {
    let pool = BufferPool::new(64 << 10, 0).unwrap();
    for _ in 0..1000 {
        let b = pool
            .alloc(8192, 0)
            .expect("memory of dropped blocks is reused");
        drop(b);
    }
    assert_eq!(pool.stats().bytes_in_use, 0);
}
