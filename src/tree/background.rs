//! Background work: eviction and checkpoints.
//!
//! Evictor threads (paper §4.3: evictions run concurrently, the head advances in order) keep
//! free room at the tail of the circular buffer above a low-water mark, so writers seldom stop
//! to write a leaf themselves; several evictions in flight also keep several disk I/Os in
//! flight, which a single thread evicting synchronously cannot. Each evicts a run of blocks
//! at a time, their leaves written back in one batch first (`clean.rs`). A writer that still
//! finds the buffer full evicts one block itself (that path guarantees progress); the threads
//! only add throughput.
//!
//! The first evictor also writes buffered changes back to their leaves once writes have
//! paused for `Config::idle_write_back` (`clean.rs` says why).
//!
//! A checkpointer thread writes a checkpoint when the log has grown past
//! `Config::checkpoint_log_bytes` since the last one, which bounds the log's size and the
//! time recovery needs to replay it, and when values written out of line call for one
//! (`Blobs::wants_checkpoint`: checkpoints free the extents overwrites left behind), with or
//! without a log.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::pool::PageId;
use crate::sync::{AtomicBool, Ordering};
use crate::tree::writeback::PageBatch;
use crate::tree::Shared;

/// How long an idle evictor sleeps before checking the buffer again, rung or not. Every
/// operation that may take buffer room rings when the buffer is short of it
/// (`Shared::nudge_evictors`), so this is a safety net. At 1 ms, as it was, two idle
/// evictors woke about 2,000 times a second on a tree nobody used.
const POLL: Duration = Duration::from_millis(50);
/// How long the idle checkpointer sleeps before checking the log again.
const CHECKPOINT_POLL: Duration = Duration::from_millis(50);
/// After an eviction error (e.g. a full disk) wait this long before trying again; the writer
/// that next needs room meets the same error itself and reports it.
const BACKOFF_ON_ERROR: Duration = Duration::from_millis(20);

/// A stop flag and a doorbell, shared between the tree and one kind of background thread.
pub(crate) struct Control {
    stop: AtomicBool,
    /// Rung and not yet answered: set by the first `ring`, cleared when a thread wakes.
    rung: AtomicBool,
    wake: Mutex<bool>,
    bell: Condvar,
}

impl Control {
    pub(crate) fn new() -> Arc<Control> {
        Arc::new(Control {
            stop: AtomicBool::new(false),
            rung: AtomicBool::new(false),
            wake: Mutex::new(false),
            bell: Condvar::new(),
        })
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Wakes the threads. Every operation that may have taken buffer room rings while the
    /// buffer is short of it; a ring not answered yet needs no other (the thread it wakes
    /// looks at the buffer itself), and skipping it saves the mutex, which two threads would
    /// pass back and forth, and the `futex` wake, a system call even with nobody waiting.
    pub(crate) fn ring(&self) {
        if self.rung.load(Ordering::Relaxed) || self.rung.swap(true, Ordering::AcqRel) {
            return;
        }
        *self.wake.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.bell.notify_all();
    }

    /// Sleeps until rung, stopped, or `timeout` passes.
    fn wait(&self, timeout: Duration) {
        let guard = self.wake.lock().unwrap_or_else(PoisonError::into_inner);
        let (mut woken, _) = self
            .bell
            .wait_timeout_while(guard, timeout, |w| !*w && !self.stopped())
            .unwrap_or_else(PoisonError::into_inner);
        *woken = false;
        // After clearing `wake`, under its lock: a ring from here on wakes the next wait.
        self.rung.store(false, Ordering::Release);
    }
}

/// The running background threads of one tree.
pub(crate) struct Background {
    evict: Arc<Control>,
    checkpoint: Arc<Control>,
    threads: Vec<JoinHandle<()>>,
}

impl Shared {
    /// Room below which evictors start: 1/32 of the buffer, at least four leaf pages.
    fn low_water(&self) -> usize {
        (self.pool().capacity() / 32).max(4 * self.page_size())
    }

    /// Whether the buffer is short of room (cheap: two atomic loads).
    pub(crate) fn short_of_room(&self) -> bool {
        self.pool().ring_free() < self.low_water()
    }

    /// Whether this tree runs evictor threads (`Background::start` decides the same way).
    fn has_evictors(&self) -> bool {
        !cfg!(shuttle) && !self.storage().is_in_memory() && self.config().evictor_threads > 0
    }

