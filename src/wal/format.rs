//! The byte layout of segment headers and records (see the module docs of `wal`), and the
//! one decoder that recovery, replay and the `wal_decode` fuzz target all run.

use std::io::{self, Read};
use std::path::Path;

use super::{LogOp, Lsn};
use crate::error::{Error, Result};
use crate::store::checksum;

/// First bytes of every segment file.
pub(crate) const MAGIC: [u8; 8] = *b"BFKVWAL\0";
/// Format version written into segment headers: 4 since merge records exist (3 added batch
/// records), so a bfkv that knows neither refuses the segment instead of cutting the log at
/// the first one.
pub(crate) const VERSION: u32 = 4;
/// The versions before merge records (3) and before batch records (2), still read.
const OLDER_VERSIONS: [u32; 2] = [2, 3];
/// Bytes reserved for the segment header; records start at this file offset.
pub(crate) const HEADER_SIZE: u64 = 64;
/// Bytes of the header covered by its checksum (magic .. first LSN).
const HEADER_CHECKED: usize = 32;
/// Checksum and operation byte in front of every record's lengths.
const RECORD_FIXED: u64 = 5;
/// Most bytes a LEB128 length of a `u32` takes.
const MAX_VARINT: u64 = 5;
/// Most bytes a record takes besides its key and value (the lengths at their longest).
const MAX_HEAD: u64 = RECORD_FIXED + 2 * MAX_VARINT;
/// Smallest accepted segment size: a header and room for real records.
pub(crate) const MIN_SEGMENT_SIZE: u64 = 4096;
/// Largest accepted segment size: keeps every record body (bounded by the segment) within
/// the `u32` length prefix, and bounds what a header read from disk can claim.
pub(crate) const MAX_SEGMENT_SIZE: u64 = 1 << 32;
/// Op byte of an insert record.
const OP_INSERT: u8 = 1;
/// Op byte of a remove record.
const OP_REMOVE: u8 = 2;
/// Op byte of an atomic batch: an empty key and, as the value, the batch's writes one after
/// another (`encode_batch_write`). One checksum covers them all, so recovery finds the
/// batch whole or cuts it with the torn tail.
const OP_BATCH: u8 = 3;
/// Op byte of a merge record: the key and, as the value, its operand list.
const OP_MERGE: u8 = 4;
/// Kind byte of an insert inside a batch record.
const BATCH_PUT: u8 = 1;
/// Kind byte of a remove inside a batch record.
const BATCH_REMOVE: u8 = 2;
/// Kind byte of a merge inside a batch record (the value is the operand list).
const BATCH_MERGE: u8 = 3;

/// Bytes the record for `op` takes in the log; also how far it advances the LSN.
pub(crate) fn record_len(op: &LogOp<'_>) -> u64 {
    let (k, v) = match op {
        LogOp::Insert { key, value } => (key.len() as u64, value.len() as u64),
        LogOp::Remove { key } => (key.len() as u64, 0),
        LogOp::Batch { body } => (0, body.len() as u64),
        LogOp::Merge { key, operands } => (key.len() as u64, operands.len() as u64),
    };
    RECORD_FIXED + varint_len(k) + varint_len(v) + k + v
}

/// The longest key a record may have in `room` bytes (with an empty value).
pub(crate) fn max_key_len(room: u64) -> u64 {
    longest_fitting(room.saturating_sub(RECORD_FIXED + 1))
}

/// The longest value a record with a `key_len`-byte key may have in `room` bytes; `None` if
/// the key alone does not fit.
pub(crate) fn max_value_len(room: u64, key_len: u64) -> Option<u64> {
    let rest = room.checked_sub(RECORD_FIXED + varint_len(key_len) + key_len)?;
    (rest > 0).then(|| longest_fitting(rest))
}

/// The largest `n` with `varint_len(n) + n <= room` (`room` at least 1; 0 otherwise).
fn longest_fitting(room: u64) -> u64 {
    let mut n = room.saturating_sub(1);
    // At most four steps: the length's encoding shrinks by a byte each time `n` crosses a
    // power of 128.
    while n > 0 && varint_len(n) + n > room {
        n -= 1;
    }
    n
}

