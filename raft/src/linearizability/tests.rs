//! Tests of the linearizability checker: hand-written histories with known verdicts, the
//! recorder driven by threads, generated histories (intact and corrupted), and agreement
//! with an exhaustive search on small random histories.

use super::*;

/// A value; `None` (absent) is written out where meant.
#[allow(clippy::unnecessary_wraps)] // register values are `Option`s
fn v(s: &str) -> Option<Vec<u8>> {
    Some(s.as_bytes().to_vec())
}

fn done(client: u64, invoke: u64, complete: u64, op: Op) -> Operation {
    let (key, complete, outcome) = (b"k".to_vec(), Some(complete), Outcome::Ok);
    Operation {
        client,
        key,
        op,
        invoke,
        complete,
        outcome,
    }
}

fn unknown(client: u64, invoke: u64, op: Op) -> Operation {
    let (key, complete, outcome) = (b"k".to_vec(), None, Outcome::Unknown);
    Operation {
        client,
        key,
        op,
        invoke,
        complete,
        outcome,
    }
}

fn read(seen: Option<Vec<u8>>) -> Op {
    Op::Read(seen)
}

fn write(value: Option<Vec<u8>>) -> Op {
    Op::Write(value)
}

fn cas(expected: Option<Vec<u8>>, new: Option<Vec<u8>>, succeeded: bool) -> Op {
    Op::Cas {
        expected,
        new,
        succeeded,
    }
}

fn verdict(ops: &[Operation]) -> Verdict {
    check_operations(ops, DEFAULT_STEP_BUDGET)
}

fn linearizable(ops: &[Operation]) -> bool {
    match verdict(ops) {
        Verdict::Linearizable => true,
        Verdict::NotLinearizable { .. } => false,
        inconclusive @ Verdict::Inconclusive { .. } => panic!("{inconclusive}"),
    }
}

#[test]
fn a_sequential_history_is_linearizable() {
    let ops = [
        done(1, 1, 2, read(None)),
        done(1, 3, 4, write(v("a"))),
        done(2, 5, 6, read(v("a"))),
        done(2, 7, 8, cas(v("a"), v("b"), true)),
        done(1, 9, 10, cas(v("a"), v("c"), false)),
        done(1, 11, 12, read(v("b"))),
        done(2, 13, 14, write(None)),
        done(1, 15, 16, read(None)),
    ];
    assert_eq!(verdict(&ops), Verdict::Linearizable);
}

#[test]
fn a_read_overlapping_two_writes_may_see_either() {
    let writes = [done(1, 1, 10, write(v("a"))), done(2, 2, 11, write(v("b")))];
    for seen in [v("a"), v("b")] {
        let reads = [
            done(3, 3, 12, read(seen.clone())),
            done(3, 13, 14, read(seen)),
        ];
        assert!(linearizable(&[writes.as_slice(), &reads].concat()));
    }
    // Once both writes are over, the order they took is fixed for every later read.
    let reads = [done(3, 12, 13, read(v("a"))), done(3, 14, 15, read(v("b")))];
    assert!(!linearizable(&[writes.as_slice(), &reads].concat()));
}

#[test]
fn a_stale_read_after_a_completed_write_is_caught() {
    let ops = [
        done(1, 1, 2, write(v("a"))),
        done(1, 3, 4, write(v("b"))),
        done(2, 5, 6, read(v("a"))),
    ];
    assert!(!linearizable(&ops));
}

#[test]
fn a_read_of_a_value_never_written_is_caught() {
    assert!(!linearizable(&[
        done(1, 1, 2, write(v("a"))),
        done(2, 1, 3, read(v("z")))
    ]));
    assert!(!linearizable(&[done(1, 1, 2, read(v("a")))]));
}

#[test]
fn swap_results_must_match_the_value() {
    let a = done(1, 1, 2, write(v("a")));
    let then = |op: Op| [a.clone(), done(2, 3, 4, op)];
    assert!(linearizable(&then(cas(v("a"), v("b"), true))));
    assert!(linearizable(&then(cas(v("x"), v("b"), false))));
    assert!(!linearizable(&then(cas(v("x"), v("b"), true))));
    assert!(!linearizable(&then(cas(v("a"), v("b"), false))));
    // What a swap reports is what later reads see.
    let swapped = [
        &then(cas(v("a"), v("b"), true))[..],
        &[done(1, 5, 6, read(v("b")))],
    ];
    assert!(linearizable(&swapped.concat()));
    let not_swapped = [
        &then(cas(v("x"), v("b"), false))[..],
        &[done(1, 5, 6, read(v("b")))],
    ];
    assert!(!linearizable(&not_swapped.concat()));
}

