//! What snapshots and transactions cost, in memory (`Config::in_memory()`, 1M accounts of
//! 16-byte keys and 8-byte balances loaded first, uniform keys, one thread):
//!
//! - `transactions/transfer`: one transfer (read two balances, write both and a 24-byte
//!   history record) as a `transact` transaction, against `plain`, the same reads by `get`
//!   and writes by one `Batch` (not isolated: what the transaction adds is its snapshot,
//!   read set and commit check). Throughput in transfers per second.
//! - `transactions/insert`: inserts of new 16 + 16-byte records with one snapshot held open
//!   the whole time (`snapshot`; every insert saves what it replaces), against none open
//!   (`none`). Throughput in inserts per second; the snapshot is renewed every 100k
//!   inserts so that what it keeps stays within `max_snapshot_bytes`.
//!
//! Results: `docs/benchmarks.md`.
//!
//! ```sh
//! cargo bench --bench transactions
//! ```

// `criterion_main!` defines an undocumented `pub fn main`.
#![allow(missing_docs)]

use std::time::Duration;

use bfkv::{Config, Keyspace, Tree};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const ACCOUNTS: u64 = 1_000_000;

fn key(i: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes());
    k[8..].copy_from_slice(&i.to_be_bytes());
    k
}

fn balance(v: Option<Vec<u8>>) -> u64 {
    v.map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

fn ledger() -> (Tree, Keyspace, Keyspace) {
    let tree = Tree::open(Config::in_memory().cache_size(512 << 20)).expect("open");
    let accounts = tree.keyspace("accounts").expect("keyspace");
    let history = tree.keyspace("history").expect("keyspace");
    for i in 0..ACCOUNTS {
        accounts
            .insert(key(i), 1_000u64.to_le_bytes())
            .expect("load");
    }
    (tree, accounts, history)
}

fn transfers(c: &mut Criterion) {
    let (tree, accounts, history) = ledger();
    let mut g = c.benchmark_group("transactions");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(1));
    let mut rng = SmallRng::seed_from_u64(7);
    let mut n = 0u64;
    let mut pick = move || {
        let from = rng.gen_range(0..ACCOUNTS);
        let to = (from + rng.gen_range(1..ACCOUNTS)) % ACCOUNTS;
        (from, to, rng.gen_range(1..10u64))
    };
    g.bench_function("transfer/transaction", |b| {
        b.iter(|| {
            let (from, to, amount) = pick();
            n += 1;
            tree.transact(|tx| {
                let a = balance(tx.get(&accounts, key(from))?);
                let b = balance(tx.get(&accounts, key(to))?);
                if a >= amount {
                    tx.insert(&accounts, key(from), (a - amount).to_le_bytes());
                    tx.insert(&accounts, key(to), (b + amount).to_le_bytes());
                    tx.insert(
                        &history,
                        n.to_be_bytes(),
                        [&key(from)[..8], &amount.to_le_bytes()].concat(),
                    );
                }
                Ok(())
            })
            .expect("transfer");
        });
    });
    g.bench_function("transfer/plain", |b| {
        b.iter(|| {
            let (from, to, amount) = pick();
            n += 1;
            let a = balance(accounts.get(key(from)).expect("get"));
            let b = balance(accounts.get(key(to)).expect("get"));
            if a >= amount {
                let mut batch = tree.batch();
                batch.insert(&accounts, key(from), (a - amount).to_le_bytes());
                batch.insert(&accounts, key(to), (b + amount).to_le_bytes());
                batch.insert(
                    &history,
                    n.to_be_bytes(),
                    [&key(from)[..8], &amount.to_le_bytes()].concat(),
                );
                batch.commit().expect("commit");
            }
        });
    });
    g.finish();
}

fn inserts(c: &mut Criterion) {
    let mut g = c.benchmark_group("transactions");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(1));
    for open in [false, true] {
        let tree = Tree::open(Config::in_memory().cache_size(1 << 30)).expect("open");
        let mut snap = open.then(|| tree.snapshot());
        let mut i = 0u64;
        let name = if open {
            "insert/snapshot"
        } else {
            "insert/none"
        };
        g.bench_function(name, |b| {
            b.iter(|| {
                i += 1;
                tree.insert(key(i), [1u8; 16]).expect("insert");
                if open && i.is_multiple_of(100_000) {
                    snap = Some(tree.snapshot());
                }
            });
        });
        drop(snap);
    }
    g.finish();
}

criterion_group!(benches, transfers, inserts);
criterion_main!(benches);
