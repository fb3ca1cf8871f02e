//! Tests of the blob file and its extent allocator.

use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

use super::{blocks_for, BlobFile, Extents, BLOB_BLOCK};
use crate::error::Error;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

fn random_bytes(rng: &mut SmallRng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill_bytes(&mut v);
    v
}

/// A blob file in a fresh directory (kept alive by the returned `TempDir`).
fn blob_file() -> (tempfile::TempDir, BlobFile) {
    let dir = tempfile::tempdir().unwrap();
    let blob = BlobFile::open(&dir.path().join("blob")).unwrap();
    (dir, blob)
}

/// Asserts `result` is the corruption a read beyond the end of the file must give.
fn assert_beyond_eof<T: std::fmt::Debug>(
    blob: &BlobFile,
    block: u64,
    result: crate::error::Result<T>,
) {
    match result {
        Err(Error::Corruption {
            file,
            page,
            offset,
            reason,
        }) => {
            assert_eq!(file, blob.path());
            assert_eq!(page, Some(block));
            assert_eq!(offset, None);
            assert_eq!(reason, "blob extent beyond the end of the blob file");
        }
        other => panic!("expected Corruption beyond the end, got {other:?}"),
    }
}

#[test]
fn blocks_for_rounds_up() {
    assert_eq!(blocks_for(0), 0);
    assert_eq!(blocks_for(1), 1);
    assert_eq!(blocks_for(4095), 1);
    assert_eq!(blocks_for(4096), 1);
    assert_eq!(blocks_for(4097), 2);
    assert_eq!(blocks_for(u64::MAX), u64::MAX / BLOB_BLOCK + 1);
}

#[test]
fn blob_file_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<BlobFile>();
    check::<Extents>();
}

#[test]
fn open_creates_a_private_file_and_reopens_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blob");
    let data = b"kept across a reopen";
    {
        let blob = BlobFile::open(&path).unwrap();
        assert_eq!(blob.path(), path);
        assert_eq!(blob.len_blocks().unwrap(), 0);
        // ext4 and xfs take O_DIRECT, tmpfs does not; either must work.
        eprintln!("blob file direct: {}", blob.is_direct());
        blob.write(3, data).unwrap();
        blob.sync().unwrap();
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let blob = BlobFile::open(&path).unwrap();
    assert_eq!(blob.len_blocks().unwrap(), 4);
    let mut back = vec![0u8; data.len()];
    blob.read(3, 0, &mut back).unwrap();
    assert_eq!(&back, data);
}

#[test]
fn round_trips_at_every_size() {
    let (dir, blob) = blob_file();
    let mut rng = SmallRng::seed_from_u64(0xb10b);
    let sizes = [
        0,
        1,
        4095,
        4096,
        4097,
        128 * KIB - 1,
        128 * KIB,
        128 * KIB + 1,
        512 * KIB - 1,
        512 * KIB,
        MIB,
        MIB + 3,
        16 * MIB,
    ];
    let mut extents = Extents::new();
    extents.allocate(7); // nothing starts at block 0
    let mut written = Vec::new();
    for &len in &sizes {
        let data = random_bytes(&mut rng, len);
        // One spare block between values, so padding that spilled over would show.
        let block = extents.allocate(blocks_for(len as u64) + 1);
        let crc = blob.write(block, &data).unwrap();
        let mut back = vec![0xAAu8; len];
        let read_crc = blob.read(block, 0, &mut back).unwrap();
        assert!(back == data, "round trip of {len} bytes at block {block}");
        // Checksummed in pieces by the threads, combined: the checksum of the whole.
        assert_eq!(
            crc,
            crate::store::checksum::crc32c(&data),
            "{len} bytes written"
        );
        assert_eq!(read_crc, crc, "{len} bytes read");
        written.push((block, data));
    }
    blob.sync().unwrap();
    // Everything still there after all later writes, and through a new handle.
    let again = BlobFile::open(&dir.path().join("blob")).unwrap();
    let raw = std::fs::read(dir.path().join("blob")).unwrap();
    for (block, data) in &written {
        let mut back = vec![0u8; data.len()];
        again.read(*block, 0, &mut back).unwrap();
        assert!(&back == data, "{} bytes at block {block}", data.len());
        let at = (*block * BLOB_BLOCK) as usize;
        assert!(raw[at..at + data.len()] == data[..]);
        // The last block is zero-padded, and the spare block after it never written.
        let padded_end = at + ((blocks_for(data.len() as u64) + 1) * BLOB_BLOCK) as usize;
        assert!(
            raw[at + data.len()..padded_end.min(raw.len())]
                .iter()
                .all(|&b| b == 0),
            "padding after {} bytes at block {block}",
            data.len()
        );
    }
}

