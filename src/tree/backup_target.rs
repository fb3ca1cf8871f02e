//! How a backup's directory comes to be and goes (`backup.rs` copies into it).
//!
//! From the moment the target exists until every file of the copy is in it and synced, it
//! holds the marker [`INCOMPLETE_BACKUP`], and `Tree::open` refuses a directory holding it
//! (`tree_dir.rs`): a backup cut short by a crash, a kill or a full disk never opens as a
//! database. The directory comes into being with the marker already in it: it is made
//! under a temporary name beside the target, the marker written and synced, then renamed
//! to the target and the parent synced (made in place, a kill between the `mkdir` and the
//! marker would leave an empty directory, which opens as a new tree). Once the copy is
//! complete the marker is removed and the directory synced. A failed backup's directory is
//! removed marker last.

use std::fs;
use std::io::{self, Write};
use std::path::Path;

use super::tree_dir::INCOMPLETE_BACKUP;
use crate::error::{Error, Result};

/// What the marker says to a person who finds it.
const MARKER_TEXT: &[u8] = b"This directory is a bfkv backup that did not complete; \
bfkv refuses to open it. Remove the directory and take the backup again.\n";

/// Makes the directory `target` (0700) holding the marker, durably (see the module docs).
///
/// # Errors
/// `Io` of kind `AlreadyExists` if anything is at `target` (nothing there is touched);
/// `Io` for a failure to make it.
pub(super) fn create(target: &Path) -> Result<()> {
    let (Some(parent), Some(name)) = (target.parent(), target.file_name()) else {
        return Err(Error::InvalidInput {
            reason: "a backup target must name a new directory",
        });
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    crate::sys::create_private_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    if fs::symlink_metadata(target).is_ok() {
        return Err(Error::io(
            target,
            io::Error::new(io::ErrorKind::AlreadyExists, "the backup target exists"),
        ));
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let staging = parent.join(format!(
        ".{}.bfkv-backup-{}-{nanos}",
        name.to_string_lossy(),
        std::process::id()
    ));
    make_private_dir(&staging)?;
    let made = write_marker(&staging)
        .and_then(|()| sync_dir(&staging))
        .and_then(|()| fs::rename(&staging, target).map_err(|e| Error::io(target, e)));
    if let Err(e) = made {
        let _ = fs::remove_file(staging.join(INCOMPLETE_BACKUP));
        let _ = fs::remove_dir(&staging);
        return Err(e);
    }
    sync_dir(parent)
}

/// Marks the backup in `target` complete: every file is in it and synced.
///
/// # Errors
/// `Io` removing the marker or syncing the directory.
pub(super) fn complete(target: &Path) -> Result<()> {
    let marker = target.join(INCOMPLETE_BACKUP);
    fs::remove_file(&marker).map_err(|e| Error::io(&marker, e))?;
    sync_dir(target)
}

/// Removes a failed backup's directory, the marker last, so that what a crash leaves of it
/// still holds the marker. A directory whose marker is gone and cannot be put back (a full
/// disk) holds a complete copy (the marker goes only then) and is left as it is.
pub(super) fn discard(target: &Path) {
    let marker = target.join(INCOMPLETE_BACKUP);
    if fs::symlink_metadata(&marker).is_err()
        && write_marker(target)
            .and_then(|()| sync_dir(target))
            .is_err()
    {
        return;
    }
    let Ok(entries) = fs::read_dir(target) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name() == INCOMPLETE_BACKUP {
            continue;
        }
        let path = entry.path();
        let _ = match entry.file_type() {
            Ok(t) if t.is_dir() => fs::remove_dir_all(&path),
            _ => fs::remove_file(&path),
        };
    }
    if sync_dir(target).is_ok() && fs::remove_file(&marker).is_ok() {
        let _ = fs::remove_dir(target);
    }
}

/// Writes the marker into `dir` and syncs it.
fn write_marker(dir: &Path) -> Result<()> {
    let marker = dir.join(INCOMPLETE_BACKUP);
    let mut file = crate::sys::private_options()
        .create_new(true)
        .open(&marker)
        .map_err(|e| Error::io(&marker, e))?;
    file.write_all(MARKER_TEXT)
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::io(&marker, e))
}

/// Makes the directory `dir` (0700); fails if anything is there.
fn make_private_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    let builder = {
        let mut b = fs::DirBuilder::new();
        std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
        b
    };
    #[cfg(not(unix))]
    let builder = fs::DirBuilder::new();
    builder.create(dir).map_err(|e| Error::io(dir, e))
}

/// Syncs a directory's entries.
fn sync_dir(dir: &Path) -> Result<()> {
    crate::sys::sync_dir(dir).map_err(|e| Error::io(dir, e))
}
