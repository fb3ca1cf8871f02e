//! Unit tests of what a node read from disk must pass: validation against damage, the
//! decoding check over built and mutated nodes, and records within the leaf's bounds.

use super::tests::buf;
use super::tests_merge::leaf;
use super::*;

#[test]
fn validation_rejects_damage() {
    let mut b = buf(256);
    let mut n = NodeMut::init(&mut b, NodeKind::Leaf, Some(b"a"), Some(b"z"));
    for k in [&b"b"[..], b"c", b"d"] {
        n.upsert(k, b"val", RecordKind::Insert).unwrap();
    }
    NodeRef::from_bytes_checked(&b).unwrap();
    let mutations: [(usize, u8); 9] = [
        (16, 9),             // size_log2
        (17, 0),             // kind
        (19, 2),             // format
        (20, 200),           // count
        (24, 0),             // data_used
        (26, 1),             // garbage
        (29, 1),             // reserved
        (32 + 16 + 7, 0x99), // look-ahead of record 0
        (32 + 16 + 5, 0x70), // record kind 7 of record 0
    ];
    for (at, v) in mutations {
        let mut c = b.clone();
        c[at] = v;
        assert!(
            NodeRef::from_bytes_checked(&c).is_err(),
            "mutation at {at} accepted"
        );
    }
    // Swapping two metas breaks the order.
    let mut c = b.clone();
    let (m0, m1) = (32 + 16, 32 + 24);
    let tmp: Vec<u8> = c[m0..m0 + 8].to_vec();
    c.copy_within(m1..m1 + 8, m0);
    c[m1..m1 + 8].copy_from_slice(&tmp);
    assert!(NodeRef::from_bytes_checked(&c).is_err());
    assert!(NodeRef::from_bytes_checked(&b[..255]).is_err());
    assert!(NodeRef::from_bytes_checked(&[]).is_err());
}

#[test]
fn decode_check_accepts_built_nodes() {
    let mut b = buf(4096);
    leaf(&mut b, 30);
    let mut data = vec![6u8]; // 64 << 6 = 4096
    data.extend_from_slice(&b);
    data.extend_from_slice(b"k05k17zzzzk");
    fuzz::decode_check(&data);
}

#[test]
fn decode_check_survives_mutated_nodes() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0x6e6f_6465);
    for _ in 0..3000 {
        let len = rng.gen_range(1..2000);
        let mut data: Vec<u8> = (0..len).map(|_| rng.gen::<u8>()).collect();
        data[0] |= 0x80;
        fuzz::decode_check(&data);
    }
}

#[test]
fn bounds_check_accepts_built_nodes_and_rejects_out_of_bounds_records() {
    let mut b = buf(4096);
    let mut n = NodeMut::init(&mut b, NodeKind::Leaf, Some(b"apple"), Some(b"apricot"));
    for k in [&b"apple"[..], b"applesauce", b"appliance"] {
        n.upsert(k, b"value", RecordKind::Insert).unwrap();
    }
    assert!(NodeRef::from_checksummed(&b).is_ok());
    // A record whose length runs past the end of the page: both depths refuse it.
    let meta_at = HEADER_SIZE + 2 * 8;
    let mut bad = b.clone();
    let m = u64::from_le_bytes(bad[meta_at..meta_at + 8].try_into().unwrap());
    let huge_value = m | (0x7fff << 29);
    bad[meta_at..meta_at + 8].copy_from_slice(&huge_value.to_le_bytes());
    assert!(NodeRef::from_checksummed(&bad).is_err());
    assert!(NodeRef::from_bytes_checked(&bad).is_err());
    // Records swapped out of order stay in bounds: only the full check notices.
    let mut swapped = b.clone();
    let (x, y) = (meta_at, meta_at + 8);
    let (first, second) = (swapped[x..x + 8].to_vec(), swapped[y..y + 8].to_vec());
    swapped[x..x + 8].copy_from_slice(&second);
    swapped[y..y + 8].copy_from_slice(&first);
    assert!(NodeRef::from_checksummed(&swapped).is_ok());
    assert!(NodeRef::from_bytes_checked(&swapped).is_err());
}

#[test]
fn keys_within_compares_the_first_and_last_keys_with_the_bounds() {
    let mut b = buf(4096);
    let mut node = NodeMut::init(&mut b, NodeKind::Leaf, Some(b"k10"), Some(b"k20"));
    for k in [&b"k10"[..], b"k15", b"k19"] {
        node.push_sorted(k, b"v", RecordKind::Insert).unwrap();
    }
    let n = node.as_ref();
    assert!(n.keys_within(Some(b"k10"), Some(b"k20")));
    assert!(n.keys_within(None, None));
    assert!(n.keys_within(Some(b"a"), Some(b"k19\0")));
    // The first key below the low bound, the last at or past the high one.
    assert!(!n.keys_within(Some(b"k11"), None));
    assert!(!n.keys_within(None, Some(b"k19")));
    // Bounds that do not share the node's prefix sort before or after every key.
    assert!(!n.keys_within(Some(b"m"), None));
    assert!(!n.keys_within(None, Some(b"a")));
    let mut e = buf(512);
    let empty = NodeMut::init(&mut e, NodeKind::Leaf, None, None);
    assert!(empty.as_ref().keys_within(Some(b"z"), Some(b"a\0")));
}
