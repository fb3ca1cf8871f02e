//! Property tests of the node layout: random insert / overwrite / remove / compact / copy /
//! merge / split sequences against a `BTreeMap` model, for node sizes 64 B to 64 KiB.
//!
//! After every step the node must validate as untrusted bytes, hold exactly the model's
//! records in order, and account its bytes exactly (`used_bytes` = header + metas + fences +
//! live data; `used_bytes + free_space = size`). proptest prints the failing case and keeps
//! its seed in `tests_prop.proptest-regressions` for replay.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

/// Model: full key -> (value, kind, reference bit).
type Model = BTreeMap<Vec<u8>, (Vec<u8>, RecordKind, bool)>;

/// One step of a test sequence. Keys are given as suffixes after the test's prefix.
#[derive(Debug, Clone)]
enum Op {
    /// Upsert a key with a value of this length and kind.
    Put(Vec<u8>, usize, u8),
    /// Remove a key if present (else check it is absent).
    Del(Vec<u8>),
    /// Set the reference bit of the n-th record (modulo len).
    SetRef(usize, bool),
    /// Compact in place.
    Compact,
    /// `copy_filtered` into a node of `MIN_NODE << shift`, keeping kinds in the mask (or
    /// referenced records if the flag is set), then continue with the copy.
    Copy(u32, u8, bool, bool),
    /// `merge_from` a mini-page holding these records (suffix, value length, kind).
    Merge(Vec<(Vec<u8>, usize, u8)>),
    /// `split_records` + build, checked but not kept.
    Split,
}

/// Key suffixes from a tiny alphabet, so look-ahead ties and prefix-of relations are common.
fn suffix() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(prop::sample::select(vec![0u8, 1, b'a', b'b', 0xFF]), 0..6)
}

/// Value lengths: mostly small, sometimes up to a quarter of the node.
fn vlen(size: usize) -> impl Strategy<Value = usize> {
    prop_oneof![4 => 0..16usize, 1 => 0..=(size / 4).min(4000)]
}

/// A random op for a node of `size` bytes.
fn op(size: usize) -> impl Strategy<Value = Op> {
    let shifts = 0..=(MAX_NODE.trailing_zeros() - MIN_NODE.trailing_zeros());
    prop_oneof![
        8 => (suffix(), vlen(size), 0..5u8).prop_map(|(k, v, t)| Op::Put(k, v, t)),
        3 => suffix().prop_map(Op::Del),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(i, b)| Op::SetRef(i, b)),
        1 => Just(Op::Compact),
        1 => (shifts, any::<u8>(), any::<bool>(), any::<bool>()).prop_map(|(s, m, r, c)| Op::Copy(s, m, r, c)),
        1 => prop::collection::vec((suffix(), vlen(size), 0..5u8), 0..12).prop_map(Op::Merge),
        1 => Just(Op::Split),
    ]
}

/// Node size, prefix, fence mode, then ops.
fn scenario() -> impl Strategy<Value = (usize, Vec<u8>, bool, Vec<Op>)> {
    prop::sample::select(vec![64usize, 128, 256, 4096, 65536]).prop_flat_map(|size| {
        let prefix = prop_oneof![Just(Vec::new()), prop::collection::vec(b'p'..=b'q', 0..300)];
        (
            Just(size),
            prefix,
            any::<bool>(),
            prop::collection::vec(op(size), 1..200),
        )
    })
}

/// The record kind of a test code.
fn kind(t: u8) -> RecordKind {
    RecordKind::from_u8(t % 5).unwrap_or(RecordKind::Insert)
}

/// Checks the node against the model; `fixed` is header + fence metas + fence bytes.
fn check(node: NodeRef<'_>, model: &Model, fixed: usize) {
    if let Err(e) = NodeRef::from_bytes_checked(node.bytes()) {
        panic!("built node rejected: {e:?}");
    }
    assert_eq!(node.len(), model.len());
    let p = node.prefix_len();
    let mut key = Vec::new();
    let mut live = 0;
    for (i, (k, (v, t, r))) in model.iter().enumerate() {
        node.key_into(i, &mut key);
        assert_eq!(&key, k);
        assert_eq!(
            (node.value(i), node.record_kind(i), node.ref_bit(i)),
            (v.as_slice(), *t, *r)
        );
        live += 8 + k.len() - p + v.len();
    }
    assert_eq!(node.used_bytes(), fixed + live);
    assert_eq!(node.used_bytes() + node.free_space(), node.size());
    assert_eq!(
        node.dirty_count(),
        model.values().filter(|(_, t, _)| t.is_dirty()).count()
    );
}

