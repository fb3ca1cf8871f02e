//! Atomic batches survive `kill -9` whole or not at all, in every durability mode.
//!
//! A child process (this test binary, re-executed) commits batches of 1 to 300 writes over
//! two keyspaces, each batch drawn from a seed the parent knows, and reports each batch
//! before committing it and after it was acknowledged. The parent kills it at a random
//! moment and reopens the directory. The recovered state must be the state after some
//! number of whole batches: under `Sync` and `Buffered` every acknowledged one (and maybe
//! the one in flight); under `None`, whatever the last checkpoint held (a thread in the
//! child checkpoints every few milliseconds while batches commit). The cache is tiny, so
//! evictions, splits and checkpoints are cut by the kill too.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bfkv::{Config, Durability, Tree};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CHILD_ENV: &str = "BFKV_BATCH_CRASH_CHILD";
const SPACES: [&str; 2] = ["left", "right"];

/// Kill cycles per mode (`BFKV_CRASH_CYCLES` asks for more).
fn cycles() -> u64 {
    std::env::var("BFKV_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}

fn config(dir: &std::path::Path, mode: &str) -> Config {
    let config = Config::new(dir)
        .cache_size(256 << 10)
        .checkpoint_log_bytes(1 << 20);
    match mode {
        "sync" => config.durability(Durability::Sync),
        "buffered" => config.durability(Durability::Buffered),
        "none" => config.durability(Durability::None),
        other => panic!("unknown mode {other}"),
    }
}

/// One write of a batch: keyspace index, key, value (`None`: remove).
type W = (usize, String, Option<String>);

/// Batch `seq` of `cycle`: the same for the child that commits it and the parent that
/// checks it.
fn batch(cycle: u64, seq: u64) -> Vec<W> {
    let mut rng = StdRng::seed_from_u64(cycle << 32 | seq);
    let n = if rng.gen_ratio(1, 5) {
        rng.gen_range(50..300)
    } else {
        rng.gen_range(1..10)
    };
    (0..n)
        .map(|i| {
            let space = rng.gen_range(0..SPACES.len());
            let key = format!("key-{:05}", rng.gen_range(0..3000u32));
            let value = rng
                .gen_ratio(4, 5)
                .then(|| format!("c{cycle}-s{seq}-{i}-{}", "v".repeat(rng.gen_range(0..100))));
            (space, key, value)
        })
        .collect()
}

/// The model's state: keyspace index and key → value.
type Model = BTreeMap<(usize, String), String>;

fn apply(model: &mut Model, writes: &[W]) {
    for (s, k, v) in writes {
        match v {
            Some(v) => model.insert((*s, k.clone()), v.clone()),
            None => model.remove(&(*s, k.clone())),
        };
    }
}

fn child(spec: &str) -> ! {
    let mut parts = spec.split(',');
    let (dir, mode, cycle) = (
        parts.next().unwrap_or_default().to_string(),
        parts.next().unwrap_or_default().to_string(),
        parts
            .next()
            .and_then(|c| c.parse::<u64>().ok())
            .unwrap_or(0),
    );
    let tree = std::sync::Arc::new(common::open_child(|| {
        Tree::open(config(dir.as_ref(), &mode))
    }));
    let spaces: Vec<_> = SPACES
        .iter()
        .map(|n| tree.keyspace(n).expect("keyspace"))
        .collect();
    if mode == "none" {
        // Without a log only checkpoints persist: take them while batches commit.
        let tree = tree.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(3));
            tree.checkpoint().expect("child checkpoint");
        });
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "OPEN")
        .and_then(|()| out.flush())
        .expect("stdout");
    for seq in 0u64.. {
        let mut b = tree.batch();
        for (s, k, v) in batch(cycle, seq) {
            match v {
                Some(v) => b.insert(&spaces[s], k, v),
                None => b.remove(&spaces[s], k),
            }
        }
        writeln!(out, "P")
            .and_then(|()| out.flush())
            .expect("stdout");
        b.commit().expect("child commit");
        writeln!(out, "A")
            .and_then(|()| out.flush())
            .expect("stdout");
    }
    unreachable!("the parent kills this process")
}

fn recovered(tree: &Tree) -> Model {
    let mut got = Model::new();
    for (s, name) in SPACES.iter().enumerate() {
        for r in &tree.keyspace(name).expect("keyspace") {
            let (k, v) = r.expect("scan after recovery");
            got.insert(
                (s, String::from_utf8(k).expect("utf8")),
                String::from_utf8(v).expect("utf8"),
            );
        }
    }
    got
}

fn run_cycles(mode: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("test binary");
    let test_name = format!("kill_9_keeps_batches_whole_{mode}");
    let mut rng = StdRng::seed_from_u64(0xBA7C4 ^ mode.len() as u64);
    let mut model = Model::new();
    let (mut acknowledged_total, mut recovered_total) = (0u64, 0u64);
    for cycle in 0..cycles() {
        let mut child = Command::new(&exe)
            .args([
                test_name.as_str(),
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(
                CHILD_ENV,
                format!("{},{mode},{cycle}", dir.path().display()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().expect("child stdout");
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        loop {
            let line = rx
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("{mode} cycle {cycle}: child did not open"));
            if line.ends_with("OPEN") {
                break;
            }
        }
        let lifetime = Duration::from_millis(rng.gen_range(30..400));
        let start = Instant::now();
        let (mut started, mut acked) = (0u64, 0u64);
        let mut count = |line: &str| match line {
            "P" => started += 1,
            "A" => acked += 1,
            _ => {}
        };
        while start.elapsed() < lifetime {
            match rx.recv_timeout(Duration::from_millis(5)) {
                Ok(line) => count(&line),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("{mode} cycle {cycle}: child exited early")
                }
            }
        }
        child.kill().expect("kill -9");
        let _ = child.wait();
        let _ = reader.join();
        for line in rx.try_iter() {
            count(&line);
        }
        let tree = Tree::open(config(dir.path(), mode)).expect("reopen after kill");
        let got = recovered(&tree);
        // Which number of whole batches the recovered state is: the least allowed first.
        let least = if mode == "none" { 0 } else { acked };
        let mut state = model.clone();
        let mut matched = None;
        for seq in 0..=started {
            if seq >= least && state == got {
                matched = Some(seq);
                break;
            }
            if seq < started {
                apply(&mut state, &batch(cycle, seq));
            }
        }
        let Some(whole) = matched else {
            panic!(
                "{mode} cycle {cycle}: the recovered state is not the state after any number \
                 of whole batches from {least} to {started} ({acked} acknowledged)"
            );
        };
        acknowledged_total += acked;
        recovered_total += whole;
        model = got;
        tree.close().expect("close after verification");
    }
    assert!(
        acknowledged_total > 50,
        "{mode}: only {acknowledged_total} batches acknowledged"
    );
    if mode == "none" {
        assert!(recovered_total > 0, "none: no checkpoint ever held a batch");
    }
}

#[test]
fn kill_9_keeps_batches_whole_sync() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
    }
    run_cycles("sync");
}

#[test]
fn kill_9_keeps_batches_whole_buffered() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
    }
    run_cycles("buffered");
}

#[test]
fn kill_9_keeps_batches_whole_none() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
    }
    run_cycles("none");
}
