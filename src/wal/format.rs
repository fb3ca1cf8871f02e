//! The byte layout of segment headers and records (see the module docs of `wal`), and the
//! one decoder that recovery, replay and the `wal_decode` fuzz target all run.

use std::io::{self, Read};
use std::path::Path;

use super::{LogOp, Lsn};
use crate::error::{Error, Result};

/// First bytes of every segment file.
pub(crate) const MAGIC: [u8; 8] = *b"BFKVWAL\0";
/// Format version written into segment headers; a reader rejects any other.
pub(crate) const VERSION: u32 = 1;
/// Bytes reserved for the segment header; records start at this file offset.
pub(crate) const HEADER_SIZE: u64 = 64;
/// Bytes of the header covered by its checksum (magic .. first LSN).
const HEADER_CHECKED: usize = 32;
/// Length prefix plus checksum in front of every record body.
pub(crate) const RECORD_PREFIX: u64 = 8;
/// Fixed part of a record body: LSN u64, op u8, key length u32, value length u32.
pub(crate) const BODY_FIXED: u64 = 17;
/// Bytes a record takes besides its key and value.
pub(crate) const RECORD_OVERHEAD: u64 = RECORD_PREFIX + BODY_FIXED;
/// Smallest accepted segment size: a header and room for real records.
pub(crate) const MIN_SEGMENT_SIZE: u64 = 4096;
/// Largest accepted segment size: keeps every record body (bounded by the segment) within
/// the `u32` length prefix, and bounds what a header read from disk can claim.
pub(crate) const MAX_SEGMENT_SIZE: u64 = 1 << 32;
/// Op byte of an insert record.
const OP_INSERT: u8 = 1;
/// Op byte of a remove record.
const OP_REMOVE: u8 = 2;

/// Bytes the record for `op` takes in the log; also how far it advances the LSN.
pub(crate) fn record_len(op: &LogOp<'_>) -> u64 {
    let (k, v) = match op {
        LogOp::Insert { key, value } => (key.len(), value.len()),
        LogOp::Remove { key } => (key.len(), 0),
    };
    RECORD_OVERHEAD + k as u64 + v as u64
}

/// Appends the record for `op` at `lsn` to `out`. The caller checked that the key and value
/// lengths fit in `u32` (they are bounded by the segment size).
pub(crate) fn encode_record(out: &mut Vec<u8>, lsn: Lsn, op: &LogOp<'_>) {
    let start = out.len();
    let len = record_len(op) as usize;
    out.resize(start + len, 0);
    encode_record_into(&mut out[start..], lsn, op);
}

/// Writes the record for `op` at `lsn` into `out`, which is exactly `record_len(op)` bytes
/// (the Buffered log encodes straight into its mapped segment).
pub(crate) fn encode_record_into(out: &mut [u8], lsn: Lsn, op: &LogOp<'_>) {
    let (code, key, value): (u8, &[u8], &[u8]) = match op {
        LogOp::Insert { key, value } => (OP_INSERT, key, value),
        LogOp::Remove { key } => (OP_REMOVE, key, &[]),
    };
    debug_assert_eq!(out.len() as u64, record_len(op));
    let body_len = BODY_FIXED as usize + key.len() + value.len();
    let (prefix, body) = out.split_at_mut(RECORD_PREFIX as usize);
    prefix[..4].copy_from_slice(&(body_len as u32).to_le_bytes());
    body[..8].copy_from_slice(&lsn.to_le_bytes());
    body[8] = code;
    body[9..13].copy_from_slice(&(key.len() as u32).to_le_bytes());
    body[13..17].copy_from_slice(&(value.len() as u32).to_le_bytes());
    let (k, v) = body[BODY_FIXED as usize..].split_at_mut(key.len());
    k.copy_from_slice(key);
    v.copy_from_slice(value);
    let crc = record_crc(&prefix[..4], body);
    prefix[4..8].copy_from_slice(&crc.to_le_bytes());
}

