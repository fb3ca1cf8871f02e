//! The snapshot's bytes: a directory (a bfkv backup) packed into one buffer, and unpacked
//! again, checked before anything is written.
//!
//! bfkv preallocates its files (a 64 MiB log segment, the blob file and the data file grow
//! in large steps), so a small tree's directory is mostly zeros; a pack stores only each
//! file's non-zero 4 KiB blocks, as extents, and unpacking leaves the rest as holes.
//!
//! Format, integers little-endian:
//!
//! ```text
//! magic      8 bytes  "BFKVPACK"
//! version    u32      1
//! count      u32      number of entries, each a directory or a file:
//!   kind     u8       1 = directory, 2 = file
//!   path_len u16      then the path: UTF-8, relative, components joined by '/', each
//!                     one a plain name; its parent directory is an earlier entry
//!   (a file only:)
//!   len      u64      the file's length
//!   extents  u32      then each extent: offset u64, length u64 (> 0), the bytes; in
//!                     ascending order, not overlapping, inside the file
//! crc        u32      CRC-32C of every byte before it
//! ```

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::files::{create_dir, create_file, remove_all, sync_dir};

/// The first bytes of every pack.
const MAGIC: &[u8; 8] = b"BFKVPACK";
/// The format version this code writes and reads.
const VERSION: u32 = 1;
/// Entry kind: a directory.
const KIND_DIR: u8 = 1;
/// Entry kind: a file.
const KIND_FILE: u8 = 2;
/// Runs of zeros this long and aligned are left out.
const BLOCK: usize = 4096;
/// The longest file a pack may declare (256 TiB): a bound on what a crafted pack can make
/// the unpacker allocate as holes.
const MAX_FILE_LEN: u64 = 1 << 48;
/// What the decoder calls the bytes in its errors.
const WHAT: &str = "snapshot pack";

/// One entry of a parsed pack, borrowing its bytes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Item<'a> {
    /// A directory at this relative path.
    Dir(&'a str),
    /// A file.
    File {
        /// Its relative path.
        path: &'a str,
        /// Its length.
        len: u64,
        /// `(offset, bytes)` of its non-zero parts.
        extents: Vec<(u64, &'a [u8])>,
    },
}

/// Packs every directory and regular file under `dir` (not `dir` itself).
pub(crate) fn pack_dir(dir: &Path) -> Result<Vec<u8>> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&VERSION.to_le_bytes());
    let count_at = out.len();
    out.extend_from_slice(&0u32.to_le_bytes());
    let mut count = 0u32;
    pack_tree(dir, "", &mut out, &mut count)?;
    out[count_at..count_at + 4].copy_from_slice(&count.to_le_bytes());
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// Appends the entries under `dir` (whose pack path is `prefix`) in name order, each
/// directory before what it holds.
fn pack_tree(dir: &Path, prefix: &str, out: &mut Vec<u8>, count: &mut u32) -> Result<()> {
    let mut names = fs::read_dir(dir)
        .and_then(|entries| {
            entries
                .map(|e| e.map(|e| e.file_name()))
                .collect::<Result<Vec<_>, _>>()
        })
        .map_err(|e| Error::io(dir, e))?;
    names.sort();
    for name in names {
        let path = dir.join(&name);
        let Some(name) = name.to_str() else {
            return Err(Error::malformed(WHAT, "a file name to pack is not UTF-8"));
        };
        let rel = if prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{prefix}/{name}")
        };
        let Ok(rel_len) = u16::try_from(rel.len()) else {
            return Err(Error::malformed(
                WHAT,
                "a path to pack is longer than 65535 bytes",
            ));
        };
        let kind = fs::symlink_metadata(&path).map_err(|e| Error::io(&path, e))?;
        *count = count
            .checked_add(1)
            .ok_or(Error::malformed(WHAT, "more than 2^32 entries to pack"))?;
        if kind.is_dir() {
            out.push(KIND_DIR);
            out.extend_from_slice(&rel_len.to_le_bytes());
            out.extend_from_slice(rel.as_bytes());
            pack_tree(&path, &rel, out, count)?;
        } else if kind.is_file() {
            out.push(KIND_FILE);
            out.extend_from_slice(&rel_len.to_le_bytes());
            out.extend_from_slice(rel.as_bytes());
            pack_file(&path, out)?;
        } else {
            return Err(Error::malformed(
                WHAT,
                "only directories and regular files can be packed",
            ));
        }
    }
    Ok(())
}

