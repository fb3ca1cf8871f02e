//! Tests of `store.rs`: scans against batches, snapshots against every write, the checks a
//! transaction's commit makes, and readers made too old when saved values outgrow the limit.

use super::*;
use crate::tree::versions::Undo;

fn kv(k: &str, v: &str) -> KeyValue {
    (k.as_bytes().to_vec(), v.as_bytes().to_vec())
}

fn undo(pairs: &[(&str, Option<&str>)]) -> Undo {
    pairs
        .iter()
        .map(|(k, v)| (k.as_bytes().to_vec(), v.map(|v| v.as_bytes().to_vec())))
        .collect()
}

fn rewound(v: &Versions, scan: ScanStart, items: &[KeyValue]) -> Result<Vec<KeyValue>> {
    let mut items = items.to_vec();
    v.rewind(scan, &mut items, &Bound::Unbounded, &Bound::Unbounded)?;
    Ok(items)
}

const PLENTY: usize = 1 << 30;

#[test]
fn a_scan_sees_batches_from_before_its_start_and_not_after() {
    let r = Versions::new(PLENTY);
    let before = r.ticket();
    assert!(!before.save_undo(), "no scan: nothing to save");
    let scan = r.begin_scan();
    let after = r.ticket();
    assert!(after.save_undo());
    // The batch after the scan's start changed b, added c, removed d.
    r.publish(
        &after,
        undo(&[("b", Some("b0")), ("c", None), ("d", Some("d0"))]),
        None,
    );
    let items = [kv("a", "a1"), kv("b", "b1"), kv("c", "c1"), kv("e", "e1")];
    assert_eq!(
        rewound(&r, scan, &items).unwrap(),
        vec![kv("a", "a1"), kv("b", "b0"), kv("d", "d0"), kv("e", "e1")]
    );
    // A scan that starts now sees the batch.
    let later = r.begin_scan();
    assert_eq!(
        rewound(&r, later, &[kv("b", "b1")]).unwrap(),
        vec![kv("b", "b1")]
    );
    r.end_scan(scan);
    assert_eq!(r.saved(), 0, "the remaining scan does not need it");
    r.end_scan(later);
}

#[test]
fn scans_past_the_slots_register_under_the_lock() {
    let r = Versions::new(PLENTY);
    let scans: Vec<ScanStart> = (0..SLOTS + 6).map(|_| r.begin_scan()).collect();
    assert_eq!(scans.iter().filter(|s| s.place == Place::Locked).count(), 6);
    let t = r.ticket();
    assert!(t.save_undo());
    r.publish(&t, undo(&[("k", None)]), None);
    // Ending all but one overflowed scan keeps the undo it needs.
    let (last, rest) = scans.split_last().unwrap();
    assert_eq!(last.place, Place::Locked);
    for s in rest {
        r.end_scan(*s);
    }
    assert_eq!(r.saved(), 1);
    assert!(rewound(&r, *last, &[kv("k", "v")]).unwrap().is_empty());
    r.end_scan(*last);
    assert_eq!(r.saved(), 0);
    assert!(!r.ticket().save_undo(), "no scan left");
}

#[test]
fn the_earliest_later_batch_gives_the_old_value() {
    let r = Versions::new(PLENTY);
    let scan = r.begin_scan();
    let first = r.ticket();
    let second = r.ticket();
    // Published in the other order.
    r.publish(&second, undo(&[("k", Some("v1"))]), None);
    r.publish(&first, undo(&[("k", Some("v0"))]), None);
    assert_eq!(
        rewound(&r, scan, &[kv("k", "v2")]).unwrap(),
        vec![kv("k", "v0")]
    );
    r.end_scan(scan);
    assert_eq!(r.saved(), 0);
}

#[test]
fn a_snapshot_turns_versioning_on_and_sees_its_moment() {
    let r = Versions::new(PLENTY);
    assert!(!r.versioning());
    let snap = r.register();
    assert!(r.versioning());
    let s1 = r
        .record(undo(&[("k", Some("v0"))]), None, |_| Ok(()))
        .unwrap();
    assert!(s1 > snap.seq());
    let later = r.register();
    r.record(undo(&[("k", Some("v1"))]), None, |_| Ok(()))
        .unwrap();
    let old = |s, k: &[u8]| {
        r.before(s, k)
            .unwrap()
            .map(|o| o.map(|b| String::from_utf8(b.to_vec()).unwrap()))
    };
    assert_eq!(old(snap, b"k"), Some(Some("v0".into())));
    assert_eq!(old(later, b"k"), Some(Some("v1".into())));
    assert_eq!(
        old(snap, b"other"),
        None,
        "untouched: the tree's value is the snapshot's"
    );
    r.release(snap);
    assert_eq!(
        r.saved(),
        1,
        "the later snapshot needs the second write only"
    );
    r.release(later);
    assert_eq!(r.saved(), 0);
    assert!(!r.versioning());
}

#[test]
fn a_commit_check_sees_every_write_numbered_before_it_and_stops_the_write() {
    let r = Versions::new(PLENTY);
    let tx = r.register();
    r.record(undo(&[("b", Some("0"))]), None, |_| Ok(()))
        .unwrap();
    let saved = r.saved();
    let e = r
        .record(undo(&[("a", None)]), None, |w| {
            assert!(w.key_since(b"b", tx.seq()) && !w.key_since(b"a", tx.seq()));
            assert_eq!(
                w.in_range_since(Bound::Included(b"a"), Bound::Unbounded, tx.seq()),
                Some(&b"b"[..])
            );
            assert_eq!(
                w.in_range_since(Bound::Included(b"c"), Bound::Unbounded, tx.seq()),
                None
            );
            Err(Error::InvalidInput { reason: "refused" })
        })
        .unwrap_err();
    assert!(matches!(e, Error::InvalidInput { .. }));
    assert_eq!(r.saved(), saved, "a refused write saves nothing");
    r.release(tx);
}

#[test]
fn outgrowing_the_limit_makes_the_oldest_reader_too_old_and_only_it() {
    let r = Versions::new(4096);
    let old = r.register();
    r.record(undo(&[("k", Some("v"))]), None, |_| Ok(()))
        .unwrap();
    let young = r.register();
    let scan = r.begin_scan();
    let big = "x".repeat(3000);
    r.record(undo(&[("k", Some(&big))]), None, |_| Ok(()))
        .unwrap();
    r.record(undo(&[("k", Some(&big))]), None, |_| Ok(()))
        .unwrap();
    assert!(matches!(
        r.before(old, b"k"),
        Err(Error::SnapshotTooOld { limit: 4096 })
    ));
    assert!(matches!(
        rewound(&r, old, &[]),
        Err(Error::SnapshotTooOld { .. })
    ));
    assert!(r.stats().too_old >= 1);
    assert!(r.stats().bytes <= 4096 || r.before(young, b"k").is_err());
    // Readers that started after the write they need still answer, until they too are
    // the oldest past the limit.
    let newest = r.register();
    assert_eq!(r.before(newest, b"k").unwrap(), None);
    r.end_scan(scan);
    r.release(old);
    r.release(young);
    r.release(newest);
    assert_eq!(r.saved(), 0);
    assert_eq!(r.stats().open, 0);
}
