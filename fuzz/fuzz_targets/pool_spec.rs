//! Arbitrary bytes as an IPAddressPool spec and as a CiliumLoadBalancerIPPool spec (serde_json, or lines) through allocator::Pool::parse / parse_cilium and the Allocator.
//! The checks live in fake-watcher/tests/fuzz_regressions/checks.rs, which
//! the regression test shares.

#![no_main]

#[allow(dead_code)]
#[path = "../../fake-watcher/tests/fuzz_regressions/checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::pool_spec(data));