#[test]
fn unknown_writes_may_take_effect_late_or_never() {
    let base = [done(1, 1, 2, write(v("a"))), unknown(2, 3, write(v("b")))];
    let late = [done(3, 10, 11, read(v("a"))), done(3, 20, 21, read(v("b")))];
    let never = [done(3, 10, 11, read(v("a"))), done(3, 20, 21, read(v("a")))];
    for reads in [late, never] {
        assert!(linearizable(&[base.as_slice(), &reads].concat()));
    }
    // Not before it was invoked, and once seen it does not undo itself.
    assert!(!linearizable(&[
        base[1].clone(),
        done(3, 1, 2, read(v("b")))
    ]));
    let flicker = [done(3, 10, 11, read(v("b"))), done(3, 12, 13, read(v("a")))];
    assert!(!linearizable(&[base.as_slice(), &flicker].concat()));
}

#[test]
fn unknown_swaps_and_reads() {
    let ops = [
        done(1, 1, 2, write(v("a"))),
        unknown(2, 3, cas(v("a"), v("b"), false)), // its `succeeded` means nothing
        unknown(3, 4, read(v("zzz"))),             // and an unknown read says nothing
        done(1, 10, 11, read(v("b"))),
    ];
    assert!(linearizable(&ops));
    let mismatched = [
        ops[0].clone(),
        unknown(2, 3, cas(v("x"), v("b"), true)),
        ops[3].clone(),
    ];
    assert!(!linearizable(&mismatched));
    // An unknown write can be what made a swap fail.
    let a = [done(1, 1, 2, write(v("a"))), unknown(2, 3, write(v("c")))];
    let failed = [&a[..], &[done(1, 5, 6, cas(v("a"), v("b"), false))]].concat();
    assert!(linearizable(&failed));
    assert!(!linearizable(&[failed[0].clone(), failed[2].clone()]));
}

#[test]
fn keys_are_checked_independently() {
    let on = |key: &str, mut operation: Operation| {
        operation.key = key.as_bytes().to_vec();
        operation
    };
    let fine = [
        on("x", done(1, 1, 2, write(v("a")))),
        on("y", done(2, 1, 2, write(v("b")))),
        on("x", done(1, 3, 4, read(v("a")))),
        on("y", done(2, 3, 4, read(v("b")))),
    ];
    assert!(linearizable(&fine));
    // "b" was written, but to the other key.
    let crossed = [
        fine[0].clone(),
        fine[1].clone(),
        on("x", done(1, 3, 4, read(v("b")))),
    ];
    match verdict(&crossed) {
        Verdict::NotLinearizable { key, ops, .. } => {
            assert_eq!((key, ops.len()), (b"x".to_vec(), 2));
        }
        other => panic!("expected a violation on x, got {other}"),
    }
}

#[test]
fn the_report_prints_the_keys_history() {
    let ops = [
        done(1, 1, 2, write(v("a"))),
        done(1, 3, 4, write(v("b"))),
        unknown(3, 4, cas(None, v("c"), false)),
        done(2, 5, 6, read(v("a"))),
    ];
    let report = verdict(&ops).to_string();
    for needle in [
        "NOT linearizable: key \"k\" (4 ops)\n",
        "\n  #0    client 1   [     1,      2]  write \"a\" -> ok\n",
        "\n  #2    client 3   [     4,      -]  cas (absent) => \"c\" -> unknown\n",
        "\n  #3    client 2   [     5,      6]  read -> \"a\"\n",
        "places 2 of them, ending #0 #1 with the key at \"b\"; nothing can come next.",
    ] {
        assert!(
            report.contains(needle),
            "{needle:?} missing from:\n{report}"
        );
    }
}

