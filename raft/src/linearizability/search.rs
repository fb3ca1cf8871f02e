//! The search over one key's operations: the time-ordered linked list of invocations and
//! returns, the memo of failed positions, the pruning of optional (unknown-outcome)
//! operations, and the depth-first search itself; see the [module documentation](super).

use std::collections::HashMap;

use super::{Op, Operation, Outcome};

/// A register value, interned per key; 0 is absent.
type Value = u32;

/// An operation as the search sees it.
pub(super) struct Step {
    invoke: u64,
    /// `u64::MAX` if it never returned.
    complete: u64,
    /// Whether it must be placed: its outcome is known.
    required: bool,
    effect: Effect,
    /// Its index among the required or among the optional steps: its bit in the memo.
    rank: usize,
    /// The rank of the last optional step invoked before this optional one with the same
    /// effect: the earlier twin must be used first.
    twin: Option<usize>,
    /// Its index into the key's operations, for the report.
    source: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Effect {
    Read(Value),
    Write(Value),
    /// A swap (expected, new) reported done.
    Swap(Value, Value),
    /// A swap reported not done because the register did not hold this.
    NoSwap(Value),
    /// A swap (expected, new) of unknown outcome.
    MaybeSwap(Value, Value),
}

impl Effect {
    /// The register's value after this step from `value`, or `None` if the reported result
    /// is impossible from `value`.
    fn apply(self, value: Value) -> Option<Value> {
        match self {
            Effect::Read(seen) => (seen == value).then_some(value),
            Effect::Write(new) => Some(new),
            Effect::Swap(expected, new) => (value == expected).then_some(new),
            Effect::NoSwap(expected) => (value != expected).then_some(value),
            Effect::MaybeSwap(expected, new) => Some(if value == expected { new } else { value }),
        }
    }

    /// The value this step reads or expects.
    fn mentioned(self) -> Option<Value> {
        match self {
            Effect::Read(v) | Effect::Swap(v, _) | Effect::NoSwap(v) | Effect::MaybeSwap(v, _) => {
                Some(v)
            }
            Effect::Write(_) => None,
        }
    }
}

impl Step {
    /// Whether this step, right after an optional one that changed the register from
    /// `from`, depends on that change: from `from` it would be impossible or (if optional)
    /// a no-op. If not, the optional one could move after it or be dropped.
    fn needs(&self, from: Value) -> bool {
        match self.effect.apply(from) {
            None => true,
            Some(after) => {
                !self.required && after == from && !matches!(self.effect, Effect::Write(_))
            }
        }
    }
}

pub(super) fn compile<'a>(ops: &[&'a Operation]) -> Vec<Step> {
    let mut interned: HashMap<Option<&[u8]>, Value> = HashMap::from([(None, 0)]);
    let mut intern = |value: &'a Option<Vec<u8>>| {
        let next = interned.len() as Value;
        *interned.entry(value.as_deref()).or_insert(next)
    };
    let (mut steps, mut ranks, mut twins) = (Vec::new(), [0, 0], HashMap::new());
    for (source, &operation) in ops.iter().enumerate() {
        let required = operation.outcome == Outcome::Ok;
        let effect = match &operation.op {
            Op::Read(_) if !required => continue, // says nothing, changes nothing
            Op::Read(seen) => Effect::Read(intern(seen)),
            Op::Write(value) => Effect::Write(intern(value)),
            Op::Cas {
                expected,
                new,
                succeeded,
            } => match (required, *succeeded) {
                (false, _) => Effect::MaybeSwap(intern(expected), intern(new)),
                (true, true) => Effect::Swap(intern(expected), intern(new)),
                (true, false) => Effect::NoSwap(intern(expected)),
            },
        };
        let complete = operation.complete.filter(|_| required).unwrap_or(u64::MAX);
        let rank = ranks[usize::from(required)];
        ranks[usize::from(required)] += 1;
        let twin = if required {
            None
        } else {
            twins.insert(effect, rank)
        };
        let invoke = operation.invoke;
        steps.push(Step {
            invoke,
            complete,
            required,
            effect,
            rank,
            twin,
            source,
        });
    }
    steps
}

pub(super) enum Search {
    Found,
    /// The longest legal order found, as indices into the key's operations.
    Stuck(Vec<usize>),
    OutOfBudget,
}

