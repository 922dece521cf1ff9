//! The decision for one Service (docs/allocation.md §4.2–4.4): what it
//! keeps, is given, releases, or why it gets nothing. No I/O and no
//! locking: it works on the allocator value it is handed and returns a
//! [`Decision`] whose failures are typed, so that the Event message and
//! the condition reason come from one place.

use std::net::IpAddr;

use allocator::{AllocError, Allocator, FamilyPolicy, Holding, Request};

use super::service::{parse_status, ServiceView};

/// Why a Service has no address. Its [`Failure::reason`] is the condition
/// reason and its [`Failure::detail`] the end of the Event message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// No cluster IP: no family to give an address of.
    NoClusterIp,
    /// The allocator found nothing (§4.4).
    Allocation(AllocError),
}

impl Failure {
    /// A stable CamelCase reason (docs/allocation.md §4.7).
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Failure::NoClusterIp => "NoClusterIP",
            Failure::Allocation(error) => match error {
                AllocError::NoPool => "NoPoolServes",
                AllocError::UnknownPool { .. } | AllocError::CiliumPoolNamed { .. } => {
                    "UnknownPool"
                }
                AllocError::PoolDisabled { .. } => "PoolDisabled",
                AllocError::AddressReserved { .. } => "AddressReserved",
                AllocError::PoolDoesNotServe { .. } => "PoolDoesNotServe",
                AllocError::NoAvailable { .. } => "PoolExhausted",
                AllocError::NotInAnyPool { .. } => "AddressOutsidePools",
                AllocError::Avoided { .. } => "AddressAvoided",
                AllocError::DifferentPools { .. } => "AddressesInDifferentPools",
                AllocError::NotInRequestedPool { .. } => "AddressNotInRequestedPool",
                AllocError::Taken {
                    conflict: allocator::ShareConflict::InUse { .. },
                    ..
                } => "AddressInUse",
                AllocError::Taken { .. } => "SharingRefused",
                AllocError::WrongFamily { .. } | AllocError::NotRequested { .. } => "WrongFamily",
                AllocError::NoFamilyInPool { .. } => "FamilyUnavailable",
            },
        }
    }

    /// What went wrong, in words.
    pub(crate) fn detail(&self) -> String {
        match self {
            Failure::NoClusterIp => "the service has no cluster IP".to_owned(),
            Failure::Allocation(error) => error.to_string(),
        }
    }
}

/// What became of the Service's addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// It holds addresses: `given` when some were newly given (the
    /// holding then named in `IPAllocated`); `waits_for_family` for a
    /// PreferDualStack Service holding one family it did not ask for alone.
    Holds {
        given: Option<Holding>,
        waits_for_family: bool,
    },
    /// It holds nothing and waits (§4.6).
    Fails(Failure),
    /// The request itself is invalid (`LoadBalancerFailed`, §4.2): it keeps
    /// what it holds and gets nothing new.
    Invalid(String),
}

/// The decision for one Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Decision {
    /// The status addresses were released, and why (`ClearAssignment`).
    pub(crate) cleared: Option<String>,
    /// When only part of the status was released (a pair held per address,
    /// docs/cilium.md §3.5): the addresses released; `None`: all of them.
    pub(crate) cleared_part: Option<Vec<String>>,
    pub(crate) outcome: Outcome,
}

/// What [`decide`] reads of one Service.
pub(crate) struct Input<'a> {
    pub(crate) key: &'a str,
    pub(crate) view: &'a ServiceView<'a>,
    pub(crate) namespace_labels: &'a std::collections::BTreeMap<String, String>,
    /// `status.loadBalancer.ingress[].ip` as written.
    pub(crate) status: &'a [String],
    /// The status addresses are stale (released when the Service stopped
    /// being ours, their clearing not yet written): never kept.
    pub(crate) stale_status: bool,
}

