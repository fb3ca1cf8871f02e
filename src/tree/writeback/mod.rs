//! Write-back: turning a cached leaf into a disk page, one at a time (eviction) or 32 at a
//! time (checkpoint passes, the idle write-back, an evictor's run).
//!
//! | file | owns |
//! |---|---|
//! | `evict.rs` | the pool's eviction callback, `write_back`, the salvage of a damaged leaf |
//! | `page_batch.rs` | a batch of leaf pages built, read ahead and written together |
//! | `checkpoint.rs` | a checkpoint's passes over the buffered leaves |
//! | `clean.rs` | the idle write-back and an evictor's run |

mod checkpoint;
mod clean;
mod evict;
mod page_batch;

pub(in crate::tree) use checkpoint::{
    Plan, BATCH, SUPERSEDED_LEAST, SUPERSEDED_SHARE, WANTED_SHARE,
};
pub(in crate::tree) use page_batch::PageBatch;
