//! The peers behind `bfkv_workload::runner::Engine`, with the settings the report states.
//! bfkv and Microsoft's `bf-tree` come from the adapters the criterion bench and the
//! `vs_bftree` example use, so every comparison drives them through the same code.
//!
//! Durability is matched at "no fsync per write": every write is its own operation (one
//! transaction per write where the engine has transactions), and reaches the engine's log
//! or file through the OS without waiting for the disk.

use std::ops::Bound;
use std::path::Path;

use bfkv::Durability;
use bfkv_workload::decode_value;
use bfkv_workload::runner::{BoxError, Engine};
use redb::ReadableDatabase;

pub use bfkv_workload::engines::{Bfkv, MsBfTree};

/// Every engine name the harness knows, in report order.
pub const ALL: [&str; 8] = [
    "bfkv",
    "bf-tree",
    "rocksdb",
    "rocksdb-buffered",
    "redb",
    "fjall",
    "lmdb",
    "sled",
];

/// The engines of regime 1 (equal budget, direct I/O).
pub const DIRECT: [&str; 3] = ["bfkv", "bf-tree", "rocksdb"];

/// The buffered peers of regime 2 (equal footprint), run before bfkv there.
pub const BUFFERED: [&str; 5] = ["rocksdb-buffered", "redb", "fjall", "lmdb", "sled"];

/// LMDB's map size: an upper bound on its file (sparse until used).
const LMDB_MAP_SIZE: usize = 16 << 30;

/// Opens engine `name` in the empty directory `dir` with `cache` bytes of its own cache.
pub fn open(name: &str, dir: &Path, cache: usize) -> Result<Box<dyn Engine>, BoxError> {
    Ok(match name {
        "bfkv" => Box::new(Bfkv::open(dir, cache, Durability::Buffered, None, None)?),
        "bf-tree" => Box::new(MsBfTree::open(dir, cache.next_power_of_two())?),
        "bf-tree-cache-only" => Box::new(MsBfTree::open_cache_only(cache.next_power_of_two())?),
        "rocksdb" => Box::new(Rocks::open(dir, cache, true)?),
        "rocksdb-buffered" => Box::new(Rocks::open(dir, cache, false)?),
        "redb" => Box::new(Redb::open(dir, cache)?),
        "fjall" => Box::new(Fjall::open(dir, cache)?),
        "lmdb" => Box::new(Lmdb::open(dir)?),
        "sled" => Box::new(Sled::open(dir, cache)?),
        other => return Err(format!("unknown engine `{other}`").into()),
    })
}

/// The settings `open` uses for `name`, in words, for the report.
pub fn settings(name: &str) -> &'static str {
    match name {
        "bfkv" => "`Durability::Buffered` (log record written through a mapped segment before the write returns, fsynced in the background every 5 ms), io_uring + `O_DIRECT` data file, cache = the circular buffer, other settings default",
        "bf-tree" => "file-backed, `StorageBackend::IoUringBlocking` (`O_DIRECT`), circular buffer = the cache (a power of two), write-ahead log off (0.5.7's default: it does not log), other settings default",
        "bf-tree-cache-only" => "bf-tree's in-memory mode (`:cache:`), for data that fits",
        "rocksdb" => "WAL on, `sync = false`; `use_direct_reads` and `use_direct_io_for_flush_and_compaction`; LRU block cache = the cache, memtables charged to it (`WriteBufferManager` with the cache, limit half of it, `write_buffer_size` a quarter), index and filter blocks in the cache, partitioned (two-level index, partitioned filters, 4 KiB metadata blocks, top level pinned), bloom filter 10 bits/key, no compression",
        "rocksdb-buffered" => "as `rocksdb` but buffered I/O (no direct reads or flush/compaction I/O)",
        "redb" => "one write transaction per write with `Durability::None`, one read transaction per read or scan, cache (`set_cache_size`) = the cache",
        "fjall" => "one keyspace; default journal (each write is flushed to the OS, never fsynced by the write), block cache (`cache_size`) = the cache, no compression (built without `lz4`), other settings default",
        "lmdb" => "`heed` environment with `NO_SYNC | NO_META_SYNC`, one write transaction per write, one read transaction per read or scan, map size 16 GiB; no cache of its own (the file is memory-mapped: the OS page cache is its cache)",
        "sled" => "default flush (background, every 500 ms), `cache_capacity` = the cache",
        _ => "",
    }
}

/// Copies a found value into `out`; whether there was one.
fn found(value: Option<impl AsRef<[u8]>>, out: &mut Vec<u8>) -> bool {
    match value {
        Some(v) => {
            out.clear();
            out.extend_from_slice(v.as_ref());
            true
        }
        None => false,
    }
}

/// Checks a scanned value's format.
fn check(v: &[u8], engine: &str) -> Result<(), BoxError> {
    decode_value(v)
        .map(|_| ())
        .ok_or_else(|| format!("{engine} scan returned a malformed value").into())
}

