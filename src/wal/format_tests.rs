//! Tests of `format.rs`: records of every kind round-trip (lengths on every varint boundary),
//! the size limits are the largest records that fit, and a record with a wrong checksum or
//! malformed lengths ends the log.

use super::*;

/// A segment holding `ops` from LSN `first`, in a file of `size` bytes (zeros after).
fn segment(first: Lsn, ops: &[LogOp<'_>], size: u64) -> (SegmentHeader, Vec<u8>) {
    let header = SegmentHeader {
        segment_size: size,
        first_lsn: first,
    };
    let mut bytes = header.encode().to_vec();
    let mut lsn = first;
    for op in ops {
        let before = bytes.len();
        encode_record(&mut bytes, lsn, op);
        assert_eq!(
            (bytes.len() - before) as u64,
            record_len(op),
            "record_len is exact"
        );
        lsn += record_len(op);
    }
    bytes.resize(size as usize, 0);
    (header, bytes)
}

/// A decoded record: its LSN, key, and value (`None`: a removal).
type Seen = (Lsn, Vec<u8>, Option<Vec<u8>>);

fn read_all(header: &SegmentHeader, bytes: &[u8]) -> (Scan, Vec<Seen>) {
    let mut r = &bytes[HEADER_SIZE as usize..];
    let mut seen = Vec::new();
    let scan = scan_records(&mut r, header, Path::new("seg"), |lsn, op| {
        seen.push(match op {
            LogOp::Insert { key, value } => (lsn, key.to_vec(), Some(value.to_vec())),
            LogOp::Remove { key } => (lsn, key.to_vec(), None),
            // A batch's body stands in for its key (only the batch test writes them).
            LogOp::Batch { body } => (lsn, body.to_vec(), Some(b"batch".to_vec())),
            LogOp::Merge { key, operands } => {
                (lsn, [b"merge:", key].concat(), Some(operands.to_vec()))
            }
        });
        Ok(())
    })
    .expect("a slice cannot fail to read");
    (scan, seen)
}

#[test]
fn lengths_on_every_varint_boundary_round_trip() {
    let lens = [0usize, 1, 127, 128, 16_383, 16_384, 70_000];
    let keys: Vec<Vec<u8>> = lens.iter().map(|&n| vec![7u8; n]).collect();
    let values: Vec<Vec<u8>> = lens.iter().map(|&n| vec![9u8; n]).collect();
    let mut ops = Vec::new();
    for k in &keys {
        ops.push(LogOp::Remove { key: k });
        for v in &values {
            ops.push(LogOp::Insert { key: k, value: v });
        }
    }
    let total: u64 = ops.iter().map(record_len).sum();
    let (header, bytes) = segment(1000, &ops, HEADER_SIZE + total + 100);
    let (scan, seen) = read_all(&header, &bytes);
    assert_eq!(scan.tail, Tail::Clean);
    assert_eq!(scan.end_lsn, 1000 + total);
    assert_eq!(seen.len(), ops.len());
    for (op, (_, key, value)) in ops.iter().zip(&seen) {
        match op {
            LogOp::Insert { key: k, value: v } => {
                assert_eq!((key.as_slice(), value.as_deref()), (*k, Some(*v)));
            }
            LogOp::Remove { key: k } => assert_eq!((key.as_slice(), value), (*k, &None)),
            LogOp::Batch { .. } | LogOp::Merge { .. } => panic!("only inserts and removes"),
        }
    }
}

#[test]
fn a_merge_record_round_trips() {
    let op = LogOp::Merge {
        key: b"counter",
        operands: &[1, 7],
    };
    let (header, bytes) = segment(5, &[op], 4096);
    let (scan, seen) = read_all(&header, &bytes);
    assert_eq!(scan.tail, Tail::Clean);
    assert_eq!(scan.end_lsn, 5 + record_len(&op));
    assert_eq!(seen, vec![(5, b"merge:counter".to_vec(), Some(vec![1, 7]))]);
}

#[test]
fn a_batch_record_holds_its_writes_whole() {
    let mut body = Vec::new();
    let writes: [(&[u8], BatchValue<'_>); 5] = [
        (b"a", BatchValue::Put(b"1")),
        (b"", BatchValue::Remove),
        (&[9; 200], BatchValue::Put(&[8; 300])),
        (b"m", BatchValue::Merge(&[1, 2])),
        (b"z", BatchValue::Put(b"")),
    ];
    for (k, v) in writes {
        encode_batch_write(&mut body, k, v);
    }
    let expected_len: u64 = writes
        .iter()
        .map(|(k, v)| {
            let n = match v {
                BatchValue::Put(v) | BatchValue::Merge(v) => v.len(),
                BatchValue::Remove => 0,
            };
            batch_write_len(k.len(), n)
        })
        .sum();
    assert_eq!(body.len() as u64, expected_len);
    let decoded: Vec<_> = batch_writes(&body).collect::<Result<_, _>>().unwrap();
    assert_eq!(decoded, writes);
    let op = LogOp::Batch { body: &body };
    let (header, bytes) = segment(77, &[op], 4096);
    let (scan, seen) = read_all(&header, &bytes);
    assert_eq!((scan.tail, seen.len()), (Tail::Clean, 1));
    assert_eq!(seen[0].1, body);
    // Cut anywhere, the record is gone whole: no write of it is read.
    for cut in 1..record_len(&op) as usize {
        let mut torn = bytes.clone();
        torn.truncate(HEADER_SIZE as usize + cut);
        assert!(read_all(&header, &torn).1.is_empty(), "cut at {cut}");
    }
    // A body that does not decode says so instead of inventing writes.
    let mut bad = body.clone();
    bad[0] = 7;
    assert!(batch_writes(&bad).next().unwrap().is_err());
    assert!(batch_writes(&body[..body.len() - 1]).any(|w| w.is_err()));
}

#[test]
fn a_small_record_takes_seven_bytes_besides_its_data() {
    let op = LogOp::Insert {
        key: &[1; 16],
        value: &[2; 16],
    };
    assert_eq!(record_len(&op), 39);
    assert_eq!(record_len(&LogOp::Remove { key: &[1; 16] }), 23);
}

#[test]
fn size_limits_are_the_largest_records_that_fit() {
    // Rooms around the points where a length's encoding grows a byte.
    for room in (0..200).chain(16_370..16_420) {
        for key_len in [0u64, 1, 120, 130] {
            let fits =
                |k: u64, v: u64| RECORD_FIXED + varint_len(k) + varint_len(v) + k + v <= room;
            match max_value_len(room, key_len) {
                Some(v) => assert!(
                    fits(key_len, v) && !fits(key_len, v + 1),
                    "{room} {key_len}"
                ),
                None => assert!(!fits(key_len, 0), "{room} {key_len}"),
            }
        }
        let k = max_key_len(room);
        if room >= RECORD_FIXED + 2 {
            assert!(RECORD_FIXED + varint_len(k) + 1 + k <= room, "{room}");
        }
        assert!(
            RECORD_FIXED + varint_len(k + 1) + 1 + k + 1 > room,
            "{room}"
        );
    }
}

#[test]
fn a_record_read_at_another_lsn_fails_its_checksum() {
    let ops = [LogOp::Insert {
        key: b"key",
        value: b"value",
    }];
    let (_, bytes) = segment(500, &ops, 4096);
    // The same bytes, in a segment that claims to start one LSN later.
    let moved = SegmentHeader {
        segment_size: 4096,
        first_lsn: 501,
    };
    let (scan, seen) = read_all(&moved, &bytes);
    assert!(seen.is_empty());
    assert_eq!(scan.tail, Tail::Torn("record checksum mismatch"));
}

#[test]
fn malformed_lengths_end_the_log() {
    let header = SegmentHeader {
        segment_size: 4096,
        first_lsn: 0,
    };
    let mut bytes = header.encode().to_vec();
    // Checksum, insert, then a key length whose every byte says "more follows".
    bytes.extend_from_slice(&[1, 2, 3, 4, OP_INSERT]);
    bytes.extend_from_slice(&[0xff; 12]);
    bytes.resize(4096, 0);
    let (scan, seen) = read_all(&header, &bytes);
    assert!(seen.is_empty());
    assert_eq!(scan.tail, Tail::Torn("record lengths malformed"));
    // A length longer than the rest of the segment.
    let mut bytes = header.encode().to_vec();
    bytes.extend_from_slice(&[1, 2, 3, 4, OP_INSERT, 0xff, 0xff, 0x03, 0]);
    bytes.resize(4096, 0);
    assert_eq!(
        read_all(&header, &bytes).0.tail,
        Tail::Torn("record length out of range")
    );
    // A length that does not fit in a u32.
    let mut bytes = header.encode().to_vec();
    bytes.extend_from_slice(&[1, 2, 3, 4, OP_INSERT, 0xff, 0xff, 0xff, 0xff, 0x7f, 0]);
    bytes.resize(4096, 0);
    assert_eq!(
        read_all(&header, &bytes).0.tail,
        Tail::Torn("record lengths malformed")
    );
}
