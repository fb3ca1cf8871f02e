//! Large values, stored out of line: `extents.rs` knows which extents of the blob file are
//! in use and when they may be freed; `outline.rs` turns a user's value into what a leaf
//! stores (itself, or a reference to an extent written first) and back.

mod extents;
mod outline;

pub(in crate::tree) use extents::{BlobPin, Blobs, TableEntry, FAILED_FOLD, MARKED, REF_LEN};
pub(in crate::tree) use outline::Stored;
