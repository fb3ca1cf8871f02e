//! Keyspaces: independent key orders in one tree. `space.rs` holds a keyspace's identity
//! and its gate; `prefix.rs` the prefix every stored key of a keyspace starts with.

mod prefix;
mod space;

#[cfg(all(test, not(shuttle)))]
pub(in crate::tree) use prefix::stored_key;
pub(in crate::tree) use prefix::{
    is_empty_range, prefix_id, prefix_range, user_key, FullKey, Prefix, CATALOG_BYTE,
};
pub(in crate::tree) use space::Space;
