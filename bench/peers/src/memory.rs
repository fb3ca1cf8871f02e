//! An engine's memory, measured honestly (issue 6): the peak resident set of its process
//! during a phase, plus the pages of its files that sit in the OS page cache at the phase's
//! end. Engines on buffered I/O keep most of their working set in the page cache, outside
//! their RSS; counting only RSS would flatter them against engines on direct I/O.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;

/// What `/proc/self/status` says about this process's memory, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Status {
    /// Peak resident set since the process started or since [`reset_peak_rss`] (`VmHWM`).
    pub peak_rss: u64,
    /// Resident set now (`VmRSS`).
    pub rss: u64,
}

/// Resets this process's peak RSS to its current RSS (`echo 5 > /proc/self/clear_refs`), so
/// the next [`status`] reports the peak of what happened since. False if the kernel refused.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// This process's memory figures, if `/proc/self/status` can be read.
pub fn status() -> Option<Status> {
    parse_status(&std::fs::read_to_string("/proc/self/status").ok()?)
}

/// Parses the `VmHWM` and `VmRSS` lines (kB) of a `/proc/<pid>/status` text.
pub fn parse_status(text: &str) -> Option<Status> {
    let kib = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let n: u64 = line[name.len()..].split_whitespace().next()?.parse().ok()?;
        Some(n * 1024)
    };
    Some(Status {
        peak_rss: kib("VmHWM:")?,
        rss: kib("VmRSS:")?,
    })
}

/// Bytes of this process's RSS that are pages of files under `dir` mapped into it (LMDB maps
/// its whole file). Those pages are also in the page cache, so [`footprint`] subtracts them
/// once instead of counting them twice.
pub fn mapped_resident(dir: &Path) -> u64 {
    std::fs::read_to_string("/proc/self/smaps")
        .map(|text| parse_smaps_under(&text, dir))
        .unwrap_or(0)
}

/// Sums the `Rss:` lines (kB) of the mappings in an smaps text whose file lies under `dir`.
pub fn parse_smaps_under(text: &str, dir: &Path) -> u64 {
    let mut inside = false;
    let mut total = 0;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            // A mapping's header: address range, perms, offset, device, inode, path.
            let path = words.nth(4).map(Path::new);
            inside = path.is_some_and(|p| p.starts_with(dir));
        } else if inside && first == "Rss:" {
            total += words
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
                * 1024;
        }
    }
    total
}

/// An engine's footprint: its peak RSS, plus its files' pages in the page cache, minus the
/// part of those pages that its RSS already counts (mapped files).
pub fn footprint(peak_rss: u64, page_cache: u64, mapped: u64) -> u64 {
    peak_rss + page_cache.saturating_sub(mapped)
}

/// Bytes of `file` resident in the OS page cache: `mincore` over a shared read-only mapping
/// of it (mapping does not read anything in; `mincore` does not fault pages in).
pub fn resident_bytes(file: &Path) -> io::Result<u64> {
    let f = File::open(file)?;
    let len = f.metadata()?.len();
    if len == 0 {
        return Ok(0);
    }
    let len = usize::try_from(len).map_err(|_| io::Error::other("file larger than memory"))?;
    // SAFETY: sysconf has no preconditions.
    let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        p if p > 0 => p as usize,
        _ => 4096,
    };
    // SAFETY: a fresh mapping chosen by the kernel (null hint) of a file we hold open; it
    // aliases no Rust memory and is never dereferenced, only passed to mincore and munmap.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: `addr..addr+len` is the mapping made above; `vec` has one byte per page of it,
    // as mincore requires.
    let rc = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
    let err = io::Error::last_os_error();
    // SAFETY: unmaps exactly the mapping made above, which nothing else refers to.
    unsafe { libc::munmap(addr, len) };
    if rc != 0 {
        return Err(err);
    }
    let pages = vec.iter().filter(|&&b| b & 1 == 1).count() as u64;
    Ok((pages * page as u64).min(len as u64))
}

/// Visits every regular file under `dir` (recursively). Files that vanish while it walks
/// (an LSM engine deleting compacted tables) are skipped.
fn walk(dir: &Path, visit: &mut dyn FnMut(&Path, u64)) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = match entry {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let meta = match entry.metadata() {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if meta.is_dir() {
            walk(&entry.path(), visit)?;
        } else if meta.is_file() {
            visit(&entry.path(), meta.len());
        }
    }
    Ok(())
}

/// Bytes of all files under `dir` resident in the page cache.
pub fn dir_resident(dir: &Path) -> io::Result<u64> {
    let mut total = 0;
    walk(dir, &mut |path, _| {
        // A file deleted between listing and opening has no pages left to count.
        total += resident_bytes(path).unwrap_or(0);
    })?;
    Ok(total)
}

/// Allocated bytes of all files under `dir` (apparent sizes: LMDB's map is sparse, so its
/// apparent size says nothing; blocks are what the disk holds).
pub fn dir_disk_bytes(dir: &Path) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    walk(dir, &mut |path, _| {
        total += std::fs::metadata(path).map_or(0, |m| m.blocks() * 512);
    })?;
    Ok(total)
}

