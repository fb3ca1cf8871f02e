//! A census of the cache for diagnosis (cfg `fuzzing` or `bfkv_internals`): how the circular buffer's
//! bytes divide between records, node overhead and unused space, per kind of node.

use std::fmt;

use crate::node::{NodeKind, NodeRef, RecordKind};
use crate::pool::Location;
use crate::tree::Shared;

/// Where the cache's bytes are, counted over every leaf at one moment.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
#[cfg_attr(not(any(fuzzing, bfkv_internals)), allow(unreachable_pub))] // `internals` re-exports it
pub struct Census {
    /// Leaves in the tree.
    pub leaves: u64,
    /// Leaves with a mini-page in the cache.
    pub minis: u64,
    /// Leaves cached as a full-page mirror.
    pub mirrors: u64,
    /// Block bytes of mini-pages (their size classes).
    pub mini_bytes: u64,
    /// Block bytes of mirrors.
    pub mirror_bytes: u64,
    /// Bytes of mini-pages' live content (header, metas, data).
    pub mini_used: u64,
    /// Key-suffix and value bytes of mini-page records, per kind: insert, cache, tombstone,
    /// phantom, upsert.
    pub mini_record_bytes: [u64; 5],
    /// Mini-page records per kind (same order).
    pub mini_records: [u64; 5],
    /// Mini-page cache records whose reference bit is set.
    pub mini_referenced: u64,
    /// Records in mirrors.
    pub mirror_records: u64,
    /// Mirror records whose reference bit is set.
    pub mirror_referenced: u64,
    /// Mini-pages per block size, 64 B to 64 KiB (index = floor(log2(size)) - 6).
    pub mini_sizes: [u64; 11],
    /// The buffer's capacity.
    pub capacity: u64,
    /// Bytes of live blocks (headers included), from the pool.
    pub bytes_in_use: u64,
}

impl Shared {
    /// Counts the cache's content leaf by leaf (each under its read lock).
    pub(crate) fn census(&self) -> Census {
        let mut c = Census {
            capacity: self.pool().capacity() as u64,
            bytes_in_use: self.pool().stats().bytes_in_use,
            ..Census::default()
        };
        for (_, pid) in self.index().leaves() {
            c.leaves += 1;
            let page = self.pool().read(pid);
            let (Location::Mini(_), Some(bytes)) = (page.location(), page.mini()) else {
                continue;
            };
            let node = NodeRef::from_bytes(bytes);
            if node.kind() == NodeKind::Leaf {
                c.mirrors += 1;
                c.mirror_bytes += node.size() as u64;
                c.mirror_records += node.len() as u64;
                c.mirror_referenced += (0..node.len()).filter(|&i| node.ref_bit(i)).count() as u64;
                continue;
            }
            c.minis += 1;
            c.mini_bytes += node.size() as u64;
            c.mini_used += node.used_bytes() as u64;
            let class = (node.size().ilog2() as usize).saturating_sub(6);
            if let Some(n) = c.mini_sizes.get_mut(class) {
                *n += 1;
            }
            for i in 0..node.len() {
                let kind = node.record_kind(i) as usize;
                if let Some(n) = c.mini_records.get_mut(kind) {
                    *n += 1;
                    c.mini_record_bytes[kind] +=
                        (node.key_suffix(i).len() + node.value(i).len()) as u64;
                }
                if node.record_kind(i) == RecordKind::Cache && node.ref_bit(i) {
                    c.mini_referenced += 1;
                }
            }
        }
        c
    }
}

impl fmt::Display for Census {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        let records: u64 = self.mini_record_bytes.iter().sum();
        writeln!(
            f,
            "cache {:.1} MiB, live blocks {:.1} MiB; leaves {}: {} minis ({:.1} MiB, content \
             {:.1} MiB, record bytes {:.1} MiB), {} mirrors ({:.1} MiB, {} records, {} referenced)",
            mib(self.capacity),
            mib(self.bytes_in_use),
            self.leaves,
            self.minis,
            mib(self.mini_bytes),
            mib(self.mini_used),
            mib(records),
            self.mirrors,
            mib(self.mirror_bytes),
            self.mirror_records,
            self.mirror_referenced,
        )?;
        writeln!(
            f,
            "mini records insert/cache/tombstone/phantom/upsert: {:?} ({:?} bytes); cache \
             records referenced: {}",
            self.mini_records, self.mini_record_bytes, self.mini_referenced
        )?;
        write!(f, "mini sizes 64 B..64 KiB: {:?}", self.mini_sizes)
    }
}

