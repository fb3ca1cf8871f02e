//! The operating-system calls whose form differs between platforms, behind one portable
//! signature each: positional I/O, preallocation, private files and directories, the
//! ownership check of files bfkv is about to trust, and the page size. Linux gets the fast
//! paths (`fallocate`, zeroing by extent); macOS and Windows get what their standard
//! library offers, with the same meaning.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::Path;

/// Reads up to `buf.len()` bytes at `offset` in one call (fewer at the end of the file).
pub(crate) fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_at(file, buf, offset)
    }
    #[cfg(windows)]
    {
        std::os::windows::fs::FileExt::seek_read(file, buf, offset)
    }
}

/// Reads exactly `buf.len()` bytes at `offset` (`UnexpectedEof` past the end).
pub(crate) fn read_exact_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match read_at(file, buf, offset) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `buf` at `offset`.
pub(crate) fn write_all_at(file: &File, mut buf: &[u8], mut offset: u64) -> io::Result<()> {
    while !buf.is_empty() {
        #[cfg(unix)]
        let written = std::os::unix::fs::FileExt::write_at(file, buf, offset);
        #[cfg(windows)]
        let written = std::os::windows::fs::FileExt::seek_write(file, buf, offset);
        match written {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                buf = &buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reserves the blocks of bytes `offset..offset + len` so that later writes there need
/// neither new blocks nor a size update; the range reads as zeros where it was never
/// written. Where the file system cannot reserve blocks, the file is extended (sparsely).
///
/// # Errors
/// The system call's error (`StorageFull` when the blocks are not there).
pub(crate) fn preallocate(file: &File, offset: u64, len: u64) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::io::AsRawFd;
        let (Ok(off), Ok(n)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
            return Err(io::ErrorKind::InvalidInput.into());
        };
        // SAFETY: fallocate only reads its integer arguments; the descriptor is `file`'s,
        // which outlives the call.
        if unsafe { libc::fallocate(file.as_raw_fd(), 0, off, n) } == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EOPNOTSUPP) {
            return Err(err);
        }
    }
    let end = offset.checked_add(len).ok_or(io::ErrorKind::InvalidInput)?;
    if file.metadata()?.len() < end {
        file.set_len(end)?;
    }
    Ok(())
}

/// Makes bytes `offset..offset + len` of `file` read as zeros, keeping their blocks
/// reserved: by extent on Linux file systems that can (no data written), else by writing
/// zeros. Not durable until the file is synced.
///
/// # Errors
/// The system call's error.
pub(crate) fn zero_range(file: &File, offset: u64, len: u64) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::io::AsRawFd;
        let (Ok(off), Ok(n)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
            return Err(io::ErrorKind::InvalidInput.into());
        };
        // SAFETY: as in `preallocate`.
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_ZERO_RANGE, off, n) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EOPNOTSUPP) {
            return Err(err);
        }
    }
    let zeros = vec![0u8; 1 << 20];
    let mut at = 0u64;
    while at < len {
        let n = (len - at).min(zeros.len() as u64) as usize;
        write_all_at(file, &zeros[..n], offset + at)?;
        at += n as u64;
    }
    Ok(())
}

/// Options that open a file for reading and writing, never through a symbolic link, and,
/// if they create it, create it readable and writable by its owner only (0600 on Unix).
pub(crate) fn private_options() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.read(true).write(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600).custom_flags(libc::O_NOFOLLOW);
    }
    options
}