#[test]
fn a_small_budget_is_inconclusive_not_wrong() {
    let writes = (0..20).map(|i| done(i, 1, 2, write(v(&i.to_string()))));
    let ops: Vec<Operation> = writes.chain([done(0, 3, 4, read(v("nope")))]).collect();
    let verdict = check_operations(&ops, 50);
    assert!(
        matches!(verdict, Verdict::Inconclusive { budget: 50, .. }),
        "{verdict}"
    );
    assert!(verdict
        .to_string()
        .starts_with("inconclusive: key \"k\" (21 ops)"));
}

#[test]
fn the_recorder_follows_threads_on_a_real_register() {
    let history = History::new();
    let register = Mutex::new(None::<Vec<u8>>);
    std::thread::scope(|scope| {
        for client in 0..4_u64 {
            let (history, register) = (history.clone(), &register);
            scope.spawn(move || {
                let mut rng = Rng::new(client + 1);
                for n in 0..200_u32 {
                    let value = v(&format!("{client}.{n}"));
                    let call = match rng.below(3) {
                        0 => Call::Read,
                        1 => Call::Write(value),
                        _ => {
                            let expected = v(&format!("{}.{}", rng.below(4), n.saturating_sub(1)));
                            Call::Cas {
                                expected,
                                new: value,
                            }
                        }
                    };
                    let id = history.invoke(client, "k", call.clone());
                    let mut current = register.lock().unwrap();
                    let reply = match call {
                        Call::Read => Reply::Read(current.clone()),
                        Call::Write(new) => {
                            *current = new;
                            Reply::Write
                        }
                        Call::Cas { expected, new } => {
                            let swaps = *current == expected;
                            if swaps {
                                *current = new;
                            }
                            Reply::Cas(swaps)
                        }
                    };
                    drop(current);
                    if n % 50 == 7 {
                        history.fail_unknown(id);
                    } else {
                        history.complete(id, reply);
                    }
                }
            });
        }
    });
    assert_eq!(history.operations().len(), 800);
    assert_eq!(check(&history), Verdict::Linearizable);

    // A refused write leaves no trace: had it been discarded wrongly, a read of it would be
    // unexplained.
    let refused = history.invoke(9, "k", Call::Write(v("refused")));
    history.discard(refused);
    let id = history.invoke(9, "k", Call::Write(v("z")));
    history.complete(id, Reply::Write);
    let id = history.invoke(9, "k", Call::Read);
    history.complete(id, Reply::Read(v("refused")));
    assert!(!check(&history).is_linearizable());
}

#[test]
#[should_panic(expected = "does not answer")]
fn a_reply_of_the_wrong_kind_is_a_bug() {
    let history = History::new();
    let id = history.invoke(1, "k", Call::Read);
    history.complete(id, Reply::Cas(true));
}

/// Marsaglia's xorshift64: enough for test inputs, and replayable from the seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// A history of `clients` clients running `total` operations on one register, each taking
/// effect at a random moment inside its interval, so it is linearizable. One operation in
/// twenty ends unknown, half of those before taking effect.
fn generate(rng: &mut Rng, clients: u64, total: usize) -> Vec<Operation> {
    enum Phase {
        Idle,
        Invoked(usize),
        Applied(usize),
    }
    let mut phases: Vec<Phase> = (0..clients).map(|_| Phase::Idle).collect();
    let (mut ops, mut register, mut tick) = (Vec::new(), None::<Vec<u8>>, 0);
    while ops.len() < total || phases.iter().any(|phase| !matches!(phase, Phase::Idle)) {
        tick += 1;
        let client = rng.below(clients);
        let phase = &mut phases[client as usize];
        match *phase {
            Phase::Idle if ops.len() < total => {
                let fresh = v(&format!("v{}", ops.len()));
                let op = match rng.below(20) {
                    0..=7 => read(None),
                    8..=13 => write(fresh),
                    14 => write(None),
                    15..=17 => cas(register.clone(), fresh, false),
                    _ => cas(
                        v(&format!("v{}", rng.below(ops.len() as u64 + 1))),
                        fresh,
                        false,
                    ),
                };
                ops.push(unknown(client, tick, op));
                *phase = Phase::Invoked(ops.len() - 1);
            }
            Phase::Idle => {}
            Phase::Invoked(i) if rng.below(40) == 0 => {
                ops[i].complete = Some(tick); // gave up before it took effect
                *phase = Phase::Idle;
            }
            Phase::Invoked(i) => {
                match &mut ops[i].op {
                    Op::Read(seen) => seen.clone_from(&register),
                    Op::Write(value) => register.clone_from(value),
                    Op::Cas {
                        expected,
                        new,
                        succeeded,
                    } => {
                        *succeeded = register == *expected;
                        if *succeeded {
                            register.clone_from(new);
                        }
                    }
                }
                *phase = Phase::Applied(i);
            }
            Phase::Applied(i) => {
                ops[i].complete = Some(tick);
                if rng.below(40) != 0 {
                    ops[i].outcome = Outcome::Ok;
                }
                *phase = Phase::Idle;
            }
        }
    }
    ops
}

