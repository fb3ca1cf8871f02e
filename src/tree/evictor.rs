//! Background eviction (paper §4.3: evictions run concurrently, the head advances in order).
//!
//! A few threads keep free room at the tail of the circular buffer above a low-water mark,
//! so writers seldom stop to write a leaf themselves; several evictions in flight also keep
//! several disk I/Os in flight, which a single thread evicting synchronously cannot. A writer
//! that still finds the buffer full evicts one block itself (that path guarantees progress);
//! the threads only add throughput.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use super::Shared;
use crate::sync::{AtomicBool, Ordering};

/// How long an idle evictor sleeps before checking the buffer again.
const POLL: Duration = Duration::from_millis(1);
/// After an eviction error (e.g. a full disk) wait this long before trying again; the writer
/// that next needs room meets the same error itself and reports it.
const BACKOFF_ON_ERROR: Duration = Duration::from_millis(20);

/// Shared between the tree and its evictor threads.
struct Control {
    stop: AtomicBool,
    wake: Mutex<bool>,
    bell: Condvar,
}

/// The running evictor threads of one tree.
pub(crate) struct Evictors {
    control: Arc<Control>,
    threads: Vec<JoinHandle<()>>,
}

impl Shared {
    /// Room below which evictors start: 1/16 of the buffer, at least four leaf pages.
    fn low_water(&self) -> usize {
        (self.pool.capacity() / 16).max(4 * self.page_size)
    }

    /// Whether the buffer is short of room (cheap: two atomic loads).
    pub(crate) fn short_of_room(&self) -> bool {
        self.pool.ring_free() < self.low_water()
    }
}

impl Evictors {
    /// Starts `count` evictor threads for `tree` (none for in-memory trees).
    pub(crate) fn start(tree: &Arc<Shared>, count: usize) -> Evictors {
        let control = Arc::new(Control {
            stop: AtomicBool::new(false),
            wake: Mutex::new(false),
            bell: Condvar::new(),
        });
        let threads = if tree.store.is_none() { 0 } else { count };
        let threads = (0..threads)
            .filter_map(|i| {
                let (tree, control) = (tree.clone(), control.clone());
                std::thread::Builder::new()
                    .name(format!("bfkv-evict-{i}"))
                    .spawn(move || run(&tree, &control))
                    .ok()
            })
            .collect();
        Evictors { control, threads }
    }

    /// Wakes the evictors now (a writer found the buffer short of room).
    pub(crate) fn nudge(&self) {
        if self.threads.is_empty() {
            return;
        }
        *self
            .control
            .wake
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = true;
        self.control.bell.notify_all();
    }

    /// Stops and joins the threads.
    pub(crate) fn stop(&mut self) {
        self.control.stop.store(true, Ordering::Release);
        self.control.bell.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Evictors {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(tree: &Shared, control: &Control) {
    while !control.stop.load(Ordering::Acquire) {
        if tree.short_of_room() {
            // Evict until there is twice the low-water room, so bursts of writes find room.
            let target = 2 * tree.low_water();
            while tree.pool.ring_free() < target && !control.stop.load(Ordering::Acquire) {
                if tree.make_room().is_err() {
                    std::thread::sleep(BACKOFF_ON_ERROR);
                    break;
                }
            }
            continue;
        }
        let guard = control.wake.lock().unwrap_or_else(PoisonError::into_inner);
        let (mut woken, _) = control
            .bell
            .wait_timeout_while(guard, POLL, |w| {
                !*w && !control.stop.load(Ordering::Acquire)
            })
            .unwrap_or_else(PoisonError::into_inner);
        *woken = false;
    }
}