/// Appends a file's length and its non-zero extents.
fn pack_file(path: &Path, out: &mut Vec<u8>) -> Result<()> {
    let io = |e| Error::io(path, e);
    let mut file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    out.extend_from_slice(&len.to_le_bytes());
    let extents_at = out.len();
    out.extend_from_slice(&0u32.to_le_bytes());
    let mut extents = 0u32;
    // The open extent: where its header sits in `out`, and its file offset.
    let mut open: Option<(usize, u64)> = None;
    let mut chunk = vec![0u8; 256 * BLOCK];
    let mut offset = 0u64;
    loop {
        let n = read_full(&mut file, &mut chunk).map_err(io)?;
        if n == 0 {
            break;
        }
        for block in chunk[..n].chunks(BLOCK) {
            if block.iter().all(|&b| b == 0) {
                close_extent(out, &mut open, offset);
            } else {
                if open.is_none() {
                    open = Some((out.len(), offset));
                    out.extend_from_slice(&[0u8; 16]);
                    extents = extents.checked_add(1).ok_or(Error::malformed(
                        WHAT,
                        "a file to pack has more than 2^32 extents",
                    ))?;
                }
                out.extend_from_slice(block);
            }
            offset += block.len() as u64;
        }
    }
    close_extent(out, &mut open, offset);
    if offset != len {
        return Err(Error::malformed(
            WHAT,
            "a file changed length while it was packed",
        ));
    }
    out[extents_at..extents_at + 4].copy_from_slice(&extents.to_le_bytes());
    Ok(())
}

/// Fills in the header of the open extent, if any, which ends at file offset `end`.
fn close_extent(out: &mut [u8], open: &mut Option<(usize, u64)>, end: u64) {
    if let Some((at, start)) = open.take() {
        out[at..at + 8].copy_from_slice(&start.to_le_bytes());
        out[at + 8..at + 16].copy_from_slice(&(end - start).to_le_bytes());
    }
}

/// Reads until `buf` is full or the file ends; the number of bytes read.
fn read_full(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// A cursor over the pack's bytes that fails, instead of panicking, past their end.
struct Input<'a> {
    /// What is left.
    rest: &'a [u8],
}

impl<'a> Input<'a> {
    /// The next `n` bytes.
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.rest.len() {
            return Err(Error::malformed(WHAT, "truncated"));
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    /// The next `N` bytes as an array.
    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
}

/// Checks the whole pack (magic, version, checksum, every length and path) and returns
/// its entries.
pub(crate) fn parse(bytes: &[u8]) -> Result<Vec<Item<'_>>> {
    let Some(body_len) = bytes.len().checked_sub(4) else {
        return Err(Error::malformed(WHAT, "truncated"));
    };
    let (body, crc) = bytes.split_at(body_len);
    let mut input = Input { rest: body };
    if input.take(MAGIC.len()).ok() != Some(MAGIC.as_slice()) {
        return Err(Error::malformed(WHAT, "bad magic"));
    }
    if u32::from_le_bytes(
        crc.try_into()
            .map_err(|_| Error::malformed(WHAT, "truncated"))?,
    ) != crc32c::crc32c(body)
    {
        return Err(Error::malformed(WHAT, "checksum mismatch"));
    }
    if u32::from_le_bytes(input.array()?) != VERSION {
        return Err(Error::malformed(WHAT, "unknown version"));
    }
    let count = u32::from_le_bytes(input.array()?);
    let mut dirs = HashSet::new();
    let mut seen = HashSet::new();
    // Not `with_capacity(count)`: the count is not trusted yet.
    let mut items = Vec::new();
    for _ in 0..count {
        let kind = input.array::<1>()?[0];
        let path_len = u16::from_le_bytes(input.array()?);
        let path = std::str::from_utf8(input.take(usize::from(path_len))?)
            .map_err(|_| Error::malformed(WHAT, "a path is not UTF-8"))?;
        check_path(path, &dirs)?;
        if !seen.insert(path) {
            return Err(Error::malformed(WHAT, "a path appears twice"));
        }
        match kind {
            KIND_DIR => {
                dirs.insert(path);
                items.push(Item::Dir(path));
            }
            KIND_FILE => items.push(parse_file(&mut input, path)?),
            _ => return Err(Error::malformed(WHAT, "unknown entry kind")),
        }
    }
    if !input.rest.is_empty() {
        return Err(Error::malformed(WHAT, "bytes after the last entry"));
    }
    Ok(items)
}

