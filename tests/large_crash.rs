//! Crash recovery by `kill -9` with large values in flight, in every durability mode.
//!
//! A child process (this test binary, re-executed) writes to 40 slots values of mixed sizes:
//! small, around the inline limit (a value longer than `max_record_len` less the key goes
//! to the blob file), a few KiB, 256 KiB to 4 MiB, now and then 16 MiB, and removes. Each
//! value is derived from (cycle, seq, len), so the child reports a short descriptor (`P I
//! slot-07 c3 s128 len 1048576`) before issuing a write and `A` after its acknowledgement;
//! under `Durability::None` it flushes every few writes and reports `F` when the flush
//! returned. Some cycles run a thread that checkpoints every few milliseconds, so kills cut
//! checkpoints that free extents too. The parent kills the child at a random moment (now
//! and then during recovery, before it opened), reopens the directory and checks:
//!
//! * every slot reads (by `get` and by a scan) exactly its last acknowledged value, or the
//!   value of the write in flight; under `None`, the value it had at the last reported
//!   flush or any value written since (acknowledged or in flight). A partial or foreign
//!   value, an error, or a lost acknowledged value fails the test;
//! * after a checkpoint, the blob file has exactly one extent per slot holding an
//!   out-of-line value, and its blocks: no extent leaked by the crash survives a
//!   checkpoint (and none still referenced is counted free); nor does the file keep
//!   growing past the blocks in use and free.
//!
//! The child continues on the same directory across cycles, so each one starts from a
//! recovered state. The cache is tiny and log checkpoints frequent, as in `crash.rs`.

#![cfg(unix)]

mod common;

use std::fmt::{self, Write as _};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bfkv::{Config, Durability, Tree};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CHILD_ENV: &str = "BFKV_LARGE_CRASH_CHILD";
/// Slots written: keys `slot-00` .. `slot-39`.
const SLOTS: usize = 40;
/// Bytes of every slot key.
const KEY_LEN: usize = "slot-00".len();
/// Under `Durability::None` the child flushes after every this many writes.
const FLUSH_EVERY: u64 = 8;
/// Bytes of a blob-file block (extents are whole blocks).
const BLOB_BLOCK: u64 = 4096;
/// How much longer than its used and free blocks the blob file may be after a checkpoint,
/// besides a quarter of them (see [`check_space`]).
const GROWTH_SLACK: u64 = 32 << 20;

/// Kill cycles per mode: 20 (60 kills over the three modes); `BFKV_CRASH_CYCLES` asks for
/// more.
fn cycles() -> u64 {
    std::env::var("BFKV_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}

fn config(dir: &Path, mode: &str) -> Config {
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

/// A seed that tells the modes apart.
fn mode_seed(mode: &str) -> u64 {
    mode.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3)
    })
}

fn slot_key(slot: usize) -> String {
    format!("slot-{slot:02}")
}

/// Which write a value comes from; the value itself is [`Desc::value`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Desc {
    cycle: u64,
    seq: u64,
    len: usize,
}

impl fmt::Display for Desc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{} s{} len {}", self.cycle, self.seq, self.len)
    }
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The 16-byte stamp at the start of each 4 KiB block of a value: cycle, seq, len and the
/// block's index, u32 LE each (so a misplaced block tells where it came from).
fn stamp(cycle: u64, seq: u64, len: usize, block: usize) -> [u8; 16] {
    let mut s = [0u8; 16];
    s[..4].copy_from_slice(&(cycle as u32).to_le_bytes());
    s[4..8].copy_from_slice(&(seq as u32).to_le_bytes());
    s[8..12].copy_from_slice(&(len as u32).to_le_bytes());
    s[12..].copy_from_slice(&(block as u32).to_le_bytes());
    s
}

impl Desc {
    /// The value's bytes: a pseudo-random stream seeded by (cycle, seq, len), each 4 KiB
    /// block starting with its stamp.
    fn value(&self) -> Vec<u8> {
        let mut state = self.cycle.wrapping_mul(0xA24B_AED4_963E_E407)
            ^ self.seq.wrapping_mul(0x9FB2_1C65_1E98_DF25)
            ^ (self.len as u64).rotate_left(40);
        let mut v = vec![0u8; self.len];
        for chunk in v.chunks_mut(8) {
            let r = splitmix(&mut state).to_le_bytes();
            chunk.copy_from_slice(&r[..chunk.len()]);
        }
        for (i, block) in v.chunks_mut(BLOB_BLOCK as usize).enumerate() {
            let s = stamp(self.cycle, self.seq, self.len, i);
            let n = block.len().min(s.len());
            block[..n].copy_from_slice(&s[..n]);
        }
        v
    }

