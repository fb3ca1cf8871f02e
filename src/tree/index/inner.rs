//! Inner nodes: pinned in memory, immutable once published, replaced copy-on-write.
//!
//! Paper §3.4 pins inner nodes and reads them with optimistic latch coupling. Here the same
//! goal (readers never write shared memory on the way down, never block) is reached with
//! read-copy-update: a structure change builds new versions of the nodes on the path and
//! publishes a new root; readers that started earlier finish on the old versions, which
//! crossbeam-epoch frees once they are gone. Structure changes are rare (one per leaf split
//! or leaf removal) and are serialized by the tree's structure lock, whose 8-byte version
//! readers check after locking a leaf (see `root.rs`).
//!
//! An inner node is a node of the shared layout (`node/`, kind Inner): record `i` maps the
//! keys from its key up to the next record's key to child `i`. Record 0 is keyed by the
//! node's low bound. Level-1 nodes store leaf page ids as 8-byte values; higher levels keep
//! their children in `children`, parallel to the records.

use crate::node::{self, NodeKind, NodeMut, NodeRef, Record, RecordKind};
use crate::pool::PageId;
use crate::sync::Arc;

/// Deepest tree we descend. Nodes always hold at least 3 entries when they split, so 32
/// levels address far more leaves than a `u32` page id can name.
pub(crate) const MAX_HEIGHT: usize = 32;

/// One immutable inner node.
pub(crate) struct Inner {
    level: u8,
    bytes: Box<[u8]>,
    children: Box<[Arc<Inner>]>,
}

/// What an entry of an inner node points at.
#[derive(Clone)]
pub(crate) enum ChildRef {
    /// A leaf, by page id (level-1 nodes).
    Leaf(PageId),
    /// Another inner node (levels above 1).
    Inner(Arc<Inner>),
}

/// An owned entry, used while rebuilding nodes during a structure change.
#[derive(Clone)]
pub(crate) struct Entry {
    /// The entry's separator (for the first entry of a node: its low bound, or empty).
    key: Vec<u8>,
    /// The child.
    child: ChildRef,
}

impl Entry {
    /// The entry for a leaf whose keys start at `low` (empty: the node's first entry).
    pub(crate) fn leaf(low: Vec<u8>, pid: PageId) -> Entry {
        Entry {
            key: low,
            child: ChildRef::Leaf(pid),
        }
    }
}

impl Inner {
    /// A root over a single leaf: the tree's initial shape.
    pub(crate) fn single_leaf(pid: PageId, node_size: usize) -> Inner {
        let entries = vec![Entry {
            key: Vec::new(),
            child: ChildRef::Leaf(pid),
        }];
        let mut built = Self::build(1, None, None, entries, node_size);
        debug_assert_eq!(built.len(), 1);
        built.remove(0).1
    }

