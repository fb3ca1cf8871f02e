//! A real full disk (DESIGN.md, "Bad input and faults"): the database directory is a small
//! `tmpfs`, filled up after `open` by another file. A write that fails for lack of room
//! returns `Err(Io)`, is not visible, and is not there after the tree is reopened once
//! room is freed; every write acknowledged before it is.
//!
//! Mounting needs root (CI runs as root); elsewhere each test says it was skipped.
#![cfg(target_os = "linux")]

use std::fs::{self, File};
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use bfkv::{Config, Durability, Error, Tree};

/// A tmpfs of `size` bytes mounted on a fresh directory, unmounted on drop.
struct SmallDisk {
    _root: tempfile::TempDir,
    mount: PathBuf,
}

impl SmallDisk {
    fn mount(size: u64) -> Option<SmallDisk> {
        let root = tempfile::tempdir().expect("tempdir");
        let mount = root.path().join("disk");
        fs::create_dir(&mount).expect("mkdir");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}")])
            .arg("tmpfs")
            .arg(&mount)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("skipped: cannot mount a tmpfs here (needs root)");
            return None;
        }
        Some(SmallDisk { _root: root, mount })
    }

    fn db(&self) -> PathBuf {
        self.mount.join("db")
    }

    /// Fills the disk with a file until it refuses more; returns the file's path.
    fn fill(&self) -> PathBuf {
        let path = self.mount.join("filler");
        let mut f = File::create(&path).expect("filler");
        let chunk = vec![0xa5u8; 64 << 10];
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(28), "filling: {e}");
                    break;
                }
            }
        }
        // Whatever is left is smaller than a chunk: take it too.
        while f.write(&chunk[..512]).is_ok_and(|n| n > 0) {}
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

fn key(i: u32) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..4].copy_from_slice(&i.to_be_bytes());
    k
}

fn value(i: u32) -> Vec<u8> {
    let mut v = format!("value-{i}-").into_bytes();
    v.resize(100, b'v');
    v
}

/// The tree on `disk`: a 1 MiB staging ring, no checkpoint by log size, no background
/// writes, so what reaches the disk is what the test does.
fn config(disk: &SmallDisk, durability: Durability, cache: usize, segment: u64) -> Config {
    Config::new(disk.db())
        .durability(durability)
        .cache_size(cache)
        .log_segment_size(segment)
        .log_staging_size(1 << 20)
        .checkpoint_log_bytes(1 << 30)
        .evictor_threads(0)
        .idle_write_back(None)
}

/// Inserts keys from `from` on until an insert fails; returns the failing key's number.
fn insert_until_full(tree: &Tree, from: u32) -> u32 {
    for i in from..from + 4_000_000 {
        if let Err(e) = tree.insert(key(i), value(i)) {
            assert!(matches!(e, Error::Io { .. }), "insert {i}: {e}");
            return i;
        }
    }
    panic!("4M inserts fit on a full disk");
}

/// Reopens the tree and checks that keys below `failed` hold their values and key
/// `failed` is absent; then that the tree takes a write and a checkpoint.
fn check_reopened(config: Config, failed: u32) {
    let tree = Tree::open(config).expect("reopen after room was freed");
    for i in 0..failed {
        assert_eq!(
            tree.get(key(i)).expect("get").as_deref(),
            Some(&value(i)[..]),
            "acknowledged key {i} of {failed}"
        );
    }
    assert_eq!(
        tree.get(key(failed)).expect("get"),
        None,
        "the failed write {failed} is there after reopen"
    );
    assert_eq!(tree.iter().count() as u32, failed, "keys after reopen");
    tree.insert(b"after", b"reopen")
        .expect("insert after reopen");
    tree.checkpoint().expect("checkpoint after reopen");
    tree.close().expect("close");
}

/// The log cannot grow (the data file needs no room: the cache holds everything).
fn log_full(durability: Durability) {
    let Some(disk) = SmallDisk::mount(16 << 20) else {
        return;
    };
    let config =
        config(&disk, durability, 64 << 20, 1 << 20).flush_interval(Duration::from_millis(1));
    let tree = Tree::open(config.clone()).expect("open");
    let filler = disk.fill();
    let failed = insert_until_full(&tree, 0);
    assert!(
        failed > 1000,
        "{durability:?}: only {failed} inserts before the disk was full"
    );
    // The failed write is not visible: the tree refuses every call until it is reopened.
    assert!(
        tree.get(key(failed)).is_err(),
        "{durability:?}: get of the failed key"
    );
    assert!(
        tree.get(key(0)).is_err(),
        "{durability:?}: a read after the log failed"
    );
    assert!(
        tree.insert(b"later", b"x").is_err(),
        "{durability:?}: a later write"
    );
    assert!(tree.checkpoint().is_err(), "{durability:?}: a checkpoint");
    assert!(tree.close().is_err(), "{durability:?}: close");
    fs::remove_file(filler).expect("free room");
    check_reopened(config, failed);
}