/// Allocated bytes of the write-ahead log files under `dir`: those in a directory named
/// `wal` (bfkv's) or named `*.log` (RocksDB's). The engines without such files (bf-tree in
/// its default configuration, LMDB, redb) keep no log apart from their data files.
pub fn dir_log_bytes(dir: &Path) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    walk(dir, &mut |path, _| {
        let in_wal = path
            .strip_prefix(dir)
            .is_ok_and(|rel| rel.parent().is_some_and(|p| p.ends_with("wal")));
        let is_log = path.extension().is_some_and(|e| e == "log");
        if in_wal || is_log {
            total += std::fs::metadata(path).map_or(0, |m| m.blocks() * 512);
        }
    })?;
    Ok(total)
}

/// Writes dirty pages back and drops the OS page cache (`sync; echo 3 >
/// /proc/sys/vm/drop_caches`), so one engine's cached files do not help or crowd the next.
/// False if not permitted (not root); the caller says so and goes on.
pub fn drop_page_cache() -> bool {
    // A failed `sync` only leaves dirtier caches behind; dropping still does what it can.
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn mincore_sees_a_read_file_and_not_a_dropped_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut f = File::create(&path).unwrap();
        f.write_all(&vec![7u8; 1 << 20]).unwrap();
        f.sync_all().unwrap();
        // Just written through the page cache: resident (at least most of it).
        let written = resident_bytes(&path).unwrap();
        assert!(written >= 512 << 10, "{written}");
        // Evict it (fadvise DONTNEED works on clean pages without root), then read a half.
        // SAFETY: a valid open descriptor; advice has no memory-safety effect.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0);
        let after_drop = resident_bytes(&path).unwrap();
        assert!(after_drop < 256 << 10, "{after_drop}");
        let mut half = vec![0u8; 512 << 10];
        File::open(&path).unwrap().read_exact(&mut half).unwrap();
        let after_read = resident_bytes(&path).unwrap();
        assert!(after_read >= 512 << 10, "{after_read}");
        assert!(after_read <= 1 << 20);
        // A fresh empty file has nothing resident, and the directory sum sees the first.
        File::create(dir.path().join("empty")).unwrap();
        assert_eq!(resident_bytes(&dir.path().join("empty")).unwrap(), 0);
        assert_eq!(dir_resident(dir.path()).unwrap(), after_read);
        assert!(dir_disk_bytes(dir.path()).unwrap() >= 1 << 20);
        assert_eq!(dir_log_bytes(dir.path()).unwrap(), 0);
    }

    #[test]
    fn log_files_are_those_in_wal_or_named_log() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("wal")).unwrap();
        for (name, bytes) in [
            ("data", 64 << 10),
            ("wal/seg-1", 16 << 10),
            ("000012.log", 8 << 10),
        ] {
            let mut f = File::create(dir.path().join(name)).unwrap();
            f.write_all(&vec![1u8; bytes]).unwrap();
            f.sync_all().unwrap();
        }
        assert_eq!(dir_log_bytes(dir.path()).unwrap(), 24 << 10);
        assert_eq!(dir_disk_bytes(dir.path()).unwrap(), 88 << 10);
    }

    #[test]
    fn status_and_smaps_parse() {
        let text = "Name:\tpeers\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nRssFile:\t 12 kB\n";
        assert_eq!(
            parse_status(text),
            Some(Status {
                peak_rss: 2 << 20,
                rss: 1 << 20
            })
        );
        assert_eq!(parse_status("VmRSS: 1 kB\n"), None);
        let smaps = "\
7f00-7f10 r--s 00000000 fd:00 123 /data/db/data.mdb
Size:                 64 kB
Rss:                  40 kB
7f20-7f30 r-xp 00000000 fd:00 124 /usr/lib/libc.so.6
Rss:                 100 kB
7f40-7f50 rw-p 00000000 00:00 0
Rss:                   8 kB
7f60-7f70 r--s 00000000 fd:00 125 /data/db/sub/lock.mdb
Rss:                   4 kB
";
        assert_eq!(parse_smaps_under(smaps, Path::new("/data/db")), 44 << 10);
        assert_eq!(parse_smaps_under(smaps, Path::new("/data/other")), 0);
        assert_eq!(footprint(100, 50, 30), 120);
        assert_eq!(footprint(100, 10, 30), 100);
    }

    #[test]
    fn peak_rss_resets_to_current() {
        // Touch 64 MiB, free it, reset: the peak drops back near the current RSS.
        let big = vec![1u8; 64 << 20];
        assert_eq!(
            big.iter().step_by(4096).map(|&b| b as usize).sum::<usize>(),
            16384
        );
        drop(big);
        let before = status().unwrap();
        assert!(before.peak_rss >= 64 << 20);
        if reset_peak_rss() {
            let after = status().unwrap();
            assert!(after.peak_rss < before.peak_rss, "{after:?} {before:?}");
        }
    }
}
