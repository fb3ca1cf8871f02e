//! The blob file: large values stored out of line, away from the pages of the tree.
//!
//! A value too large for a leaf would cost many pages there, each with its own header,
//! checksum and request. Here it is one extent of whole blocks written with one large
//! sequential request (a few in parallel for very large values), bypassing the page cache
//! where the file system allows. The file has no header and no checksums of its own: the
//! tree records where each value lives and how long it is, and recovery rebuilds the
//! allocator (`extents.rs`) from those records, so nothing here needs to be durable beyond
//! the bytes themselves.

use std::fs::File;
use std::io;
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};

use super::{checksum, PageBuf};
use crate::error::{Error, Result};

/// Bytes per block of the blob file (`O_DIRECT` alignment on every common device).
pub(crate) const BLOB_BLOCK: u64 = 4096;

/// [`BLOB_BLOCK`] as a buffer length.
const BLOCK: usize = BLOB_BLOCK as usize;

/// Writes from this length on are cut into chunks moved by several threads; a write up to
/// one buffer's length ([`CHUNK_MAX`]) is one request on the calling thread. On the virtual
/// disk here (2-3 GiB/s), a 1 MiB value written as one request was faster than as four
/// 256 KiB chunks on four threads, most clearly under `Sync`: the chunks' threads are
/// started for each value and wait to be scheduled, and the write is done when its slowest
/// chunk is. A longer value needs several buffers anyway, and its chunks go out together.
const PARALLEL_MIN: usize = CHUNK_MAX + 1;

/// Reads are cut later and coarser than writes: a read up to one buffer's length
/// ([`CHUNK_MAX`]) is one request on the calling thread. On the virtual disk here a 1 MiB
/// value read as four 256 KiB requests in parallel came in at two thirds of the rate of one
/// 1 MiB request (a read is done when its slowest piece is, and the pieces compete), two
/// 512 KiB pieces were no faster than one request, and with both cores busy elsewhere
/// any split halved the rate (every piece on another thread waits to be scheduled, twice),
/// while the single request kept its pace.
const READ_PARALLEL_MIN: usize = CHUNK_MAX + 1;

/// The smallest chunk of a parallel read (see [`READ_PARALLEL_MIN`]).
const READ_CHUNK_MIN: usize = 512 << 10;

/// The largest chunk of a parallel request: bounds each thread's buffer (and so the memory
/// one call holds, `WORKERS` of them) while staying large enough for sequential speed.
const CHUNK_MAX: usize = 1 << 20;

/// Bytes a chunk is copied and checksummed in at a time: one pass over the chunk would
/// checksum bytes the copy has already pushed out of the core's caches.
const FUSED: usize = 32 << 10;

/// Threads moving one request's chunks at once (the calling thread among them).
const WORKERS: usize = 4;

/// Why a read is refused whose bytes do not all lie in the file.
const BEYOND_EOF: &str = "blob extent beyond the end of the blob file";

/// Why a request is refused whose byte offsets do not fit a `u64`.
const BEYOND_ANY_OFFSET: &str = "blob extent beyond any file offset";

/// Blocks needed for `len` bytes (0 for 0).
pub(crate) fn blocks_for(len: u64) -> u64 {
    len.div_ceil(BLOB_BLOCK)
}

/// `len` rounded up to whole blocks, as a buffer length.
fn round_up(len: usize) -> usize {
    len.next_multiple_of(BLOCK)
}

/// The chunk length of a parallel request of `len` bytes: a quarter of it, so all
/// [`WORKERS`] get a share, within `min..=`[`CHUNK_MAX`].
fn chunk_len(len: usize, min: usize) -> usize {
    round_up((len / 4).clamp(min, CHUNK_MAX))
}

/// The blob file, open for positional I/O in whole blocks.
#[derive(Debug)]
pub(crate) struct BlobFile {
    /// The open file; direct I/O where `direct`.
    file: File,
    /// Its path, for error messages.
    path: PathBuf,
    /// Whether the page cache is bypassed (`O_DIRECT` / `F_NOCACHE`); every request is
    /// aligned either way, so this only says how fast, never whether, I/O works.
    direct: bool,
    /// Aligned buffers of [`CHUNK_MAX`] bytes kept between calls (at most [`WORKERS`]): a
    /// fresh one per call cost a page fault and a zeroing per 4 KiB moved.
    spare: std::sync::Mutex<Vec<PageBuf>>,
}

