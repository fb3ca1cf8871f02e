//! The keyspace catalog: which name has which id, kept in the tree itself, under keys that
//! start with `0xFF` (no keyspace prefix does), so it is logged, checkpointed and recovered
//! like any data.
//!
//! | key | value |
//! |---|---|
//! | `FF 00` | the next id to hand out (u32 LE; 1 when absent) |
//! | `FF 01` name | the keyspace's id (u32 LE) |
//! | `FF 02` id (u32 BE) | empty: a dropped keyspace whose keys may not all be removed yet |
//!
//! Ids are never reused, so a write that raced a drop can never show up in a later
//! keyspace of the same name. A drop writes its `FF 02` mark before it removes the name,
//! and removes the mark only after the last key; `open` finishes any drop a crash cut short.

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::MergeOperator;
use crate::error::{Error, Result};
use crate::sync::{Mutex, RwLock};
use crate::tree::keyspace::Space;
use crate::tree::keyspace::{prefix_id, Prefix, CATALOG_BYTE};
use crate::tree::shared::Shared;
use crate::tree::WriteOp;
use crate::wal::Appended;

/// Key of the next id.
const NEXT_ID: [u8; 2] = [CATALOG_BYTE, 0x00];
/// Second byte of a name's key.
const NAME: u8 = 0x01;
/// Second byte of a dropped keyspace's mark.
const DROPPING: u8 = 0x02;
/// Longest keyspace name, in bytes.
pub(crate) const MAX_NAME: usize = 255;
/// Keys removed per pass of a drop (each pass finds them with one scan).
const DROP_CHUNK: usize = 1024;

/// The keyspaces of one open tree that have handles, and the lock that orders creations and
/// drops.
pub(crate) struct Catalog {
    /// The default keyspace (id 0).
    default: Arc<Space>,
    /// Named keyspaces looked up or created since open.
    named: Mutex<HashMap<String, Arc<Space>>>,
    /// Held by a creation or a drop from its first catalog read to its last write.
    change: Mutex<()>,
    /// The merge operators of the keyspaces configured with one of their own
    /// (`Config::keyspace_merge_operator`), by keyspace id, as the catalog names them.
    operators: RwLock<HashMap<u32, MergeOperator>>,
}

impl Catalog {
    /// The catalog of a tree just opened: nothing looked up yet.
    pub(crate) fn new() -> Catalog {
        Catalog {
            default: Arc::new(Space::new(0, String::new())),
            named: Mutex::new(HashMap::new()),
            change: Mutex::new(()),
            operators: RwLock::default(),
        }
    }

    /// The default keyspace.
    pub(crate) fn default_space(&self) -> &Arc<Space> {
        &self.default
    }

    /// Closes every keyspace's gate and waits for the calls inside (the tree is closing).
    pub(crate) fn shut_all(&self) {
        self.default.shut(false);
        let named: Vec<Arc<Space>> = self.named.lock().values().cloned().collect();
        for space in named {
            space.shut(false);
        }
    }
}

/// A catalog key: `kind` then `rest`.
fn catalog_key(kind: u8, rest: &[u8]) -> Vec<u8> {
    [&[CATALOG_BYTE, kind][..], rest].concat()
}

/// A u32 stored little-endian, or `Corruption`.
fn decode_id(shared: &Shared, bytes: &[u8]) -> Result<u32> {
    let bytes: [u8; 4] = bytes.try_into().map_err(|_| {
        shared
            .storage()
            .corruption(None, "keyspace catalog entry of the wrong size")
    })?;
    Ok(u32::from_le_bytes(bytes))
}

/// Checks a keyspace name.
fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(Error::InvalidConfig {
            reason: "a keyspace name is 1 to 255 bytes of UTF-8",
        });
    }
    Ok(())
}

impl Shared {
    /// The keyspace named `name`, created (and the creation logged) if it does not exist.
    pub(crate) fn keyspace_named(&self, name: &str) -> Result<Arc<Space>> {
        check_name(name)?;
        if let Some(space) = self.catalog().named.lock().get(name) {
            return Ok(space.clone());
        }
        let _change = self.catalog().change.lock();
        if let Some(space) = self.catalog().named.lock().get(name) {
            return Ok(space.clone());
        }
        let name_key = catalog_key(NAME, name.as_bytes());
        let id = if let Some(id) = self.get(&name_key)? {
            decode_id(self, &id)?
        } else {
            let id = match self.get(&NEXT_ID)? {
                Some(next) => decode_id(self, &next)?,
                None => 1,
            };
            let next = id.checked_add(1).ok_or(Error::InvalidConfig {
                reason: "every keyspace id has been used",
            })?;
            // The counter first: a crash between the two writes only skips an id.
            self.write(&NEXT_ID, WriteOp::Put(&next.to_le_bytes()))?;
            self.write(&name_key, WriteOp::Put(&id.to_le_bytes()))?;
            id
        };
        self.name_operator(name.as_bytes(), id);
        let space = Arc::new(Space::new(id, name.to_owned()));
        self.catalog()
            .named
            .lock()
            .insert(name.to_owned(), space.clone());
        Ok(space)
    }