/// Points one completed read, if any, at a value it cannot have seen, and says whether the
/// value is stale (written, but overwritten before the read began) or never written.
///
/// A value `s` is stale for a read when a completed write or swap `x` of another value
/// returned before the read began, and every operation that could produce `s` (the initial
/// absence included) returned before `x` began: in every legal order they all precede `x`,
/// which precedes the read.
fn corrupt(rng: &mut Rng, ops: &mut [Operation]) -> Option<bool> {
    let reads: Vec<usize> = (0..ops.len())
        .filter(|&i| ops[i].outcome == Outcome::Ok && matches!(ops[i].op, Op::Read(_)))
        .collect();
    let target = *reads.get(rng.below(reads.len().max(1) as u64) as usize)?;
    let (invoke, Op::Read(seen)) = (ops[target].invoke, &ops[target].op) else {
        unreachable!("a read was picked")
    };
    let returned = |o: &Operation| o.complete.filter(|_| o.outcome == Outcome::Ok);
    let overwrites = |o: &Operation, value: &Option<Vec<u8>>| match &o.op {
        Op::Write(new)
        | Op::Cas {
            new,
            succeeded: true,
            ..
        } => new != value,
        _ => false,
    };
    let stale = ops
        .iter()
        .map(|o| &o.op)
        .chain([&write(None)])
        .find_map(|op| {
            let Op::Write(value) = op else { return None };
            let producers = ops.iter().filter(|o| match &o.op {
                Op::Write(new) | Op::Cas { new, .. } => new == value,
                Op::Read(_) => false,
            });
            let last_produced = producers.map(returned).try_fold(0, |a, b| Some(a.max(b?)));
            let overwritten = ops.iter().any(|x| {
                let before_read = returned(x).is_some_and(|end| end < invoke);
                let after_producers = last_produced.is_some_and(|end| end < x.invoke);
                overwrites(x, value) && before_read && after_producers
            });
            (value != seen && overwritten).then(|| value.clone())
        });
    let is_stale = stale.is_some();
    ops[target].op = read(stale.unwrap_or_else(|| v("never written")));
    Some(is_stale)
}

#[test]
fn generated_histories_pass_and_corrupted_ones_fail() {
    let (mut stale, mut runs) = (0, 0);
    for seed in 1..=300_u64 {
        let mut rng = Rng::new(seed);
        let clients = 2 + rng.below(4);
        let mut ops = generate(&mut rng, clients, [10, 40, 200][seed as usize % 3]);
        let intact = verdict(&ops);
        assert!(
            intact.is_linearizable(),
            "seed {seed}: a register's history was rejected: {intact}"
        );
        let Some(is_stale) = corrupt(&mut rng, &mut ops) else {
            continue;
        };
        (stale, runs) = (stale + usize::from(is_stale), runs + 1);
        let corrupted = verdict(&ops);
        assert!(
            matches!(corrupted, Verdict::NotLinearizable { .. }),
            "seed {seed}: a corrupted read (stale: {is_stale}) was accepted: {corrupted}"
        );
    }
    let enough = runs > 250 && stale > runs / 2;
    assert!(enough, "{stale} of {runs} corrupted reads saw stale values");
}

#[test]
fn five_clients_and_a_thousand_operations_get_a_verdict() {
    let mut rng = Rng::new(1000);
    let mut ops = generate(&mut rng, 5, 1000);
    assert_eq!(verdict(&ops), Verdict::Linearizable);
    assert_eq!(corrupt(&mut rng, &mut ops), Some(true));
    assert!(matches!(verdict(&ops), Verdict::NotLinearizable { .. }));
}

