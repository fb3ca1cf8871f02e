//! The checkpoint file: its format, and writing it atomically.
//!
//! Little-endian:
//! | bytes | field |
//! |---|---|
//! | 0..8 | magic `BFKVCKP1` |
//! | 8..12 | format version (3) |
//! | 12..16 | page size |
//! | 16..24 | LSN replay starts at: the checkpoint's own, or an earlier one's if it left a dirty leaf unwritten (0 until the write-ahead log exists) |
//! | 24..32 | leaf count n |
//! | ... | n × (page id u32, disk page u64, image LSN u64, low-bound length u16, low-bound bytes) in key order |
//! | ... | blob extent count m (u64), then m × (leaf page u64, first block u64, blocks u64) |
//! | last 4 | crc32c of everything before |
//!
//! A leaf's image LSN (`pages.rs`) says which logged writes its page already holds: replay
//! skips the records below it that fall in the leaf's range. The blob extents are those the
//! leaves' records reference (`blob/extents.rs`), each with the page that references it. Format 2
//! (no extents, from before large values) is read with none; format 1 (no image LSNs, from
//! before merges existed) as LSN 0 too: replaying its writes again is harmless.

use std::collections::HashSet;
use std::path::Path as FsPath;

use crate::error::{Error, Result};
use crate::store::checksum;
use crate::tree::blob::TableEntry;
use crate::tree::storage::SnapshotLeaf;
use crate::wal::vfs::LogFs;
use crate::wal::Lsn;

const MAGIC: &[u8; 8] = b"BFKVCKP1";
const FORMAT: u32 = 3;
/// The format before blob extents, still read.
const FORMAT_WITHOUT_BLOBS: u32 = 2;
/// The format before image LSNs, still read.
const FORMAT_WITHOUT_LSNS: u32 = 1;
const HEADER: usize = 32;

/// A checkpoint file's content: its LSN, its leaves in key order, its blob extents.
pub(in crate::tree) type Decoded = (Lsn, Vec<SnapshotLeaf>, Vec<TableEntry>);

pub(in crate::tree) fn decode(bytes: &[u8], path: &FsPath, page_size: usize) -> Result<Decoded> {
    let bad = |reason| Error::corruption(path, None, reason);
    if bytes.len() < HEADER + 4 {
        return Err(bad("checkpoint file too short"));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if checksum::crc32c(body).to_le_bytes() != crc {
        return Err(bad("checkpoint checksum mismatch"));
    }
    if &body[..8] != MAGIC {
        return Err(bad("not a bfkv checkpoint"));
    }
    let u32_at =
        |at: usize| u32::from_le_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]]);
    let (with_lsns, with_blobs) = match u32_at(8) {
        FORMAT => (true, true),
        FORMAT_WITHOUT_BLOBS => (true, false),
        FORMAT_WITHOUT_LSNS => (false, false),
        _ => return Err(bad("unsupported checkpoint format version")),
    };
    let fixed_len = if with_lsns { 22 } else { 14 };
    if u32_at(12) as usize != page_size {
        return Err(Error::InvalidConfig {
            reason: "page size differs from the existing tree's",
        });
    }
    let u64_at = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&body[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let lsn = u64_at(16);
    let count = u64_at(24);
    let mut at = HEADER;
    let mut leaves = Vec::new();
    let mut seen = HashSet::new();
    for _ in 0..count {
        let Some(fixed) = body.get(at..at + fixed_len) else {
            return Err(bad("checkpoint truncated"));
        };
        let pid = u32::from_le_bytes([fixed[0], fixed[1], fixed[2], fixed[3]]);
        let mut page = [0u8; 8];
        page.copy_from_slice(&fixed[4..12]);
        let mut lsn = [0u8; 8];
        if with_lsns {
            lsn.copy_from_slice(&fixed[12..20]);
        }
        let len = u16::from_le_bytes([fixed[fixed_len - 2], fixed[fixed_len - 1]]) as usize;
        let Some(low) = body.get(at + fixed_len..at + fixed_len + len) else {
            return Err(bad("checkpoint truncated"));
        };
        if let Some(prev) = leaves.last().map(|l: &SnapshotLeaf| l.low.as_slice()) {
            if low <= prev {
                return Err(bad("checkpoint leaves out of order"));
            }
        } else if !low.is_empty() {
            return Err(bad("first leaf has a low bound"));
        }
        if !seen.insert(pid) {
            return Err(bad("checkpoint names a page id twice"));
        }
        leaves.push(SnapshotLeaf {
            pid,
            page: u64::from_le_bytes(page),
            lsn: u64::from_le_bytes(lsn),
            low: low.to_vec(),
        });
        at += fixed_len + len;
    }
    let mut table = Vec::new();
    if with_blobs {
        let Some(count) = body.get(at..at + 8).map(|_| u64_at(at)) else {
            return Err(bad("checkpoint truncated"));
        };
        at += 8;
        let fits = count
            .checked_mul(24)
            .is_some_and(|n| n <= (body.len() - at) as u64);
        if !fits {
            return Err(bad("checkpoint truncated"));
        }
        for _ in 0..count {
            let (page, start, blocks) = (u64_at(at), u64_at(at + 8), u64_at(at + 16));
            if blocks == 0 {
                return Err(bad("checkpoint names an empty blob extent"));
            }
            table.push(TableEntry {
                page,
                start,
                blocks,
            });
            at += 24;
        }
    }
    if at != body.len() || leaves.is_empty() {
        return Err(bad("checkpoint length does not match its leaf count"));
    }
    Ok((lsn, leaves, table))
}

