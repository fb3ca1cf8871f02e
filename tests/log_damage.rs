//! Damage in a log that a crash left unsealed: a child process (this test binary,
//! re-executed) inserts 3,000 keys, each acknowledged, and is killed with SIGKILL; then one
//! byte of the log is flipped and the directory reopened. Damage followed by records that
//! were acknowledged is `Err(Corruption)` naming the segment and the damaged record's
//! offset, never a log cut short there with every later record dropped.
//!
//! Three ways to leave the records unsealed: `Sync`, where every record was synced (and the
//! synced mark moved with each sync); `Buffered` with no staging ring and no sync in the
//! child's lifetime, where no mark covers any record and only the records that verify
//! after the damage tell it from a torn tail (a flip in the very last record looks exactly
//! like a torn tail and is cut; under `Sync` the last record was synced, so its damage is
//! reported too); and `Buffered` with every record still in the staging ring, where what
//! the appends published tells.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use bfkv::{Config, Durability, Error, Tree};

const CHILD_ENV: &str = "BFKV_LOG_DAMAGE_CHILD";
const KEYS: usize = 3000;

fn key(i: usize) -> String {
    format!("key-{i:05}")
}

fn value(i: usize) -> String {
    format!("value-{i:05}-{}", "v".repeat(i % 40))
}

fn config(dir: &Path, mode: &str) -> Config {
    let config = Config::new(dir);
    match mode {
        "sync" => config.durability(Durability::Sync),
        // Each write reaches the OS through `pwrite`; the first background sync would
        // come a minute after the open, long after the child is killed.
        "buffered" => config
            .durability(Durability::Buffered)
            .log_staging_size(0)
            .flush_interval(Duration::from_secs(60)),
        // Every record stays in the staging ring (`wal/staging`): nothing drains it into
        // the segments while the child runs.
        "buffered-ring" => config
            .durability(Durability::Buffered)
            .flush_interval(Duration::from_secs(60)),
        other => panic!("unknown mode {other}"),
    }
}

/// The child: insert every key, acknowledged one by one, then wait to be killed.
fn child(spec: &str) -> ! {
    let (dir, mode) = spec.split_once(',').expect("dir,mode");
    let tree = common::open_child(|| Tree::open(config(dir.as_ref(), mode)));
    for i in 0..KEYS {
        tree.insert(key(i), value(i)).expect("child insert");
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "DONE")
        .and_then(|()| out.flush())
        .expect("stdout");
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

/// Runs the child for `mode` in `dir` until it has acknowledged every insert, then kills
/// it with SIGKILL.
fn crash_after_inserts(test_name: &str, dir: &Path, mode: &str) {
    let exe = std::env::current_exe().expect("test binary");
    let mut child = Command::new(exe)
        .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{},{mode}", dir.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("child stdout");
    let done = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|line| line.ends_with("DONE"));
    child.kill().expect("kill -9"); // SIGKILL on Unix
    let _ = child.wait();
    assert!(done, "{mode}: the child did not finish its inserts");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// The log's one segment in `dir` and the end of its written bytes (after its last
/// non-zero byte; the rest is preallocated zeros).
fn segment(dir: &Path) -> (PathBuf, u64) {
    let mut segments: Vec<PathBuf> = std::fs::read_dir(dir.join("wal"))
        .expect("wal dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    assert_eq!(segments.len(), 1, "one segment: {segments:?}");
    let path = segments.remove(0);
    let bytes = std::fs::read(&path).expect("read segment");
    let end = bytes.iter().rposition(|&b| b != 0).expect("records") as u64 + 1;
    (path, end)
}

fn flip(path: &Path, at: u64) {
    let mut bytes = std::fs::read(path).expect("read");
    bytes[at as usize] ^= 0x20;
    std::fs::write(path, bytes).expect("write");
}

/// A copy of the crashed tree in `crashed` with the byte at `at` of its log flipped.
fn damaged_copy(crashed: &Path, at: impl Fn(u64) -> u64) -> (tempfile::TempDir, PathBuf, u64) {
    let copy = tempfile::tempdir().expect("tempdir");
    copy_dir(crashed, copy.path());
    let (seg, end) = segment(copy.path());
    let at = at(end);
    flip(&seg, at);
    (copy, seg, at)
}

/// Every record of this test is shorter than this.
const RECORD_MAX: u64 = 100;

/// Flips at 20 %, 50 % and 80 % of the log: each reopen is `Err(Corruption)` naming the
/// segment and an offset at most a record before the flip.
fn damage_in_the_log_is_reported(crashed: &Path, mode: &str) {
    let records = 64; // the segment header
    for percent in [20, 50, 80] {
        let (copy, seg, at) =
            damaged_copy(crashed, |end| records + (end - records) * percent / 100);
        match Tree::open(config(copy.path(), mode)) {
            Err(Error::Corruption {
                file,
                offset: Some(offset),
                ..
            }) => {
                assert_eq!(file, seg, "{mode} {percent} %");
                assert!(
                    offset <= at && at - offset < RECORD_MAX,
                    "{mode} {percent} %: damage at {at} reported at {offset}"
                );
            }
            Err(e) => panic!("{mode} {percent} %: {e:?}"),
            Ok(tree) => {
                let kept = tree.iter().count();
                panic!("{mode} {percent} %: opened with {kept} of {KEYS} keys");
            }
        }
    }
}

/// Two bytes before the log's end: in the last record.
fn in_the_last_record(end: u64) -> u64 {
    end - 2
}

#[test]
fn damage_in_a_crashed_sync_log_is_reported_never_cut() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
    }
    let crashed = tempfile::tempdir().expect("tempdir");
    crash_after_inserts(
        "damage_in_a_crashed_sync_log_is_reported_never_cut",
        crashed.path(),
        "sync",
    );
    damage_in_the_log_is_reported(crashed.path(), "sync");
    // The last record was synced before its insert returned: its damage is no torn tail.
    let (copy, seg, _) = damaged_copy(crashed.path(), in_the_last_record);
    match Tree::open(config(copy.path(), "sync")) {
        Err(Error::Corruption { file, .. }) => assert_eq!(file, seg),
        other => panic!("the last synced record damaged: {:?}", other.map(|_| ())),
    }
    // Undamaged, every key is there.
    let tree = Tree::open(config(crashed.path(), "sync")).expect("reopen");
    assert_eq!(tree.iter().count(), KEYS);
}

