//! The device limit: random `O_DIRECT` `pread`s of one bfkv page per second on a large file on
//! the same file system as the engines' files, with the same number of threads as the engine
//! run.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use bfkv_workload::Rng;

/// A buffer for `O_DIRECT` reads, aligned to its size, freed on drop.
struct AlignedBlock {
    /// Start of the allocation (non-null, aligned to `layout`'s size, which it has).
    ptr: *mut u8,
    /// Its layout: a power-of-two size, aligned to that size.
    layout: Layout,
}

impl AlignedBlock {
    /// A zeroed block of `len` bytes (a power of two, at least 512).
    fn new(len: usize) -> io::Result<AlignedBlock> {
        let layout = Layout::from_size_align(len, len)
            .ok()
            .filter(|_| len >= 512)
            .ok_or_else(|| io::Error::other("block size is not a power of two of 512 or more"))?;
        // SAFETY: the layout has a nonzero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(io::Error::other("out of memory"));
        }
        Ok(AlignedBlock { ptr, layout })
    }

    /// The block as a slice.
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is a live, exclusively owned allocation of `layout.size()`
        // initialized (zeroed) bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for AlignedBlock {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { dealloc(self.ptr, self.layout) };
    }
}

/// Makes sure `path` is a fully written (not sparse) file of `bytes` bytes, so reads reach
/// the device; writes it only if it is not that already.
pub fn prepare_file(path: &Path, bytes: u64) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    if let Ok(m) = std::fs::metadata(path) {
        if m.len() == bytes && m.blocks() * 512 >= bytes {
            return Ok(());
        }
    }
    let mut f = File::create(path)?;
    let mut chunk = vec![0u8; 1 << 20];
    let mut rng = Rng::new(7);
    let mut written = 0u64;
    while written < bytes {
        // Not zeros: no file system or device should get to treat the blocks as empty.
        for w in chunk.chunks_exact_mut(8) {
            w.copy_from_slice(&rng.next_u64().to_le_bytes());
        }
        let n = (bytes - written).min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n])?;
        written += n as u64;
    }
    f.sync_all()
}

/// Random `O_DIRECT` reads of `block` bytes (a power of two) per second over `path` with
/// `threads` threads for `secs`.
pub fn pread_iops(path: &Path, threads: usize, secs: f64, block: usize) -> io::Result<f64> {
    let blocks = std::fs::metadata(path)?.len() / block as u64;
    if blocks == 0 {
        return Err(io::Error::other("probe file is empty"));
    }
    let deadline = Instant::now() + Duration::from_secs_f64(secs.max(0.1));
    let start = Instant::now();
    let counts: Vec<io::Result<u64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.max(1))
            .map(|t| s.spawn(move || reader(path, block, blocks, t as u64, deadline)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(io::Error::other("reader panicked")))
            })
            .collect()
    });
    let elapsed = start.elapsed().as_secs_f64();
    let mut total = 0;
    for c in counts {
        total += c?;
    }
    Ok(total as f64 / elapsed.max(1e-9))
}

/// One reading thread: random reads of `block` bytes until `deadline`; returns how many.
fn reader(path: &Path, block: usize, blocks: u64, seed: u64, deadline: Instant) -> io::Result<u64> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)?;
    // Readahead does not apply to O_DIRECT, but say so anyway for the buffered fallback.
    // SAFETY: a valid open descriptor; advice has no memory-safety effect.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    let mut buf = AlignedBlock::new(block)?;
    let mut rng = Rng::new(0x5eed ^ seed);
    let mut n = 0u64;
    while !n.is_multiple_of(64) || Instant::now() < deadline {
        let off = rng.below(blocks) * block as u64;
        f.read_exact_at(buf.as_mut(), off)?;
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_file_is_written_once_and_read_directly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("probe");
        prepare_file(&path, 4 << 20).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 4 << 20);
        let before = std::fs::metadata(&path).unwrap().modified().unwrap();
        prepare_file(&path, 4 << 20).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().modified().unwrap(),
            before
        );
        for block in [4096, 8192] {
            let iops = pread_iops(&path, 2, 0.2, block).unwrap();
            assert!(iops > 100.0, "{block}: {iops}");
        }
        assert!(pread_iops(&path, 1, 0.1, 3000).is_err());
    }
}
