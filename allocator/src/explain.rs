//! Why a Service holds what it holds, or nothing (`fake-watcher explain`):
//! a read-only walk over the pools in docs/allocation.md §4.4 order, each
//! judged by the very checks the allocation runs (`check`, `fit_all`,
//! `lowest_fit`, `fits`), so the explanation cannot tell another story
//! than the decision. A child of the `alloc` module for its private state;
//! it changes nothing, and costs a walk over the pools (it is asked once,
//! by a person, never per event).

use std::net::IpAddr;
use std::sync::Arc;

use super::{group_of_request, Allocator, Holding, PoolState};
use crate::addr::Family;
use crate::error::{AllocError, ShareConflict};
use crate::pool::Unserved;
use crate::request::{FamilyPolicy, Request};

/// Addresses of a sharing group listed at most when a pool refuses it.
const TRIED_SHOWN: usize = 4;

/// Which step of §4.4 picks the Service's pools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Step 2: the requested addresses; the one candidate is the pool that
    /// contains them.
    RequestedAddresses,
    /// Step 3: the requested pool, alone, whatever its autoAssign.
    RequestedPool,
    /// Step 4: the pools with autoAssign that serve the Service.
    PoolOrder,
}

/// Why a pool was taken or passed over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The Service holds these addresses of the pool, and may keep them
    /// (step 1).
    Holds { ips: Vec<IpAddr> },
    /// The pool would give these addresses.
    Fits { ips: Vec<IpAddr> },
    /// Its serviceAllocation does not cover the Service's Namespace.
    NamespaceNotServed,
    /// Its serviceAllocation's serviceSelectors do not match the Service.
    ServiceSelectorMismatch,
    /// autoAssign is false and the Service asks for neither the pool nor
    /// one of its addresses.
    AutoAssignOff,
    /// A disabled Cilium pool: it keeps its holders but gives no new
    /// address.
    Disabled,
    /// The pool has no address of the family at all.
    NoFamily { family: Family },
    /// No free address of the family is left.
    Full { family: Family },
    /// No free address of the family is left, and the addresses where the
    /// Service's sharing group stands refuse it: the first few, with why.
    SharingRefused {
        family: Family,
        tried: Vec<(IpAddr, ShareConflict)>,
    },
    /// The requested addresses may not be given (taken, avoided, not in
    /// the requested pool, the wrong families).
    Refused(AllocError),
}

/// One candidate pool and its verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolVerdict {
    pub pool: String,
    pub verdict: Verdict,
    /// The pool the Service holds from, or would get its addresses from.
    pub chosen: bool,
}

/// The decision for one Service, explained.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explanation {
    pub step: Step,
    /// What the Service holds now.
    pub held: Option<Holding>,
    /// Step 1, when it holds addresses: whether it may keep them.
    pub keep: Option<Result<(), AllocError>>,
    /// The candidate pools in §4.4 order: for [`Step::PoolOrder`] every
    /// accepted pool (those without autoAssign where they would stand if
    /// they had it); otherwise the one pool concerned, if it exists.
    pub pools: Vec<PoolVerdict>,
    /// What the Service ends with: what it keeps, or what steps 2–4 give
    /// it (its own addresses counted as taken), or why it gets nothing.
    pub outcome: Result<Holding, AllocError>,
}

