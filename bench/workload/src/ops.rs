//! The phases of `docs/workloads.md` as streams of operations.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::{Rng, Zipf};

/// How a phase picks the record it touches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Distribution {
    /// Every record equally likely.
    Uniform,
    /// YCSB's scrambled Zipfian with skew θ (0 < θ < 1).
    Zipf(f64),
}

/// One phase of the workload (`docs/workloads.md`, "Phases").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// L: insert records 0..N, threads splitting the range.
    Load,
    /// A: 50 % read, 50 % update.
    A,
    /// B: 95 % read, 5 % update.
    B,
    /// C: 100 % read.
    C,
    /// E: 95 % scan (1..=100 records), 5 % insert of new records N, N+1, ...
    E,
    /// F: 50 % read, 50 % read-modify-write.
    F,
    /// U: 100 % read, uniform whatever the run's distribution.
    U,
}

impl Phase {
    /// Every phase, in `docs/workloads.md` order.
    pub const ALL: [Phase; 7] = [
        Phase::Load,
        Phase::A,
        Phase::B,
        Phase::C,
        Phase::E,
        Phase::F,
        Phase::U,
    ];

    /// The phase's letter (`L` for load).
    pub fn letter(self) -> char {
        match self {
            Phase::Load => 'L',
            Phase::A => 'A',
            Phase::B => 'B',
            Phase::C => 'C',
            Phase::E => 'E',
            Phase::F => 'F',
            Phase::U => 'U',
        }
    }

    /// The phase named by `letter` (either case), if any.
    pub fn from_letter(letter: char) -> Option<Phase> {
        Phase::ALL
            .into_iter()
            .find(|p| p.letter() == letter.to_ascii_uppercase())
    }
}

/// One operation on the engine under test. Records are numbers; [`crate::key`] and
/// [`crate::value`] turn them into bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Read the record.
    Read(u64),
    /// Overwrite the record with its value at `version`.
    Update {
        /// Record number.
        record: u64,
        /// Version to write.
        version: u64,
    },
    /// Insert a record that does not exist yet (load, E).
    Insert(u64),
    /// Read `len` records in key order from the record's key on.
    Scan {
        /// Record whose key starts the scan.
        start: u64,
        /// Records to read.
        len: usize,
    },
    /// Read the record, then write its value with the version read plus one.
    ReadModifyWrite(u64),
}

/// Records thread `thread` of `threads` inserts in the load phase of `n` records.
pub fn load_range(n: u64, threads: usize, thread: usize) -> Range<u64> {
    let t = threads.max(1) as u128;
    let bound = |k: usize| (u128::from(n) * k as u128 / t) as u64;
    bound(thread)..bound(thread + 1)
}

/// Chooses records for one thread of one phase.
#[derive(Debug, Clone)]
enum Chooser {
    /// Uniform over `0..n`.
    Uniform(u64),
    /// Scrambled Zipf.
    Zipf(Zipf),
}

/// The operations of one thread in one phase: finite for the load phase (the thread's share
/// of the records), endless otherwise. Deterministic for a given seed, phase and thread
/// (except which new record numbers E's inserts get, which threads draw from a shared
/// counter so the inserted records are exactly N, N+1, ...).
#[derive(Debug, Clone)]
pub struct OpGen {
    /// The phase.
    phase: Phase,
    /// This thread's generator.
    rng: Rng,
    /// Record choice for reads, updates and scan starts.
    chooser: Chooser,
    /// Load phase: the records still to insert.
    load: Range<u64>,
    /// E's next new record number, shared by the phase's threads.
    next_insert: Arc<AtomicU64>,
    /// Operations produced so far (used as the version of updates, so each is distinct).
    count: u64,
}

impl OpGen {
    /// Thread `thread` of `threads` in `phase` over `n` records, choosing with `dist` (phase U
    /// is always uniform), seeded with `seed`. `next_insert` is shared by all threads of an
    /// E phase and starts at the current record count.
    ///
    /// `None` if `n` is 0 or the Zipf θ is outside (0, 1).
    pub fn new(
        phase: Phase,
        n: u64,
        dist: Distribution,
        seed: u64,
        thread: usize,
        threads: usize,
        next_insert: Arc<AtomicU64>,
    ) -> Option<OpGen> {
        let chooser = match (phase, dist) {
            (Phase::U, _) | (_, Distribution::Uniform) if n > 0 => Chooser::Uniform(n),
            (_, Distribution::Zipf(theta)) => Chooser::Zipf(Zipf::new(n, theta)?),
            _ => return None,
        };
        let load = if phase == Phase::Load {
            load_range(n, threads, thread)
        } else {
            0..0
        };
        Some(OpGen {
            phase,
            rng: Rng::for_thread(seed, phase, thread),
            chooser,
            load,
            next_insert,
            count: 0,
        })
    }

    /// The next record to touch.
    fn record(&mut self) -> u64 {
        match &self.chooser {
            Chooser::Uniform(n) => self.rng.below(*n),
            Chooser::Zipf(z) => z.next_record(&mut self.rng),
        }
    }

    /// Whether a percentage draw falls under `percent`.
    fn chance(&mut self, percent: u64) -> bool {
        self.rng.below(100) < percent
    }
}

