//! Tree-core tests that need the internals: the structure checker after every operation
//! (`structure.rs`) and the model-checked interleavings (shuttle: `shuttle.rs`,
//! `shuttle_reads.rs`, `shuttle_mirror.rs`, `shuttle_versions.rs`).

#[cfg(all(test, shuttle))]
mod shuttle;
#[cfg(all(test, shuttle))]
mod shuttle_mirror;
#[cfg(all(test, shuttle))]
mod shuttle_reads;
#[cfg(all(test, shuttle))]
mod shuttle_versions;
#[cfg(test)]
mod structure;
