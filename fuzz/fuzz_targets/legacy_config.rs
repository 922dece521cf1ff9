//! Arbitrary text through fake_watcher::parse_legacy_config (MetalLB's legacy YAML).
//! The checks live in fake-watcher/tests/fuzz_regressions/checks.rs, which
//! the regression test shares.

#![no_main]

#[allow(dead_code)]
#[path = "../../fake-watcher/tests/fuzz_regressions/checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::legacy_config(data));