impl Iterator for OpGen {
    type Item = Op;

    fn next(&mut self) -> Option<Op> {
        self.count += 1;
        let op = match self.phase {
            Phase::Load => Op::Insert(self.load.next()?),
            Phase::A | Phase::B => {
                let read_percent = if self.phase == Phase::A { 50 } else { 95 };
                if self.chance(read_percent) {
                    Op::Read(self.record())
                } else {
                    Op::Update {
                        record: self.record(),
                        version: self.count,
                    }
                }
            }
            Phase::C | Phase::U => Op::Read(self.record()),
            Phase::E => {
                if self.chance(95) {
                    let start = self.record();
                    let len = 1 + self.rng.below(100) as usize;
                    Op::Scan { start, len }
                } else {
                    Op::Insert(self.next_insert.fetch_add(1, Ordering::Relaxed))
                }
            }
            Phase::F => {
                if self.chance(50) {
                    Op::Read(self.record())
                } else {
                    Op::ReadModifyWrite(self.record())
                }
            }
        };
        Some(op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gen(phase: Phase, dist: Distribution, thread: usize) -> OpGen {
        OpGen::new(
            phase,
            10_000,
            dist,
            5,
            thread,
            2,
            Arc::new(AtomicU64::new(10_000)),
        )
        .unwrap()
    }

    #[test]
    fn load_splits_the_range_exactly() {
        let parts: Vec<Range<u64>> = (0..3).map(|t| load_range(10, 3, t)).collect();
        assert_eq!(parts, [0..3, 3..6, 6..10]);
        let a: Vec<Op> = gen(Phase::Load, Distribution::Uniform, 1).collect();
        assert_eq!(a.len(), 5_000);
        assert_eq!(a[0], Op::Insert(5_000));
        assert_eq!(a[4_999], Op::Insert(9_999));
    }

    #[test]
    fn mixes_match_the_phase_table() {
        let count = |phase, pred: fn(&Op) -> bool| {
            gen(phase, Distribution::Zipf(0.9), 0)
                .take(100_000)
                .filter(pred)
                .count()
        };
        let a_reads = count(Phase::A, |op| matches!(op, Op::Read(_)));
        assert!((49_000..51_000).contains(&a_reads), "{a_reads}");
        let b_updates = count(Phase::B, |op| matches!(op, Op::Update { .. }));
        assert!((4_500..5_500).contains(&b_updates), "{b_updates}");
        assert_eq!(count(Phase::C, |op| matches!(op, Op::Read(_))), 100_000);
        let e_inserts = count(Phase::E, |op| matches!(op, Op::Insert(_)));
        assert!((4_500..5_500).contains(&e_inserts), "{e_inserts}");
        let f_rmw = count(Phase::F, |op| matches!(op, Op::ReadModifyWrite(_)));
        assert!((49_000..51_000).contains(&f_rmw), "{f_rmw}");
    }

    #[test]
    fn scans_and_inserts_of_e() {
        let shared = Arc::new(AtomicU64::new(10_000));
        let mk = |t| {
            OpGen::new(
                Phase::E,
                10_000,
                Distribution::Zipf(0.9),
                1,
                t,
                2,
                shared.clone(),
            )
            .unwrap()
        };
        let mut inserted: Vec<u64> = mk(0)
            .take(2_000)
            .chain(mk(1).take(2_000))
            .filter_map(|op| match op {
                Op::Insert(r) => Some(r),
                Op::Scan { start, len } => {
                    assert!(start < 10_000 && (1..=100).contains(&len));
                    None
                }
                other => panic!("E produced {other:?}"),
            })
            .collect();
        inserted.sort_unstable();
        let expect: Vec<u64> = (10_000..10_000 + inserted.len() as u64).collect();
        assert_eq!(inserted, expect);
    }

    #[test]
    fn same_seed_same_ops_and_u_is_uniform() {
        let a: Vec<Op> = gen(Phase::A, Distribution::Zipf(0.9), 1)
            .take(1_000)
            .collect();
        let b: Vec<Op> = gen(Phase::A, Distribution::Zipf(0.9), 1)
            .take(1_000)
            .collect();
        assert_eq!(a, b);
        let other: Vec<Op> = gen(Phase::A, Distribution::Zipf(0.9), 0)
            .take(1_000)
            .collect();
        assert_ne!(a, other);

        // Under Zipf the hottest record takes a large share; under U none does.
        let hottest = |g: OpGen| {
            let mut counts = vec![0u32; 10_000];
            for op in g.take(50_000) {
                if let Op::Read(r) = op {
                    counts[r as usize] += 1;
                }
            }
            counts.into_iter().max().unwrap_or(0)
        };
        assert!(hottest(gen(Phase::C, Distribution::Zipf(0.9), 0)) > 2_000);
        assert!(hottest(gen(Phase::U, Distribution::Zipf(0.9), 0)) < 30);
        assert_eq!(Phase::from_letter('e'), Some(Phase::E));
        assert_eq!(Phase::from_letter('l'), Some(Phase::Load));
        assert_eq!(Phase::from_letter('x'), None);
    }
}
