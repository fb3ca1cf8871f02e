//! Tests of the `io_uring` path itself: error mapping, zero fill past the end of the file,
//! and the per-completion check of a batch larger than the ring.

use super::uring;
use super::PageBuf;
use crate::error::Result;

#[test]
fn io_uring_maps_errors_and_zero_fills_past_the_end() {
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("short");
    std::fs::write(&path, vec![0xAB; 6000]).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let mut buf = PageBuf::new(8192);
    buf.fill(0xCD);
    let req = uring::Request {
        ptr: buf.as_mut_ptr(),
        len: 8192,
        offset: 0,
    };
    let mut checked = Vec::new();
    let check = |i: usize, bytes: &[u8]| -> Result<()> {
        checked.push((i, bytes.len(), bytes[5999], bytes[6000]));
        Ok(())
    };
    // SAFETY: `buf` outlives the call and is not touched during it; `file` is open.
    unsafe {
        uring::run(
            file.as_raw_fd(),
            uring::Dir::Read,
            [Ok(req)].into_iter(),
            check,
        )
    }
    .unwrap();
    assert_eq!(checked, [(0, 8192, 0xAB, 0)]);
    assert!(buf[..6000].iter().all(|&b| b == 0xAB) && buf[6000..].iter().all(|&b| b == 0));
    // Writing through a read-only descriptor: the kernel's -EBADF comes back as an error.
    let req = uring::Request {
        ptr: buf.as_mut_ptr(),
        len: 4096,
        offset: 0,
    };
    // SAFETY: as above.
    let r = unsafe {
        uring::run(
            file.as_raw_fd(),
            uring::Dir::Write,
            [Ok::<_, ()>(req)].into_iter(),
            |_, _| Ok(()),
        )
    };
    match r {
        Err(uring::Failure::Io(e)) => assert_eq!(e.raw_os_error(), Some(libc::EBADF)),
        other => panic!("expected EBADF, got {other:?}"),
    }
}

/// A batch larger than the ring (so slots are refilled as completions arrive): every
/// request is checked exactly once, after its bytes arrived; a failing check is the batch's
/// error; a bad request fails the batch before any I/O.
#[test]
fn io_uring_checks_each_completion_and_stops_at_the_first_failure() {
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("many");
    let n = 600usize;
    let mut data = vec![0u8; n * 512];
    for (i, chunk) in data.chunks_mut(512).enumerate() {
        chunk.fill(i as u8);
    }
    std::fs::write(&path, &data).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let mut bufs: Vec<PageBuf> = (0..n).map(|_| PageBuf::new(512)).collect();
    let reqs = |bufs: &mut Vec<PageBuf>| {
        bufs.iter_mut()
            .enumerate()
            .map(|(i, b)| {
                Ok(uring::Request {
                    ptr: b.as_mut_ptr(),
                    len: 512,
                    offset: (i * 512) as u64,
                })
            })
            .collect::<Vec<_>>()
    };
    let mut seen = vec![false; n];
    let check = |i: usize, bytes: &[u8]| -> Result<(), usize> {
        assert!(
            bytes.iter().all(|&b| b == i as u8),
            "request {i} checked before it arrived"
        );
        assert!(
            !std::mem::replace(&mut seen[i], true),
            "request {i} checked twice"
        );
        Ok(())
    };
    let list = reqs(&mut bufs);
    // SAFETY: the buffers outlive the call and are only read through `check`.
    unsafe { uring::run(file.as_raw_fd(), uring::Dir::Read, list.into_iter(), check) }.unwrap();
    assert!(seen.iter().all(|&s| s));
    let mut calls = 0;
    let failing = |i: usize, _: &[u8]| -> Result<(), usize> {
        calls += 1;
        if i == 300 {
            Err(i)
        } else {
            Ok(())
        }
    };
    let list = reqs(&mut bufs);
    // SAFETY: as above.
    let r = unsafe {
        uring::run(
            file.as_raw_fd(),
            uring::Dir::Read,
            list.into_iter(),
            failing,
        )
    };
    assert!(matches!(r, Err(uring::Failure::Caller(300))), "{r:?}");
    assert!(calls <= n);
    // A bad request stops the batch before any I/O.
    let list = reqs(&mut bufs).into_iter().chain([Err(7usize)]);
    let mut called = false;
    // SAFETY: as above.
    let r = unsafe {
        uring::run(file.as_raw_fd(), uring::Dir::Read, list, |_, _| {
            called = true;
            Ok(())
        })
    };
    assert!(matches!(r, Err(uring::Failure::Caller(7))) && !called);
}
