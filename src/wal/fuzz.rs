//! The `wal_decode` fuzz check: untrusted bytes through the segment decoder that recovery and
//! replay use, checked against the bytes themselves and against a model of valid records.

use std::io::Cursor;
use std::path::Path;

use super::format::{self, SegmentHeader, HEADER_SIZE};
use super::{LogOp, Lsn};

/// An owned decoded record: LSN, kind (`INSERT`, `REMOVE`, `BATCH`, `MERGE`), key, value (a
/// batch's body, a merge's operands).
type Owned = (Lsn, u8, Vec<u8>, Vec<u8>);

const INSERT: u8 = 0;
const REMOVE: u8 = 1;
const BATCH: u8 = 2;
const MERGE: u8 = 3;

/// The operation an owned record stands for.
fn op_of<'a>(kind: u8, key: &'a [u8], value: &'a [u8]) -> LogOp<'a> {
    match kind {
        INSERT => LogOp::Insert { key, value },
        REMOVE => LogOp::Remove { key },
        MERGE => LogOp::Merge {
            key,
            operands: value,
        },
        _ => LogOp::Batch { body: value },
    }
}

/// Decodes fuzz input as a log segment and checks what the decoder returns. Panics on any
/// inconsistency.
///
/// `data[0]` picks the mode. Raw (bit 0 clear): the rest is a segment file. Model (bit 0
/// set): the rest describes records, which are encoded into a valid segment, then damaged
/// (truncated, one byte flipped, or overwritten with the remaining input from some offset);
/// the decoder must return every record that lies wholly before the damage, unchanged.
pub(crate) fn decode_check(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        check_raw(rest);
    } else {
        check_model(rest);
    }
}

/// Decodes `bytes` as a segment file; panics unless the result is a prefix of records that
/// re-encode to exactly the bytes they came from.
fn check_raw(bytes: &[u8]) -> Vec<Owned> {
    let mut r = Cursor::new(bytes);
    let path = Path::new("fuzz-segment");
    let header = match format::read_header(&mut r, path) {
        Ok(Ok(h)) => h,
        Ok(Err(_)) => return Vec::new(),
        Err(e) => panic!("a slice reader cannot fail: {e}"),
    };
    let mut records = Vec::new();
    let scan = format::scan_records(&mut r, &header, path, |lsn, op| {
        records.push(match op {
            LogOp::Insert { key, value } => (lsn, INSERT, key.to_vec(), value.to_vec()),
            LogOp::Remove { key } => (lsn, REMOVE, key.to_vec(), Vec::new()),
            LogOp::Batch { body } => {
                // Whatever the body holds, reading it ends without a panic.
                let writes = format::batch_writes(body).count();
                assert!(writes <= body.len(), "each write takes at least a byte");
                (lsn, BATCH, Vec::new(), body.to_vec())
            }
            LogOp::Merge { key, operands } => (lsn, MERGE, key.to_vec(), operands.to_vec()),
        });
        Ok(())
    })
    .unwrap_or_else(|e| panic!("a slice reader cannot fail: {e}"));
    let mut at = HEADER_SIZE as usize;
    let mut lsn = header.first_lsn;
    for (rec_lsn, kind, key, value) in &records {
        assert_eq!(*rec_lsn, lsn, "records are contiguous in LSN");
        let mut enc = Vec::new();
        let op = op_of(*kind, key, value);
        format::encode_record(&mut enc, lsn, &op);
        assert_eq!(
            &bytes[at..at + enc.len()],
            &enc[..],
            "record at {lsn} re-encodes"
        );
        at += enc.len();
        lsn += enc.len() as u64;
    }
    assert_eq!(scan.records, records.len() as u64);
    assert_eq!(
        scan.end_offset, at as u64,
        "end offset follows the last record"
    );
    assert_eq!(scan.end_lsn, lsn);
    assert!(scan.end_offset <= header.segment_size);
    records
}

/// Builds a valid segment from the input, damages it, and checks the decoded prefix.
fn check_model(input: &[u8]) {
    let mut it = input.iter().copied();
    let mut next = || it.next().unwrap_or(0);
    let first_lsn = u64::from(next()) << 40 | u64::from(next());
    let damage_kind = next() % 3;
    let damage_at = usize::from(next()) << 8 | usize::from(next());
    let flip = next() | 1;
    let count = usize::from(next() % 32);
    let mut records: Vec<Owned> = Vec::new();
    let mut seg = SegmentHeader {
        segment_size: 0,
        first_lsn,
    }
    .encode()
    .to_vec();
    let mut lsn = first_lsn;
    for i in 0..count {
        let b = next();
        let klen = usize::from(b & 0x1f);
        let vlen = usize::from(next() % 64);
        let kind = match (b >> 6, b & 0x20) {
            (0, _) | (1, 0) => INSERT,
            (1, _) => MERGE,
            (2, _) => REMOVE,
            _ => BATCH,
        };
        let key: Vec<u8> = (0..klen).map(|j| (i * 31 + j) as u8).collect();
        let value: Vec<u8> = match kind {
            INSERT | MERGE => (0..vlen).map(|j| (i * 7 + j * 3) as u8).collect(),
            REMOVE => Vec::new(),
            // A batch of a remove of `key` and an insert of a `vlen`-byte value.
            _ => {
                let v: Vec<u8> = (0..vlen).map(|j| (i * 5 + j) as u8).collect();
                let mut body = Vec::new();
                format::encode_batch_write(&mut body, &key, format::BatchValue::Remove);
                format::encode_batch_write(&mut body, &v, format::BatchValue::Put(&key));
                body
            }
        };
        let key = if kind == BATCH { Vec::new() } else { key };
        let before = seg.len();
        format::encode_record(&mut seg, lsn, &op_of(kind, &key, &value));
        records.push((lsn, kind, key.clone(), value.clone()));
        lsn += (seg.len() - before) as u64;
    }
    let garbage: Vec<u8> = it.collect();
    // Room for the records plus some zeros (preallocated space), at least the minimum size.
    let size = (seg.len() as u64 + 64).max(format::MIN_SEGMENT_SIZE);
    let header = SegmentHeader {
        segment_size: size,
        first_lsn,
    };
    seg[..HEADER_SIZE as usize].copy_from_slice(&header.encode());
    // Damage never touches the header: header damage is a different story (open refuses or
    // drops the segment), covered by raw mode.
    let span = seg.len() - HEADER_SIZE as usize + 1;
    let at = HEADER_SIZE as usize + damage_at % span;
    match damage_kind {
        0 => seg.truncate(at),
        1 if at < seg.len() => seg[at] ^= flip,
        1 => {}
        _ => {
            seg.truncate(at);
            seg.extend_from_slice(&garbage);
        }
    }
    let decoded = check_raw(&seg);
    let intact = records
        .iter()
        .filter(|(l, kind, k, v)| {
            let len = format::record_len(&op_of(*kind, k, v));
            HEADER_SIZE + (l - first_lsn) + len <= at as u64
        })
        .count();
    let intact = if damage_kind == 1 && at >= seg.len() {
        records.len()
    } else {
        intact
    };
    assert!(
        decoded.len() >= intact,
        "{} records before the damage, {} decoded",
        intact,
        decoded.len()
    );
    assert_eq!(
        &decoded[..intact],
        &records[..intact],
        "intact records unchanged"
    );
    if damage_kind == 1 {
        // One flipped byte never passes a crc32c: the decoder stops at the damaged record.
        assert_eq!(decoded.len(), intact, "a flipped byte ends the log");
    }
}