#[test]
fn a_full_disk_under_the_log_fails_the_write_whole_under_sync() {
    log_full(Durability::Sync);
}

#[test]
fn a_full_disk_under_the_log_fails_the_write_whole_under_buffered() {
    log_full(Durability::Buffered);
}

/// The data file cannot grow: a small cache makes every write evict, and the log has room
/// (one large preallocated segment, or no log).
fn data_full(durability: Durability) {
    let Some(disk) = SmallDisk::mount(48 << 20) else {
        return;
    };
    let config = config(&disk, durability, 256 << 10, 16 << 20);
    let tree = Tree::open(config.clone()).expect("open");
    let filler = disk.fill();
    let failed = insert_until_full(&tree, 0);
    assert!(
        failed > 100,
        "{durability:?}: only {failed} inserts before the disk was full"
    );
    // The log did not fail: the tree goes on, without the failed write.
    assert_eq!(tree.get(key(failed)).expect("get failed key"), None);
    assert_eq!(
        tree.get(key(0)).expect("get").as_deref(),
        Some(&value(0)[..]),
        "{durability:?}: an acknowledged key"
    );
    fs::remove_file(filler).expect("free room");
    // With room again, writes and a checkpoint go through.
    tree.checkpoint().expect("checkpoint once room is freed");
    tree.close().expect("close");
    check_reopened(config, failed);
}

#[test]
fn a_full_disk_under_the_data_file_fails_the_write_whole_under_sync() {
    data_full(Durability::Sync);
}

#[test]
fn a_full_disk_under_the_data_file_fails_the_write_whole_under_none() {
    data_full(Durability::None);
}

/// Values stored out of line when the disk is full: the write that finds no room for its
/// extent fails with `Err(Io)` before anything is applied or logged, so the key keeps its
/// old value and the tree is not failed for good: once room is freed large and small
/// writes work again, and a reopen finds every acknowledged value.
#[test]
fn a_full_disk_under_the_blob_file_fails_the_large_write_alone() {
    let Some(disk) = SmallDisk::mount(48 << 20) else {
        return;
    };
    let config = config(&disk, Durability::Sync, 4 << 20, 1 << 20);
    let big = |i: u32| {
        let mut v = vec![(i % 251) as u8; 1 << 20];
        v[..4].copy_from_slice(&i.to_be_bytes());
        v
    };
    let tree = Tree::open(config.clone()).expect("open");
    tree.insert(b"doc", big(0)).expect("first large value");
    let filler = disk.fill();
    let mut failed = None;
    for i in 1..64u32 {
        match tree.insert(format!("doc-{i}"), big(i)) {
            Ok(()) => {}
            Err(Error::Io { .. }) => {
                failed = Some(i);
                break;
            }
            Err(e) => panic!("large insert {i}: {e}"),
        }
    }
    let failed = failed.expect("a full disk took 64 MiB of values");
    assert_eq!(tree.get(format!("doc-{failed}")).expect("get"), None);
    assert_eq!(tree.get(b"doc").expect("get"), Some(big(0)));
    // An overwrite that cannot store its value leaves the old one.
    assert!(matches!(
        tree.insert(b"doc", big(99)),
        Err(Error::Io { .. })
    ));
    assert_eq!(tree.get(b"doc").expect("get"), Some(big(0)));
    fs::remove_file(filler).expect("free room");
    tree.insert(b"doc", big(100))
        .expect("a large write once room is back");
    tree.insert(b"small", b"fine").expect("a small write");
    tree.close().expect("close");
    let tree = Tree::open(config).expect("reopen");
    assert_eq!(tree.get(b"doc").expect("get"), Some(big(100)));
    for i in 1..failed {
        assert_eq!(
            tree.get(format!("doc-{i}")).expect("get"),
            Some(big(i)),
            "acknowledged doc-{i}"
        );
    }
    assert_eq!(tree.get(format!("doc-{failed}")).expect("get"), None);
    tree.close().expect("close");
}
