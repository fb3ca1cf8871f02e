//! A backup target inside the tree's own directory is refused, however the path reaches
//! it (`..`, a symbolic link, a path that does not exist yet), and nothing is written:
//! neither the target nor any directory on the way to it. A target that exists is
//! `AlreadyExists`, inside the tree or not.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use bfkv::{Config, Error, Tree};

/// Every path under `dir`, relative to it, recursively.
fn listing(dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let path = e.expect("entry").path();
            if path.is_dir() && !path.is_symlink() {
                todo.push(path.clone());
            }
            out.insert(path.strip_prefix(dir).expect("prefix").to_path_buf());
        }
    }
    out
}

#[test]
fn a_target_inside_the_tree_is_refused_and_nothing_written() {
    let root = tempfile::tempdir().expect("tempdir");
    let db = root.path().join("db");
    let tree = Tree::open(Config::new(&db)).expect("open");
    for i in 0u32..1000 {
        tree.insert(i.to_be_bytes(), [1u8; 50]).expect("insert");
    }
    #[cfg_attr(not(unix), allow(unused_mut))]
    let mut targets = vec![
        db.join("wal").join("sub"),
        db.join("x"),
        db.join("new").join("deeper").join("x"),
        root.path()
            .join("elsewhere")
            .join("..")
            .join("db")
            .join("x"),
        db.join("gone").join("..").join("x"),
        db.join("wal").join("..").join("..").join("db").join("y"),
        root.path().join("db").join(".").join("z"),
    ];
    #[cfg(unix)]
    {
        // A link to the tree from outside it, and one to its log directory.
        std::os::unix::fs::symlink(&db, root.path().join("alias")).expect("symlink");
        std::os::unix::fs::symlink(db.join("wal"), root.path().join("log")).expect("symlink");
        targets.push(root.path().join("alias").join("x"));
        targets.push(root.path().join("log").join("x"));
        targets.push(root.path().join("alias").join("nope").join("..").join("x"));
    }
    let before_db = listing(&db);
    let before_root = listing(root.path());
    for target in &targets {
        match tree.backup(target) {
            Err(Error::InvalidInput { reason }) => {
                assert!(reason.contains("inside"), "{target:?}: {reason}");
            }
            other => panic!("{target:?}: expected InvalidInput, got {other:?}"),
        }
        assert!(!target.exists(), "{target:?} was made");
        assert_eq!(
            listing(&db),
            before_db,
            "{target:?}: the tree's directory changed"
        );
        assert_eq!(
            listing(root.path()),
            before_root,
            "{target:?}: something was made"
        );
    }
    // A target that exists answers as every existing target does, inside the tree too.
    for existing in [db.clone(), db.join("wal"), db.join("data")] {
        match tree.backup(&existing) {
            Err(Error::Io { source, .. }) => {
                assert_eq!(
                    source.kind(),
                    std::io::ErrorKind::AlreadyExists,
                    "{existing:?}"
                );
            }
            other => panic!("{existing:?}: expected AlreadyExists, got {other:?}"),
        }
        assert_eq!(
            listing(&db),
            before_db,
            "{existing:?}: the tree's directory changed"
        );
    }
    // The tree is unharmed, and a target beside it (through `..` from inside) is fine.
    let beside = db.join("wal").join("..").join("..").join("beside");
    tree.backup(&beside).expect("a backup beside the tree");
    let copy = Tree::open(Config::new(root.path().join("beside"))).expect("open copy");
    assert_eq!(
        copy.get(7u32.to_be_bytes()).expect("get"),
        Some(vec![1u8; 50])
    );
    assert_eq!(
        tree.get(7u32.to_be_bytes()).expect("get"),
        Some(vec![1u8; 50])
    );
}