impl BlobFile {
    /// Opens or creates the blob file at `path`, bypassing the page cache where the file
    /// system allows (like the data file, and for the same reason: the tree's own cache
    /// decides what stays in memory). A new file's directory entry is made durable, so
    /// values written and synced into it cannot vanish with the entry after a crash.
    ///
    /// # Errors
    /// `Io` if the file cannot be opened, is not a trusted regular file, or its directory
    /// cannot be synced.
    pub(crate) fn open(path: &Path) -> Result<BlobFile> {
        let (file, direct) = super::file::open_file(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        if len == 0 {
            // Possibly created just now; syncing the entry of an old empty file is harmless.
            super::file::sync_parent_dir(path)?;
        }
        Ok(BlobFile {
            file,
            path: path.to_path_buf(),
            direct,
            spare: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// The file's path, for the tree's own error messages.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether I/O bypasses the page cache (tests and stats want to know).
    #[allow(dead_code)] // used by the tree's blob store and unit tests
    pub(crate) fn is_direct(&self) -> bool {
        self.direct
    }

    /// The file's length in whole blocks (rounded up), so recovery can compare it with the
    /// extents in use and shrink a file left longer by a crash.
    ///
    /// # Errors
    /// `Io` if the file cannot be examined.
    pub(crate) fn len_blocks(&self) -> Result<u64> {
        let len = self.file.metadata().map_err(|e| self.io(e))?.len();
        Ok(blocks_for(len))
    }

    /// Writes `data` at block `block`, the last block zero-padded so that every request is
    /// aligned (direct I/O needs it) and the padding never holds stale bytes. Large values
    /// go out as several large requests in parallel, which a device completes faster than
    /// one request after another.
    ///
    /// # Errors
    /// `Io` if a write fails (some chunks may have been written); `Corruption` if the
    /// extent lies beyond any file offset.
    pub(crate) fn write(&self, block: u64, data: &[u8]) -> Result<u32> {
        if data.is_empty() {
            return Ok(checksum::crc32c(data));
        }
        let base = block
            .checked_mul(BLOB_BLOCK)
            .filter(|b| b.checked_add(round_up(data.len()) as u64).is_some())
            .ok_or_else(|| Error::corruption(&self.path, Some(block), BEYOND_ANY_OFFSET))?;
        let chunk = if data.len() < PARALLEL_MIN {
            round_up(data.len())
        } else {
            chunk_len(data.len(), BLOCK)
        };
        let pieces: Vec<(u64, &[u8])> = data
            .chunks(chunk)
            .enumerate()
            .map(|(i, piece)| (base + (i * chunk) as u64, piece))
            .collect();
        let crcs = self.run(pieces, |buf, (at, piece)| {
            let n = round_up(piece.len());
            // Checksummed here, by the threads, each step right after its copy, while its
            // bytes are still in cache.
            let mut crc = 0;
            for (dst, src) in buf[..piece.len()]
                .chunks_mut(FUSED)
                .zip(piece.chunks(FUSED))
            {
                dst.copy_from_slice(src);
                crc = checksum::crc32c_append(crc, dst);
            }
            // The buffer is reused from an earlier, longer chunk: clear the padding.
            buf[piece.len()..n].fill(0);
            crate::sys::write_all_at(&self.file, &buf[..n], at).map_err(|e| self.io(e))?;
            Ok((piece.len(), crc))
        })?;
        Ok(combine(&crcs))
    }

    /// [`read_uninit`](Self::read_uninit) into an initialized buffer.
    #[cfg(test)] // the tree reads whole values, through `read_vec`
    pub(crate) fn read(&self, block: u64, offset: u64, buf: &mut [u8]) -> Result<u32> {
        // SAFETY: `MaybeUninit<u8>` has the layout of `u8`, and `read_uninit` only ever
        // writes initialized bytes through the view, so `buf` stays initialized.
        let view = unsafe { &mut *(std::ptr::from_mut(buf) as *mut [MaybeUninit<u8>]) };
        self.read_uninit(block, offset, view)
    }

    /// The `len` bytes of the extent that starts at block `block`, in a new vector, and
    /// their CRC-32C. The vector is never zeroed first: for a large value that was a
    /// `memset` of the whole length on the calling thread before the first request went
    /// out (the allocator hands back recycled memory, not fresh zero pages).
    ///
    /// # Errors
    /// As for [`read_uninit`](Self::read_uninit).
    pub(crate) fn read_vec(&self, block: u64, len: usize) -> Result<(Vec<u8>, u32)> {
        let mut value = Vec::with_capacity(len);
        let crc = self.read_uninit(block, 0, &mut value.spare_capacity_mut()[..len])?;
        // SAFETY: `read_uninit` returned Ok, so it wrote all `len` bytes of the spare
        // capacity (every piece is copied whole before its thread reports success).
        unsafe { value.set_len(len) };
        Ok((value, crc))
    }

    /// Reads `buf.len()` bytes from byte `offset` of the extent that starts at block
    /// `block` and returns their CRC-32C; on success every byte of `buf` has been written.
    /// Direct I/O reads whole aligned blocks only, so the covering blocks are read into
    /// aligned buffers and the requested bytes copied out; large reads are cut into chunks
    /// read in parallel, as in [`write`](Self::write).
    ///
    /// # Errors
    /// `Corruption` (at page `block`) if any requested byte lies beyond the end of the file
    /// (a reference to a value the file does not hold); `Io` if a read fails.
    fn read_uninit(&self, block: u64, offset: u64, buf: &mut [MaybeUninit<u8>]) -> Result<u32> {
        if buf.is_empty() {
            return Ok(checksum::crc32c(&[]));
        }
        let beyond = || Error::corruption(&self.path, Some(block), BEYOND_ANY_OFFSET);
        let start = block
            .checked_mul(BLOB_BLOCK)
            .and_then(|b| b.checked_add(offset))
            .ok_or_else(beyond)?;
        let head = (start % BLOB_BLOCK) as usize;
        let aligned = start - head as u64;
        let covered = round_up(head + buf.len());
        aligned.checked_add(covered as u64).ok_or_else(beyond)?;
        let chunk = if buf.len() < READ_PARALLEL_MIN {
            covered
        } else {
            chunk_len(buf.len(), READ_CHUNK_MIN)
        };
        // Chunk k covers the aligned bytes `aligned + k * chunk ..`; the first one starts
        // `head` bytes before the requested range, so its share of `buf` is that much shorter.
        let first_len = (chunk - head).min(buf.len());
        let (first, rest) = buf.split_at_mut(first_len);
        let pieces: Vec<(u64, usize, &mut [MaybeUninit<u8>])> =
            std::iter::once((aligned, head, first))
                .chain(
                    rest.chunks_mut(chunk)
                        .enumerate()
                        .map(|(i, piece)| (aligned + ((i + 1) * chunk) as u64, 0, piece)),
                )
                .collect();
        let crcs = self.run(pieces, |cbuf, (at, skip, piece)| {
            let want = skip + piece.len();
            let got = self.read_upto(&mut cbuf[..round_up(want)], at)?;
            if got < want {
                return Err(Error::corruption(&self.path, Some(block), BEYOND_EOF));
            }
            // Each step is checksummed and then copied out while it is in cache.
            let mut crc = 0;
            for (dst, src) in piece.chunks_mut(FUSED).zip(cbuf[skip..want].chunks(FUSED)) {
                crc = checksum::crc32c_append(crc, src);
                fill(dst, src);
            }
            Ok((piece.len(), crc))
        })?;
        Ok(combine(&crcs))
    }

    /// Reads into `buf` (aligned, a block multiple) from byte `at` until it is full or the
    /// file ends; returns the bytes read. The caller decides whether an early end matters:
    /// a short final block is fine as long as the requested bytes lie before it.
    fn read_upto(&self, buf: &mut [u8], at: u64) -> Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            // A direct read that ends inside a block stopped at the end of the file; asking
            // again from there would be unaligned (EINVAL), not a cleaner answer.
            if self.direct && done % BLOCK != 0 {
                break;
            }
            match crate::sys::read_at(&self.file, &mut buf[done..], at + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io(e)),
            }
        }
        Ok(done)
    }

    /// Makes every completed write durable (fdatasync), before the tree records a
    /// reference to it.
    ///
    /// # Errors
    /// `Io` if the flush fails: writes since the last successful sync may be lost.
    pub(crate) fn sync(&self) -> Result<()> {
        self.file.sync_data().map_err(|e| self.io(e))
    }

    /// Sets the file's length to `blocks` blocks, so space freed at the end goes back to
    /// the file system.
    ///
    /// # Errors
    /// `Io` if the length cannot be set; `Corruption` if it exceeds any file offset.
    pub(crate) fn set_len_blocks(&self, blocks: u64) -> Result<()> {
        let len = blocks
            .checked_mul(BLOB_BLOCK)
            .ok_or_else(|| Error::corruption(&self.path, Some(blocks), BEYOND_ANY_OFFSET))?;
        self.file.set_len(len).map_err(|e| self.io(e))
    }

    /// Reserves blocks `from..to` (the file grows to `to` blocks): writes into reserved
    /// blocks neither extend the file nor allocate, which on ext4 ran at 1.6 times the rate
    /// of extending writes.
    ///
    /// # Errors
    /// `Io` from the file system (`StorageFull` without room).
    pub(crate) fn reserve_blocks(&self, from: u64, to: u64) -> Result<()> {
        let (Some(offset), Some(end)) = (from.checked_mul(BLOB_BLOCK), to.checked_mul(BLOB_BLOCK))
        else {
            return Err(Error::corruption(&self.path, Some(to), BEYOND_ANY_OFFSET));
        };
        if end <= offset {
            return Ok(());
        }
        crate::sys::preallocate(&self.file, offset, end - offset).map_err(|e| self.io(e))
    }

    /// An I/O error on this file.
    fn io(&self, e: io::Error) -> Error {
        Error::io(&self.path, e)
    }
}

/// Copies `src` into `dst` (of the same length), initializing it.
fn fill(dst: &mut [MaybeUninit<u8>], src: &[u8]) {
    assert_eq!(
        dst.len(),
        src.len(),
        "a read piece and its bytes differ in length"
    );
    // SAFETY: both are valid for `src.len()` bytes (checked just above), `dst` is borrowed
    // mutably so nothing else can overlap it, and `MaybeUninit<u8>` has the layout of `u8`.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast::<u8>(), src.len());
    }
}

