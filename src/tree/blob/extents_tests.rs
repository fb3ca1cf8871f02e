//! Tests of `extents.rs`: value references, in-memory trees storing inline, which extents a
//! checkpoint frees, pins, and the extents recovery claims.

use super::*;

#[test]
fn references_round_trip_and_other_values_are_not_references() {
    let r = BlobRef {
        start: 7,
        len: 5 << 20,
        crc: 0xDEAD_BEEF,
    };
    assert_eq!(BlobRef::decode(&r.encode()), Some(r));
    assert_eq!(r.blocks(), (5 << 20) / BLOB_BLOCK);
    let mut other = r.encode();
    other[0] ^= 1;
    assert_eq!(BlobRef::decode(&other), None);
    assert_eq!(BlobRef::decode(&r.encode()[..REF_LEN - 1]), None);
    assert_eq!(BlobRef::decode(b""), None);
}

#[test]
fn in_memory_trees_store_everything_inline() {
    let b = Blobs::none();
    let r = BlobRef {
        start: 1,
        len: 1,
        crc: 0,
    };
    assert!(!b.must_store(&vec![0; 100_000], 10));
    assert_eq!(b.decode(&r.encode()), None);
    assert!(b.store(b"x", false).is_err());
}

#[test]
fn extents_are_freed_only_by_a_checkpoint_that_does_not_reference_them() {
    let dir = tempfile::tempdir().unwrap();
    let b = Blobs::open(&dir.path().join("blobs"), &[]).unwrap();
    let value = vec![7u8; 3 * BLOB_BLOCK as usize + 1];
    let kept = b.store(&value, true).unwrap();
    let dropped = b.store(&value, false).unwrap();
    let written_only = b.store(b"not applied", false).unwrap();
    assert_eq!(b.read(&kept).unwrap(), value);
    b.applied(kept.start);
    b.applied(dropped.start);
    let count = b.start_checkpoint();
    // Applied after the checkpoint took its LSN: kept although no page names it.
    let late = b.store(&value, false).unwrap();
    b.applied(late.start);
    let table = [TableEntry {
        page: 9,
        start: kept.start,
        blocks: kept.blocks(),
    }];
    b.checkpointed(count, &table);
    assert_eq!(b.usage().2, 3, "kept, written_only and late stay in use");
    // The freed extent is reused by the next value of its size.
    let again = b.store(&vec![8u8; value.len()], false).unwrap();
    assert_eq!(again.start, dropped.start);
    assert!(
        b.read(&dropped).is_err(),
        "a stale reference fails its checksum"
    );
    let _ = written_only;
}

#[test]
fn a_pin_keeps_freed_extents_from_reuse_until_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let b = Blobs::open(&dir.path().join("blobs"), &[]).unwrap();
    let value = vec![1u8; 10_000];
    let r = b.store(&value, false).unwrap();
    b.applied(r.start);
    let pin = b.pin();
    let count = b.start_checkpoint();
    b.checkpointed(count, &[]);
    let other = b.store(&value, false).unwrap();
    assert_ne!(other.start, r.start, "reused under a pin");
    assert_eq!(b.read(&r).unwrap(), value);
    drop(pin);
    let third = b.store(&value, false).unwrap();
    assert_eq!(third.start, r.start);
}

#[test]
fn recovery_claims_logged_extents_and_refuses_overlaps() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blobs");
    let table = [TableEntry {
        page: 3,
        start: 0,
        blocks: 4,
    }];
    // A blob file a checkpoint names extents of exists (an absent one is refused).
    std::fs::write(&path, []).unwrap();
    let b = Blobs::open(&path, &table).unwrap();
    let r = BlobRef {
        start: 10,
        len: 2 * BLOB_BLOCK,
        crc: 0,
    };
    b.claim(&r).unwrap();
    b.claim(&r).unwrap();
    let overlapping = BlobRef {
        start: 2,
        len: 1,
        crc: 0,
    };
    assert!(matches!(
        b.claim(&overlapping),
        Err(Error::Corruption { .. })
    ));
    // The gap between the two is free and handed out first.
    let s = b.store(&[5u8; 100], false).unwrap();
    assert!((4..10).contains(&s.start));
    assert_eq!(b.usage().2, 3);
}
