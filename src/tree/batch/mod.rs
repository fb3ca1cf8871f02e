//! Atomic batches: `commit.rs` applies a batch's writes under the locks of every leaf they
//! touch, taken in key order; `rewind.rs` keeps the old values that scans in progress need,
//! so that no scan sees part of a batch. The public [`Batch`](crate::Batch) that collects
//! the writes is in `api/batch.rs`.

mod commit;
mod plan;
mod rewind;

pub(in crate::tree) use commit::{Change, Write};
pub(in crate::tree) use rewind::{Rewind, ScanStart};
