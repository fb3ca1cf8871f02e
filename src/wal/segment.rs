//! Segment files: naming, creation with preallocation, and recovery of the log directory at
//! open (find the last valid record, cut the torn tail, check the segments continue each
//! other).

use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};

use super::damage;
use super::format::{self, SegmentHeader, Tail, HEADER_SIZE};
use super::vfs::{LogFile, LogFs, Reader};
use super::Lsn;
use crate::error::{Error, Result};
use crate::sync::Arc;

/// Read-ahead buffer used when scanning a segment.
pub(crate) const SCAN_BUFFER: usize = 256 << 10;

/// A segment file of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Segment {
    /// LSN of its first record (also in its name and header).
    pub(crate) first_lsn: Lsn,
    /// Its path.
    pub(crate) path: PathBuf,
}

/// The file name of the segment whose first record is `first_lsn`.
pub(crate) fn segment_name(first_lsn: Lsn) -> String {
    format!("wal-{first_lsn:016x}.log")
}

/// The first LSN encoded in a segment file name, if `name` is one.
pub(crate) fn parse_segment_name(name: &str) -> Option<Lsn> {
    let hex = name.strip_prefix("wal-")?.strip_suffix(".log")?;
    if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// The segment files in `dir`, oldest first. Other files are ignored.
pub(crate) fn list_segments(fs: &dyn LogFs, dir: &Path) -> Result<Vec<Segment>> {
    let mut out = Vec::new();
    for name in fs.list(dir).map_err(|e| Error::io(dir, e))? {
        if let Some(first_lsn) = parse_segment_name(&name) {
            out.push(Segment {
                first_lsn,
                path: dir.join(name),
            });
        }
    }
    out.sort_by_key(|s| s.first_lsn);
    Ok(out)
}

/// Makes the directory entries of `dir` (created or removed files) durable.
pub(crate) fn sync_dir(fs: &dyn LogFs, dir: &Path) -> Result<()> {
    fs.sync_dir(dir).map_err(|e| Error::io(dir, e))
}

/// Creates (or replaces) the segment starting at `first_lsn`, durable with its directory
/// entry before it is returned, so that no record lands in a file a crash can lose.
/// The whole segment is preallocated (see `LogFile::preallocate`); the space reads as
/// zeros, which is how the reader finds the end of the log.
pub(crate) fn create_segment(
    fs: &dyn LogFs,
    dir: &Path,
    first_lsn: Lsn,
    segment_size: u64,
) -> Result<(Segment, Arc<dyn LogFile>)> {
    let path = dir.join(segment_name(first_lsn));
    let io = |e| Error::io(&path, e);
    let file = fs.open(&path, true).map_err(io)?;
    let header = SegmentHeader {
        segment_size,
        first_lsn,
    };
    let mut head = header.encode();
    head[format::BOOT_AT..format::BOOT_AT + 4].copy_from_slice(&boot_tag(fs).to_le_bytes());
    file.write_all_at(&head, 0).map_err(io)?;
    file.preallocate(segment_size).map_err(io)?;
    file.sync_all().map_err(io)?;
    sync_dir(fs, dir)?;
    Ok((Segment { first_lsn, path }, file))
}

/// Removes a segment file and makes the removal durable before the next one goes, so that
/// the segments left after a crash are always a contiguous suffix of the log.
pub(crate) fn remove_segment(fs: &dyn LogFs, dir: &Path, seg: &Segment) -> Result<()> {
    match fs.remove(&seg.path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(&seg.path, e)),
    }
    sync_dir(fs, dir)
}

/// The log directory as recovery left it: where appending continues.
#[derive(Debug)]
pub(crate) struct Recovered {
    /// Every segment, oldest first; the last is the active one.
    pub(crate) segments: Vec<Segment>,
    /// The active segment, open for writing.
    pub(crate) file: Arc<dyn LogFile>,
    /// Size of the active segment (from its header).
    pub(crate) segment_size: u64,
    /// File offset in the active segment where the next record goes.
    pub(crate) offset: u64,
    /// LSN of the next record.
    pub(crate) end_lsn: Lsn,
    /// Why the tail was cut, if bytes after the last valid record failed a check.
    pub(crate) torn_tail: Option<&'static str>,
    /// Synced marks written to the active segment so far, counting from its slot 0: picks
    /// the slot of the next one (recovery writes one, in the slot not holding the best).
    pub(crate) marks: u64,
    /// The side file of synced marks ([`SIDE_FILE`]), open for writing.
    pub(crate) side: Arc<dyn LogFile>,
    /// Marks written to the side file so far, as `marks` for the header.
    pub(crate) side_marks: u64,
}

