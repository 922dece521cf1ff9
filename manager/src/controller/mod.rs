//! The controller: decides a Service's addresses (docs/allocation.md §4) on the
//! allocator and writes the result through a [`crate::Client`].

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Namespace, Service};
use subscriber::{CiliumLoadBalancerIPPool, IPAddressPool};

mod allocating;
mod decide;
mod explain;
mod parked;
mod service;

pub use allocating::{AllocatingController, ControllerConfig, ControllerStats, ServiceHolding};
pub use explain::{Asks, Explanation, Judgement, NotHandled, Shows};
pub use service::SharingAcrossNamespaces;

/// What became of one reconciliation, and what the manager must do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncOutcome {
    pub state: SyncState,
    /// Services waiting for an address must be reconsidered (a Service was
    /// deleted or released its addresses), longest-waiting first.
    pub wake_waiting: bool,
    /// Further Services to reconsider.
    pub reconsider: Reconsider,
    /// With [`SyncState::Waiting`]: Services of one class fail alike in the
    /// same allocator state (their failure depends only on the
    /// configuration and their demand), so a wake that sees the first of a
    /// class fail again skips the rest. `None`: always reconsidered.
    pub waiting_class: Option<u64>,
    /// With [`SyncState::Waiting`] for a failure in a `waiting_class`: the
    /// class, all a pool may read of the Service (but its name) and the
    /// failure's message. Two Services alike fail alike under any
    /// configuration of `IPAddressPool`s and Namespaces in the same
    /// allocator state (see [`Shortcuts::failure_epoch`]), and one that
    /// fails alike again fails as it did.
    pub alike: Option<u64>,
    /// With [`SyncState::Waiting`]: what can end the wait. `None`: any
    /// delete or release may (it is woken by every one); `Some(keys)`: only
    /// a release that frees one of these (none: only a pool or Namespace
    /// change, which reconsiders every Service anyway).
    pub wake_on: Option<Vec<WakeOn>>,
    /// With `wake_waiting`: what this reconciliation freed, so that only
    /// the waiting Services it can serve are woken (docs/allocation.md
    /// §4.9), besides those woken by any release.
    pub freed: Vec<WakeOn>,
    /// [`WakeOn::Holders`] of each address this reconciliation took: while
    /// a wake is worked through, the waiting Services refused one of them
    /// that it has yet to reach are run too, as reconsidering every waiting
    /// Service in order would run them after this one and name it among
    /// the holders (docs/allocation.md §4.6).
    pub joined: Vec<WakeOn>,
    /// With [`SyncState::Retry`]: the Service could get no address, and
    /// only the write of that (clearing its status) failed. It waits from
    /// now on all the same (docs/allocation.md §4.6: waiting starts when a Service
    /// first fails to get an address), besides being retried.
    pub waiting_too: bool,
}

impl SyncOutcome {
    /// Plain success, nothing else to do.
    pub fn success() -> Self {
        Self::new(SyncState::Success)
    }

    pub fn new(state: SyncState) -> Self {
        Self {
            state,
            wake_waiting: false,
            reconsider: Reconsider::None,
            waiting_class: None,
            alike: None,
            wake_on: None,
            freed: Vec::new(),
            joined: Vec::new(),
            waiting_too: false,
        }
    }
}

