//! Hostile surroundings (DESIGN.md, "Bad input and faults"): every file bfkv keeps is in its
//! directory and private to its user, and files planted or loosened by someone else are
//! refused at open, promptly, rather than trusted.
#![cfg(unix)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bfkv::{Config, Durability, Error, Tree};

/// Every file and directory under `dir`, `dir` included.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        if out[i].is_dir() {
            for e in fs::read_dir(&out[i]).expect("read_dir") {
                out.push(e.expect("entry").path());
            }
        }
        i += 1;
    }
    out
}

/// The names in `/dev/shm`, where bfkv once kept its staging ring.
fn shm_names() -> Vec<String> {
    fs::read_dir("/dev/shm").map_or_else(
        |_| Vec::new(),
        |d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with("bfkv"))
                .collect()
        },
    )
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).expect("meta").permissions().mode() & 0o777
}

#[test]
fn a_buffered_tree_keeps_everything_in_its_directory_owner_only() {
    let before = shm_names();
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("db");
    let tree = Tree::open(Config::new(&dir).durability(Durability::Buffered)).expect("open");
    for i in 0..5000u32 {
        tree.insert(i.to_be_bytes(), [1u8; 16]).expect("insert");
    }
    tree.checkpoint().expect("checkpoint");
    for i in 5000..6000u32 {
        tree.insert(i.to_be_bytes(), [2u8; 16]).expect("insert");
    }
    // Running: the staging file is in the log directory, nothing of bfkv in /dev/shm.
    assert_eq!(shm_names(), before, "bfkv created files in /dev/shm");
    if cfg!(target_os = "linux") {
        assert!(dir.join("wal").join("staging").is_file());
    }
    for p in walk(&dir) {
        let want = if p.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(mode(&p), want, "{}", p.display());
    }
    // A crash: the staged records come back from the directory alone, even moved elsewhere.
    std::mem::forget(tree);
    let moved = root.path().join("moved");
    copy_dir(&dir, &moved);
    let tree = Tree::open(Config::new(&moved)).expect("reopen the copy");
    for i in 0..6000u32 {
        let want = if i < 5000 { [1u8; 16] } else { [2u8; 16] };
        assert_eq!(tree.get(i.to_be_bytes()).expect("get"), Some(want.to_vec()));
    }
    tree.close().expect("close");
    assert_eq!(shm_names(), before);
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("mkdir");
    for e in fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        let target = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &target);
        } else if e.file_name() != "LOCK" {
            fs::copy(e.path(), &target).expect("copy");
        }
    }
}

/// Opens `dir`, which must fail with an error (not hang, not succeed) within a few seconds.
fn refused(dir: &Path, what: &str) -> Error {
    let (tx, rx) = std::sync::mpsc::channel();
    let config = Config::new(dir);
    std::thread::spawn(move || {
        let _ = tx.send(Tree::open(config).map(Tree::close));
    });
    let started = Instant::now();
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(Err(e)) => e,
        Ok(Ok(_)) => panic!("{what}: open succeeded"),
        Err(timeout) => panic!("{what}: open hung for {:?} ({timeout})", started.elapsed()),
    }
}

/// A closed tree in a fresh directory, with some data.
fn closed_tree() -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("tempdir");
    let tree = Tree::open(Config::new(root.path())).expect("open");
    for i in 0..100u32 {
        tree.insert(i.to_be_bytes(), b"v").expect("insert");
    }
    tree.close().expect("close");
    root
}

#[test]
fn planted_or_loosened_files_are_refused_at_open() {
    // A FIFO where the staging ring goes: an error, not a hang.
    let root = closed_tree();
    let staging = root.path().join("wal").join("staging");
    let c = std::ffi::CString::new(staging.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: mkfifo reads the NUL-terminated path only.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    assert!(matches!(refused(root.path(), "fifo"), Error::Io { .. }));

    // A symbolic link to another file as the staging ring.
    let root = closed_tree();
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let planted = elsewhere.path().join("records");
    fs::write(&planted, vec![0u8; 1 << 16]).expect("plant");
    let staging = root.path().join("wal").join("staging");
    std::os::unix::fs::symlink(&planted, &staging).expect("symlink");
    assert!(matches!(refused(root.path(), "symlink"), Error::Io { .. }));

    // A data file, a log segment or a checkpoint that others may write.
    for victim in ["data", "checkpoint", "wal-segment"] {
        let root = closed_tree();
        let path = if victim == "wal-segment" {
            let wal = root.path().join("wal");
            fs::read_dir(&wal)
                .expect("wal dir")
                .map(|e| e.expect("entry").path())
                .find(|p| p.extension().is_some_and(|x| x == "log"))
                .expect("a segment")
        } else {
            root.path().join(victim)
        };
        fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).expect("chmod");
        let e = refused(root.path(), victim);
        assert!(
            matches!(&e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied),
            "{victim}: {e:?}"
        );
        // Put right by its owner, the tree opens again with its data.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod");
        let tree = Tree::open(Config::new(root.path())).expect("reopen");
        assert_eq!(
            tree.get(7u32.to_be_bytes()).expect("get"),
            Some(b"v".to_vec())
        );
    }
}
