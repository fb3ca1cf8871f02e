//! Crash recovery by `kill -9`: a child process (this test binary, re-executed) writes under
//! `Durability::Sync` or `Buffered` and reports each operation before issuing it and after it
//! was acknowledged; the parent kills it at a random moment, reopens the directory and checks
//! that every acknowledged write (removals included) is there. The one operation in flight at
//! the kill may or may not have happened. The cache is tiny and checkpoints frequent, so
//! evictions, splits and checkpoints are interrupted too. `Buffered` runs three ways: with
//! the default staging ring, with a ring small enough that the writer fills it and writes
//! it out itself, and with no ring. Under `Durability::None` the child also flushes now and
//! then (reported like a write), and each key must hold its value at the last flush that
//! returned, or one it was given after it: a write is durable only once flushed, and the
//! leaves a crash interrupted in writing back may hold some later writes and not others.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bfkv::{Config, Durability, Tree};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CHILD_ENV: &str = "BFKV_CRASH_CHILD";
/// Kill cycles per mode: 40 (200 kills over the five modes, 40 under `Sync`, 120 under
/// `Buffered`, 40 under `None`); `BFKV_CRASH_CYCLES` asks for more (docs/ARCHITECTURE.md,
/// "Testing").
fn cycles() -> u64 {
    std::env::var("BFKV_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40)
}

/// The tree's configuration in mode `mode`: `sync`, `buffered` (records staged in the
/// default staging ring in the log directory), `buffered-small-ring` (a 64 KiB ring, which the writer fills
/// and writes out itself many times a second), `buffered-unstaged` (no ring: each write
/// `pwrite`s its record) or `none` (no log).
fn config(dir: &std::path::Path, mode: &str) -> Config {
    let config = Config::new(dir)
        .cache_size(256 << 10)
        .checkpoint_log_bytes(1 << 20);
    match mode {
        "sync" => config.durability(Durability::Sync),
        "buffered" => config.durability(Durability::Buffered),
        "buffered-small-ring" => config
            .durability(Durability::Buffered)
            .log_staging_size(64 << 10),
        "buffered-unstaged" => config.durability(Durability::Buffered).log_staging_size(0),
        "none" => config.durability(Durability::None),
        other => panic!("unknown mode {other}"),
    }
}

/// The child: open (recovering), then write forever, reporting `P op` before and `A` after
/// each acknowledged operation (under `none`, a flush now and then among them).
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
    let tree = common::open_child(|| Tree::open(config(dir.as_ref(), &mode)));
    let mut out = std::io::stdout().lock();
    writeln!(out, "OPEN")
        .and_then(|()| out.flush())
        .expect("stdout");
    let mut rng = StdRng::seed_from_u64(cycle);
    for seq in 0u64.. {
        let key = format!("key-{:05}", rng.gen_range(0..3000u32));
        if mode == "none" && rng.gen_ratio(1, 100) {
            writeln!(out, "P F")
                .and_then(|()| out.flush())
                .expect("stdout");
            tree.flush().expect("child flush");
        } else if rng.gen_ratio(1, 4) {
            writeln!(out, "P R {key}")
                .and_then(|()| out.flush())
                .expect("stdout");
            tree.remove(&key).expect("child remove");
        } else {
            let value = format!("c{cycle}-s{seq}-{}", "v".repeat(rng.gen_range(0..200)));
            writeln!(out, "P I {key} {value}")
                .and_then(|()| out.flush())
                .expect("stdout");
            tree.insert(&key, &value).expect("child insert");
        }
        writeln!(out, "A")
            .and_then(|()| out.flush())
            .expect("stdout");
    }
    unreachable!("the loop above never ends; the parent kills this process")
}

/// One operation as the child reported it.
#[derive(Clone, Debug)]
enum Op {
    Insert(String, String),
    Remove(String),
    Flush,
}

fn parse(line: &str) -> Option<Op> {
    let mut parts = line.splitn(4, ' ');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("P"), Some("I"), Some(k), Some(v)) => Some(Op::Insert(k.into(), v.into())),
        (Some("P"), Some("R"), Some(k), None) => Some(Op::Remove(k.into())),
        (Some("P"), Some("F"), None, None) => Some(Op::Flush),
        _ => None,
    }
}

fn apply(model: &mut BTreeMap<String, String>, op: &Op) {
    match op {
        Op::Insert(k, v) => {
            model.insert(k.clone(), v.clone());
        }
        Op::Remove(k) => {
            model.remove(k);
        }
        Op::Flush => {}
    }
}

/// What a tree without a log may recover to: each key's value at the last flush that
/// returned, or any value it was given since (`None`: removed).
#[derive(Default)]
struct Unlogged {
    flushed: BTreeMap<String, String>,
    since: BTreeMap<String, Vec<Option<String>>>,
}

impl Unlogged {
    /// `op` was acknowledged, and `model` is the state after it.
    fn acknowledged(&mut self, op: &Op, model: &BTreeMap<String, String>) {
        if matches!(op, Op::Flush) {
            self.flushed = model.clone();
            self.since.clear();
        } else {
            self.in_flight(op);
        }
    }

    /// `op` was issued: it may have happened (a flush in flight changes nothing: the state
    /// at its start is one the keys may hold already).
    fn in_flight(&mut self, op: &Op) {
        match op {
            Op::Insert(k, v) => self
                .since
                .entry(k.clone())
                .or_default()
                .push(Some(v.clone())),
            Op::Remove(k) => self.since.entry(k.clone()).or_default().push(None),
            Op::Flush => {}
        }
    }

