//! Arbitrary bytes as a node page: validation must never panic, and a page it accepts must
//! answer search, bounds and child lookups exactly like a linear scan over its records.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    bfkv::internals::node_decode_check(data);
});