/// The CRC-32C of consecutive pieces, given each piece's length and CRC.
fn combine(crcs: &[(usize, u32)]) -> u32 {
    let mut pieces = crcs.iter();
    let first = pieces.next().map_or(0, |&(_, crc)| crc);
    pieces.fold(first, |crc, &(len, next)| {
        checksum::crc32c_combine(crc, next, len)
    })
}

impl BlobFile {
    /// An aligned buffer of [`CHUNK_MAX`] bytes (every chunk fits), from the spares if any.
    fn take_buf(&self) -> PageBuf {
        let spare = self
            .spare
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop();
        spare.unwrap_or_else(|| PageBuf::new(CHUNK_MAX + BLOCK))
    }

    /// Keeps `buf` for the next call, up to [`WORKERS`] buffers.
    fn give_buf(&self, buf: PageBuf) {
        let mut spare = self
            .spare
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if spare.len() < WORKERS {
            spare.push(buf);
        }
    }

    /// Runs `work` on every item with an aligned buffer per thread: on the calling thread
    /// alone for one item, else shared round-robin among up to [`WORKERS`] scoped threads,
    /// each with its own buffer (the calling thread among them). Chunks are equal, so a
    /// fixed share per thread balances as well as a queue would, with nothing shared
    /// between the threads. Returns the items' results in item order, or the first error
    /// (by thread); the other threads finish their shares regardless, which only costs time
    /// on an already failing request. A thread that cannot be started (resources
    /// exhausted) is an `Io` error.
    fn run<T: Send, R: Send>(
        &self,
        items: Vec<T>,
        work: impl Fn(&mut [u8], T) -> Result<R> + Sync,
    ) -> Result<Vec<R>> {
        let workers = items.len().min(WORKERS);
        let work = &work;
        let share = move |items: Vec<(usize, T)>| -> Result<Vec<(usize, R)>> {
            let mut buf = self.take_buf();
            let done = items
                .into_iter()
                .map(|(i, item)| work(&mut buf, item).map(|r| (i, r)))
                .collect();
            self.give_buf(buf);
            done
        };
        let numbered = items.into_iter().enumerate();
        if workers <= 1 {
            return Ok(share(numbered.collect())?
                .into_iter()
                .map(|(_, r)| r)
                .collect());
        }
        let mut shares: Vec<Vec<(usize, T)>> = (0..workers).map(|_| Vec::new()).collect();
        for (i, item) in numbered {
            shares[i % workers].push((i, item));
        }
        let mut shares = shares.into_iter();
        let mine = shares.next().unwrap_or_default();
        let mut done = std::thread::scope(|s| {
            let mut result = Ok(Vec::new());
            let mut handles = Vec::new();
            for items in shares {
                match std::thread::Builder::new().spawn_scoped(s, move || share(items)) {
                    Ok(h) => handles.push(h),
                    Err(e) => result = Err(self.io(e)),
                }
            }
            let gather = |result: Result<Vec<(usize, R)>>, r: Result<Vec<(usize, R)>>| {
                let mut all = result?;
                all.extend(r?);
                Ok(all)
            };
            result = gather(result, share(mine));
            for h in handles {
                let r = h
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                result = gather(result, r);
            }
            result
        })?;
        done.sort_unstable_by_key(|&(i, _)| i);
        Ok(done.into_iter().map(|(_, r)| r).collect())
    }
}
