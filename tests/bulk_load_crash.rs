//! `Tree::bulk_load` against `kill -9`: a child process (this test binary, re-executed)
//! writes a few keys of its own, flushes, and bulk-loads; the parent kills it before, during
//! or after the load, reopens the directory, and finds all of the load or none of it (all of
//! it once the call returned), and the child's own writes. A binary of its own: a test
//! beside it that closed and reopened a tree could find the directory's lock still held by
//! a child forked meanwhile (its copy of the descriptor lives until its `exec`).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use bfkv::{Config, Durability, Tree};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn value(i: u64) -> Vec<u8> {
    format!("v{i}-{}", "x".repeat((i % 29) as usize)).into_bytes()
}

const CHILD_ENV: &str = "BFKV_BULK_CRASH_CHILD";
/// Records of each child's load.
const CRASH_LOAD: u64 = 150_000;

/// Kill cycles, the durability modes in turn: 12; `BFKV_CRASH_CYCLES` asks for more
/// (docs/ARCHITECTURE.md, "Testing").
fn cycles() -> u64 {
    std::env::var("BFKV_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12)
}

fn crash_config(dir: &Path, cycle: u64) -> Config {
    let durability = [Durability::None, Durability::Buffered, Durability::Sync][cycle as usize % 3];
    Config::new(dir).cache_size(1 << 20).durability(durability)
}

fn crash_record(cycle: u64, i: u64) -> (Vec<u8>, Vec<u8>) {
    (
        format!("load-{cycle:03}-{i:06}").into_bytes(),
        value(i * 31 + cycle),
    )
}

/// The child: open (recovering), write a few keys of its own, flush, bulk-load, and report
/// `RETURNED` once the load returned.
fn child(spec: &str) -> ! {
    let (dir, cycle) = spec.split_once(',').expect("spec");
    let cycle: u64 = cycle.parse().expect("cycle");
    let tree = common::open_child(|| Tree::open(crash_config(dir.as_ref(), cycle)));
    for i in 0..100 {
        tree.insert(format!("a-{cycle:03}-{i:03}"), b"own")
            .expect("insert");
    }
    tree.flush().expect("flush");
    let mut out = std::io::stdout().lock();
    writeln!(out, "LOADING")
        .and_then(|()| out.flush())
        .expect("stdout");
    let n = tree.bulk_load((0..CRASH_LOAD).map(|i| crash_record(cycle, i)));
    assert_eq!(n.expect("bulk load"), CRASH_LOAD);
    writeln!(out, "RETURNED")
        .and_then(|()| out.flush())
        .expect("stdout");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn kill_9_during_a_load_leaves_all_of_it_or_none() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("test binary");
    let mut rng = StdRng::seed_from_u64(11);
    let (mut whole, mut none) = (0, 0);
    for cycle in 0..cycles() {
        let mut child = Command::new(&exe)
            .args([
                "kill_9_during_a_load_leaves_all_of_it_or_none",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, format!("{},{cycle}", dir.path().display()))
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn child");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let loading = lines
            .by_ref()
            .map_while(Result::ok)
            .any(|l| l.ends_with("LOADING"));
        assert!(loading, "cycle {cycle}: the child did not start its load");
        // The load takes about a hundred milliseconds: kill before, during or after it.
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..200)));
        child.kill().expect("kill -9");
        let _ = child.wait();
        let returned = lines.map_while(Result::ok).any(|l| l.ends_with("RETURNED"));
        let tree = Tree::open(crash_config(dir.path(), cycle)).expect("reopen after kill");
        let prefix = format!("load-{cycle:03}-");
        let found: Vec<_> = tree
            .range(prefix.as_bytes()..format!("load-{cycle:03}.").as_bytes())
            .map(|r| r.expect("scan"))
            .collect();
        if found.is_empty() {
            assert!(!returned, "cycle {cycle}: the load returned but is gone");
            none += 1;
        } else {
            let expected: Vec<_> = (0..CRASH_LOAD).map(|i| crash_record(cycle, i)).collect();
            assert!(
                found == expected,
                "cycle {cycle}: {} of {CRASH_LOAD} records",
                found.len()
            );
            whole += 1;
        }
        // The child's own writes were flushed before the load.
        for i in 0..100 {
            let own = tree.get(format!("a-{cycle:03}-{i:03}")).expect("get");
            assert_eq!(own.as_deref(), Some(&b"own"[..]), "cycle {cycle}");
        }
        tree.close().expect("close");
    }
    eprintln!("kills: {whole} with the whole load, {none} with none of it");
}