/// Bytes a node with `fixed` overhead needs for these records.
fn needed(model: &Model, fixed: usize, p: usize) -> usize {
    fixed
        + model
            .iter()
            .map(|(k, (v, _, _))| 8 + k.len() - p + v.len())
            .sum::<usize>()
}

/// Runs one scenario.
fn run(size: usize, prefix: &[u8], finite: bool, ops: Vec<Op>) {
    let low = prefix.to_vec();
    let high = [prefix, &[0xFF; 7]].concat();
    let (low, high) = if finite {
        (Some(low.as_slice()), Some(high.as_slice()))
    } else {
        (None, None)
    };
    let mut buf = vec![0u8; size];
    let (fixed, p) = {
        let node = NodeMut::init(&mut buf, NodeKind::Leaf, low, high);
        (node.as_ref().used_bytes(), node.as_ref().prefix_len())
    };
    let full = |s: &[u8]| [prefix, s].concat();
    let mut model = Model::new();
    for op in ops {
        let mut node = NodeMut::from_bytes(&mut buf);
        let mut replacement = None;
        match op {
            Op::Put(s, len, t) => {
                let (key, value) = (full(&s), vec![len as u8; len]);
                let fits = node.as_ref().fits(&key, len);
                let before = node.as_ref().bytes().to_vec();
                let res = node.upsert(&key, &value, kind(t));
                assert_eq!(res.is_ok(), fits, "fits() disagrees with upsert");
                if let Ok(i) = res {
                    let refb = model.get(&key).is_some_and(|e| e.2);
                    model.insert(key.clone(), (value, kind(t), refb));
                    assert_eq!(model.keys().position(|k| *k == key), Some(i));
                } else {
                    assert_eq!(node.as_ref().bytes(), &before[..]);
                    let mut grown = model.clone();
                    grown.insert(key, (value, kind(t), false));
                    assert!(
                        needed(&grown, fixed, p) > node.as_ref().size(),
                        "refused a record that fits"
                    );
                }
            }
            Op::Del(s) => {
                let key = full(&s);
                match node.as_ref().search(&key) {
                    Search::Found(i) => {
                        assert!(model.remove(&key).is_some());
                        node.remove_at(i);
                    }
                    Search::NotFound(i) => {
                        assert!(!model.contains_key(&key));
                        assert_eq!(model.range(..key).count(), i);
                    }
                }
            }
            Op::SetRef(i, on) => {
                let n = model.len().max(1);
                if let Some((_, e)) = model.iter_mut().nth(i % n) {
                    e.2 = on;
                    node.set_ref_bit(i % node.as_ref().len(), on);
                }
            }
            Op::Compact => {
                node.compact();
                assert_eq!(node.as_ref().contiguous_free(), node.as_ref().free_space());
            }
            Op::Copy(shift, mask, keep_ref, clear) => {
                let keep = |t: RecordKind, r: bool| mask & (1 << t as u8) != 0 || (keep_ref && r);
                let kept: Model = model
                    .iter()
                    .filter(|(_, (_, t, r))| keep(*t, *r))
                    .map(|(k, (v, t, r))| (k.clone(), (v.clone(), *t, *r && !clear)))
                    .collect();
                let mut spare = vec![0u8; MIN_NODE << shift];
                let fits = needed(&kept, fixed, p) <= spare.len();
                let res = copy_filtered(node.as_ref(), &mut spare, keep, clear);
                assert_eq!(res.is_ok(), fits);
                if res.is_ok() {
                    replacement = Some(spare);
                    model = kept;
                }
            }
            Op::Merge(recs) => {
                let mut mb = vec![0u8; MAX_NODE];
                let mut mini = NodeMut::init(&mut mb, NodeKind::Mini, low, high);
                let mut mm = Model::new();
                for (s, len, t) in recs {
                    let key = full(&s);
                    mini.upsert(&key, &vec![len as u8 ^ 0x55; len], kind(t))
                        .unwrap();
                    mm.insert(key, (vec![len as u8 ^ 0x55; len], kind(t), false));
                }
                let mut expect = model.clone();
                for (k, (v, t, _)) in &mm {
                    match t {
                        RecordKind::Tombstone => {
                            expect.remove(k);
                        }
                        RecordKind::Insert | RecordKind::Upsert => {
                            let refb = expect.get(k).is_some_and(|e| e.2);
                            expect.insert(k.clone(), (v.clone(), RecordKind::Insert, refb));
                        }
                        RecordKind::Cache | RecordKind::Phantom => {}
                    }
                }
                // At this layer an Upsert's value stands for the new value.
                let mut fold = |_: &[u8], _: Option<&[u8]>, v: &[u8]| Ok::<_, ()>(Some(v.to_vec()));
                let sorted = merge_sorted(node.as_ref(), mini.as_ref(), &mut fold).unwrap();
                let upserts = mm.values().any(|e| e.1 == RecordKind::Upsert);
                let want: Vec<Record> = expect
                    .iter()
                    .filter(|(_, (_, t, _))| t.exists())
                    .map(|(k, (v, _, _))| Record {
                        key: k.as_slice().into(),
                        value: v.as_slice().into(),
                        kind: RecordKind::Insert,
                    })
                    .collect();
                assert_eq!(sorted, want);
                let before = node.as_ref().bytes().to_vec();
                if let Ok(()) = node.merge_from(mini.as_ref()) {
                    model = expect;
                } else {
                    assert_eq!(node.as_ref().bytes(), &before[..]);
                    assert!(
                        upserts || needed(&expect, fixed, p) > node.as_ref().size(),
                        "merge refused though it fits"
                    );
                }
            }
            Op::Split => split_and_check(node.as_ref(), &model, low, high),
        }
        if let Some(b) = replacement {
            buf = b;
        }
        check(NodeRef::from_bytes(&buf), &model, fixed);
    }
}