    pub(crate) fn node(&self) -> NodeRef<'_> {
        NodeRef::from_bytes(&self.bytes)
    }

    pub(crate) fn len(&self) -> usize {
        self.node().len()
    }

    /// Index of the child whose range holds `key`.
    fn index_for(&self, key: &[u8]) -> usize {
        self.node().child_index(key)
    }

    /// Index of the child holding the greatest keys below `key`.
    fn index_before(&self, key: &[u8]) -> usize {
        self.node().lower_bound(key).saturating_sub(1)
    }

    /// The leaf page id of entry `i` (level 1 only).
    fn leaf_at(&self, i: usize) -> PageId {
        debug_assert_eq!(self.level, 1);
        // Page ids are written by `build` from a `PageId`, so the narrowing is lossless.
        self.node().child(i) as PageId
    }

    fn inner_at(&self, i: usize) -> &Inner {
        &self.children[i]
    }

    /// The entries of this node, owned.
    fn entries(&self) -> Vec<Entry> {
        let node = self.node();
        (0..node.len())
            .map(|i| {
                let mut key = Vec::new();
                node.key_into(i, &mut key);
                let child = if self.level == 1 {
                    ChildRef::Leaf(self.leaf_at(i))
                } else {
                    ChildRef::Inner(self.children[i].clone())
                };
                Entry { key, child }
            })
            .collect()
    }

    /// Builds one or more nodes of `level` holding `entries` (sorted; the first entry's key
    /// is replaced by `low`), splitting where they do not fit one node. Returns each node
    /// with its low bound (`None` for the first, which has `low`).
    pub(crate) fn build(
        level: u8,
        low: Option<&[u8]>,
        high: Option<&[u8]>,
        mut entries: Vec<Entry>,
        node_size: usize,
    ) -> Vec<(Option<Vec<u8>>, Inner)> {
        debug_assert!(!entries.is_empty());
        entries[0].key = low.map(<[u8]>::to_vec).unwrap_or_default();
        let records: Vec<Record> = entries
            .iter()
            .map(|e| Record {
                key: node::Bytes::from_slice(&e.key),
                value: match &e.child {
                    ChildRef::Leaf(pid) => node::Bytes::from_slice(&u64::from(*pid).to_le_bytes()),
                    ChildRef::Inner(_) => node::Bytes::new(),
                },
                kind: RecordKind::Insert,
            })
            .collect();
        let groups = node::split_records(&records, node_size, NodeKind::Inner, low, high);
        let mut out = Vec::with_capacity(groups.len());
        for (g, (range, group_low)) in groups.iter().enumerate() {
            let glow = if g == 0 { low } else { group_low.as_deref() };
            let ghigh = match groups.get(g + 1) {
                Some((_, next_low)) => next_low.as_deref(),
                None => high,
            };
            let mut bytes = vec![0u8; node_size].into_boxed_slice();
            // `split_records` sized every group to fit a node of `node_size` bytes.
            let built = node::build(
                &mut bytes,
                NodeKind::Inner,
                glow,
                ghigh,
                &records[range.clone()],
            );
            debug_assert!(
                built.is_ok(),
                "split_records produced a group that does not fit"
            );
            let children = entries[range.clone()]
                .iter()
                .filter_map(|e| match &e.child {
                    ChildRef::Inner(n) => Some(n.clone()),
                    ChildRef::Leaf(_) => None,
                })
                .collect();
            let label = if g == 0 { None } else { group_low.clone() };
            out.push((
                label,
                Inner {
                    level,
                    bytes,
                    children,
                },
            ));
        }
        out
    }
}

/// A node's exact low and high bound (`None`: infinite), owned.
pub(crate) type Bounds = (Option<Vec<u8>>, Option<Vec<u8>>);

