//! The file layer under the log segments and the checkpoint file: [`LogFs`] and
//! [`LogFile`], with [`StdFs`], the operating system's files, as the one production
//! implementation. It exists so tests can cut power under the log (`MemFs`, an in-memory
//! file system with a volatile cache) exactly where `tests/crash.rs` cannot: between a
//! `pwrite` and its `fdatasync`. The methods are the system calls the log already made
//! (`pread`, `pwrite`, `fdatasync`, `fsync`, `ftruncate`, `fallocate`, `rename`, `unlink`, a
//! directory `fsync`), one dynamic call each, so the production path keeps its behaviour and
//! its cost (a virtual call next to a system call).
//!
//! Errors are plain `io::Error`s: callers add the path, as they did with `std::fs`.
//!
//! Two capabilities are optional: [`LogFs::stages_in_memory`], whether a `Buffered` log may
//! stage its records in a ring of memory mapped from a file (`wal::ring`), which bypasses
//! the file layer (`MemFs` says no: its power cuts must see every record as a call); and
//! [`LogFs::boot`], which boot of the machine this is (`MemFs` starts a new one with every
//! crash image).
//!
//! [`StdFs`] creates directories 0700 and files 0600, and refuses to open an existing file
//! that is not a regular file of this user or that others may write (`sys::open_trusted`).

use std::fmt::Debug;
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::Path;

use crate::sync::Arc;

/// One open file of the log directory.
pub(crate) trait LogFile: Send + Sync + Debug {
    /// Reads up to `buf.len()` bytes at `offset`; fewer only at the end of the file.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Writes all of `buf` at `offset` (reaches the OS, not yet stable storage).
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes the file's data (and its length) durable: `fdatasync`.
    fn sync_data(&self) -> io::Result<()>;
    /// Makes the file's data and metadata durable: `fsync`.
    fn sync_all(&self) -> io::Result<()>;
    /// Truncates or extends the file (with zeros) to `len` bytes.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Reserves blocks up to `len` bytes so later writes there need no size update; the
    /// space reads as zeros.
    fn preallocate(&self, len: u64) -> io::Result<()>;
    /// Makes `len` bytes at `offset` read as zeros (without allocating where it can).
    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()>;
}

/// The directory operations the log and checkpoints need.
pub(crate) trait LogFs: Send + Sync + Debug {
    /// Creates `dir` and its parents if absent.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// The names of the files in `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Opens `path` for reading and writing; with `create`, creates it or empties it.
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn LogFile>>;
    /// Removes the file `path`.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Renames `from` to `to`, replacing `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes the entries of `dir` (created, removed, renamed files) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Whether a `Buffered` log on this file layer may stage records in shared memory
    /// (module docs).
    fn stages_in_memory(&self) -> bool {
        false
    }
    /// A tag of the machine's current boot, never 0 (`sys::boot_id`), or `None` where it
    /// cannot be known. Bytes written to a file on this boot read back exactly as written,
    /// synced or not; across a restart only synced bytes are sure to (the log trusts
    /// records after damage as proof of damage only on the boot that wrote them).
    fn boot(&self) -> Option<u32> {
        None
    }
}

/// Reads a whole file (the checkpoint), `NotFound` if it does not exist.
pub(crate) fn read_all(fs: &dyn LogFs, path: &Path) -> io::Result<Vec<u8>> {
    let file = fs.open(path, false)?;
    let mut out = Vec::new();
    Reader::new(file).read_to_end(&mut out)?;
    Ok(out)
}

/// Sequential reads of a [`LogFile`] (for `BufReader`), from offset 0.
#[derive(Debug)]
pub(crate) struct Reader {
    /// The file.
    file: Arc<dyn LogFile>,
    /// Offset of the next read.
    pos: u64,
}

impl Reader {
    /// A reader at the start of `file`.
    pub(crate) fn new(file: Arc<dyn LogFile>) -> Reader {
        Reader { file, pos: 0 }
    }
}

impl Read for Reader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// The operating system's file system.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct StdFs;

/// A file of [`StdFs`].
#[derive(Debug)]
struct StdFile(File);

impl LogFile for StdFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match crate::sys::read_at(&self.0, &mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        crate::sys::write_all_at(&self.0, buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn sync_all(&self) -> io::Result<()> {
        self.0.sync_all()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    /// `fallocate` on Linux: appending into allocated blocks lets `fdatasync` skip the
    /// file-size update (measured on this ext4 box, loaded: ~100 µs instead of ~165 µs per
    /// `pwrite` + `fdatasync` of a 141-byte record).
    fn preallocate(&self, len: u64) -> io::Result<()> {
        crate::sys::preallocate(&self.0, 0, len)
    }

    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        crate::sys::zero_range(&self.0, offset, len)
    }
}

impl LogFs for StdFs {
    fn stages_in_memory(&self) -> bool {
        true
    }

    fn boot(&self) -> Option<u32> {
        crate::sys::boot_id().map(|hash| (hash as u32).max(1))
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        crate::sys::create_private_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(dir)? {
            if let Ok(name) = entry?.file_name().into_string() {
                out.push(name);
            }
        }
        Ok(out)
    }

    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn LogFile>> {
        let mut options = crate::sys::private_options();
        let file = if create {
            options.create(true).truncate(true).open(path)?
        } else {
            crate::sys::open_trusted(path, &options)?
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?
        };
        Ok(Arc::new(StdFile(file)))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        crate::sys::sync_dir(dir)
    }
}