/// RocksDB (`rocksdb` crate), with direct I/O or buffered.
pub struct Rocks {
    /// The database.
    db: rocksdb::DB,
    /// Whether it was opened with direct I/O.
    direct: bool,
    /// Writes: WAL on, no sync (the defaults, spelled out).
    write: rocksdb::WriteOptions,
}

impl Rocks {
    /// Opens RocksDB in `dir` with `cache` bytes for block cache and memtables together.
    pub fn open(dir: &Path, cache: usize, direct: bool) -> Result<Rocks, BoxError> {
        let block_cache = rocksdb::Cache::new_lru_cache(cache);
        let mut table = rocksdb::BlockBasedOptions::default();
        table.set_block_cache(&block_cache);
        // Index and filter blocks live in the budget too; partitioned, so a lookup reads a
        // 4 KiB partition of them instead of a table's whole filter when the cache is small
        // (whole filters made each YCSB-C get read ~125 pages in a trial).
        table.set_cache_index_and_filter_blocks(true);
        table.set_pin_l0_filter_and_index_blocks_in_cache(true);
        table.set_index_type(rocksdb::BlockBasedIndexType::TwoLevelIndexSearch);
        table.set_partition_filters(true);
        table.set_metadata_block_size(4096);
        table.set_pin_top_level_index_and_filter(true);
        table.set_bloom_filter(10.0, false);
        let mut opts = rocksdb::Options::default();
        opts.create_if_missing(true);
        opts.set_block_based_table_factory(&table);
        opts.set_compression_type(rocksdb::DBCompressionType::None);
        opts.set_write_buffer_size(cache / 4);
        // Memtables count against the same budget as the block cache.
        let wbm = rocksdb::WriteBufferManager::new_write_buffer_manager_with_cache(
            cache / 2,
            false,
            block_cache.clone(),
        );
        opts.set_write_buffer_manager(&wbm);
        opts.set_use_direct_reads(direct);
        opts.set_use_direct_io_for_flush_and_compaction(direct);
        let mut write = rocksdb::WriteOptions::default();
        write.set_sync(false);
        write.disable_wal(false);
        Ok(Rocks {
            db: rocksdb::DB::open(&opts, dir)?,
            direct,
            write,
        })
    }
}

impl Engine for Rocks {
    fn name(&self) -> &'static str {
        if self.direct {
            "rocksdb"
        } else {
            "rocksdb-buffered"
        }
    }

    fn get(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, BoxError> {
        Ok(found(self.db.get_pinned(key)?, out))
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), BoxError> {
        Ok(self.db.put_opt(key, value, &self.write)?)
    }

    fn scan(&self, start: &[u8], len: usize) -> Result<usize, BoxError> {
        let mut it = self.db.raw_iterator();
        it.seek(start);
        let mut n = 0;
        while n < len {
            let Some(v) = it.value() else { break };
            check(v, "rocksdb")?;
            n += 1;
            it.next();
        }
        it.status()?;
        Ok(n)
    }

    fn leaf_io(&self) -> Option<(u64, u64)> {
        None
    }
}

/// The one table of the redb database.
const REDB_TABLE: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("peers");

/// redb, one transaction per operation.
pub struct Redb(redb::Database);

impl Redb {
    /// Creates a redb database in `dir` with a `cache`-byte cache.
    pub fn open(dir: &Path, cache: usize) -> Result<Redb, BoxError> {
        let db = redb::Builder::new()
            .set_cache_size(cache)
            .create(dir.join("redb.db"))?;
        // Create the table once, so reads never find it missing.
        let w = db.begin_write()?;
        w.open_table(REDB_TABLE)?;
        w.commit()?;
        Ok(Redb(db))
    }
}

impl Engine for Redb {
    fn name(&self) -> &'static str {
        "redb"
    }

    fn get(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, BoxError> {
        let r = self.0.begin_read()?;
        let table = r.open_table(REDB_TABLE)?;
        Ok(found(table.get(key)?.as_ref().map(|v| v.value()), out))
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), BoxError> {
        let mut w = self.0.begin_write()?;
        w.set_durability(redb::Durability::None)?;
        w.open_table(REDB_TABLE)?.insert(key, value)?;
        w.commit()?;
        Ok(())
    }

    fn scan(&self, start: &[u8], len: usize) -> Result<usize, BoxError> {
        let r = self.0.begin_read()?;
        let table = r.open_table(REDB_TABLE)?;
        let mut n = 0;
        for kv in table.range::<&[u8]>(start..)?.take(len) {
            check(kv?.1.value(), "redb")?;
            n += 1;
        }
        Ok(n)
    }

    fn leaf_io(&self) -> Option<(u64, u64)> {
        None
    }
}

/// fjall, one keyspace.
pub struct Fjall {
    /// The database (kept open for the keyspace's sake).
    _db: fjall::Database,
    /// The keyspace holding the records.
    ks: fjall::Keyspace,
}