pub(in crate::tree) fn encode(
    page_size: usize,
    lsn: u64,
    leaves: &[SnapshotLeaf],
    table: &[TableEntry],
) -> Vec<u8> {
    // Sized exactly: a tree of 65k leaves makes a 2.5 MiB file, and growing the buffer
    // by doubling held the old and the new buffer at once.
    let leaf_bytes: usize = leaves
        .iter()
        .map(|l| std::mem::size_of_val(&l.pid) + 8 + 8 + 2 + l.low.len())
        .sum();
    let len = HEADER + leaf_bytes + 8 + table.len() * 24 + 4;
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    out.extend_from_slice(&(page_size as u32).to_le_bytes());
    out.extend_from_slice(&lsn.to_le_bytes());
    out.extend_from_slice(&(leaves.len() as u64).to_le_bytes());
    for SnapshotLeaf {
        low,
        pid,
        page,
        lsn,
    } in leaves
    {
        out.extend_from_slice(&pid.to_le_bytes());
        out.extend_from_slice(&page.to_le_bytes());
        out.extend_from_slice(&lsn.to_le_bytes());
        // Low bounds are keys, at most 8191 bytes (see `Limits`).
        out.extend_from_slice(&(low.len() as u16).to_le_bytes());
        out.extend_from_slice(low);
    }
    out.extend_from_slice(&(table.len() as u64).to_le_bytes());
    for e in table {
        out.extend_from_slice(&e.page.to_le_bytes());
        out.extend_from_slice(&e.start.to_le_bytes());
        out.extend_from_slice(&e.blocks.to_le_bytes());
    }
    let crc = checksum::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    debug_assert_eq!(out.len(), len, "the size estimate is exact");
    out
}

/// Writes `bytes` to `path` atomically: temporary file, fsync, rename, fsync the directory.
pub(in crate::tree) fn write_atomically(
    fs: &dyn LogFs,
    dir: &FsPath,
    path: &FsPath,
    bytes: &[u8],
) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let f = fs.open(&tmp, true).map_err(|e| Error::io(&tmp, e))?;
    f.write_all_at(bytes, 0).map_err(|e| Error::io(&tmp, e))?;
    f.sync_all().map_err(|e| Error::io(&tmp, e))?;
    drop(f);
    fs.rename(&tmp, path).map_err(|e| Error::io(path, e))?;
    fs.sync_dir(dir).map_err(|e| Error::io(dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_format_round_trips_and_rejects_damage() {
        let leaf = |low: &[u8], pid, page, lsn| SnapshotLeaf {
            low: low.to_vec(),
            pid,
            page,
            lsn,
        };
        let leaves = vec![
            leaf(b"", 0, 5, 10),
            leaf(b"m", 3, 9, 0),
            leaf(b"t", 1, 7, 99),
        ];
        let table = vec![TableEntry {
            page: 9,
            start: 100,
            blocks: 4096,
        }];
        let bytes = encode(4096, 0, &leaves, &table);
        let path = FsPath::new("checkpoint");
        let (lsn, back, extents) = decode(&bytes, path, 4096).unwrap();
        assert_eq!(lsn, 0);
        assert_eq!(back, leaves);
        assert_eq!(extents, table);
        // Format 2, without blob extents, reads with none.
        let mut two = bytes[..bytes.len() - 4 - 8 - 24].to_vec();
        two[8..12].copy_from_slice(&FORMAT_WITHOUT_BLOBS.to_le_bytes());
        two.extend_from_slice(&checksum::crc32c(&two).to_le_bytes());
        let (_, back, extents) = decode(&two, path, 4096).unwrap();
        assert_eq!((back, extents), (leaves.clone(), Vec::new()));
        // Format 1, without image LSNs, reads as LSN 0.
        let mut old = Vec::new();
        old.extend_from_slice(&bytes[..8]);
        old.extend_from_slice(&FORMAT_WITHOUT_LSNS.to_le_bytes());
        old.extend_from_slice(&bytes[12..HEADER]);
        for l in &leaves {
            old.extend_from_slice(&l.pid.to_le_bytes());
            old.extend_from_slice(&l.page.to_le_bytes());
            old.extend_from_slice(&(l.low.len() as u16).to_le_bytes());
            old.extend_from_slice(&l.low);
        }
        old.extend_from_slice(&checksum::crc32c(&old).to_le_bytes());
        let (_, back, _) = decode(&old, path, 4096).unwrap();
        let zeroed: Vec<SnapshotLeaf> = leaves
            .iter()
            .map(|l| SnapshotLeaf {
                lsn: 0,
                ..l.clone()
            })
            .collect();
        assert_eq!(back, zeroed);
        assert!(matches!(
            decode(&bytes, path, 8192),
            Err(Error::InvalidConfig { .. })
        ));
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(
                matches!(decode(&bad, path, 4096), Err(Error::Corruption { .. })),
                "flip at {i}"
            );
        }
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n], path, 4096).is_err(), "truncated to {n}");
        }
    }
}
