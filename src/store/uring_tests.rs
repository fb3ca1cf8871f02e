//! Tests of the `io_uring` path itself: error mapping, zero fill past the end of the file,
//! the per-completion check of a batch larger than the ring, and requests abandoned when
//! the ring can no longer be waited on.

use super::uring;
use super::PageBuf;
use crate::error::Result;

/// A file in `dir` of `n` chunks of 512 bytes, chunk `i` filled with the byte `i as u8`.
fn numbered_file(dir: &std::path::Path, n: usize) -> std::fs::File {
    let path = dir.join("numbered");
    let mut data = vec![0u8; n * 512];
    for (i, chunk) in data.chunks_mut(512).enumerate() {
        chunk.fill(i as u8);
    }
    std::fs::write(&path, &data).unwrap();
    std::fs::File::open(&path).unwrap()
}

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
    let n = 600usize;
    let file = numbered_file(dir.path(), n);
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

/// A streamed read takes requests as its source yields them and submits the first before
/// the source is done: the file is in the page cache, where the kernel completes a read
/// as it is submitted, so the first checks run before the source yields its last request.
/// Every request is checked once. The source cannot start a batch of its own on the ring;
/// an error from it is the read's error; a panic in it unwinds once nothing is in flight,
/// and the thread's ring still works afterwards.
#[test]
fn io_uring_streams_requests_as_the_source_yields_them() {
    use std::cell::RefCell;
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    let n = 64usize;
    let file = numbered_file(dir.path(), n);
    let fd = file.as_raw_fd();
    let mut bufs: Vec<PageBuf> = (0..n).map(|_| PageBuf::new(512)).collect();
    let ptrs: Vec<*mut u8> = bufs.iter_mut().map(|b| b.as_mut_ptr()).collect();
    let req = |i: usize| uring::Request {
        ptr: ptrs[i],
        len: 512,
        offset: (i * 512) as u64,
    };
    // (whether a check, request index), in the order they happened.
    let events = RefCell::new(Vec::new());
    let mut nested = None;
    let source = (0..n).map(|i| {
        events.borrow_mut().push((false, i));
        if i == 3 {
            let mut spare = PageBuf::new(512);
            let own = uring::Request {
                ptr: spare.as_mut_ptr(),
                len: 512,
                offset: 0,
            };
            // SAFETY: `spare` outlives the call and is not touched during it.
            let r = unsafe {
                uring::run(
                    fd,
                    uring::Dir::Read,
                    [Ok::<_, ()>(own)].into_iter(),
                    |_, _| Ok(()),
                )
            };
            nested = Some(matches!(r, Err(uring::Failure::Io(_))));
        }
        Ok::<_, usize>(req(i))
    });
    let check = |i: usize, bytes: &[u8]| -> Result<(), usize> {
        assert!(
            bytes.iter().all(|&b| b == i as u8),
            "request {i} checked early"
        );
        events.borrow_mut().push((true, i));
        Ok(())
    };
    // SAFETY: the buffers outlive the call and are only read through `check`.
    unsafe { uring::read_streamed(fd, source, check) }.unwrap();
    assert_eq!(nested, Some(true), "a batch inside the source must fail");
    let events = events.into_inner();
    let mut checked: Vec<usize> = events.iter().filter(|e| e.0).map(|e| e.1).collect();
    checked.sort_unstable();
    assert_eq!(checked, (0..n).collect::<Vec<_>>());
    let first_check = events.iter().position(|e| e.0).unwrap();
    let last_yield = events.iter().rposition(|e| !e.0).unwrap();
    assert!(
        first_check < last_yield,
        "nothing was submitted before the source ended"
    );
    // An error from the source ends the read.
    let source = (0..n).map(|i| if i == 20 { Err(i) } else { Ok(req(i)) });
    // SAFETY: as above.
    let r = unsafe { uring::read_streamed(fd, source, |_, _| Ok(())) };
    assert!(matches!(r, Err(uring::Failure::Caller(20))), "{r:?}");
    // A panic in the source.
    let source = (0..n).map(|i| {
        assert!(i != 20, "the source fails");
        Ok::<_, ()>(req(i))
    });
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: as above; the call unwinds only once no request is in flight.
        unsafe { uring::read_streamed(fd, source, |_, _| Ok(())) }
    }));
    assert!(panicked.is_err());
    let source = (0..n).map(|i| Ok::<_, ()>(req(i)));
    // SAFETY: as above.
    unsafe { uring::read_streamed(fd, source, |_, _| Ok(())) }.unwrap();
    drop(bufs);
}