/// Decides one Service from scratch (§4.4): keep what its status holds if
/// still allowed, else take what it asks for or the lowest fitting
/// addresses.
pub(crate) fn decide(allocator: &mut Allocator, input: &Input<'_>) -> Decision {
    let Some(families) = input.view.families else {
        return no_cluster_ip(allocator, input);
    };
    let (requested, invalid) = match &input.view.requested {
        Ok(ips) => (ips.as_slice(), None),
        Err(reason) => (&[][..], Some(reason.clone())),
    };
    let request = input
        .view
        .request(input.key, families, input.namespace_labels, requested);
    let (kept, cleared, mut cleared_part) = keep_status(allocator, &request, input);
    let outcome = match invalid {
        Some(reason) => Outcome::Invalid(reason),
        None if kept => complete(allocator, &request, families, requested),
        None => take(allocator, &request, families, requested),
    };
    // The address kept alone may go too (a RequireDualStack Service that
    // found no address of the other family): then the whole status was.
    if cleared_part.is_some() {
        let held = allocator.held(input.key).map_or(&[][..], |(_, ips)| ips);
        let parsed = |text: &String| text.parse::<IpAddr>().ok();
        let released: Vec<IpAddr> = cleared_part.iter().flatten().filter_map(parsed).collect();
        let all_kept = input
            .status
            .iter()
            .filter_map(parsed)
            .filter(|ip| !released.contains(ip))
            .all(|ip| held.contains(&ip));
        if !all_kept {
            cleared_part = None;
        }
    }
    Decision {
        cleared,
        cleared_part,
        outcome,
    }
}

/// §4.3: a Service with no cluster IP gets nothing and keeps nothing.
fn no_cluster_ip(allocator: &mut Allocator, input: &Input<'_>) -> Decision {
    allocator.release(input.key);
    let cleared = (!input.status.is_empty()).then(|| Failure::NoClusterIp.detail());
    let outcome = match &input.view.requested {
        Err(reason) => Outcome::Invalid(reason.clone()),
        Ok(_) => Outcome::Fails(Failure::NoClusterIp),
    };
    Decision {
        cleared,
        cleared_part: None,
        outcome,
    }
}

/// §4.4 step 1: keeps the status addresses if still allowed; otherwise
/// releases whatever is held, saying why when the status showed addresses.
/// A pair held per address (docs/cilium.md §3.5) may keep one address and
/// release the other: the third value names the released one.
fn keep_status(
    allocator: &mut Allocator,
    request: &Request<'_>,
    input: &Input<'_>,
) -> (bool, Option<String>, Option<Vec<String>>) {
    if input.status.is_empty() || input.stale_status {
        // The status lost its addresses (a failed write, or a user): start
        // from a clean slate, as MetalLB does.
        allocator.release(input.key);
        return (false, None, None);
    }
    let kept = parse_status(input.status).and_then(|ips| {
        allocator
            .keep_part(request, &ips)
            .map_err(|e| e.to_string())
    });
    match kept {
        Ok((_, None)) => (true, None, None),
        Ok((_, Some((ip, why)))) => {
            tracing::debug!(key = input.key, %ip, %why, "held address no longer allowed");
            (true, Some(why.to_string()), Some(vec![ip.to_string()]))
        }
        Err(reason) => {
            tracing::debug!(key = input.key, %reason, "held address no longer allowed");
            allocator.release(input.key);
            (false, Some(reason), None)
        }
    }
}

/// A dual-stack Service holding one family it did not ask for alone: a
/// PreferDualStack one (§4.3), or one that kept one address of a pair
/// held per address (docs/cilium.md §3.5).
pub(crate) fn incomplete(families: FamilyPolicy, held: &[IpAddr], requested: &[IpAddr]) -> bool {
    matches!(
        families,
        FamilyPolicy::PreferDual { .. } | FamilyPolicy::RequireDual
    ) && held.len() == 1
        && requested.is_empty()
}

/// After keeping the status addresses: a half-served PreferDualStack
/// Service gets its missing family if one fits (§4.3).
fn complete(
    allocator: &mut Allocator,
    request: &Request<'_>,
    families: FamilyPolicy,
    requested: &[IpAddr],
) -> Outcome {
    let held = allocator.held(request.key).map(|(_, ips)| ips.to_vec());
    if !incomplete(families, held.as_deref().unwrap_or_default(), requested) {
        return Outcome::Holds {
            given: None,
            waits_for_family: false,
        };
    }
    match allocator.complete_dual_stack(request) {
        Some(holding) => Outcome::Holds {
            given: Some(holding),
            waits_for_family: false,
        },
        // Both families or none: a new pair, or nothing (§4.3).
        None if families == FamilyPolicy::RequireDual => {
            take(allocator, request, families, requested)
        }
        None => Outcome::Holds {
            given: None,
            waits_for_family: true,
        },
    }
}

/// §4.4 steps 2–4: the requested addresses, or the lowest fitting ones.
fn take(
    allocator: &mut Allocator,
    request: &Request<'_>,
    families: FamilyPolicy,
    requested: &[IpAddr],
) -> Outcome {
    match allocator.allocate(request) {
        Ok(holding) => Outcome::Holds {
            waits_for_family: incomplete(families, &holding.ips, requested),
            given: Some(holding),
        },
        Err(error) => Outcome::Fails(Failure::Allocation(error)),
    }
}

