//! Real threads on one tree: four threads mix inserts, removes, gets and scans (both
//! directions) over interleaved keys, with a cache small enough that eviction, splits,
//! mini-page merges and leaf removals run all the time.
//!
//! What breaks if this fails:
//! - *lost update*: each thread owns some keys and writes increasing versions; any read (get
//!   or scan) must return a state at least as new as the owner's last acknowledged write and
//!   no newer than the owner's last started write;
//! - *torn value*: every value carries a hash of itself and its key;
//! - *scan order*: a scan yields strictly ordered keys, never one twice;
//! - *scan completeness*: keys present for a scan's whole duration (the "stable" keys,
//!   written before the threads start and never touched again, and batches a thread keeps
//!   still while it scans them) are all returned; keys absent for its whole duration are not.
//!
//! Seeds are printed on failure; rerun one with `BFKV_SEED=<seed> cargo test --release --test
//! concurrency`.

use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bfkv::{Config, Tree};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const THREADS: usize = 4;

/// FNV-1a over several byte strings.
fn hash(parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for p in parts {
        for &b in *p {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

/// A value: tag, writer, version, filler, then a hash of the key and all of the above.
fn make_value(key: &[u8], tag: u8, thread: u8, version: u64, filler: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(18 + filler);
    v.push(tag);
    v.push(thread);
    v.extend_from_slice(&version.to_le_bytes());
    v.extend((0..filler).map(|j| (version as u8).wrapping_add(j as u8)));
    let h = hash(&[key, &v]);
    v.extend_from_slice(&h.to_le_bytes());
    v
}

/// Decodes a value written by `make_value` for `key`: (tag, writer, version), or why not.
fn read_value(key: &[u8], v: &[u8]) -> Result<(u8, u8, u64), String> {
    if v.len() < 18 {
        return Err(format!("value of {} bytes is too short", v.len()));
    }
    let (body, tail) = v.split_at(v.len() - 8);
    let mut h = [0u8; 8];
    h.copy_from_slice(tail);
    if hash(&[key, body]) != u64::from_le_bytes(h) {
        return Err("torn value or value of another key (hash mismatch)".into());
    }
    let mut ver = [0u8; 8];
    ver.copy_from_slice(&body[2..10]);
    Ok((body[0], body[1], u64::from_le_bytes(ver)))
}

/// A 64-bit mix (splitmix64 finalizer).
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The workload's fixed parameters and the shared record of owned-key versions.
struct Shared {
    seed: u64,
    /// Key prefixes `k00000`..; every prefix has a stable, a shared and one owned key per thread.
    prefixes: usize,
    /// Per owned key: the version of the newest write its owner has started.
    started: Vec<AtomicU64>,
    /// Per owned key: the version of the newest write its owner got `Ok` for.
    acked: Vec<AtomicU64>,
}

fn stable_key(i: usize) -> Vec<u8> {
    format!("k{i:05}/s").into_bytes()
}
fn shared_key(i: usize) -> Vec<u8> {
    format!("k{i:05}/x").into_bytes()
}
fn owned_key(i: usize, t: usize) -> Vec<u8> {
    format!("k{i:05}/o{t}").into_bytes()
}
fn batch_key(t: usize, round: usize, j: usize) -> Vec<u8> {
    format!("m/{t}/{round:04}/{j:03}").into_bytes()
}

/// What a parsed key is.
enum Kind {
    Stable(usize),
    Shared,
    Owned(usize, usize),
    Batch,
}

fn parse_key(k: &[u8]) -> Option<Kind> {
    let s = std::str::from_utf8(k).ok()?;
    if let Some(rest) = s.strip_prefix("m/") {
        let _writer: usize = rest.split('/').next()?.parse().ok()?;
        return Some(Kind::Batch);
    }
    let (i, what) = s.strip_prefix('k')?.split_once('/')?;
    let i: usize = i.parse().ok()?;
    match what {
        "s" => Some(Kind::Stable(i)),
        "x" => Some(Kind::Shared),
        _ => Some(Kind::Owned(i, what.strip_prefix('o')?.parse().ok()?)),
    }
}

impl Shared {
    fn slot(i: usize, t: usize) -> usize {
        i * THREADS + t
    }

    /// Whether the owner's write number `version` of owned key (i, t) is a removal.
    fn is_remove(&self, i: usize, t: usize, version: u64) -> bool {
        mix(self.seed ^ ((i as u64) << 20) ^ ((t as u64) << 16) ^ version.wrapping_mul(0x9e37))
            .is_multiple_of(4)
    }

    fn stable_value(i: usize) -> Vec<u8> {
        make_value(&stable_key(i), b's', 0, i as u64, i % 150)
    }

    fn owned_value(i: usize, t: usize, version: u64) -> Vec<u8> {
        let filler = (mix(version ^ i as u64) % 120) as usize;
        make_value(&owned_key(i, t), b'o', t as u8, version, filler)
    }

    /// Checks one observation of owned key (i, t), made between reading `acked` (before) and
    /// `started` (after): it must be the state after one of the writes `acked..=started`.
    fn check_owned(
        &self,
        i: usize,
        t: usize,
        window: (u64, u64),
        seen: Option<&[u8]>,
    ) -> Result<(), String> {
        let (lo, hi) = window;
        let key = owned_key(i, t);
        if let Some(v) = seen {
            let (tag, writer, version) = read_value(&key, v)?;
            if tag != b'o' || usize::from(writer) != t {
                return Err(format!("owned key {i}/{t} holds tag {tag} by {writer}"));
            }
            if version < lo || version > hi || version == 0 || self.is_remove(i, t, version) {
                return Err(format!(
                    "owned key {i}/{t}: saw version {version}, allowed {lo}..={hi} (lost update)"
                ));
            }
            if v != Shared::owned_value(i, t, version).as_slice() {
                return Err(format!("owned key {i}/{t}: version {version} bytes differ"));
            }
        } else {
            let absent_ok = lo == 0 || (lo..=hi).any(|v| v > 0 && self.is_remove(i, t, v));
            if !absent_ok {
                return Err(format!(
                    "owned key {i}/{t}: absent, but every write in {lo}..={hi} inserted it"
                ));
            }
        }
        Ok(())
    }
}

/// A scan over random bounds in random direction, checked against everything known.
fn checked_scan(tree: &Tree, sh: &Shared, rng: &mut StdRng) -> Result<usize, String> {
    let a = rng.gen_range(0..sh.prefixes);
    let b = (a + rng.gen_range(1..200)).min(sh.prefixes);
    let lo_key = format!("k{a:05}").into_bytes();
    let hi_key = if rng.gen_ratio(1, 10) {
        b"n".to_vec() // past the batch keys too
    } else {
        format!("k{b:05}").into_bytes()
    };
    let lower = if rng.gen_ratio(1, 8) {
        Bound::Unbounded
    } else {
        Bound::Included(lo_key.clone())
    };
    let upper = Bound::Excluded(hi_key.clone());
    let first = match &lower {
        Bound::Unbounded => 0,
        _ => a,
    };
    let last = if hi_key == b"n" { sh.prefixes } else { b };
    let windows_before: Vec<u64> = (first..last)
        .flat_map(|i| (0..THREADS).map(move |t| (i, t)))
        .map(|(i, t)| sh.acked[Shared::slot(i, t)].load(Ordering::SeqCst))
        .collect();
    let reverse = rng.gen_bool(0.5);
    let iter = tree.range::<Vec<u8>, _>((lower, upper));
    let items: Vec<(Vec<u8>, Vec<u8>)> = if reverse {
        iter.rev().collect::<Result<_, _>>()
    } else {
        iter.collect::<Result<_, _>>()
    }
    .map_err(|e| format!("scan error: {e}"))?;
    let windows_after: Vec<u64> = (first..last)
        .flat_map(|i| (0..THREADS).map(move |t| (i, t)))
        .map(|(i, t)| sh.started[Shared::slot(i, t)].load(Ordering::SeqCst))
        .collect();
    let dir = if reverse { "descending" } else { "ascending" };
    for w in items.windows(2) {
        let ordered = if reverse {
            w[0].0 > w[1].0
        } else {
            w[0].0 < w[1].0
        };
        if !ordered {
            return Err(format!(
                "{dir} scan [k{first:05}, {:?}): {:?} then {:?} (out of order or repeated)",
                String::from_utf8_lossy(&hi_key),
                String::from_utf8_lossy(&w[0].0),
                String::from_utf8_lossy(&w[1].0)
            ));
        }
    }
    let mut stable_seen = vec![false; last - first];
    let mut owned_seen: Vec<Option<&[u8]>> = vec![None; (last - first) * THREADS];
    for (k, v) in &items {
        let ks = String::from_utf8_lossy(k);
        match parse_key(k) {
            Some(Kind::Stable(i)) if (first..last).contains(&i) => {
                if v != &Shared::stable_value(i) {
                    return Err(format!("{dir} scan: stable key {ks} has a wrong value"));
                }
                stable_seen[i - first] = true;
            }
            Some(Kind::Owned(i, t)) if (first..last).contains(&i) && t < THREADS => {
                owned_seen[(i - first) * THREADS + t] = Some(v);
            }
            Some(Kind::Shared) => {
                let (tag, _, _) = read_value(k, v).map_err(|e| format!("{ks}: {e}"))?;
                if tag != b'x' {
                    return Err(format!("shared key {ks} has tag {tag}"));
                }
            }
            Some(Kind::Batch) => {
                read_value(k, v).map_err(|e| format!("{ks}: {e}"))?;
            }
            _ => return Err(format!("{dir} scan returned a key out of range: {ks}")),
        }
    }
    if let Some(missing) = stable_seen.iter().position(|s| !s) {
        return Err(format!(
            "{dir} scan [k{first:05}, {:?}) missed stable key k{:05}/s ({} records returned)",
            String::from_utf8_lossy(&hi_key),
            first + missing,
            items.len()
        ));
    }
    for (n, seen) in owned_seen.iter().enumerate() {
        let (i, t) = (first + n / THREADS, n % THREADS);
        sh.check_owned(i, t, (windows_before[n], windows_after[n]), *seen)
            .map_err(|e| format!("{dir} scan: {e}"))?;
    }
    Ok(items.len())
}

/// A batch this thread alone writes: insert it, scan it whole both ways while nobody else
/// touches it, remove it and scan again. Empties whole leaves, so they are removed.
fn batch_round(tree: &Tree, t: usize, round: usize, size: usize) -> Result<(), String> {
    let keys: Vec<Vec<u8>> = (0..size).map(|j| batch_key(t, round, j)).collect();
    for (j, k) in keys.iter().enumerate() {
        let v = make_value(k, b'b', t as u8, round as u64, 40 + j % 80);
        tree.insert(k, &v)
            .map_err(|e| format!("batch insert: {e}"))?;
    }
    let lo = format!("m/{t}/{round:04}/").into_bytes();
    let hi = format!("m/{t}/{round:04}0").into_bytes();
    for rev in [false, true] {
        let it = tree.range(lo.clone()..hi.clone());
        let mut got: Vec<Vec<u8>> = if rev {
            it.rev().map(|r| r.map(|kv| kv.0)).collect::<Result<_, _>>()
        } else {
            it.map(|r| r.map(|kv| kv.0)).collect::<Result<_, _>>()
        }
        .map_err(|e| format!("batch scan: {e}"))?;
        if rev {
            got.reverse();
        }
        if got != keys {
            return Err(format!(
                "batch {t}/{round} (rev {rev}): scan returned {} of {} keys present throughout",
                got.len(),
                keys.len()
            ));
        }
    }
    for k in &keys {
        tree.remove(k).map_err(|e| format!("batch remove: {e}"))?;
    }
    let left = tree.range(lo.clone()..hi.clone()).count() + tree.range(lo..hi).rev().count();
    if left != 0 {
        return Err(format!(
            "batch {t}/{round}: {left} removed keys still scanned"
        ));
    }
    Ok(())
}

/// One thread: `ops` random operations, a scan now and then, a batch round now and then.
fn worker(tree: &Tree, sh: &Shared, t: usize, ops: usize) -> Result<(usize, usize), String> {
    let mut rng = StdRng::seed_from_u64(sh.seed.wrapping_add(t as u64 * 0x1234_5678));
    let mut next_version = vec![1u64; sh.prefixes];
    let (mut scans, mut scanned) = (0, 0);
    for op in 0..ops {
        let i = rng.gen_range(0..sh.prefixes);
        let ctx = |e: String| format!("thread {t} op {op}: {e}");
        match rng.gen_range(0..100) {
            0..=39 => {
                // A write to this thread's own key, with the next version.
                let v = next_version[i];
                next_version[i] += 1;
                let slot = Shared::slot(i, t);
                sh.started[slot].store(v, Ordering::SeqCst);
                let key = owned_key(i, t);
                let r = if sh.is_remove(i, t, v) {
                    tree.remove(&key)
                } else {
                    tree.insert(&key, Shared::owned_value(i, t, v))
                };
                r.map_err(|e| ctx(format!("write: {e}")))?;
                sh.acked[slot].store(v, Ordering::SeqCst);
            }
            40..=54 => {
                let key = shared_key(i);
                let r = if rng.gen_ratio(1, 3) {
                    tree.remove(&key)
                } else {
                    let filler = rng.gen_range(0..200);
                    tree.insert(&key, make_value(&key, b'x', t as u8, op as u64, filler))
                };
                r.map_err(|e| ctx(format!("shared write: {e}")))?;
            }
            55..=84 => {
                // Read someone's owned key (often another thread's).
                let o = rng.gen_range(0..THREADS);
                let slot = Shared::slot(i, o);
                let lo = sh.acked[slot].load(Ordering::SeqCst);
                let got = tree
                    .get(owned_key(i, o))
                    .map_err(|e| ctx(format!("get: {e}")))?;
                let hi = sh.started[slot].load(Ordering::SeqCst);
                sh.check_owned(i, o, (lo, hi), got.as_deref())
                    .map_err(|e| ctx(format!("get: {e}")))?;
            }
            85..=92 => {
                let got = tree.get(stable_key(i)).map_err(|e| ctx(format!("{e}")))?;
                if got.as_deref() != Some(Shared::stable_value(i).as_slice()) {
                    return Err(ctx(format!(
                        "stable key {i}: got {:?} bytes",
                        got.map(|v| v.len())
                    )));
                }
                if let Some(v) = tree.get(shared_key(i)).map_err(|e| ctx(format!("{e}")))? {
                    read_value(&shared_key(i), &v).map_err(|e| ctx(format!("shared {i}: {e}")))?;
                }
            }
            93..=98 => {
                scanned += checked_scan(tree, sh, &mut rng).map_err(ctx)?;
                scans += 1;
            }
            _ => batch_round(tree, t, op, rng.gen_range(50..400)).map_err(ctx)?,
        }
    }
    Ok((scans, scanned))
}

/// Runs the whole workload on `tree`; `reopen` (file-backed trees) closes and reopens it at
/// the end and checks everything again.
fn run(config: Config, seed: u64, prefixes: usize, ops: usize, reopen: bool) -> bfkv::Stats {
    let started = Instant::now();
    let tree = Tree::open(config.clone()).expect("open");
    let sh = Shared {
        seed,
        prefixes,
        started: (0..prefixes * THREADS).map(|_| AtomicU64::new(0)).collect(),
        acked: (0..prefixes * THREADS).map(|_| AtomicU64::new(0)).collect(),
    };
    for i in 0..prefixes {
        tree.insert(stable_key(i), Shared::stable_value(i))
            .unwrap_or_else(|e| panic!("seed {seed}: stable insert {i}: {e}"));
    }
    let results: Vec<Result<(usize, usize), String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (tree, sh) = (&tree, &sh);
                s.spawn(move || worker(tree, sh, t, ops))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
            .collect()
    });
    let mut scans = 0;
    for r in &results {
        match r {
            Ok((n, _)) => scans += n,
            Err(e) => panic!("seed {seed}: {e}"),
        }
    }
    let check_final = |tree: &Tree, when: &str| {
        let all: Vec<(Vec<u8>, Vec<u8>)> = tree
            .iter()
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("seed {seed} {when}: iter: {e}"));
        let mut expected = Vec::new();
        for i in 0..prefixes {
            expected.push((stable_key(i), Shared::stable_value(i)));
            for t in 0..THREADS {
                let v = sh.acked[Shared::slot(i, t)].load(Ordering::SeqCst);
                if v > 0 && !sh.is_remove(i, t, v) {
                    expected.push((owned_key(i, t), Shared::owned_value(i, t, v)));
                }
            }
        }
        expected.sort();
        let mut owned_and_stable = Vec::new();
        for (k, v) in &all {
            match parse_key(k) {
                Some(Kind::Shared) => {
                    read_value(k, v).unwrap_or_else(|e| panic!("seed {seed} {when}: {e}"));
                }
                Some(Kind::Batch) => panic!("seed {seed} {when}: batch key left behind"),
                Some(_) => owned_and_stable.push((k.clone(), v.clone())),
                None => panic!("seed {seed} {when}: unknown key {k:?}"),
            }
        }
        assert!(
            owned_and_stable == expected,
            "seed {seed} {when}: final contents differ: {} records, expected {}",
            owned_and_stable.len(),
            expected.len()
        );
        for (k, v) in expected.iter().step_by(7) {
            let got = tree.get(k).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            assert_eq!(
                got.as_ref(),
                Some(v),
                "seed {seed} {when}: get after the run"
            );
        }
    };
    check_final(&tree, "after the run");
    let stats = tree.stats();
    eprintln!(
        "seed {seed}: {scans} scans, {:.1} s, {stats:?}",
        started.elapsed().as_secs_f64()
    );
    if reopen {
        tree.close()
            .unwrap_or_else(|e| panic!("seed {seed}: close: {e}"));
        let tree = Tree::open(config).unwrap_or_else(|e| panic!("seed {seed}: reopen: {e}"));
        check_final(&tree, "after reopen");
    }
    stats
}

fn seed() -> u64 {
    std::env::var("BFKV_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
}

#[test]
fn four_threads_on_a_file_backed_tree_with_a_small_cache() {
    let seed = seed();
    eprintln!("seed {seed}");
    let dir = tempfile::tempdir().expect("tempdir");
    let s = run(
        Config::new(dir.path()).cache_size(512 << 10),
        seed,
        3000,
        25_000,
        true,
    );
    assert!(
        s.evictions > 0 && s.splits > 0 && s.merges > 0 && s.leaves_removed > 0,
        "seed {seed}: the workload did not exercise eviction, splits, merges and leaf removal: {s:?}"
    );
}

#[test]
fn four_threads_on_an_in_memory_tree() {
    let seed = seed();
    eprintln!("seed {seed}");
    let s = run(
        Config::in_memory().cache_size(64 << 20),
        seed,
        2000,
        20_000,
        false,
    );
    // In memory every leaf is a full-page mirror: no mini-page merges, but splits and
    // removals of emptied leaves.
    assert!(
        s.splits > 0 && s.leaves_removed > 0,
        "seed {seed}: no splits or leaf removals: {s:?}"
    );
}