/// The search over one key's steps; see the [module documentation](super).
pub(super) fn search(steps: &[Step], budget: u64) -> Search {
    let mut marks: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * steps.len());
    for (i, step) in steps.iter().enumerate() {
        marks.push((step.invoke, false, i));
        if step.complete != u64::MAX {
            marks.push((step.complete, true, i));
        }
    }
    // Invocations sort before returns at equal ticks: equal ticks overlap.
    marks.sort_unstable();
    let mut entries = vec![(0, None); steps.len()]; // (invocation, return) per step
    for (at, &(_, is_return, i)) in marks.iter().enumerate() {
        if is_return {
            entries[i].1 = Some(at);
        } else {
            entries[i].0 = at;
        }
    }
    let marks: Vec<(usize, bool)> = marks
        .iter()
        .map(|&(_, is_return, i)| (i, is_return))
        .collect();
    let mut list = Links::new(marks.len());
    let mut pos = Position::new(steps);
    let (mut stack, mut best, mut spent) = (Vec::<(usize, Value)>::new(), Vec::<usize>::new(), 0);
    // `None` while required steps are tried, then what optional ones must provide.
    let mut wanted: Option<Wanted> = None;
    let mut cursor = list.first();
    while pos.required_left > 0 {
        spent += 1;
        if spent > budget {
            return Search::OutOfBudget;
        }
        if cursor == list.head() || marks[cursor].1 {
            // Nothing else may come next in this pass.
            if wanted.is_none() {
                let found = Wanted::of(&list, &marks, steps, &pos);
                spent += found.scanned;
                (wanted, cursor) = (Some(found), list.first());
                continue;
            }
            let Some((i, before)) = stack.pop() else {
                return Search::Stuck(best.iter().map(|&i| steps[i].source).collect());
            };
            pos.remember_failed();
            let (call, ret) = entries[i];
            if let Some(ret) = ret {
                list.relink(ret);
            }
            list.relink(call);
            pos.toggle(&steps[i]);
            pos.set_value(before, enabler(&stack, steps));
            wanted = (!steps[i].required).then(|| Wanted::of(&list, &marks, steps, &pos));
            cursor = list.next[call];
            continue;
        }
        let (i, step) = (marks[cursor].0, &steps[marks[cursor].0]);
        cursor = list.next[cursor];
        let enabled = enabler(&stack, steps);
        if step.required != wanted.is_none()
            || enabled.is_some_and(|from| !step.needs(from))
            || step.twin.is_some_and(|twin| !pos.used(twin))
        {
            continue;
        }
        let before = pos.value;
        let Some(after) = step.effect.apply(before) else {
            continue;
        };
        if let Some(wanted) = &wanted {
            if after == before || !wanted.admits(i, after, &pos) {
                continue;
            }
        }
        pos.toggle(step);
        pos.set_value(after, (!step.required).then_some(before));
        if pos.dominated() {
            pos.toggle(step);
            pos.set_value(before, enabled);
            continue;
        }
        let (call, ret) = entries[i];
        list.unlink(call);
        if let Some(ret) = ret {
            list.unlink(ret);
        }
        stack.push((i, before));
        if stack.len() > best.len() {
            best = stack.iter().map(|&(j, _)| j).collect();
        }
        (wanted, cursor) = (None, list.first());
    }
    Search::Found
}

/// The register value before the last step, if that step was optional: the next step must
/// need the change (see [`Step::needs`]).
fn enabler(stack: &[(usize, Value)], steps: &[Step]) -> Option<Value> {
    let &(last, before) = stack.last()?;
    (!steps[last].required).then_some(before)
}

/// A circular doubly linked list over marks `0..len`, with `len` as the sentinel.
struct Links {
    next: Vec<usize>,
    prev: Vec<usize>,
}

impl Links {
    fn new(len: usize) -> Self {
        let next = (0..=len).map(|i| (i + 1) % (len + 1)).collect();
        let prev = (0..=len).map(|i| (i + len) % (len + 1)).collect();
        Links { next, prev }
    }

    fn head(&self) -> usize {
        self.next.len() - 1
    }

    fn first(&self) -> usize {
        self.next[self.head()]
    }

    fn unlink(&mut self, at: usize) {
        let (prev, next) = (self.prev[at], self.next[at]);
        (self.next[prev], self.prev[next]) = (next, prev);
    }

    /// Undoes `unlink(at)`; sound because unlinks are undone in reverse order.
    fn relink(&mut self, at: usize) {
        let (prev, next) = (self.prev[at], self.next[at]);
        (self.next[prev], self.prev[next]) = (at, at);
    }
}

/// What optional steps may provide at a position whose required candidates all failed: a
/// value some candidate fails without.
struct Wanted {
    values: Vec<Value>,
    /// A failed swap expected the current value: any change lets it through.
    any_change: bool,
    /// The first optional write of a dead value (one no remaining step reads or expects).
    /// What follows cannot tell dead values apart, and the earliest such write may go
    /// wherever a later one may, so only it is tried.
    first_dead: Option<usize>,
    /// Marks looked at, for the budget.
    scanned: u64,
}

