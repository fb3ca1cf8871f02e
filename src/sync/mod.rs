//! The concurrency shim: every atomic, lock and thread bfkv uses comes from here, so the
//! `--cfg shuttle` build (RUSTFLAGS) swaps them all for shuttle's model-checked versions at once.
//!
//! Code elsewhere imports `crate::sync::...` and never names `std::sync` or `parking_lot`
//! directly for state shared between threads.

#[cfg(not(shuttle))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize};
#[cfg(not(shuttle))]
pub(crate) use std::sync::Arc;
#[cfg(not(shuttle))]
#[allow(unused_imports)]
pub(crate) use std::thread;

#[cfg(not(shuttle))]
pub(crate) use std::sync::atomic::fence;

#[cfg(shuttle)]
pub(crate) use shuttle::sync::atomic::fence;
#[cfg(shuttle)]
pub(crate) use shuttle::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize};
#[cfg(shuttle)]
pub(crate) use shuttle::sync::Arc;
#[cfg(shuttle)]
#[allow(unused_imports)]
pub(crate) use shuttle::thread;

pub(crate) use std::sync::atomic::Ordering;

/// A mutex without poisoning: a panic while holding it is a bug we do not try to survive.
#[derive(Debug, Default)]
pub(crate) struct Mutex<T> {
    #[cfg(not(shuttle))]
    inner: parking_lot::Mutex<T>,
    #[cfg(shuttle)]
    inner: shuttle::sync::Mutex<T>,
}

/// Guard returned by [`Mutex::lock`].
#[cfg(not(shuttle))]
pub(crate) type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;
/// Guard returned by [`Mutex::lock`].
#[cfg(shuttle)]
pub(crate) type MutexGuard<'a, T> = shuttle::sync::MutexGuard<'a, T>;

impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Mutex {
            inner: Self::make(value),
        }
    }

    #[cfg(not(shuttle))]
    fn make(value: T) -> parking_lot::Mutex<T> {
        parking_lot::Mutex::new(value)
    }

    #[cfg(shuttle)]
    fn make(value: T) -> shuttle::sync::Mutex<T> {
        shuttle::sync::Mutex::new(value)
    }

    #[cfg(not(shuttle))]
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.inner.lock()
    }

    #[cfg(not(shuttle))]
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        self.inner.try_lock()
    }

    #[cfg(shuttle)]
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match self.inner.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    #[cfg(shuttle)]
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        // A poisoned lock means another model thread panicked; the test fails on that panic.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A reader-writer lock without poisoning (see [`Mutex`]).
#[derive(Debug, Default)]
pub(crate) struct RwLock<T> {
    #[cfg(not(shuttle))]
    inner: parking_lot::RwLock<T>,
    #[cfg(shuttle)]
    inner: shuttle::sync::RwLock<T>,
}

/// Guard returned by [`RwLock::read`].
#[cfg(not(shuttle))]
pub(crate) type RwLockReadGuard<'a, T> = parking_lot::RwLockReadGuard<'a, T>;
/// Guard returned by [`RwLock::read`].
#[cfg(shuttle)]
pub(crate) type RwLockReadGuard<'a, T> = shuttle::sync::RwLockReadGuard<'a, T>;
/// Guard returned by [`RwLock::write`].
#[cfg(not(shuttle))]
pub(crate) type RwLockWriteGuard<'a, T> = parking_lot::RwLockWriteGuard<'a, T>;
/// Guard returned by [`RwLock::write`].
#[cfg(shuttle)]
pub(crate) type RwLockWriteGuard<'a, T> = shuttle::sync::RwLockWriteGuard<'a, T>;

impl<T> RwLock<T> {
    #[cfg(not(shuttle))]
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, T> {
        self.inner.read()
    }

    #[cfg(not(shuttle))]
    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.inner.write()
    }

    #[cfg(not(shuttle))]
    pub(crate) fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
        self.inner.try_read()
    }

    #[cfg(shuttle)]
    pub(crate) fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
        match self.inner.try_read() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    #[cfg(shuttle)]
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, T> {
        self.inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    #[cfg(shuttle)]
    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.inner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Gives up the rest of this thread's time slice (a scheduling point under shuttle).
pub(crate) fn yield_now() {
    #[cfg(not(shuttle))]
    std::thread::yield_now();
    #[cfg(shuttle)]
    shuttle::thread::yield_now();
}

/// One step of a bounded spin: a CPU hint normally, a scheduling point under shuttle.
pub(crate) fn spin_hint() {
    #[cfg(not(shuttle))]
    std::hint::spin_loop();
    #[cfg(shuttle)]
    shuttle::thread::yield_now();
}

#[cfg(all(test, not(shuttle)))]
mod tests {
    use super::*;

    #[test]
    fn mutex_serializes_threads() {
        let m = Arc::new(Mutex::new(0u64));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let m = m.clone();
                thread::spawn(move || {
                    for _ in 0..1000 {
                        *m.lock() += 1;
                        spin_hint();
                    }
                    yield_now();
                })
            })
            .collect();
        for h in handles {
            h.join().expect("worker thread panicked");
        }
        assert_eq!(*m.lock(), 4000);
    }
}

mod rcu;
pub(crate) use rcu::{pin, EpochGuard, RcuCell};
mod region;
pub(crate) use region::AppendRegion;
mod ringmap;
pub(crate) use ringmap::RingMap;
