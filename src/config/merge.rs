//! Merge operators in the configuration: the tree's, and one per keyspace.

use super::Config;

/// The function [`Config::merge_operator`] installs: `(key, old value, operand) -> new value`
/// (`None` removes the key).
pub(crate) type MergeFn = dyn Fn(&[u8], Option<&[u8]>, &[u8]) -> Option<Vec<u8>> + Send + Sync;

/// A tree's merge operator, shared by every thread that folds operands.
#[derive(Clone)]
pub(crate) struct MergeOperator(pub(crate) std::sync::Arc<MergeFn>);

impl std::fmt::Debug for MergeOperator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MergeOperator")
    }
}

impl Config {
    /// The function that combines a key's value with a merge operand, for
    /// [`Tree::merge`](crate::Tree::merge): it gets the key (without its keyspace), the current
    /// value (`None` if absent) and the operand, and returns the new value (`None` removes the
    /// key). A merge is blind: it buffers the operand in the leaf's mini-page without reading
    /// the old value, and the operands are folded over it, in the order they were
    /// acknowledged, when the key is read or its leaf is written back. The same operator must
    /// be configured whenever the tree is opened: a log holding merges cannot be replayed
    /// without it (`Err(InvalidConfig)` at open). It must be deterministic, and return at
    /// most [`Limits::max_value_len`](crate::Limits::max_value_len) bytes. If it panics, or
    /// returns more, for some key, only that key fails (see
    /// [`Error::MergeFailed`](crate::Error::MergeFailed)). It is the operator of every
    /// keyspace without one of its own ([`Config::keyspace_merge_operator`]).
    ///
    /// A leaf's operands are folded into its page by one read and one write when its
    /// mini-page is evicted, so a merge costs that write-back shared by the operands the
    /// cache held for the leaf: with data far larger than the cache, larger pages (fewer
    /// leaves, more operands each) make merges cheaper (`docs/benchmarks.md`).
    ///
    /// ```
    /// let add = |_key: &[u8], old: Option<&[u8]>, operand: &[u8]| {
    ///     let n = |b: Option<&[u8]>| b.and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes);
    ///     Some((n(old) + n(Some(operand))).to_le_bytes().to_vec())
    /// };
    /// let tree = bfkv::Tree::open(bfkv::Config::in_memory().merge_operator(add))?;
    /// tree.merge(b"visits", 1u64.to_le_bytes())?;
    /// tree.merge(b"visits", 2u64.to_le_bytes())?;
    /// assert_eq!(tree.get(b"visits")?, Some(3u64.to_le_bytes().to_vec()));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    #[must_use]
    pub fn merge_operator(
        mut self,
        operator: impl Fn(&[u8], Option<&[u8]>, &[u8]) -> Option<Vec<u8>> + Send + Sync + 'static,
    ) -> Self {
        self.merge_operator = Some(MergeOperator(std::sync::Arc::new(operator)));
        self
    }

    /// The merge operator of keyspace `name` (the tree's, [`Config::merge_operator`], is
    /// the default for keyspaces without their own). Like the tree's, it must be configured
    /// whenever the tree is opened: recovery folds each keyspace's logged merges with its
    /// own. Setting it again for the same name replaces it.
    ///
    /// ```
    /// let add = |_: &[u8], old: Option<&[u8]>, operand: &[u8]| {
    ///     let n = |b: Option<&[u8]>| b.and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes);
    ///     Some((n(old) + n(Some(operand))).to_le_bytes().to_vec())
    /// };
    /// let append = |_: &[u8], old: Option<&[u8]>, operand: &[u8]| {
    ///     Some([old.unwrap_or_default(), operand].concat())
    /// };
    /// let tree = bfkv::Tree::open(
    ///     bfkv::Config::in_memory()
    ///         .merge_operator(append)
    ///         .keyspace_merge_operator("counters", add),
    /// )?;
    /// let counters = tree.keyspace("counters")?;
    /// counters.merge(b"views", 2u64.to_le_bytes())?;
    /// counters.merge(b"views", 3u64.to_le_bytes())?;
    /// assert_eq!(counters.get(b"views")?, Some(5u64.to_le_bytes().to_vec()));
    /// tree.merge(b"log", b"a")?; // the default keyspace: the tree's operator
    /// tree.merge(b"log", b"b")?;
    /// assert_eq!(tree.get(b"log")?, Some(b"ab".to_vec()));
    /// # Ok::<(), bfkv::Error>(())
    /// ```
    #[must_use]
    pub fn keyspace_merge_operator(
        mut self,
        name: &str,
        operator: impl Fn(&[u8], Option<&[u8]>, &[u8]) -> Option<Vec<u8>> + Send + Sync + 'static,
    ) -> Self {
        let operator = MergeOperator(std::sync::Arc::new(operator));
        self.keyspace_merge_operators.retain(|(n, _)| n != name);
        self.keyspace_merge_operators
            .push((name.to_owned(), operator));
        self
    }

    /// The operator configured for keyspace `name`, if it has one of its own.
    pub(crate) fn keyspace_operator(&self, name: &[u8]) -> Option<&MergeOperator> {
        self.keyspace_merge_operators
            .iter()
            .find(|(n, _)| n.as_bytes() == name)
            .map(|(_, op)| op)
    }
}
