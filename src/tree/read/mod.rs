//! Reads: lookups and scans without a leaf lock, the public range iterator, and batched
//! lookups.
//!
//! | file | owns |
//! |---|---|
//! | `scan.rs` | the public [`Range`]: a double-ended iterator that copies out one leaf at a time |
//! | `scan_items.rs` | what a range reads from, a record as it is lent, the bounds' buffers |
//! | `copied.rs` | what a scan copied out of a leaf and has not yielded yet, and the copying |
//! | `scan_buffers.rs` | the buffers scans copy into, kept per thread |
//! | `scan_locked.rs` | a scan's refill under the leaf's read lock |
//! | `optimistic.rs` | lookups and scan refills that take no lock and validate a version |
//! | `readahead.rs` | the next leaf's page read with the current one, for long scans |
//! | `multi.rs` | `get_many`: the misses of many keys read together |
//!
//! A scan depends on keyspaces (its bounds and gate) and on the batch undo (`versions::Versions`),
//! never the reverse.

mod copied;
mod multi;
mod optimistic;
mod readahead;
mod scan;
mod scan_buffers;
mod scan_items;
mod scan_locked;

pub use scan::Range;