/// Bytes the LEB128 encoding of `n` takes (7 bits per byte).
fn varint_len(n: u64) -> u64 {
    let bits = 64 - u64::from(n.leading_zeros());
    bits.div_ceil(7).max(1)
}

/// Writes `n` as LEB128 at the start of `out`; returns the bytes written.
fn put_varint(out: &mut [u8], mut n: u64) -> usize {
    let mut i = 0;
    while n >= 0x80 {
        out[i] = (n as u8 & 0x7f) | 0x80;
        n >>= 7;
        i += 1;
    }
    out[i] = n as u8;
    i + 1
}

/// Bytes one write takes inside a batch record: kind, two lengths, key, value.
pub(crate) fn batch_write_len(key_len: usize, value_len: usize) -> u64 {
    let (k, v) = (key_len as u64, value_len as u64);
    1 + varint_len(k) + varint_len(v) + k + v
}

/// Appends one write of a batch to `body`.
pub(crate) fn encode_batch_write(body: &mut Vec<u8>, key: &[u8], write: BatchValue<'_>) {
    let mut head = [0u8; 1 + 2 * MAX_VARINT as usize];
    let v = match write {
        BatchValue::Put(v) => {
            head[0] = BATCH_PUT;
            v
        }
        BatchValue::Remove => {
            head[0] = BATCH_REMOVE;
            &[]
        }
        BatchValue::Merge(operands) => {
            head[0] = BATCH_MERGE;
            operands
        }
    };
    let mut n = 1;
    n += put_varint(&mut head[n..], key.len() as u64);
    n += put_varint(&mut head[n..], v.len() as u64);
    body.extend_from_slice(&head[..n]);
    body.extend_from_slice(key);
    body.extend_from_slice(v);
}

/// The writes of a batch record's body, in order: key and value (`None`: a remove). An item
/// is `Err` (and the last) where the body does not decode; a body the writer encoded always
/// does, and the record checksum keeps damage out, so that means a writer bug.
pub(crate) fn batch_writes(body: &[u8]) -> BatchWrites<'_> {
    BatchWrites { rest: body }
}

/// Iterator returned by [`batch_writes`].
pub(crate) struct BatchWrites<'a> {
    rest: &'a [u8],
}

/// One decoded write of a batch: key and what it does.
pub(crate) type BatchWrite<'a> = (&'a [u8], BatchValue<'a>);