    /// The first key of `got` that holds a value it may not hold.
    fn first_wrong<'a>(&'a self, got: &'a BTreeMap<String, String>) -> Option<&'a String> {
        let keys = got
            .keys()
            .chain(self.flushed.keys())
            .chain(self.since.keys());
        keys.into_iter().find(|&k| {
            let found = got.get(k);
            found != self.flushed.get(k)
                && !self
                    .since
                    .get(k)
                    .is_some_and(|vs| vs.iter().any(|v| v.as_ref() == found))
        })
    }
}

fn run_cycles(mode: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut model: BTreeMap<String, String> = BTreeMap::new();
    let exe = std::env::current_exe().expect("test binary");
    let test_name = if mode == "none" {
        "kill_9_keeps_every_flushed_write_none".to_string()
    } else {
        format!(
            "kill_9_loses_no_acknowledged_write_{}",
            mode.replace('-', "_")
        )
    };
    let mut rng = StdRng::seed_from_u64(0x00C0_FFEE ^ mode.len() as u64);
    let mut acknowledged_total = 0u64;
    let mut unlogged = Unlogged::default();
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
        let lifetime = Duration::from_millis(rng.gen_range(30..400));
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                match line {
                    Ok(l) => {
                        if tx.send(l).is_err() {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
        });
        // Wait for the child to have recovered (the test harness prints its own lines
        // first), then let it run for `lifetime`.
        loop {
            let line = rx
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("{mode} cycle {cycle}: child did not open"));
            if line.ends_with("OPEN") {
                break;
            }
        }
        let start = Instant::now();
        let mut pending: Option<Op> = None;
        while start.elapsed() < lifetime {
            match rx.recv_timeout(Duration::from_millis(5)) {
                Ok(line) if line == "A" => {
                    if let Some(op) = pending.take() {
                        apply(&mut model, &op);
                        unlogged.acknowledged(&op, &model);
                        acknowledged_total += 1;
                    }
                }
                Ok(line) => pending = parse(&line),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("{mode} cycle {cycle}: child exited early")
                }
            }
        }
        child.kill().expect("kill -9"); // SIGKILL on Unix
        let _ = child.wait();
        // Lines the child wrote before dying still count: drain them.
        let _ = reader.join();
        for line in rx.try_iter() {
            if line == "A" {
                if let Some(op) = pending.take() {
                    apply(&mut model, &op);
                    unlogged.acknowledged(&op, &model);
                    acknowledged_total += 1;
                }
            } else {
                pending = parse(&line);
            }
        }
        if let Some(op) = &pending {
            unlogged.in_flight(op);
        }
        if let Some(keep) = std::env::var_os("BFKV_CRASH_KEEP") {
            // The crashed directory, kept for a failure's post-mortem (one per mode).
            let keep = std::path::Path::new(&keep).join(mode);
            let _ = std::fs::remove_dir_all(&keep);
            copy_dir(dir.path(), &keep);
        }
        // Reopen: every acknowledged write must be there; the pending one may or may not.
        let tree = Tree::open(config(dir.path(), mode)).expect("reopen after kill");
        let mut with_pending = model.clone();
        if let Some(op) = &pending {
            apply(&mut with_pending, op);
        }
        let got: BTreeMap<String, String> = tree
            .iter()
            .map(|r| {
                let (k, v) = r.expect("scan after recovery");
                (
                    String::from_utf8(k).expect("utf8 key"),
                    String::from_utf8(v).expect("utf8 value"),
                )
            })
            .collect();
        if mode == "none" {
            if let Some(key) = unlogged.first_wrong(&got) {
                panic!(
                    "{mode} cycle {cycle}: {key} recovered as {:?}; at the last flush it was \
                     {:?}, and since given {:?}",
                    got.get(key),
                    unlogged.flushed.get(key),
                    unlogged.since.get(key)
                );
            }
        } else if got != model && got != with_pending {
            let missing: Vec<_> = model
                .iter()
                .filter(|(k, v)| got.get(*k) != Some(v))
                .take(5)
                .collect();
            let extra: Vec<_> = got
                .iter()
                .filter(|(k, v)| model.get(*k) != Some(v))
                .take(5)
                .collect();
            panic!(
                "{mode} cycle {cycle}: recovered state differs from the acknowledged writes \
                 (pending {pending:?}); first differences: expected {missing:?}, found {extra:?}"
            );
        }
        // Continue from what was recovered: that is the state the next child starts from
        // (durable once the tree is closed).
        tree.close().expect("close after verification");
        unlogged = Unlogged {
            flushed: got.clone(),
            since: BTreeMap::new(),
        };
        model = got;
    }
    assert!(
        acknowledged_total > 100,
        "{mode}: only {acknowledged_total} writes were acknowledged"
    );
}

#[test]
fn kill_9_loses_no_acknowledged_write_sync() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
    }
    run_cycles("sync");
}

#[test]
fn kill_9_loses_no_acknowledged_write_buffered() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
    }
    run_cycles("buffered");
}

#[test]
fn kill_9_loses_no_acknowledged_write_buffered_small_ring() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
    }
    run_cycles("buffered-small-ring");
}

#[test]
fn kill_9_loses_no_acknowledged_write_buffered_unstaged() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
    }
    run_cycles("buffered-unstaged");
}

#[test]
fn kill_9_keeps_every_flushed_write_none() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
    }
    run_cycles("none");
}

/// Copies directory `from` to `to`, recursively.
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        let target = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).expect("copy");
        }
    }
}