impl Allocator {
    /// Explains the decision for `request` as it stands, changing nothing.
    pub fn explain(&self, request: &Request<'_>) -> Explanation {
        let held = self.holding(request.key);
        let keep = held.as_ref().map(|h| self.can_keep(request, &h.ips));
        let kept = match (&held, &keep) {
            (Some(holding), Some(Ok(()))) => Some(holding.clone()),
            _ => None,
        };
        let step = if !request.addresses.is_empty() {
            Step::RequestedAddresses
        } else if request.pool.is_some() {
            Step::RequestedPool
        } else {
            Step::PoolOrder
        };
        let outcome = match &kept {
            Some(holding) => Ok(holding.clone()),
            None => self.choose_new(request).map(|((pool, other), mut ips)| {
                ips.sort_by_key(IpAddr::is_ipv6);
                Holding {
                    pool: pool.to_string(),
                    ips,
                    other_pool: other.as_deref().map(str::to_owned),
                }
            }),
        };
        let candidates: Vec<&PoolState> = match step {
            Step::RequestedAddresses => self
                .pools_of(request.addresses)
                .ok()
                .into_iter()
                .flat_map(|(first, second)| [Some(first), second])
                .flatten()
                .filter_map(|name| self.pools.get(&name).map(|state| &**state))
                .collect(),
            // `metallb.io/address-pool` names IPAddressPools only.
            Step::RequestedPool => request
                .pool
                .and_then(|name| self.pools.get(name))
                .filter(|state| state.pool.kind == crate::pool::PoolKind::IPAddressPool)
                .map(|state| &**state)
                .into_iter()
                .collect(),
            Step::PoolOrder => self.in_pool_order(),
        };
        let chosen = |name: &str| {
            outcome
                .as_ref()
                .is_ok_and(|h| h.pool == name || h.other_pool.as_deref() == Some(name))
        };
        let pools = candidates
            .into_iter()
            .map(|state| PoolVerdict {
                pool: state.name.to_string(),
                verdict: self.verdict(state, request, step, kept.as_ref()),
                chosen: chosen(&state.name),
            })
            .collect();
        Explanation {
            step,
            held,
            keep,
            pools,
            outcome,
        }
    }

    /// Every accepted pool in the §4.4 step 4 order; a pool without
    /// autoAssign where that order would put it.
    fn in_pool_order(&self) -> Vec<&PoolState> {
        let mut states: Vec<&PoolState> = self.pools.values().map(|state| &**state).collect();
        states.sort_by_cached_key(|state| {
            state.auto.clone().unwrap_or_else(|| {
                let pool = &state.pool;
                (
                    !pool.is_pinned(),
                    pool.priority_rank(),
                    Arc::clone(&state.name),
                )
            })
        });
        states
    }

    /// The verdict of one candidate pool.
    fn verdict(
        &self,
        state: &PoolState,
        request: &Request<'_>,
        step: Step,
        kept: Option<&Holding>,
    ) -> Verdict {
        match state.pool.unserved(&request.subject) {
            Some(Unserved::Namespace) => return Verdict::NamespaceNotServed,
            Some(Unserved::ServiceSelector) => return Verdict::ServiceSelectorMismatch,
            None => {}
        }
        if let Some(holding) = kept {
            let ips: Vec<IpAddr> = holding
                .ips
                .iter()
                .copied()
                .filter(|ip| holding.pool_of(*ip) == &*state.name)
                .collect();
            if !ips.is_empty() {
                return Verdict::Holds { ips };
            }
        }
        match step {
            Step::RequestedAddresses => {
                let partial = matches!(request.families, FamilyPolicy::PreferDual { .. });
                match self.check(request, request.addresses, partial, true) {
                    Ok(_) => Verdict::Fits {
                        ips: request.addresses.to_vec(),
                    },
                    Err(error) => Verdict::Refused(error),
                }
            }
            Step::PoolOrder if !state.pool.auto_assign => Verdict::AutoAssignOff,
            _ if state.pool.disabled => Verdict::Disabled,
            Step::RequestedPool | Step::PoolOrder => self.fit_verdict(state, request),
        }
    }

    /// The addresses `state` gives `request` in the first family pass
    /// (§4.3) it can satisfy, or why it satisfies none.
    fn fit_verdict(&self, state: &PoolState, request: &Request<'_>) -> Verdict {
        for families in Self::passes(request.families) {
            if let Some(ips) = self.fit_all(state, families, request) {
                return Verdict::Fits { ips };
            }
        }
        let needed: &[Family] = match request.families {
            FamilyPolicy::Single(family) => &[family][..],
            _ => &[Family::V4, Family::V6],
        };
        // PreferDualStack fails only when neither family fits: name one
        // the pool has.
        let must_have_all = !matches!(request.families, FamilyPolicy::PreferDual { .. });
        if must_have_all {
            if let Some(&family) = needed.iter().find(|f| !state.has_family(**f)) {
                return Verdict::NoFamily { family };
            }
        }
        let full = needed
            .iter()
            .copied()
            .filter(|f| state.has_family(*f))
            .find(|f| self.lowest_fit(state, *f, request).is_none());
        match full {
            Some(family) => self.full_verdict(state, family, request),
            // Each family fits alone but not together: cannot happen, as
            // the families of one pool are independent; say full anyway.
            None => Verdict::Full {
                family: needed.first().copied().unwrap_or(Family::V4),
            },
        }
    }

