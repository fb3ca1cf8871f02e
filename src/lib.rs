//! bfkv: an embeddable, concurrent, larger-than-memory key-value store built on the Bf-Tree
//! (VLDB 2024).
//!
//! A B-tree caches whole pages although most records on a page are cold. bfkv keeps 4 KiB
//! leaf pages on disk and gives each at most one variable-length **mini-page** in memory,
//! holding recent writes, hot records and known-absent keys; mini-pages live in one circular
//! buffer whose size is the memory budget.
//!
//! Layers, top to bottom: the public API (this file, [`Config`], [`Error`]), the tree core,
//! the buffer pool (`pool`), the page layout shared by every node (`node`), and the page
//! store (`store`), the only code that touches a data file. `docs/ARCHITECTURE.md` explains
//! each layer and its invariants.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod config;
mod error;
mod pool;
pub(crate) mod sync;

pub use config::{Config, Durability, IoBackend, Limits};
pub use error::{Error, Result};

/// Entry points into the lower layers for the fuzz targets (feature `internals`). Not a
/// stable API: nothing here is covered by semver.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod internals {
    /// The buffer pool, driven page by page (fuzz target `pool_model`).
    pub use crate::pool::harness::PoolHarness;
}