/// Something a release frees, that a waiting Service may wait for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WakeOn {
    /// An address of this family in this pool.
    Pool(String, allocator::Family),
    /// An address of this family in any unpinned automatic pool: they
    /// serve every Service, so one that tried them waits on them all with
    /// one key, not one per pool.
    UnpinnedPool(allocator::Family),
    /// This address.
    Address(std::net::IpAddr),
    /// A holder left an address of this family in this pool, or changed
    /// its sharing terms there: a Service that may share may fit on an
    /// address that is still held.
    Regrouped(String, allocator::Family),
    /// The same in any unpinned automatic pool (as [`WakeOn::UnpinnedPool`]).
    UnpinnedRegrouped(allocator::Family),
    /// An address of this family in any pinned automatic pool with these
    /// rules ([`allocator::AutoGroup::Pinned`]): they serve the same
    /// Services, so one that tried them waits on them with one key.
    PinnedPool(u64, allocator::Family),
    /// The same as [`WakeOn::Regrouped`] in any such pool.
    PinnedRegrouped(u64, allocator::Family),
    /// A holder left or joined this address: the holder a refused
    /// Service's message names may be another now.
    Holders(std::net::IpAddr),
    /// An address of this family in any Cilium pool of this group: where
    /// a half-served Service held in a Cilium pool may get its other
    /// family (docs/cilium.md §3.5), one key for all the pools alike.
    CiliumGroup(allocator::AutoGroup, allocator::Family),
    /// The same as [`WakeOn::Regrouped`] in any such pool.
    CiliumRegrouped(allocator::AutoGroup, allocator::Family),
    /// A change of this pool: for a Service that failed for the
    /// configuration alone (docs/allocation.md §4.6), no release and no
    /// change of another pool can end the wait, but one of the pool it
    /// asked for, of a pool with an address it asked for
    /// ([`WakeOn::PoolCovering`]) or of its Namespace's labels
    /// ([`WakeOn::NamespaceChanged`]). These three are never freed by a
    /// release.
    PoolChanged(String),
    /// A change of a pool that has (or had) this address.
    PoolCovering(std::net::IpAddr),
    /// A change of this Namespace's labels.
    NamespaceChanged(String),
}

impl WakeOn {
    /// A change of configuration ([`WakeOn::PoolChanged`],
    /// [`WakeOn::PoolCovering`], [`WakeOn::NamespaceChanged`]), which no
    /// release frees.
    pub(crate) fn is_change(&self) -> bool {
        matches!(
            self,
            WakeOn::PoolChanged(_) | WakeOn::PoolCovering(_) | WakeOn::NamespaceChanged(_)
        )
    }

    /// For a key of free addresses in some pools, the key of holders
    /// leaving or changing their terms there (what a Service that may
    /// share can fit into as well).
    pub(crate) fn regrouped(&self) -> Option<WakeOn> {
        match self {
            WakeOn::Pool(pool, family) => Some(WakeOn::Regrouped(pool.clone(), *family)),
            WakeOn::PinnedPool(rules, family) => Some(WakeOn::PinnedRegrouped(*rules, *family)),
            WakeOn::UnpinnedPool(family) => Some(WakeOn::UnpinnedRegrouped(*family)),
            WakeOn::CiliumGroup(group, family) => Some(WakeOn::CiliumRegrouped(*group, *family)),
            _ => None,
        }
    }
}

/// How a reconciliation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyncState {
    /// Done; the key leaves the waiting list if it was on it.
    Success,
    /// A write failed: process the key again after a backoff.
    Retry(String),
    /// No address could be given: the key waits (docs/allocation.md §4.6) until a
    /// delete or release wakes it. Not retried by itself.
    Waiting,
    /// The request is invalid (`LoadBalancerFailed`): not retried, not waiting.
    Invalid,
}

/// Which other Services to reconsider after a reconciliation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reconsider {
    None,
    /// These keys (e.g. the others on a shared address).
    Keys(Vec<String>),
    /// Every Service, in two passes as at sync (docs/allocation.md §4.5, §4.6): first
    /// every Service keeps what is still allowed ([`Controller::restore`]),
    /// then the others are reconsidered, those that had to release first.
    /// After a pool or Namespace change.
    All,
}

/// What the restore pass at sync (docs/allocation.md §4.5, first pass) did with a
/// Service's status addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestoreOutcome {
    /// Not ours (not a LoadBalancer of our class), or no addresses in status.
    Nothing,
    /// The status addresses are still allowed and now held.
    Kept,
    /// Kept one address of a PreferDualStack Service that did not ask
    /// for it alone: it waits for the other family, and is among the
    /// Services without addresses in the second pass (§4.5).
    KeptIncomplete,
    /// Kept, and nothing else is to do: the Service holds exactly what its
    /// object shows (addresses and pool), wants no further family, and no
    /// Warning or clearing is pending for it, so reconciling it now would
    /// write and emit nothing. The second pass may leave it out.
    Settled,
    /// The status addresses are not allowed: the Service must release them.
    MustRelease,
}

