//! A safe, lifetime-free driver over the pool for the fuzz targets (cfg `fuzzing` or `bfkv_internals`):
//! pages are named by id, and every operation keeps the pool's ownership rules.

use super::size::{class_size, CLASSES};
use super::{BufferPool, EvictGuard, Location};
use crate::error::{Error, Result};

/// The pool plus nothing else: each method is one pool operation as the tree would do it.
pub struct PoolHarness {
    pool: BufferPool,
}

impl PoolHarness {
    /// A pool of `capacity` bytes (`None` if the configuration is refused).
    pub fn new(capacity: usize, second_chance_percent: u8) -> Option<PoolHarness> {
        BufferPool::new(capacity, second_chance_percent)
            .ok()
            .map(|pool| PoolHarness { pool })
    }

    /// A new page on disk page `disk`; returns its id, `None` once all 2^32 ids are taken.
    pub fn add_page(&self, disk: u64) -> Option<u32> {
        self.pool
            .insert_page(Location::Disk(disk % (1 << 40)))
            .map(|g| g.page_id())
    }

    /// Usable bytes of size class `class` (modulo the class count): 64, 80, 96, 112, 128,
    /// 160, ... (four per doubling; class `4 * k` is `64 << k`).
    pub fn class_size(class: u8) -> usize {
        class_size(usize::from(class) % CLASSES)
    }

    /// Gives `pid` a new mini-page of size class `class` (modulo the class count) holding
    /// `bytes` repeated (the old one is freed). False, with nothing changed, if the buffer
    /// is full.
    pub fn remap(&self, pid: u32, class: u8, bytes: &[u8]) -> bool {
        let size = PoolHarness::class_size(class);
        let Some(mut block) = self.pool.alloc(size, pid) else {
            return false;
        };
        fill(block.bytes_mut(), bytes);
        let mut guard = self.pool.write(pid);
        if let Some(old) = guard.set_mini(block) {
            self.pool.dealloc(old);
        }
        true
    }

    /// Copies `pid`'s mini-page to the tail if it is in the copy-on-access region. Returns
    /// whether it moved.
    pub fn touch(&self, pid: u32) -> bool {
        let mut guard = self.pool.write(pid);
        let Location::Mini(addr) = guard.location() else {
            return false;
        };
        if !self.pool.is_copy_on_access(addr) {
            return false;
        }
        let Some(old) = guard.mini() else {
            return false;
        };
        let Some(mut block) = self.pool.alloc(old.len(), pid) else {
            return false;
        };
        block.bytes_mut().copy_from_slice(old);
        drop(guard.set_mini(block));
        true
    }

    /// Allocates a block of size class `class` (modulo the class count) and returns it at
    /// once (one alloc + dealloc pair, for the benchmark). False if the buffer was full.
    pub fn alloc_and_free(&self, class: u8) -> bool {
        self.pool.alloc(PoolHarness::class_size(class), 0).is_some()
    }

    /// Takes and releases `pid`'s lock (shared or exclusive), for the benchmark.
    pub fn lock_cycle(&self, pid: u32, exclusive: bool) {
        if exclusive {
            drop(self.pool.write(pid));
        } else {
            drop(self.pool.read(pid));
        }
    }

    /// Points `pid` at a disk page, freeing its mini-page.
    pub fn drop_mini(&self, pid: u32, disk: u64) {
        drop(self.pool.write(pid).set_location_disk(disk % (1 << 40)));
    }

    /// `pid`'s mini-page bytes, if it has one.
    pub fn read(&self, pid: u32) -> Option<Vec<u8>> {
        self.pool.read(pid).mini().map(<[u8]>::to_vec)
    }

    /// One `evict_one`. `Ok(Some((pid, bytes)))` for an evicted page, `Ok(None)` if only dead
    /// blocks were passed or nothing was left; `Err(())` if `fail` made the callback fail.
    #[allow(clippy::result_unit_err)]
    pub fn evict(&self, fail: bool) -> Result<Option<(u32, Vec<u8>)>, ()> {
        let mut victim = None;
        let mut cb = |g: &mut EvictGuard<'_, '_>, bytes: &[u8]| -> Result<()> {
            if fail {
                return Err(Error::io("fuzz", std::io::Error::from_raw_os_error(5)));
            }
            victim = Some((g.page_id(), bytes.to_vec()));
            g.set_location_disk(u64::from(g.page_id()));
            Ok(())
        };
        match self.pool.evict_one(&mut cb) {
            Ok(_) => Ok(victim),
            Err(_) => Err(()),
        }
    }

    /// Walks the buffer (panics on any inconsistency) and checks its live bytes against the
    /// counters and against the mapped pages `pids`.
    pub fn audit(&self, pids: &[u32]) {
        let a = self.pool.audit();
        assert_eq!(a.live_bytes, self.pool.stats().bytes_in_use);
        let mapped: u64 = pids
            .iter()
            .filter_map(|&p| self.read(p))
            .map(|m| m.len() as u64 + 8)
            .sum();
        assert_eq!(a.live_bytes, mapped);
    }

    /// Evicts everything; afterwards head == tail (every freed byte was passed).
    pub fn drain(&self) {
        while let Ok(Some(_)) | Ok(None) = self.evict(false) {
            if self.pool.stats().ring_bytes == 0 {
                break;
            }
        }
        let s = self.pool.stats();
        assert_eq!(
            (s.ring_bytes, s.bytes_in_use, s.free_listed),
            (0, 0, 0),
            "{s:?}"
        );
    }
}

/// Fills `out` with `pattern` repeated (zeros if it is empty).
fn fill(out: &mut [u8], pattern: &[u8]) {
    if pattern.is_empty() {
        out.fill(0);
        return;
    }
    for (o, p) in out.iter_mut().zip(pattern.iter().cycle()) {
        *o = *p;
    }
}