    /// Wakes the evictors if the buffer is short of room. Call it after an operation that
    /// may have taken room (a write, a promotion, a move to the tail, a scan's mirror), with
    /// no page lock held: the first ring makes a system call.
    pub(crate) fn nudge_evictors(&self) {
        if self.has_evictors() && self.short_of_room() {
            self.evict_bell().ring();
        }
    }
}

impl Background {
    /// Starts `evictors` evictor threads and a checkpointer (none of either for in-memory
    /// trees).
    pub(crate) fn start(tree: &Arc<Shared>, evictors: usize) -> Background {
        let (evict, checkpoint) = (tree.evict_bell().clone(), tree.checkpoint_bell().clone());
        let file_backed = !tree.storage().is_in_memory();
        let evictors = if file_backed { evictors } else { 0 };
        let mut threads = Vec::new();
        for i in 0..evictors {
            let (tree, control) = (tree.clone(), evict.clone());
            // The first evictor also does the idle write-back: a thread of its own cost 7-9
            // MiB of resident memory in its malloc arena (`tests/memory.rs`).
            let idle = (i == 0)
                .then_some(tree.config().idle_write_back)
                .flatten()
                .map(IdleWriter::new);
            let spawned = std::thread::Builder::new()
                .name(format!("bfkv-evict-{i}"))
                .spawn(move || run_evictor(&tree, &control, idle));
            threads.extend(spawned.ok());
        }
        // Without a log, checkpoints are still what frees the blob file's extents
        // (`Blobs::wants_checkpoint`).
        if file_backed && !cfg!(shuttle) {
            let (tree, control) = (tree.clone(), checkpoint.clone());
            let spawned = std::thread::Builder::new()
                .name("bfkv-checkpoint".into())
                .spawn(move || run_checkpointer(&tree, &control));
            threads.extend(spawned.ok());
        }
        Background {
            evict,
            checkpoint,
            threads,
        }
    }

