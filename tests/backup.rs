//! Online backups: every acknowledged write in the copy in every durability mode, an
//! independent copy (opens beside its source, outlives it, backs up itself), a target that
//! exists left alone, and writers that go on while the copy is made, whose writes the copy
//! holds as a prefix.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bfkv::{Config, Durability, Error, Tree};

/// Equality of two maps, reported briefly (sizes and the first difference).
fn same(got: &BTreeMap<Vec<u8>, Vec<u8>>, expected: &BTreeMap<Vec<u8>, Vec<u8>>, what: &str) {
    if got == expected {
        return;
    }
    let first = got
        .iter()
        .zip(expected.iter())
        .find(|(a, b)| a != b)
        .map(|(a, b)| (a.0.clone(), b.0.clone()));
    panic!(
        "{what}: {} records, expected {}; first differing keys {first:?}",
        got.len(),
        expected.len()
    );
}

fn contents(tree: &Tree, keyspace: Option<&str>) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let records: Vec<_> = match keyspace {
        None => tree.iter().collect(),
        Some(name) => tree.keyspace(name).expect("keyspace").iter().collect(),
    };
    records.into_iter().map(|r| r.expect("record")).collect()
}

#[test]
fn a_backup_holds_every_acknowledged_write_and_stands_alone() {
    for durability in [Durability::Sync, Durability::Buffered, Durability::None] {
        let root = tempfile::tempdir().expect("tempdir");
        let src = root.path().join("src");
        let tree =
            Tree::open(Config::new(&src).cache_size(1 << 20).durability(durability)).expect("open");
        let ks = tree.keyspace("ks").expect("keyspace");
        let mut model = BTreeMap::new();
        let mut ks_model = BTreeMap::new();
        for i in 0u32..20_000 {
            let (k, v) = (i.to_be_bytes().to_vec(), vec![i as u8; 40]);
            tree.insert(&k, &v).expect("insert");
            model.insert(k.clone(), v.clone());
            if i % 3 == 0 {
                ks.insert(&k, &v).expect("insert");
                ks_model.insert(k, v);
            }
        }
        for i in (0u32..20_000).step_by(7) {
            tree.remove(i.to_be_bytes()).expect("remove");
            model.remove(&i.to_be_bytes()[..]);
        }
        // No flush: the backup must hold what was acknowledged.
        let copy = root.path().join("backups").join("one");
        tree.backup(&copy).expect("backup");
        // The copy opens while its source is open, and holds exactly that.
        {
            let backup = Tree::open(Config::new(&copy)).expect("open backup");
            same(&contents(&backup, None), &model, &format!("{durability:?}"));
            same(
                &contents(&backup, Some("ks")),
                &ks_model,
                &format!("{durability:?} ks"),
            );
            // It is independent: writing it does not touch the source.
            backup.insert(b"only in the backup", b"").expect("insert");
            let again = root.path().join("backups").join("two");
            backup.backup(&again).expect("backup of a backup");
            backup.close().expect("close");
            let twice = Tree::open(Config::new(&again)).expect("open second backup");
            assert_eq!(
                twice.get(b"only in the backup").expect("get"),
                Some(Vec::new())
            );
        }
        assert_eq!(tree.get(b"only in the backup").expect("get"), None);
        model.insert(b"only in the backup".to_vec(), Vec::new());
        // The source goes away; the copy stays whole.
        tree.close().expect("close");
        std::fs::remove_dir_all(&src).expect("remove source");
        let backup = Tree::open(Config::new(&copy)).expect("open backup");
        assert_eq!(
            contents(&backup, None),
            model,
            "{durability:?} after the source is gone"
        );
        assert_eq!(backup.keyspaces().expect("keyspaces"), ["ks"]);
    }
}

#[test]
fn a_target_that_exists_is_left_alone() {
    let root = tempfile::tempdir().expect("tempdir");
    let tree = Tree::open(Config::new(root.path().join("db"))).expect("open");
    tree.insert(b"k", b"v").expect("insert");
    let busy = root.path().join("busy");
    std::fs::create_dir(&busy).expect("mkdir");
    std::fs::write(busy.join("precious"), b"keep me").expect("write");
    match tree.backup(&busy) {
        Err(Error::Io { source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::AlreadyExists);
        }
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
    assert_eq!(
        std::fs::read(busy.join("precious")).expect("read"),
        b"keep me"
    );
    assert_eq!(std::fs::read_dir(&busy).expect("read_dir").count(), 1);
    let file = root.path().join("file");
    std::fs::write(&file, b"x").expect("write");
    assert!(tree.backup(&file).is_err());
    assert_eq!(std::fs::read(&file).expect("read"), b"x");
    let memory = Tree::open(Config::in_memory()).expect("open");
    assert!(matches!(
        memory.backup(root.path().join("mem")),
        Err(Error::InvalidConfig { .. })
    ));
}

/// A writer appends keys 0, 1, 2, ... while a backup runs: it is never stopped for the
/// whole copy, and the copy holds keys 0..m for some m at least the count acknowledged
/// before the call (the tree after a prefix of the acknowledged writes).
#[test]
fn writers_go_on_during_a_backup_and_the_copy_is_a_prefix() {
    for durability in [Durability::Sync, Durability::Buffered] {
        let root = tempfile::tempdir().expect("tempdir");
        let db = root.path().join("db");
        // Enough data that the copy takes a while (loaded without a log, for speed).
        {
            let tree = Tree::open(Config::new(&db).durability(Durability::None)).expect("open");
            let filler = tree.keyspace("filler").expect("keyspace");
            for i in 0u32..200_000 {
                filler.insert(i.to_be_bytes(), [9u8; 100]).expect("insert");
            }
            tree.close().expect("close");
        }
        let tree = Tree::open(Config::new(&db).durability(durability)).expect("open");
        let acked = AtomicU64::new(0);
        let stop = AtomicBool::new(false);
        let (before, during) = std::thread::scope(|s| {
            let writer = s.spawn(|| {
                let mut i = 0u64;
                while !stop.load(Ordering::Acquire) {
                    tree.insert(i.to_be_bytes(), i.to_le_bytes())
                        .expect("insert");
                    i += 1;
                    acked.store(i, Ordering::Release);
                }
            });
            while acked.load(Ordering::Acquire) < 100 {
                std::thread::yield_now();
            }
            let before = acked.load(Ordering::Acquire);
            tree.backup(root.path().join("copy")).expect("backup");
            let during = acked.load(Ordering::Acquire) - before;
            stop.store(true, Ordering::Release);
            writer.join().expect("writer");
            (before, during)
        });
        assert!(
            during > 0,
            "{durability:?}: the writer stopped for the whole backup"
        );
        let copy = Tree::open(Config::new(root.path().join("copy"))).expect("open backup");
        let keys: Vec<u64> = copy
            .iter()
            .map(|r| u64::from_be_bytes(r.expect("record").0.try_into().expect("u64 key")))
            .collect();
        let m = keys.len() as u64;
        assert!(
            m >= before,
            "{durability:?}: {m} keys, {before} acknowledged before the call"
        );
        assert!(
            keys.iter().copied().eq(0..m),
            "{durability:?}: the copy's keys are not a prefix of the writes"
        );
        assert_eq!(
            copy.keyspace("filler").expect("filler").iter().count(),
            200_000
        );
    }
}