/// Cilium's message for a family no enabled pool serves (docs/cilium.md
/// §3.6).
const NO_POOL_MESSAGE: &str =
    "There are no enabled CiliumLoadBalancerIPPools that match this service";
/// Cilium's message for a family whose serving pools are full.
const OUT_OF_IPS_MESSAGE: &str =
    "All enabled CiliumLoadBalancerIPPools that match this service ran out of allocatable IPs";

/// Cilium's reason and message for the missing part of a request
/// (`cilium.io/IPAMRequestSatisfied`, status False).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CiliumUnsatisfied {
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

impl CiliumUnsatisfied {
    /// `no_pool` for a family (no address requested).
    pub(crate) fn no_pool() -> Self {
        Self {
            reason: "no_pool",
            message: NO_POOL_MESSAGE.to_owned(),
        }
    }

    /// `out_of_ips`.
    pub(crate) fn out_of_ips() -> Self {
        Self {
            reason: "out_of_ips",
            message: OUT_OF_IPS_MESSAGE.to_owned(),
        }
    }

    /// `no_pool` for a requested address.
    pub(crate) fn no_pool_for(ip: IpAddr) -> Self {
        Self {
            reason: "no_pool",
            message: format!("No pool exists with a CIDR containing '{ip}'"),
        }
    }

    fn selector_mismatch(ip: IpAddr) -> Self {
        Self {
            reason: "pool_selector_mismatch",
            message: format!(
                "The pool with the CIDR containing '{ip}', doesn't select this service"
            ),
        }
    }

    fn already_allocated(ip: IpAddr) -> Self {
        Self {
            reason: "already_allocated",
            message: format!("The IP '{ip}' is already allocated to another service"),
        }
    }

    fn incompatible(ip: IpAddr, why: &str) -> Self {
        Self {
            reason: "already_allocated_incompatible_service",
            message: format!(
                "The IP '{ip}' is already allocated to an incompatible service. Reason: {why}"
            ),
        }
    }
}

impl Failure {
    /// Cilium's nearest reason for this failure (the mapping table of
    /// docs/cilium.md §3.6). `requested`: the requested addresses, which
    /// name the address of a failure that does not.
    pub(crate) fn cilium(&self, requested: &[IpAddr]) -> CiliumUnsatisfied {
        let Failure::Allocation(error) = self else {
            return CiliumUnsatisfied::no_pool();
        };
        match error {
            AllocError::NoPool
            | AllocError::UnknownPool { .. }
            | AllocError::CiliumPoolNamed { .. }
            | AllocError::NoFamilyInPool { .. } => CiliumUnsatisfied::no_pool(),
            // Cilium skips a disabled pool's ranges before it looks at the
            // pool: no enabled range contains the address.
            AllocError::PoolDisabled { .. } => match requested.first() {
                Some(ip) => CiliumUnsatisfied::no_pool_for(*ip),
                None => CiliumUnsatisfied::no_pool(),
            },
            // Of a requested address, the pool does not select the Service;
            // of a requested pool, no pool serves it.
            AllocError::PoolDoesNotServe { .. } => match requested.first() {
                Some(ip) => CiliumUnsatisfied::selector_mismatch(*ip),
                None => CiliumUnsatisfied::no_pool(),
            },
            AllocError::NoAvailable { .. } => CiliumUnsatisfied::out_of_ips(),
            AllocError::NotInAnyPool { ip } => CiliumUnsatisfied::no_pool_for(*ip),
            AllocError::WrongFamily { ips, .. } | AllocError::NotRequested { held: ips, .. } => {
                match ips.first() {
                    Some(ip) => CiliumUnsatisfied::no_pool_for(*ip),
                    None => CiliumUnsatisfied::no_pool(),
                }
            }
            AllocError::NotInRequestedPool { ip, .. } => CiliumUnsatisfied::selector_mismatch(*ip),
            AllocError::DifferentPools { second, .. } => {
                CiliumUnsatisfied::selector_mismatch(*second)
            }
            AllocError::Avoided { ip, .. }
            | AllocError::AddressReserved { ip, .. }
            | AllocError::Taken {
                ip,
                conflict: allocator::ShareConflict::InUse { .. },
            } => CiliumUnsatisfied::already_allocated(*ip),
            AllocError::Taken { ip, conflict } => {
                CiliumUnsatisfied::incompatible(*ip, &conflict.to_string())
            }
        }
    }
}
