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
pub(crate) mod sync;

pub use config::{Config, Durability, IoBackend, Limits};
pub use error::{Error, Result};

/// Entry points into the lower layers for the fuzz targets (feature `internals`). Not a
/// stable API: nothing here is covered by semver.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod internals {
    use crate::node::{NodeKind, NodeMut, NodeRef, RecordKind};

    /// Fuzz entry for the node layout: decodes `data` as a node page and, if it validates,
    /// checks search, bounds and iteration against a linear scan (panics on disagreement).
    pub fn node_decode_check(data: &[u8]) {
        crate::node::decode_check(data);
    }

    /// Bench entry: formats `buf` as an empty node (`mini` = mini-page, else leaf) with
    /// infinite fences.
    pub fn node_init(buf: &mut [u8], mini: bool) {
        let kind = [NodeKind::Leaf, NodeKind::Mini][usize::from(mini)];
        NodeMut::init(buf, kind, None, None);
    }

    /// Bench entry: upserts an Insert record into a node; false if it does not fit.
    pub fn node_upsert(buf: &mut [u8], key: &[u8], value: &[u8]) -> bool {
        let mut node = NodeMut::from_bytes(buf);
        node.upsert(key, value, RecordKind::Insert).is_ok()
    }

    /// Bench entry: the value of `key` in a node, if present.
    pub fn node_get<'a>(buf: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
        NodeRef::from_bytes(buf).get(key).map(|(_, _, v)| v)
    }
}