    /// Stops and joins the threads.
    pub(crate) fn stop(&mut self) {
        for control in [&self.evict, &self.checkpoint] {
            control.stop.store(true, Ordering::Release);
            control.bell.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run_checkpointer(tree: &Shared, control: &Control) {
    while !control.stopped() {
        if tree.wants_checkpoint() && tree.checkpoint_fuzzy().is_err() {
            // A failed checkpoint changes nothing durable; try again later. Writers keep
            // logging meanwhile, and `flush`/`close` report the error to a caller.
            std::thread::sleep(BACKOFF_ON_ERROR);
        }
        control.wait(CHECKPOINT_POLL);
    }
}

/// The idle write-back's state: it waits for the count of applied writes to stand still for
/// `pause`, then writes back the buffered leaves until a write arrives. A pass that got
/// through every leaf is not repeated until more writes have come and paused again.
///
/// It waits for writes only, not for lookups that read from disk, though its reads and
/// writes share the device with theirs: giving way to those lookups as well moves the cost
/// rather than removing it. On YCSB after a 5M-record load into a 32 MiB cache on direct
/// I/O, giving way makes the lookups of the 10 s after the load about a fifth faster and a
/// YCSB-A after 20 s of lookups about an eighth slower: A finds the load's leaves still
/// dirty and writes them back as it evicts them (`ycsb --idle-write-back off` shows that
/// side).
struct IdleWriter {
    pause: Duration,
    /// The count last seen, and when it was first seen.
    seen: (u64, Instant),
    /// The count when a pass last went through every leaf (`None`: no pass yet; a tree may
    /// open with dirty leaves, replayed from the log).
    clean_at: Option<u64>,
    /// Where the next pass starts.
    from: PageId,
}

impl IdleWriter {
    fn new(pause: Duration) -> IdleWriter {
        IdleWriter {
            pause,
            seen: (u64::MAX, Instant::now()),
            clean_at: None,
            from: 0,
        }
    }

    /// Runs a pass if writes have paused long enough. The pass gives way to eviction, to a
    /// stop, and to the next write.
    fn tick(&mut self, tree: &Shared, control: &Control) {
        let now = tree.writes_applied();
        if now != self.seen.0 {
            self.seen = (now, Instant::now());
            return;
        }
        if self.clean_at == Some(now) || self.seen.1.elapsed() < self.pause {
            return;
        }
        let idle = || !control.stopped() && !tree.short_of_room() && tree.writes_applied() == now;
        match tree.write_back_idle(&mut self.from, &idle) {
            Ok(true) => self.clean_at = Some(now),
            Ok(false) => {}
            // Nothing durable changed; the leaves stay dirty for eviction or a later pass.
            Err(_) => std::thread::sleep(BACKOFF_ON_ERROR),
        }
    }
}

fn run_evictor(tree: &Shared, control: &Control, mut idle: Option<IdleWriter>) {
    let poll = idle.as_ref().map_or(POLL, |w| w.pause.min(POLL));
    let mut batch = PageBatch::default();
    while !control.stopped() {
        if tree.short_of_room() {
            // Evict until there is twice the low-water room, so bursts of writes find room.
            let target = 2 * tree.low_water();
            while tree.pool().ring_free() < target && !control.stopped() {
                if tree.make_room_batch(&mut batch).is_err() {
                    std::thread::sleep(BACKOFF_ON_ERROR);
                    break;
                }
            }
            continue;
        }
        if let Some(w) = &mut idle {
            w.tick(tree, control);
        }
        control.wait(poll);
    }
}

#[cfg(all(test, not(shuttle)))]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A wait that a ring should end returns long before this.
    const LONG: Duration = Duration::from_secs(30);

    #[test]
    fn rings_while_one_is_pending_are_skipped_and_none_is_lost() {
        let c = Control::new();
        // Many rings with nobody waiting: the first is kept, the rest skipped.
        for _ in 0..1000 {
            c.ring();
        }
        assert!(c.rung.load(Ordering::Acquire));
        let start = Instant::now();
        c.wait(LONG);
        assert!(start.elapsed() < LONG / 2, "the pending ring was lost");
        assert!(
            !c.rung.load(Ordering::Acquire),
            "waking did not clear the ring"
        );
        // The next ring, after a wake, is not skipped.
        c.ring();
        let start = Instant::now();
        c.wait(LONG);
        assert!(
            start.elapsed() < LONG / 2,
            "a ring after a wake was skipped"
        );
        // A thread already asleep is woken.
        let sleeper = {
            let c = c.clone();
            std::thread::spawn(move || {
                let start = Instant::now();
                c.wait(LONG);
                start.elapsed()
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        c.ring();
        assert!(
            sleeper.join().expect("sleeper") < LONG / 2,
            "the sleeper was not woken"
        );
    }

    /// A tree whose config asks for evictors but runs none, so a ring stays pending and
    /// can be seen.
    fn tree_without_evictor_threads(dir: &std::path::Path) -> crate::tree::Tree {
        let config = crate::Config::new(dir)
            .cache_size(256 << 10)
            .durability(crate::Durability::None)
            .evictor_threads(1)
            .idle_write_back(None);
        let shared = Arc::new(crate::tree::persist::open(config).expect("open"));
        crate::tree::Tree::from_shared(shared, 0)
    }

    #[test]
    fn reads_writes_and_scans_ring_the_evictors_only_when_short_of_room() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tree = tree_without_evictor_threads(dir.path());
        let shared = tree.shared();
        let bell = shared.evict_bell();
        let key = |i: u32| i.to_be_bytes();
        let mut n = 0;
        // Fill the buffer until writes evict (inline here) and it is well below the mark,
        // so one eviction by an operation below cannot lift it back over.
        while shared.pool().ring_free() >= shared.low_water() / 4
            || tree.stats().foreground_evictions == 0
        {
            tree.insert(key(n), [7u8; 100]).expect("insert");
            n += 1;
        }
        assert!(bell.rung.load(Ordering::Acquire), "a write did not ring");
        for (what, op) in [
            (
                "a read",
                &(|| drop(tree.get(key(0)).expect("get"))) as &dyn Fn(),
            ),
            ("a scan", &|| {
                drop(tree.iter().next().expect("record").expect("scan"));
            }),
            ("a write", &|| {
                tree.insert(key(1), [8u8; 100]).expect("insert");
            }),
        ] {
            bell.rung.store(false, Ordering::Release);
            op();
            assert!(shared.short_of_room(), "the buffer gained room by itself");
            assert!(bell.rung.load(Ordering::Acquire), "{what} did not ring");
        }
        // Every eviction so far was an operation's own; the background's are not counted.
        let before = tree.stats();
        assert!(before.foreground_evictions > 0);
        assert!(before.foreground_evictions <= before.evictions);
        // With room to spare, nothing rings.
        while shared.short_of_room() {
            shared.make_room().expect("evict");
        }
        let after = tree.stats();
        assert!(after.evictions > before.evictions);
        assert_eq!(after.foreground_evictions, before.foreground_evictions);
        bell.rung.store(false, Ordering::Release);
        drop(tree.get(key(2)).expect("get"));
        drop(tree.iter().next());
        assert!(
            !bell.rung.load(Ordering::Acquire),
            "rang with room to spare"
        );
        assert!(n > 0);
    }
}
