//! Merges survive `kill -9` exactly once, in every durability mode.
//!
//! A child process (this test binary, re-executed) counts with merges of a u64 add: single
//! merges and batches of 1 to 40 merges over 20,000 counters in two keyspaces, each step
//! drawn from a seed the parent knows. It reports each step before it starts and after it
//! was acknowledged, while a thread checkpoints every few milliseconds (so leaf images that
//! already hold merges logged after the checkpoint's LSN are on disk when the kill comes).
//! The parent kills it at a random moment and reopens the directory. Under `Sync` and
//! `Buffered` the counters must equal their counts after some number of whole steps, at
//! least every acknowledged one: no merge lost, none counted twice. Under `None` (what the
//! last checkpoint held, taken leaf by leaf while merges go on) each counter must equal its
//! count after some number of its own merges. Before each check the directory is opened
//! without the merge operator: a log holding merges must refuse to open then. The cache is tiny, so the
//! operands are folded by evictions and checkpoints all the time.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bfkv::{Config, Durability, Tree};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CHILD_ENV: &str = "BFKV_MERGE_CRASH_CHILD";
const SPACES: [&str; 2] = ["hits", "bytes"];
const COUNTERS: u32 = 20_000;

/// Kill cycles per mode (`BFKV_CRASH_CYCLES` asks for more).
fn cycles() -> u64 {
    std::env::var("BFKV_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}

/// The u64 add merge operator; an empty operand resets the counter (removes it).
fn add(_key: &[u8], old: Option<&[u8]>, operand: &[u8]) -> Option<Vec<u8>> {
    if operand.is_empty() {
        return None;
    }
    let n = |b: Option<&[u8]>| {
        b.and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes)
    };
    Some((n(old) + n(Some(operand))).to_le_bytes().to_vec())
}

fn config(dir: &std::path::Path, mode: &str) -> Config {
    bare_config(dir, mode).merge_operator(add)
}

/// `config` without the merge operator.
fn bare_config(dir: &std::path::Path, mode: &str) -> Config {
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

/// One merge of a step: keyspace index, counter, amount.
type M = (usize, String, u64);

/// Step `seq` of `cycle` (a single merge, or a batch of merges when it has more than one):
/// the same for the child and the parent.
fn step(cycle: u64, seq: u64) -> Vec<M> {
    let mut rng = StdRng::seed_from_u64(cycle << 32 | seq);
    let n = if rng.gen_ratio(1, 3) {
        rng.gen_range(1..40)
    } else {
        1
    };
    let mut merges: Vec<M> = Vec::with_capacity(n);
    for _ in 0..n {
        // Now and then the same counter again within a batch.
        let m = match merges.last() {
            Some(last) if rng.gen_ratio(1, 6) => last.clone(),
            _ => (
                rng.gen_range(0..SPACES.len()),
                format!("counter-{:05}", rng.gen_range(0..COUNTERS)),
                rng.gen_range(1..1000),
            ),
        };
        merges.push(m);
    }
    merges
}

/// Keyspace index and counter → count.
type Model = BTreeMap<(usize, String), u64>;

fn apply(model: &mut Model, merges: &[M]) {
    for (s, k, n) in merges {
        *model.entry((*s, k.clone())).or_default() += n;
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
    {
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
        let merges = step(cycle, seq);
        writeln!(out, "P")
            .and_then(|()| out.flush())
            .expect("stdout");
        if let [(s, k, n)] = &merges[..] {
            spaces[*s].merge(k, n.to_le_bytes()).expect("child merge");
        } else {
            let mut b = tree.batch();
            for (s, k, n) in &merges {
                b.merge(&spaces[*s], k, n.to_le_bytes());
            }
            b.commit().expect("child commit");
        }
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
            let v: [u8; 8] = v.try_into().expect("a counter is 8 bytes");
            got.insert(
                (s, String::from_utf8(k).expect("utf8")),
                u64::from_le_bytes(v),
            );
        }
    }
    got
}

/// Under `Sync` and `Buffered`: `got` is `model` after some number of whole steps, at least
/// the `acked` acknowledged ones, at most the `started` ones.
fn check_whole_steps(model: &Model, got: &Model, mode: &str, cycle: u64, acked: u64, started: u64) {
    let mut state = model.clone();
    for seq in 0..=started {
        if seq >= acked && state == *got {
            return;
        }
        if seq < started {
            apply(&mut state, &step(cycle, seq));
        }
    }
    let mut acked_state = model.clone();
    for seq in 0..acked {
        apply(&mut acked_state, &step(cycle, seq));
    }
    let diff: Vec<_> = acked_state
        .iter()
        .filter(|(k, v)| got.get(*k) != Some(*v))
        .take(5)
        .map(|(k, v)| (k.clone(), *v, got.get(k).copied()))
        .collect();
    panic!(
        "{mode} cycle {cycle}: the counters are not the counts after any number of whole \
         steps from {acked} to {started} ({acked} acknowledged); against the acknowledged \
         ones, (counter, expected, recovered): {diff:?}"
    );
}

/// Under `None` a checkpoint is taken leaf by leaf while single merges go on, so the
/// recovered tree is no single point of the sequence; but each counter must hold its count
/// after some number of its own merges (with random amounts, a merge counted twice or lost
/// lands off that list).
fn check_each_counter(model: &Model, got: &Model, cycle: u64, started: u64) {
    let mut allowed: BTreeMap<(usize, String), Vec<u64>> = BTreeMap::new();
    let mut state = model.clone();
    for seq in 0..started {
        let merges = step(cycle, seq);
        for (s, k, _) in &merges {
            let start = model.get(&(*s, k.clone())).copied().unwrap_or(0);
            allowed
                .entry((*s, k.clone()))
                .or_insert_with(|| vec![start]);
        }
        apply(&mut state, &merges);
        for (s, k, _) in &merges {
            let key = (*s, k.clone());
            allowed
                .get_mut(&key)
                .expect("added above")
                .push(state[&key]);
        }
    }
    for key in state.keys().chain(got.keys()) {
        let recovered = got.get(key).copied().unwrap_or(0);
        let ok = match allowed.get(key) {
            Some(values) => values.contains(&recovered),
            None => model.get(key).copied().unwrap_or(0) == recovered,
        };
        assert!(
            ok,
            "none cycle {cycle}: counter {key:?} recovered as {recovered}, not a count after \
             any number of its merges ({:?})",
            allowed.get(key)
        );
    }
}

fn run_cycles(mode: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("test binary");
    let test_name = format!("kill_9_counts_every_merge_once_{mode}");
    let mut rng = StdRng::seed_from_u64(0x3E29E ^ mode.len() as u64);
    let mut model = Model::new();
    let mut acknowledged_total = 0u64;
    let mut refused = 0u64;
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
        // Without the operator, a log that holds merges does not open (and nothing changes).
        match Tree::open(bare_config(dir.path(), mode)) {
            Err(bfkv::Error::InvalidConfig { .. }) => refused += 1,
            Err(e) => panic!("{mode} cycle {cycle}: open without the operator: {e}"),
            Ok(tree) => tree.close().expect("close"),
        }
        let tree = Tree::open(config(dir.path(), mode)).expect("reopen after kill");
        let got = recovered(&tree);
        if mode == "none" {
            check_each_counter(&model, &got, cycle, started);
        } else {
            check_whole_steps(&model, &got, mode, cycle, acked, started);
        }
        acknowledged_total += acked;
        model = got;
        tree.close().expect("close after verification");
    }
    assert!(
        acknowledged_total > 50,
        "{mode}: only {acknowledged_total} steps acknowledged"
    );
    if mode != "none" {
        assert!(refused > 0, "{mode}: no log with merges was left to refuse");
    }
}

#[test]
fn kill_9_counts_every_merge_once_sync() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
    }
    run_cycles("sync");
}

#[test]
fn kill_9_counts_every_merge_once_buffered() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
    }
    run_cycles("buffered");
}

#[test]
fn kill_9_counts_every_merge_once_none() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
    }
    run_cycles("none");
}
