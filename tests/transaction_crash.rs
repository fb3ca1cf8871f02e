//! Crash recovery by `kill -9` of a process committing transactions, under `Sync` and
//! `Buffered`. The child moves money between accounts with `Tree::transact` (two
//! balances and a history record per transfer, overdrafts refused) on two threads, and
//! reports each transfer's id once its commit returned. The parent kills it at a random
//! moment, reopens the directory and checks that the balances sum to the total (no
//! transfer torn), that every acknowledged transfer's history record is there, and that
//! the balances are exactly what the history records replayed give (no transfer applied
//! without its record, none twice). The child continues on the same directory across
//! cycles.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bfkv::{Config, Durability, Tree};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CHILD_ENV: &str = "BFKV_TRANSACTION_CRASH_CHILD";
const ACCOUNTS: u32 = 64;
const START: u64 = 1_000;

fn cycles() -> u64 {
    std::env::var("BFKV_CRASH_CYCLES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(15)
}

fn config(dir: &std::path::Path, mode: &str) -> Config {
    let durability = if mode == "sync" {
        Durability::Sync
    } else {
        Durability::Buffered
    };
    Config::new(dir)
        .cache_size(512 << 10)
        .durability(durability)
        .checkpoint_log_bytes(1 << 20)
}

fn num(v: &[u8]) -> u64 {
    u64::from_le_bytes(v.try_into().expect("8-byte balance"))
}

/// A history record: from, to (u32 BE each), amount (u64 LE).
fn record(from: u32, to: u32, amount: u64) -> Vec<u8> {
    [
        &from.to_be_bytes()[..],
        &to.to_be_bytes(),
        &amount.to_le_bytes(),
    ]
    .concat()
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
    let tree = Arc::new(common::open_child(|| {
        Tree::open(config(dir.as_ref(), &mode))
    }));
    let accounts = tree.keyspace("accounts").expect("keyspace");
    if accounts.iter().next().is_none() {
        let mut batch = tree.batch();
        for a in 0..ACCOUNTS {
            batch.insert(&accounts, a.to_be_bytes(), START.to_le_bytes());
        }
        batch.commit().expect("accounts");
    }
    let out = Arc::new(std::sync::Mutex::new(std::io::stdout()));
    {
        let mut o = out.lock().expect("stdout");
        writeln!(o, "OPEN")
            .and_then(|()| o.flush())
            .expect("stdout");
    }
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            let (tree, out) = (tree.clone(), out.clone());
            std::thread::spawn(move || {
                let accounts = tree.keyspace("accounts").expect("keyspace");
                let history = tree.keyspace("history").expect("keyspace");
                let mut rng = StdRng::seed_from_u64(cycle * 1000 + t);
                for n in 0u64.. {
                    let id = format!("{cycle:04}-{t}-{n:08}");
                    let from = rng.gen_range(0..ACCOUNTS);
                    let to = (from + rng.gen_range(1..ACCOUNTS)) % ACCOUNTS;
                    let amount = rng.gen_range(1..400);
                    let moved = tree
                        .transact(|tx| {
                            let a = num(&tx.get(&accounts, from.to_be_bytes())?.expect("account"));
                            if a < amount {
                                return Ok(false);
                            }
                            let b = num(&tx.get(&accounts, to.to_be_bytes())?.expect("account"));
                            tx.insert(&accounts, from.to_be_bytes(), (a - amount).to_le_bytes());
                            tx.insert(&accounts, to.to_be_bytes(), (b + amount).to_le_bytes());
                            tx.insert(&history, &id, record(from, to, amount));
                            Ok(true)
                        })
                        .expect("transfer");
                    if moved {
                        let mut o = out.lock().expect("stdout");
                        writeln!(o, "A {id}")
                            .and_then(|()| o.flush())
                            .expect("stdout");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    unreachable!("the parent kills this process")
}

fn run_cycles(mode: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("test binary");
    let test_name = format!("kill_9_keeps_every_acknowledged_transaction_whole_{mode}");
    let mut rng = StdRng::seed_from_u64(0x7A_C0DE ^ mode.len() as u64);
    let mut acked: BTreeSet<String> = BTreeSet::new();
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
        let lifetime = Duration::from_millis(rng.gen_range(50..500));
        let start = Instant::now();
        let mut note = |line: &str| {
            if let Some(id) = line.strip_prefix("A ") {
                acked.insert(id.to_string());
            }
        };
        while start.elapsed() < lifetime {
            match rx.recv_timeout(Duration::from_millis(5)) {
                Ok(line) => note(&line),
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
            note(&line);
        }
        check(dir.path(), mode, cycle, &acked);
    }
    assert!(!acked.is_empty(), "{mode}: no transfer was acknowledged");
}

/// The recovered tree: balances sum to the total, every acknowledged transfer is recorded,
/// and replaying the records from the starting balances gives exactly the balances.
fn check(dir: &std::path::Path, mode: &str, cycle: u64, acked: &BTreeSet<String>) {
    let start = Instant::now();
    let tree = loop {
        match Tree::open(config(dir, mode)) {
            Err(bfkv::Error::Locked { .. }) if start.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => break other.expect("reopen after kill"),
        }
    };
    let accounts = tree.keyspace("accounts").expect("keyspace");
    let history = tree.keyspace("history").expect("keyspace");
    let balances: BTreeMap<u32, u64> = accounts
        .iter()
        .map(|r| {
            let (k, v) = r.expect("scan accounts");
            (
                u32::from_be_bytes(k.try_into().expect("account key")),
                num(&v),
            )
        })
        .collect();
    if balances.is_empty() {
        // Killed before the accounts' batch was acknowledged: nothing else can be there.
        assert!(
            acked.is_empty() && history.iter().next().is_none(),
            "{mode} cycle {cycle}"
        );
        return;
    }
    assert_eq!(
        balances.len(),
        ACCOUNTS as usize,
        "{mode} cycle {cycle}: accounts"
    );
    let total: u64 = balances.values().sum();
    assert_eq!(
        total,
        START * u64::from(ACCOUNTS),
        "{mode} cycle {cycle}: a transfer was torn"
    );
    let mut replayed: BTreeMap<u32, u64> = (0..ACCOUNTS).map(|a| (a, START)).collect();
    let mut recorded = BTreeSet::new();
    for r in &history {
        let (id, v) = r.expect("scan history");
        let from = u32::from_be_bytes(v[0..4].try_into().expect("record"));
        let to = u32::from_be_bytes(v[4..8].try_into().expect("record"));
        let amount = num(&v[8..16]);
        *replayed.get_mut(&from).expect("account") -= amount;
        *replayed.get_mut(&to).expect("account") += amount;
        recorded.insert(String::from_utf8(id).expect("id"));
    }
    let lost: Vec<_> = acked.difference(&recorded).take(3).collect();
    assert!(
        lost.is_empty(),
        "{mode} cycle {cycle}: acknowledged transfers lost: {lost:?}"
    );
    assert_eq!(
        replayed, balances,
        "{mode} cycle {cycle}: balances differ from their history"
    );
    tree.close().expect("close");
}

#[test]
fn kill_9_keeps_every_acknowledged_transaction_whole_sync() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
    }
    run_cycles("sync");
}

#[test]
fn kill_9_keeps_every_acknowledged_transaction_whole_buffered() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
    }
    run_cycles("buffered");
}
