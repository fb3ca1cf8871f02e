//! A merge operator that misbehaves for one key (panics, or returns a value too long to
//! store) costs that key alone: its reads answer with the error, every other key reads and
//! writes, checkpoints and `close` go on, nothing hangs, and an `insert` or `remove` of the
//! key clears it. Each scenario runs under a deadline, so a hang fails the test instead of
//! stalling the run. Recovery that has to fold with an operator that panics fails the open
//! with the error, not a panic.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use bfkv::{Config, Durability, Error, Tree};

/// How long a scenario may take before it counts as hung (they take seconds).
const DEADLINE: Duration = Duration::from_secs(240);

/// The operand the operators below refuse to fold.
const POISON: &[u8] = b"poison";

/// The child process of the replay test, when set: its directory.
const CHILD_ENV: &str = "BFKV_MERGE_FAULTS_CHILD";

/// A merge operator (a plain function, so the child process can name it too).
type Operator = fn(&[u8], Option<&[u8]>, &[u8]) -> Option<Vec<u8>>;

/// Adds little-endian u64 operands; panics on [`POISON`].
#[allow(clippy::unnecessary_wraps)] // the operator's signature
fn add_or_panic(_key: &[u8], old: Option<&[u8]>, operand: &[u8]) -> Option<Vec<u8>> {
    assert!(operand != POISON, "operand refused by the test operator");
    Some(
        (counter(old) + counter(Some(operand)))
            .to_le_bytes()
            .to_vec(),
    )
}

/// Adds little-endian u64 operands; returns 100 KB for [`POISON`].
#[allow(clippy::unnecessary_wraps)] // the operator's signature
fn add_or_bloat(_key: &[u8], old: Option<&[u8]>, operand: &[u8]) -> Option<Vec<u8>> {
    if operand == POISON {
        return Some(vec![7; 100_000]);
    }
    Some(
        (counter(old) + counter(Some(operand)))
            .to_le_bytes()
            .to_vec(),
    )
}

fn counter(v: Option<&[u8]>) -> u64 {
    v.and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

fn key(i: u32) -> Vec<u8> {
    format!("key-{i:08}").into_bytes()
}

/// Runs `scenario` on a thread of its own and fails the test if it takes past the deadline.
fn with_deadline(name: &str, scenario: impl FnOnce() + Send + 'static) {
    let (done, finished) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        scenario();
        let _ = done.send(());
    });
    match finished.recv_timeout(DEADLINE) {
        Ok(()) => worker.join().expect("scenario"),
        // The scenario panicked: report its panic.
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(panic) = worker.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{name}: hung past {DEADLINE:?}"),
    }
}

fn config(dir: &Path, cache: usize, operator: Operator, evictors: usize) -> Config {
    Config::new(dir)
        .cache_size(cache)
        .durability(Durability::Buffered)
        .evictor_threads(evictors)
        .merge_operator(operator)
}

/// 100k keys loaded and the tree reopened (so they are cold), one merge the operator
/// cannot fold into a cold key, then 50k writes to other keys through a 1 MiB cache, which
/// evicts and writes back the poisoned key's leaf many times over.
fn poisoned_key_costs_only_itself(operator: Operator, evictors: usize, expect: fn(&Error) -> bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = Tree::open(config(dir.path(), 4 << 20, operator, evictors)).expect("open");
    for i in 0..100_000 {
        tree.insert(key(i), 1u64.to_le_bytes()).expect("load");
    }
    tree.close().expect("close after load");
    let tree = Tree::open(config(dir.path(), 1 << 20, operator, evictors)).expect("reopen");
    let bad = key(77_777);
    tree.merge(&bad, POISON)
        .expect("a merge into a cold key is only buffered");
    tree.merge(key(5), 2u64.to_le_bytes())
        .expect("merge of another key");
    for i in 0..50_000u32 {
        let k = key(100_000 + i);
        tree.insert(&k, i.to_le_bytes())
            .unwrap_or_else(|e| panic!("insert {i}: {e}"));
        if i % 1000 == 0 {
            tree.remove(key(i))
                .unwrap_or_else(|e| panic!("remove {i}: {e}"));
        }
    }
    tree.checkpoint().expect("checkpoint");
    let e = tree
        .get(&bad)
        .expect_err("the poisoned key answers with the error");
    assert!(expect(&e), "poisoned key: {e:?}");
    assert!(tree.merge(&bad, 1u64.to_le_bytes()).is_err() || tree.get(&bad).is_err());
    assert_eq!(
        tree.get(key(5)).expect("get"),
        Some(3u64.to_le_bytes().to_vec())
    );
    assert_eq!(
        tree.get(key(77_778)).expect("get"),
        Some(1u64.to_le_bytes().to_vec())
    );
    assert_eq!(
        tree.get(key(100_005)).expect("get"),
        Some(5u32.to_le_bytes().to_vec())
    );
    // A scan yields the error in the key's place and goes on.
    let around: Vec<_> = tree.range(key(77_776)..key(77_779)).collect();
    assert_eq!(around.len(), 3, "{around:?}");
    assert!(around[1].is_err(), "{around:?}");
    assert_eq!(
        around[2].as_ref().expect("after the poisoned key").0,
        key(77_778)
    );
    tree.close().expect("close");

    // The failure is durable and stays with the key; an insert clears it.
    let tree =
        Tree::open(config(dir.path(), 1 << 20, operator, evictors)).expect("reopen after close");
    let e = tree.get(&bad).expect_err("still poisoned after reopen");
    assert!(expect(&e), "after reopen: {e:?}");
    assert!(matches!(
        tree.compare_and_swap(&bad, None, Some(b"x".as_slice())),
        Err(ref e) if expect(e)
    ));
    tree.insert(&bad, 9u64.to_le_bytes())
        .expect("an insert clears it");
    tree.merge(&bad, 1u64.to_le_bytes())
        .expect("merges fold again");
    assert_eq!(
        tree.get(&bad).expect("get"),
        Some(10u64.to_le_bytes().to_vec())
    );
    tree.remove(key(77_778)).expect("remove");
    tree.close().expect("close");
}

