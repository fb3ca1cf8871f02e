//! Damaged files: a child process (this test binary, re-executed) runs a fixed workload,
//! checkpoints halfway, syncs the log and exits without closing, so the directory holds data
//! pages, a checkpoint and several small log segments. The parent then damages one file at a
//! time (a flipped byte at many positions in every file, the log cut at many points), opens
//! the tree, scans it and reads sampled keys. Every answer must be correct data or
//! `Err(Corruption)`; never a panic, never a wrong value. For the log, "correct" is precise:
//! the tree equals the replay of a prefix of the history that keeps at least every record
//! before the damage, and a flipped byte in any record the child synced (in every segment,
//! the last one's too: the sync marked them) is `Corruption` naming its segment. A log cut
//! short is `Corruption` while the side file of synced marks says more was synced, and a
//! torn tail, cut, once that file is gone too (as a power cut may leave it).

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use bfkv::{Config, Durability, Error, Tree};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CHILD_ENV: &str = "BFKV_CORRUPTION_CHILD";
const SEGMENT: u64 = 16 << 10;
const KEYS: u32 = 2000;
/// Operations before the checkpoint, and in total.
const BEFORE_CHECKPOINT: usize = 1500;
const OPS: usize = 3000;
/// A log record takes this many bytes plus its key and value: checksum, op, and the two
/// lengths, one byte each (every key and value here is shorter than 128 bytes).
const RECORD_OVERHEAD: u64 = 7;
/// The log stores every key with its keyspace's prefix: one byte for the default keyspace.
const KEY_PREFIX: u64 = 1;
const HEADER: u64 = 64;

#[derive(Clone, Debug)]
enum Op {
    Insert(Vec<u8>, Vec<u8>),
    Remove(Vec<u8>),
}

impl Op {
    fn key(&self) -> &[u8] {
        match self {
            Op::Insert(k, _) | Op::Remove(k) => k,
        }
    }

    fn log_len(&self) -> u64 {
        RECORD_OVERHEAD
            + KEY_PREFIX
            + match self {
                Op::Insert(k, v) => (k.len() + v.len()) as u64,
                Op::Remove(k) => k.len() as u64,
            }
    }
}

fn key(i: u32) -> Vec<u8> {
    format!("key-{i:05}").into_bytes()
}

/// The workload, the same in the child and the parent.
fn history() -> Vec<Op> {
    let mut rng = StdRng::seed_from_u64(5);
    (0..OPS)
        .map(|seq| {
            let k = key(rng.gen_range(0..KEYS));
            if seq >= BEFORE_CHECKPOINT / 2 && rng.gen_ratio(1, 4) {
                Op::Remove(k)
            } else {
                let v = format!("s{seq}-{}", "v".repeat(rng.gen_range(0..60)));
                Op::Insert(k, v.into_bytes())
            }
        })
        .collect()
}

fn config(dir: &Path) -> Config {
    Config::new(dir)
        .cache_size(256 << 10)
        .durability(Durability::Buffered)
        .log_segment_size(SEGMENT)
        // Only the explicit checkpoint, taken while no write runs: the checkpoint is then
        // exactly a prefix of the history.
        .checkpoint_log_bytes(1 << 40)
}

/// The child: run the history with one checkpoint, sync the log, exit without closing.
fn child(dir: &str) -> ! {
    let tree = common::open_child(|| Tree::open(config(dir.as_ref())));
    for (i, op) in history().iter().enumerate() {
        if i == BEFORE_CHECKPOINT {
            tree.checkpoint().expect("child checkpoint");
        }
        match op {
            Op::Insert(k, v) => tree.insert(k, v).expect("child insert"),
            Op::Remove(k) => tree.remove(k).expect("child remove"),
        }
    }
    tree.flush().expect("child flush");
    // No close: the log keeps everything after the checkpoint.
    std::process::exit(0)
}

/// Every file of the directory but the lock, by path relative to it.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    for sub in [dir.to_path_buf(), dir.join("wal")] {
        for entry in fs::read_dir(&sub).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_file() && path.file_name() != Some("LOCK".as_ref()) {
                let rel = path.strip_prefix(dir).expect("prefix").to_path_buf();
                out.insert(rel, fs::read(&path).expect("read"));
            }
        }
    }
    out
}

