//! [`MemFs`]: an in-memory [`LogFs`] with a volatile cache, for power-cut tests of the log
//! and the checkpoint file (the counterpart of `store::FaultStore` for the data pages).
//!
//! Every file is an inode with what reads see (`cache`) and what survives a power cut
//! (`durable`, updated by `sync_data`/`sync_all`); names are the same, the directory's
//! current entries against the durable ones (updated by `sync_dir` of that directory), so
//! a file created or renamed without a directory sync disappears or keeps its old name.
//!
//! [`power_cut_at`](MemFs::power_cut_at)`(n, torn)` cuts power at the `n`-th mutating call
//! from now (writes, syncs, truncations, preallocations, creations, removals, renames,
//! directory syncs): that call and every later one fail with `EIO` (so nothing is
//! acknowledged after the cut), and, if `torn`, the first half of a cut write reaches the
//! medium. A linked `FaultStore` is powered off at the same moment, and a cut that starts in
//! the linked store powers this file system off too. [`crash_image`](MemFs::crash_image)
//! is what a reboot finds (on a new boot, [`LogFs::boot`]). [`fail_at`](MemFs::fail_at)`(n)` makes one call fail with the
//! power left on (a full disk, a failed `fdatasync`).

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use super::vfs::{LogFile, LogFs};
use crate::store::FaultStore;
use crate::sync::{Arc, Mutex};

/// A file's contents.
#[derive(Debug, Default, Clone)]
struct Inode {
    /// What reads see.
    cache: Vec<u8>,
    /// What survives a power cut.
    durable: Vec<u8>,
}

/// Everything the file system holds.
#[derive(Debug, Default)]
struct State {
    /// Current directory entries.
    names: HashMap<PathBuf, usize>,
    /// Entries as of the last sync of their directory.
    durable_names: HashMap<PathBuf, usize>,
    /// Inodes by number.
    inodes: Vec<Inode>,
    /// Mutating calls so far.
    ops: u64,
    /// The call (by count) at which power is cut, and whether a cut write tears.
    cut_at: Option<(u64, bool)>,
    /// Power is off: every call fails.
    powered_off: bool,
    /// The call (by count) that fails on its own, doing nothing, with power staying on.
    fail_at: Option<u64>,
}

/// An in-memory file system with a volatile cache and power cuts (module docs).
#[derive(Debug, Clone)]
pub(crate) struct MemFs {
    /// Shared with the open files.
    inner: Arc<Inner>,
}

/// The state and the linked store.
#[derive(Debug, Default)]
struct Inner {
    /// Files and faults.
    state: Mutex<State>,
    /// The data-page store that loses power with this file system.
    linked: Mutex<Option<Arc<FaultStore>>>,
    /// This boot's tag (`LogFs::boot`): each file system and each crash image has its own.
    boot: u32,
}

/// A tag for a new boot: every `MemFs` and crash image gets another one.
fn next_boot() -> u32 {
    static BOOTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    BOOTS
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        .max(1)
}

/// An open file of a [`MemFs`].
#[derive(Debug)]
struct MemFile {
    /// The file system.
    inner: Arc<Inner>,
    /// The inode.
    inode: usize,
}

fn eio() -> io::Error {
    crate::sys::injected_fault()
}

fn not_found() -> io::Error {
    io::Error::from(io::ErrorKind::NotFound)
}

impl Inner {
    /// Runs one mutating call: `f` gets the state and whether this call is the torn cut.
    /// Fails with `EIO` once power is off (here or in the linked store).
    fn mutate<T>(&self, f: impl FnOnce(&mut State, Option<bool>) -> T) -> io::Result<T> {
        let linked = self.linked.lock().clone();
        let linked_off = linked.as_ref().is_some_and(|s| s.is_powered_off());
        let (out, cut) = {
            let mut st = self.state.lock();
            if st.powered_off || linked_off {
                st.powered_off = true;
                return Err(eio());
            }
            st.ops += 1;
            if st.fail_at == Some(st.ops) {
                st.fail_at = None;
                return Err(eio());
            }
            match st.cut_at {
                Some((n, torn)) if st.ops >= n => {
                    st.powered_off = true;
                    (f(&mut st, Some(torn)), true)
                }
                _ => (f(&mut st, None), false),
            }
        };
        if cut {
            if let Some(store) = linked {
                // The next data-page write is the first one the dead disk drops.
                store.power_cut_at_write(1, false);
            }
            return Err(eio());
        }
        Ok(out)
    }
}

impl Default for MemFs {
    fn default() -> MemFs {
        MemFs::new()
    }
}

impl MemFs {
    /// An empty file system.
    pub(crate) fn new() -> MemFs {
        MemFs {
            inner: Arc::new(Inner {
                boot: next_boot(),
                ..Inner::default()
            }),
        }
    }

    /// Powers `store` off with this file system (and this one off with it).
    pub(crate) fn link(&self, store: Arc<FaultStore>) {
        *self.inner.linked.lock() = Some(store);
    }

    /// Cuts power at the `n`-th mutating call from now (1 = the next); with `torn`, the first
    /// half of that call, if a write, reaches the medium.
    pub(crate) fn power_cut_at(&self, n: u64, torn: bool) {
        let mut st = self.inner.state.lock();
        st.cut_at = Some((st.ops + n.max(1), torn));
    }