/// The record checksum covers the length prefix too, so a damaged length cannot make the
/// reader check the wrong bytes against a checksum that happens to match.
fn record_crc(len: &[u8], body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(len), body)
}

/// Length of the whole records at the start of `buf` that fit in `room` bytes. `buf` holds
/// whole records as `encode_record` wrote them.
pub(crate) fn fitting_prefix(buf: &[u8], room: u64) -> usize {
    let mut at = 0usize;
    while at + 4 <= buf.len() {
        let body = u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
        let len = RECORD_PREFIX as usize + body as usize;
        if (at + len) as u64 > room {
            break;
        }
        at += len;
    }
    debug_assert!(at <= buf.len(), "the append buffer holds whole records");
    at.min(buf.len())
}

/// The decoded header of a segment file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegmentHeader {
    /// Total file size the segment was created with (header included).
    pub(crate) segment_size: u64,
    /// LSN of the first record of the segment.
    pub(crate) first_lsn: Lsn,
}

impl SegmentHeader {
    /// The header bytes.
    pub(crate) fn encode(&self) -> [u8; HEADER_SIZE as usize] {
        let mut b = [0u8; HEADER_SIZE as usize];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[16..24].copy_from_slice(&self.segment_size.to_le_bytes());
        b[24..32].copy_from_slice(&self.first_lsn.to_le_bytes());
        let crc = crc32c::crc32c(&b[..HEADER_CHECKED]);
        b[32..36].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Validates and decodes header bytes; the error says which check failed.
    pub(crate) fn decode(b: &[u8; HEADER_SIZE as usize]) -> Result<SegmentHeader, &'static str> {
        if b[0..8] != MAGIC {
            return Err("bad log segment magic");
        }
        let crc = u32::from_le_bytes([b[32], b[33], b[34], b[35]]);
        if crc != crc32c::crc32c(&b[..HEADER_CHECKED]) {
            return Err("log segment header checksum mismatch");
        }
        if u32::from_le_bytes([b[8], b[9], b[10], b[11]]) != VERSION {
            return Err("unsupported log format version");
        }
        let segment_size = le_u64(&b[16..24]);
        if !(MIN_SEGMENT_SIZE..=MAX_SEGMENT_SIZE).contains(&segment_size) {
            return Err("log segment size out of range");
        }
        Ok(SegmentHeader {
            segment_size,
            first_lsn: le_u64(&b[24..32]),
        })
    }
}

/// Reads an 8-byte little-endian integer from a slice of exactly 8 bytes.
fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Reads and decodes the header at the reader's position. `Ok(Err(reason))` is a header that
/// is missing (short file) or damaged; `Err` is an I/O failure.
pub(crate) fn read_header<R: Read>(
    r: &mut R,
    path: &Path,
) -> Result<Result<SegmentHeader, &'static str>> {
    let mut b = [0u8; HEADER_SIZE as usize];
    let n = read_full(r, &mut b).map_err(|e| Error::io(path, e))?;
    if n < b.len() {
        return Ok(Err("log segment shorter than its header"));
    }
    Ok(SegmentHeader::decode(&b))
}

/// Why a scan of a segment's records stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tail {
    /// Zeros (preallocated space), end of file, or no room for another record: the normal
    /// end of a segment.
    Clean,
    /// Bytes that are not a valid next record (torn write, damage, garbage).
    Torn(&'static str),
}

/// Where the valid records of a segment end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Scan {
    /// File offset just after the last valid record.
    pub(crate) end_offset: u64,
    /// LSN just after the last valid record (the first LSN if there is none).
    pub(crate) end_lsn: Lsn,
    /// Valid records.
    pub(crate) records: u64,
    /// Why the scan stopped.
    pub(crate) tail: Tail,
}

