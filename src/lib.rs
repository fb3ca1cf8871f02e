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
pub(crate) mod node;
pub(crate) mod store;
pub(crate) mod sync;
mod pool;

pub use config::{Config, Durability, IoBackend, Limits};
pub use error::{Error, Result};

/// Entry points into the lower layers for the fuzz targets (feature `internals`). Not a
/// stable API: nothing here is covered by semver.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod internals {
    /// Fuzz entry for the node layout: decodes `data` as a node page and, if it validates,
    /// checks search, bounds and iteration against a linear scan (panics on disagreement).
    pub fn node_decode_check(data: &[u8]) {
        crate::node::decode_check(data);
    }
}
