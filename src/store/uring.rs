//! The `io_uring` I/O path: one ring per thread, created lazily and shared by every store the
//! thread uses (the file descriptor travels with each request), so the I/O path takes no
//! lock and two threads never share a ring or each other's completions.
//!
//! A batch keeps the ring full: every completion is handed to the caller's check (the
//! store verifies the page checksum there) while the rest of the batch is still in flight,
//! and its slot is refilled with the next request of a batch larger than the ring. The
//! per-request state lives in the ring's scratch vectors, so a batch allocates nothing once
//! the thread has run one as large.
//!
//! Registered (fixed) buffers and files are not used: the buffers belong to the callers
//! (any `PageBuf`), so fixed buffers would cost a registration or a copy per batch, and a
//! ring shared by every store of a thread cannot keep a registered file safely (a
//! registration pins the file, and a closed descriptor's number is reused). The bench
//! measures what they would buy at most (`bare_io_uring_fixed`); see docs/benchmarks.md.

use std::cell::RefCell;
use std::io;
use std::os::fd::RawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};

use io_uring::{opcode, squeue, types, IoUring};

/// Submission queue entries per ring, and the most requests a ring keeps in flight (the
/// completion queue is twice as large, so it never overflows).
const RING_ENTRIES: u32 = 256;

/// Completions a read batch waits for at a time once all its requests are in flight.
const READ_WAKE: usize = 8;

/// Requests' worth of scratch space a ring keeps between batches.
const SCRATCH_KEPT: usize = 4096;

/// How many times in a row waiting for in-flight requests may fail (1 ms apart) before the
/// batch gives up on them: their buffers are then the kernel's for good (`Failure::Abandoned`).
const MAX_WAIT_FAILURES: u32 = 100;

/// One request: `len` bytes between `ptr` and file offset `offset`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Request {
    /// Start of the buffer.
    pub(super) ptr: *mut u8,
    /// Bytes to transfer.
    pub(super) len: usize,
    /// File offset of the first byte.
    pub(super) offset: u64,
}

/// A request of the running batch and how far it got.
#[derive(Debug)]
struct Op {
    /// What to transfer.
    req: Request,
    /// Bytes transferred so far (a short transfer is resubmitted for the rest).
    done: usize,
    /// Whether the kernel holds the request (submitted, its completion not yet seen).
    inflight: bool,
}

/// A thread's ring, the next `user_data` it hands out, and the scratch space of a batch.
struct Ring {
    /// The ring itself.
    uring: IoUring,
    /// Request ids are unique per ring: a batch of n takes n consecutive ids.
    next_id: u64,
    /// Set when the ring must never be used again (a failed submission may have left
    /// entries in the queue); `with_ring` drops it.
    broken: bool,
    /// The running batch's requests (kept between batches for its capacity).
    ops: Vec<Op>,
    /// Indices of requests to submit again (a transient error or a short transfer).
    retry: Vec<usize>,
}

