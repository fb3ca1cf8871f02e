//! Whole-node operations: copying, merging a mini-page into its leaf's records, splitting
//! sorted records into nodes, and building nodes from sorted records.

use std::cmp::Ordering;
use std::ops::Range;

use super::layout::{common_prefix_len, effective_prefix, stored_fences, FIXED_COST, META_SIZE};
use super::{NoSpace, NodeKind, NodeMut, NodeRef, RecordKind};

/// Owned key or value bytes of a [`Record`]: inline up to 24 bytes, so the records a split
/// or merge materializes (a whole page of them) cost no allocation each when small (profile
/// of 2-thread in-memory inserts: ~29 % of samples in the allocator, mostly for these).
pub(crate) type Bytes = smallvec::SmallVec<[u8; 24]>;

/// One record, owned, with its full key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    /// The full key (prefix included).
    pub key: Bytes,
    /// The value.
    pub value: Bytes,
    /// The record kind.
    pub kind: RecordKind,
}

/// Copies `src` into the (possibly differently sized) `dst`, compacting; keeps the records
/// for which `keep(kind, ref_bit)` is true and clears reference bits if `clear_refs`. The
/// copy keeps `src`'s fences, prefix, kind, disk page and flags. Used to grow and shrink
/// mini-pages and to copy one on access.
///
/// # Errors
/// [`NoSpace`] if the kept records and the fences do not fit `dst` (or `dst.len()` is not
/// a valid node size); `dst` is then unchanged.
pub(crate) fn copy_filtered(
    src: NodeRef<'_>,
    dst: &mut [u8],
    keep: impl Fn(RecordKind, bool) -> bool,
    clear_refs: bool,
) -> Result<(), NoSpace> {
    copy_into(src, dst, &keep, clear_refs, false)
}

/// Bytes a node needs to hold `src`'s fences and the records `keep(kind, ref_bit)` selects.
pub(crate) fn filtered_len(src: NodeRef<'_>, keep: impl Fn(RecordKind, bool) -> bool) -> usize {
    let (low, high) = (src.low_fence_stored(), src.high_fence_stored());
    let mut need = FIXED_COST + low.map_or(0, <[u8]>::len) + high.map_or(0, <[u8]>::len);
    for i in 0..src.len() {
        if keep(src.record_kind(i), src.ref_bit(i)) {
            need += META_SIZE + src.key_suffix(i).len() + src.value(i).len();
        }
    }
    need
}

/// Copies the referenced records of `mirror`, a clean full-page mirror, into `dst` as a
/// mini-page of cached answers (reference bits cleared), keeping its fences, prefix and disk
/// page: the leaf's hot records stay in memory for the bytes they need, not a whole page.
///
/// # Errors
/// As [`copy_filtered`].
pub(crate) fn mini_from_mirror(mirror: NodeRef<'_>, dst: &mut [u8]) -> Result<(), NoSpace> {
    debug_assert_eq!(mirror.kind(), NodeKind::Leaf);
    copy_into(mirror, dst, &|_, referenced| referenced, true, true)
}

/// [`copy_filtered`], optionally turning the copy into a mini-page whose records are cache
/// records (`as_cache`).
fn copy_into(
    src: NodeRef<'_>,
    dst: &mut [u8],
    keep: &dyn Fn(RecordKind, bool) -> bool,
    clear_refs: bool,
    as_cache: bool,
) -> Result<(), NoSpace> {
    if !super::valid_size(dst.len()) {
        debug_assert!(false, "copy_filtered into a buffer of {} bytes", dst.len());
        return Err(NoSpace);
    }
    if filtered_len(src, keep) > dst.len() {
        return Err(NoSpace);
    }
    let (low, high) = (src.low_fence_stored(), src.high_fence_stored());
    let kind = if as_cache { NodeKind::Mini } else { src.kind() };
    let mut node = NodeMut::from_bytes(dst);
    if !node.format(kind, src.prefix_len(), low, high) {
        debug_assert!(
            false,
            "fences of a valid node do not fit although the total does"
        );
        return Err(NoSpace);
    }
    node.set_disk_page(src.disk_page());
    node.set_flags(src.flags());
    for i in 0..src.len() {
        let (kind, refb) = (src.record_kind(i), src.ref_bit(i));
        if keep(kind, refb) {
            let kind = if as_cache && kind.exists() {
                RecordKind::Cache
            } else {
                kind
            };
            node.push_suffix(src.key_suffix(i), src.value(i), kind, refb && !clear_refs)?;
        }
    }
    Ok(())
}

/// Folds a key's pending merge operands (an Upsert record's value) over its value below:
/// `(key, value below, operands) -> new value` (`None`: absent), or an error.
pub(crate) type Fold<'f, E> =
    dyn FnMut(&[u8], Option<&[u8]>, &[u8]) -> Result<Option<Vec<u8>>, E> + 'f;

