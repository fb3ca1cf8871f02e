//! YCSB's `ZipfianGenerator` (Gray et al., "Quickly generating billion-record synthetic
//! databases", SIGMOD 1994) and YCSB's FNV-1a scramble of its ranks.

use crate::Rng;

/// The skew every workload uses unless told otherwise (YCSB's default).
pub const DEFAULT_THETA: f64 = 0.9;

/// Terms of ζ summed exactly before the Euler–Maclaurin tail takes over: from 2^10 on, the
/// first dropped correction term is about 1e-18, and the exact part costs ~10 µs (a
/// generator is built per thread and per run, inside benchmark timings).
const EXACT_TERMS: u64 = 1 << 10;

/// ζ(n, θ) = Σ_{i=1..n} i^-θ, for 0 < θ < 1.
///
/// Exact summation up to 2^10 terms; beyond, the Euler–Maclaurin formula for the tail, so a
/// generator over billions of records is built in constant time and a 5M-record one does not
/// cost 5M `powf` calls per thread and phase.
pub fn zeta(n: u64, theta: f64) -> f64 {
    if n <= EXACT_TERMS {
        return zeta_extend(0.0, 0, n, theta);
    }
    let head = zeta_extend(0.0, 0, EXACT_TERMS - 1, theta);
    let (a, b) = (EXACT_TERMS as f64, n as f64);
    let f = |x: f64| x.powf(-theta);
    let f1 = |x: f64| -theta * x.powf(-theta - 1.0);
    let f3 = |x: f64| -theta * (theta + 1.0) * (theta + 2.0) * x.powf(-theta - 3.0);
    let integral = (b.powf(1.0 - theta) - a.powf(1.0 - theta)) / (1.0 - theta);
    head + integral + (f(a) + f(b)) / 2.0 + (f1(b) - f1(a)) / 12.0 - (f3(b) - f3(a)) / 720.0
}

/// YCSB's incremental formula: ζ over `to` items given `sum` = ζ over `from` items, adding
/// the terms `from+1 ..= to`. Used to grow a generator when records are inserted.
pub fn zeta_extend(sum: f64, from: u64, to: u64, theta: f64) -> f64 {
    (from + 1..=to).fold(sum, |s, i| s + (i as f64).powf(-theta))
}

/// FNV-1a-64 of `rank` as 8 little-endian bytes, reduced to a record in `0..n`: YCSB's
/// scramble, so rank 0 (the hottest) is not record 0 and hot records are spread out.
pub fn scramble(rank: u64, n: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in rank.to_le_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h % n
}

/// Zipf-distributed ranks in `0..n`: rank 0 most popular, P(rank r) ∝ (r+1)^-θ.
#[derive(Debug, Clone)]
pub struct Zipf {
    /// Number of ranks.
    n: u64,
    /// Skew θ, in (0, 1).
    theta: f64,
    /// 1 / (1 - θ).
    alpha: f64,
    /// ζ(n, θ).
    zetan: f64,
    /// Gray et al.'s η for the current `n`.
    eta: f64,
    /// 1 + 0.5^θ: below it (scaled by ζ(n)) a draw is rank 1.
    rank1_bound: f64,
}

impl Zipf {
    /// A generator over `n` ranks with skew `theta`; `None` unless `n > 0` and
    /// `0 < theta < 1` (the formula's domain).
    pub fn new(n: u64, theta: f64) -> Option<Zipf> {
        if n == 0 || !(theta > 0.0 && theta < 1.0) {
            return None;
        }
        Some(Zipf::with_zeta(n, theta, zeta(n, theta)))
    }

    /// The generator for `n` ranks given ζ(n, θ).
    fn with_zeta(n: u64, theta: f64, zetan: f64) -> Zipf {
        let zeta2 = 1.0 + 0.5f64.powf(theta);
        let eta = (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan);
        Zipf {
            n,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            eta,
            rank1_bound: zeta2,
        }
    }

    /// Number of ranks.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Always false: a generator has at least one rank.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The generator over `n` (≥ the current count) ranks, ζ extended incrementally.
    pub fn grow(&self, n: u64) -> Zipf {
        if n <= self.n {
            return self.clone();
        }
        let zetan = zeta_extend(self.zetan, self.n, n, self.theta);
        Zipf::with_zeta(n, self.theta, zetan)
    }

