//! The log across real process deaths: a child process (this test binary re-executed)
//! appends and commits under `Sync` and `Buffered`, printing each acknowledged record; the
//! parent SIGKILLs it at random points and checks every acknowledged record replays. A
//! second child runs four writer threads, so kills land while records are reserved but not
//! yet written, and segment switches are waiting for them.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{LogOp, Wal, WalConfig};
use crate::Durability;

fn config(durability: Durability) -> WalConfig {
    WalConfig {
        segment_size: 16384,
        durability,
        flush_interval: Duration::from_millis(5),
        // Small, so that writers also fill it and write it out themselves.
        ring_capacity: 64 << 10,
    }
}

/// Environment variable that turns `sigkill_child` into the writer process.
const CHILD_ENV: &str = "BFKV_WAL_SIGKILL_CHILD";

/// Appends an insert of `key` and `value` and waits until it is acknowledged.
fn insert_and_commit(wal: &Wal, key: &[u8], value: &[u8]) {
    let appended = wal.append(LogOp::Insert { key, value }).expect("append");
    wal.commit(appended).expect("commit");
}

fn child_value(i: u64) -> Vec<u8> {
    vec![(i % 251) as u8; (i % 97) as usize]
}

/// Not a test by itself: run by `committed_records_survive_sigkill` in a child process, it
/// continues the log in the given directory, printing `ack <i>` after each commit returns,
/// until it is killed.
#[test]
fn sigkill_child() {
    let Some(spec) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let spec = spec.into_string().expect("utf-8 spec");
    let (mode, dir) = spec.split_once(':').expect("mode:dir");
    let durability = if mode == "sync" {
        Durability::Sync
    } else {
        Durability::Buffered
    };
    let wal = Wal::open(Path::new(dir), config(durability)).expect("child open");
    let mut next = 0u64;
    wal.replay(0, |_, _| {
        next += 1;
        Ok(())
    })
    .expect("child replay");
    for i in next.. {
        insert_and_commit(&wal, &i.to_be_bytes(), &child_value(i));
        println!("ack {i}");
    }
}

/// Runs the child test `name` with `env` set to `value`, passes the text after `ack ` of
/// each acknowledgement it prints to `on_ack`, and SIGKILLs it after the `kill_after`-th.
/// Checks that it was killed, not that it ended by itself first.
fn kill_child_after(
    name: &str,
    env: &str,
    value: &std::ffi::OsStr,
    kill_after: u64,
    mut on_ack: impl FnMut(&str),
) {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", name, "--nocapture"])
        .env(env, value)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("stdout");
    let mut seen = 0u64;
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("child output");
        if let Some(ack) = line.strip_prefix("ack ") {
            on_ack(ack);
            seen += 1;
            if seen == kill_after {
                child.kill().expect("SIGKILL");
            }
        }
    }
    assert!(!child.wait().expect("wait").success(), "{name}: not killed");
    assert!(seen >= kill_after, "{name}: the child died early");
}

#[test]
fn committed_records_survive_sigkill() {
    let mut rng = StdRng::seed_from_u64(12);
    for mode in ["sync", "buffered"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut acked: Option<u64> = None;
        for cycle in 0..6 {
            let spec = format!("{mode}:{}", dir.path().display());
            let kill_after = rng.gen_range(100..400u64);
            kill_child_after(
                "wal::tests_crash::sigkill_child",
                CHILD_ENV,
                spec.as_ref(),
                kill_after,
                |i| {
                    let i: u64 = i.parse().expect("ack number");
                    acked = Some(acked.map_or(i, |a| a.max(i)));
                },
            );
            // Every acknowledged record is there, in order, with its value.
            let wal = Wal::open(dir.path(), config(Durability::Sync)).expect("reopen");
            let mut n = 0u64;
            wal.replay(0, |_, op| {
                let LogOp::Insert { key, value } = op else {
                    panic!("only inserts were logged");
                };
                assert_eq!(key, n.to_be_bytes());
                assert_eq!(value, child_value(n));
                n += 1;
                Ok(())
            })
            .expect("replay");
            let want = acked.map_or(0, |a| a + 1);
            assert!(
                n >= want,
                "{mode} cycle {cycle}: {n} records, {want} acknowledged"
            );
        }
    }
}

/// Writer threads in `four_writers_survive_sigkill`'s child.
const WRITERS: u8 = 4;

/// Environment variable that turns `sigkill_child_four_writers` into the writer process.
const CHILD4_ENV: &str = "BFKV_WAL_SIGKILL_CHILD4";

/// Not a test by itself: run by `four_writers_survive_sigkill` in a child process. Four
/// threads append and commit under `Buffered` (the lock-free staging ring, small enough to
/// fill, and small segments so that switches happen), each numbering its records from where the log left
/// it, printing `ack <thread> <i>` after each commit, until the process is killed.
#[test]
fn sigkill_child_four_writers() {
    let Some(dir) = std::env::var_os(CHILD4_ENV) else {
        return;
    };
    let wal = Wal::open(Path::new(&dir), config(Durability::Buffered)).expect("child open");
    let mut next = [0u64; WRITERS as usize];
    wal.replay(0, |_, op| {
        if let LogOp::Insert { key, .. } = op {
            next[usize::from(key[0])] += 1;
        }
        Ok(())
    })
    .expect("child replay");
    std::thread::scope(|s| {
        for t in 0..WRITERS {
            let (wal, start) = (&wal, next[usize::from(t)]);
            s.spawn(move || {
                for i in start.. {
                    let mut key = vec![t];
                    key.extend_from_slice(&i.to_be_bytes());
                    insert_and_commit(wal, &key, &child_value(i));
                    println!("ack {t} {i}");
                }
            });
        }
    });
}

#[test]
fn four_writers_survive_sigkill() {
    let mut rng = StdRng::seed_from_u64(13);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut acked: [Option<u64>; WRITERS as usize] = [None; WRITERS as usize];
    for cycle in 0..20 {
        let kill_after = rng.gen_range(200..2000u64);
        kill_child_after(
            "wal::tests_crash::sigkill_child_four_writers",
            CHILD4_ENV,
            dir.path().as_os_str(),
            kill_after,
            |ack| {
                let (t, i) = ack.split_once(' ').expect("ack <thread> <i>");
                let (t, i): (usize, u64) = (t.parse().expect("thread"), i.parse().expect("i"));
                acked[t] = Some(acked[t].map_or(i, |a| a.max(i)));
            },
        );
        // Each thread's records are a gapless prefix of its numbering, with their values,
        // and reach past its last acknowledged one.
        let wal = Wal::open(dir.path(), config(Durability::Sync)).expect("reopen");
        let mut n = [0u64; WRITERS as usize];
        wal.replay(0, |_, op| {
            let LogOp::Insert { key, value } = op else {
                panic!("only inserts were logged");
            };
            let t = usize::from(key[0]);
            assert_eq!(key[1..], n[t].to_be_bytes(), "cycle {cycle} thread {t}");
            assert_eq!(value, child_value(n[t]));
            n[t] += 1;
            Ok(())
        })
        .expect("replay");
        for t in 0..usize::from(WRITERS) {
            let want = acked[t].map_or(0, |a| a + 1);
            assert!(
                n[t] >= want,
                "cycle {cycle} thread {t}: {} records, {want} acknowledged",
                n[t]
            );
        }
    }
}
