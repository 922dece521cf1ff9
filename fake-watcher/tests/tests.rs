//! Integration tests of fake-watcher, one binary.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

// The `fake-watcher replay` command: output formats, exit statuses, stderr.
mod cli;

// The snapshot corpus of streams (insta::glob!): every rule of
// docs/allocation.md §4 end to end.
mod corpus;

// Random streams: §6 invariants after every line, identical replays, restarts
// and failed writes that change no address, streams cut mid-line.
mod properties;

// An independent, naive model of the allocation rules: random streams must
// end with the same addresses in the replay and in the model.
mod reference;

// Bad lines and bad values: a precise error each, the rest undisturbed.
mod bad_input;

// Inputs found by the cargo-fuzz targets (fuzz/), replayed without a fuzzer.
mod fuzz_regressions;

// `fake-watcher explain`: the decision for one Service, pool by pool.
mod explain;

// `fake-watcher what-if`: what applying objects would change; exit 3 with --fail-on-change.
mod what_if;

// Cilium LB-IPAM clusters: a recorded one replays unchanged, its mixed twin
// moves nothing, --config takes Cilium pools.
mod cilium;