#[test]
fn damage_in_a_crashed_unsynced_log_is_reported_and_only_a_torn_tail_is_cut() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
    }
    let crashed = tempfile::tempdir().expect("tempdir");
    crash_after_inserts(
        "damage_in_a_crashed_unsynced_log_is_reported_and_only_a_torn_tail_is_cut",
        crashed.path(),
        "buffered",
    );
    damage_in_the_log_is_reported(crashed.path(), "buffered");
    // A flip in the very last record: nothing verifies after it, so it is a torn tail,
    // cut, and every other key is there.
    let (copy, _, _) = damaged_copy(crashed.path(), in_the_last_record);
    let tree = Tree::open(config(copy.path(), "buffered")).expect("a torn-tail look-alike opens");
    assert_eq!(tree.iter().count(), KEYS - 1);
    assert_eq!(tree.get(key(KEYS - 1)).expect("get"), None);
    for i in [0, KEYS / 2, KEYS - 2] {
        assert_eq!(
            tree.get(key(i)).expect("get"),
            Some(value(i).into_bytes()),
            "key {i}"
        );
    }
}

#[test]
fn damage_in_a_crashed_staging_ring_is_reported_never_cut() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
    }
    let crashed = tempfile::tempdir().expect("tempdir");
    crash_after_inserts(
        "damage_in_a_crashed_staging_ring_is_reported_never_cut",
        crashed.path(),
        "buffered-ring",
    );
    let ring = crashed.path().join("wal/staging");
    let bytes = std::fs::read(&ring).expect("staging ring");
    // The ring's bytes start at the page after its header; the records from there on.
    let data = 4096u64;
    let end = bytes.iter().rposition(|&b| b != 0).expect("records") as u64 + 1;
    assert!(end > data + 100_000, "the records are in the ring");
    for percent in [20, 50, 80] {
        let copy = tempfile::tempdir().expect("tempdir");
        copy_dir(crashed.path(), copy.path());
        let at = data + (end - data) * percent / 100;
        let staged = copy.path().join("wal/staging");
        flip(&staged, at);
        match Tree::open(config(copy.path(), "buffered-ring")) {
            Err(Error::Corruption {
                file,
                offset: Some(offset),
                ..
            }) => {
                assert_eq!(file, staged, "{percent} %");
                assert!(
                    offset <= at && at - offset < RECORD_MAX,
                    "{percent} %: damage at {at} reported at {offset}"
                );
            }
            Err(e) => panic!("{percent} %: {e:?}"),
            Ok(tree) => {
                let kept = tree.iter().count();
                panic!("ring {percent} %: opened with {kept} of {KEYS} keys");
            }
        }
    }
    let tree = Tree::open(config(crashed.path(), "buffered-ring")).expect("reopen");
    assert_eq!(tree.iter().count(), KEYS);
}