/// Puts the directory back to `files` exactly (removing files a recovery created).
fn restore(dir: &Path, files: &BTreeMap<PathBuf, Vec<u8>>) {
    for (rel, _) in snapshot(dir) {
        if !files.contains_key(&rel) {
            fs::remove_file(dir.join(rel)).expect("remove");
        }
    }
    for (rel, bytes) in files {
        fs::write(dir.join(rel), bytes).expect("restore");
    }
}

/// Keys read one by one, with what `get` answered.
type Gets = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// The states of the history, checked against what a tree shows.
struct Model {
    ops: Vec<Op>,
    /// LSN just after each operation's record (the log starts at LSN 0).
    ends: Vec<u64>,
    full: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl Model {
    fn new() -> Model {
        let ops = history();
        let mut ends = Vec::with_capacity(ops.len());
        let mut lsn = 0;
        for op in &ops {
            lsn += op.log_len();
            ends.push(lsn);
        }
        let full = Model::state(&ops);
        Model { ops, ends, full }
    }

    fn state(ops: &[Op]) -> BTreeMap<Vec<u8>, Vec<u8>> {
        let mut m = BTreeMap::new();
        for op in ops {
            match op {
                Op::Insert(k, v) => m.insert(k.clone(), v.clone()),
                Op::Remove(k) => m.remove(k),
            };
        }
        m
    }

    /// How many operations' records end at or before log position `lsn`.
    fn ops_before(&self, lsn: u64) -> usize {
        self.ends.partition_point(|&e| e <= lsn)
    }

    /// The prefix lengths `k >= min` whose state equals `seen`, by walking the history once
    /// and keeping the number of keys on which the two differ.
    fn matching_prefixes(&self, seen: &BTreeMap<Vec<u8>, Vec<u8>>, min: usize) -> Vec<usize> {
        let mut state: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let mut differ = seen.len();
        let mut out = Vec::new();
        for k in 0..=self.ops.len() {
            if k >= min && differ == 0 {
                out.push(k);
            }
            let Some(op) = self.ops.get(k) else { break };
            let key = op.key();
            let was = state.get(key) != seen.get(key);
            match op {
                Op::Insert(k, v) => state.insert(k.clone(), v.clone()),
                Op::Remove(k) => state.remove(k),
            };
            let now = state.get(key) != seen.get(key);
            differ = differ + usize::from(now) - usize::from(was);
        }
        out
    }
}

/// What one open + scan + gets of a damaged directory gave.
enum Outcome {
    /// Open failed with `Corruption` in this file.
    OpenCorrupt(PathBuf),
    /// Open worked: the scan's records, the answers of the gets that did not fail, and how
    /// many reads said `Corruption`.
    Read(BTreeMap<Vec<u8>, Vec<u8>>, Gets, usize),
}

/// Opens, scans both ways and reads every third key. Any error but `Corruption` fails.
fn read_back(dir: &Path, what: &str) -> Outcome {
    let tree = match Tree::open(config(dir)) {
        Ok(t) => t,
        Err(Error::Corruption { file, .. }) => return Outcome::OpenCorrupt(file),
        Err(e) => panic!("{what}: open failed with {e}, expected Corruption"),
    };
    let mut seen = BTreeMap::new();
    let mut corrupt = 0;
    for item in &tree {
        match item {
            Ok((k, v)) => {
                if let Some((last, _)) = seen.last_key_value() {
                    assert!(*last < k, "{what}: scan out of order at {k:?}");
                }
                seen.insert(k, v);
            }
            Err(Error::Corruption { .. }) => corrupt += 1,
            Err(e) => panic!("{what}: scan failed with {e}, expected Corruption"),
        }
    }
    let mut back = Vec::new();
    for item in tree.iter().rev() {
        match item {
            Ok(kv) => back.push(kv),
            Err(Error::Corruption { .. }) => corrupt += 1,
            Err(e) => panic!("{what}: reverse scan failed with {e}, expected Corruption"),
        }
    }
    if corrupt == 0 {
        back.reverse();
        assert!(back.into_iter().eq(seen.clone()), "{what}: scans disagree");
    }
    let mut gets = Vec::new();
    for i in (0..KEYS).step_by(3) {
        let k = key(i);
        match tree.get(&k) {
            Ok(v) => gets.push((k, v)),
            Err(Error::Corruption { .. }) => corrupt += 1,
            Err(e) => panic!("{what}: get {i} failed with {e}, expected Corruption"),
        }
    }
    drop(tree);
    Outcome::Read(seen, gets, corrupt)
}

/// Checks damage that leaves the log whole: the full history, or records missing behind
/// `Corruption`, never a wrong or invented one.
fn expect_full_or_corrupt(model: &Model, outcome: Outcome, what: &str) -> bool {
    match outcome {
        Outcome::OpenCorrupt(_) => true,
        Outcome::Read(seen, gets, corrupt) => {
            if corrupt == 0 {
                assert!(
                    seen == model.full,
                    "{what}: tree differs from the full history"
                );
            }
            for (k, v) in &seen {
                assert_eq!(model.full.get(k), Some(v), "{what}: wrong record {k:?}");
            }
            for (k, v) in &gets {
                assert_eq!(model.full.get(k), v.as_ref(), "{what}: wrong get {k:?}");
            }
            corrupt > 0
        }
    }
}

/// Checks damage to the log: the tree is a prefix of the history of at least `min` operations.
fn expect_prefix(model: &Model, outcome: Outcome, min: usize, what: &str) {
    match outcome {
        Outcome::OpenCorrupt(file) => panic!("{what}: open said {} is corrupt", file.display()),
        Outcome::Read(seen, gets, corrupt) => {
            assert_eq!(corrupt, 0, "{what}: reads failed with Corruption");
            for (k, v) in &gets {
                assert_eq!(
                    seen.get(k),
                    v.as_ref(),
                    "{what}: get disagrees with scan {k:?}"
                );
            }
            let ks = model.matching_prefixes(&seen, min);
            assert!(
                !ks.is_empty(),
                "{what}: not a prefix of >= {min} operations"
            );
        }
    }
}

/// The damaged-file sweep. One test: the child workload is built once.
#[test]
fn damaged_files_give_correct_data_or_corruption() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child(&dir);
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let status = Command::new(std::env::current_exe().expect("exe"))
        .args(["--exact", "damaged_files_give_correct_data_or_corruption"])
        .env(CHILD_ENV, dir)
        .status()
        .expect("spawn child");
    assert!(status.success(), "child failed: {status}");
    let model = Model::new();
    let pristine = snapshot(dir);