/// The route from the root to a leaf: each inner node passed and the entry taken.
pub(crate) struct Path<'g> {
    steps: [Option<(&'g Inner, usize)>; MAX_HEIGHT],
    len: usize,
    leaf: PageId,
}

/// How to choose the child at each level.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seek<'k> {
    /// The leaf whose range holds this key.
    Key(&'k [u8]),
    /// The leaf holding the greatest keys strictly below this key.
    Before(&'k [u8]),
    /// The first leaf.
    First,
    /// The last leaf.
    Last,
}

impl<'g> Path<'g> {
    /// Walks from `root` to a leaf.
    pub(crate) fn descend(root: &'g Inner, seek: Seek<'_>) -> Path<'g> {
        let mut path = Path {
            steps: [None; MAX_HEIGHT],
            len: 0,
            leaf: 0,
        };
        let mut node = root;
        loop {
            let i = match seek {
                Seek::Key(k) => node.index_for(k),
                Seek::Before(k) => node.index_before(k),
                Seek::First => 0,
                Seek::Last => node.len() - 1,
            };
            if path.len < MAX_HEIGHT {
                path.steps[path.len] = Some((node, i));
                path.len += 1;
            }
            if node.level == 1 {
                path.leaf = node.leaf_at(i);
                return path;
            }
            node = node.inner_at(i);
        }
    }

    /// The leaf reached.
    pub(crate) fn leaf(&self) -> PageId {
        self.leaf
    }

    fn steps(&self) -> impl DoubleEndedIterator<Item = (&'g Inner, usize)> + '_ {
        self.steps[..self.len].iter().flatten().copied()
    }

    /// The leaf's exact low bound (`false` when it is minus infinity), written into `out`.
    pub(crate) fn low_into(&self, out: &mut Vec<u8>) -> bool {
        for (node, i) in self.steps().rev() {
            if i > 0 {
                node.node().key_into(i, out);
                return true;
            }
        }
        out.clear();
        false
    }

    /// The leaf's exact high bound (`false` when it is plus infinity), written into `out`.
    pub(crate) fn high_into(&self, out: &mut Vec<u8>) -> bool {
        for (node, i) in self.steps().rev() {
            if i + 1 < node.len() {
                node.node().key_into(i + 1, out);
                return true;
            }
        }
        out.clear();
        false
    }

    /// Both bounds, owned.
    pub(crate) fn bounds(&self) -> Bounds {
        let mut low = Vec::new();
        let mut high = Vec::new();
        let has_low = self.low_into(&mut low);
        let has_high = self.high_into(&mut high);
        (has_low.then_some(low), has_high.then_some(high))
    }
}

/// Replaces the entry that points at leaf `pid` (found by `key`, which the leaf holds) with
/// `replacement` (empty: the leaf is removed; several: it was split), rebuilding every node
/// on the path copy-on-write. Returns the new root, or `None` when that would remove the
/// last leaf (the tree always keeps one). The caller holds the structure lock.
pub(crate) fn replace_leaf(
    root: &Inner,
    key: &[u8],
    pid: PageId,
    replacement: Vec<Entry>,
    node_size: usize,
) -> Option<Inner> {
    let path = Path::descend(root, Seek::Key(key));
    debug_assert_eq!(
        path.leaf(),
        pid,
        "the structure changed under the structure lock"
    );
    if let Some(root) = insert_in_parent(&path, &replacement, node_size) {
        return Some(root);
    }
    let steps: Vec<(&Inner, usize)> = path.steps().collect();
    // Each node's bounds, from the path above it, taken before anything is rebuilt.
    let bounds: Vec<Bounds> = (0..steps.len())
        .map(|depth| {
            Path {
                steps: path.steps,
                len: depth,
                leaf: 0,
            }
            .bounds()
        })
        .collect();
    let mut repl = replacement;
    let mut built_root: Vec<(Option<Vec<u8>>, Inner)> = Vec::new();
    for (depth, &(node, i)) in steps.iter().enumerate().rev() {
        let mut entries = node.entries();
        entries.splice(i..=i, repl);
        repl = Vec::new();
        if entries.is_empty() {
            continue; // this node vanishes too; its parent drops its entry
        }
        let (low, high) = &bounds[depth];
        let built = Inner::build(
            node.level,
            low.as_deref(),
            high.as_deref(),
            entries,
            node_size,
        );
        if depth == 0 {
            built_root = built;
            break;
        }
        // The first node keeps the key the old node had in its parent.
        let (parent, pi) = steps[depth - 1];
        let mut first_key = Vec::new();
        parent.node().key_into(pi, &mut first_key);
        repl = built
            .into_iter()
            .enumerate()
            .map(|(g, (label, n))| Entry {
                key: if g == 0 {
                    first_key.clone()
                } else {
                    label.unwrap_or_default()
                },
                child: ChildRef::Inner(Arc::new(n)),
            })
            .collect();
    }
    new_root(built_root, node_size)
}

/// The common case of a leaf split: the leaf's parent takes the new separators without
/// overflowing. Its new version is built by copying its records straight across (no owned
/// entries, no split planning), and every node above it is copied as bytes with one child
/// pointer swapped. `None` when the general path is needed (removal, or a full parent).
fn insert_in_parent(path: &Path<'_>, replacement: &[Entry], node_size: usize) -> Option<Inner> {
    if replacement.is_empty() {
        return None;
    }
    let steps: Vec<(&Inner, usize)> = path.steps().collect();
    let depth = steps.len().checked_sub(1)?;
    let (parent, at) = steps[depth];
    let (low, high) = Path {
        steps: path.steps,
        len: depth,
        leaf: 0,
    }
    .bounds();
    let mut bytes = vec![0u8; node_size].into_boxed_slice();
    let mut node = NodeMut::init(&mut bytes, NodeKind::Inner, low.as_deref(), high.as_deref());
    let old = parent.node();
    let mut key = Vec::new();
    for j in 0..old.len() {
        if j == 0 {
            key.clear();
            key.extend_from_slice(low.as_deref().unwrap_or_default());
        } else {
            old.key_into(j, &mut key);
        }
        if j != at {
            node.push_sorted(&key, old.value(j), RecordKind::Insert)
                .ok()?;
            continue;
        }
        // The leaf keeps its key; its new siblings follow with theirs.
        for (g, e) in replacement.iter().enumerate() {
            let ChildRef::Leaf(pid) = e.child else {
                return None;
            };
            let k = if g == 0 {
                key.as_slice()
            } else {
                e.key.as_slice()
            };
            node.push_sorted(k, &u64::from(pid).to_le_bytes(), RecordKind::Insert)
                .ok()?;
        }
    }
    let mut child = Arc::new(Inner {
        level: 1,
        bytes,
        children: Box::new([]),
    });
    for &(node, i) in steps[..depth].iter().rev() {
        let mut children = node.children.clone();
        children[i] = child;
        child = Arc::new(Inner {
            level: node.level,
            bytes: node.bytes.clone(),
            children,
        });
    }
    Some(Arc::try_unwrap(child).unwrap_or_else(|shared| Inner {
        level: shared.level,
        bytes: shared.bytes.clone(),
        children: shared.children.clone(),
    }))
}

/// Makes the new root from the rebuilt old root level: one node becomes the root (shrinking
/// while it has a single inner child); several get a new root one level up.
fn new_root(mut level_nodes: Vec<(Option<Vec<u8>>, Inner)>, node_size: usize) -> Option<Inner> {
    while level_nodes.len() > 1 {
        let level = level_nodes[0].1.level + 1;
        let entries = level_nodes
            .into_iter()
            .map(|(label, n)| Entry {
                key: label.unwrap_or_default(),
                child: ChildRef::Inner(Arc::new(n)),
            })
            .collect();
        level_nodes = Inner::build(level, None, None, entries, node_size);
    }
    let (_, mut root) = level_nodes.pop()?;
    while root.level > 1 && root.len() == 1 {
        let child = root.children[0].clone();
        root = Arc::try_unwrap(child).unwrap_or_else(|shared| Inner {
            level: shared.level,
            bytes: shared.bytes.clone(),
            children: shared.children.clone(),
        });
    }
    Some(root)
}

/// Builds a whole tree over `leaves` (sorted by low bound; the first has no low bound):
/// recovery's bulk load from a checkpoint.
pub(crate) fn bulk_load(leaves: Vec<(Vec<u8>, PageId)>, node_size: usize) -> Option<Inner> {
    if leaves.is_empty() {
        return None;
    }
    let entries: Vec<Entry> = leaves
        .into_iter()
        .map(|(key, pid)| Entry {
            key,
            child: ChildRef::Leaf(pid),
        })
        .collect();
    new_root(Inner::build(1, None, None, entries, node_size), node_size)
}

/// Every leaf in key order with its exact low bound (empty for the first).
pub(crate) fn leaves(root: &Inner) -> Vec<(Vec<u8>, PageId)> {
    let mut out = Vec::new();
    collect_leaves(root, None, &mut out);
    out
}

fn collect_leaves(node: &Inner, low: Option<&[u8]>, out: &mut Vec<(Vec<u8>, PageId)>) {
    let n = node.node();
    for i in 0..n.len() {
        let key = if i == 0 {
            low.map(<[u8]>::to_vec).unwrap_or_default()
        } else {
            let mut k = Vec::new();
            n.key_into(i, &mut k);
            k
        };
        if node.level == 1 {
            out.push((key, node.leaf_at(i)));
        } else {
            let child_low = if i == 0 && low.is_none() {
                None
            } else {
                Some(key.as_slice())
            };
            collect_leaves(node.inner_at(i), child_low, out);
        }
    }
}
