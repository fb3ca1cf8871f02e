//! The public handles over the shared state: [`Tree`] (`tree.rs`) and [`Batch`]
//! (`batch.rs`).

mod batch;
mod tree;

pub use batch::Batch;
pub use tree::Tree;
