//! Arbitrary bytes as a log segment (or a valid segment damaged at a random place): the
//! decoder recovery and replay use must never panic, and must return a prefix of valid
//! records: each re-encodes to exactly the bytes it came from, and every record before the
//! damage comes back unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    bfkv::internals::wal_decode_check(data);
});
