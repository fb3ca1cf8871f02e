//! The leaf cache: mini-pages and full-page mirrors in the buffer pool (`crate::pool`),
//! what a lookup that misses caches, and the writes into a leaf's cached node.
//!
//! | file | owns |
//! |---|---|
//! | `lookup.rs` | lookups in a locked leaf, and what a miss caches |
//! | `leaf.rs` | buffered writes, growth through the size classes, conversion to a mirror, splits and empty-leaf removal |
//! | `mirror.rs` | full-page mirrors, the move of a mini-page to the buffer's tail |
//! | `admit.rs` | the doorkeeper in front of promotion |
//! | `whole_leaves.rs` | whether a miss caches its whole leaf or its record |

mod admit;
mod leaf;
mod lookup;
mod mirror;
mod whole_leaves;

pub(in crate::tree) use admit::Doorkeeper;
pub(in crate::tree) use leaf::{
    apply, live_records, node_records, percent_roll, with_page_buf, Written, MINI_OVERHEAD,
};
