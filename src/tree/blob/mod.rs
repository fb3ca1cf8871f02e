//! Large values, stored out of line: `extents.rs` knows which extents of the blob file are
//! in use and when they may be freed; `reference.rs` is what a leaf stores in a value's
//! place, and the markers of stored values that are not the user's; `outline.rs` turns a
//! user's value into what a leaf stores (itself, or a reference to an extent written
//! first) and back.

mod extents;
mod outline;
mod reference;

pub(in crate::tree) use extents::{BlobPin, Blobs, TableEntry, FAILED_FOLD, MARKED, REF_LEN};
pub(in crate::tree) use outline::Stored;