/// What one write of a batch record does to its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BatchValue<'a> {
    /// Sets this value.
    Put(&'a [u8]),
    /// Removes the key.
    Remove,
    /// Merges this operand list into the value.
    Merge(&'a [u8]),
}

impl<'a> Iterator for BatchWrites<'a> {
    type Item = std::result::Result<BatchWrite<'a>, &'static str>;

    fn next(&mut self) -> Option<Self::Item> {
        let (&kind, after) = self.rest.split_first()?;
        let decoded = get_lengths(after).and_then(|(k, v, n)| {
            let (k, v) = (k as usize, v as usize);
            let data = after.get(n..n + k + v)?;
            let (key, value) = data.split_at(k);
            let value = match kind {
                BATCH_PUT => BatchValue::Put(value),
                BATCH_REMOVE if v == 0 => BatchValue::Remove,
                BATCH_MERGE => BatchValue::Merge(value),
                _ => return None,
            };
            Some(((key, value), n + k + v))
        });
        if let Some((write, used)) = decoded {
            self.rest = &after[used..];
            Some(Ok(write))
        } else {
            self.rest = &[];
            Some(Err("malformed write inside a batch record"))
        }
    }
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
/// (the Buffered log encodes straight into its staging ring).
pub(crate) fn encode_record_into(out: &mut [u8], lsn: Lsn, op: &LogOp<'_>) {
    let (code, key, value): (u8, &[u8], &[u8]) = match op {
        LogOp::Insert { key, value } => (OP_INSERT, key, value),
        LogOp::Remove { key } => (OP_REMOVE, key, &[]),
        LogOp::Batch { body } => (OP_BATCH, &[], body),
        LogOp::Merge { key, operands } => (OP_MERGE, key, operands),
    };
    debug_assert_eq!(out.len() as u64, record_len(op));
    // The operation and lengths are put together on the stack and everything is checksummed
    // from where it already is: reading the record back out of `out` right after the byte
    // copies would stall on loads that straddle those stores.
    let mut head = [0u8; 1 + 2 * 5];
    head[0] = code;
    let mut n = 1;
    n += put_varint(&mut head[n..], key.len() as u64);
    n += put_varint(&mut head[n..], value.len() as u64);
    let head = &head[..n];
    let crc = checksum::crc32c_append(record_crc(lsn, head, key), value);
    let at = RECORD_FIXED as usize - 1;
    out[at..at + n].copy_from_slice(head);
    let at = at + n;
    out[at..at + key.len()].copy_from_slice(key);
    let at = at + key.len();
    out[at..at + value.len()].copy_from_slice(value);
    out[..4].copy_from_slice(&crc.to_le_bytes());
}

/// The record checksum covers the record's LSN, which is not stored: a record read anywhere
/// but at its own position (a stale record of a recycled or reused file, a copy in the wrong
/// place) fails it. It covers the lengths too, so damaged lengths cannot make the reader
/// check the wrong bytes against a checksum that happens to match. `head` and `data` are
/// the record after its checksum, in two pieces (the reader holds them apart).
fn record_crc(lsn: Lsn, head: &[u8], data: &[u8]) -> u32 {
    let crc = checksum::crc32c_append(checksum::crc32c(&lsn.to_le_bytes()), head);
    checksum::crc32c_append(crc, data)
}

/// The record lengths at the start of `b` (after the operation byte): key length, value
/// length, and the bytes they took. `None` if `b` ends first or a length does not fit in a
/// `u32` (a writer never encodes one that does not).
fn get_lengths(b: &[u8]) -> Option<(u64, u64, usize)> {
    let (k, a) = get_varint(b)?;
    let (v, c) = get_varint(b.get(a..)?)?;
    Some((k, v, a + c))
}

/// Decodes one LEB128 `u32` at the start of `b`: the value and the bytes it took.
fn get_varint(b: &[u8]) -> Option<(u64, usize)> {
    let mut n = 0u64;
    for (i, &byte) in b.iter().take(MAX_VARINT as usize).enumerate() {
        n |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return u32::try_from(n).is_ok().then_some((n, i + 1));
        }
    }
    None
}

/// Length of the whole records at the start of `buf` that fit in `room` bytes. `buf` holds
/// whole records as `encode_record` wrote them.
pub(crate) fn fitting_prefix(buf: &[u8], room: u64) -> usize {
    let mut at = 0usize;
    while let Some((k, v, n)) = buf.get(at + RECORD_FIXED as usize..).and_then(get_lengths) {
        let len = RECORD_FIXED as usize + n + k as usize + v as usize;
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

/// Where the two synced-mark slots sit in a segment header. A mark is the LSN below which
/// the segment's records were synced when it was written (8 bytes), then a crc32c of the
/// segment's first LSN and that LSN (4 bytes); all zeros is no mark. Marks go to the slots
/// in turn, so a write torn by a power cut damages at most the newer one, and the older
/// one still holds.
pub(crate) const MARK_SLOTS: [u64; 2] = [36, 48];

/// The synced mark bytes saying the records of the segment starting at `first_lsn` were
/// synced up to `synced`.
pub(crate) fn encode_mark(first_lsn: Lsn, synced: Lsn) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[..8].copy_from_slice(&synced.to_le_bytes());
    let crc = checksum::crc32c_append(checksum::crc32c(&first_lsn.to_le_bytes()), &b[..8]);
    b[8..].copy_from_slice(&crc.to_le_bytes());
    b
}

/// The highest valid synced mark in header bytes `b` of the segment starting at
/// `first_lsn`, if any. A slot that fails its check (a torn mark write) is ignored: the
/// mark only ever narrows what may be cut as a torn tail, so ignoring one errs towards
/// the cut the log made before marks existed.
#[cfg(all(test, not(shuttle)))]
pub(crate) fn decode_mark(b: &[u8; HEADER_SIZE as usize], first_lsn: Lsn) -> Option<Lsn> {
    mark_slots(b, first_lsn).into_iter().flatten().max()
}

/// The valid mark of each slot in header bytes `b` (see [`decode_mark`]).
pub(crate) fn mark_slots(b: &[u8; HEADER_SIZE as usize], first_lsn: Lsn) -> [Option<Lsn>; 2] {
    MARK_SLOTS.map(|at| decode_mark_slot(&b[at as usize..at as usize + 12], first_lsn))
}

/// The mark in the 12 bytes `mark` (an [`encode_mark`] of the segment starting at
/// `first_lsn`), if they hold a valid one.
pub(crate) fn decode_mark_slot(mark: &[u8], first_lsn: Lsn) -> Option<Lsn> {
    let synced = le_u64(mark.get(..8)?);
    (mark == encode_mark(first_lsn, synced) && synced >= first_lsn).then_some(synced)
}

/// Where a segment header holds the boot tag of the run that created the segment or last
/// opened it (`LogFs::boot`; 4 bytes, 0 for none). Outside the header's checksum, like the
/// synced mark: open rewrites it.
pub(crate) const BOOT_AT: usize = 60;

/// The boot tag in header bytes `b`, if one is there.
pub(crate) fn boot_tag(b: &[u8; HEADER_SIZE as usize]) -> Option<u32> {
    let tag = u32::from_le_bytes([b[BOOT_AT], b[BOOT_AT + 1], b[BOOT_AT + 2], b[BOOT_AT + 3]]);
    (tag != 0).then_some(tag)
}

impl SegmentHeader {
    /// The header bytes.
    pub(crate) fn encode(&self) -> [u8; HEADER_SIZE as usize] {
        let mut b = [0u8; HEADER_SIZE as usize];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[16..24].copy_from_slice(&self.segment_size.to_le_bytes());
        b[24..32].copy_from_slice(&self.first_lsn.to_le_bytes());
        let crc = checksum::crc32c(&b[..HEADER_CHECKED]);
        b[32..36].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Validates and decodes header bytes; the error says which check failed.
    pub(crate) fn decode(b: &[u8; HEADER_SIZE as usize]) -> Result<SegmentHeader, &'static str> {
        if b[0..8] != MAGIC {
            return Err("bad log segment magic");
        }
        let crc = u32::from_le_bytes([b[32], b[33], b[34], b[35]]);
        if crc != checksum::crc32c(&b[..HEADER_CHECKED]) {
            return Err("log segment header checksum mismatch");
        }
        let version = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        if version != VERSION && !OLDER_VERSIONS.contains(&version) {
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
    let mut data = Vec::new();
    loop {
        let room = header.segment_size.saturating_sub(scan.end_offset);
        // The smallest record: checksum, operation, two one-byte lengths.
        if room < RECORD_FIXED + 2 {
            return Ok(scan);
        }
        // Checksum, operation and the longest lengths, read one byte at a time past the
        // fixed part so the reader stays at the key.
        let mut head = [0u8; MAX_HEAD as usize];
        let fixed = RECORD_FIXED as usize;
        let n = read_full(r, &mut head[..fixed]).map_err(|e| Error::io(path, e))?;
        if head[..n].iter().all(|&b| b == 0) {
            // End of file or preallocated zeros: where the writer stopped (no record starts
            // with a zero operation byte).
            return Ok(scan);
        }
        if n < fixed {
            return Ok(scan.torn("truncated record header"));
        }
        let mut have = fixed;
        let (klen, vlen, lengths) = loop {
            if let Some(found) = get_lengths(&head[fixed..have]) {
                break found;
            }
            if have == head.len() {
                return Ok(scan.torn("record lengths malformed"));
            }
            if read_full(r, &mut head[have..=have]).map_err(|e| Error::io(path, e))? == 0 {
                return Ok(scan.torn("truncated record header"));
            }
            have += 1;
        };
        let head_len = (fixed + lengths) as u64;
        let data_len = klen + vlen;
        if data_len > room.saturating_sub(head_len) {
            return Ok(scan.torn("record length out of range"));
        }
        data.clear();
        // `take` bounds the read by the bytes that exist, so a huge garbage length cannot
        // allocate more than the file holds.
        let got = r
            .by_ref()
            .take(data_len)
            .read_to_end(&mut data)
            .map_err(|e| Error::io(path, e))?;
        if (got as u64) < data_len {
            return Ok(scan.torn("truncated record"));
        }
        let crc = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        let expected = record_crc(scan.end_lsn, &head[4..have], &data);
        if crc != expected {
            // Also a valid record from another place in the log (its LSN is not this one).
            return Ok(scan.torn("record checksum mismatch"));
        }
        let (key, value) = data.split_at(klen as usize);
        let op = match head[4] {
            OP_INSERT => LogOp::Insert { key, value },
            OP_REMOVE if vlen == 0 => LogOp::Remove { key },
            OP_BATCH if klen == 0 => LogOp::Batch { body: value },
            OP_MERGE => LogOp::Merge {
                key,
                operands: value,
            },
            _ => return Ok(scan.torn("unknown record operation")),
        };
        visit(scan.end_lsn, op)?;
        scan.end_offset += head_len + data_len;
        scan.end_lsn += head_len + data_len;
        scan.records += 1;
    }
}

/// What the first bytes of a record say about it, before its checksum is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Shape {
    /// Operation byte.
    pub(super) op: u8,
    /// Key length.
    pub(super) key_len: u64,
    /// Bytes of checksum, operation and lengths.
    pub(super) head_len: usize,
    /// Bytes of the whole record.
    pub(super) len: usize,
}

/// The shape of the record that would start at `b[0]`, if its first bytes are ones a
/// writer could have written: a known operation, lengths that decode and agree with it (a
/// remove has no value, a batch no key), and the whole record inside `b`.
pub(super) fn shape(b: &[u8]) -> Option<Shape> {
    let fixed = RECORD_FIXED as usize;
    let op = *b.get(fixed - 1)?;
    let (k, v, n) = get_lengths(b.get(fixed..)?)?;
    let agrees = match op {
        OP_INSERT | OP_MERGE => true,
        OP_REMOVE => v == 0,
        OP_BATCH => k == 0,
        _ => false,
    };
    let head_len = fixed + n;
    let len = head_len.checked_add(usize::try_from(k + v).ok()?)?;
    (agrees && len <= b.len()).then_some(Shape {
        op,
        key_len: k,
        head_len,
        len,
    })
}

/// Whether the record of shape `s` at the start of `b` passes its checksum at `lsn`, and a
/// batch record's writes all decode.
pub(super) fn verifies(b: &[u8], lsn: Lsn, s: &Shape) -> bool {
    let Some((head, data)) = b
        .get(..s.len)
        .and_then(|r| r.split_at_checked(s.head_len))
        .filter(|(head, _)| head.len() > 4)
    else {
        return false;
    };
    let crc = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    if crc != record_crc(lsn, &head[4..], data) {
        return false;
    }
    s.op != OP_BATCH || batch_writes(data).all(|w| w.is_ok())
}

impl Scan {
    /// This scan, stopped at a torn or damaged record.
    fn torn(mut self, reason: &'static str) -> Scan {
        self.tail = Tail::Torn(reason);
        self
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

#[cfg(all(test, not(shuttle)))]
#[path = "format_tests.rs"]
mod tests;
