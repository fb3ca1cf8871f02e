//! What `Tree::open` refuses, creating nothing: a path that is a regular file, a
//! non-empty directory holding no tree, a backup that did not complete, a data file one of
//! whose superblock slots another format version wrote, and a deleted blob file that the
//! checkpoint or the log still references. And what it still opens: an absent path, an
//! empty directory, a volume's root, a slot merely damaged.

use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use bfkv::{Config, Durability, Error, Tree};

/// Every path under `dir`, relative to it, recursively.
fn listing(dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let path = e.expect("entry").path();
            if path.is_dir() {
                todo.push(path.clone());
            }
            out.insert(path.strip_prefix(dir).expect("prefix").to_path_buf());
        }
    }
    out
}

#[test]
fn a_regular_file_is_not_a_directory() {
    let root = tempfile::tempdir().expect("tempdir");
    let file = root.path().join("file");
    std::fs::write(&file, b"mine").expect("write");
    let err = Tree::open(Config::new(&file)).expect_err("a file is not a tree");
    assert!(
        err.to_string().contains("not a directory"),
        "the message says what is wrong: {err}"
    );
    match err {
        Error::Io { path, source } => {
            assert_eq!(path, file);
            assert_eq!(source.kind(), ErrorKind::NotADirectory);
        }
        other => panic!("expected Io, got {other:?}"),
    }
    assert_eq!(std::fs::read(&file).expect("read"), b"mine");
}

#[test]
fn a_directory_of_other_files_is_refused_and_left_alone() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("home");
    std::fs::create_dir_all(dir.join("photos")).expect("mkdir");
    std::fs::write(dir.join("notes.txt"), b"mine").expect("write");
    let before = listing(&dir);
    match Tree::open(Config::new(&dir)) {
        Err(Error::Io { path, source }) => {
            assert_eq!(path, dir);
            assert_eq!(source.kind(), ErrorKind::DirectoryNotEmpty);
        }
        other => panic!("expected Io DirectoryNotEmpty, got {other:?}"),
    }
    assert_eq!(listing(&dir), before, "nothing was created");
    // Only hidden files: not a tree either.
    let hidden = root.path().join("hidden");
    std::fs::create_dir(&hidden).expect("mkdir");
    std::fs::write(hidden.join(".profile"), b"").expect("write");
    assert!(Tree::open(Config::new(&hidden)).is_err());
    assert_eq!(listing(&hidden).len(), 1);
}

#[test]
fn absent_paths_empty_directories_and_volume_roots_become_trees() {
    let root = tempfile::tempdir().expect("tempdir");
    let volume = root.path().join("volume");
    std::fs::create_dir_all(volume.join("lost+found")).expect("mkdir");
    let empty = root.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    for dir in [root.path().join("absent").join("deeper"), empty, volume] {
        let tree = Tree::open(Config::new(&dir)).expect("a new tree");
        tree.insert(b"k", b"v").expect("insert");
        tree.close().expect("close");
        // A tree's directory with a file of the user's beside it still opens.
        std::fs::write(dir.join("README"), b"my database").expect("write");
        let tree = Tree::open(Config::new(&dir)).expect("reopen");
        assert_eq!(tree.get(b"k").expect("get"), Some(b"v".to_vec()));
    }
}

#[test]
fn a_directory_holding_the_marker_of_an_unfinished_backup_is_refused() {
    let root = tempfile::tempdir().expect("tempdir");
    let source = root.path().join("db");
    let tree = Tree::open(Config::new(&source)).expect("open");
    tree.insert(b"k", b"v").expect("insert");
    let copy = root.path().join("copy");
    tree.backup(&copy).expect("backup");
    // A complete backup holds no marker; put one in, as a backup cut short leaves it.
    assert!(!copy.join("BACKUP-INCOMPLETE").exists());
    std::fs::write(copy.join("BACKUP-INCOMPLETE"), b"").expect("write");
    let before = listing(&copy);
    match Tree::open(Config::new(&copy)) {
        Err(Error::Corruption { file, reason, .. }) => {
            assert_eq!(file, copy.join("BACKUP-INCOMPLETE"));
            assert!(reason.contains("backup"), "{reason}");
        }
        other => panic!("expected Corruption, got {other:?}"),
    }
    assert_eq!(listing(&copy), before, "nothing was created or removed");
}

/// Rewrites the store format version of superblock slot `slot` of the data file in `dir`
/// to `version`, with a checksum that holds (as another version of bfkv would write it).
fn set_slot_version(dir: &Path, page_size: usize, slot: u64, version: u32) {
    let path = dir.join("data");
    let mut bytes = std::fs::read(&path).expect("read data");
    let at = slot as usize * page_size;
    let page = &mut bytes[at..at + page_size];
    assert_eq!(&page[8..16], b"BFKVSTOR", "a superblock");
    page[16..20].copy_from_slice(&version.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&slot.to_le_bytes()), &page[8..]);
    page[0..4].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&path, &bytes).expect("write data");
}

