//! Encoding, decoding and choosing between the two superblock slots and their free-list
//! chains (byte layout in the module docs of `store`).

use super::disk::Disk;
use super::page::{self, get_u32, get_u64, put_u32, put_u64, Kind};
use super::paged::check_page_size;
use super::{PageBuf, PageNo, FIRST_DATA_PAGE};
use crate::config::{MAX_PAGE_SIZE, MIN_PAGE_SIZE};
use crate::error::{Error, Result};

/// Identifies a bfkv page-store superblock.
const MAGIC: &[u8; 8] = b"BFKVSTOR";
/// Version of the superblock and free-list page formats, and of what the pages hold: 2 since
/// every key starts with its keyspace's prefix (version 1 stored bare keys).
const FORMAT_VERSION: u32 = 2;
/// Why a slot of format 1 is not read.
const OLDER_FORMAT: &str =
    "data file of bfkv before keyspaces (store format 1): this version reads format 2";
/// Why a slot of a later format is not read.
const NEWER_FORMAT: &str = "store format newer than this version of bfkv reads";
/// Where the inline free page numbers start in a superblock.
const SB_ENTRIES: usize = 72;
/// Where the free page numbers start in a free-list page.
const CHAIN_ENTRIES: usize = 32;

/// What one valid superblock slot says.
#[derive(Debug, Clone)]
pub(super) struct Superblock {
    /// Sequence number: the slot with the higher one is newer.
    pub(super) seq: u64,
    /// Pages in the file, the superblock slots included.
    pub(super) page_count: u64,
    /// The free pages.
    pub(super) free: Vec<PageNo>,
    /// This slot's free-list chain, in chain order.
    pub(super) chain: Vec<PageNo>,
}

/// Free page numbers a superblock holds inline.
fn inline_capacity(page_size: usize) -> usize {
    (page_size - SB_ENTRIES) / 8
}

/// Free page numbers one free-list page holds.
fn chain_capacity(page_size: usize) -> usize {
    (page_size - CHAIN_ENTRIES) / 8
}

/// Free-list pages needed to store `free` free page numbers.
pub(super) fn chain_pages_needed(page_size: usize, free: usize) -> usize {
    free.saturating_sub(inline_capacity(page_size))
        .div_ceil(chain_capacity(page_size))
}

/// The superblock page for slot `seq % 2` and the pages of its chain (`chain`, at least
/// [`chain_pages_needed`] long; surplus chain pages are written empty so they stay linked
/// and owned). Everything is stamped and ready to write.
pub(super) fn encode(
    page_size: usize,
    seq: u64,
    page_count: u64,
    free: &[PageNo],
    chain: &[PageNo],
) -> (PageBuf, Vec<PageBuf>) {
    debug_assert!(chain.len() >= chain_pages_needed(page_size, free.len()));
    let (inline, mut rest) = free.split_at(free.len().min(inline_capacity(page_size)));
    let mut chain_bufs = Vec::with_capacity(chain.len());
    for (i, &p) in chain.iter().enumerate() {
        let (here, later) = rest.split_at(rest.len().min(chain_capacity(page_size)));
        rest = later;
        let mut buf = PageBuf::new(page_size);
        put_u64(&mut buf, 8, seq);
        put_u64(&mut buf, 16, chain.get(i + 1).copied().unwrap_or(0));
        put_u32(&mut buf, 24, here.len() as u32);
        for (j, &f) in here.iter().enumerate() {
            put_u64(&mut buf, CHAIN_ENTRIES + 8 * j, f);
        }
        page::stamp(p, Kind::FreeList, &mut buf);
        chain_bufs.push(buf);
    }
    let mut sb = PageBuf::new(page_size);
    sb[8..16].copy_from_slice(MAGIC);
    put_u32(&mut sb, 16, FORMAT_VERSION);
    put_u32(&mut sb, 20, page_size as u32);
    put_u64(&mut sb, 24, seq);
    put_u64(&mut sb, 32, page_count);
    put_u64(&mut sb, 40, free.len() as u64);
    put_u64(&mut sb, 48, chain.first().copied().unwrap_or(0));
    put_u64(&mut sb, 56, chain.len() as u64);
    put_u32(&mut sb, 64, inline.len() as u32);
    for (j, &f) in inline.iter().enumerate() {
        put_u64(&mut sb, SB_ENTRIES + 8 * j, f);
    }
    page::stamp(seq % 2, Kind::Superblock, &mut sb);
    (sb, chain_bufs)
}