#[test]
fn overwrite_with_a_shorter_value_zero_pads() {
    let (_dir, blob) = blob_file();
    let mut rng = SmallRng::seed_from_u64(5);
    // Old bytes on disk past the new value's end, and 6 chunks of 1 MiB for 4 threads: the
    // thread that writes the partial last chunk wrote a full one before with the same
    // buffer. Its padding must be zeros, neither the file's old bytes nor the buffer's.
    blob.write(1, &random_bytes(&mut rng, 8 * MIB)).unwrap();
    let short = random_bytes(&mut rng, 5 * MIB + 100);
    blob.write(1, &short).unwrap();
    let mut back = vec![0u8; short.len() + 3996];
    blob.read(1, 0, &mut back).unwrap();
    assert!(back[..short.len()] == short[..]);
    assert!(back[short.len()..].iter().all(|&b| b == 0));
}

#[test]
fn partial_reads_at_unaligned_offsets() {
    let (_dir, blob) = blob_file();
    let mut rng = SmallRng::seed_from_u64(0x9a27);
    let data = random_bytes(&mut rng, 5 * MIB + 17);
    let block = 11;
    blob.write(block, &data).unwrap();
    let mut cases: Vec<(usize, usize)> = vec![
        (0, 1),
        (1, 1),
        (4095, 1),
        (4095, 2),
        (4096, 4096),
        (4097, 8191),
        (100, 128 * KIB),
        (4095, 512 * KIB), // chunked: chunks of 128 KiB, the first one `head` short
        (4095, 512 * KIB + 1),
        (128 * KIB - 1, 600 * KIB), // spans chunk boundaries of 152 KiB chunks
        (MIB - 1, 2 * MIB + 2),     // 512 KiB chunks
        (1, 5 * MIB + 16),          // 1 MiB chunks, to the last byte
        (5 * MIB, 17),
        (data.len() - 1, 1),
    ];
    for _ in 0..60 {
        let offset = rng.gen_range(0..data.len());
        let len = if rng.gen_bool(0.5) {
            rng.gen_range(1..=(data.len() - offset).min(64 * KIB))
        } else {
            rng.gen_range(1..=data.len() - offset)
        };
        cases.push((offset, len));
    }
    for (offset, len) in cases {
        let mut back = vec![0x55u8; len];
        blob.read(block, offset as u64, &mut back).unwrap();
        assert!(
            back[..] == data[offset..offset + len],
            "read of {len} bytes at offset {offset}"
        );
    }
    // An offset beyond the first block of the extent reads from later blocks.
    let mut back = vec![0u8; 10];
    blob.read(block + 2, 5, &mut back).unwrap();
    assert_eq!(back[..], data[2 * 4096 + 5..2 * 4096 + 15]);
    // An empty read is fine anywhere.
    blob.read(1 << 40, 0, &mut []).unwrap();
}