    fn matches(&self, got: &[u8]) -> bool {
        got.len() == self.len && got == self.value().as_slice()
    }
}

/// What a slot holds: a value, or nothing.
type Val = Option<Desc>;

fn show(v: &Val) -> String {
    v.map_or_else(|| "absent".to_string(), |d| d.to_string())
}

/// A value as found: its length, first bytes and the stamp of its first block.
fn describe(got: &[u8]) -> String {
    let head = got.iter().take(24).fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    });
    format!("len {} [{head}] {}", got.len(), stamp_at(got, 0))
}

/// The stamp of the block of `got` holding byte `at`, decoded.
fn stamp_at(got: &[u8], at: usize) -> String {
    let start = at - at % BLOB_BLOCK as usize;
    let Some(s) = got.get(start..start + 16) else {
        return "(no stamp)".to_string();
    };
    let u = |i: usize| u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
    format!(
        "(block at {start} stamped c{} s{} len {} block {})",
        u(0),
        u(4),
        u(8),
        u(12)
    )
}

/// Where `got` first differs from candidate `d`'s value of the same length.
fn first_difference(got: &[u8], d: &Desc) -> Option<String> {
    if got.len() != d.len {
        return None;
    }
    let want = d.value();
    let at = got.iter().zip(&want).position(|(a, b)| a != b)?;
    let wrong = got[at..]
        .iter()
        .zip(&want[at..])
        .filter(|(a, b)| a != b)
        .count();
    Some(format!(
        "differs from {d} first at byte {at} ({wrong} bytes differ), there {}",
        stamp_at(got, at)
    ))
}

/// The size of the next write's value, or `None` for a remove. `inline` is the longest
/// value stored in the leaf with a slot key.
fn draw(rng: &mut StdRng, inline: usize) -> Option<usize> {
    Some(match rng.gen_range(0..100) {
        0..=11 => return None,
        12..=41 => rng.gen_range(0..200),
        42..=66 if rng.gen_ratio(1, 4) => rng.gen_range(inline - 1..=inline + 1),
        42..=66 => rng.gen_range(1900..2200),
        67..=84 => rng.gen_range(3 << 10..20 << 10),
        85..=98 => rng.gen_range(256 << 10..=4 << 20),
        _ => 16 << 20,
    })
}

fn say(out: &mut impl Write, line: &str) {
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .expect("stdout");
}

/// The child: open (recovering), then write forever, reporting `P op` before and `A` after
/// each acknowledged write (and `F` after each flush under `None`).
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
    let inline = config(dir.as_ref(), &mode).limits().max_record_len - KEY_LEN;
    let tree = Arc::new(common::open_child(|| {
        Tree::open(config(dir.as_ref(), &mode))
    }));
    // One cycle in three without extra checkpoints (a longer log to replay), the others
    // with a checkpoint every 3 or 20 ms running alongside the writes.
    if let Some(period) = [None, Some(3), Some(20)][(cycle % 3) as usize] {
        let tree = Arc::clone(&tree);
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(period));
            if let Err(e) = tree.checkpoint() {
                // Exit, so the parent sees it: a panic would end this thread only.
                eprintln!("child checkpoint failed: {e:?}");
                std::process::exit(3);
            }
        });
    }
    let mut out = std::io::stdout().lock();
    say(&mut out, "OPEN");
    let mut rng =
        StdRng::seed_from_u64(cycle.wrapping_mul(0x5851_F42D_4C95_7F2D) ^ mode_seed(&mode));
    for seq in 0u64.. {
        let key = slot_key(rng.gen_range(0..SLOTS));
        match draw(&mut rng, inline) {
            None => {
                say(&mut out, &format!("P R {key}"));
                tree.remove(&key).expect("child remove");
            }
            Some(len) => {
                let d = Desc { cycle, seq, len };
                let value = d.value();
                say(&mut out, &format!("P I {key} {d}"));
                tree.insert(&key, &value).expect("child insert");
            }
        }
        say(&mut out, "A");
        if mode == "none" && seq % FLUSH_EVERY == FLUSH_EVERY - 1 {
            tree.flush().expect("child flush");
            say(&mut out, "F");
        }
    }
    unreachable!("the loop above never ends; the parent kills this process")
}