/// Reads and validates slot `slot`. The outer error is an I/O failure; the inner one says
/// why the slot is not valid.
fn read_slot<D: Disk>(
    disk: &D,
    page_size: usize,
    slot: PageNo,
) -> Result<Result<Superblock, &'static str>> {
    let mut bufs = [PageBuf::new(page_size)];
    disk.read_pages(&[slot], &mut bufs)?;
    let sb = &bufs[0];
    if let Err(reason) = page::verify(slot, Kind::Superblock, sb) {
        return Ok(Err(reason));
    }
    if &sb[8..16] != MAGIC {
        return Ok(Err("bad superblock magic"));
    }
    match get_u32(sb, 16) {
        FORMAT_VERSION => {}
        1 => return Ok(Err(OLDER_FORMAT)),
        v if v > FORMAT_VERSION => return Ok(Err(NEWER_FORMAT)),
        _ => return Ok(Err("unknown store format version")),
    }
    if get_u32(sb, 20) as usize != page_size {
        return Ok(Err("superblock page size differs"));
    }
    let seq = get_u64(sb, 24);
    let page_count = get_u64(sb, 32);
    let free_total = get_u64(sb, 40);
    let mut next = get_u64(sb, 48);
    let chain_len = get_u64(sb, 56);
    let inline = get_u32(sb, 64) as usize;
    if page_count < FIRST_DATA_PAGE || seq % 2 != slot {
        return Ok(Err("superblock header out of range"));
    }
    // Every listed page is distinct and inside the file, which bounds both counts.
    if free_total.saturating_add(chain_len) > page_count || inline > inline_capacity(page_size) {
        return Ok(Err("superblock counts out of range"));
    }
    let mut free: Vec<PageNo> = (0..inline)
        .map(|j| get_u64(sb, SB_ENTRIES + 8 * j))
        .collect();
    let mut chain = Vec::with_capacity(chain_len as usize);
    let mut buf = [PageBuf::new(page_size)];
    for _ in 0..chain_len {
        if next < FIRST_DATA_PAGE || next >= page_count {
            return Ok(Err("free-list chain points outside the file"));
        }
        disk.read_pages(&[next], &mut buf)?;
        let cp = &buf[0];
        if let Err(reason) = page::verify(next, Kind::FreeList, cp) {
            return Ok(Err(reason));
        }
        let count = get_u32(cp, 24) as usize;
        if get_u64(cp, 8) != seq || count > chain_capacity(page_size) {
            return Ok(Err("free-list page does not belong to this superblock"));
        }
        free.extend((0..count).map(|j| get_u64(cp, CHAIN_ENTRIES + 8 * j)));
        chain.push(next);
        next = get_u64(cp, 16);
    }
    if next != 0 || free.len() as u64 != free_total {
        return Ok(Err("free-list chain length differs from the superblock"));
    }
    let mut seen = free.clone();
    seen.extend_from_slice(&chain);
    seen.sort_unstable();
    let distinct = seen.windows(2).all(|w| w[0] != w[1]);
    if !distinct || seen.iter().any(|&p| p < FIRST_DATA_PAGE || p >= page_count) {
        return Ok(Err("free list holds a page twice or outside the file"));
    }
    Ok(Ok(Superblock {
        seq,
        page_count,
        free,
        chain,
    }))
}

/// What `open` found: the newest valid slot, and the chain of the other slot if it is valid
/// too (its pages stay the store's; the next `sync` rewrites that slot).
#[derive(Debug)]
pub(super) struct Loaded {
    /// The newest valid superblock.
    pub(super) newest: Superblock,
    /// The other slot's chain, empty if that slot is not valid.
    pub(super) other_chain: Vec<PageNo>,
}

/// Picks the newest valid superblock slot. No valid slot is `Error::Corruption`, unless a
/// valid superblock of another page size is there: that is `Error::InvalidConfig`. A slot
/// whose checksum holds but whose format is another version's is `Error::Corruption` too,
/// whatever the other slot holds: another version of bfkv wrote it, so the other slot may be
/// that version's older state (or this version's, which that one went on from), and its
/// pages may no longer be what that slot says.
pub(super) fn load<D: Disk>(disk: &D, page_size: usize) -> Result<Loaded> {
    let a = read_slot(disk, page_size, 0)?;
    let b = read_slot(disk, page_size, 1)?;
    for (slot, read) in [(0, &a), (1, &b)] {
        if let Err(reason @ (OLDER_FORMAT | NEWER_FORMAT)) = read {
            return Err(Error::corruption(disk.path(), Some(slot), reason));
        }
    }
    let (newest, other) = match (a, b) {
        (Ok(a), Ok(b)) if a.seq >= b.seq => (a, Some(b)),
        (Ok(a), Ok(b)) => (b, Some(a)),
        (Ok(a), Err(_)) => (a, None),
        (Err(_), Ok(b)) => (b, None),
        (Err(a), Err(b)) => {
            // A slot never written explains less than the other's reason.
            let reason = if a == page::NEVER_WRITTEN { b } else { a };
            if other_page_size(disk, page_size)? {
                return Err(Error::InvalidConfig {
                    reason: "page size differs from the one the data file was created with",
                });
            }
            return Err(Error::corruption(disk.path(), Some(0), reason));
        }
    };
    let other_chain = other.map(|o| o.chain).unwrap_or_default();
    Ok(Loaded {
        newest,
        other_chain,
    })
}

/// Whether slot 0 or 1 holds a valid superblock written with a page size other than
/// `page_size`.
fn other_page_size<D: Disk>(disk: &D, page_size: usize) -> Result<bool> {
    Ok(stored_page_size(disk)?.is_some_and(|stored| stored != page_size))
}

/// The page size of the valid superblock in slot 0 or 1, whatever size it was written
/// with; `None` if neither slot holds one. Slot 0 starts the file at every page size, so
/// its size field (in the first 4 KiB) names the candidate, trusted only if the slot passes
/// its checks at that size. Slot 1 starts one page in: if slot 0 is torn or damaged, it is
/// tried at every page size.
pub(super) fn stored_page_size<D: Disk>(disk: &D) -> Result<Option<usize>> {
    let mut probe = [PageBuf::new(MIN_PAGE_SIZE)];
    disk.read_pages(&[0], &mut probe)?;
    let claimed = get_u32(&probe[0], 20) as usize;
    if check_page_size(claimed).is_ok() && read_slot(disk, claimed, 0)?.is_ok() {
        return Ok(Some(claimed));
    }
    let mut size = MIN_PAGE_SIZE;
    while size <= MAX_PAGE_SIZE {
        // A read past the end of a small file only means no slot 1 of this size.
        if matches!(read_slot(disk, size, 1), Ok(Ok(_))) {
            return Ok(Some(size));
        }
        size *= 2;
    }
    Ok(None)
}
