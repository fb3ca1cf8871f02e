//! [`FileStore`]: the page store on a data file, through `io_uring` or `pread`/`pwrite`, with
//! `O_DIRECT` where the file system accepts it.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use super::disk::{self, Disk};
use super::paged::{check_page_size, PagedStore};
use super::superblock;
use super::{PageBuf, PageNo};
use crate::error::{Error, Result};
use crate::sync::{AtomicU64, Mutex, Ordering};

/// The data file grows by at least this much at a time (and by `1 / GROW_SHARE` of its
/// size once that is more), so writes of new pages land inside the file.
pub(super) const GROW_MIN: u64 = 4 << 20;
/// ... a 32nd: the reserved tail is disk space the file takes and no page uses, so it is
/// kept to a small share of the file.
const GROW_SHARE: u64 = 32;

/// How a [`FileStore`] moves pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    /// `io_uring`, one ring per thread (Linux only).
    IoUring,
    /// Positional `pread`/`pwrite`, one page per system call.
    Pread,
}

/// The page store on a data file.
pub(crate) type FileStore = PagedStore<FileDisk>;

/// A data file opened for page I/O.
#[derive(Debug)]
pub(crate) struct FileDisk {
    /// The open file; closed when the store is dropped.
    file: File,
    /// Its path, for error messages.
    path: PathBuf,
    /// How pages move.
    backend: Backend,
    /// Whether the file is open with `O_DIRECT` (false where the file system refused it).
    #[allow(dead_code)] // used by unit tests and the internals harness
    direct: bool,
    /// Bytes of the file known to exist (its length at open, or as far as `grow` extended
    /// it). Pages past the store's page count may lie below it, unwritten: the superblock's
    /// page count, not the file length, says which pages exist.
    backed: AtomicU64,
    /// Held while extending the file.
    grow: Mutex<()>,
    /// Set once `io_uring` requests on the file were abandoned (`uring::Failure::Abandoned`):
    /// they may still land, so no later read, write or flush of this handle is trusted.
    abandoned: std::sync::atomic::AtomicBool,
}

impl FileStore {
    /// Creates the data file at `path` (or opens an existing one) with pages of `page_size`
    /// bytes, using `backend` for I/O.
    ///
    /// # Errors
    /// `InvalidConfig` for a bad page size, a page size other than the file's, or `io_uring`
    /// off Linux; `Io` if the file cannot be opened or `io_uring` cannot be set up;
    /// `Corruption` if neither superblock slot is valid.
    pub(crate) fn open(path: &Path, page_size: usize, backend: Backend) -> Result<FileStore> {
        Self::open_sized(path, page_size, false, backend)
    }

    /// As [`FileStore::open`], except that an existing data file keeps the page size it was
    /// created with: `page_size` is the size of a new file's pages. `page_size()` tells
    /// which size the store has.
    ///
    /// # Errors
    /// As [`FileStore::open`], less the page size other than the file's.
    pub(crate) fn open_keeping_size(
        path: &Path,
        page_size: usize,
        backend: Backend,
    ) -> Result<FileStore> {
        Self::open_sized(path, page_size, true, backend)
    }

