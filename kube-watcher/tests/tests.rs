//! Integration tests of kube-watcher, one binary. No API server can run
//! here, so the host runs against an in-process API-server stub
//! (`support/apiserver_stub.rs`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

mod support;

// The host on the stub: writes, sync order, 409, 410 and relists, leases.
mod host;

// The metallb.io/AddressAssigned condition: merged on type, removed, kept
// across a restart.
mod conditions;

// Pool feedback: Events and the Accepted condition of rejected pools.
mod pools;

// Cilium's pools: discovery, their four conditions, the Service's condition.
mod cilium;

// What an operator sees: election status, Lease errors, watch backoff, logs.
mod operation;

// `kube-watcher record`: a replay stream (docs/replay.md) that fake-watcher replays.
mod record;

// deploy/crd/crd.yaml is what the Rust types generate.
mod crd;

// deploy/: kustomizations, image, Docker build.
mod deploy;

// deploy/rbac.yaml grants exactly the verbs the host and the recorder use.
mod rbac;

// Against the cluster in KUBECONFIG; ignored by default (see README.md).
mod e2e;
