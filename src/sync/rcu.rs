//! A read-copy-update cell: readers get a plain `&T` for as long as they stay pinned; a
//! writer swaps in a new value and the old one is destroyed once no pinned reader can still
//! see it (crossbeam-epoch). Inner nodes are published this way, so a reader walking down
//! the tree never writes shared memory and never reads bytes that are being changed.

use crossbeam_epoch::{Atomic, Owned};

use super::Ordering;

/// Proof that the current thread is pinned; references loaded under it stay valid until it
/// is dropped.
pub(crate) type EpochGuard = crossbeam_epoch::Guard;

/// Pins the current thread (cheap: a thread-local counter).
pub(crate) fn pin() -> EpochGuard {
    crossbeam_epoch::pin()
}

/// A pointer to a `T` that is replaced as a whole, never mutated in place.
pub(crate) struct RcuCell<T: Send + Sync + 'static> {
    ptr: Atomic<T>,
}

impl<T: Send + Sync + 'static> RcuCell<T> {
    /// A cell holding `value`.
    pub(crate) fn new(value: T) -> Self {
        RcuCell {
            ptr: Atomic::new(value),
        }
    }

    /// The current value, valid while `guard` lives.
    pub(crate) fn load<'g>(&self, guard: &'g EpochGuard) -> &'g T {
        let shared = self.ptr.load(Ordering::Acquire, guard);
        // SAFETY: the pointer is never null (set in `new`, only ever swapped for another
        // `Owned`), and a value that was swapped out is destroyed through `defer_destroy`,
        // which waits until every guard pinned before the swap (including `guard`) is gone.
        unsafe { shared.deref() }
    }

    /// Publishes `value`; the previous value is destroyed once no pinned reader can see it.
    pub(crate) fn replace(&self, value: T, guard: &EpochGuard) {
        let old = self.ptr.swap(Owned::new(value), Ordering::AcqRel, guard);
        // SAFETY: `old` is no longer reachable through the cell; only readers pinned before
        // the swap may still hold it, and deferred destruction outlives all of them.
        unsafe { guard.defer_destroy(old) };
    }
}

impl<T: Send + Sync + 'static> std::fmt::Debug for RcuCell<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The value may be replaced while being printed; the cell is printed opaque.
        f.write_str("RcuCell")
    }
}

impl<T: Send + Sync + 'static> Drop for RcuCell<T> {
    fn drop(&mut self) {
        // SAFETY: `&mut self` means no reader can load from this cell any more, and readers
        // that loaded earlier did so under guards that cannot outlive the borrow of the cell
        // they loaded from; the pointer is non-null and uniquely owned here.
        unsafe {
            let guard = crossbeam_epoch::unprotected();
            let current = self.ptr.load(Ordering::Relaxed, guard);
            drop(current.into_owned());
        }
    }
}

#[cfg(all(test, not(shuttle)))]
mod tests {
    use super::*;
    use crate::sync::{thread, Arc, AtomicUsize};

    struct Counted(u64, Arc<AtomicUsize>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn replaced_values_are_dropped_and_readers_see_whole_values() {
        let drops = Arc::new(AtomicUsize::new(0));
        let cell = Arc::new(RcuCell::new(Counted(0, drops.clone())));
        let reader = {
            let cell = cell.clone();
            thread::spawn(move || {
                let mut last = 0;
                for _ in 0..20_000 {
                    let g = pin();
                    let v = cell.load(&g).0;
                    assert!(v >= last, "values go backwards: {v} < {last}");
                    last = v;
                }
            })
        };
        for i in 1..=2_000u64 {
            let g = pin();
            cell.replace(Counted(i, drops.clone()), &g);
        }
        reader.join().expect("reader panicked");
        assert!(Arc::try_unwrap(cell).is_ok(), "sole owner");
        // Deferred destructions run eventually; flush this thread's garbage to make it so.
        for _ in 0..64 {
            pin().flush();
        }
        assert!(drops.load(Ordering::SeqCst) >= 1, "nothing was reclaimed");
    }
}
