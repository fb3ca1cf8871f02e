//! The search for records after damage, on log bytes built in memory: what proves damage
//! (records that verify after a flipped byte, a garbled range or a zeroed one) and what
//! never does (a torn record followed by zeros, preallocated zeros, stale records of other
//! positions, random bytes).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::verified_after;
use crate::wal::format::{encode_batch_write, encode_record, BatchValue};
use crate::wal::{LogOp, Lsn};

/// A log of `n` records from LSN `base`, then `zeros` zero bytes (preallocated space), and
/// where each record starts in it.
fn log(seed: u64, base: Lsn, n: usize, zeros: usize) -> (Vec<u8>, Vec<usize>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut bytes = Vec::new();
    let mut starts = Vec::new();
    for i in 0..n {
        starts.push(bytes.len());
        let lsn = base + bytes.len() as u64;
        let key = format!("key-{i:05}");
        let value: Vec<u8> = (0..rng.gen_range(0..120)).map(|_| rng.gen()).collect();
        let op = match i % 4 {
            0 => LogOp::Remove {
                key: key.as_bytes(),
            },
            1 => LogOp::Merge {
                key: key.as_bytes(),
                operands: &value,
            },
            _ => LogOp::Insert {
                key: key.as_bytes(),
                value: &value,
            },
        };
        encode_record(&mut bytes, lsn, &op);
    }
    bytes.resize(bytes.len() + zeros, 0);
    (bytes, starts)
}

#[test]
fn records_after_a_flipped_byte_prove_damage_wherever_it_lands() {
    let base = 7_000;
    let (pristine, starts) = log(1, base, 60, 4096);
    for victim in [0, 1, 30, 58] {
        let (at, next) = (starts[victim], starts[victim + 1]);
        // Every byte of the record: checksum, operation, lengths, key, value.
        for i in at..next {
            let mut bytes = pristine.clone();
            bytes[i] ^= 0x40;
            let lsn = base + at as u64;
            assert_eq!(
                verified_after(&bytes[at..], lsn),
                Some(next - at),
                "record {victim}, byte {}",
                i - at
            );
        }
    }
}

#[test]
fn a_garbled_or_zeroed_range_before_records_proves_damage() {
    let base = 1 << 20;
    let (pristine, starts) = log(2, base, 200, 4096);
    let (from, to) = (starts[50] + 3, starts[80] + 11);
    let after = starts[81];
    let mut rng = StdRng::seed_from_u64(3);
    let mut garbled = pristine.clone();
    garbled[from..to].iter_mut().for_each(|b| *b = rng.gen());
    let mut zeroed = pristine.clone();
    zeroed[from..to].fill(0);
    for bytes in [garbled, zeroed] {
        let at = starts[50];
        assert_eq!(
            verified_after(&bytes[at..], base + at as u64),
            Some(after - at)
        );
    }
    // Zeros from a record's start (where the scan stops as at the log's end), then records.
    let mut bytes = pristine.clone();
    bytes[starts[50]..starts[52]].fill(0);
    let at = starts[50];
    assert_eq!(
        verified_after(&bytes[at..], base + at as u64),
        Some(starts[52] - at)
    );
}

#[test]
fn one_record_then_zeros_proves_damage_and_one_damaged_last_record_does_not() {
    let (pristine, starts) = log(4, 0, 20, 8192);
    let mut bytes = pristine.clone();
    bytes[starts[18] + 6] ^= 1;
    let at = starts[18];
    assert_eq!(
        verified_after(&bytes[at..], at as u64),
        Some(starts[19] - at)
    );
    let mut bytes = pristine.clone();
    bytes[starts[19] + 6] ^= 1;
    let at = starts[19];
    assert_eq!(verified_after(&bytes[at..], at as u64), None);
}

#[test]
fn a_torn_record_followed_by_preallocated_zeros_proves_nothing() {
    let (pristine, starts) = log(5, 300, 40, 0);
    for cut in [starts[39] + 1, starts[39] + 9, pristine.len() - 1] {
        let mut bytes = pristine[..cut].to_vec();
        bytes.resize(bytes.len() + (256 << 10), 0);
        let at = starts[39];
        assert_eq!(verified_after(&bytes[at..], 300 + at as u64), None);
    }
    // Nothing but zeros (the scan stopped at the preallocated end).
    assert_eq!(verified_after(&vec![0u8; 1 << 16], 12_345), None);
    assert_eq!(verified_after(&[], 12_345), None);
}

#[test]
fn stale_records_of_other_positions_prove_nothing() {
    // A recycled file or ring lap: records at the right offsets but written for LSNs one
    // lap (or one byte) away. Each fails its checksum where it now lies.
    let lap = 1 << 16;
    for shift in [lap, 1, u64::MAX - lap] {
        let (stale, starts) = log(6, 5_000u64.wrapping_add(shift), 50, 4096);
        let mut bytes = stale.clone();
        bytes[starts[10] + 5] ^= 0x80;
        let at = starts[10];
        assert_eq!(verified_after(&bytes[at..], 5_000 + at as u64), None);
    }
}

#[test]
fn random_bytes_prove_nothing() {
    let mut rng = StdRng::seed_from_u64(7);
    for len in [100, 4096, 1 << 20] {
        let bytes: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        assert_eq!(verified_after(&bytes, rng.gen::<u32>().into()), None);
    }
    // Bytes made of plausible record heads everywhere (every byte an operation and a short
    // length): many candidates, each failing its checksum.
    let heads: Vec<u8> = (0..1 << 20).map(|i| [1u8, 3, 2, 4][i % 4]).collect();
    assert_eq!(verified_after(&heads, 0), None);
}

#[test]
fn a_batch_record_counts_only_if_its_writes_decode() {
    let mut body = Vec::new();
    encode_batch_write(&mut body, b"a", BatchValue::Put(b"1"));
    encode_batch_write(&mut body, b"b", BatchValue::Remove);
    let mut bytes = vec![0xEEu8; 16];
    let at = bytes.len();
    encode_record(&mut bytes, 100 + at as u64, &LogOp::Batch { body: &body });
    bytes.resize(bytes.len() + 64, 0);
    assert_eq!(verified_after(&bytes, 100), Some(at));
    // A body that does not decode, under a checksum that matches it: not a record a
    // writer wrote.
    let mut bad = vec![0xEEu8; 16];
    encode_record(
        &mut bad,
        100 + at as u64,
        &LogOp::Batch { body: &[9, 1, 1] },
    );
    bad.resize(bad.len() + 64, 0);
    assert_eq!(verified_after(&bad, 100), None);
}