/// All records of `leaf` with the dirty records of `mini` applied (newest wins, tombstones
/// delete, cache and phantom records dropped), sorted, as Insert records. An Upsert record's
/// value goes to `fold` with the key and the leaf's value (if any): it returns the key's new
/// value (`None`: absent) or an error, which this returns. Leaf records of a non-existing
/// kind (tombstone, phantom: not expected in a leaf) are dropped too.
pub(crate) fn merge_sorted<E>(
    leaf: NodeRef<'_>,
    mini: NodeRef<'_>,
    fold: &mut Fold<'_, E>,
) -> Result<Vec<Record>, E> {
    let mut out = Vec::with_capacity(leaf.len() + mini.len());
    let (mut i, mut j) = (0, 0);
    let (mut lk, mut mk) = (Vec::new(), Vec::new());
    if i < leaf.len() {
        leaf.key_into(i, &mut lk);
    }
    if j < mini.len() {
        mini.key_into(j, &mut mk);
    }
    let insert = |key: &[u8], value: &[u8]| Record {
        key: Bytes::from_slice(key),
        value: Bytes::from_slice(value),
        kind: RecordKind::Insert,
    };
    while i < leaf.len() || j < mini.len() {
        let ord = match (i < leaf.len(), j < mini.len()) {
            (true, false) => Ordering::Less,
            (false, true) => Ordering::Greater,
            _ => lk.cmp(&mk),
        };
        let (take_leaf, take_mini) = (ord != Ordering::Greater, ord != Ordering::Less);
        let mini_kind = take_mini.then(|| mini.record_kind(j));
        match mini_kind {
            Some(RecordKind::Insert) => out.push(insert(&mk, mini.value(j))),
            Some(RecordKind::Upsert) => {
                let base = (take_leaf && leaf.record_kind(i).exists()).then(|| leaf.value(i));
                if let Some(v) = fold(&mk, base, mini.value(j))? {
                    out.push(insert(&mk, &v));
                }
            }
            Some(RecordKind::Tombstone) => {}
            Some(RecordKind::Cache | RecordKind::Phantom) | None => {
                if take_leaf && leaf.record_kind(i).exists() {
                    out.push(insert(&lk, leaf.value(i)));
                }
            }
        }
        if take_leaf {
            i += 1;
            if i < leaf.len() {
                leaf.key_into(i, &mut lk);
            }
        }
        if take_mini {
            j += 1;
            if j < mini.len() {
                mini.key_into(j, &mut mk);
            }
        }
    }
    Ok(out)
}

/// Shortest separator `s` with `a < s <= b` (requires `a < b`): the shortest prefix of `b`
/// that is greater than `a`.
#[allow(dead_code)] // used by unit tests and the internals harness
pub(crate) fn shortest_separator(a: &[u8], b: &[u8]) -> Vec<u8> {
    debug_assert!(a < b, "shortest_separator needs a < b");
    let c = common_prefix_len(a, b);
    b[..(c + 1).min(b.len())].to_vec()
}

/// Builds a node of `buf.len()` bytes from sorted records with unique keys.
///
/// # Errors
/// [`NoSpace`] if the records do not fit (`buf` then holds a partial node).
pub(crate) fn build(
    buf: &mut [u8],
    kind: NodeKind,
    low: Option<&[u8]>,
    high: Option<&[u8]>,
    records: &[Record],
) -> Result<(), NoSpace> {
    let mut node = NodeMut::init(buf, kind, low, high);
    for r in records {
        node.push_sorted(&r.key, &r.value, r.kind)?;
    }
    Ok(())
}

/// Bytes a node of at most `max_size` bytes needs to hold sorted `records` between the
/// bounds `low` and `high`: what [`build`] fills, with the prefix such a node takes. A
/// smaller node may keep a shorter prefix only when it is smaller than four times the
/// longest key (`layout::max_prefix_len`), so the caller still checks the build.
pub(crate) fn built_len(
    records: &[Record],
    max_size: usize,
    low: Option<&[u8]>,
    high: Option<&[u8]>,
) -> usize {
    let p = effective_prefix(low, high, max_size);
    let (l, h) = stored_fences(low, high, p);
    let fences = l.map_or(0, <[u8]>::len) + h.map_or(0, <[u8]>::len);
    let bytes: usize = records
        .iter()
        .map(|r| META_SIZE + r.key.len().saturating_sub(p) + r.value.len())
        .sum();
    FIXED_COST + fences + bytes
}

/// Splits sorted records into consecutive groups that each fit a node of `node_size` bytes,
/// balanced by bytes, within the outer bounds `low`/`high`. Returns each group's index range
/// and low bound (the first group's is `low`). Between leaf groups the separator is the
/// shortest key `s` with `left_max < s <= right_min`; between inner groups it is the right
/// group's exact first key (which that group's first record keeps). Each group's cost counts
/// its own prefix compression (the common prefix of its bounds). Always succeeds when every
/// record obeys the size limits; with no records it returns one empty group.
pub(crate) fn split_records(
    records: &[Record],
    node_size: usize,
    kind: NodeKind,
    low: Option<&[u8]>,
    high: Option<&[u8]>,
) -> Vec<(Range<usize>, Option<Vec<u8>>)> {
    cut(records, node_size, kind, low, high, false)
}

