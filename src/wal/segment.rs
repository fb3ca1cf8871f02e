//! Segment files: naming, creation with preallocation, and recovery of the log directory at
//! open (find the last valid record, cut the torn tail, check the segments continue each
//! other).

use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};

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
    file.write_all_at(&header.encode(), 0).map_err(io)?;
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
}

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
    let Some(last) = examined.pop() else {
        let (seg, file) = create_segment(fs, dir, 0, new_segment_size)?;
        return Ok(Recovered {
            segments: vec![seg],
            file,
            segment_size: new_segment_size,
            offset: HEADER_SIZE,
            end_lsn: 0,
            torn_tail: None,
        });
    };
    let (Ok(header), Some(scan)) = (last.header, last.scan) else {
        return Err(Error::corruption(
            &last.seg.path,
            None,
            "log segment unreadable",
        ));
    };
    if synced_mark(fs, &last.seg.path, header.first_lsn)? > scan.end_lsn {
        // Records up to the mark were synced, so they cannot be a torn tail.
        return Err(Error::corruption_at(
            &last.seg.path,
            scan.end_offset,
            "log damaged before records that were synced",
        ));
    }
    let file = cut_tail(fs, &last.seg.path, scan.end_offset, header.segment_size)?;
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
    })
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

/// The LSN below which the segment at `path` (starting at `first_lsn`) was synced, as its
/// header's synced mark says (`first_lsn` without a mark).
fn synced_mark(fs: &dyn LogFs, path: &Path, first_lsn: Lsn) -> Result<Lsn> {
    let file = fs.open(path, false).map_err(|e| Error::io(path, e))?;
    let mut b = [0u8; HEADER_SIZE as usize];
    if file.read_at(&mut b, 0).map_err(|e| Error::io(path, e))? < b.len() {
        return Ok(first_lsn);
    }
    Ok(format::decode_mark(&b, first_lsn).unwrap_or(first_lsn))
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
/// (so everything after reads as zeros), durably, and returns it open for writing.
fn cut_tail(
    fs: &dyn LogFs,
    path: &Path,
    end_offset: u64,
    segment_size: u64,
) -> Result<Arc<dyn LogFile>> {
    let io = |e| Error::io(path, e);
    let file = fs.open(path, false).map_err(io)?;
    file.set_len(end_offset).map_err(io)?;
    file.preallocate(segment_size).map_err(io)?;
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