    /// Notes that keyspace `name` has id `id`, for its merge operator if it has its own.
    fn name_operator(&self, name: &[u8], id: u32) {
        if let Some(op) = self.config().keyspace_operator(name) {
            self.catalog().operators.write().insert(id, op.clone());
        }
    }

    /// The ids of the keyspaces configured with merge operators of their own, read from
    /// the catalog as recovered so far (at open, before the log is replayed: replay folds
    /// with them).
    ///
    /// # Errors
    /// Those of reading the catalog.
    pub(crate) fn load_keyspace_operators(&self) -> Result<()> {
        for (name, _) in &self.config().keyspace_merge_operators {
            if let Some(id) = self.get(&catalog_key(NAME, name.as_bytes()))? {
                self.name_operator(name.as_bytes(), decode_id(self, &id)?);
            }
        }
        Ok(())
    }

    /// A write of stored key `key` replayed at open: the naming of a keyspace with a merge
    /// operator of its own makes that operator the one its later merges fold with.
    pub(crate) fn replayed_catalog_write(&self, key: &[u8], value: &[u8]) {
        if let [CATALOG_BYTE, NAME, name @ ..] = key {
            if let Ok(id) = decode_id(self, value) {
                self.name_operator(name, id);
            }
        }
    }

    /// The merge operator that folds the operands of stored key `key`: its keyspace's own,
    /// else the tree's.
    pub(crate) fn merge_operator_for(
        &self,
        key: &[u8],
    ) -> Option<std::borrow::Cow<'_, MergeOperator>> {
        if !self.config().keyspace_merge_operators.is_empty() {
            if let Some(id) = prefix_id(key) {
                if let Some(op) = self.catalog().operators.read().get(&id) {
                    return Some(std::borrow::Cow::Owned(op.clone()));
                }
            }
        }
        self.config()
            .merge_operator
            .as_ref()
            .map(std::borrow::Cow::Borrowed)
    }

    /// The names of the keyspaces, in byte order (the default keyspace is not named).
    pub(crate) fn keyspace_names(&self) -> Result<Vec<String>> {
        let names = self.catalog_entries(NAME)?;
        names
            .into_iter()
            .map(|(name, _)| {
                String::from_utf8(name).map_err(|_| {
                    self.storage()
                        .corruption(None, "keyspace name is not UTF-8")
                })
            })
            .collect()
    }

    /// Drops the keyspace named `name` with its keys (nothing if there is none). Handles on
    /// it answer `KeyspaceDropped` from then on; calls already inside finish first.
    pub(crate) fn drop_keyspace(&self, name: &str) -> Result<()> {
        check_name(name)?;
        let _change = self.catalog().change.lock();
        let name_key = catalog_key(NAME, name.as_bytes());
        let Some(id) = self.get(&name_key)? else {
            return Ok(());
        };
        let id = decode_id(self, &id)?;
        let space = self.catalog().named.lock().remove(name);
        if let Some(space) = space {
            space.shut(true);
        }
        self.write(&catalog_key(DROPPING, &id.to_be_bytes()), WriteOp::Put(&[]))?;
        self.write(&name_key, WriteOp::Delete)?;
        self.finish_drop(id)
    }

    /// Finishes the drops a crash cut short (at open, after replay).
    pub(crate) fn finish_drops(&self) -> Result<()> {
        for (id, _) in self.catalog_entries(DROPPING)? {
            let id: [u8; 4] = id
                .as_slice()
                .try_into()
                .map_err(|_| self.storage().corruption(None, "bad dropped-keyspace mark"))?;
            let id = u32::from_be_bytes(id);
            // The name may still point at it if the crash came before its removal.
            for (name, named_id) in self.catalog_entries(NAME)? {
                if decode_id(self, &named_id)? == id {
                    self.write(&catalog_key(NAME, &name), WriteOp::Delete)?;
                }
            }
            self.finish_drop(id)?;
        }
        Ok(())
    }

    /// Removes every key of keyspace `id`, then its drop mark; one durability wait at the
    /// end rather than one per key.
    fn finish_drop(&self, id: u32) -> Result<()> {
        let space = Space::new(id, String::new());
        let prefix = space.prefix();
        loop {
            let keys: Vec<Vec<u8>> = crate::tree::read::Range::new::<&[u8], _>(self, &space, ..)
                .keys_only()
                .take(DROP_CHUNK)
                .map(|r| r.map(|(k, _)| k))
                .collect::<Result<_>>()?;
            if keys.is_empty() {
                break;
            }
            let mut last: Option<Appended> = None;
            for key in keys {
                last = self
                    .apply(&prefix.key(&key), WriteOp::Delete, true)?
                    .or(last);
                self.after_write();
            }
            if let Some(appended) = last {
                self.journal().commit(appended)?;
            }
        }
        self.write(&catalog_key(DROPPING, &id.to_be_bytes()), WriteOp::Delete)
    }

    /// The catalog entries of `kind`: (key after the kind byte, value), in key order.
    fn catalog_entries(&self, kind: u8) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let space = Space::with_prefix(Prefix::raw(&[CATALOG_BYTE, kind]));
        crate::tree::read::Range::new::<&[u8], _>(self, &space, ..).collect()
    }
}