fn is_merge_failed(e: &Error) -> bool {
    matches!(e, Error::MergeFailed { reason } if reason.contains("refused by the test operator"))
}

fn is_too_large(e: &Error) -> bool {
    matches!(e, Error::ValueTooLarge { len: 100_000, .. })
}

#[test]
fn a_panicking_operator_costs_only_its_key_with_evictor_threads() {
    with_deadline("panic, evictor threads", || {
        poisoned_key_costs_only_itself(add_or_panic, 2, is_merge_failed);
    });
}

#[test]
fn a_panicking_operator_costs_only_its_key_on_foreground_evictions() {
    // Without evictor threads every eviction runs on a writer: the panic must not reach it.
    with_deadline("panic, foreground", || {
        poisoned_key_costs_only_itself(add_or_panic, 0, is_merge_failed);
    });
}

#[test]
fn an_oversized_merge_result_costs_only_its_key() {
    with_deadline("oversized result", || {
        poisoned_key_costs_only_itself(add_or_bloat, 2, is_too_large);
    });
}

#[test]
fn a_merge_folded_at_once_fails_only_its_call() {
    let tree = Tree::open(Config::in_memory().merge_operator(add_or_panic)).expect("open");
    tree.insert(b"k", 1u64.to_le_bytes()).expect("insert");
    let e = tree.merge(b"k", POISON).expect_err("the fold panics");
    assert!(is_merge_failed(&e), "{e:?}");
    assert_eq!(
        tree.get(b"k").expect("get"),
        Some(1u64.to_le_bytes().to_vec())
    );
    let mut batch = tree.batch();
    batch.merge(&tree.default_keyspace(), b"k", POISON);
    batch.insert(&tree.default_keyspace(), b"other", b"v");
    assert!(is_merge_failed(
        &batch.commit().expect_err("the batch folds")
    ));
    assert_eq!(
        tree.get(b"other").expect("get"),
        None,
        "a failed batch applies nothing"
    );
}

/// The child: writes a key, lets its mini-page be written back (a 1 MiB cache, then writes
/// to other leaves), merges [`POISON`] into it (buffered: the key's leaf is on disk), says
/// so and waits to be killed. Its log then holds the insert and the merge, which a replay
/// with a cache large enough to keep them together folds at once.
fn child(dir: &str) -> ! {
    let tree = common::open_child(|| {
        Tree::open(
            Config::new(dir)
                .cache_size(1 << 20)
                .durability(Durability::Buffered)
                .merge_operator(add_or_panic),
        )
    });
    tree.insert(b"k", 1u64.to_le_bytes()).expect("insert");
    for i in 0..60_000 {
        tree.insert(key(i), [0u8; 64]).expect("fill");
    }
    tree.merge(b"k", POISON).expect("buffered merge");
    let mut out = std::io::stdout().lock();
    writeln!(out, "DONE")
        .and_then(|()| out.flush())
        .expect("stdout");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn a_panic_during_replay_fails_the_open_with_the_error() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child(&dir);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "a_panic_during_replay_fails_the_open_with_the_error",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("child stdout");
    let done = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.ends_with("DONE"));
    child.kill().expect("kill -9");
    let _ = child.wait();
    assert!(done, "the child did not finish its writes");
    let open = |operator: Operator| {
        let start = std::time::Instant::now();
        loop {
            match Tree::open(
                Config::new(dir.path())
                    .cache_size(64 << 20)
                    .durability(Durability::Buffered)
                    .merge_operator(operator),
            ) {
                Err(Error::Locked { .. }) if start.elapsed() < Duration::from_secs(5) => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                other => return other,
            }
        }
    };
    let e = open(add_or_panic).expect_err("replay folds the poisoned operand");
    assert!(is_merge_failed(&e), "{e:?}");
    // The directory is left as it was: an operator that accepts the operand opens it.
    let tree = open(add_or_bloat_free).expect("open with an operator that folds it");
    assert_eq!(
        tree.get(b"k").expect("get"),
        Some(1u64.to_le_bytes().to_vec())
    );
}

/// Adds; takes [`POISON`] as zero.
#[allow(clippy::unnecessary_wraps)] // the operator's signature
fn add_or_bloat_free(_key: &[u8], old: Option<&[u8]>, operand: &[u8]) -> Option<Vec<u8>> {
    let n = if operand == POISON {
        0
    } else {
        counter(Some(operand))
    };
    Some((counter(old) + n).to_le_bytes().to_vec())
}