/// The file of the log directory where every sync records the active segment's synced
/// end (two slots written in turn, each an `encode_mark`; nothing else). It is never synced
/// on the commit path: within a boot the page cache holds it exactly, so after a crash of
/// the process every acknowledged record is below its mark, and a mark the kernel wrote
/// back before a power cut is as true as one in the segment header, since a mark is only
/// ever written after its sync. The segment header's own mark (every [`MARK_EVERY`] bytes)
/// is the one each sync of the segment makes durable; writing the header at every sync
/// would add a page to every `fdatasync` (4-12 % on each sync's latency, measured here).
pub(crate) const SIDE_FILE: &str = "synced";

/// Where the side file's two mark slots are.
const SIDE_SLOTS: [u64; 2] = [0, 16];

/// A sync writes the segment header's mark when the log grew this much since the last
/// one: the records below it are reported as damaged, never cut, whatever happened to
/// the side file, after a power cut too.
pub(crate) const MARK_EVERY: u64 = 1 << 20;

/// A segment file examined by recovery.
struct Examined {
    /// The segment.
    seg: Segment,
    /// Its header, or why it is unusable.
    header: Result<SegmentHeader, &'static str>,
    /// Where its valid records end (when the header is valid).
    scan: Option<format::Scan>,
}

/// Opens the segments in `dir` (creating `dir` and a first segment if there are none), and
/// returns where the log continues. A torn or damaged tail (in the last segment, or a last
/// segment whose header never became durable) is cut at the last valid record, durably, so
/// no stale byte past it can later be mistaken for a record. Damage anywhere before the tail
/// is `Error::Corruption`.
pub(crate) fn recover(fs: &dyn LogFs, dir: &Path, new_segment_size: u64) -> Result<Recovered> {
    fs.create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let mut examined = Vec::new();
    for seg in list_segments(fs, dir)? {
        examined.push(examine(fs, seg)?);
    }
    // Only the newest segment may lack a valid header: a crash while creating it.
    while let Some(last) = examined.last() {
        if last.header.is_ok() || has_records(fs, &last.seg.path)? {
            break;
        }
        remove_segment(fs, dir, &last.seg)?;
        examined.pop();
    }
    for ex in &examined {
        if let Err(reason) = ex.header {
            return Err(Error::corruption(&ex.seg.path, None, reason));
        }
    }
    for pair in examined.windows(2) {
        let prev_end = pair[0].scan.map(|s| s.end_lsn);
        if prev_end != Some(pair[1].seg.first_lsn) {
            // Every segment is synced before the next one is written, so only the last
            // segment can legitimately end early.
            return Err(Error::corruption(
                &pair[0].seg.path,
                None,
                "log segment damaged before the end of the log",
            ));
        }
    }
    let side_path = dir.join(SIDE_FILE);
    let side = open_side(fs, dir, &side_path)?;
    let Some(last) = examined.pop() else {
        let (seg, file) = create_segment(fs, dir, 0, new_segment_size)?;
        return Ok(Recovered {
            segments: vec![seg],
            file,
            segment_size: new_segment_size,
            offset: HEADER_SIZE,
            end_lsn: 0,
            torn_tail: None,
            marks: 0,
            side,
            side_marks: 0,
        });
    };
    let (Ok(header), Some(scan)) = (last.header, last.scan) else {
        return Err(Error::corruption(
            &last.seg.path,
            None,
            "log segment unreadable",
        ));
    };
    let head = read_head(fs, &last.seg.path)?;
    let slots = head.map_or([None; 2], |b| format::mark_slots(&b, header.first_lsn));
    let side_slots = side_marks(&*side, &side_path, header.first_lsn)?;
    let mark = slots
        .iter()
        .chain(&side_slots)
        .flatten()
        .copied()
        .max()
        .unwrap_or(header.first_lsn);
    if mark > scan.end_lsn {
        // Records up to the mark were synced, so they cannot be a torn tail.
        return Err(Error::corruption_at(
            &last.seg.path,
            scan.end_offset,
            "log damaged before records that were synced",
        ));
    }
    let this_boot = head
        .and_then(|b| format::boot_tag(&b))
        .is_some_and(|tag| fs.boot() == Some(tag));
    if this_boot && damage_shown(fs, &last.seg.path, &header, &scan)? {
        return Err(Error::corruption_at(
            &last.seg.path,
            scan.end_offset,
            "log damaged before records written after it",
        ));
    }
    let slot = free_slot(slots);
    let file = cut_tail(fs, &last.seg, scan, header.segment_size, slot)?;
    let side_slot = free_slot(side_slots);
    // Best effort, as at every sync: the header's mark just written covers the same.
    let _ = write_side_mark(&*side, side_slot, header.first_lsn, scan.end_lsn);
    let mut segments: Vec<Segment> = examined.into_iter().map(|e| e.seg).collect();
    segments.push(last.seg);
    Ok(Recovered {
        segments,
        file,
        segment_size: header.segment_size,
        offset: scan.end_offset,
        end_lsn: scan.end_lsn,
        torn_tail: match scan.tail {
            Tail::Torn(reason) => Some(reason),
            Tail::Clean => None,
        },
        marks: slot + 1,
        side,
        side_marks: side_slot + 1,
    })
}

