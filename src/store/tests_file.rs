//! Tests of the file store: page sizes fixed at creation and read back, the previous
//! format refused, buffered I/O where `O_DIRECT` is refused, the file grown ahead of use.

use super::tests::{assert_corrupt, assert_payload, pattern, Files, Harness, P};
use super::*;
use crate::error::Error;

#[test]
fn page_size_is_checked_and_fixed_at_creation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d");
    assert!(matches!(
        FileStore::open(&path, 3000, Backend::Pread),
        Err(Error::InvalidConfig { .. })
    ));
    assert!(matches!(
        FileStore::open(&path, 128 << 10, Backend::Pread),
        Err(Error::InvalidConfig { .. })
    ));
    let s = FileStore::open(&path, 16384, Backend::Pread).unwrap();
    let p = s.allocate().unwrap();
    let mut buf = PageBuf::new(16384);
    buf[16383] = 7;
    s.write(p, &mut buf).unwrap();
    s.sync().unwrap();
    drop(s);
    let r = FileStore::open(&path, 4096, Backend::Pread);
    assert!(matches!(r, Err(Error::InvalidConfig { .. })), "{r:?}");
    let s = FileStore::open(&path, 16384, Backend::Pread).unwrap();
    s.read(p, &mut buf).unwrap();
    assert_eq!(buf[16383], 7);
}

/// `open_keeping_size` takes an existing file's page size, from slot 0 or, when slot 0 is
/// damaged, from slot 1; a new file gets the size given.
#[test]
fn an_existing_file_keeps_its_page_size_even_with_slot_0_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d");
    let s = FileStore::open(&path, 16384, Backend::Pread).unwrap();
    let mut buf = PageBuf::new(16384);
    buf[16383] = 7;
    let p = s.allocate().unwrap();
    s.write(p, &mut buf).unwrap();
    s.sync().unwrap();
    // A second superblock, so that both slots name page `p`.
    let q = s.allocate().unwrap();
    s.write(q, &mut buf).unwrap();
    s.sync().unwrap();
    drop(s);
    let s = FileStore::open_keeping_size(&path, 8192, Backend::Pread).unwrap();
    assert_eq!(s.page_size(), 16384);
    drop(s);
    let pristine = std::fs::read(&path).unwrap();
    // Slot 0's checksum broken (its size field intact), then its size field garbage.
    for (at, flip) in [(100, 0xff), (21, 0x5a)] {
        let mut bytes = pristine.clone();
        bytes[at] ^= flip;
        std::fs::write(&path, &bytes).unwrap();
        let s = FileStore::open_keeping_size(&path, 8192, Backend::Pread).unwrap();
        assert_eq!(s.page_size(), 16384, "byte {at} damaged");
        let mut back = PageBuf::new(16384);
        s.read(p, &mut back).unwrap();
        assert_eq!(back[16383], 7);
    }
    let fresh = FileStore::open_keeping_size(&dir.path().join("e"), 8192, Backend::Pread);
    assert_eq!(fresh.unwrap().page_size(), 8192);
}

/// A data file of the format before keyspaces (bare keys) is refused with a reason that
/// says so, not read as keys of some keyspace.
#[test]
fn a_data_file_of_the_previous_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d");
    drop(FileStore::open(&path, P, Backend::Pread).unwrap());
    let mut bytes = std::fs::read(&path).unwrap();
    for slot in 0..2 {
        let sb = &mut bytes[slot * P..(slot + 1) * P];
        if &sb[8..16] == b"BFKVSTOR" {
            sb[16..20].copy_from_slice(&1u32.to_le_bytes());
            page::stamp(slot as PageNo, page::Kind::Superblock, sb);
        } else {
            sb.fill(0); // never written: the reason comes from the other slot
        }
    }
    std::fs::write(&path, &bytes).unwrap();
    match FileStore::open(&path, P, Backend::Pread) {
        Err(Error::Corruption { reason, .. }) => {
            assert!(reason.contains("before keyspaces"), "{reason}");
        }
        other => panic!("expected Corruption, got {other:?}"),
    }
}

#[test]
fn falls_back_to_buffered_io_where_o_direct_is_refused() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        return;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    // Older kernels' tmpfs refuses O_DIRECT (EINVAL) and the store falls back to buffered
    // I/O; newer ones accept it. Either way the store must work.
    let s = FileStore::open(&dir.path().join("d"), P, Backend::Pread).unwrap();
    let p = s.allocate().unwrap();
    s.write(p, &mut pattern(1)).unwrap();
    let mut buf = PageBuf::new(P);
    s.read(p, &mut buf).unwrap();
    assert_payload(&buf, 1);
}

/// The data file is extended ahead of the pages written (so new pages are written inside
/// it), the store's page count, not the file's length, says which pages exist, and a
/// reopened store neither hands out nor reads the preallocated tail as data.
#[test]
fn the_file_grows_ahead_of_the_pages_in_use() {
    for backend in [Backend::Pread, Backend::IoUring] {
        if backend == Backend::IoUring && !cfg!(target_os = "linux") {
            continue;
        }
        let h = Files::new(backend);
        let s = h.make();
        let mut written = Vec::new();
        for i in 0..300u64 {
            let p = s.allocate().unwrap();
            s.write(p, &mut pattern(i)).unwrap();
            written.push((p, i));
        }
        s.sync().unwrap();
        let len = std::fs::metadata(s.path()).unwrap().len();
        let pages = s.stats().file_pages;
        assert!(
            len >= pages * P as u64,
            "{backend:?}: file shorter than its pages"
        );
        assert_eq!(
            len % super::file::GROW_MIN,
            0,
            "{backend:?}: grown in chunks"
        );
        assert!(len > pages * P as u64, "{backend:?}: nothing preallocated");
        let s = h.reopen(s).unwrap().unwrap();
        assert_eq!(
            s.stats().file_pages,
            pages,
            "{backend:?}: page count from superblock"
        );
        let mut buf = PageBuf::new(P);
        for &(p, i) in &written {
            s.read(p, &mut buf).unwrap();
            assert_payload(&buf, i);
        }
        // A page of the preallocated tail was never written: corrupt, not data.
        assert_corrupt(s.read(pages, &mut buf), pages);
        // New pages continue after the page count, not after the file's end.
        assert_eq!(s.allocate().unwrap(), pages);
    }
}
