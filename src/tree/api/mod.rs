//! The public handles over the shared state: [`Tree`] (`tree.rs`), [`Keyspace`]
//! (`keyspace.rs`) and [`Batch`] (`batch.rs`).

mod batch;
mod keyspace;
mod tree;

pub use batch::Batch;
pub use keyspace::Keyspace;
pub use tree::Tree;