    fn open_sized(
        path: &Path,
        page_size: usize,
        keep: bool,
        backend: Backend,
    ) -> Result<FileStore> {
        check_page_size(page_size)?;
        if backend == Backend::IoUring {
            #[cfg(target_os = "linux")]
            super::uring::probe().map_err(|e| Error::io(path, e))?;
            #[cfg(not(target_os = "linux"))]
            return Err(Error::InvalidConfig {
                reason: "io_uring is only available on Linux",
            });
        }
        let (file, direct) = open_file(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let disk = FileDisk {
            file,
            path: path.to_path_buf(),
            backend,
            direct,
            backed: AtomicU64::new(len),
            grow: Mutex::new(()),
            abandoned: std::sync::atomic::AtomicBool::new(false),
        };
        if len > 0 {
            let page_size = if keep {
                superblock::stored_page_size(&disk)?.unwrap_or(page_size)
            } else {
                page_size
            };
            return PagedStore::mount(disk, page_size);
        }
        let store = PagedStore::format(disk, page_size)?;
        sync_parent_dir(path)?;
        Ok(store)
    }

    /// Whether the data file is open with `O_DIRECT`.
    #[allow(dead_code)] // used by unit tests and the internals harness
    pub(crate) fn is_direct(&self) -> bool {
        self.disk().direct
    }

    /// The data file's path.
    #[allow(dead_code)] // used by unit tests and the internals harness
    pub(crate) fn path(&self) -> &Path {
        &self.disk().path
    }

    /// The backend this store uses.
    #[allow(dead_code)] // used by unit tests and the internals harness
    pub(crate) fn backend(&self) -> Backend {
        self.disk().backend
    }
}

/// Opens (creating, 0600) `path` for reading and writing, bypassing the page cache where
/// the platform and file system allow: `O_DIRECT` on Linux (tmpfs and some others reject
/// it with `EINVAL`, and then the page cache is used), `F_NOCACHE` on macOS. An existing
/// file must be a regular file of this user that others cannot write
/// (`sys::check_trusted`).
pub(super) fn open_file(path: &Path) -> io::Result<(File, bool)> {
    let mut options = crate::sys::private_options();
    options.create(true);
    let (file, direct) = open_uncached(path, &options)?;
    crate::sys::check_trusted(&file.metadata()?)?;
    Ok((file, direct))
}

#[cfg(target_os = "linux")]
fn open_uncached(path: &Path, options: &std::fs::OpenOptions) -> io::Result<(File, bool)> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut direct = options.clone();
    match direct
        .custom_flags(libc::O_DIRECT | libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(file) => Ok((file, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok((options.open(path)?, false)),
        Err(e) => Err(e),
    }
}

#[cfg(target_os = "macos")]
fn open_uncached(path: &Path, options: &std::fs::OpenOptions) -> io::Result<(File, bool)> {
    use std::os::unix::io::AsRawFd;
    let file = options.open(path)?;
    // SAFETY: fcntl(F_NOCACHE) only reads its integer arguments; the descriptor is
    // `file`'s, open for the call.
    let direct = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_NOCACHE, 1) } == 0;
    Ok((file, direct))
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn open_uncached(path: &Path, options: &std::fs::OpenOptions) -> io::Result<(File, bool)> {
    Ok((options.open(path)?, false))
}

/// Makes the new file's directory entry durable.
pub(super) fn sync_parent_dir(path: &Path) -> Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    crate::sys::sync_dir(parent).map_err(|e| Error::io(parent, e))
}

impl FileDisk {
    /// Byte offset of request `page` with a buffer of `len` bytes.
    fn offset(&self, page: PageNo, len: usize) -> Result<u64> {
        disk::offset(page, len).ok_or_else(|| {
            Error::corruption(&self.path, Some(page), "page number beyond any file offset")
        })
    }

    /// Makes sure the file extends to at least `end` bytes before pages are written there.
    ///
    /// A direct write past the end of an ext4 file must extend it, which takes the inode
    /// lock exclusively: `io_uring` cannot issue it without blocking, so every such write went
    /// to a kernel worker thread, one at a time, each with its own doorbell to the device
    /// (20 % of all samples of the checkpoint-pause benchmark were in those workers). Blocks
    /// allocated ahead with `fallocate` are written under the shared lock instead, inline and
    /// batched. Where `fallocate` is not supported or fails, the writes extend the file as
    /// before; a real lack of space then shows as the write's own error.
    fn grow(&self, end: u64) {
        if end <= self.backed.load(Ordering::Acquire) {
            return;
        }
        let _one = self.grow.lock();
        let now = self.backed.load(Ordering::Acquire);
        if end <= now {
            return;
        }
        let target = end.max(now + now / GROW_SHARE).next_multiple_of(GROW_MIN);
        // Out of space, say: the write itself reports it, and the next one asks again.
        if crate::sys::preallocate(&self.file, now, target - now).is_ok() {
            self.backed.store(target, Ordering::Release);
        }
    }

