//! `Tree::backup` against `kill -9`: a child process (this test binary, re-executed) opens
//! a tree of 20,000 keys and one large value and backs it up into a new directory; the
//! parent kills it at a sweep of moments after the call starts (0 to 400 ms, and once
//! after it returned). Each target must be absent, refuse to open (a backup cut short
//! holds its marker), or hold everything: all 20,000 keys and the large value. Never a
//! tree that opens with part of it, or none. The source itself recovers whole each time.
//! A binary of its own: the parent opens the targets while children fork (`tests/common`).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use bfkv::{Config, Error, Tree};

const CHILD_ENV: &str = "BFKV_BACKUP_CRASH_CHILD";
/// Keys of the source tree, besides the large value.
const KEYS: u32 = 20_000;
/// Records of another keyspace, so that the copy takes some 200 ms.
const FILLER: u32 = 300_000;

fn config(dir: &Path) -> Config {
    Config::new(dir).cache_size(4 << 20)
}

fn value(i: u32) -> Vec<u8> {
    format!("value-{i}-{}", "v".repeat((i % 61) as usize)).into_bytes()
}

/// The large value: stored out of line, in the blob file.
fn large() -> Vec<u8> {
    (0..8u32 << 20)
        .map(|j| (j.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

/// Kill points, in ms after the child reported the call: 9 from 0 to 400 ms by default;
/// `BFKV_CRASH_CYCLES=n` asks for `n` (docs/ARCHITECTURE.md, "Testing").
fn delays() -> Vec<u64> {
    let n = std::env::var("BFKV_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(9)
        .max(2);
    (0..n).map(|i| i * 400 / (n - 1)).collect()
}

/// The child: open the source, report `BACKUP`, back it up, report `DONE`, wait.
fn child(spec: &str) -> ! {
    let (source, target) = spec.split_once(',').expect("spec");
    let tree = common::open_child(|| Tree::open(config(source.as_ref())));
    let mut out = std::io::stdout().lock();
    writeln!(out, "BACKUP")
        .and_then(|()| out.flush())
        .expect("stdout");
    let start = std::time::Instant::now();
    tree.backup(target).expect("child backup");
    writeln!(out, "DONE in {:?}", start.elapsed())
        .and_then(|()| out.flush())
        .expect("stdout");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// What a target held after the kill.
enum Found {
    Absent,
    Refused,
    Whole,
}

/// Checks the target `dir`: absent, refused as an unfinished backup, or holding every key
/// and the large value (anything else panics).
fn check(dir: &Path, what: &str, large: &[u8]) -> Found {
    if !dir.exists() {
        return Found::Absent;
    }
    let tree = match Tree::open(config(dir)) {
        Ok(tree) => tree,
        Err(Error::Corruption { file, .. }) if file.ends_with("BACKUP-INCOMPLETE") => {
            return Found::Refused
        }
        Err(e) => panic!("{what}: the target neither opens nor says it is unfinished: {e}"),
    };
    let mut n = 0u32;
    for r in tree.range(..b"large".as_slice()) {
        let (k, v) = r.unwrap_or_else(|e| panic!("{what}: scan: {e}"));
        let i = u32::from_be_bytes(k.as_slice().try_into().expect("a 4-byte key"));
        assert_eq!(v, value(i), "{what}: key {i}");
        n += 1;
    }
    let got = tree
        .get(b"large")
        .unwrap_or_else(|e| panic!("{what}: get: {e}"));
    assert!(
        n == KEYS && got.as_deref() == Some(large),
        "{what}: the target opened with {n} of {KEYS} keys and the large value {}",
        if got.as_deref() == Some(large) {
            "whole"
        } else {
            "missing or wrong"
        }
    );
    tree.close().expect("close target");
    Found::Whole
}

#[test]
fn kill_9_during_a_backup_leaves_no_target_that_opens_partial() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
    }
    let root = tempfile::tempdir().expect("tempdir");
    let source = root.path().join("source");
    let large = large();
    {
        let tree = Tree::open(config(&source)).expect("open source");
        for i in 0..KEYS {
            tree.insert(i.to_be_bytes(), value(i)).expect("insert");
        }
        tree.insert(b"large", &large).expect("insert large");
        // Enough data besides that the copy takes a while.
        let filler = tree.keyspace("filler").expect("keyspace");
        let records = (0..FILLER).map(|i| (i.to_be_bytes(), [7u8; 100]));
        assert_eq!(
            filler.bulk_load(records).expect("bulk load"),
            u64::from(FILLER)
        );
        tree.close().expect("close source");
    }
    let exe = std::env::current_exe().expect("test binary");
    let (mut absent, mut refused, mut whole) = (0, 0, 0);
    // `None`: killed only once the call returned.
    let points = delays().into_iter().map(Some).chain([None]);
    for (cycle, delay) in points.enumerate() {
        let target = root.path().join("backups").join(format!("t{cycle}"));
        let mut child = Command::new(&exe)
            .args([
                "kill_9_during_a_backup_leaves_no_target_that_opens_partial",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(
                CHILD_ENV,
                format!("{},{}", source.display(), target.display()),
            )
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn child");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout"))
            .lines()
            .map_while(Result::ok);
        assert!(
            lines.by_ref().any(|l| l.ends_with("BACKUP")),
            "cycle {cycle}: the child did not start its backup"
        );
        if let Some(ms) = delay {
            std::thread::sleep(Duration::from_millis(ms));
        } else {
            let done = lines.by_ref().find(|l| l.starts_with("DONE"));
            let done = done.unwrap_or_else(|| panic!("cycle {cycle}: no return"));
            eprintln!("the backup took {}", &done["DONE in ".len()..]);
        }
        child.kill().expect("kill -9");
        let _ = child.wait();
        let returned = delay.is_none() || lines.any(|l| l.starts_with("DONE"));
        let what = format!("cycle {cycle} (killed at {delay:?} ms, returned: {returned})");
        match check(&target, &what, &large) {
            Found::Absent => {
                assert!(
                    !returned,
                    "{what}: the backup returned but its target is gone"
                );
                absent += 1;
            }
            Found::Refused => {
                assert!(!returned, "{what}: the backup returned but is refused");
                refused += 1;
            }
            Found::Whole => whole += 1,
        }
    }
    assert!(whole >= 1, "the backup that returned must open whole");
    // The source, killed each time in the middle of its backup, recovers whole.
    assert!(matches!(check(&source, "source", &large), Found::Whole));
    eprintln!("targets: {absent} absent, {refused} refused as unfinished, {whole} whole");
}
