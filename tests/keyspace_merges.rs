//! A merge operator per keyspace: a counters keyspace adds, a log keyspace appends and the
//! default keyspace uses the tree's operator, in one tree and one batch; after a `kill -9`
//! the log's merges replay with each keyspace's own operator; a keyspace without an
//! operator (and no tree-wide one) refuses merges.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use bfkv::{Config, Durability, Error, Tree};

const CHILD_ENV: &str = "BFKV_KEYSPACE_MERGES_CHILD";
const ROUNDS: u64 = 300;

#[allow(clippy::unnecessary_wraps)] // the merge operator's signature
fn add(_key: &[u8], old: Option<&[u8]>, operand: &[u8]) -> Option<Vec<u8>> {
    let n = |b: Option<&[u8]>| {
        b.and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes)
    };
    Some((n(old) + n(Some(operand))).to_le_bytes().to_vec())
}

#[allow(clippy::unnecessary_wraps)] // the merge operator's signature
fn append(_key: &[u8], old: Option<&[u8]>, operand: &[u8]) -> Option<Vec<u8>> {
    Some([old.unwrap_or_default(), operand].concat())
}

#[allow(clippy::unnecessary_wraps)] // the merge operator's signature
fn keep_max(_key: &[u8], old: Option<&[u8]>, operand: &[u8]) -> Option<Vec<u8>> {
    Some(old.map_or(operand, |o| o.max(operand)).to_vec())
}

fn config(dir: &std::path::Path) -> Config {
    Config::new(dir)
        .cache_size(512 << 10)
        .durability(Durability::Sync)
        .merge_operator(keep_max)
        .keyspace_merge_operator("counters", add)
        .keyspace_merge_operator("log", append)
}

#[test]
fn each_keyspace_folds_with_its_own_operator() {
    let tree = Tree::open(Config::in_memory().keyspace_merge_operator("counters", add)).unwrap();
    let counters = tree.keyspace("counters").unwrap();
    let other = tree.keyspace("other").unwrap();
    counters.merge(b"n", 2u64.to_le_bytes()).unwrap();
    counters.merge(b"n", 3u64.to_le_bytes()).unwrap();
    assert_eq!(
        counters.get(b"n").unwrap(),
        Some(5u64.to_le_bytes().to_vec())
    );
    // No operator of its own and none for the tree: refused, nothing written.
    assert!(matches!(
        other.merge(b"n", b"x"),
        Err(Error::InvalidConfig { .. })
    ));
    assert!(matches!(
        tree.merge(b"n", b"x"),
        Err(Error::InvalidConfig { .. })
    ));
    let mut batch = tree.batch();
    batch.merge(&counters, b"n", 1u64.to_le_bytes());
    batch.merge(&other, b"n", b"x");
    assert!(matches!(batch.commit(), Err(Error::InvalidConfig { .. })));
    let mut batch = tree.batch();
    batch.merge(&counters, b"n", 1u64.to_le_bytes());
    batch.commit().unwrap();
    assert_eq!(
        counters.get(b"n").unwrap(),
        Some(6u64.to_le_bytes().to_vec())
    );
}

fn child(dir: &str) -> ! {
    let tree = common::open_child(|| Tree::open(config(dir.as_ref())));
    let (counters, log) = (
        tree.keyspace("counters").unwrap(),
        tree.keyspace("log").unwrap(),
    );
    let default = tree.default_keyspace();
    for i in 0..ROUNDS {
        let mut batch = tree.batch();
        batch.merge(&counters, b"c", 1u64.to_le_bytes());
        batch.merge(&log, b"l", [b'a' + (i % 26) as u8]);
        batch.merge(&default, b"m", i.to_be_bytes());
        batch.commit().expect("batch");
        counters
            .merge(format!("c{}", i % 7), 2u64.to_le_bytes())
            .expect("merge");
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "DONE")
        .and_then(|()| out.flush())
        .expect("stdout");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn each_keyspace_replays_with_its_own_operator_after_a_kill() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child(&dir);
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "each_keyspace_replays_with_its_own_operator_after_a_kill",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let done = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .any(|l| l.ends_with("DONE"));
    child.kill().unwrap();
    let _ = child.wait();
    assert!(done);
    let tree = common::open_child(|| Tree::open(config(dir.path())));
    let (counters, log) = (
        tree.keyspace("counters").unwrap(),
        tree.keyspace("log").unwrap(),
    );
    assert!(
        tree.stats().replayed > 0,
        "the merges came back from the log"
    );
    assert_eq!(
        counters.get(b"c").unwrap(),
        Some(ROUNDS.to_le_bytes().to_vec())
    );
    let want: Vec<u8> = (0..ROUNDS).map(|i| b'a' + (i % 26) as u8).collect();
    assert_eq!(log.get(b"l").unwrap(), Some(want));
    assert_eq!(
        tree.get(b"m").unwrap(),
        Some((ROUNDS - 1).to_be_bytes().to_vec())
    );
    let per: u64 = (0..7u64)
        .map(|k| num(counters.get(format!("c{k}")).unwrap()))
        .sum();
    assert_eq!(per, 2 * ROUNDS);
    tree.close().unwrap();
    // And once more after a clean close, from the checkpoint.
    let tree = Tree::open(config(dir.path())).unwrap();
    assert_eq!(
        tree.keyspace("counters").unwrap().get(b"c").unwrap(),
        Some(ROUNDS.to_le_bytes().to_vec())
    );
}

fn num(v: Option<Vec<u8>>) -> u64 {
    v.map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()))
}
