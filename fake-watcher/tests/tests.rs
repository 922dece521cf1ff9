//! Integration tests of fake-watcher, one binary.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

// The `fake-watcher replay` command: output formats, exit statuses, stderr.
mod cli;

// The snapshot corpus of streams: every rule of DESIGN.md §4 end to end.
mod corpus;