/// The slot of two that a new mark goes to: the one not holding the best valid mark, so
/// a torn write of the new one loses only itself.
fn free_slot(slots: [Option<Lsn>; 2]) -> u64 {
    match slots {
        [None, _] => 0,
        [Some(_), None] => 1,
        [Some(a), Some(b)] => u64::from(a >= b),
    }
}

/// The side file at `path`, created (durably) if absent, never emptied.
fn open_side(fs: &dyn LogFs, dir: &Path, path: &Path) -> Result<Arc<dyn LogFile>> {
    match fs.open(path, false) {
        Ok(file) => Ok(file),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let file = fs.open(path, true).map_err(|e| Error::io(path, e))?;
            sync_dir(fs, dir)?;
            Ok(file)
        }
        Err(e) => Err(Error::io(path, e)),
    }
}

/// The valid marks of the side file's slots for the segment starting at `first_lsn`.
fn side_marks(side: &dyn LogFile, path: &Path, first_lsn: Lsn) -> Result<[Option<Lsn>; 2]> {
    let mut b = [0u8; 32];
    let n = side.read_at(&mut b, 0).map_err(|e| Error::io(path, e))?;
    Ok(SIDE_SLOTS.map(|at| {
        let at = at as usize;
        b[..n]
            .get(at..at + 12)
            .and_then(|slot| format::decode_mark_slot(slot, first_lsn))
    }))
}

/// Writes into slot `slot % 2` of the side file that the segment starting at `first_lsn`
/// was synced up to `synced` (not synced itself: see [`SIDE_FILE`]).
pub(crate) fn write_side_mark(
    side: &dyn LogFile,
    slot: u64,
    first_lsn: Lsn,
    synced: Lsn,
) -> io::Result<()> {
    let at = SIDE_SLOTS[(slot % 2) as usize];
    side.write_all_at(&format::encode_mark(first_lsn, synced), at)
}

/// The boot tag a segment written now carries (0: none known).
fn boot_tag(fs: &dyn LogFs) -> u32 {
    fs.boot().unwrap_or(0)
}

/// Whether records that verify follow where the scan of the last segment stopped
/// (`damage`): at a record that failed its check, or at zeros that non-zero bytes follow
/// closely. Reads from there until the segment ends, [`damage::SEARCH_LIMIT`] bytes, or
/// [`damage::ZERO_RUN`] zeros in a row.
fn damage_shown(
    fs: &dyn LogFs,
    path: &Path,
    header: &SegmentHeader,
    scan: &format::Scan,
) -> Result<bool> {
    let io = |e| Error::io(path, e);
    let file = fs.open(path, false).map_err(io)?;
    let end = header
        .segment_size
        .min(scan.end_offset.saturating_add(damage::SEARCH_LIMIT));
    let mut bytes = Vec::new();
    let mut chunk = vec![0u8; SCAN_BUFFER];
    let mut zeros = 0u64;
    let mut at = scan.end_offset;
    while at < end && zeros < damage::ZERO_RUN {
        let want = (end - at).min(chunk.len() as u64) as usize;
        let n = file.read_at(&mut chunk[..want], at).map_err(io)?;
        if n == 0 {
            break;
        }
        let got = &chunk[..n];
        match got.iter().rposition(|&b| b != 0) {
            Some(i) => zeros = (n - 1 - i) as u64,
            None => zeros += n as u64,
        }
        if scan.tail == Tail::Clean && bytes.is_empty() && zeros == n as u64 {
            // The usual end of the log: zeros from where the scan stopped. Only a chunk's
            // worth is read to tell it from zeros that records follow.
            return Ok(false);
        }
        bytes.extend_from_slice(got);
        at += n as u64;
    }
    Ok(damage::verified_after(&bytes, scan.end_lsn).is_some())
}

