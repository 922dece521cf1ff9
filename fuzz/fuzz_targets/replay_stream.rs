//! Arbitrary bytes as a whole replay stream (--keep-going, invariants checked after every line).
//! The checks live in fake-watcher/tests/fuzz_regressions/checks.rs, which
//! the regression test shares.

#![no_main]

#[allow(dead_code)]
#[path = "../../fake-watcher/tests/fuzz_regressions/checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::replay_stream(data));