#[test]
fn reads_past_the_end_are_corruption() {
    let (_dir, blob) = blob_file();
    let data = vec![7u8; 10_000];
    blob.write(2, &data).unwrap();
    assert_eq!(blob.len_blocks().unwrap(), 5);
    // The zero padding of the last block is inside the file.
    let mut back = vec![1u8; 3 * 4096];
    blob.read(2, 0, &mut back).unwrap();
    assert!(back[..10_000] == data[..] && back[10_000..].iter().all(|&b| b == 0));
    // One byte past the end, from an offset and from a later block.
    assert_beyond_eof(&blob, 2, blob.read(2, 3 * 4096, &mut [0u8; 1]));
    assert_beyond_eof(&blob, 2, blob.read(2, 100, &mut vec![0u8; 3 * 4096]));
    assert_beyond_eof(&blob, 5, blob.read(5, 0, &mut [0u8; 1]));
    assert_beyond_eof(&blob, 100, blob.read(100, 0, &mut [0u8; 4096]));
    // Large (chunked) reads too, whether the end falls in the first chunk or a later one.
    assert_beyond_eof(&blob, 0, blob.read(0, 0, &mut vec![0u8; MIB]));
    blob.write(10, &vec![3u8; 2 * MIB]).unwrap();
    assert_beyond_eof(&blob, 10, blob.read(10, 1, &mut vec![0u8; 2 * MIB]));
    // Offsets that fit no u64 are refused, not wrapped.
    assert!(matches!(
        blob.read(u64::MAX / 2, 0, &mut [0u8; 1]),
        Err(Error::Corruption { .. })
    ));
    assert!(matches!(
        blob.write(u64::MAX / 4096, &[1]),
        Err(Error::Corruption { .. })
    ));
}

#[test]
fn a_short_final_block_reads_up_to_the_end_of_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blob");
    let blob = BlobFile::open(&path).unwrap();
    let mut rng = SmallRng::seed_from_u64(77);
    let data = random_bytes(&mut rng, 700 * KIB);
    blob.write(0, &data).unwrap();
    // Cut the file inside its last block, as a crash or another tool might.
    let cut = data.len() - 50;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(cut as u64)
        .unwrap();
    assert_eq!(blob.len_blocks().unwrap(), blocks_for(cut as u64));
    for (offset, len) in [(cut - 10, 10), (0, cut), (cut - 5000, 5000), (3, cut - 3)] {
        let mut back = vec![0u8; len];
        blob.read(0, offset as u64, &mut back).unwrap();
        assert!(back[..] == data[offset..offset + len], "{offset}+{len}");
    }
    for (offset, len) in [(cut - 10, 11), (0, cut + 1), (cut, 1), (5, cut)] {
        assert_beyond_eof(&blob, 0, blob.read(0, offset as u64, &mut vec![0u8; len]));
    }
}

#[test]
fn set_len_blocks_shrinks_and_grows() {
    let (_dir, blob) = blob_file();
    blob.write(0, &vec![9u8; 10 * 4096]).unwrap();
    assert_eq!(blob.len_blocks().unwrap(), 10);
    blob.set_len_blocks(4).unwrap();
    assert_eq!(blob.len_blocks().unwrap(), 4);
    let mut back = vec![0u8; 4 * 4096];
    blob.read(0, 0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 9));
    assert_beyond_eof(&blob, 4, blob.read(4, 0, &mut [0u8; 1]));
    blob.set_len_blocks(6).unwrap();
    assert_eq!(blob.len_blocks().unwrap(), 6);
    blob.read(4, 0, &mut back[..2 * 4096]).unwrap();
    assert!(back[..2 * 4096].iter().all(|&b| b == 0));
    blob.set_len_blocks(0).unwrap();
    assert_eq!(blob.len_blocks().unwrap(), 0);
}

#[test]
fn concurrent_writers_and_readers_of_distinct_extents() {
    let (_dir, blob) = blob_file();
    let values: Vec<Vec<u8>> = (0..8)
        .map(|i| {
            random_bytes(
                &mut SmallRng::seed_from_u64(i),
                300 * KIB + i as usize * 97 * KIB,
            )
        })
        .collect();
    let mut extents = Extents::new();
    let starts: Vec<u64> = values
        .iter()
        .map(|v| extents.allocate(blocks_for(v.len() as u64)))
        .collect();
    std::thread::scope(|s| {
        for (v, &start) in values.iter().zip(&starts) {
            let blob = &blob;
            s.spawn(move || {
                blob.write(start, v).unwrap();
                let mut back = vec![0u8; v.len()];
                blob.read(start, 0, &mut back).unwrap();
                assert!(back == *v);
            });
        }
    });
    for (v, &start) in values.iter().zip(&starts) {
        let mut back = vec![0u8; v.len()];
        blob.read(start, 0, &mut back).unwrap();
        assert!(back == *v);
    }
}