#[test]
fn one_superblock_slot_of_another_format_refuses_the_open() {
    let page_size = 8 << 10;
    for (slot, version) in [(0, 3), (1, 3), (0, 1), (1, u32::MAX)] {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("db");
        let config = Config::new(&dir).page_size(page_size);
        // Two checkpoints: both slots valid, each holding a state of the tree.
        let tree = Tree::open(config.clone()).expect("open");
        tree.insert(b"k", b"v").expect("insert");
        tree.checkpoint().expect("checkpoint");
        tree.insert(b"k2", b"v2").expect("insert");
        tree.close().expect("close");
        set_slot_version(&dir, page_size, slot, version);
        match Tree::open(config.clone()) {
            Err(Error::Corruption {
                file, page, reason, ..
            }) => {
                assert_eq!(file, dir.join("data"));
                assert_eq!(page, Some(slot), "slot {slot} version {version}");
                let expected = if version == 1 { "format 1" } else { "newer" };
                assert!(reason.contains(expected), "{reason}");
            }
            Ok(_) => panic!("slot {slot} of format {version}: opened from the other slot"),
            Err(other) => panic!("expected Corruption, got {other:?}"),
        }
    }
}

#[test]
fn a_damaged_superblock_slot_still_opens_from_the_other() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("db");
    let config = Config::new(&dir).page_size(8 << 10);
    let tree = Tree::open(config.clone()).expect("open");
    tree.insert(b"k", b"v").expect("insert");
    tree.checkpoint().expect("checkpoint");
    tree.close().expect("close");
    // A version field changed without the checksum: damage, not another format.
    let path = dir.join("data");
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[(8 << 10) + 16] ^= 0x04;
    std::fs::write(&path, &bytes).expect("write");
    let tree = Tree::open(config).expect("open from the intact slot");
    assert_eq!(tree.get(b"k").expect("get"), Some(b"v".to_vec()));
}

fn large(i: u8) -> Vec<u8> {
    (0..300_000u32).map(|j| (j as u8) ^ i).collect()
}

#[test]
fn a_deleted_blob_file_the_checkpoint_references_is_corruption_at_open() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("db");
    let tree = Tree::open(Config::new(&dir)).expect("open");
    tree.insert(b"small", b"v").expect("insert");
    for i in 0..3u8 {
        tree.insert([b'L', i], large(i)).expect("insert large");
    }
    tree.close().expect("close");
    std::fs::remove_file(dir.join("blobs")).expect("remove blobs");
    for _ in 0..2 {
        match Tree::open(Config::new(&dir)) {
            Err(Error::Corruption { file, .. }) => assert_eq!(file, dir.join("blobs")),
            other => panic!("expected Corruption naming the blob file, got {other:?}"),
        }
        assert!(!dir.join("blobs").exists(), "nothing made in its place");
    }
    // A tree that never stored a large value opens without its (empty) blob file.
    let plain = root.path().join("plain");
    let tree = Tree::open(Config::new(&plain)).expect("open");
    tree.insert(b"k", b"v").expect("insert");
    tree.close().expect("close");
    std::fs::remove_file(plain.join("blobs")).expect("remove blobs");
    let tree = Tree::open(Config::new(&plain)).expect("reopen");
    assert_eq!(tree.get(b"k").expect("get"), Some(b"v".to_vec()));
}

/// Copies the files of a tree's directory (and its `wal/`) but the lock: what a crash of
/// the tree at this moment leaves on disk, the page cache included.
fn crash_image(from: &Path, to: &Path) {
    for sub in ["", "wal"] {
        std::fs::create_dir_all(to.join(sub)).expect("mkdir");
        for e in std::fs::read_dir(from.join(sub)).expect("read_dir") {
            let e = e.expect("entry");
            if e.path().is_file() && e.file_name() != "LOCK" {
                std::fs::copy(e.path(), to.join(sub).join(e.file_name())).expect("copy");
            }
        }
    }
}

#[test]
fn a_deleted_blob_file_the_log_references_is_corruption_at_open() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("db");
    let config = Config::new(&dir).durability(Durability::Sync);
    let tree = Tree::open(config).expect("open");
    tree.insert(b"small", b"v").expect("insert");
    tree.insert(b"large", large(7)).expect("insert large");
    tree.flush().expect("flush");
    // The large value's reference is only in the log: no checkpoint has run since it.
    let image = root.path().join("image");
    crash_image(&dir, &image);
    drop(tree);
    // The image as it is recovers the value: the test's premise.
    let whole = root.path().join("whole");
    crash_image(&image, &whole);
    let tree = Tree::open(Config::new(&whole)).expect("open the image");
    assert_eq!(tree.get(b"large").expect("get"), Some(large(7)));
    drop(tree);
    std::fs::remove_file(image.join("blobs")).expect("remove blobs");
    for _ in 0..2 {
        match Tree::open(Config::new(&image)) {
            Err(Error::Corruption { file, .. }) => assert_eq!(file, image.join("blobs")),
            other => panic!("expected Corruption naming the blob file, got {other:?}"),
        }
        assert!(!image.join("blobs").exists(), "nothing left in its place");
    }
}