/// A write as the child reported it: the slot and what it then holds.
fn parse(line: &str) -> Option<(usize, Val)> {
    let parts: Vec<&str> = line.split(' ').collect();
    let slot = |key: &str| {
        key.strip_prefix("slot-")
            .and_then(|n| n.parse::<usize>().ok())
    };
    match parts[..] {
        ["P", "R", key] => Some((slot(key)?, None)),
        ["P", "I", key, c, s, "len", len] => Some((
            slot(key)?,
            Some(Desc {
                cycle: c.strip_prefix('c')?.parse().ok()?,
                seq: s.strip_prefix('s')?.parse().ok()?,
                len: len.parse().ok()?,
            }),
        )),
        _ => None,
    }
}

/// What the parent learned from one child's reports.
struct Reports {
    /// Each slot's last acknowledged value.
    acked: Vec<Val>,
    /// The write reported but not acknowledged.
    pending: Option<(usize, Val)>,
    /// Under `None`: each slot at the last reported flush (or at the start of the cycle).
    flushed: Vec<Val>,
    /// Under `None`: the values written to each slot since then, in flight included.
    since_flush: Vec<Vec<Val>>,
    acks: u64,
    flushes: u64,
    large_acked: u64,
    bytes_acked: u64,
}

impl Reports {
    fn new(model: &[Val]) -> Reports {
        Reports {
            acked: model.to_vec(),
            pending: None,
            flushed: model.to_vec(),
            since_flush: vec![Vec::new(); SLOTS],
            acks: 0,
            flushes: 0,
            large_acked: 0,
            bytes_acked: 0,
        }
    }

    fn line(&mut self, line: &str) {
        match line {
            "A" => {
                if let Some((slot, v)) = self.pending.take() {
                    self.acked[slot] = v;
                    self.acks += 1;
                    if let Some(d) = v {
                        self.bytes_acked += d.len as u64;
                        self.large_acked += u64::from(d.len >= 256 << 10);
                    }
                }
            }
            "F" => {
                self.flushes += 1;
                self.flushed.clone_from(&self.acked);
                self.since_flush.iter_mut().for_each(Vec::clear);
            }
            _ => {
                if let Some((slot, v)) = parse(line) {
                    self.pending = Some((slot, v));
                    self.since_flush[slot].push(v);
                }
            }
        }
    }

    /// What slot `slot` may hold after the kill, each with why.
    fn allowed(&self, mode: &str, slot: usize) -> Vec<(Val, &'static str)> {
        if mode == "none" {
            let mut allowed = vec![(self.flushed[slot], "at the last flush")];
            allowed.extend(self.since_flush[slot].iter().map(|&v| (v, "written since")));
            return allowed;
        }
        let mut allowed = vec![(self.acked[slot], "acknowledged")];
        if let Some((s, v)) = self.pending {
            if s == slot {
                allowed.push((v, "in flight"));
            }
        }
        allowed
    }
}