/// Everything observable of an allocator, to check that a refused call changed nothing.
fn state(e: &Extents) -> (Vec<(u64, u64)>, u64, u64) {
    (e.free_runs(), e.end(), e.used_blocks())
}

#[test]
fn allocation_grows_at_the_end_and_freeing_coalesces() {
    let mut e = Extents::new();
    assert_eq!((e.end(), e.used_blocks(), e.free_blocks()), (0, 0, 0));
    assert_eq!(e.allocate(3), 0);
    assert_eq!(e.allocate(2), 3);
    assert_eq!(e.allocate(4), 5);
    assert_eq!(e.allocate(1), 9);
    assert_eq!((e.end(), e.used_blocks(), e.free_blocks()), (10, 10, 0));
    e.free(3, 2).unwrap();
    assert_eq!(e.free_runs(), [(3, 2)]);
    e.free(0, 3).unwrap(); // joins the run after it
    assert_eq!(e.free_runs(), [(0, 5)]);
    e.free(6, 2).unwrap(); // a hole inside an allocated run is fine
    assert_eq!(e.free_runs(), [(0, 5), (6, 2)]);
    e.free(5, 1).unwrap(); // joins both neighbours
    assert_eq!(e.free_runs(), [(0, 8)]);
    assert_eq!((e.end(), e.used_blocks(), e.free_blocks()), (10, 2, 8));
    e.free(9, 1).unwrap(); // at the end: the end drops to the last block in use
    assert_eq!((e.end(), e.free_runs()), (9, vec![(0, 8)]));
    e.free(8, 1).unwrap(); // the last run in use: the end drops through the free run too
    assert_eq!((e.end(), e.used_blocks(), e.free_runs()), (0, 0, vec![]));
    e.assert_index_consistent();
}

#[test]
fn allocation_is_best_fit() {
    // Free runs of 5 at 0, 2 at 10, 3 at 20, 2 at 30, 8 at 40; the end at 50.
    let used = [(5, 5), (12, 8), (23, 7), (32, 8), (48, 2)];
    let mut e = Extents::with_used(used).unwrap();
    assert_eq!(e.free_runs(), [(0, 5), (10, 2), (20, 3), (30, 2), (40, 8)]);
    assert_eq!(e.allocate(2), 10, "smallest run that fits, lowest start");
    assert_eq!(e.allocate(2), 30, "the equal run at 30 next");
    assert_eq!(e.allocate(1), 20, "smallest run left is 3 at 20");
    assert_eq!(e.free_runs(), [(0, 5), (21, 2), (40, 8)]);
    assert_eq!(e.allocate(6), 40);
    assert_eq!(e.allocate(9), 50, "no run holds 9: the end grows");
    assert_eq!(e.end(), 59);
    assert_eq!(e.allocate(5), 0, "an exact fit");
    assert_eq!(e.free_runs(), [(21, 2), (46, 2)]);
    assert_eq!(e.used_blocks() + e.free_blocks(), e.end());
    e.assert_index_consistent();
}

#[test]
fn refused_frees_change_nothing() {
    let mut e = Extents::with_used([(0, 4), (6, 4), (12, 2)]).unwrap();
    let before = state(&e);
    assert!(e.free(4, 1).is_err(), "a free block");
    assert!(e.free(3, 2).is_err(), "partly free");
    assert!(e.free(2, 10).is_err(), "covers a free run");
    assert!(e.free(13, 2).is_err(), "beyond the end");
    assert!(e.free(20, 1).is_err(), "far beyond the end");
    assert!(e.free(1, 0).is_err(), "empty");
    assert!(e.free(u64::MAX, 2).is_err(), "overflow");
    assert_eq!(state(&e), before);
    e.free(6, 4).unwrap();
    let before = state(&e);
    assert_eq!(
        e.free(6, 4),
        Err("blob run already free (double free)"),
        "double free"
    );
    assert!(e.free(12, 3).is_err());
    assert_eq!(state(&e), before);
    e.assert_index_consistent();
}

