//! Online backup: a copy of the directory that `Tree::open` opens, taken while writers go on.
//!
//! 1. `flush`: every write acknowledged before the call is in the log (or, without a log,
//!    in the checkpoint `flush` writes); then a checkpoint, so the log to copy is short.
//! 2. With checkpoints held off (so the pages the last one references stay as they are, no
//!    log segment is removed, and no blob extent is freed), copy the checkpoint file and the
//!    data file, link (or copy) the log's segments, then copy the blob file. Pages written since the checkpoint are copied too but
//!    referenced by nothing the copy holds; the active segment is copied, its boot tag
//!    cleared (its reads raced the writes), and what it holds past the point it was read is
//!    cut as a torn tail.
//! 3. Open the copy as a tree (its recovery replays the copied log over the copied
//!    checkpoint), read every leaf's page in it and check it as a read does (checksum,
//!    a well-formed leaf, not one that lost records to damage), and close it: so the
//!    backup needs no replay later, and a tree with a damaged page is never copied as if
//!    it were whole (the backup fails, and nothing is left at the target).
//!
//! Writers go on throughout; only checkpoints wait for the copy. The target is refused if
//! it lies inside the tree's directory, and holds a marker until step 2 is done and synced,
//! so a copy cut short never opens (`backup_target.rs`).

use std::fs;
use std::path::Path;

use crate::error::{Error, Result};
use crate::node::NodeRef;
use crate::pool::Location;
use crate::tree::cache::with_page_buf;
use crate::tree::shared::Shared;
use crate::tree::{FLAG_DAMAGED, NO_PAGE};

/// Largest cache the check of a backup (step 3) uses.
const CHECK_CACHE: usize = 32 << 20;

impl Shared {
    /// Backs the tree up into `target`, a directory that must not exist (see `Tree::backup`).
    pub(crate) fn backup(&self, target: &Path) -> Result<()> {
        let (Some(dir), Some(wal)) = (&self.config().dir, self.journal().wal()) else {
            return Err(Error::InvalidConfig {
                reason: "an in-memory tree has no files to back up",
            });
        };
        let target = &super::backup_target::outside_tree(dir, target)?;
        super::backup_target::create(target)?;
        let result = self.flush().and_then(|()| {
            self.checkpoint()?;
            let _no_checkpoint = self.storage().pages().one_at_a_time();
            copy_file(&dir.join("checkpoint"), &target.join("checkpoint"))?;
            copy_file(&dir.join("data"), &target.join("data"))?;
            let wal_dir = target.join("wal");
            crate::sys::create_private_dir_all(&wal_dir).map_err(|e| Error::io(&wal_dir, e))?;
            let segments = wal.segment_paths();
            for (i, path) in segments.iter().enumerate() {
                let name = path.file_name().unwrap_or_default();
                let to = wal_dir.join(name);
                if i + 1 == segments.len() {
                    copy_file(path, &to)?;
                    // Copied while written: past its mark it reads as after a restart.
                    crate::wal::clear_boot_tag(&to)?;
                } else {
                    link_or_copy(path, &to)?;
                }
            }
            sync_dir(&wal_dir)?;
            // After the log: every extent a copied record names was written before the
            // record was appended, and no extent is freed before the next checkpoint.
            if dir.join("blobs").exists() {
                copy_file(&dir.join("blobs"), &target.join("blobs"))?;
            }
            sync_dir(target)
        });
        let result = result
            .and_then(|()| super::backup_target::complete(target))
            .and_then(|()| self.check_backup(target));
        if result.is_err() {
            // Nothing was there before: leave nothing half made.
            super::backup_target::discard(target);
        }
        result
    }

    /// Opens the copy in `target` (recovery), checks its leaf pages, and closes it (a
    /// checkpoint). Opened without background threads, so no leaf moves meanwhile.
    fn check_backup(&self, target: &Path) -> Result<()> {
        let mut config = self.config().clone();
        config.dir = Some(target.to_path_buf());
        config.cache_size = config.cache_size.min(CHECK_CACHE);
        let copy = super::open(config)?;
        // The data file was copied as it is: a damaged page of the copy is the source's.
        let checked = copy
            .check_leaf_pages()
            .map_err(|e| match (e, &self.config().dir) {
                (
                    Error::Corruption {
                        file,
                        page,
                        offset,
                        reason,
                    },
                    Some(dir),
                ) if file == target.join("data") => Error::Corruption {
                    file: dir.join("data"),
                    page,
                    offset,
                    reason,
                },
                (e, _) => e,
            });
        let closed = copy.close();
        checked.and(closed)
    }

    /// Reads the disk page of every leaf and checks it as a read of it would.
    fn check_leaf_pages(&self) -> Result<()> {
        with_page_buf(self.page_size(), |buf| {
            for (_, pid) in self.index().leaves() {
                let leaf = self.pool().read(pid);
                let page = match (leaf.location(), leaf.mini()) {
                    (Location::Disk(page), _) => Some(page),
                    (Location::Mini(_), Some(node)) => NodeRef::from_bytes(node).disk_page(),
                    (Location::Mini(_), None) => None,
                };
                let Some(page) = page.filter(|&p| p != NO_PAGE) else {
                    continue;
                };
                self.storage().read_page(page, buf)?;
                let leaf = self.storage().check_leaf(page, buf)?;
                if leaf.flags() & FLAG_DAMAGED != 0 {
                    return Err(self
                        .storage()
                        .corruption(Some(page), "leaf lost records to a damaged page"));
                }
            }
            Ok(())
        })
    }
}

/// Copies `from` to the new file `to` (0600) and syncs it. `std::fs::copy` lets the kernel
/// share the blocks where the file system can (`copy_file_range`: reflinks on XFS and
/// Btrfs).
fn copy_file(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from, to).map_err(|e| Error::io(from, e))?;
    sync_file(to)
}

/// Hard-links `from` as `to` (a complete log segment is never written again), or copies it
/// where links are not possible.
fn link_or_copy(from: &Path, to: &Path) -> Result<()> {
    match fs::hard_link(from, to) {
        Ok(()) => Ok(()),
        Err(_) => copy_file(from, to),
    }
}

/// Syncs a file's data.
fn sync_file(path: &Path) -> Result<()> {
    let file = fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    file.sync_all().map_err(|e| Error::io(path, e))
}

/// Syncs a directory's entries.
fn sync_dir(dir: &Path) -> Result<()> {
    crate::sys::sync_dir(dir).map_err(|e| Error::io(dir, e))
}