    /// Makes the `n`-th mutating call from now (1 = the next) fail with `EIO` and do
    /// nothing, as a full disk or a failed `fdatasync` does; later calls succeed.
    #[cfg(test)]
    pub(crate) fn fail_at(&self, n: u64) {
        let mut st = self.inner.state.lock();
        st.fail_at = Some(st.ops + n.max(1));
    }

    /// Whether power is off.
    pub(crate) fn is_powered_off(&self) -> bool {
        self.inner.state.lock().powered_off
    }

    /// Mutating calls so far.
    pub(crate) fn ops(&self) -> u64 {
        self.inner.state.lock().ops
    }

    /// What a reboot finds: the durable entries and contents, powered on, no fault armed.
    pub(crate) fn crash_image(&self) -> MemFs {
        let st = self.inner.state.lock();
        let mut image = State::default();
        for (name, &ino) in &st.durable_names {
            let data = st
                .inodes
                .get(ino)
                .map(|i| i.durable.clone())
                .unwrap_or_default();
            image.names.insert(name.clone(), image.inodes.len());
            image.durable_names.insert(name.clone(), image.inodes.len());
            image.inodes.push(Inode {
                cache: data.clone(),
                durable: data,
            });
        }
        MemFs {
            inner: Arc::new(Inner {
                state: Mutex::new(image),
                linked: Mutex::new(None),
                boot: next_boot(),
            }),
        }
    }
}

impl LogFile for MemFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let st = self.inner.state.lock();
        let data = &st.inodes[self.inode].cache;
        let from = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(data.len());
        let n = buf.len().min(data.len() - from);
        buf[..n].copy_from_slice(&data[from..from + n]);
        Ok(n)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let ino = self.inode;
        self.inner.mutate(|st, cut| {
            let write = |data: &mut Vec<u8>, bytes: &[u8]| {
                let end = offset as usize + bytes.len();
                if data.len() < end {
                    data.resize(end, 0);
                }
                data[offset as usize..end].copy_from_slice(bytes);
            };
            match cut {
                None => write(&mut st.inodes[ino].cache, buf),
                Some(true) => write(&mut st.inodes[ino].durable, &buf[..buf.len() / 2]),
                Some(false) => {}
            }
        })
    }

    fn sync_data(&self) -> io::Result<()> {
        let ino = self.inode;
        self.inner.mutate(|st, cut| {
            if cut.is_none() {
                let i = &mut st.inodes[ino];
                i.durable.clone_from(&i.cache);
            }
        })
    }

    fn sync_all(&self) -> io::Result<()> {
        self.sync_data()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let ino = self.inode;
        self.inner.mutate(|st, cut| {
            if cut.is_none() {
                st.inodes[ino].cache.resize(len as usize, 0);
            }
        })
    }

    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        let ino = self.inode;
        self.inner.mutate(|st, cut| {
            if cut.is_none() {
                let data = &mut st.inodes[ino].cache;
                let end = (offset + len) as usize;
                if data.len() < end {
                    data.resize(end, 0);
                }
                data[offset as usize..end].fill(0);
            }
        })
    }

    fn preallocate(&self, len: u64) -> io::Result<()> {
        let ino = self.inode;
        self.inner.mutate(|st, cut| {
            let data = &mut st.inodes[ino].cache;
            if cut.is_none() && data.len() < len as usize {
                data.resize(len as usize, 0);
            }
        })
    }
}

impl LogFs for MemFs {
    fn boot(&self) -> Option<u32> {
        Some(self.inner.boot)
    }

    fn create_dir_all(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let st = self.inner.state.lock();
        Ok(st
            .names
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| Some(p.file_name()?.to_str()?.to_string()))
            .collect())
    }

    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn LogFile>> {
        let inode = if create {
            self.inner.mutate(|st, cut| {
                if cut.is_some() {
                    return 0;
                }
                let ino = st.inodes.len();
                st.inodes.push(Inode::default());
                st.names.insert(path.to_path_buf(), ino);
                ino
            })?
        } else {
            let st = self.inner.state.lock();
            *st.names.get(path).ok_or_else(not_found)?
        };
        Ok(Arc::new(MemFile {
            inner: self.inner.clone(),
            inode,
        }))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.inner
            .mutate(|st, cut| match cut {
                None => st.names.remove(path).map(|_| ()).ok_or_else(not_found),
                Some(_) => Ok(()),
            })
            .and_then(|r| r)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner
            .mutate(|st, cut| {
                if cut.is_some() {
                    return Ok(());
                }
                let ino = st.names.remove(from).ok_or_else(not_found)?;
                st.names.insert(to.to_path_buf(), ino);
                Ok(())
            })
            .and_then(|r| r)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner.mutate(|st, cut| {
            if cut.is_some() {
                return;
            }
            st.durable_names.retain(|p, _| p.parent() != Some(dir));
            let current: Vec<(PathBuf, usize)> = st
                .names
                .iter()
                .filter(|(p, _)| p.parent() == Some(dir))
                .map(|(p, &i)| (p.clone(), i))
                .collect();
            st.durable_names.extend(current);
        })
    }
}