#[test]
fn claims_beyond_the_end_free_the_gap() {
    let mut e = Extents::new();
    e.claim(10, 5).unwrap();
    assert_eq!(
        (e.end(), e.used_blocks(), e.free_runs()),
        (15, 5, vec![(0, 10)])
    );
    e.claim(15, 1).unwrap(); // right at the end: no gap
    assert_eq!((e.end(), e.free_runs()), (16, vec![(0, 10)]));
    e.claim(3, 2).unwrap(); // inside the free run: splits it
    assert_eq!(e.free_runs(), [(0, 3), (5, 5)]);
    e.claim(0, 3).unwrap(); // a whole free run
    e.claim(20, 1).unwrap();
    assert_eq!(e.free_runs(), [(5, 5), (16, 4)]);
    assert_eq!((e.end(), e.used_blocks(), e.free_blocks()), (21, 12, 9));
    let before = state(&e);
    assert_eq!(
        e.claim(20, 1),
        Err("blob run already in use"),
        "the same run again"
    );
    assert!(e.claim(3, 2).is_err());
    assert!(e.claim(4, 3).is_err(), "partly in use");
    assert!(e.claim(8, 4).is_err(), "free then in use");
    assert!(e.claim(19, 5).is_err(), "free, in use, beyond the end");
    assert!(e.claim(6, 0).is_err(), "empty");
    assert!(e.claim(u64::MAX - 1, 3).is_err(), "overflow");
    assert_eq!(state(&e), before);
    assert_eq!(e.allocate(4), 16, "the gap is allocatable");
    e.assert_index_consistent();
}

#[test]
fn with_used_takes_runs_in_any_order_and_rejects_overlaps() {
    let e = Extents::with_used([(30, 2), (0, 1), (10, 10)]).unwrap();
    assert_eq!(e.free_runs(), [(1, 9), (20, 10)]);
    assert_eq!((e.end(), e.used_blocks(), e.free_blocks()), (32, 13, 19));
    let e = Extents::with_used(std::iter::empty()).unwrap();
    assert_eq!((e.end(), e.used_blocks()), (0, 0));
    assert_eq!(
        Extents::with_used([(0, 5), (4, 2)]).unwrap_err(),
        "overlapping blob runs"
    );
    assert!(Extents::with_used([(10, 5), (0, 11)]).is_err());
    assert!(Extents::with_used([(10, 5), (10, 5)]).is_err());
    assert!(Extents::with_used([(1, 2), (5, 0)]).is_err());
}

/// The allocator's expected behaviour, block by block.
struct Model {
    used: Vec<bool>,
}

impl Model {
    fn end(&self) -> u64 {
        self.used
            .iter()
            .rposition(|&u| u)
            .map_or(0, |i| i as u64 + 1)
    }

    fn is_used(&self, block: u64) -> bool {
        self.used.get(block as usize).copied().unwrap_or(false)
    }

    fn set(&mut self, start: u64, blocks: u64, to: bool) {
        let stop = (start + blocks) as usize;
        if self.used.len() < stop {
            self.used.resize(stop, false);
        }
        self.used[start as usize..stop].fill(to);
    }

    /// Maximal free runs below the end.
    fn free_runs(&self) -> Vec<(u64, u64)> {
        let mut runs = Vec::new();
        let mut run: Option<u64> = None;
        for b in 0..self.end() {
            match (self.is_used(b), run) {
                (false, None) => run = Some(b),
                (true, Some(s)) => {
                    runs.push((s, b - s));
                    run = None;
                }
                _ => {}
            }
        }
        runs
    }

    /// Where best-fit puts `blocks` blocks.
    fn best_fit(&self, blocks: u64) -> u64 {
        self.free_runs()
            .into_iter()
            .filter(|&(_, len)| len >= blocks)
            .min_by_key(|&(s, len)| (len, s))
            .map_or(self.end(), |(s, _)| s)
    }
}

