//! What `Tree::open` finds at a tree's path, decided before it creates anything there.
//!
//! A tree is a directory. An absent path or an empty directory becomes a new tree; a
//! directory holding any of the names a tree keeps ([`TREE_FILES`]) is opened as one.
//! Everything else is refused and left as it is:
//! - a path that is not a directory (`Io` of kind `NotADirectory`);
//! - a directory holding only other files (`Io` of kind `DirectoryNotEmpty`): a mistyped
//!   path would otherwise become a tree, its `LOCK`, `data` and `wal/` written beside the
//!   user's files;
//! - a backup that did not complete (`Corruption` naming its marker, `backup_target.rs`):
//!   its files could otherwise open as an empty or an older tree.
//!
//! `lost+found`, which the root of an ext2/3/4 file system holds, counts as empty, so a
//! tree may live at the root of a volume of its own.

use std::fs;
use std::io;
use std::path::Path;

use crate::error::{Error, Result};

/// The file a backup keeps in its directory until every file is copied and synced; a
/// directory holding it is a backup cut short.
pub(crate) const INCOMPLETE_BACKUP: &str = "BACKUP-INCOMPLETE";

/// The names a tree creates in its directory (the checkpoint's temporary file included:
/// a crash can leave it), the incomplete-backup marker among them.
const TREE_FILES: [&str; 7] = [
    "LOCK",
    "data",
    "checkpoint",
    "checkpoint.tmp",
    "wal",
    "blobs",
    INCOMPLETE_BACKUP,
];

/// What a file system puts in the root directory of a volume.
const VOLUME_ROOT: &str = "lost+found";

/// Checks that `dir` is absent, an empty directory, or a tree's directory (see the module
/// docs); nothing is created or changed.
///
/// # Errors
/// `Io` of kind `NotADirectory` or `DirectoryNotEmpty` for a path that is not a tree's;
/// `Corruption` for a backup that did not complete; `Io` for a failure to examine `dir`.
pub(crate) fn check(dir: &Path) -> Result<()> {
    let meta = match fs::metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(dir, e)),
    };
    if !meta.is_dir() {
        return Err(Error::io(
            dir,
            io::Error::new(
                io::ErrorKind::NotADirectory,
                "not a directory: a tree is a directory",
            ),
        ));
    }
    let mut foreign = false;
    let mut ours = false;
    for entry in fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let name = entry.map_err(|e| Error::io(dir, e))?.file_name();
        if name == INCOMPLETE_BACKUP {
            return Err(Error::corruption(
                dir.join(INCOMPLETE_BACKUP),
                None,
                "a backup that did not complete: remove its directory and back up again",
            ));
        }
        if TREE_FILES.iter().any(|f| name == *f) {
            ours = true;
        } else if name != VOLUME_ROOT {
            foreign = true;
        }
    }
    if foreign && !ours {
        return Err(Error::io(
            dir,
            io::Error::new(
                io::ErrorKind::DirectoryNotEmpty,
                "the directory holds files and none of a bfkv tree: nothing was created there",
            ),
        ));
    }
    Ok(())
}