#[cfg(all(test, not(shuttle)))]
mod tests {
    use super::*;
    use crate::tree::read::Range;
    use crate::{Config, Tree};

    /// The id the catalog gives `name`.
    fn id_of(tree: &Tree, name: &str) -> u32 {
        let shared = tree.shared();
        let id = shared
            .get(&catalog_key(NAME, name.as_bytes()))
            .unwrap()
            .unwrap();
        decode_id(shared, &id).unwrap()
    }

    /// Keys stored under keyspace `id`'s prefix, whatever the catalog says.
    fn stored_under(tree: &Tree, id: u32) -> usize {
        let space = Space::new(id, String::new());
        Range::new::<&[u8], _>(tree.shared(), &space, ..).count()
    }

    #[test]
    fn an_unfinished_drop_is_finished_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let tree = Tree::open(Config::new(dir.path()).cache_size(1 << 20)).unwrap();
        let gone = tree.keyspace("gone").unwrap();
        let stay = tree.keyspace("stay").unwrap();
        for i in 0u32..3000 {
            gone.insert(i.to_be_bytes(), [1u8; 40]).unwrap();
            stay.insert(i.to_be_bytes(), [2u8; 40]).unwrap();
        }
        let id = id_of(&tree, "gone");
        // What a crash right after the drop's first write leaves: the mark, the name, the keys.
        tree.shared()
            .write(&catalog_key(DROPPING, &id.to_be_bytes()), WriteOp::Put(&[]))
            .unwrap();
        drop((gone, stay));
        tree.close().unwrap();
        let tree = Tree::open(Config::new(dir.path())).unwrap();
        assert_eq!(tree.keyspaces().unwrap(), ["stay"]);
        assert_eq!(stored_under(&tree, id), 0);
        assert!(tree.shared().catalog_entries(DROPPING).unwrap().is_empty());
        assert_eq!(tree.keyspace("stay").unwrap().iter().count(), 3000);
        let again = tree.keyspace("gone").unwrap();
        assert!(again.iter().next().is_none());
        assert_ne!(id_of(&tree, "gone"), id, "ids are never reused");
    }

    #[test]
    fn writes_racing_a_drop_leave_nothing_behind() {
        let tree = Tree::open(Config::in_memory()).unwrap();
        let ks = tree.keyspace("race").unwrap();
        let id = id_of(&tree, "race");
        let written = std::sync::atomic::AtomicU32::new(0);
        std::thread::scope(|s| {
            let (ks, written) = (&ks, &written);
            let writer = s.spawn(move || {
                for i in 0u32.. {
                    match ks.insert(i.to_be_bytes(), b"v") {
                        Ok(()) => written.store(i + 1, std::sync::atomic::Ordering::Release),
                        Err(Error::KeyspaceDropped { .. }) => return i,
                        Err(e) => panic!("insert: {e}"),
                    }
                }
                unreachable!()
            });
            while written.load(std::sync::atomic::Ordering::Acquire) < 2000 {
                std::thread::yield_now();
            }
            tree.drop_keyspace("race").unwrap();
            assert!(writer.join().unwrap() >= 2000);
        });
        assert_eq!(stored_under(&tree, id), 0);
        assert!(tree.keyspaces().unwrap().is_empty());
    }
}
