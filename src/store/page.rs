//! The 8-byte header every page starts with: checksum and format marker (layout in the
//! module docs of `store`).

use super::{checksum, PageNo, STORE_RESERVED};

/// Marks a page as written by this store; an all-zero page never matches.
const PAGE_MAGIC: u16 = 0xBF5E;
/// Version of the page header format.
const PAGE_VERSION: u8 = 1;

/// What a page holds; stored in byte 7 so a page of one kind is never taken for another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Kind {
    /// A caller's page.
    Data = 1,
    /// A superblock slot (page 0 or 1).
    Superblock = 2,
    /// A page of a free-list chain.
    FreeList = 3,
}

/// The checksum of `buf` as it would sit at page `page`: crc32c of the page number (u64 LE)
/// followed by everything after the header.
fn checksum(page: PageNo, buf: &[u8]) -> u32 {
    let crc = checksum::crc32c(&page.to_le_bytes());
    checksum::crc32c_append(crc, &buf[STORE_RESERVED..])
}

/// What [`verify`] says of a page of zeros.
pub(super) const NEVER_WRITTEN: &str = "page was never written (all zero)";

/// Writes the header of a `kind` page destined for `page` into `buf[..STORE_RESERVED]`.
pub(super) fn stamp(page: PageNo, kind: Kind, buf: &mut [u8]) {
    debug_assert!(buf.len() > STORE_RESERVED);
    let crc = checksum(page, buf);
    buf[0..4].copy_from_slice(&crc.to_le_bytes());
    buf[4..6].copy_from_slice(&PAGE_MAGIC.to_le_bytes());
    buf[6] = PAGE_VERSION;
    buf[7] = kind as u8;
}

/// Checks that `buf` is an intact `kind` page read from `page`; the error says what failed.
pub(super) fn verify(page: PageNo, kind: Kind, buf: &[u8]) -> Result<(), &'static str> {
    if buf.len() <= STORE_RESERVED {
        return Err("page shorter than its header");
    }
    if buf[4..6] != PAGE_MAGIC.to_le_bytes() {
        return Err(if buf.iter().all(|&b| b == 0) {
            NEVER_WRITTEN
        } else {
            "bad page magic"
        });
    }
    if buf[6] != PAGE_VERSION {
        return Err("unknown page format version");
    }
    if buf[7] != kind as u8 {
        return Err("page holds a different kind of data");
    }
    let stored = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if stored != checksum(page, buf) {
        return Err("page checksum mismatch (torn, damaged or misplaced page)");
    }
    Ok(())
}

/// Reads a little-endian u64 at `at` (the caller guarantees `at + 8 <= buf.len()`).
pub(super) fn get_u64(buf: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(b)
}

/// Reads a little-endian u32 at `at` (the caller guarantees `at + 4 <= buf.len()`).
pub(super) fn get_u32(buf: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(b)
}

/// Writes a little-endian u64 at `at`.
pub(super) fn put_u64(buf: &mut [u8], at: usize, v: u64) {
    buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Writes a little-endian u32 at `at`.
pub(super) fn put_u32(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