    /// Reads `buf.len()` bytes at `offset` with `pread`, zero-filling past the end of file.
    fn pread(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            match crate::sys::read_at(&self.file, &mut buf[done..], offset + done as u64) {
                Ok(0) => {
                    buf[done..].fill(0);
                    break;
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Runs a batch of `(page, buffer start, buffer length)` requests through this
    /// thread's `io_uring` ring, as one batch or streamed (`Submit`), calling
    /// `check(i, bytes)` on each completed request (see `uring::run`). Requests the ring had
    /// to abandon come back with their error: the caller must leak their buffers; this
    /// handle refuses all I/O from then on.
    ///
    /// # Safety
    /// Each pointer must be valid for its length (and writable for reads) and not otherwise
    /// accessed until this returns.
    #[cfg(target_os = "linux")]
    unsafe fn uring(
        &self,
        how: Submit,
        reqs: impl Iterator<Item = (PageNo, *mut u8, usize)>,
        check: impl FnMut(usize, &[u8]) -> Result<()>,
    ) -> std::result::Result<(), (Error, Vec<usize>)> {
        use super::uring::{self, Failure, Request};
        use std::os::fd::AsRawFd;
        self.usable().map_err(|e| (e, Vec::new()))?;
        let reqs = reqs.map(|(page, ptr, len)| {
            Ok(Request {
                ptr,
                len,
                offset: self.offset(page, len)?,
            })
        });
        let fd = self.file.as_raw_fd();
        // SAFETY: the caller vouches for the buffers; `self.file` stays open for the call.
        let result = unsafe {
            match how {
                Submit::Batch(dir) => uring::run(fd, dir, reqs, check),
                Submit::Streamed => uring::read_streamed(fd, reqs, check),
            }
        };
        result.map_err(|f| match f {
            Failure::Io(e) => (Error::io(&self.path, e), Vec::new()),
            Failure::Caller(e) => (e, Vec::new()),
            Failure::Abandoned(e, held) => {
                self.abandoned.store(true, Ordering::Release);
                (Error::io(&self.path, e), held)
            }
        })
    }

    /// `Err` once requests were abandoned (see `abandoned`).
    fn usable(&self) -> Result<()> {
        if self.abandoned.load(Ordering::Acquire) {
            return Err(Error::io(
                &self.path,
                io::Error::other(
                    "io_uring requests on this file could not be waited for; reopen the tree",
                ),
            ));
        }
        Ok(())
    }
}

impl Disk for FileDisk {
    fn path(&self) -> &Path {
        &self.path
    }

    fn read_pages(&self, pages: &[PageNo], bufs: &mut [PageBuf]) -> Result<()> {
        self.read_pages_checked(pages, bufs, &mut |_, _| Ok(()))
    }

    fn read_pages_checked(
        &self,
        pages: &[PageNo],
        bufs: &mut [PageBuf],
        check: &mut dyn FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<()> {
        match self.backend {
            Backend::Pread => {
                for (i, (&page, buf)) in pages.iter().zip(bufs.iter_mut()).enumerate() {
                    let offset = self.offset(page, buf.len())?;
                    self.pread(offset, buf)
                        .map_err(|e| Error::io(&self.path, e))?;
                    check(i, buf)?;
                }
                Ok(())
            }
            #[cfg(target_os = "linux")]
            Backend::IoUring => {
                let reqs = pages
                    .iter()
                    .zip(bufs.iter_mut())
                    .map(|(&p, b)| (p, b.as_mut_ptr(), b.len()));
                // SAFETY: `bufs` is mutably borrowed for the whole call; `check` only sees a
                // buffer once its request completed, through the slice `uring::run` passes;
                // the buffers of abandoned requests are leaked below, never freed.
                let result =
                    unsafe { self.uring(Submit::Batch(super::uring::Dir::Read), reqs, check) };
                result.map_err(|(e, held)| {
                    // The kernel may still write these: give the caller fresh buffers and
                    // never free the old ones.
                    for i in held {
                        let fresh = PageBuf::new(bufs[i].len());
                        std::mem::forget(std::mem::replace(&mut bufs[i], fresh));
                    }
                    e
                })
            }
            #[cfg(not(target_os = "linux"))]
            Backend::IoUring => Err(Error::InvalidConfig {
                reason: "io_uring is only available on Linux",
            }),
        }
    }

    fn read_pages_streamed(
        &self,
        bufs: &mut [PageBuf],
        next: &mut dyn FnMut() -> Option<PageNo>,
        check: &mut dyn FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<usize> {
        match self.backend {
            Backend::Pread => super::disk::read_collected(self, bufs, next, check),
            #[cfg(target_os = "linux")]
            Backend::IoUring => {
                let mut named = 0;
                let reqs = bufs.iter_mut().map_while(|b| {
                    let p = next()?;
                    named += 1;
                    Some((p, b.as_mut_ptr(), b.len()))
                });
                // SAFETY: as in `read_pages_checked`; each buffer is handed out once, by
                // the iterator over `bufs`, which stays mutably borrowed for the call.
                let result = unsafe { self.uring(Submit::Streamed, reqs, check) };
                result.map_err(|(e, held)| {
                    for i in held {
                        let fresh = PageBuf::new(bufs[i].len());
                        std::mem::forget(std::mem::replace(&mut bufs[i], fresh));
                    }
                    e
                })?;
                Ok(named)
            }
            #[cfg(not(target_os = "linux"))]
            Backend::IoUring => Err(Error::InvalidConfig {
                reason: "io_uring is only available on Linux",
            }),
        }
    }

    fn write_pages(&self, pages: &[PageNo], bufs: &[PageBuf]) -> Result<()> {
        let mut end = 0;
        for (&page, buf) in pages.iter().zip(bufs) {
            end = end.max(self.offset(page, buf.len())? + buf.len() as u64);
        }
        self.grow(end);
        match self.backend {
            Backend::Pread => {
                for (&page, buf) in pages.iter().zip(bufs) {
                    let offset = self.offset(page, buf.len())?;
                    crate::sys::write_all_at(&self.file, buf, offset)
                        .map_err(|e| Error::io(&self.path, e))?;
                }
                Ok(())
            }
            #[cfg(target_os = "linux")]
            Backend::IoUring => {
                let reqs = pages
                    .iter()
                    .zip(bufs)
                    .map(|(&p, b)| (p, b.as_ptr().cast_mut(), b.len()));
                // SAFETY: `bufs` is borrowed for the whole call, and a write request only
                // reads through its pointer, so the shared borrow suffices. An abandoned
                // write only reads its buffer, so the process's memory is safe whatever
                // the caller does with it next; what may yet land in the file is a page
                // that no checkpoint references (leaves are written to fresh pages) and
                // whose checksum covers its page number, and this handle is refused from
                // now on (the flush that would make it durable fails).
                let result = unsafe {
                    self.uring(Submit::Batch(super::uring::Dir::Write), reqs, |_, _| Ok(()))
                };
                result.map_err(|(e, _)| e)
            }
            #[cfg(not(target_os = "linux"))]
            Backend::IoUring => Err(Error::InvalidConfig {
                reason: "io_uring is only available on Linux",
            }),
        }
    }

    fn flush(&self) -> Result<()> {
        self.usable()?;
        self.file.sync_data().map_err(|e| Error::io(&self.path, e))
    }
}

/// How [`FileDisk::uring`] hands its requests to the ring.
#[cfg(target_os = "linux")]
#[derive(Debug, Clone, Copy)]
enum Submit {
    /// All together, once the request list is complete (`uring::run`).
    Batch(super::uring::Dir),
    /// Reads, submitted in groups as the list names them (`uring::read_streamed`).
    Streamed,
}