/// Reads a segment's header and finds where its valid records end.
fn examine(fs: &dyn LogFs, seg: Segment) -> Result<Examined> {
    let file = fs
        .open(&seg.path, false)
        .map_err(|e| Error::io(&seg.path, e))?;
    let mut r = BufReader::with_capacity(SCAN_BUFFER, Reader::new(file));
    let header = format::read_header(&mut r, &seg.path)?.and_then(|h| {
        if h.first_lsn == seg.first_lsn {
            Ok(h)
        } else {
            Err("log segment name and header disagree")
        }
    });
    let scan = match &header {
        Ok(h) => Some(format::scan_records(&mut r, h, &seg.path, |_, _| Ok(()))?),
        Err(_) => None,
    };
    Ok(Examined { seg, header, scan })
}

/// The header bytes of the segment file at `path`, `None` if it is shorter than a header.
fn read_head(fs: &dyn LogFs, path: &Path) -> Result<Option<[u8; HEADER_SIZE as usize]>> {
    let file = fs.open(path, false).map_err(|e| Error::io(path, e))?;
    let mut b = [0u8; HEADER_SIZE as usize];
    if file.read_at(&mut b, 0).map_err(|e| Error::io(path, e))? < b.len() {
        return Ok(None);
    }
    Ok(Some(b))
}

/// Clears the boot tag of the segment file at `path`, a copy taken while the segment was
/// written (a backup's). The copy's bytes past its synced mark come from reads that raced
/// the writes: a record torn by the copy may have whole records after it, as after a
/// restart, so records that verify after a failed one prove nothing there, and its
/// recovery cuts at the first failure past the mark.
///
/// # Errors
/// `Io` if the file cannot be opened or written.
pub(crate) fn clear_boot_tag(path: &Path) -> Result<()> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    crate::sys::write_all_at(&file, &[0u8; 4], format::BOOT_AT as u64)
        .map_err(|e| Error::io(path, e))
}

/// Writes the synced mark of the segment `file` (starting at `first_lsn`) into slot
/// `slot % 2`: its records below `synced` are on stable storage. Not synced itself: the
/// next sync of the segment carries it. Callers alternate the slots.
pub(crate) fn write_mark(
    file: &dyn LogFile,
    slot: u64,
    first_lsn: Lsn,
    synced: Lsn,
) -> io::Result<()> {
    let at = format::MARK_SLOTS[(slot % 2) as usize];
    file.write_all_at(&format::encode_mark(first_lsn, synced), at)
}

/// Truncates the active segment just after its last valid record and preallocates it again
/// (so everything after reads as zeros), writes a synced mark at its end into mark slot
/// `slot` and this boot's tag into its header, durably, and returns it open for writing.
fn cut_tail(
    fs: &dyn LogFs,
    seg: &Segment,
    scan: format::Scan,
    segment_size: u64,
    slot: u64,
) -> Result<Arc<dyn LogFile>> {
    let io = |e| Error::io(&seg.path, e);
    let file = fs.open(&seg.path, false).map_err(io)?;
    file.set_len(scan.end_offset).map_err(io)?;
    file.preallocate(segment_size).map_err(io)?;
    // Both are made durable with the records by the sync below: every record kept is then
    // below the mark, and damage to it is reported at later opens, whatever happens next.
    write_mark(&*file, slot, seg.first_lsn, scan.end_lsn).map_err(io)?;
    file.write_all_at(&boot_tag(fs).to_le_bytes(), format::BOOT_AT as u64)
        .map_err(io)?;
    file.sync_all().map_err(io)?;
    Ok(file)
}

/// Whether anything but zeros follows the header slot of a segment file: a segment whose
/// header is damaged but that holds records was not a crash during its creation (the header
/// is durable before any record is written), so deleting it would lose acknowledged writes.
fn has_records(fs: &dyn LogFs, path: &Path) -> Result<bool> {
    let file = fs.open(path, false).map_err(|e| Error::io(path, e))?;
    let mut r = BufReader::with_capacity(SCAN_BUFFER, Reader::new(file));
    let mut skipped = 0u64;
    loop {
        let chunk = r.fill_buf().map_err(|e| Error::io(path, e))?;
        if chunk.is_empty() {
            return Ok(false);
        }
        let n = chunk.len();
        let skip = (HEADER_SIZE.saturating_sub(skipped) as usize).min(n);
        if chunk[skip..].iter().any(|&b| b != 0) {
            return Ok(true);
        }
        skipped += n as u64;
        r.consume(n);
    }
}
