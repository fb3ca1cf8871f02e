//! The index: which leaf owns which key. `root.rs` owns the root of the inner nodes (an RCU
//! cell), the structure lock and the structure version; `inner.rs` the inner nodes
//! themselves (immutable once published, rebuilt copy-on-write by splits and removals).
//! Its siblings locate and lock a leaf through [`Index`], and walk the inner nodes through
//! [`Path`] and [`Seek`].

pub(in crate::tree) mod inner;
mod root;

pub(in crate::tree) use inner::{Bounds, Entry, Inner, Path, Seek};
pub(in crate::tree) use root::{Index, Owner, SmoGuard};
