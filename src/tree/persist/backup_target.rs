//! Where a backup may go, and how its directory comes to be and goes (`backup.rs` copies
//! into it).
//!
//! A target inside the tree's own directory is refused before anything is written: the
//! copy would be made into the tree it copies. The target is taken as the file system will
//! resolve it once made: each existing ancestor canonicalized (symbolic links and `..`
//! resolved), so neither gets around the check; on Unix an ancestor that is the tree's
//! directory under another name (a bind mount) is found by its device and inode.
//!
//! From the moment the target exists until every file of the copy is in it and synced, it
//! holds the marker [`INCOMPLETE_BACKUP`], and `Tree::open` refuses a directory holding it
//! (`tree_dir.rs`): a backup cut short by a crash, a kill or a full disk never opens as a
//! database. The directory comes into being with the marker already in it: it is made
//! under a temporary name beside the target, the marker written and synced, then renamed
//! to the target and the parent synced (made in place, a kill between the `mkdir` and the
//! marker would leave an empty directory, which opens as a new tree; a kill before the
//! rename leaves the temporary directory, holding only the marker). Once the copy is
//! complete the marker is removed and the directory synced. A failed backup's directory is
//! removed marker last.

use std::fs;
use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};

use super::tree_dir::INCOMPLETE_BACKUP;
use crate::error::{Error, Result};

/// What the marker says to a person who finds it.
const MARKER_TEXT: &[u8] = b"This directory is a bfkv backup that did not complete; \
bfkv refuses to open it. Remove the directory and take the backup again.\n";

/// `target` resolved as the file system will resolve it once made (see the module docs),
/// refused if it lies inside `tree_dir`.
///
/// # Errors
/// `Io` of kind `AlreadyExists` if anything is at `target`, wherever it is (what `backup`
/// answers a target that exists); `InvalidInput` for a target inside the tree's directory
/// (or one naming no directory, such as `/`); `Io` if an ancestor cannot be examined (a
/// dangling link among them).
pub(super) fn outside_tree(tree_dir: &Path, target: &Path) -> Result<PathBuf> {
    refuse_existing(target)?;
    let tree = fs::canonicalize(tree_dir).map_err(|e| Error::io(tree_dir, e))?;
    let resolved = resolve(target).map_err(|e| Error::io(target, e))?;
    if resolved.file_name().is_none() {
        return Err(Error::InvalidInput {
            reason: "a backup target must name a new directory",
        });
    }
    if resolved.starts_with(&tree) || under_same_directory(&tree, &resolved)? {
        return Err(Error::InvalidInput {
            reason: "a backup target inside the tree's own directory",
        });
    }
    Ok(resolved)
}

/// `path` made absolute, each existing prefix canonicalized in turn (so a link or `..`
/// met after a component that does not exist yet is resolved too), the rest kept as it is.
fn resolve(path: &Path) -> io::Result<PathBuf> {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    let mut out = PathBuf::new();
    for component in absolute.components() {
        match component {
            Component::Prefix(_) | Component::RootDir => out.push(component.as_os_str()),
            Component::CurDir => {}
            // `out` is canonical up to its first missing component and lexical after it,
            // and the directories `mkdir` will make are plain ones: its parent is `..`.
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(name) => {
                out.push(name);
                if fs::symlink_metadata(&out).is_ok() {
                    out = fs::canonicalize(&out)?;
                }
            }
        }
    }
    Ok(out)
}

/// Whether an existing ancestor of `resolved` is the directory `tree` by identity (device
/// and inode), whatever path reaches it.
#[cfg(unix)]
fn under_same_directory(tree: &Path, resolved: &Path) -> Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let id = |m: &fs::Metadata| (m.dev(), m.ino());
    let tree_id = id(&fs::metadata(tree).map_err(|e| Error::io(tree, e))?);
    for ancestor in resolved.ancestors() {
        if let Ok(meta) = fs::metadata(ancestor) {
            if id(&meta) == tree_id {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Without inode numbers, the canonical paths alone decide.
#[cfg(not(unix))]
fn under_same_directory(_tree: &Path, _resolved: &Path) -> Result<bool> {
    Ok(false)
}

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
    refuse_existing(target)?;
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

/// `Io` of kind `AlreadyExists` if anything (a link included) is at `target`.
fn refuse_existing(target: &Path) -> Result<()> {
    match fs::symlink_metadata(target) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(target, e)),
        Ok(_) => Err(Error::io(
            target,
            io::Error::new(io::ErrorKind::AlreadyExists, "the backup target exists"),
        )),
    }
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