    // The log holds several segments; check our record-size model against them.
    let segments: Vec<(PathBuf, u64)> = pristine
        .keys()
        .filter_map(|rel| {
            let name = rel.file_name()?.to_str()?;
            let hex = name.strip_prefix("wal-")?.strip_suffix(".log")?;
            Some((rel.clone(), u64::from_str_radix(hex, 16).ok()?))
        })
        .collect();
    assert!(segments.len() >= 4, "only {} log segments", segments.len());
    let used: Vec<u64> = segments
        .iter()
        .map(|(rel, _)| used_len(&pristine[rel]))
        .collect();
    let (last_rel, last_first) = &segments[segments.len() - 1];
    let log_end = last_first + used[used.len() - 1] - HEADER;
    assert_eq!(
        log_end,
        model.ends[OPS - 1],
        "record sizes do not match the log"
    );
    assert!(segments[0].1 <= model.ends[BEFORE_CHECKPOINT - 1]);
    restore(dir, &pristine);
    expect_prefix(&model, read_back(dir, "pristine"), OPS, "pristine");

    // 1. Every log segment: header, records and padding.
    let mut log_trials = 0;
    for (i, (rel, first)) in segments.iter().enumerate() {
        let is_last = rel == last_rel;
        let positions = (0..40)
            .step_by(5)
            .chain((HEADER..used[i]).step_by(401))
            .chain([used[i] - 1, used[i], used[i] + 1, SEGMENT - 1])
            .filter(|&p| p < pristine[rel].len() as u64);
        for pos in positions {
            let mut files = pristine.clone();
            let file = files.get_mut(rel).expect("segment");
            file[pos as usize] ^= 0x08;
            restore(dir, &files);
            let what = format!("flip {} byte {pos}", rel.display());
            let outcome = read_back(dir, &what);
            log_trials += 1;
            let full = dir.join(rel);
            if pos < used[i] {
                // A header, or a record the child synced before it exited.
                match outcome {
                    Outcome::OpenCorrupt(f) => assert_eq!(f, full, "{what}: wrong file named"),
                    Outcome::Read(..) => panic!("{what}: damage not reported"),
                }
            } else {
                // Past the last record: the log ends there anyway.
                expect_prefix(&model, outcome, OPS, &what);
            }
        }
        // The side file of synced marks gone too: past the header's own mark, a flip in
        // the last segment's last record is a torn tail, cut there.
        if is_last {
            let mut files = pristine.clone();
            files.remove(&PathBuf::from("wal/synced"));
            let at = model.ends[OPS - 2] - first + HEADER + 3;
            files.get_mut(rel).expect("segment")[at as usize] ^= 0x08;
            restore(dir, &files);
            let what = format!("flip {} byte {at}, no side file", rel.display());
            expect_prefix(&model, read_back(dir, &what), OPS - 1, &what);
            log_trials += 1;
        }
    }