/// As [`split_records`], with every group but the last as full as it can be: for a leaf
/// whose new records were all appended past its end (ascending inserts), where the left
/// part will not grow again and a balanced cut would leave it half empty for good.
pub(crate) fn split_records_packed(
    records: &[Record],
    node_size: usize,
    kind: NodeKind,
    low: Option<&[u8]>,
    high: Option<&[u8]>,
) -> Vec<(Range<usize>, Option<Vec<u8>>)> {
    cut(records, node_size, kind, low, high, true)
}

/// [`split_records`] (`packed`: [`split_records_packed`]).
fn cut(
    records: &[Record],
    node_size: usize,
    kind: NodeKind,
    low: Option<&[u8]>,
    high: Option<&[u8]>,
    packed: bool,
) -> Vec<(Range<usize>, Option<Vec<u8>>)> {
    let n = records.len();
    if n == 0 {
        return vec![(0..0, low.map(<[u8]>::to_vec))];
    }
    let mut cum = Vec::with_capacity(n + 1);
    cum.push(0);
    for r in records {
        cum.push(cum[cum.len() - 1] + META_SIZE + r.key.len() + r.value.len());
    }
    let plan = Planner {
        records,
        cum,
        size: node_size,
        inner: kind == NodeKind::Inner,
        low,
        high,
    };
    let greedy = plan.greedy();
    let k = greedy.len() - 1;
    let bounds = if packed {
        greedy
    } else {
        plan.balanced(k)
            .or_else(|| plan.balanced(k + 1))
            .unwrap_or(greedy)
    };
    bounds
        .windows(2)
        .map(|w| (w[0]..w[1], plan.low_of(w[0]).map(<[u8]>::to_vec)))
        .collect()
}

/// Cost model and cut search for [`split_records`].
struct Planner<'r> {
    /// The sorted records.
    records: &'r [Record],
    /// `cum[i]`: bytes (meta + full key + value) of records `0..i`.
    cum: Vec<usize>,
    /// Node size.
    size: usize,
    /// Inner nodes separate by exact keys.
    inner: bool,
    /// Outer low bound.
    low: Option<&'r [u8]>,
    /// Outer high bound.
    high: Option<&'r [u8]>,
}

impl<'r> Planner<'r> {
    /// Length of the separator before record `e` (a prefix of its key), `0 < e < n`.
    fn sep_len(&self, e: usize) -> usize {
        let right = &self.records[e].key;
        if self.inner {
            return right.len();
        }
        (common_prefix_len(&self.records[e - 1].key, right) + 1).min(right.len())
    }

    /// Low bound of a group starting at `s`.
    fn low_of(&self, s: usize) -> Option<&'r [u8]> {
        if s == 0 {
            return self.low;
        }
        let key: &'r [u8] = &self.records[s].key;
        Some(&key[..self.sep_len(s)])
    }

    /// High bound of a group ending at `e` (exclusive).
    fn high_of(&self, e: usize) -> Option<&'r [u8]> {
        if e == self.records.len() {
            return self.high;
        }
        let key: &'r [u8] = &self.records[e].key;
        Some(&key[..self.sep_len(e)])
    }

    /// Does group `s..e` fit one node, with the prefix and fences its bounds give it?
    fn fits(&self, s: usize, e: usize) -> bool {
        let (low, high) = (self.low_of(s), self.high_of(e));
        let p = effective_prefix(low, high, self.size);
        let (low, high) = stored_fences(low, high, p);
        let fences = low.map_or(0, <[u8]>::len) + high.map_or(0, <[u8]>::len);
        let records = (self.cum[e] - self.cum[s]).saturating_sub((e - s) * p);
        FIXED_COST + fences + records <= self.size
    }

    /// The largest `e` such that `s..e` fits (cost grows with `e`), at least `s + 1`.
    fn max_end(&self, s: usize) -> usize {
        let mut e = s + 1;
        while e < self.records.len() && self.fits(s, e + 1) {
            e += 1;
        }
        e
    }

    /// Group bounds `[0, c1, .., n]`, each group as full as possible.
    fn greedy(&self) -> Vec<usize> {
        let mut bounds = vec![0];
        let mut s = 0;
        while s < self.records.len() {
            s = self.max_end(s);
            bounds.push(s);
        }
        bounds
    }

    /// Group bounds for `k` groups cut nearest the byte midpoints, or `None` if they do not
    /// all fit.
    fn balanced(&self, k: usize) -> Option<Vec<usize>> {
        let n = self.records.len();
        if k == 0 || k > n {
            return None;
        }
        let mut bounds = vec![0];
        let mut s = 0;
        for g in 0..k - 1 {
            let rest = k - g;
            let target = self.cum[s] + (self.cum[n] - self.cum[s]) / rest;
            let hi = self.max_end(s).min(n - (rest - 1));
            if hi <= s {
                return None;
            }
            let mut e = s + 1;
            while e < hi && self.cum[e] < target {
                e += 1;
            }
            if e > s + 1 && self.cum[e] >= target && target - self.cum[e - 1] < self.cum[e] - target
            {
                e -= 1;
            }
            bounds.push(e);
            s = e;
        }
        if !self.fits(s, n) {
            return None;
        }
        bounds.push(n);
        Some(bounds)
    }
}
