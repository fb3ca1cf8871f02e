//! The public handles over the shared state: [`Tree`] (its lifecycle and keyspaces in
//! `tree.rs`, its key-value methods in `tree_keys.rs`), [`Keyspace`] (`keyspace.rs`) and
//! [`Batch`] (`batch.rs`).

mod batch;
mod keyspace;
mod tree;
mod tree_keys;

pub use batch::Batch;
pub use keyspace::Keyspace;
pub use tree::Tree;
