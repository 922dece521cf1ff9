//! Integration tests of fake-watcher, one binary.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

// The `fake-watcher replay` command: output formats, exit statuses, stderr.
mod cli;