    /// The next rank.
    pub fn next_rank(&self, rng: &mut Rng) -> u64 {
        let u = rng.next_f64();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < self.rank1_bound {
            return 1.min(self.n - 1);
        }
        let r = (self.n as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        r.min(self.n - 1)
    }

    /// The next record: a rank scrambled over `0..n`.
    pub fn next_record(&self, rng: &mut Rng) -> u64 {
        scramble(self.next_rank(rng), self.n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeta_tail_matches_exact_sum() {
        for n in [EXACT_TERMS + 1, 5_000, 1_000_000, 3_000_001] {
            let exact = zeta_extend(0.0, 0, n, 0.9);
            let fast = zeta(n, 0.9);
            assert!(
                ((exact - fast) / exact).abs() < 1e-9,
                "{n}: {exact} vs {fast}"
            );
        }
        let z = zeta(1000, 0.99);
        assert_eq!(
            z,
            zeta_extend(zeta_extend(0.0, 0, 400, 0.99), 400, 1000, 0.99)
        );
    }

    #[test]
    fn head_frequencies_match_theory() {
        let n = 1000;
        let z = Zipf::new(n, 0.9).unwrap();
        let mut rng = Rng::new(7);
        let draws = 400_000;
        let mut counts = vec![0u32; n as usize];
        for _ in 0..draws {
            counts[z.next_rank(&mut rng) as usize] += 1;
        }
        let zetan = zeta(n, 0.9);
        for (r, &count) in counts.iter().enumerate().take(2) {
            let expect = ((r + 1) as f64).powf(-0.9) / zetan;
            let got = f64::from(count) / f64::from(draws);
            assert!(
                (got - expect).abs() < 0.05 * expect,
                "rank {r}: {got} vs {expect}"
            );
        }
        // Rank 0 of 1000 at θ = 0.9 is 1/ζ(1000, 0.9) = 9.50 % of draws (computed in Python).
        assert!((0.090..0.100).contains(&(f64::from(counts[0]) / f64::from(draws))));
        // Later ranks follow the curve roughly (Gray et al.'s formula is approximate there).
        let ten_share = f64::from(counts[10..20].iter().sum::<u32>()) / f64::from(draws);
        let ten_expect: f64 = (11..21).map(|i| f64::from(i).powf(-0.9)).sum::<f64>() / zetan;
        assert!(
            (ten_share - ten_expect).abs() < 0.25 * ten_expect,
            "{ten_share} vs {ten_expect}"
        );
        assert!(counts.iter().sum::<u32>() == draws);
    }

    #[test]
    fn bad_parameters_are_refused() {
        assert!(Zipf::new(0, 0.9).is_none());
        assert!(Zipf::new(10, 1.0).is_none());
        assert!(Zipf::new(10, 0.0).is_none());
        assert!(Zipf::new(10, f64::NAN).is_none());
        let one = Zipf::new(1, 0.9).unwrap();
        let mut rng = Rng::new(1);
        assert!((0..100).all(|_| one.next_record(&mut rng) == 0));
    }

    #[test]
    fn grow_matches_fresh_generator() {
        let small = Zipf::new(1000, 0.9).unwrap();
        let grown = small.grow(1500);
        let fresh = Zipf::new(1500, 0.9).unwrap();
        assert_eq!(grown.len(), 1500);
        assert!((grown.zetan - fresh.zetan).abs() < 1e-12);
        let (mut a, mut b) = (Rng::new(3), Rng::new(3));
        assert!((0..1000).all(|_| grown.next_rank(&mut a) == fresh.next_rank(&mut b)));
    }

    #[test]
    fn scramble_is_fnv1a_of_le_bytes() {
        // Reference values computed independently (Python FNV-1a-64, mod 1000).
        let got: Vec<u64> = (0..5).map(|r| scramble(r, 1000)).collect();
        assert_eq!(got, [405, 996, 223, 814, 769]);
        let z = Zipf::new(1_000_000, 0.9).unwrap();
        let mut rng = Rng::new(11);
        assert!((0..10_000).all(|_| z.next_record(&mut rng) < 1_000_000));
    }
}
