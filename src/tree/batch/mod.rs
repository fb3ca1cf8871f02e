//! Atomic batches: `commit.rs` applies a batch's writes under the locks of every leaf they
//! touch, taken in key order, `plan.rs` decides how they reach each leaf; the old values
//! that scans in progress need are kept by `versions/`. The public [`Batch`](crate::Batch)
//! that collects the writes is in `api/batch.rs`.

mod commit;
mod plan;

pub(in crate::tree) use commit::{Change, Check, Write};
