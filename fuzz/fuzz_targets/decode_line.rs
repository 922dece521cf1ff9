//! A stream line (or several) of arbitrary bytes through fake_watcher::StreamReader and decode_event.
//! The checks live in fake-watcher/tests/fuzz_regressions/checks.rs, which
//! the regression test shares.

#![no_main]

#[allow(dead_code)]
#[path = "../../fake-watcher/tests/fuzz_regressions/checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::decode_line(data));