/// The definition, searched exhaustively: some subset of the unknown writes and swaps,
/// together with every completed operation, has an order that keeps real-time precedence
/// and in which every result is what a register gives.
fn brute_force(ops: &[Operation]) -> bool {
    let ops: Vec<&Operation> = ops
        .iter()
        .filter(|o| o.outcome == Outcome::Ok || !matches!(o.op, Op::Read(_)))
        .collect();
    let optional: Vec<usize> = (0..ops.len())
        .filter(|&i| ops[i].outcome == Outcome::Unknown)
        .collect();
    (0..1_u32 << optional.len()).any(|mask| {
        let chosen = |i: &usize| {
            optional
                .iter()
                .position(|j| j == i)
                .is_none_or(|bit| mask & 1 << bit != 0)
        };
        let mut left: Vec<usize> = (0..ops.len()).filter(chosen).collect();
        place(&ops, &mut left, None)
    })
}

/// Whether the operations `left` can follow, in some order, a register holding `value`.
fn place(ops: &[&Operation], left: &mut Vec<usize>, value: Option<&[u8]>) -> bool {
    let end = |o: &Operation| {
        o.complete
            .filter(|_| o.outcome == Outcome::Ok)
            .unwrap_or(u64::MAX)
    };
    if left.is_empty() {
        return true;
    }
    for k in 0..left.len() {
        let o = ops[left[k]];
        if left.iter().any(|&j| end(ops[j]) < o.invoke) {
            continue; // something still unplaced had returned before `o` began
        }
        let known = o.outcome == Outcome::Ok;
        let next = match &o.op {
            Op::Read(seen) if seen.as_deref() == value => value,
            Op::Write(new) => new.as_deref(),
            Op::Cas {
                expected,
                new,
                succeeded,
            } => {
                // Unknown: either result will do; known: the result must match.
                let swaps = expected.as_deref() == value;
                if known && swaps != *succeeded {
                    continue;
                }
                if swaps {
                    new.as_deref()
                } else {
                    value
                }
            }
            Op::Read(_) => continue,
        };
        let i = left.remove(k);
        let found = place(ops, left, next);
        left.insert(k, i);
        if found {
            return true;
        }
    }
    false
}

/// Random small histories, with `values` distinct values and unknown outcomes one time in
/// `unknown_one_in`, checked against [`brute_force`].
fn agree_with_brute_force(seeds: std::ops::RangeInclusive<u64>, values: u64, unknown_one_in: u64) {
    let (mut yes, mut no) = (0, 0);
    for seed in seeds {
        let mut rng = Rng::new(seed);
        let pick = |rng: &mut Rng| {
            let k = rng.below(values + 1);
            (k > 0).then(|| vec![b'a' + k as u8])
        };
        let ops: Vec<Operation> = (0..3 + rng.below(6))
            .map(|_| {
                let (invoke, client) = (rng.below(12), rng.below(3));
                let op = match rng.below(3) {
                    0 => read(pick(&mut rng)),
                    1 => write(pick(&mut rng)),
                    _ => cas(pick(&mut rng), pick(&mut rng), rng.below(2) == 0),
                };
                match rng.below(unknown_one_in) {
                    0 => unknown(client, invoke, op),
                    _ => done(client, invoke, invoke + 1 + rng.below(6), op),
                }
            })
            .collect();
        let expected = brute_force(&ops);
        assert_eq!(
            linearizable(&ops),
            expected,
            "seed {seed}:\n{}",
            verdict(&ops)
        );
        *(if expected { &mut yes } else { &mut no }) += 1;
    }
    assert!(
        yes > 100 && no > 100,
        "{yes} linearizable, {no} not: too one-sided to tell"
    );
}

#[test]
fn small_random_histories_agree_with_exhaustive_search() {
    agree_with_brute_force(1..=20_000, 2, 4);
}

#[test]
fn small_histories_with_many_unknowns_agree_with_exhaustive_search() {
    agree_with_brute_force(1..=20_000, 4, 2);
    agree_with_brute_force(1..=20_000, 1, 2);
}