/// The decision-maker the manager drives, one key at a time (modelled on the
/// controller interface Cilium's BGP manager called on MetalLB).
///
/// Not part of the crate's public surface: it is `pub` only inside this
/// private module, so a host names [`crate::Manager`] with
/// [`AllocatingController`] and cannot implement it (nor its
/// [`Shortcuts`]).
#[async_trait]
pub trait Controller: Shortcuts + Send + Sync + 'static {
    /// Reconciles the Service `key`; `None` when it is deleted.
    async fn set_balancer(&self, key: &str, service: Option<&Service>) -> SyncOutcome;
    /// Applies a pool change; `None` when the pool is deleted.
    async fn set_pool(&self, name: &str, pool: Option<&IPAddressPool>) -> SyncOutcome;
    /// Applies a `CiliumLoadBalancerIPPool` change; `None` when it is
    /// deleted. The default ignores Cilium pools.
    async fn set_cilium_pool(
        &self,
        name: &str,
        pool: Option<&CiliumLoadBalancerIPPool>,
    ) -> SyncOutcome {
        let _ = (name, pool);
        SyncOutcome::success()
    }
    /// Applies a Namespace change; `None` when it is deleted.
    async fn set_namespace(&self, name: &str, namespace: Option<&Namespace>) -> SyncOutcome;
    /// The first pass of docs/allocation.md §4.5 (at sync, and after a pool or
    /// Namespace change): keep the Service's status addresses if still
    /// allowed, release them (with `ClearAssignment`) if not; hand out
    /// nothing, write no status.
    async fn restore(&self, key: &str, service: &Service) -> RestoreOutcome;
    /// The host's initial list is complete; called after the restore pass.
    fn mark_synced(&self);
}

/// The manager's speed shortcuts: questions whose answer only lets the
/// manager skip work that would change nothing. Each is off with
/// [`ControllerConfig::exhaustive`] (as are [`RestoreOutcome::Settled`] and
/// a waiting Service's [`SyncOutcome::waiting_class`] and
/// [`SyncOutcome::wake_on`]), and the property test
/// `skipping_settled_services_changes_nothing` (fake-watcher) with the
/// manager test `cilium_pools_and_keys_give_the_same_result_without_shortcuts`
/// show the result is the same with or without them.
pub trait Shortcuts {
    /// Whether the update of the Service `key` from `old` to `new` can
    /// change nothing this controller decides, so the manager need not
    /// queue it: typically the echo of the controller's own status write.
    /// The default (`false`) queues every update.
    fn is_settled_update(&self, key: &str, old: &Service, new: &Service) -> bool {
        let _ = (key, old, new);
        false
    }
    /// For the first pass after a pool change: the Services the change
    /// may have touched (those it released, those holding addresses in the
    /// pools it changed, those with something pending), or `None` for
    /// every Service. The manager restores these and every Service that
    /// retries or had an event since it was last reconciled; the others
    /// hold addresses the change left as they were, and are settled
    /// without a look (docs/allocation.md §4.9). A Service that waits (but
    /// one waiting on a change of another pool) or failed with a Warning
    /// is reconsidered in the second pass, at its first-seen place; it is
    /// restored first only if it is in `services` or has something pending.
    /// The default (`None`) restores every Service.
    fn touched_by_change(&self) -> Option<Touched> {
        None
    }
    /// A number that changes whenever something happens that may let a
    /// waiting Service get an address, or fail otherwise: an address left
    /// by a holder, a pool or Namespace change. Two waiting Services
    /// [`SyncOutcome::alike`] reconciled at one reading fail alike, so one
    /// failing again tells the other's outcome: a change's second pass
    /// runs one of each, not every waiting Service (docs/allocation.md
    /// §4.9). `None` (the default, and with
    /// [`ControllerConfig::exhaustive`]): every one is run.
    fn failure_epoch(&self) -> Option<u64> {
        None
    }
}

/// What the last pool or Namespace change may have touched (see
/// [`Shortcuts::touched_by_change`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Touched {
    /// The Services it may have touched, besides the busy ones.
    pub services: Vec<String>,
    /// The Services whose last reconciliation failed with a Warning (but
    /// those waiting on a change of configuration alone): the change may
    /// let them announce otherwise, though it touched nothing they hold
    /// unless they are in `services` too.
    pub failing: Vec<String>,
    /// What the change was, as the keys of the Services that wait on a
    /// change of configuration alone ([`WakeOn::PoolChanged`],
    /// [`WakeOn::PoolCovering`], [`WakeOn::NamespaceChanged`]): of those,
    /// only the ones waiting on one of these are looked at. `None`: every
    /// waiting Service is.
    pub changes: Option<Vec<WakeOn>>,
}