    // 2. The log cut at many points: later segments gone, this one truncated, and the side
    // file of synced marks gone with them (else the cut loses records it says were synced).
    for (i, (rel, first)) in segments.iter().enumerate() {
        for cut in (0..used[i]).step_by(1021).chain([used[i] - 1, 32, 63, 64]) {
            let mut files = pristine.clone();
            for (later, _) in &segments[i + 1..] {
                files.remove(later);
            }
            files.get_mut(rel).expect("segment").truncate(cut as usize);
            let side = files.remove(&PathBuf::from("wal/synced"));
            restore(dir, &files);
            let what = format!("log cut in {} at {cut}", rel.display());
            let min = if cut <= HEADER {
                model.ops_before(*first)
            } else {
                model.ops_before(first + cut - HEADER)
            };
            expect_prefix(&model, read_back(dir, &what), min, &what);
            log_trials += 1;
            if rel == last_rel && cut > HEADER {
                files.insert(PathBuf::from("wal/synced"), side.expect("side file"));
                restore(dir, &files);
                let what = format!("{what}, with the side file");
                match read_back(dir, &what) {
                    Outcome::OpenCorrupt(f) => assert_eq!(f, dir.join(rel), "{what}"),
                    Outcome::Read(..) => panic!("{what}: synced records lost, not reported"),
                }
            }
        }
    }

    // 3. The checkpoint file: any flip is caught by its checksum.
    let ckpt = PathBuf::from("checkpoint");
    let len = pristine[&ckpt].len();
    for pos in (0..len).step_by(7).chain([len - 1]) {
        let mut files = pristine.clone();
        files.get_mut(&ckpt).expect("checkpoint")[pos] ^= 0x40;
        restore(dir, &files);
        match read_back(dir, &format!("checkpoint flip {pos}")) {
            Outcome::OpenCorrupt(f) => assert_eq!(f, dir.join(&ckpt)),
            Outcome::Read(..) => panic!("checkpoint flip {pos} not reported"),
        }
    }

    // 4. Data pages: header, middle and last byte of every page.
    let data = PathBuf::from("data");
    // The file grows ahead of the pages in use; the zero pages past the last one written
    // hold nothing.
    let pages = pristine[&data]
        .chunks(4096)
        .rposition(|p| p.iter().any(|&b| b != 0))
        .map_or(0, |last| last + 1);
    let mut detected = 0;
    for page in 0..pages {
        for offset in [9, 2048 + page % 7, 4095] {
            let mut files = pristine.clone();
            files.get_mut(&data).expect("data")[page * 4096 + offset] ^= 1 << (page % 8);
            restore(dir, &files);
            let what = format!("data page {page} byte {offset}");
            if expect_full_or_corrupt(&model, read_back(dir, &what), &what) {
                detected += 1;
            }
        }
    }
    eprintln!(
        "{} segments, {log_trials} log trials, {} checkpoint flips, {pages} data pages: \
         {detected} of {} page flips detected",
        segments.len(),
        len / 7 + 2,
        pages * 3
    );
    assert!(detected > 0, "no data-page flip was detected");
    restore(dir, &pristine);
    expect_prefix(&model, read_back(dir, "restored"), OPS, "restored");
}

/// Bytes of a segment file up to where its records end.
fn used_len(bytes: &[u8]) -> u64 {
    // A record: crc32c (4 bytes), op (1, never 0), key and value lengths (one byte each
    // here, every length being below 128), key, value. Preallocated space is zeros.
    let mut at = HEADER as usize;
    while let Some(&[op, klen, vlen]) = bytes.get(at + 4..at + 7) {
        if op == 0 {
            break;
        }
        assert!(klen < 0x80 && vlen < 0x80, "one-byte lengths");
        at += RECORD_OVERHEAD as usize + usize::from(klen) + usize::from(vlen);
    }
    at as u64
}