impl Wanted {
    fn of(list: &Links, marks: &[(usize, bool)], steps: &[Step], pos: &Position) -> Self {
        let (value, mut at) = (pos.value, list.first());
        let mut wanted = Wanted {
            values: Vec::new(),
            any_change: false,
            first_dead: None,
            scanned: 0,
        };
        while at != list.head() && !marks[at].1 {
            let (i, step) = (marks[at].0, &steps[marks[at].0]);
            match step.effect {
                Effect::Write(new) if !step.required && new != value && pos.dead(new) => {
                    wanted.first_dead.get_or_insert(i);
                }
                Effect::Read(v) | Effect::Swap(v, _) if v != value => wanted.values.push(v),
                Effect::MaybeSwap(v, new) if v != value && v != new => wanted.values.push(v),
                Effect::NoSwap(v) if v == value => wanted.any_change = true,
                _ => {}
            }
            (wanted.scanned, at) = (wanted.scanned + 1, list.next[at]);
        }
        wanted
    }

    /// Whether optional step `i`, setting the register to `value`, is worth trying.
    fn admits(&self, i: usize, value: Value, pos: &Position) -> bool {
        if pos.dead(value) {
            self.any_change && self.first_dead.is_none_or(|first| first == i)
        } else {
            self.any_change || self.values.contains(&value)
        }
    }
}

/// Where the search stands, and the memo of failed positions.
struct Position {
    /// A bit per required step placed (by rank), then a word holding the register value and
    /// the enabler plus one (0: none): the memo's key. Values are below `2 * ops + 1`.
    key: Vec<u64>,
    /// A bit per optional step used (by rank).
    optional: Vec<u64>,
    value: Value,
    required_left: usize,
    /// Per value, how many steps not yet placed read or expect it.
    mentions: Vec<u32>,
    /// Per key, the optional-step sets of failed positions, none a superset of another.
    failed: HashMap<Vec<u64>, Vec<Box<[u64]>>>,
}

impl Position {
    fn new(steps: &[Step]) -> Self {
        let required = steps.iter().filter(|step| step.required).count();
        let mut mentions = Vec::new();
        for value in steps.iter().filter_map(|step| step.effect.mentioned()) {
            mentions.resize(mentions.len().max(value as usize + 1), 0);
            mentions[value as usize] += 1;
        }
        Position {
            key: vec![0; required.div_ceil(64) + 1],
            optional: vec![0; (steps.len() - required).div_ceil(64)],
            value: 0,
            required_left: required,
            mentions,
            failed: HashMap::new(),
        }
    }

    fn dead(&self, value: Value) -> bool {
        self.mentions
            .get(value as usize)
            .is_none_or(|&count| count == 0)
    }

    fn used(&self, optional_rank: usize) -> bool {
        self.optional[optional_rank / 64] & 1 << (optional_rank % 64) != 0
    }

    /// Places `step`, or takes it back if placed.
    fn toggle(&mut self, step: &Step) {
        let (word, bit) = (step.rank / 64, 1 << (step.rank % 64));
        let bits = if step.required {
            &mut self.key
        } else {
            &mut self.optional
        };
        bits[word] ^= bit;
        let placed = bits[word] & bit != 0;
        let left = &mut self.required_left;
        if step.required {
            *left = if placed { *left - 1 } else { *left + 1 };
        }
        if let Some(value) = step.effect.mentioned() {
            let count = &mut self.mentions[value as usize];
            *count = if placed { *count - 1 } else { *count + 1 };
        }
    }

    fn set_value(&mut self, value: Value, enabler: Option<Value>) {
        self.value = value;
        let last = self.key.len() - 1;
        self.key[last] = u64::from(value) << 32 | enabler.map_or(0, |from| u64::from(from) + 1);
    }

    fn remember_failed(&mut self) {
        let optional = &self.optional;
        if let Some(sets) = self.failed.get_mut(&self.key) {
            sets.retain(|set| !is_subset(optional, set));
            sets.push(optional.as_slice().into());
        } else {
            self.failed
                .insert(self.key.clone(), vec![optional.as_slice().into()]);
        }
    }

    /// Whether a failed position rules this one out. One without an enabler also rules out
    /// the same position with one, which has fewer choices.
    fn dominated(&mut self) -> bool {
        let last = self.key.len() - 1;
        let word = self.key[last];
        if self.covered() {
            return true;
        }
        if word & u64::from(u32::MAX) == 0 {
            return false;
        }
        self.key[last] = word & !u64::from(u32::MAX);
        let covered = self.covered();
        self.key[last] = word;
        covered
    }

    fn covered(&self) -> bool {
        let sets = self.failed.get(self.key.as_slice());
        sets.is_some_and(|sets| sets.iter().any(|set| is_subset(set, &self.optional)))
    }
}

fn is_subset(small: &[u64], large: &[u64]) -> bool {
    small.iter().zip(large).all(|(s, l)| s & !l == 0)
}
