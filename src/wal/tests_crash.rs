//! The log across real process deaths: a child process (this test binary re-executed)
//! appends and commits under `Sync` and `Buffered`, printing each acknowledged record; the
//! parent SIGKILLs it at random points and checks every acknowledged record replays.

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
    }
}

/// Environment variable that turns `sigkill_child` into the writer process.
const CHILD_ENV: &str = "BFKV_WAL_SIGKILL_CHILD";

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
        let key = i.to_be_bytes();
        let value = child_value(i);
        let appended = wal
            .append(LogOp::Insert {
                key: &key,
                value: &value,
            })
            .expect("append");
        wal.commit(appended).expect("commit");
        println!("ack {i}");
    }
}

#[test]
fn committed_records_survive_sigkill() {
    let mut rng = StdRng::seed_from_u64(12);
    for mode in ["sync", "buffered"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut acked: Option<u64> = None;
        for cycle in 0..6 {
            let mut child = Command::new(std::env::current_exe().expect("test binary"))
                .args(["--exact", "wal::tests_crash::sigkill_child", "--nocapture"])
                .env(CHILD_ENV, format!("{mode}:{}", dir.path().display()))
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn child");
            let stdout = child.stdout.take().expect("stdout");
            let kill_after = rng.gen_range(100..400u64);
            let mut seen = 0u64;
            for line in BufReader::new(stdout).lines() {
                let line = line.expect("child output");
                if let Some(i) = line.strip_prefix("ack ") {
                    let i: u64 = i.parse().expect("ack number");
                    acked = Some(acked.map_or(i, |a| a.max(i)));
                    seen += 1;
                    if seen == kill_after {
                        child.kill().expect("SIGKILL");
                    }
                }
            }
            let status = child.wait().expect("wait");
            assert!(
                !status.success(),
                "{mode} cycle {cycle}: the child was killed"
            );
            assert!(seen >= kill_after, "{mode} cycle {cycle}: child died early");
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
