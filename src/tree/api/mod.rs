//! The public handles over the shared state: [`Tree`] (its lifecycle and keyspaces in
//! `tree.rs`, its key-value methods in `tree_keys.rs`, snapshots and transactions in
//! `tree_versions.rs`), [`Keyspace`] (`keyspace.rs`), [`Batch`] (`batch.rs`),
//! [`Snapshot`] (`snapshot.rs`), [`Transaction`] (`transaction.rs`) and the iterator over
//! a transaction's range (`transaction_range.rs`).

mod batch;
mod keyspace;
mod snapshot;
mod transaction;
mod transaction_range;
mod tree;
mod tree_keys;
mod tree_versions;

pub use batch::Batch;
pub use keyspace::Keyspace;
pub use snapshot::Snapshot;
pub use transaction::Transaction;
pub use transaction_range::TransactionRange;
pub use tree::Tree;
