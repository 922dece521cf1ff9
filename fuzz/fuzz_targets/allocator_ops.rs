//! Arbitrary bytes as set_pool/remove_pool/allocate/keep/release operations, of MetalLB and Cilium pools and keys, on allocator::Allocator, invariants checked after each.
//! The checks live in fake-watcher/tests/fuzz_regressions/checks.rs, which
//! the regression test shares.

#![no_main]

#[allow(dead_code)]
#[path = "../../fake-watcher/tests/fuzz_regressions/checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::allocator_ops(data));