fn check_against(e: &Extents, m: &Model) {
    let runs = e.free_runs();
    assert_eq!(runs, m.free_runs(), "free runs");
    assert_eq!(e.end(), m.end(), "end");
    let used = m.used.iter().filter(|&&u| u).count() as u64;
    assert_eq!(e.used_blocks(), used, "used");
    assert_eq!(e.used_blocks() + e.free_blocks(), e.end());
    assert_eq!(runs.iter().map(|r| r.1).sum::<u64>(), e.free_blocks());
    for w in runs.windows(2) {
        assert!(w[0].0 + w[0].1 < w[1].0, "runs overlap or touch: {w:?}");
    }
    if let Some(&(s, len)) = runs.last() {
        assert!(s + len < e.end(), "a free run reaches the end");
    }
    e.assert_index_consistent();
}

#[test]
fn randomized_against_a_block_model() {
    for seed in 0..8u64 {
        let mut rng = SmallRng::seed_from_u64(0xe47e + seed);
        let mut e = Extents::new();
        let mut m = Model { used: Vec::new() };
        let (mut refused_frees, mut refused_claims) = (0, 0);
        for _ in 0..3000 {
            let end = m.end();
            match rng.gen_range(0..10) {
                0..=3 => {
                    let blocks = rng.gen_range(1..=12);
                    let expect = m.best_fit(blocks);
                    assert_eq!(e.allocate(blocks), expect, "allocate {blocks}");
                    m.set(expect, blocks, true);
                }
                4..=6 if end > 0 => {
                    // Free part of a run in use (valid), from a random used block.
                    let mut start = rng.gen_range(0..end);
                    while !m.is_used(start) {
                        start = (start + 1) % end;
                    }
                    let mut blocks = 1;
                    let limit = rng.gen_range(1..=16);
                    while blocks < limit && m.is_used(start + blocks) {
                        blocks += 1;
                    }
                    e.free(start, blocks).unwrap();
                    m.set(start, blocks, false);
                }
                7 => {
                    // Any range: valid exactly when all of it is in use.
                    let start = rng.gen_range(0..end + 5);
                    let blocks = rng.gen_range(0..6);
                    let ok = blocks > 0 && (start..start + blocks).all(|b| m.is_used(b));
                    let before = state(&e);
                    assert_eq!(e.free(start, blocks).is_ok(), ok, "free {start}+{blocks}");
                    if ok {
                        m.set(start, blocks, false);
                    } else {
                        assert_eq!(state(&e), before);
                        refused_frees += 1;
                    }
                }
                _ => {
                    // Any range, beyond the end too: valid exactly when none of it is in use.
                    let start = rng.gen_range(0..end + 20);
                    let blocks = rng.gen_range(0..8);
                    let ok = blocks > 0 && (start..start + blocks).all(|b| !m.is_used(b));
                    let before = state(&e);
                    assert_eq!(e.claim(start, blocks).is_ok(), ok, "claim {start}+{blocks}");
                    if ok {
                        m.set(start, blocks, true);
                    } else {
                        assert_eq!(state(&e), before);
                        refused_claims += 1;
                    }
                }
            }
            check_against(&e, &m);
        }
        // The run exercised the error paths, not only the happy ones.
        assert!(refused_frees > 10 && refused_claims > 10);
        // Recovery's view of the same state builds the same allocator.
        let mut used_runs = Vec::new();
        let mut b = 0;
        while b < m.end() {
            if m.is_used(b) {
                let len = rng
                    .gen_range(1..=4)
                    .min((b..m.end()).take_while(|&x| m.is_used(x)).count() as u64);
                used_runs.push((b, len));
                b += len;
            } else {
                b += 1;
            }
        }
        let rebuilt = Extents::with_used(used_runs.into_iter().rev()).unwrap();
        assert_eq!(state(&rebuilt), state(&e));
        rebuilt.assert_index_consistent();
    }
}
