//! Replays recorded Kubernetes watch streams through the allocator plugin,
//! offline and deterministically (docs/replay.md is the contract).
//!
//! Start with [`replay`] (or [`replay_blocking`], or [`replay_pipelined`],
//! which decodes on a thread of its own): it reads a JSON Lines
//! stream once, line by line ([`StreamReader`]), applies each line to a
//! [`ReplayStore`] that behaves as an API server, delivers the resulting
//! event to the subscriber chains on which a `manager::Manager` is
//! registered, waits for the manager to be idle, and returns a
//! [`ReplayOutput`]: the §3 [`ReplayResult`], a per-line trace
//! ([`TraceStep`]) for snapshot tests, and the lines skipped with
//! `--keep-going`. The controller writes through a [`MemoryClient`], which
//! writes into the store, delivers each write back as a watch would, records
//! every write and Event, and can fail writes on purpose ([`FailurePlan`]).
//! [`render`] prints a result as the `fake-watcher replay` command does;
//! [`load_config`] reads `--config`.

mod client;
mod config;
mod decode;
mod explain;
mod lookahead;
mod output;
mod plugin;
mod replay;
mod result;
mod source;
mod store;
mod stream;
mod what_if;

pub use client::{EventRecord, FailurePlan, MemoryClient, WriteOutcome, WriteRecord};
pub use config::{
    load_config, load_legacy_config, parse_config, parse_legacy_config, ConfigError, ConfigPool,
};
pub use explain::{
    explain_stream, render_explanation, AsksDocument, ConditionDocument, EventDocument,
    ExplainDocument, KeepDocument, OutcomeDocument, PoolDocument, ShowsDocument,
};
pub use lookahead::SPOOL_MEMORY_BYTES;
pub use output::{
    render, render_json, render_table, render_table_with, render_yaml, write_result, OutputError,
    OutputFormat, TableNotes,
};
pub use plugin::{NotIdle, Plugin};
pub use replay::{
    replay, replay_blocking, replay_pipelined, replay_with, Observer, ReplayError, ReplayOptions,
    ReplayOutput, WRITES_PER_LINE, WRITES_PER_SERVICE,
};
pub use result::{
    CiliumPoolResult, Count, FamilyResult, HoldingRecord, PoolResult, RejectedPoolResult,
    ReplayResult, ServiceResult, TraceEvent, TraceStep, MAX_SAFE_INTEGER,
};
pub use store::{Change, Delta, ReplayStore, StoreError, SERVICE_CIDR_V4, SERVICE_CIDR_V6};
pub use stream::{
    decode_event, EventType, Kind, LineError, Object, ObjectRef, Record, StreamError, StreamReader,
    WatchEvent, DEFAULT_MAX_LINE_BYTES, DEFAULT_NAMESPACE,
};
pub use what_if::{
    load_apply_file, parse_apply, parse_delete, render_what_if, what_if, ServiceChange,
    ServiceState, WhatIfError, WhatIfReport,
};