impl Fjall {
    /// Opens a fjall database in `dir` with a `cache`-byte block cache.
    pub fn open(dir: &Path, cache: usize) -> Result<Fjall, BoxError> {
        let db = fjall::Database::builder(dir)
            .cache_size(cache as u64)
            .open()?;
        let ks = db.keyspace("peers", fjall::KeyspaceCreateOptions::default)?;
        Ok(Fjall { _db: db, ks })
    }
}

impl Engine for Fjall {
    fn name(&self) -> &'static str {
        "fjall"
    }

    fn get(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, BoxError> {
        Ok(found(self.ks.get(key)?, out))
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), BoxError> {
        Ok(self.ks.insert(key, value)?)
    }

    fn scan(&self, start: &[u8], len: usize) -> Result<usize, BoxError> {
        let mut n = 0;
        for kv in self.ks.range(start..).take(len) {
            check(&kv.value()?, "fjall")?;
            n += 1;
        }
        Ok(n)
    }

    fn leaf_io(&self) -> Option<(u64, u64)> {
        None
    }
}

/// LMDB through `heed`.
pub struct Lmdb {
    /// The environment.
    env: heed::Env,
    /// The unnamed database.
    db: heed::Database<'static, heed::types::Bytes, heed::types::Bytes>,
}

impl Lmdb {
    /// Opens an LMDB environment in `dir` without syncs.
    pub fn open(dir: &Path) -> Result<Lmdb, BoxError> {
        let mut options = heed::EnvOpenOptions::new();
        options.map_size(LMDB_MAP_SIZE);
        // SAFETY: NO_SYNC / NO_META_SYNC only weaken durability after a crash (the point of
        // the throughput runs); nothing else opens this environment, so the flags cannot
        // disagree with another process's.
        unsafe { options.flags(heed::EnvFlags::NO_SYNC | heed::EnvFlags::NO_META_SYNC) };
        // SAFETY: `dir` is a fresh directory private to this process, opened once; heed's
        // requirement is that the same environment is not opened twice in one process.
        let env = unsafe { options.open(dir)? };
        let wtxn = env.write_txn()?;
        let db = env
            .create_databases_and_commit(wtxn, |opener, wtxn| {
                opener
                    .create_database(wtxn, None)
                    .map(heed::CommitOrAbort::<_, ()>::Commit)
            })?
            .unwrap_commit();
        Ok(Lmdb { env, db })
    }
}

impl Engine for Lmdb {
    fn name(&self) -> &'static str {
        "lmdb"
    }

    fn get(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, BoxError> {
        let r = self.env.read_txn()?;
        Ok(found(self.db.get(&r, key)?, out))
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), BoxError> {
        let mut w = self.env.write_txn()?;
        self.db.put(&mut w, key, value)?;
        w.commit()?;
        Ok(())
    }

    fn scan(&self, start: &[u8], len: usize) -> Result<usize, BoxError> {
        let r = self.env.read_txn()?;
        let range: (Bound<&[u8]>, Bound<&[u8]>) = (Bound::Included(start), Bound::Unbounded);
        let mut n = 0;
        for kv in self.db.range(&r, &range)?.take(len) {
            check(kv?.1, "lmdb")?;
            n += 1;
        }
        Ok(n)
    }

    fn leaf_io(&self) -> Option<(u64, u64)> {
        None
    }
}

/// sled 0.34.
pub struct Sled(sled::Db);

impl Sled {
    /// Opens sled in `dir` with a `cache`-byte page cache.
    pub fn open(dir: &Path, cache: usize) -> Result<Sled, BoxError> {
        Ok(Sled(
            sled::Config::new()
                .path(dir)
                .cache_capacity(cache as u64)
                .open()?,
        ))
    }
}

impl Engine for Sled {
    fn name(&self) -> &'static str {
        "sled"
    }

    fn get(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, BoxError> {
        Ok(found(self.0.get(key)?, out))
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), BoxError> {
        self.0.insert(key, value)?;
        Ok(())
    }

    fn scan(&self, start: &[u8], len: usize) -> Result<usize, BoxError> {
        let mut n = 0;
        for kv in self.0.range::<&[u8], _>(start..).take(len) {
            check(&kv?.1, "sled")?;
            n += 1;
        }
        Ok(n)
    }

    fn leaf_io(&self) -> Option<(u64, u64)> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bfkv_workload::{key, value};

    /// Every engine stores, finds and scans the same records (small data, default cache).
    #[test]
    fn every_engine_round_trips() {
        for name in ALL {
            let dir = tempfile::tempdir().unwrap();
            let e = open(name, dir.path(), 4 << 20).unwrap();
            for i in 0..500 {
                e.put(&key(i), &value(i, 1, 16)).unwrap();
            }
            let mut out = Vec::new();
            assert!(e.get(&key(7), &mut out).unwrap(), "{name}");
            assert_eq!(decode_value(&out), Some((7, 1)), "{name}");
            assert!(!e.get(&key(10_000), &mut out).unwrap(), "{name}");
            assert_eq!(e.scan(&[0u8; 16], 600).unwrap(), 500, "{name}");
            assert_eq!(e.name(), name);
            assert!(!settings(name).is_empty());
        }
    }
}