    /// `state` has no fitting address of `family`: full, or full and
    /// refused where the Service's sharing group stands.
    fn full_verdict(&self, state: &PoolState, family: Family, request: &Request<'_>) -> Verdict {
        let Some(group) = group_of_request(request) else {
            return Verdict::Full { family };
        };
        let mut tried: Vec<IpAddr> = self
            .services
            .iter()
            .filter(|(key, held)| {
                ***key != *request.key
                    && held.pool == state.name
                    && held.group() == Some(group.as_str())
            })
            .flat_map(|(_, held)| held.ips.iter().copied())
            .filter(|ip| Family::of(*ip) == family)
            .collect();
        tried.sort();
        tried.dedup();
        let tried: Vec<(IpAddr, ShareConflict)> = tried
            .into_iter()
            .filter_map(|ip| {
                self.fits(ip, request, Some(&group))
                    .err()
                    .map(|conflict| (ip, conflict))
            })
            .take(TRIED_SHOWN)
            .collect();
        if tried.is_empty() {
            Verdict::Full { family }
        } else {
            Verdict::SharingRefused { family, tried }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::request::{Port, Protocol};
    use crate::spec::{IPAddressPoolSpec, LabelSelectorSpec, ServiceAllocationSpec};
    use crate::Subject;

    static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn spec(addresses: &[&str]) -> IPAddressPoolSpec {
        IPAddressPoolSpec {
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            ..Default::default()
        }
    }

    fn pinned(addresses: &[&str], priority: Option<i64>, namespaces: &[&str]) -> IPAddressPoolSpec {
        IPAddressPoolSpec {
            service_allocation: Some(ServiceAllocationSpec {
                priority,
                namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
                ..Default::default()
            }),
            ..spec(addresses)
        }
    }

    const PORTS: [Port; 1] = [Port {
        protocol: Protocol::Tcp,
        port: 80,
    }];

    fn request<'a>(key: &'a str, labels: &'a BTreeMap<String, String>) -> Request<'a> {
        Request {
            key,
            subject: Subject {
                name: key.split('/').nth(1).unwrap_or(key),
                namespace: key.split('/').next().unwrap(),
                labels,
                namespace_labels: &NO_LABELS,
            },
            families: FamilyPolicy::Single(Family::V4),
            sharing_key: "",
            sharing_rule: crate::SharingRule::MetalLb,
            sharing_namespaces: crate::SharingNamespaces::Any,
            backend_key: "",
            ports: &PORTS,
            pool: None,
            addresses: &[],
        }
    }

    fn verdicts(explanation: &Explanation) -> Vec<(&str, &Verdict, bool)> {
        explanation
            .pools
            .iter()
            .map(|p| (p.pool.as_str(), &p.verdict, p.chosen))
            .collect()
    }

    /// §4.4 step 4: pinned pools by priority then name, then the others
    /// by name; a pool without autoAssign where it would stand.
    #[test]
    fn pools_come_in_the_allocation_order() {
        let mut allocator = Allocator::new();
        allocator.set_pool("b-open", &spec(&["10.0.1.0/32"]));
        allocator.set_pool("a-open", &spec(&["10.0.2.0/32"]));
        allocator.set_pool("z-pinned-1", &pinned(&["10.0.3.0/32"], Some(1), &["ns"]));
        allocator.set_pool("y-pinned", &pinned(&["10.0.4.0/32"], None, &["ns"]));
        allocator.set_pool("x-pinned-2", &pinned(&["10.0.5.0/32"], Some(2), &["other"]));
        let mut off = spec(&["10.0.6.0/32"]);
        off.auto_assign = Some(false);
        allocator.set_pool("c-off", &off);
        let mut selected = pinned(&["10.0.7.0/32"], Some(1), &[]);
        if let Some(allocation) = selected.service_allocation.as_mut() {
            allocation.service_selectors = vec![LabelSelectorSpec {
                match_labels: [("app".to_owned(), "web".to_owned())].into(),
                ..Default::default()
            }];
        }
        allocator.set_pool("w-selector", &selected);
        allocator
            .allocate(&request("ns/first", &NO_LABELS))
            .unwrap();

        let labels = BTreeMap::new();
        let explanation = allocator.explain(&request("ns/web", &labels));
        assert_eq!(explanation.step, Step::PoolOrder);
        let fits = |s: &str| Verdict::Fits { ips: vec![ip(s)] };
        assert_eq!(
            verdicts(&explanation),
            [
                ("w-selector", &Verdict::ServiceSelectorMismatch, false),
                ("z-pinned-1", &Verdict::Full { family: Family::V4 }, false),
                ("x-pinned-2", &Verdict::NamespaceNotServed, false),
                ("y-pinned", &fits("10.0.4.0"), true),
                ("a-open", &fits("10.0.2.0"), false),
                ("b-open", &fits("10.0.1.0"), false),
                ("c-off", &Verdict::AutoAssignOff, false),
            ]
        );
        // The outcome is what allocate gives.
        let outcome = explanation.outcome.unwrap();
        let given = allocator.allocate(&request("ns/web", &labels)).unwrap();
        assert_eq!(outcome, given);
        // Held now: its pool says so, and step 1 keeps it.
        let explanation = allocator.explain(&request("ns/web", &labels));
        assert_eq!(explanation.keep, Some(Ok(())));
        assert!(verdicts(&explanation).contains(&(
            "y-pinned",
            &Verdict::Holds {
                ips: vec![ip("10.0.4.0")]
            },
            true
        )));
    }

    #[test]
    fn a_requested_address_and_a_requested_pool_have_one_candidate() {
        let mut allocator = Allocator::new();
        allocator.set_pool("p", &spec(&["10.0.0.0/31"]));
        let mut off = spec(&["10.0.1.0/32"]);
        off.auto_assign = Some(false);
        allocator.set_pool("off", &off);
        allocator.allocate(&request("ns/a", &NO_LABELS)).unwrap();

        let mut wants = request("ns/b", &NO_LABELS);
        let addresses = [ip("10.0.0.0")];
        wants.addresses = &addresses;
        let explanation = allocator.explain(&wants);
        assert_eq!(explanation.step, Step::RequestedAddresses);
        let [verdict] = explanation.pools.as_slice() else {
            panic!("one candidate: {explanation:?}");
        };
        assert_eq!(verdict.pool, "p");
        assert!(matches!(
            &verdict.verdict,
            Verdict::Refused(AllocError::Taken {
                conflict: ShareConflict::InUse { holder },
                ..
            }) if holder == "ns/a"
        ));
        assert!(explanation.outcome.is_err());

        let mut wants = request("ns/b", &NO_LABELS);
        wants.pool = Some("off");
        let explanation = allocator.explain(&wants);
        assert_eq!(explanation.step, Step::RequestedPool);
        assert_eq!(
            verdicts(&explanation),
            [(
                "off",
                &Verdict::Fits {
                    ips: vec![ip("10.0.1.0")]
                },
                true
            )]
        );
        wants.pool = Some("missing");
        let explanation = allocator.explain(&wants);
        assert!(explanation.pools.is_empty());
        assert_eq!(
            explanation.outcome,
            Err(AllocError::UnknownPool {
                pool: "missing".to_owned()
            })
        );
    }

    #[test]
    fn a_full_pool_names_the_family_and_the_refusing_addresses() {
        let mut allocator = Allocator::new();
        allocator.set_pool("p", &spec(&["10.0.0.0/32"]));
        let mut first = request("ns/a", &NO_LABELS);
        first.sharing_key = "k";
        allocator.allocate(&first).unwrap();
        let mut second = request("ns/b", &NO_LABELS);
        second.sharing_key = "k";
        let explanation = allocator.explain(&second);
        assert_eq!(
            verdicts(&explanation),
            [(
                "p",
                &Verdict::SharingRefused {
                    family: Family::V4,
                    tried: vec![(
                        ip("10.0.0.0"),
                        ShareConflict::Port {
                            holder: "ns/a".to_owned(),
                            port: PORTS[0].clone()
                        }
                    )]
                },
                false
            )]
        );
        let mut v6 = request("ns/c", &NO_LABELS);
        v6.families = FamilyPolicy::Single(Family::V6);
        assert_eq!(
            verdicts(&allocator.explain(&v6)),
            [("p", &Verdict::NoFamily { family: Family::V6 }, false)]
        );
        // Reading changed nothing.
        assert_eq!(allocator.holdings().len(), 1);
        assert!(allocator.check_invariants().is_ok());
    }
}