/// A file's length and extents.
fn parse_file<'a>(input: &mut Input<'a>, path: &'a str) -> Result<Item<'a>> {
    let len = u64::from_le_bytes(input.array()?);
    if len > MAX_FILE_LEN {
        return Err(Error::malformed(WHAT, "a file is longer than 256 TiB"));
    }
    let count = u32::from_le_bytes(input.array()?);
    let mut extents = Vec::new();
    let mut end = 0u64;
    for _ in 0..count {
        let offset = u64::from_le_bytes(input.array()?);
        let n = u64::from_le_bytes(input.array()?);
        if n == 0 || offset < end || offset.checked_add(n).is_none_or(|e| e > len) {
            return Err(Error::malformed(
                WHAT,
                "an extent is empty, out of order or past its file's end",
            ));
        }
        let n_usize = usize::try_from(n).map_err(|_| Error::malformed(WHAT, "truncated"))?;
        extents.push((offset, input.take(n_usize)?));
        end = offset + n;
    }
    Ok(Item::File { path, len, extents })
}

/// Checks that `path` is relative, made of plain names, inside an earlier directory.
fn check_path(path: &str, dirs: &HashSet<&str>) -> Result<()> {
    let plain = !path.is_empty()
        && path.split('/').all(|part| {
            !part.is_empty() && part != "." && part != ".." && !part.contains(['\\', '\0', ':'])
        });
    if !plain {
        return Err(Error::malformed(
            WHAT,
            "a path is not a relative path of plain names",
        ));
    }
    match path.rsplit_once('/') {
        Some((parent, _)) if !dirs.contains(parent) => Err(Error::malformed(
            WHAT,
            "an entry comes before its directory",
        )),
        _ => Ok(()),
    }
}

/// Unpacks `bytes` into the new directory `target`: checks the whole pack first, then
/// writes every file and syncs files and directories, so the tree is durable when this
/// returns. On failure `target` is removed again.
pub(crate) fn unpack(bytes: &[u8], target: &Path) -> Result<()> {
    let items = parse(bytes)?;
    create_dir(target)?;
    let written = write_items(&items, target);
    if written.is_err() {
        let _ = remove_all(target);
    }
    written
}

/// Writes the parsed `items` under `target`.
fn write_items(items: &[Item<'_>], target: &Path) -> Result<()> {
    let mut dirs = vec![target.to_path_buf()];
    for item in items {
        match item {
            Item::Dir(path) => {
                let dir = local(target, path);
                create_dir(&dir)?;
                dirs.push(dir);
            }
            Item::File { path, len, extents } => {
                let path = local(target, path);
                let io = |e| Error::io(&path, e);
                let mut file = create_file(&path)?;
                file.set_len(*len).map_err(io)?;
                for (offset, data) in extents {
                    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(*offset))
                        .map_err(io)?;
                    file.write_all(data).map_err(io)?;
                }
                file.sync_all().map_err(io)?;
            }
        }
    }
    // Deepest first, then the parent that holds `target` itself.
    for dir in dirs.iter().rev() {
        sync_dir(dir)?;
    }
    match target.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => sync_dir(parent),
        _ => Ok(()),
    }
}

/// The checked pack path `rel` under `target`.
fn local(target: &Path, rel: &str) -> PathBuf {
    let mut path = target.to_path_buf();
    path.extend(rel.split('/'));
    path
}

#[cfg(test)]
#[path = "pack_tests.rs"]
mod tests;