/// Which allowed value `got` is, or why it is none of them.
fn identify(got: Option<&[u8]>, allowed: &[(Val, &'static str)]) -> Result<Val, String> {
    for &(v, _) in allowed {
        match (v, got) {
            (None, None) => return Ok(None),
            (Some(d), Some(g)) if d.matches(g) => return Ok(Some(d)),
            _ => {}
        }
    }
    let expected: Vec<String> = allowed
        .iter()
        .map(|(v, why)| format!("{} ({why})", show(v)))
        .collect();
    let found = match got {
        None => "absent".to_string(),
        Some(g) => {
            let mut s = describe(g);
            for (v, _) in allowed {
                if let Some(diff) = v.as_ref().and_then(|d| first_difference(g, d)) {
                    s = format!("{s}; {diff}");
                }
            }
            s
        }
    };
    Err(format!(
        "expected one of [{}], found {found}",
        expected.join(", ")
    ))
}

/// Copies directory `from` to `to`, recursively.
fn copy_dir(from: &Path, to: &Path) {
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

/// Reads the child's lines until `deadline` (handing them to `reports`); `Err` if it exited.
fn read_until(rx: &Receiver<String>, deadline: Instant, reports: &mut Reports) -> Result<(), ()> {
    while Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(5)) {
            Ok(line) => reports.line(&line),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return Err(()),
        }
    }
    Ok(())
}

/// Checks the reopened tree against `reports`; returns what each slot holds.
fn verify(tree: &Tree, mode: &str, cycle: u64, reports: &Reports, how: &str) -> Vec<Val> {
    let mut failures = Vec::new();
    let mut found: Vec<Val> = vec![None; SLOTS];
    for (slot, found) in found.iter_mut().enumerate() {
        let key = slot_key(slot);
        let allowed = reports.allowed(mode, slot);
        match tree.get(&key) {
            Err(e) => failures.push(format!(
                "{key}: get failed: {e:?}; expected one of {:?}",
                allowed
                    .iter()
                    .map(|(v, why)| format!("{} ({why})", show(v)))
                    .collect::<Vec<_>>()
            )),
            Ok(got) => match identify(got.as_deref(), &allowed) {
                Ok(v) => *found = v,
                Err(why) => failures.push(format!("{key}: {why}")),
            },
        }
    }
    if failures.is_empty() {
        // A scan must see the same.
        let mut seen = [false; SLOTS];
        for r in tree {
            match r {
                Err(e) => {
                    failures.push(format!("scan failed: {e:?}"));
                    break;
                }
                Ok((k, v)) => {
                    let key = String::from_utf8_lossy(&k).into_owned();
                    let slot = (0..SLOTS).find(|&s| slot_key(s) == key);
                    match slot.map(|s| (s, found[s])) {
                        None => failures.push(format!("scan: unexpected key {key:?}")),
                        Some((_, None)) => failures.push(format!(
                            "scan: {key} holds {} but get found it absent",
                            describe(&v)
                        )),
                        Some((s, Some(d))) => {
                            seen[s] = true;
                            if !d.matches(&v) {
                                failures.push(format!(
                                    "scan: {key} holds {}, get found {d}",
                                    describe(&v)
                                ));
                            }
                        }
                    }
                }
            }
        }
        for (s, v) in found.iter().enumerate() {
            if v.is_some() && !seen[s] {
                failures.push(format!(
                    "scan: {} missing (get found {})",
                    slot_key(s),
                    show(v)
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{mode} cycle {cycle} ({how}): recovered state is wrong ({} acknowledged writes, {} \
         flushes, in flight {:?}):\n  {}",
        reports.acks,
        reports.flushes,
        reports
            .pending
            .map(|(s, v)| format!("{} <- {}", slot_key(s), show(&v))),
        failures.join("\n  ")
    );
    found
}

/// After a checkpoint, the blob file holds one extent per out-of-line value, and no more;
/// and the file is not much longer than the blocks its allocator knows (used or free): the
/// engine keeps blocks past them (a 16 MiB growth step, and blocks freed at the end until
/// they are more than half the file: rewriting a block is cheaper than a first write), so
/// the file may be up to twice them plus [`GROWTH_SLACK`], which catches a file that keeps
/// growing without tying the test to the exact policy.
fn check_space(tree: &Tree, dir: &Path, mode: &str, cycle: u64, found: &[Val]) {
    let inline = tree.limits().max_record_len - KEY_LEN;
    tree.checkpoint().expect("checkpoint after recovery");
    let out_of_line: Vec<Desc> = found
        .iter()
        .flatten()
        .filter(|d| d.len > inline)
        .copied()
        .collect();
    let (extents, bytes) = (
        out_of_line.len() as u64,
        out_of_line
            .iter()
            .map(|d| (d.len as u64).div_ceil(BLOB_BLOCK).max(1) * BLOB_BLOCK)
            .sum::<u64>(),
    );
    let stats = tree.stats();
    let file_len = std::fs::metadata(dir.join("blobs")).map_or(0, |m| m.len());
    let known = stats.blob_bytes_in_use + stats.blob_bytes_free;
    let what = if stats.blob_extents > extents {
        "extents leaked: more in use than values stored out of line"
    } else if stats.blob_extents < extents {
        "extents lost: fewer in use than values stored out of line (a referenced extent \
         counted free)"
    } else if stats.blob_bytes_in_use != bytes {
        "the extents in use do not take the blocks of the values stored out of line"
    } else if file_len > 2 * (known + GROWTH_SLACK) {
        "the blob file is much longer than the blocks in use and free (a tail not reclaimed)"
    } else {
        return;
    };
    panic!(
        "{mode} cycle {cycle}: after reopening and a checkpoint, {what}: {} extents of {} \
         bytes in use, {} free, blob file {file_len} bytes; expected {extents} extents of \
         {bytes} bytes for the slots holding out-of-line values {:?}",
        stats.blob_extents,
        stats.blob_bytes_in_use,
        stats.blob_bytes_free,
        out_of_line
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
    );
}

fn run_cycles(mode: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("test binary");
    let test_name = format!("kill_9_with_large_values_in_flight_{mode}");
    let mut rng = StdRng::seed_from_u64(0x0B10_B5ED ^ mode_seed(mode));
    let mut model: Vec<Val> = vec![None; SLOTS];
    let (mut acks, mut large_acked, mut bytes_acked, mut large_in_flight) =
        (0u64, 0u64, 0u64, 0u64);
    let begun = Instant::now();
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
        let mut reports = Reports::new(&model);
        // One cycle in six is killed soon after it started, likely while it recovers; the
        // others once it has opened and written for a while.
        let spawned = Instant::now();
        let how = if rng.gen_ratio(1, 6) {
            let lifetime = Duration::from_millis(rng.gen_range(0..150));
            let early = read_until(&rx, spawned + lifetime, &mut reports);
            assert!(early.is_ok(), "{mode} cycle {cycle}: child exited early");
            format!("killed {lifetime:?} after it started")
        } else {
            loop {
                let line = rx
                    .recv_timeout(Duration::from_secs(120))
                    .unwrap_or_else(|_| panic!("{mode} cycle {cycle}: child did not open"));
                if line.ends_with("OPEN") {
                    break;
                }
            }
            let lifetime = Duration::from_millis(rng.gen_range(50..700));
            let written = read_until(&rx, Instant::now() + lifetime, &mut reports);
            assert!(written.is_ok(), "{mode} cycle {cycle}: child exited early");
            format!("killed {lifetime:?} after it opened")
        };
        child.kill().expect("kill -9"); // SIGKILL
        let _ = child.wait();
        // Lines the child wrote before dying still count: drain them.
        let _ = reader.join();
        for line in rx.try_iter() {
            reports.line(&line);
        }
        if let Some((_, Some(d))) = reports.pending {
            large_in_flight += u64::from(d.len >= 256 << 10);
        }
        if let Some(keep) = std::env::var_os("BFKV_CRASH_KEEP") {
            // The crashed directory, kept for a failure's post-mortem (one per mode).
            let keep = Path::new(&keep).join(format!("large-{mode}"));
            let _ = std::fs::remove_dir_all(&keep);
            copy_dir(dir.path(), &keep);
        }
        let tree = Tree::open(config(dir.path(), mode))
            .unwrap_or_else(|e| panic!("{mode} cycle {cycle} ({how}): reopen after kill: {e:?}"));
        model = verify(&tree, mode, cycle, &reports, &how);
        check_space(&tree, dir.path(), mode, cycle, &model);
        tree.close().expect("close after verification");
        acks += reports.acks;
        large_acked += reports.large_acked;
        bytes_acked += reports.bytes_acked;
    }
    let blob_file = std::fs::metadata(dir.path().join("blobs")).map_or(0, |m| m.len());
    eprintln!(
        "{mode}: {} cycles in {:?}: {acks} writes acknowledged ({} MiB, {large_acked} of 256 \
         KiB or more), {large_in_flight} kills with such a value in flight; blob file {} KiB",
        cycles(),
        begun.elapsed(),
        bytes_acked >> 20,
        blob_file >> 10
    );
    assert!(acks > 50, "{mode}: only {acks} writes were acknowledged");
    assert!(large_acked > 0, "{mode}: no large value was acknowledged");
}

#[test]
fn kill_9_with_large_values_in_flight_sync() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
    }
    run_cycles("sync");
}

#[test]
fn kill_9_with_large_values_in_flight_buffered() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
    }
    run_cycles("buffered");
}

#[test]
fn kill_9_with_large_values_in_flight_none() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
    }
    run_cycles("none");
}
