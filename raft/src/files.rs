//! File-system steps the crash-safe protocols are made of: private files and directories
//! (bfkv refuses files others may write), directory syncs, and replacing a file atomically.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};

/// Creates the directory `path` (0700 on Unix, as bfkv creates its own); fails if anything
/// is there.
pub(crate) fn create_dir(path: &Path) -> Result<()> {
    // Only Unix sets a mode on the builder.
    #[cfg_attr(not(unix), allow(unused_mut))]
    let mut builder = fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(path).map_err(|e| Error::io(path, e))
}

/// Creates the file `path` for writing (0600 on Unix); fails if anything is there.
pub(crate) fn create_file(path: &Path) -> Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path).map_err(|e| Error::io(path, e))
}

/// Makes the directory `dir`'s entries (files created, renamed or removed in it) durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    // Windows cannot open a directory as a file; NTFS journals its metadata instead.
    #[cfg(unix)]
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// Replaces `dir/name` with the concatenated `parts` so that a crash leaves the old file or
/// the new one, whole: write `name.tmp`, sync it, rename it over `name`, sync `dir`.
pub(crate) fn write_atomic(dir: &Path, name: &str, parts: &[&[u8]]) -> Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    remove_file_if_present(&tmp)?;
    let mut file = create_file(&tmp)?;
    parts
        .iter()
        .try_for_each(|part| file.write_all(part))
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::io(&tmp, e))?;
    drop(file);
    let path = dir.join(name);
    fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
    sync_dir(dir)
}

/// Removes the file `path`; nothing there is not an error.
pub(crate) fn remove_file_if_present(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(path, e)),
        _ => Ok(()),
    }
}

/// Removes the file or directory tree `path`; nothing there is not an error.
pub(crate) fn remove_all(path: &Path) -> Result<()> {
    let removed = match fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => Err(e),
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
    };
    removed.map_err(|e| Error::io(path, e))
}

/// Reads the whole file `path`; `None` if it does not exist.
pub(crate) fn read_if_present(path: &Path) -> Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path, e)),
    }
}