/// Decodes the records of a segment whose header was `header`, from a reader positioned just
/// after the header, calling `visit` for each valid record in order. Stops at the first byte
/// that does not continue the log (never panics, whatever the bytes): the records visited
/// are always a prefix of the segment. `path` names the file in I/O errors; an error from
/// `visit` stops the scan and is returned.
pub(crate) fn scan_records<R: Read>(
    r: &mut R,
    header: &SegmentHeader,
    path: &Path,
    mut visit: impl FnMut(Lsn, LogOp<'_>) -> Result<()>,
) -> Result<Scan> {
    let mut scan = Scan {
        end_offset: HEADER_SIZE,
        end_lsn: header.first_lsn,
        records: 0,
        tail: Tail::Clean,
    };
    let mut body = Vec::new();
    loop {
        let room = header.segment_size.saturating_sub(scan.end_offset);
        if room < RECORD_OVERHEAD {
            return Ok(scan);
        }
        let mut prefix = [0u8; RECORD_PREFIX as usize];
        let n = read_full(r, &mut prefix).map_err(|e| Error::io(path, e))?;
        if prefix[..n].iter().all(|&b| b == 0) {
            // End of file or preallocated zeros: where the writer stopped.
            return Ok(scan);
        }
        if n < prefix.len() {
            return Ok(scan.torn("truncated record header"));
        }
        let body_len = u64::from(u32::from_le_bytes([
            prefix[0], prefix[1], prefix[2], prefix[3],
        ]));
        if body_len < BODY_FIXED || body_len > room - RECORD_PREFIX {
            return Ok(scan.torn("record length out of range"));
        }
        body.clear();
        // `take` bounds the read by the bytes that exist, so a huge garbage length cannot
        // allocate more than the file holds.
        let got = r
            .by_ref()
            .take(body_len)
            .read_to_end(&mut body)
            .map_err(|e| Error::io(path, e))?;
        if (got as u64) < body_len {
            return Ok(scan.torn("truncated record"));
        }
        let crc = u32::from_le_bytes([prefix[4], prefix[5], prefix[6], prefix[7]]);
        if crc != record_crc(&prefix[..4], &body) {
            return Ok(scan.torn("record checksum mismatch"));
        }
        let op = match decode_body(&body, scan.end_lsn) {
            Ok(op) => op,
            Err(reason) => return Ok(scan.torn(reason)),
        };
        visit(scan.end_lsn, op)?;
        scan.end_offset += RECORD_PREFIX + body_len;
        scan.end_lsn += RECORD_PREFIX + body_len;
        scan.records += 1;
    }
}

impl Scan {
    /// This scan, stopped at a torn or damaged record.
    fn torn(mut self, reason: &'static str) -> Scan {
        self.tail = Tail::Torn(reason);
        self
    }
}

/// Decodes a checksummed record body that must carry LSN `expected`.
fn decode_body(body: &[u8], expected: Lsn) -> Result<LogOp<'_>, &'static str> {
    if body.len() < BODY_FIXED as usize {
        return Err("record length out of range");
    }
    if le_u64(&body[0..8]) != expected {
        // A valid record from another place in the log (a stale or misplaced copy).
        return Err("record LSN out of sequence");
    }
    let klen = u32::from_le_bytes([body[9], body[10], body[11], body[12]]) as usize;
    let vlen = u32::from_le_bytes([body[13], body[14], body[15], body[16]]) as usize;
    let data = &body[BODY_FIXED as usize..];
    if klen.checked_add(vlen) != Some(data.len()) {
        return Err("record key and value lengths disagree with its length");
    }
    let (key, value) = data.split_at(klen);
    match body[8] {
        OP_INSERT => Ok(LogOp::Insert { key, value }),
        OP_REMOVE if vlen == 0 => Ok(LogOp::Remove { key }),
        _ => Err("unknown record operation"),
    }
}

/// Reads until `buf` is full or the reader ends; returns the bytes read.
fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
