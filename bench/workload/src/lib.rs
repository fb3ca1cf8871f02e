//! The YCSB-style workloads bfkv is measured on, exactly as `docs/workloads.md` defines them, so
//! the `ycsb` example, the criterion benches and peer comparisons all drive engines with the
//! same records, the same key choice and the same operation mix.
//!
//! - [`key`] / [`value`]: record `i`'s 16-byte key and its value (16 or 100 bytes).
//! - [`Zipf`]: YCSB's `ZipfianGenerator` (Gray et al.) over ranks, [`scramble`]d with
//!   FNV-1a-64 so popular records are spread over the key space.
//! - [`Rng`]: a tiny seeded generator with a fixed algorithm, so a seed means the same
//!   operations on every platform and every version of this crate's dependencies.
//! - [`Phase`] and [`OpGen`]: the phases L/A/B/C/E/F/U as a stream of [`Op`]s.
//! - [`runner`]: the [`runner::Engine`] trait and the multi-threaded runner that drives an
//!   engine with those operations; [`engines`]: bfkv and Microsoft's `bf-tree` behind it;
//!   [`report`]: what the criterion benches print and read from the environment.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod engines;
mod ops;
pub mod report;
pub mod runner;
mod zipf;

pub use ops::{load_range, Distribution, Op, OpGen, Phase};
pub use zipf::{scramble, zeta, zeta_extend, Zipf, DEFAULT_THETA};

/// Bytes in every record key.
pub const KEY_LEN: usize = 16;
/// Default value size (little-endian record number, then little-endian version).
pub const VALUE_LEN: usize = 16;
/// The large-value variant.
pub const VALUE_LEN_LARGE: usize = 100;
/// Default record count (about 160 MB of raw records).
pub const DEFAULT_RECORDS: u64 = 5_000_000;

/// The SplitMix64 finalizer: a bijection on `u64`, so distinct records get distinct keys,
/// and consecutive record numbers land far apart in key order.
pub fn splitmix64(i: u64) -> u64 {
    let mut z = i;
    z ^= z >> 30;
    z = z.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z ^= z >> 27;
    z = z.wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Record `i`'s key: big-endian `splitmix64(i)` followed by 8 zero bytes.
pub fn key(i: u64) -> [u8; KEY_LEN] {
    let mut k = [0u8; KEY_LEN];
    k[..8].copy_from_slice(&splitmix64(i).to_be_bytes());
    k
}

/// Writes record `i`'s value at `version` into `buf` (at least 16 bytes): little-endian `i`,
/// little-endian `version`, and zeros for the rest (the 100-byte variant).
///
/// # Panics
/// If `buf` is shorter than 16 bytes (a caller bug, not an input condition).
pub fn write_value(buf: &mut [u8], i: u64, version: u64) {
    buf[..8].copy_from_slice(&i.to_le_bytes());
    buf[8..16].copy_from_slice(&version.to_le_bytes());
    buf[16..].fill(0);
}

/// Record `i`'s value at `version`, `len` bytes long (`len` ≥ 16).
pub fn value(i: u64, version: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len.max(16)];
    write_value(&mut v, i, version);
    v
}

/// Decodes a value written by [`write_value`]: `(record, version)`, or `None` if it is too
/// short to be one (a wrong value read back from an engine).
pub fn decode_value(v: &[u8]) -> Option<(u64, u64)> {
    let i = u64::from_le_bytes(v.get(..8)?.try_into().ok()?);
    let version = u64::from_le_bytes(v.get(8..16)?.try_into().ok()?);
    Some((i, version))
}

/// A seeded pseudo-random generator (SplitMix64 sequence). Fixed algorithm: the same seed
/// gives the same stream everywhere, which `rand`'s `SmallRng` does not promise.
#[derive(Debug, Clone)]
pub struct Rng {
    /// The Weyl-sequence state.
    state: u64,
}

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// The generator for one thread of one phase of a run with `seed`: distinct streams per
    /// (phase, thread) so threads do not replay each other's operations.
    pub fn for_thread(seed: u64, phase: Phase, thread: usize) -> Rng {
        let tag = (u64::from(phase.letter() as u8) << 32) ^ thread as u64;
        Rng::new(splitmix64(
            seed ^ splitmix64(tag.wrapping_add(0x9e37_79b9_7f4a_7c15)),
        ))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        splitmix64(self.state)
    }

    /// Uniform in `[0, 1)`, 53 bits of precision.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` (`n` > 0), by Lemire's multiply-shift with rejection, so there is
    /// no modulo bias even for large `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_big_endian_splitmix_then_zeros() {
        // splitmix64(0) = 0 since the finalizer fixes zero.
        assert_eq!(key(0), [0u8; 16]);
        // Reference values computed independently (Python, the same finalizer steps).
        assert_eq!(splitmix64(1), 0x5692_161d_100b_05e5);
        assert_eq!(
            key(1),
            [0x56, 0x92, 0x16, 0x1d, 0x10, 0x0b, 0x05, 0xe5, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(splitmix64(2), 0xdbd2_3897_3a2b_148a);
        assert_eq!(&key(2)[..8], &0xdbd2_3897_3a2b_148au64.to_be_bytes());
        assert_eq!(&key(12345)[..8], &0xf36c_f116_4265_dd51u64.to_be_bytes());
        assert_eq!(&key(12345)[8..], &[0u8; 8]);
    }

    #[test]
    fn keys_are_distinct_and_unordered() {
        let mut keys: Vec<[u8; 16]> = (0..10_000).map(key).collect();
        let in_order = keys.windows(2).filter(|w| w[0] < w[1]).count();
        // Random order: about half the neighbours ascend.
        assert!((4_000..6_000).contains(&in_order), "{in_order}");
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), 10_000);
    }

    #[test]
    fn values_round_trip() {
        let v = value(7, 3, VALUE_LEN);
        assert_eq!(v, [7, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(decode_value(&v), Some((7, 3)));
        let big = value(u64::MAX, 9, VALUE_LEN_LARGE);
        assert_eq!(big.len(), 100);
        assert_eq!(decode_value(&big), Some((u64::MAX, 9)));
        assert!(big[16..].iter().all(|&b| b == 0));
        assert_eq!(decode_value(&v[..15]), None);
    }

    #[test]
    fn rng_is_deterministic_and_uniform() {
        let a: Vec<u64> = {
            let mut r = Rng::for_thread(42, Phase::A, 1);
            (0..100).map(|_| r.next_u64()).collect()
        };
        let mut r = Rng::for_thread(42, Phase::A, 1);
        assert!(a.iter().all(|&x| x == r.next_u64()));
        let mut other = Rng::for_thread(42, Phase::A, 2);
        assert_ne!(a[0], other.next_u64());
        let mut other = Rng::for_thread(42, Phase::C, 1);
        assert_ne!(a[0], other.next_u64());

        let mut counts = [0u32; 10];
        let mut r = Rng::new(1);
        for _ in 0..100_000 {
            counts[r.below(10) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_500..10_500).contains(&c)),
            "{counts:?}"
        );
        let f = r.next_f64();
        assert!((0.0..1.0).contains(&f));
    }
}