#[cfg(test)]
mod tests {
    use crate::node::{NodeKind, NodeMut, NodeRef, RecordKind};
    use crate::{Config, Durability, Tree};

    fn key(i: u32) -> Vec<u8> {
        format!("k{i:06}").into_bytes()
    }

    /// A file-backed tree of `n` records, most of its leaves only on disk (the cache holds
    /// about a third of them), whose reads cache every record they fetch.
    fn cached_tree(dir: &std::path::Path, n: u32) -> Tree {
        let config = Config::new(dir)
            .cache_size(256 << 10)
            .promotion_percent(100)
            .durability(Durability::None);
        let tree = Tree::open(config).expect("open");
        for i in 0..n {
            tree.insert(key(i), i.to_le_bytes()).expect("insert");
        }
        tree.checkpoint().expect("checkpoint");
        tree
    }

    #[test]
    fn census_counts_what_the_leaves_hold() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tree = cached_tree(dir.path(), 20_000);
        let leaves = tree.shared().index().leaves().len() as u64;
        let c = tree.shared().census();
        assert_eq!(c.leaves, leaves);
        assert!(c.minis + c.mirrors <= c.leaves, "{c}");
        assert!(c.mini_used <= c.mini_bytes && c.mini_bytes + c.mirror_bytes <= c.capacity);
        assert_eq!(c.capacity, 256 << 10);
        let records: u64 = c.mini_records.iter().sum::<u64>() + c.mirror_records;
        assert!(records < 20_000, "the cache cannot hold every record: {c}");
        // Reads of keys cached nowhere add cache records to mini-pages (promotion 100 %).
        let before = c.mini_records[RecordKind::Cache as usize];
        for i in (0..20_000).step_by(97) {
            assert_eq!(
                tree.get(key(i)).expect("get"),
                Some(i.to_le_bytes().to_vec())
            );
        }
        let after = tree.shared().census();
        assert!(
            after.mini_records[RecordKind::Cache as usize] > before,
            "before {c}\nafter {after}"
        );
        assert!(!after.to_string().is_empty());
    }

    #[test]
    fn a_mini_page_copied_to_the_tail_moves_into_the_smallest_block_that_holds_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tree = cached_tree(dir.path(), 20_000);
        // Cache the first records of the key space, then find a mini-page holding several.
        for i in 0..200 {
            tree.get(key(i)).expect("get");
        }
        let s = tree.shared();
        let (pid, size, count) = s
            .index()
            .leaves()
            .into_iter()
            .find_map(|(_, pid)| {
                let page = s.pool().read(pid);
                let node = NodeRef::from_bytes(page.mini()?);
                (node.kind() == NodeKind::Mini && node.len() >= 8 && node.size() >= 256)
                    .then(|| (pid, node.size(), node.len()))
            })
            .expect("a mini-page with several cached records");
        let mut page = s.pool().write(pid);
        {
            // Only the first record was read since the mini-page last moved.
            let bytes = page.mini_mut().expect("mini-page");
            let mut node = NodeMut::from_bytes(bytes);
            for i in 0..count {
                node.set_ref_bit(i, i == 0);
            }
        }
        s.copy_to_tail(&mut page);
        let node = NodeRef::from_bytes(page.mini().expect("still cached"));
        assert_eq!(node.len(), 1, "only the referenced record stays");
        assert!(node.size() < size, "the copy kept its {size}-byte block");
        assert_eq!(
            Some(node.size()),
            crate::pool::block_size_for(node.used_bytes())
        );
    }
}
