//! The io_uring I/O path: one ring per thread, created lazily and shared by every store the
//! thread uses (the file descriptor travels with each request), so the I/O path takes no
//! lock and two threads never share a ring or each other's completions.

use std::cell::RefCell;
use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, squeue, types, IoUring};

/// Submission queue entries per ring: requests in flight at once. A larger batch runs in
/// waves of this many.
const RING_ENTRIES: u32 = 256;

/// A thread's ring and the next `user_data` it hands out.
struct Ring {
    /// The ring itself.
    ring: IoUring,
    /// Request ids are unique per ring: a batch of n takes n consecutive ids.
    next_id: u64,
}

thread_local! {
    /// This thread's ring, created on first use.
    static RING: RefCell<Option<Ring>> = const { RefCell::new(None) };
}

/// Which way a batch moves data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dir {
    /// File to memory.
    Read,
    /// Memory to file.
    Write,
}

/// One request of a batch: `len` bytes between `ptr` and file offset `offset`, of which
/// `done` are transferred.
#[derive(Debug)]
pub(super) struct Op {
    /// Start of the buffer.
    pub(super) ptr: *mut u8,
    /// Bytes to transfer.
    pub(super) len: usize,
    /// File offset of the first byte.
    pub(super) offset: u64,
    /// Bytes transferred so far (a short transfer is resubmitted for the rest).
    pub(super) done: usize,
}

/// Creates this thread's ring if needed, so a store can refuse to open where io_uring is
/// unavailable (old kernel, seccomp, `io_uring_disabled`).
pub(super) fn probe() -> io::Result<()> {
    with_ring(|_| Ok(()))
}

/// Runs `f` with this thread's ring.
fn with_ring<R>(f: impl FnOnce(&mut Ring) -> io::Result<R>) -> io::Result<R> {
    RING.try_with(|cell| {
        let mut slot = cell
            .try_borrow_mut()
            .map_err(|_| io::Error::other("this thread's io_uring ring is already in use"))?;
        let ring = match slot.as_mut() {
            Some(ring) => ring,
            None => slot.insert(Ring {
                ring: IoUring::new(RING_ENTRIES)?,
                next_id: 0,
            }),
        };
        let result = f(ring);
        if matches!(&result, Err(e) if e.kind() == io::ErrorKind::BrokenPipe) {
            // `submit` failed hard: unsubmitted entries may linger in the queue, so the
            // ring must never be used again.
            *slot = None;
        }
        result
    })
    .map_err(|_| io::Error::other("io_uring used during thread teardown"))?
}

/// Whether an errno means "try again".
fn transient(errno: i32) -> bool {
    errno == libc::EINTR || errno == libc::EAGAIN || errno == libc::EBUSY
}

/// Performs every op on `fd` and returns once none is in flight. Reads past the end of the
/// file fill the rest of the buffer with zeros. Returns the first error.
///
/// # Safety
/// Every `ops[i].ptr` must be valid for `ops[i].len` bytes of reads and (for `Dir::Read`)
/// writes, and not otherwise accessed, until this returns; `fd` must stay open until then.
pub(super) unsafe fn run(fd: RawFd, dir: Dir, ops: &mut [Op]) -> io::Result<()> {
    with_ring(|r| {
        let base = r.next_id;
        r.next_id = r.next_id.wrapping_add(ops.len() as u64);
        let mut pending: Vec<usize> = (0..ops.len()).rev().collect();
        let mut inflight = 0usize;
        let mut first_err: Option<io::Error> = None;
        loop {
            let mut sq = r.ring.submission();
            while first_err.is_none() && !sq.is_full() {
                let Some(i) = pending.pop() else { break };
                let op = &ops[i];
                // SAFETY: `done < len`, so the pointer stays inside the caller's buffer.
                let ptr = unsafe { op.ptr.add(op.done) };
                let len = (op.len - op.done) as u32;
                let offset = op.offset + op.done as u64;
                let entry: squeue::Entry = match dir {
                    Dir::Read => opcode::Read::new(types::Fd(fd), ptr, len)
                        .offset(offset)
                        .build(),
                    Dir::Write => opcode::Write::new(types::Fd(fd), ptr, len)
                        .offset(offset)
                        .build(),
                };
                // SAFETY: the buffer and fd outlive the request: this function does not
                // return while `inflight > 0` (the caller's contract covers the rest).
                if unsafe { sq.push(&entry.user_data(base.wrapping_add(i as u64))) }.is_err() {
                    pending.push(i);
                    break;
                }
                inflight += 1;
            }
            drop(sq);
            if inflight == 0 {
                break;
            }
            match r.ring.submit_and_wait(inflight) {
                Ok(_) => {}
                Err(e) if e.raw_os_error().is_some_and(transient) => {}
                // io_uring_enter fails only when it accepted nothing and waited for nothing,
                // so nothing of this batch is in flight; the ring is discarded (BrokenPipe).
                Err(e) => return Err(io::Error::new(io::ErrorKind::BrokenPipe, e)),
            }
            for cqe in r.ring.completion() {
                let i = cqe.user_data().wrapping_sub(base) as usize;
                let Some(op) = ops.get_mut(i) else {
                    debug_assert!(false, "completion for a request of another batch");
                    continue;
                };
                inflight -= 1;
                let res = cqe.result();
                if res < 0 {
                    if transient(-res) {
                        pending.push(i);
                    } else if first_err.is_none() {
                        first_err = Some(io::Error::from_raw_os_error(-res));
                    }
                } else if res == 0 {
                    if dir == Dir::Write {
                        first_err.get_or_insert_with(|| io::ErrorKind::WriteZero.into());
                    } else {
                        // End of file: the rest of the page was never written.
                        // SAFETY: `done < len`; the range lies inside the caller's buffer.
                        unsafe { op.ptr.add(op.done).write_bytes(0, op.len - op.done) };
                        op.done = op.len;
                    }
                } else {
                    op.done += res as usize;
                    if op.done < op.len {
                        pending.push(i);
                    }
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    })
}