/// Waits that keep failing while the kernel holds requests: the batch gives up after a
/// bounded time with `Abandoned` and the indices of the requests still held (instead of
/// stopping the process), and the thread's next batch runs on a new ring.
#[test]
fn io_uring_abandons_requests_it_cannot_wait_for() {
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("held");
    let n = 64usize;
    std::fs::write(&path, vec![0x5A; n * 4096]).unwrap();
    // Direct reads go to the device, so they are still in flight when the wait fails (reads
    // from the page cache complete during the submission itself).
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        let mut options = std::fs::OpenOptions::new();
        options.read(true);
        match options.clone().custom_flags(libc::O_DIRECT).open(&path) {
            Ok(file) => file,
            Err(_) => return, // a file system without O_DIRECT (tmpfs): nothing to hold
        }
    };
    let mut bufs: Vec<PageBuf> = (0..n).map(|_| PageBuf::new(4096)).collect();
    let list: Vec<_> = bufs
        .iter_mut()
        .enumerate()
        .map(|(i, b)| {
            Ok::<_, ()>(uring::Request {
                ptr: b.as_mut_ptr(),
                len: 4096,
                offset: (i * 4096) as u64,
            })
        })
        .collect();
    uring::FAIL_WAITS.set(true);
    let started = std::time::Instant::now();
    // SAFETY: the buffers are leaked below, whatever the outcome; `file` outlives the call.
    let r = unsafe {
        uring::run(
            file.as_raw_fd(),
            uring::Dir::Read,
            list.into_iter(),
            |_, _| Ok(()),
        )
    };
    uring::FAIL_WAITS.set(false);
    // The kernel may still write any of them.
    std::mem::forget(bufs);
    match r {
        Err(uring::Failure::Abandoned(e, held)) => {
            assert_eq!(e.raw_os_error(), Some(libc::EFAULT));
            assert!(!held.is_empty() && held.iter().all(|&i| i < n), "{held:?}");
        }
        other => panic!("expected Abandoned, got {other:?}"),
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    let mut buf = PageBuf::new(4096);
    let req = uring::Request {
        ptr: buf.as_mut_ptr(),
        len: 4096,
        offset: 4096,
    };
    // SAFETY: `buf` outlives the call and is not touched during it.
    unsafe {
        uring::run(
            file.as_raw_fd(),
            uring::Dir::Read,
            [Ok::<_, ()>(req)].into_iter(),
            |_, _| Ok(()),
        )
    }
    .unwrap();
    assert!(buf.iter().all(|&b| b == 0x5A));
}

/// A file store whose requests were abandoned hands the caller fresh buffers in place of
/// the ones the kernel may still write, and refuses every later read, write and flush;
/// the file opens again normally.
#[test]
fn file_store_refuses_io_after_abandoned_requests() {
    use super::file::{Backend, FileStore};
    use super::PageStore;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d");
    let store = FileStore::open(&path, 4096, Backend::IoUring).unwrap();
    if !store.is_direct() {
        return; // reads from the page cache complete during submission: nothing is held
    }
    let pages: Vec<_> = (0..8).map(|_| store.allocate().unwrap()).collect();
    let mut bufs: Vec<PageBuf> = (0..8).map(|_| PageBuf::new(4096)).collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        b[100] = i as u8;
    }
    store.write_batch(&pages, &mut bufs).unwrap();
    store.sync().unwrap();
    let before: Vec<*const u8> = bufs.iter().map(|b| b.as_ptr()).collect();
    uring::FAIL_WAITS.set(true);
    let r = store.read_batch(&pages, &mut bufs);
    uring::FAIL_WAITS.set(false);
    assert!(matches!(r, Err(crate::Error::Io { .. })), "{r:?}");
    let swapped = bufs
        .iter()
        .zip(&before)
        .filter(|(b, &p)| b.as_ptr() != p)
        .count();
    assert!(swapped > 0, "no buffer was handed over");
    assert!(matches!(
        store.read_batch(&pages, &mut bufs),
        Err(crate::Error::Io { .. })
    ));
    assert!(matches!(
        store.write_batch(&pages, &mut bufs),
        Err(crate::Error::Io { .. })
    ));
    assert!(matches!(store.sync(), Err(crate::Error::Io { .. })));
    drop(store);
    let store = FileStore::open(&path, 4096, Backend::IoUring).unwrap();
    store.read_batch(&pages, &mut bufs).unwrap();
    for (i, b) in bufs.iter().enumerate() {
        assert_eq!(b[100], i as u8);
    }
}
