//! bfkv and Microsoft's `bf-tree` 0.5.7 behind the [`Engine`] trait: the adapters every
//! benchmark drives them through (the `ycsb` and `vs_bftree` examples, the criterion benches,
//! and the peer comparison in `bench/peers`).

use std::path::Path;

use crate::decode_value;
use crate::runner::{BoxError, Engine};
#[cfg(target_os = "linux")]
use bf_tree::StorageBackend;
use bf_tree::{BfTree, LeafReadResult, ScanReturnField};
use bfkv::{Config, Durability, Tree};

/// bfkv, file-backed (`io_uring`, `O_DIRECT`).
pub struct Bfkv(pub Tree);

impl Bfkv {
    /// Opens a bfkv tree in `dir` with `cache` bytes of circular buffer, the given
    /// durability and, if given, a read-promotion percentage and a page size other than
    /// the defaults.
    ///
    /// # Errors
    /// Whatever [`Tree::open`] returns.
    pub fn open(
        dir: &Path,
        cache: usize,
        durability: Durability,
        promotion: Option<u8>,
        page_size: Option<usize>,
    ) -> Result<Bfkv, BoxError> {
        let mut config = Config::new(dir).cache_size(cache).durability(durability);
        if let Some(p) = promotion {
            config = config.promotion_percent(p);
        }
        if let Some(bytes) = page_size {
            config = config.page_size(bytes);
        }
        Ok(Bfkv(Tree::open(config)?))
    }
}

impl Engine for Bfkv {
    fn name(&self) -> &'static str {
        "bfkv"
    }

    fn get(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, BoxError> {
        Ok(self.0.get_into(key, out)?)
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), BoxError> {
        Ok(self.0.insert(key, value)?)
    }

    fn scan(&self, start: &[u8], len: usize) -> Result<usize, BoxError> {
        let mut n = 0;
        let mut scan = self.0.range(start..);
        while n < len {
            let Some(record) = scan.next_ref() else { break };
            decode_value(record?.1).ok_or("bfkv scan returned a malformed value")?;
            n += 1;
        }
        Ok(n)
    }

    fn leaf_io(&self) -> Option<(u64, u64)> {
        let s = self.0.stats();
        Some((s.pages_read, s.pages_written))
    }
}

/// Microsoft's `bf-tree` 0.5.7, file-backed on its `IoUringBlocking` backend (`O_DIRECT`;
/// off Linux, its default backend).
pub struct MsBfTree(pub BfTree);

impl MsBfTree {
    /// Opens a bf-tree file in `dir` with `cache` bytes of circular buffer (a power of two,
    /// as bf-tree requires).
    ///
    /// # Errors
    /// bf-tree's refusal of the configuration.
    pub fn open(dir: &Path, cache: usize) -> Result<MsBfTree, BoxError> {
        #[cfg_attr(not(target_os = "linux"), allow(unused_mut))]
        let mut config = bf_tree::Config::new(dir.join("bftree.data"), cache);
        #[cfg(target_os = "linux")]
        config.storage_backend(StorageBackend::IoUringBlocking);
        BfTree::with_config(config, None)
            .map(MsBfTree)
            .map_err(|e| format!("bf-tree config: {e:?}").into())
    }
}

impl MsBfTree {
    /// A bf-tree in its cache-only mode (`:cache:`): no file, every leaf a mini-page in the
    /// circular buffer. Its fastest configuration when the data fits in memory, since its
    /// file-backed mode caches records (30 % promotion on read), not whole pages.
    ///
    /// # Errors
    /// bf-tree's refusal of the configuration.
    pub fn open_cache_only(cache: usize) -> Result<MsBfTree, BoxError> {
        let config = bf_tree::Config::new(":cache:", cache);
        BfTree::with_config(config, None)
            .map(MsBfTree)
            .map_err(|e| format!("bf-tree config: {e:?}").into())
    }
}

impl Engine for MsBfTree {
    fn name(&self) -> &'static str {
        if self.0.config().is_memory_backend() {
            "bf-tree-cache-only"
        } else {
            "bf-tree"
        }
    }

    fn get(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, BoxError> {
        out.resize(4096, 0);
        match self.0.read(key, out) {
            LeafReadResult::Found(n) => {
                out.truncate(n as usize);
                Ok(true)
            }
            LeafReadResult::NotFound | LeafReadResult::Deleted => Ok(false),
            LeafReadResult::InvalidKey => Err("bf-tree refused the key".into()),
        }
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), BoxError> {
        match self.0.insert(key, value) {
            bf_tree::LeafInsertResult::Success => Ok(()),
            bf_tree::LeafInsertResult::InvalidKV(e) => Err(e.into()),
        }
    }

    fn scan(&self, start: &[u8], len: usize) -> Result<usize, BoxError> {
        let mut iter = self
            .0
            .scan_with_count(start, len, ScanReturnField::KeyAndValue)
            .map_err(|e| format!("bf-tree scan: {e:?}"))?;
        let mut buf = [0u8; 4096];
        let mut n = 0;
        while let Some((k, v)) = iter.next(&mut buf) {
            decode_value(&buf[k..k + v]).ok_or("bf-tree scan returned a malformed value")?;
            n += 1;
        }
        Ok(n)
    }

    fn leaf_io(&self) -> Option<(u64, u64)> {
        // bf-tree 0.5.7 counts I/O only with its `metrics` feature; see `proc_io`.
        None
    }
}
