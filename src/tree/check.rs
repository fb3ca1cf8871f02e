//! A structural checker for tests: every leaf's records, in memory and on disk, lie within
//! the leaf's exact bounds, in order, and the leaves tile the key space.

use crate::node::{NodeKind, NodeRef};
use crate::pool::Location;
use crate::tree::cache::with_page_buf;
use crate::tree::{Shared, NO_PAGE};

impl Shared {
    /// Checks the invariants; returns a description of the first violation.
    pub(crate) fn check_structure(&self) -> Result<(), String> {
        // Splits and leaf removals wait (an evictor thread may remove an empty leaf at any
        // time), so the leaves listed stay the tree's while they are checked.
        let _structure = self.index().lock_smo();
        let leaves = self.index().leaves();
        for (i, (low, pid)) in leaves.iter().enumerate() {
            let high = leaves.get(i + 1).map(|(l, _)| l.as_slice());
            if i > 0 && low.as_slice() <= leaves[i - 1].0.as_slice() {
                return Err(format!("leaf {i} low bound not above its predecessor's"));
            }
            let page = self.pool().read(*pid);
            let in_range = |k: &[u8]| (i == 0 || k >= low.as_slice()) && high.is_none_or(|h| k < h);
            let check_node = |node: NodeRef<'_>, what: &str| -> Result<(), String> {
                let mut prev: Option<Vec<u8>> = None;
                for r in 0..node.len() {
                    let mut k = Vec::new();
                    node.key_into(r, &mut k);
                    if !in_range(&k) {
                        return Err(format!(
                            "leaf {i} (pid {pid}) {what} record {r} {:?} outside [{:?}, {:?})",
                            String::from_utf8_lossy(&k),
                            String::from_utf8_lossy(low),
                            high.map(String::from_utf8_lossy)
                        ));
                    }
                    if prev.as_ref().is_some_and(|p| p >= &k) {
                        return Err(format!("leaf {i} {what} records out of order at {r}"));
                    }
                    prev = Some(k);
                }
                Ok(())
            };
            let disk = match (page.location(), page.mini()) {
                (Location::Mini(_), Some(bytes)) => {
                    let node = NodeRef::from_bytes(bytes);
                    check_node(
                        node,
                        if node.kind() == NodeKind::Leaf {
                            "mirror"
                        } else {
                            "mini-page"
                        },
                    )?;
                    if node.kind() == NodeKind::Leaf {
                        None
                    } else {
                        node.disk_page()
                    }
                }
                (Location::Disk(p), _) => Some(p),
                (Location::Mini(_), None) => {
                    return Err(format!("leaf {i} maps a block it cannot read"))
                }
            };
            if let Some(d) = disk.filter(|d| *d != NO_PAGE) {
                with_page_buf(self.page_size(), |buf| -> Result<(), String> {
                    self.storage()
                        .read_page(d, buf)
                        .map_err(|e| e.to_string())?;
                    self.storage()
                        .check_leaf(d, buf)
                        .map_err(|e| e.to_string())?;
                    let node = NodeRef::from_bytes_checked(buf).map_err(|e| e.0.to_string())?;
                    check_node(node, "disk leaf")
                })?;
            }
        }
        Ok(())
    }
}