impl Ring {
    /// A new ring. `SINGLE_ISSUER | DEFER_TASKRUN` (Linux 6.1+) lets the kernel post
    /// completions only when this thread waits for them, instead of interrupting it for
    /// each; the ring is only ever used by the thread that created it, as those flags need.
    /// Older kernels refuse the flags, and then a plain ring is used.
    fn new() -> io::Result<Ring> {
        let ring = match IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(RING_ENTRIES)
        {
            Ok(ring) => ring,
            Err(_) => IoUring::new(RING_ENTRIES)?,
        };
        Ok(Ring {
            uring: ring,
            next_id: 0,
            broken: false,
            ops: Vec::new(),
            retry: Vec::new(),
        })
    }
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

/// Why a batch failed.
#[derive(Debug)]
pub(super) enum Failure<E> {
    /// An I/O error (from the kernel or from setting up the ring).
    Io(io::Error),
    /// The error the caller's check or request list returned.
    Caller(E),
    /// Waiting for completions kept failing while the kernel still held the requests at
    /// these indices: it may still read or write their buffers at any later time, so the
    /// caller must never free or reuse them (leak them), and must treat whatever those
    /// requests may yet do to the file as unknown.
    Abandoned(io::Error, Vec<usize>),
}

/// Creates this thread's ring if needed, so a store can refuse to open where `io_uring` is
/// unavailable (old kernel, seccomp, `io_uring_disabled`).
pub(super) fn probe() -> io::Result<()> {
    with_ring(|_| ())
}

/// Runs `f` with this thread's ring.
fn with_ring<R>(f: impl FnOnce(&mut Ring) -> R) -> io::Result<R> {
    RING.try_with(|cell| {
        let mut slot = cell
            .try_borrow_mut()
            .map_err(|_| io::Error::other("this thread's io_uring ring is already in use"))?;
        let ring = match slot.as_mut() {
            Some(ring) => ring,
            None => slot.insert(Ring::new()?),
        };
        let result = f(ring);
        if ring.broken {
            *slot = None;
        }
        Ok(result)
    })
    .map_err(|_| io::Error::other("io_uring used during thread teardown"))?
}

/// Whether an errno means "try again".
fn transient(errno: i32) -> bool {
    errno == libc::EINTR || errno == libc::EAGAIN || errno == libc::EBUSY
}

/// Performs every request of `reqs` on `fd` and returns once none is in flight. Reads past
/// the end of the file fill the rest of the buffer with zeros. As soon as request `i` has
/// transferred all its bytes, `check(i, bytes)` runs on its buffer while later requests are
/// still in flight. Returns the first error (of `reqs`, of the kernel or of `check`); after
/// an error nothing more is submitted, and `check` is not called again. A panic in `check`
/// is resumed once no request is in flight (unless requests are abandoned, see below).
///
/// `reqs` is consumed before anything is submitted, so an error in it means no I/O was done.
///
/// # Safety
/// Every request's `ptr` must be valid for `len` bytes of reads and (for `Dir::Read`)
/// writes, and not otherwise accessed, until this returns (except through the slice passed
/// to `check`); `fd` must stay open until then. After `Failure::Abandoned`, the buffers of
/// the read requests it lists must never be freed or used again (the kernel may still write
/// them); an abandoned write only reads its buffer, so reusing that is safe for the
/// process, and only what the write may still put in the file is unknown.
pub(super) unsafe fn run<E>(
    fd: RawFd,
    dir: Dir,
    reqs: impl Iterator<Item = Result<Request, E>>,
    mut check: impl FnMut(usize, &[u8]) -> Result<(), E>,
) -> Result<(), Failure<E>> {
    with_ring(|r| {
        r.ops.clear();
        r.retry.clear();
        for req in reqs {
            r.ops.push(Op {
                req: req.map_err(Failure::Caller)?,
                done: 0,
                inflight: false,
            });
        }
        // SAFETY: forwarded from this function's contract.
        let outcome = unsafe { drive(r, fd, dir, &mut std::iter::empty(), &mut check) };
        finish(r, outcome)
    })
    .map_err(Failure::Io)?
}

/// Reads requests as `reqs` yields them: while it still yields, every `STREAM_GROUP` of them
/// are submitted without waiting, so the device works on the first while the caller is
/// still finding the next. Otherwise as [`run`] for `Dir::Read`, except that an error from
/// `reqs` may come after I/O was done (the requests already yielded complete first), and a
/// panic in `reqs` is resumed once none of them is in flight.
///
/// `reqs` runs while this thread's ring is in use: it must do no I/O through it (a nested
/// batch fails with an error).
///
/// # Safety
/// As for [`run`], for every request `reqs` yields, from when it yields it.
pub(super) unsafe fn read_streamed<E>(
    fd: RawFd,
    mut reqs: impl Iterator<Item = Result<Request, E>>,
    mut check: impl FnMut(usize, &[u8]) -> Result<(), E>,
) -> Result<(), Failure<E>> {
    with_ring(|r| {
        r.ops.clear();
        r.retry.clear();
        // SAFETY: forwarded from this function's contract.
        let outcome = unsafe { drive(r, fd, Dir::Read, &mut reqs, &mut check) };
        finish(r, outcome)
    })
    .map_err(Failure::Io)?
}

/// Requests a streamed read submits together while its source still yields: few enough
/// that the device starts on the first soon, enough that a submission's system call is
/// shared by several.
const STREAM_GROUP: usize = 4;

/// What ends a batch whose `drive` returned `outcome`: the ring's request ids move past the
/// batch's, its scratch space is trimmed, and a panic of the caller's code is resumed.
fn finish<E>(r: &mut Ring, outcome: Outcome<E>) -> Result<(), Failure<E>> {
    r.next_id = r.next_id.wrapping_add(r.ops.len() as u64);
    // A rare huge batch should not pin its scratch space for the thread's lifetime.
    r.ops.shrink_to(SCRATCH_KEPT);
    r.retry.shrink_to(SCRATCH_KEPT);
    match outcome {
        Outcome::Done(result) => result,
        Outcome::Panicked(payload) => std::panic::resume_unwind(payload),
    }
}

/// How a batch's `drive` ended.
enum Outcome<E> {
    /// Every request completed or failed (or was abandoned).
    Done(Result<(), Failure<E>>),
    /// The caller's source or check panicked; no request is in flight any more.
    Panicked(Box<dyn std::any::Any + Send>),
}

/// Runs the batch in `r.ops`, then the requests `source` yields (see [`run`] and
/// [`read_streamed`]). A panic of `source` or `check` stops the batch like an error and is
/// returned once no request is in flight; if requests must be abandoned instead, the
/// caller hears of them (`Failure::Abandoned`) and the panic is dropped, so that it never
/// unwinds past buffers the kernel may still write.
///
/// # Safety
/// As for [`run`], for every request in `r.ops` and every request `source` yields.
unsafe fn drive<E>(
    r: &mut Ring,
    fd: RawFd,
    dir: Dir,
    source: &mut impl Iterator<Item = Result<Request, E>>,
    check: &mut impl FnMut(usize, &[u8]) -> Result<(), E>,
) -> Outcome<E> {
    let base = r.next_id;
    let mut next = 0usize;
    let mut inflight = 0usize;
    let mut first_err: Option<Failure<E>> = None;
    let mut panicked: Option<Box<dyn std::any::Any + Send>> = None;
    let mut hard_failures = 0u32;
    // Whether `source` has nothing more to yield, and how many it yielded since the last
    // submission.
    let mut drained = false;
    let mut pulled = 0usize;
    loop {
        let mut sq = r.uring.submission();
        while first_err.is_none()
            && panicked.is_none()
            && !sq.is_full()
            && inflight < RING_ENTRIES as usize
        {
            let i = match r.retry.pop() {
                Some(i) => i,
                None if next < r.ops.len() => {
                    next += 1;
                    next - 1
                }
                None if drained || pulled == STREAM_GROUP => break,
                None => match catch_unwind(AssertUnwindSafe(|| source.next())) {
                    Ok(Some(Ok(req))) => {
                        r.ops.push(Op {
                            req,
                            done: 0,
                            inflight: false,
                        });
                        pulled += 1;
                        next += 1;
                        next - 1
                    }
                    Ok(Some(Err(e))) => {
                        first_err = Some(Failure::Caller(e));
                        break;
                    }
                    Ok(None) => {
                        drained = true;
                        break;
                    }
                    Err(payload) => {
                        panicked = Some(payload);
                        break;
                    }
                },
            };
            let op = &r.ops[i];
            // SAFETY: `done < len`, so the pointer stays inside the caller's buffer.
            let ptr = unsafe { op.req.ptr.add(op.done) };
            let len = (op.req.len - op.done) as u32;
            let offset = op.req.offset + op.done as u64;
            let entry: squeue::Entry = match dir {
                Dir::Read => opcode::Read::new(types::Fd(fd), ptr, len)
                    .offset(offset)
                    .build(),
                Dir::Write => opcode::Write::new(types::Fd(fd), ptr, len)
                    .offset(offset)
                    .build(),
            };
            // SAFETY: the buffer and fd outlive the request: this function does not return
            // while `inflight > 0` (the caller's contract covers the rest).
            if unsafe { sq.push(&entry.user_data(base.wrapping_add(i as u64))) }.is_err() {
                r.retry.push(i);
                break;
            }
            r.ops[i].inflight = true;
            inflight += 1;
        }
        drop(sq);
        pulled = 0;
        if inflight == 0 {
            let stopped = first_err.is_some() || panicked.is_some();
            if stopped || drained && next == r.ops.len() && r.retry.is_empty() {
                break;
            }
            continue;
        }
        // While the source still yields and the ring has room, submit without waiting and
        // go back for more. With requests left to submit, wait for one completion to refill
        // its slot. Once everything is queued, a write batch sleeps once for the whole last
        // wave; a read batch wakes for every `READ_WAKE` completions, so that the checks of
        // the pages already read run while the rest are still in flight, not all after the
        // last.
        let stopped = first_err.is_some() || panicked.is_some();
        let all_queued = (drained || stopped) && next == r.ops.len() && r.retry.is_empty();
        let want = match dir {
            _ if !drained && !stopped && inflight < RING_ENTRIES as usize => 0,
            _ if !all_queued => 1,
            Dir::Read => inflight.min(READ_WAKE),
            Dir::Write => inflight,
        };
        match submit_and_wait(r, want) {
            Ok(_) => hard_failures = 0,
            Err(e) if e.raw_os_error().is_some_and(transient) => {}
            // io_uring_enter fails only when it took nothing from the queue and waited for
            // nothing. Entries still queued will never reach the kernel (the ring is
            // discarded), so only the others are in flight, and their buffers cannot be
            // released before they complete: keep waiting for them, for a while.
            Err(e) => {
                r.broken = true;
                if inflight == r.uring.submission().len() {
                    first_err.get_or_insert(Failure::Io(e));
                    break;
                }
                hard_failures += 1;
                if hard_failures > MAX_WAIT_FAILURES {
                    // The ring is dropped (closing it asks the kernel to cancel what it
                    // still holds), but a request already at the device may still land:
                    // its buffer is handed over for good.
                    let held = r.ops.iter().enumerate().filter(|(_, op)| op.inflight);
                    let held = held.map(|(i, _)| i).collect();
                    return Outcome::Done(Err(Failure::Abandoned(e, held)));
                }
                first_err.get_or_insert(Failure::Io(e));
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        for cqe in r.uring.completion() {
            let i = cqe.user_data().wrapping_sub(base) as usize;
            let Some(op) = r.ops.get_mut(i) else {
                debug_assert!(false, "completion for a request of another batch");
                continue;
            };
            op.inflight = false;
            inflight -= 1;
            let res = cqe.result();
            if res < 0 {
                if transient(-res) {
                    r.retry.push(i);
                } else if first_err.is_none() {
                    first_err = Some(Failure::Io(io::Error::from_raw_os_error(-res)));
                }
                continue;
            }
            if res == 0 {
                if dir == Dir::Write {
                    first_err.get_or_insert_with(|| Failure::Io(io::ErrorKind::WriteZero.into()));
                    continue;
                }
                // End of file: the rest of the page was never written.
                // SAFETY: `done < len`; the range lies inside the caller's buffer.
                unsafe { op.req.ptr.add(op.done).write_bytes(0, op.req.len - op.done) };
                op.done = op.req.len;
            } else {
                op.done += res as usize;
                if op.done < op.req.len {
                    r.retry.push(i);
                    continue;
                }
            }
            if first_err.is_none() && panicked.is_none() {
                // SAFETY: the request is complete, so the kernel no longer touches the
                // buffer, and the caller lets nothing else access it during the batch.
                let bytes = unsafe { std::slice::from_raw_parts(op.req.ptr, op.req.len) };
                match catch_unwind(AssertUnwindSafe(|| check(i, bytes))) {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => first_err = Some(Failure::Caller(e)),
                    Err(payload) => panicked = Some(payload),
                }
            }
        }
    }
    match (panicked, first_err) {
        (Some(payload), _) => Outcome::Panicked(payload),
        (None, Some(e)) => Outcome::Done(Err(e)),
        (None, None) => Outcome::Done(Ok(())),
    }
}

/// `io_uring_enter`: submits what is queued and waits for `want` completions.
#[cfg(not(test))]
fn submit_and_wait(r: &mut Ring, want: usize) -> io::Result<usize> {
    r.uring.submit_and_wait(want)
}

#[cfg(test)]
thread_local! {
    /// Tests: while set, every wait on this thread fails with `EFAULT` once the queue has
    /// been handed to the kernel (what a ring that can no longer be waited on looks like).
    pub(super) static FAIL_WAITS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `io_uring_enter`, or its injected failure (see [`FAIL_WAITS`]).
#[cfg(test)]
fn submit_and_wait(r: &mut Ring, want: usize) -> io::Result<usize> {
    if FAIL_WAITS.get() {
        r.uring.submit()?;
        return Err(io::Error::from_raw_os_error(libc::EFAULT));
    }
    r.uring.submit_and_wait(want)
}
