//! Property tests of the node layout against a BTreeMap model.