/// Splits the node's records for nodes of its size (one group expected when the node has
/// the prefix its bounds give at that size) and of half its size, and checks every group.
fn split_and_check(node: NodeRef<'_>, model: &Model, low: Option<&[u8]>, high: Option<&[u8]>) {
    let records: Vec<Record> = model
        .iter()
        .map(|(k, (v, t, _))| Record {
            key: k.as_slice().into(),
            value: v.as_slice().into(),
            kind: *t,
        })
        .collect();
    let natural = super::layout::effective_prefix(low, high, node.size()) == node.prefix_len();
    if natural && !records.is_empty() {
        let groups = split_records(&records, node.size(), NodeKind::Leaf, low, high);
        assert_eq!(groups.len(), 1, "content of one node split in several");
    }
    split_into(&records, node.size(), low, high);
    split_into(&records, node.size() / 2, low, high);
}

/// Splits `records` for nodes of `size` bytes, builds and validates every group, and returns
/// the number of groups. The split is only guaranteed for sizes from 128 B and records within
/// the limits of that size (key <= size/4, key + value <= size/2); otherwise returns `None`.
fn split_into(
    records: &[Record],
    size: usize,
    low: Option<&[u8]>,
    high: Option<&[u8]>,
) -> Option<usize> {
    if size < 128
        || records
            .iter()
            .any(|r| r.key.len() > size / 4 || r.key.len() + r.value.len() > size / 2)
    {
        return None;
    }
    let groups = split_records(records, size, NodeKind::Leaf, low, high);
    let mut seen = 0;
    for (g, (range, glow)) in groups.iter().enumerate() {
        assert_eq!(range.start, seen);
        assert!(!range.is_empty() || records.is_empty());
        seen = range.end;
        let ghigh = groups.get(g + 1).map_or(high, |n| n.1.as_deref());
        let mut b = vec![0u8; size];
        let built = build(
            &mut b,
            NodeKind::Leaf,
            glow.as_deref(),
            ghigh,
            &records[range.clone()],
        );
        assert!(built.is_ok(), "group {g} of {} does not fit", groups.len());
        let r = NodeRef::from_bytes_checked(&b).expect("split group must validate");
        assert_eq!(r.len(), range.len());
    }
    assert_eq!(seen, records.len());
    Some(groups.len())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn node_ops_match_a_btreemap((size, prefix, finite, ops) in scenario()) {
        run(size, &prefix, finite, ops);
    }
}