/// Gives the C allocator's free memory back to the system (glibc's `malloc_trim`; nothing
/// elsewhere). A checkpoint builds a snapshot of every leaf (a few MiB for 65k leaves) and
/// frees it; glibc keeps such a peak resident in the arena of the thread that freed it, so
/// checkpoints that follow each other (rounds) would leave the resident set at their peak
/// (`tests/memory.rs` bounds it).
pub(crate) fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` takes no pointer and only returns free pages to the system;
    // no live allocation is touched.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Creates `dir` and any missing parents, each new one accessible to its owner only (0700
/// on Unix); directories that exist are left as they are.
///
/// # Errors
/// The system call's error.
pub(crate) fn create_private_dir_all(dir: &Path) -> io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Opens the file at `path` with `options` if it may be trusted: a regular file (not a
/// link, FIFO, device or directory), owned by this process's user and writable by no one
/// else. `Ok(None)` if it does not exist. On Unix the open neither follows a link nor waits
/// on a FIFO, and the checks are made on the opened file, so a file swapped in between is
/// not missed.
///
/// # Errors
/// `PermissionDenied` (saying what is wrong) for a file that must not be trusted; the
/// system call's error if it cannot be opened or examined.
pub(crate) fn open_trusted(path: &Path, options: &OpenOptions) -> io::Result<Option<File>> {
    #[cfg_attr(not(unix), allow(unused_mut))]
    let mut options = options.clone();
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(
        &mut options,
        libc::O_NOFOLLOW | libc::O_NONBLOCK,
    );
    let file = match options.open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        #[cfg(unix)]
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(refusal("a symbolic link: bfkv does not follow links"))
        }
        Err(e) => return Err(e),
    };
    check_trusted(&file.metadata()?)?;
    Ok(Some(file))
}

/// Whether a file with metadata `meta` may be trusted (as [`open_trusted`] says).
///
/// # Errors
/// `PermissionDenied`, saying what is wrong.
pub(crate) fn check_trusted(meta: &fs::Metadata) -> io::Result<()> {
    if !meta.file_type().is_file() {
        return Err(refusal("not a regular file"));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid has no arguments and cannot fail.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me {
            return Err(refusal("owned by another user"));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(refusal("writable by other users"));
        }
    }
    Ok(())
}

/// The error of a file bfkv refuses to trust.
fn refusal(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("refused to use the file: {what}"),
    )
}

/// Makes the entries of directory `dir` (files created, renamed or removed) durable. On
/// Windows, where a directory cannot be opened for syncing, NTFS journals them itself.
///
/// # Errors
/// The system call's error.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

/// Takes an exclusive advisory lock on `file` without waiting: `Ok(false)` if another open
/// file (in this or another process) holds one.
///
/// # Errors
/// The system call's error.
pub(crate) fn try_lock(file: &File) -> io::Result<bool> {
    match file.try_lock() {
        Ok(()) => Ok(true),
        Err(fs::TryLockError::WouldBlock) => Ok(false),
        Err(fs::TryLockError::Error(e)) => Err(e),
    }
}

/// Positional I/O as methods, for tests that damage files on every platform.
#[cfg(test)]
#[cfg_attr(shuttle, allow(dead_code))] // the shuttle build leaves out the log's file tests
pub(crate) trait FileAt {
    /// [`read_at`].
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// [`read_exact_at`].
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// [`write_all_at`].
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
}

#[cfg(test)]
impl FileAt for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        read_at(self, buf, offset)
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        read_exact_at(self, buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        write_all_at(self, buf, offset)
    }
}

/// The error a fault-injecting test double returns: `EIO` where there is one.
#[cfg(any(test, fuzzing, bfkv_internals))]
pub(crate) fn injected_fault() -> io::Error {
    #[cfg(unix)]
    {
        io::Error::from_raw_os_error(libc::EIO)
    }
    #[cfg(not(unix))]
    {
        io::Error::other("injected I/O error")
    }
}

/// Whether `e` is [`injected_fault`]'s error.
#[cfg(test)]
pub(crate) fn is_injected_fault(e: &io::Error) -> bool {
    let want = injected_fault();
    e.raw_os_error() == want.raw_os_error() && e.to_string() == want.to_string()
}

/// A hash of this boot's id (`/proc/sys/kernel/random/boot_id`; never 0), or `None` where
/// there is none. Within one boot the page cache holds every byte a process wrote to a
/// file, in order, even after the process dies; across a restart, only what was synced is
/// sure to be there, and unsynced pages may have reached the disk in any order. The log
/// tells damage from a torn tail by whether its bytes were written on this boot.
pub(crate) fn boot_id() -> Option<u64> {
    static BOOT: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *BOOT.get_or_init(|| {
        let id = fs::read("/proc/sys/kernel/random/boot_id").ok()?;
        let id = id.trim_ascii();
        (!id.is_empty()).then(|| {
            use crate::store::checksum::crc32c;
            let hash = u64::from(crc32c(id)) << 32 | u64::from(crc32c(&id[id.len() / 2..]));
            hash.max(1)
        })
    })
}

/// The system's memory page size.
pub(crate) fn page_size() -> usize {
    #[cfg(unix)]
    {
        // SAFETY: sysconf only reads a constant of the system.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
    }
    #[cfg(not(unix))]
    {
        4096
    }
}

#[cfg(all(test, not(shuttle)))]
mod tests {
    use super::*;

    #[test]
    fn positional_io_round_trips_and_zeroing_reads_back_zeros() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let f = private_options()
            .create(true)
            .truncate(true)
            .open(&path)
            .expect("open");
        preallocate(&f, 0, 64 << 10).expect("preallocate");
        assert!(f.metadata().expect("meta").len() >= 64 << 10);
        write_all_at(&f, &[7u8; 10_000], 100).expect("write");
        let mut back = [0u8; 10_000];
        read_exact_at(&f, &mut back, 100).expect("read");
        assert_eq!(back, [7u8; 10_000]);
        zero_range(&f, 4096, 4096).expect("zero");
        read_exact_at(&f, &mut back, 100).expect("read");
        assert!(back[..3996].iter().all(|&b| b == 7));
        assert!(back[3996..8092].iter().all(|&b| b == 0));
        assert!(back[8092..].iter().all(|&b| b == 7));
        let mut past = [0u8; 4];
        let eof = read_exact_at(&f, &mut past, f.metadata().expect("meta").len() - 2);
        assert_eq!(eof.map_err(|e| e.kind()), Err(io::ErrorKind::UnexpectedEof));
    }

    #[cfg(unix)]
    #[test]
    fn private_files_and_dirs_are_owner_only_and_strangers_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let sub = dir.path().join("a/b");
        create_private_dir_all(&sub).expect("mkdir");
        for d in [dir.path().join("a"), sub.clone()] {
            let mode = fs::metadata(&d).expect("meta").permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", d.display());
        }
        let path = sub.join("f");
        private_options()
            .create(true)
            .truncate(true)
            .open(&path)
            .expect("open");
        assert_eq!(
            fs::metadata(&path).expect("meta").permissions().mode() & 0o777,
            0o600
        );
        let read = {
            let mut o = OpenOptions::new();
            o.read(true);
            o
        };
        assert!(open_trusted(&path, &read).expect("trusted").is_some());
        assert!(open_trusted(&sub.join("absent"), &read)
            .expect("absent")
            .is_none());
        let link = sub.join("link");
        std::os::unix::fs::symlink(&path, &link).expect("symlink");
        let fifo = sub.join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: mkfifo reads the NUL-terminated path only.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).expect("chmod");
        // Refused, and promptly: the FIFO has no writer, a blocking open would hang.
        for bad in [&path, &link, &fifo, &sub] {
            let err = open_trusted(bad, &read).expect_err("refused");
            assert_eq!(
                err.kind(),
                io::ErrorKind::PermissionDenied,
                "{}",
                bad.display()
            );
        }
    }

    #[test]
    fn a_second_lock_on_the_same_file_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("LOCK");
        let a = private_options()
            .create(true)
            .truncate(false)
            .open(&path)
            .expect("a");
        let b = private_options().open(&path).expect("b");
        assert!(try_lock(&a).expect("lock a"));
        assert!(!try_lock(&b).expect("lock b"));
        drop(a);
        assert!(try_lock(&b).expect("lock b again"));
        assert!(page_size() >= 4096);
    }
}
