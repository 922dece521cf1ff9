//! Address pools: parsing and validating a pool spec on its own, of either
//! kind: an `IPAddressPool` ([`Pool::parse`], docs/allocation.md §3) or a
//! `CiliumLoadBalancerIPPool` ([`Pool::parse_cilium`], docs/cilium.md §2),
//! into one [`Pool`] type. Overlaps between pools, and the one name space
//! both kinds share, are the [`crate::Allocator`]'s business.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;

use ipnet::IpNet;

use crate::addr::{from_int, to_int, Family, Usable};
use crate::count::AddressCount;
use crate::pinned::Fact;
use crate::selector::{Selector, SelectorError, Selectors};
use crate::spec::{IPAddressPoolSpec, LabelSelectorSpec};
use pool_types::cilium::{CiliumBlock, CiliumLoadBalancerIPPoolSpec};

/// The pseudo-label a Cilium `serviceSelector` sees the Service's name in.
pub const SERVICE_NAME_LABEL: &str = "io.kubernetes.service.name";
/// The pseudo-label a Cilium `serviceSelector` sees the Service's namespace in.
pub const SERVICE_NAMESPACE_LABEL: &str = "io.kubernetes.service.namespace";

/// Which kind of object a pool comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PoolKind {
    /// MetalLB's `IPAddressPool` (`metallb.io/v1beta1`).
    IPAddressPool,
    /// Cilium's `CiliumLoadBalancerIPPool` (`cilium.io/v2`, `v2alpha1`).
    CiliumLoadBalancerIPPool,
}

impl PoolKind {
    /// The other kind.
    pub fn other(self) -> PoolKind {
        match self {
            PoolKind::IPAddressPool => PoolKind::CiliumLoadBalancerIPPool,
            PoolKind::CiliumLoadBalancerIPPool => PoolKind::IPAddressPool,
        }
    }

    /// 0 for `IPAddressPool`, 1 for Cilium's: an index into per-kind arrays.
    pub(crate) fn index(self) -> usize {
        match self {
            PoolKind::IPAddressPool => 0,
            PoolKind::CiliumLoadBalancerIPPool => 1,
        }
    }
}

impl fmt::Display for PoolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PoolKind::IPAddressPool => "IPAddressPool",
            PoolKind::CiliumLoadBalancerIPPool => "CiliumLoadBalancerIPPool",
        })
    }
}

/// How an overlap message names the other pool: "pool" among
/// `IPAddressPool`s (the message MetalLB users know), the kind otherwise.
fn pool_word(kind: &PoolKind) -> String {
    match kind {
        PoolKind::IPAddressPool => "pool".to_owned(),
        other => other.to_string(),
    }
}

/// Two overlapping ranges, for Cilium's `cilium.io/PoolConflict` message
/// (docs/cilium.md §2.7): a range of the rejected pool, and the range of
/// the older pool it overlaps (or of its own, for a pool overlapping itself).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub range: AddrRange,
    pub other_range: AddrRange,
    /// The older, accepted pool; the pool itself when it overlaps itself.
    pub other_pool: String,
    pub other_kind: PoolKind,
}

impl Conflict {
    /// Cilium's condition message, byte for byte:
    /// `Pool conflicts since range '10.0.0.0 - 10.0.0.255' overlaps range '10.0.0.0 - 10.0.0.255' from IP Pool 'blue'`.
    pub fn cilium_message(&self) -> String {
        format!(
            "Pool conflicts since range '{} - {}' overlaps range '{} - {}' from IP Pool '{}'",
            self.range.first(),
            self.range.last(),
            self.other_range.first(),
            self.other_range.last(),
            self.other_pool
        )
    }
}

/// One entry of `spec.addresses`, as an inclusive range of one family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddrRange {
    pub family: Family,
    pub(crate) first: u128,
    pub(crate) last: u128,
    /// The first and last addresses are reserved, never handed out (a
    /// Cilium `cidr` block of more than 2 addresses with
    /// `allowFirstLastIPs: No`).
    pub(crate) reserve_ends: bool,
}

impl AddrRange {
    /// The lowest address.
    pub fn first(&self) -> IpAddr {
        from_int(self.family, self.first)
    }

    /// The highest address.
    pub fn last(&self) -> IpAddr {
        from_int(self.family, self.last)
    }

    pub(crate) fn contains(&self, family: Family, value: u128) -> bool {
        self.family == family && self.first <= value && value <= self.last
    }

    /// Whether `value` (of the range's family) is one of its reserved ends.
    pub(crate) fn reserves(&self, value: u128) -> bool {
        self.reserve_ends && (value == self.first || value == self.last)
    }

    /// Whether the first and last addresses are reserved.
    pub fn reserves_ends(&self) -> bool {
        self.reserve_ends
    }

    fn new(family: Family, first: u128, last: u128) -> Self {
        AddrRange {
            family,
            first,
            last,
            reserve_ends: false,
        }
    }
}

impl fmt::Display for AddrRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first(), self.last())
    }
}

/// Why a pool is rejected. The message names the offending entry.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// `spec.addresses` is empty.
    #[error("spec.addresses is empty")]
    NoAddresses,
    /// An entry that is neither a prefix, a range nor an address.
    #[error("address {entry:?}: {reason}")]
    BadAddress { entry: String, reason: String },
    /// A range whose first address is after its last.
    #[error("range {entry}: first address is after the last")]
    Reversed { entry: String },
    /// A range from one family to the other.
    #[error("range {entry}: first and last are of different IP families")]
    MixedRange { entry: String },
    /// Two entries of the same pool overlap.
    #[error("addresses {entry:?} overlap {other:?} in the same pool")]
    SelfOverlap { entry: String, other: String },
    /// An entry overlaps a pool accepted before this one.
    #[error("addresses {entry:?} overlap {other_entry:?} of {} {other_pool:?}", pool_word(.other_kind))]
    Overlap {
        entry: String,
        other_pool: String,
        other_kind: PoolKind,
        other_entry: String,
    },
    /// An older pool of the other kind has the same name: both kinds share
    /// one name space (docs/allocation.md §3.3).
    #[error("name {other_pool:?} is taken by the older {other_kind} {other_pool:?}")]
    NameTaken {
        other_pool: String,
        other_kind: PoolKind,
    },
    /// A Cilium block's `cidr` that is not a prefix.
    #[error("{field}[{index}]: cidr {cidr:?} is not a valid prefix")]
    BadCidr {
        field: &'static str,
        index: usize,
        cidr: String,
    },
    /// A Cilium block with neither `cidr` nor `start`.
    #[error("{field}[{index}]: neither cidr nor start is set")]
    NoStart { field: &'static str, index: usize },
    /// A Cilium block's `start` or `stop` that is not an address.
    #[error("{field}[{index}]: {which} {value:?} is not an IP address")]
    BadBlockAddress {
        field: &'static str,
        index: usize,
        which: &'static str,
        value: String,
    },
    /// A Cilium block whose `start` is after its `stop`.
    #[error("{field}[{index}]: range {range}: first address is after the last")]
    BlockReversed {
        field: &'static str,
        index: usize,
        range: String,
    },
    /// A Cilium block from one family to the other.
    #[error("{field}[{index}]: range {range}: first and last are of different IP families")]
    BlockMixed {
        field: &'static str,
        index: usize,
        range: String,
    },
    /// Two blocks of one Cilium pool overlap.
    #[error("{block} ({}) overlaps {other_block} ({}) in the same pool", ranges.0, ranges.1)]
    BlockOverlap {
        block: String,
        other_block: String,
        /// The later block's range, the earlier block's.
        ranges: Box<(AddrRange, AddrRange)>,
    },
    /// `allowFirstLastIPs` other than "Yes" and "No".
    #[error("allowFirstLastIPs {value:?} is neither \"Yes\" nor \"No\"")]
    BadAllowFirstLast { value: String },
    /// A malformed Cilium `serviceSelector`.
    #[error("serviceSelector: {source}")]
    BadServiceSelector {
        #[source]
        source: SelectorError,
    },
    /// A malformed selector.
    #[error("serviceAllocation.{field}[{index}]: {source}")]
    BadSelector {
        field: &'static str,
        index: usize,
        #[source]
        source: SelectorError,
    },
    /// The same selector twice.
    #[error("serviceAllocation.{field}[{index}] duplicates an earlier selector")]
    DuplicateSelector { field: &'static str, index: usize },
    /// The same namespace twice.
    #[error("serviceAllocation.namespaces lists {namespace:?} twice")]
    DuplicateNamespace { namespace: String },
    /// A negative priority.
    #[error("serviceAllocation.priority {priority} is negative")]
    NegativePriority { priority: i64 },
}

/// The Services a pinned pool serves (`spec.serviceAllocation`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceAllocation {
    /// 1 is the highest; `None` (0 or unset) the lowest.
    pub priority: Option<u64>,
    /// Sorted, each once: most pools list one namespace, and a slice of
    /// one costs that one (a `BTreeSet` allocates a whole node).
    namespaces: Box<[String]>,
    namespace_selectors: Selectors,
    service_selectors: Selectors,
}

/// What a pool needs to know about a Service to decide whether it serves it.
#[derive(Clone, Copy, Debug)]
pub struct Subject<'a> {
    /// The Service's name (`metadata.name`): Cilium's pseudo-label
    /// `io.kubernetes.service.name`.
    pub name: &'a str,
    pub namespace: &'a str,
    /// The Service's labels.
    pub labels: &'a BTreeMap<String, String>,
    /// Its Namespace's labels (empty when the Namespace is unknown).
    pub namespace_labels: &'a BTreeMap<String, String>,
}

/// What a pinned pool requires of a Service, its priority aside: pinned
/// pools with equal rules serve the same Services, so a Service that finds
/// them all full counts them as one (docs/allocation.md §4.9).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Rules {
    allocation: Option<ServiceAllocation>,
    selector: Option<Selector>,
    /// A hash of the two, the same in every run: what a waiting Service
    /// waits on, and what the rules hash by in a map.
    fingerprint: u64,
}

impl Rules {
    fn new(allocation: Option<ServiceAllocation>, selector: Option<Selector>) -> Self {
        let mut hasher = std::hash::DefaultHasher::new();
        (&allocation, &selector).hash(&mut hasher);
        Rules {
            allocation,
            selector,
            fingerprint: hasher.finish(),
        }
    }

    pub(crate) fn serves(&self, subject: &Subject<'_>) -> bool {
        unserved(self.selector.as_ref(), self.allocation.as_ref(), subject).is_none()
    }

    pub(crate) fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Each thing of a Service that [`Rules::serves`] reads: the field,
    /// the label key (empty for the name and the namespace), and the value
    /// compared with, or `None` when only its presence counts.
    pub(crate) fn reads<'a>(
        &'a self,
        mut each: impl FnMut(SubjectField, &'a str, Option<&'a str>),
    ) {
        // As `unserved`: a Cilium selector alone, with its pseudo-labels.
        if let Some(selector) = &self.selector {
            selector.reads(|key, value| match key {
                SERVICE_NAME_LABEL => each(SubjectField::Name, "", value),
                SERVICE_NAMESPACE_LABEL => each(SubjectField::Namespace, "", value),
                _ => each(SubjectField::Label, key, value),
            });
            return;
        }
        let Some(allocation) = &self.allocation else {
            return;
        };
        for namespace in &allocation.namespaces {
            each(SubjectField::Namespace, "", Some(namespace));
        }
        for selector in &allocation.namespace_selectors {
            selector.reads(|key, value| each(SubjectField::NamespaceLabel, key, value));
        }
        for selector in &allocation.service_selectors {
            selector.reads(|key, value| each(SubjectField::Label, key, value));
        }
    }
}

/// What of a [`Subject`] a rule may read (see [`Rules::reads`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum SubjectField {
    Name,
    Namespace,
    Label,
    NamespaceLabel,
}

/// Equal rules have equal fingerprints: hashing that one number is enough.
impl Hash for Rules {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.fingerprint);
    }
}

/// The first rule of a pool (its Cilium `selector` or its MetalLB
/// `allocation`) that leaves `subject` out, if any.
fn unserved(
    selector: Option<&Selector>,
    allocation: Option<&ServiceAllocation>,
    subject: &Subject<'_>,
) -> Option<Unserved> {
    if let Some(selector) = selector {
        // Cilium's extended labels: the pseudo-labels overwrite real
        // labels of the same key (docs/cilium.md §2.4).
        let matched = selector.matches_with(|key| match key {
            SERVICE_NAME_LABEL => Some(subject.name),
            SERVICE_NAMESPACE_LABEL => Some(subject.namespace),
            _ => subject.labels.get(key).map(String::as_str),
        });
        return (!matched).then_some(Unserved::ServiceSelector);
    }
    allocation.and_then(|allocation| allocation.unserved(subject))
}

/// Which rule of a pinned pool leaves a Service out (for `explain`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unserved {
    /// Neither `namespaces` nor `namespaceSelectors` covers its Namespace.
    Namespace,
    /// No `serviceSelectors` entry matches its labels (MetalLB), or the
    /// `serviceSelector` does not match its labels and pseudo-labels
    /// (Cilium).
    ServiceSelector,
}

impl ServiceAllocation {
    /// The first rule that leaves `subject` out, if any.
    fn unserved(&self, subject: &Subject<'_>) -> Option<Unserved> {
        let namespace_ok = self.admits_namespace(subject.namespace, subject.namespace_labels);
        let service_ok =
            self.service_selectors.is_empty() || self.service_selectors.any_matches(subject.labels);
        match (namespace_ok, service_ok) {
            (false, _) => Some(Unserved::Namespace),
            (true, false) => Some(Unserved::ServiceSelector),
            (true, true) => None,
        }
    }
}

impl ServiceAllocation {
    /// Whether the namespace rule (`namespaces`, `namespaceSelectors`)
    /// lets in the Services of `namespace`, whose Namespace has `labels`.
    pub(crate) fn admits_namespace(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> bool {
        let has_namespace_rule =
            !self.namespaces.is_empty() || !self.namespace_selectors.is_empty();
        !has_namespace_rule
            || self
                .namespaces
                .binary_search_by(|listed| listed.as_str().cmp(namespace))
                .is_ok()
            || self.namespace_selectors.any_matches(labels)
    }

    pub(crate) fn namespace_selectors(&self) -> &[Selector] {
        &self.namespace_selectors
    }

    /// Facts of which a Service must have one to pass the rules (see
    /// [`Pool::guard`]). Both the namespace and the Service rule must pass,
    /// so either one's facts will do: the fewer the better.
    fn guard(&self) -> Option<BTreeSet<Fact>> {
        let has_namespace_rule =
            !self.namespaces.is_empty() || !self.namespace_selectors.is_empty();
        let namespace = has_namespace_rule
            .then(|| {
                let listed = self.namespaces.iter().cloned().map(Fact::Namespace);
                // No namespace selector: the listed namespaces alone.
                let labelled = if self.namespace_selectors.is_empty() {
                    Vec::new()
                } else {
                    selectors_facts(&self.namespace_selectors, |k, v| {
                        Fact::NamespaceLabel(k.to_owned(), v.to_owned())
                    })?
                };
                Some(listed.chain(labelled).collect::<BTreeSet<Fact>>())
            })
            .flatten();
        let service = selectors_facts(&self.service_selectors, |k, v| {
            Fact::Label(k.to_owned(), v.to_owned())
        })
        .map(BTreeSet::from_iter);
        match (namespace, service) {
            (Some(namespace), Some(service)) => Some(both_rules(namespace, service)),
            (namespace, service) => namespace.or(service),
        }
    }
}

/// The most facts a pool requiring both a namespace and a label is
/// indexed under as pairs: beyond, it is indexed under one of the two.
const MOST_PAIRED_FACTS: usize = 64;

/// The facts of which a Service passing both a namespace rule (`namespace`)
/// and a label rule (`service`) has one. Listed namespaces and required
/// labels pair up, so a Service visits the pool only with both (one lookup
/// per label of the Service); otherwise, or when the pairs would be too
/// many, the rule with fewer facts (the namespace on a tie).
fn both_rules(namespace: BTreeSet<Fact>, service: BTreeSet<Fact>) -> BTreeSet<Fact> {
    let namespaces: Option<Vec<&String>> = namespace
        .iter()
        .map(|fact| match fact {
            Fact::Namespace(n) => Some(n),
            _ => None,
        })
        .collect();
    let labels: Option<Vec<(&String, &String)>> = service
        .iter()
        .map(|fact| match fact {
            Fact::Label(k, v) => Some((k, v)),
            _ => None,
        })
        .collect();
    if let (Some(namespaces), Some(labels)) = (namespaces, labels) {
        if namespaces.len().saturating_mul(labels.len()) <= MOST_PAIRED_FACTS {
            return namespaces
                .iter()
                .flat_map(|n| {
                    labels.iter().map(|(k, v)| {
                        Fact::NamespacedLabel((*n).clone(), (*k).clone(), (*v).clone())
                    })
                })
                .collect();
        }
    }
    if service.len() < namespace.len() {
        service
    } else {
        namespace
    }
}

/// The facts of which a Service must have one to match any of `selectors`
/// (they are ORed): each selector's required pairs, as `fact` makes them.
/// `None` when there is no selector or one requires no pair.
fn selectors_facts(selectors: &[Selector], fact: impl Fn(&str, &str) -> Fact) -> Option<Vec<Fact>> {
    if selectors.is_empty() {
        return None;
    }
    let mut facts = Vec::new();
    for selector in selectors {
        let pairs = selector.required_pairs(|_| Some(0))?;
        facts.extend(pairs.into_iter().map(|(k, v)| fact(k, v)));
    }
    Some(facts)
}

/// [`Pool::guard`] of a Cilium pool's `serviceSelector`, whose
/// pseudo-labels are the Service's namespace and name.
fn cilium_guard(selector: &Selector) -> Option<BTreeSet<Fact>> {
    let is_pseudo = |key: &str| key == SERVICE_NAMESPACE_LABEL || key == SERVICE_NAME_LABEL;
    let facts = |pairs: Vec<(&str, &str)>| -> BTreeSet<Fact> {
        let fact = |(key, value): (&str, &str)| match key {
            SERVICE_NAME_LABEL => Fact::Name(value.to_owned()),
            SERVICE_NAMESPACE_LABEL => Fact::Namespace(value.to_owned()),
            _ => Fact::Label(key.to_owned(), value.to_owned()),
        };
        pairs.into_iter().map(fact).collect()
    };
    // A namespace or name is likely the most telling requirement.
    let best = facts(selector.required_pairs(|key| Some(u8::from(!is_pseudo(key))))?);
    if best.iter().any(|fact| matches!(fact, Fact::Name(_))) {
        return Some(best);
    }
    let namespace = selector.required_pairs(|key| (key == SERVICE_NAMESPACE_LABEL).then_some(0));
    let labels = selector.required_pairs(|key| (!is_pseudo(key)).then_some(0));
    match (namespace, labels) {
        (Some(namespace), Some(labels)) => Some(both_rules(facts(namespace), facts(labels))),
        _ => Some(best),
    }
}

/// A validated pool of either kind (docs/cilium.md §2.6).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    pub name: String,
    pub kind: PoolKind,
    /// `spec.addresses` in order; for Cilium, the legacy `spec.cidrs` then
    /// `spec.blocks`.
    pub ranges: Vec<AddrRange>,
    /// Always true for Cilium pools.
    pub auto_assign: bool,
    /// Always false for Cilium pools.
    pub avoid_buggy_ips: bool,
    /// `Some` for a pinned `IPAddressPool`.
    pub allocation: Option<ServiceAllocation>,
    /// Cilium's `serviceSelector`: `Some` (even for `{}`) pins the pool.
    pub selector: Option<Selector>,
    /// Cilium's `spec.disabled`: the pool keeps its holders but gives no
    /// new address.
    pub disabled: bool,
}

impl Pool {
    /// Parses and validates `spec` on its own (overlaps with other pools are
    /// checked by the allocator).
    pub fn parse(name: &str, spec: &IPAddressPoolSpec) -> Result<Pool, PoolError> {
        if spec.addresses.is_empty() {
            return Err(PoolError::NoAddresses);
        }
        let mut ranges: Vec<(AddrRange, &str)> = Vec::with_capacity(spec.addresses.len());
        for entry in &spec.addresses {
            ranges.push((parse_entry(entry)?, entry));
        }
        if let Some((later, earlier)) = first_self_overlap(&ranges) {
            let text = |i: usize| ranges.get(i).map(|(_, t)| t.trim().to_owned());
            return Err(PoolError::SelfOverlap {
                entry: text(later).unwrap_or_default(),
                other: text(earlier).unwrap_or_default(),
            });
        }
        let allocation = spec
            .service_allocation
            .as_ref()
            .map(parse_allocation)
            .transpose()?;
        Ok(Pool {
            name: name.to_owned(),
            kind: PoolKind::IPAddressPool,
            ranges: ranges.into_iter().map(|(range, _)| range).collect(),
            auto_assign: spec.auto_assign.unwrap_or(true),
            avoid_buggy_ips: spec.avoid_buggy_ips.unwrap_or(false),
            allocation,
            selector: None,
            disabled: false,
        })
    }

    /// Parses and validates a `CiliumLoadBalancerIPPool` spec on its own
    /// (docs/cilium.md §2.2–2.5): blocks (legacy `cidrs` first), the
    /// reserved ends of `allowFirstLastIPs: No`, `serviceSelector` and
    /// `disabled`. A pool without blocks is valid and serves nothing.
    pub fn parse_cilium(
        name: &str,
        spec: &CiliumLoadBalancerIPPoolSpec,
    ) -> Result<Pool, PoolError> {
        let mut blocks: Vec<(AddrRange, String)> =
            Vec::with_capacity(spec.cidrs.len() + spec.blocks.len());
        let listed = [("cidrs", &spec.cidrs), ("blocks", &spec.blocks)];
        for (field, list) in listed {
            for (index, block) in list.iter().enumerate() {
                blocks.push((
                    parse_block(field, index, block)?,
                    format!("{field}[{index}]"),
                ));
            }
        }
        let shown: Vec<(AddrRange, &str)> = blocks.iter().map(|(r, n)| (*r, n.as_str())).collect();
        if let Some((later, earlier)) = first_self_overlap(&shown) {
            if let (Some((range, block)), Some((other_range, other_block))) =
                (blocks.get(later), blocks.get(earlier))
            {
                return Err(PoolError::BlockOverlap {
                    block: block.clone(),
                    other_block: other_block.clone(),
                    ranges: Box::new((*range, *other_range)),
                });
            }
        }
        let reserve = match spec.allow_first_last_ips.as_deref() {
            None | Some("Yes") => false,
            Some("No") => true,
            Some(other) => {
                return Err(PoolError::BadAllowFirstLast {
                    value: other.to_owned(),
                })
            }
        };
        let selector = spec
            .service_selector
            .as_ref()
            .map(Selector::parse)
            .transpose()
            .map_err(|source| PoolError::BadServiceSelector { source })?;
        let ranges = blocks
            .into_iter()
            .map(|(mut range, _)| {
                // Only `cidr` blocks carry the flag so far (parse_block);
                // "more than two addresses" is decided here.
                range.reserve_ends = reserve && range.reserve_ends && range.last - range.first >= 2;
                range
            })
            .collect();
        Ok(Pool {
            name: name.to_owned(),
            kind: PoolKind::CiliumLoadBalancerIPPool,
            ranges,
            auto_assign: true,
            avoid_buggy_ips: false,
            allocation: None,
            selector,
            disabled: spec.disabled,
        })
    }

    /// Whether the pool may give addresses to `subject` (autoAssign and
    /// `disabled` aside).
    pub fn serves(&self, subject: &Subject<'_>) -> bool {
        self.unserved(subject).is_none()
    }

    /// Why the pool may not give addresses to `subject`, if it may not.
    pub fn unserved(&self, subject: &Subject<'_>) -> Option<Unserved> {
        unserved(self.selector.as_ref(), self.allocation.as_ref(), subject)
    }

    /// What it requires of a Service, if it is pinned.
    pub(crate) fn rules(&self) -> Option<Rules> {
        self.is_pinned().then(|| {
            let allocation = self.allocation.clone().map(|allocation| ServiceAllocation {
                priority: None,
                ..allocation
            });
            Rules::new(allocation, self.selector.clone())
        })
    }

    /// What a pinned pool requires: facts of which a Service it serves has
    /// at least one (docs/allocation.md §4.9), or `None` when its rules
    /// name none (only `NotIn`, `Exists`, `DoesNotExist`, an empty
    /// selector, or no rule). Necessary, not sufficient: the pools found by
    /// it are still asked [`Pool::serves`]. Cilium's pseudo-labels are the
    /// Service's namespace and name, whatever real labels of their keys say.
    pub(crate) fn guard(&self) -> Option<BTreeSet<Fact>> {
        if let Some(selector) = &self.selector {
            return cilium_guard(selector);
        }
        self.allocation.as_ref()?.guard()
    }

    /// Which addresses of `family` may be handed out.
    pub(crate) fn usable(&self, family: Family) -> Usable {
        Usable {
            family,
            avoid_buggy: self.avoid_buggy_ips,
        }
    }

    /// Whether `ip` lies in the pool and may be handed out (not avoided,
    /// not a reserved end).
    pub fn allows(&self, ip: IpAddr) -> bool {
        let (family, value) = to_int(ip);
        self.usable(family).is_usable(value)
            && self
                .ranges
                .iter()
                .any(|r| r.contains(family, value) && !r.reserves(value))
    }

    /// Whether `ip` is a reserved end of one of the pool's ranges.
    pub fn reserves(&self, ip: IpAddr) -> bool {
        let (family, value) = to_int(ip);
        self.ranges
            .iter()
            .any(|r| r.contains(family, value) && r.reserves(value))
    }

    /// How many addresses of `family` are reserved ends.
    pub fn reserved(&self, family: Family) -> u128 {
        let ranges = self.ranges.iter();
        let reserving = ranges.filter(|r| r.family == family && r.reserve_ends);
        2 * reserving.count() as u128
    }

    /// Addresses of `family`: after avoidBuggyIPs, reserved ends included
    /// (Cilium's `IPsTotal` counts them).
    pub fn total(&self, family: Family) -> AddressCount {
        let usable = self.usable(family);
        self.ranges
            .iter()
            .filter(|r| r.family == family)
            .map(|r| usable.count(r.first, r.last))
            .fold(AddressCount::new(0), AddressCount::plus)
    }

    /// Whether the pool is pinned: `serviceAllocation` (MetalLB) or
    /// `serviceSelector` (Cilium) present.
    pub fn is_pinned(&self) -> bool {
        self.allocation.is_some() || self.selector.is_some()
    }

    /// Sort key of pinned pools: priority 1 first, unset last.
    pub(crate) fn priority_rank(&self) -> u64 {
        self.allocation
            .as_ref()
            .and_then(|a| a.priority)
            .unwrap_or(u64::MAX)
    }
}

/// Two entries of one pool that overlap, as indexes (the later, the earlier
/// in spec order): a sweep over the entries sorted by first address,
/// O(n log n), so a pool of many single addresses is no trap.
fn first_self_overlap(ranges: &[(AddrRange, &str)]) -> Option<(usize, usize)> {
    let mut order: Vec<usize> = (0..ranges.len()).collect();
    order.sort_by_key(|&i| ranges.get(i).map(|(r, _)| (r.family, r.first)));
    // The entry reaching furthest so far in the current family.
    let mut reach: Option<(Family, u128, usize)> = None;
    let mut found: Option<(usize, usize)> = None;
    for &i in &order {
        let Some((range, _)) = ranges.get(i) else {
            continue;
        };
        match reach.filter(|(family, _, _)| *family == range.family) {
            Some((_, last, j)) => {
                if range.first <= last {
                    let pair = (i.max(j), i.min(j));
                    if found.is_none_or(|f| pair < f) {
                        found = Some(pair);
                    }
                }
                if range.last > last {
                    reach = Some((range.family, range.last, i));
                }
            }
            None => reach = Some((range.family, range.last, i)),
        }
    }
    found
}

fn parse_ip(entry: &str, text: &str) -> Result<IpAddr, PoolError> {
    text.parse::<IpAddr>().map_err(|_| PoolError::BadAddress {
        entry: entry.to_owned(),
        reason: format!("{text:?} is not an IP address"),
    })
}

/// Parses one `spec.addresses` entry: a prefix, a `first-last` range or one
/// address.
pub fn parse_entry(entry: &str) -> Result<AddrRange, PoolError> {
    let trimmed = entry.trim();
    if trimmed.is_empty() {
        return Err(PoolError::BadAddress {
            entry: entry.to_owned(),
            reason: "empty entry".to_owned(),
        });
    }
    if trimmed.contains('/') {
        let net: IpNet = trimmed.parse().map_err(|_| PoolError::BadAddress {
            entry: trimmed.to_owned(),
            reason: "not a valid prefix".to_owned(),
        })?;
        // Host bits set (10.0.0.5/24) mean the network, as in MetalLB.
        let net = net.trunc();
        let (family, first) = to_int(net.network());
        let (_, last) = to_int(net.broadcast());
        return Ok(AddrRange::new(family, first, last));
    }
    if let Some((low, high)) = trimmed.split_once('-') {
        let first_ip = parse_ip(trimmed, low.trim())?;
        let last_ip = parse_ip(trimmed, high.trim())?;
        let (family, first) = to_int(first_ip);
        let (last_family, last) = to_int(last_ip);
        let shown = format!("{first_ip}-{last_ip}");
        if family != last_family {
            return Err(PoolError::MixedRange { entry: shown });
        }
        if first > last {
            return Err(PoolError::Reversed { entry: shown });
        }
        return Ok(AddrRange::new(family, first, last));
    }
    let (family, value) = to_int(parse_ip(trimmed, trimmed)?);
    Ok(AddrRange::new(family, value, value))
}

/// Parses one Cilium block (docs/cilium.md §2.2): a non-empty `cidr` (masked;
/// `start`/`stop` then ignored), else `start` with `stop` (empty: the single
/// address `start`). A `cidr` block comes back with `reserve_ends` set, for
/// `allowFirstLastIPs` to keep or clear.
fn parse_block(
    field: &'static str,
    index: usize,
    block: &CiliumBlock,
) -> Result<AddrRange, PoolError> {
    fn text(value: &Option<String>) -> Option<&str> {
        value.as_deref().filter(|v| !v.is_empty())
    }
    if let Some(cidr) = text(&block.cidr) {
        let net: IpNet = cidr.parse().map_err(|_| PoolError::BadCidr {
            field,
            index,
            cidr: cidr.to_owned(),
        })?;
        let net = net.trunc();
        let (family, first) = to_int(net.network());
        let (_, last) = to_int(net.broadcast());
        let mut range = AddrRange::new(family, first, last);
        range.reserve_ends = true;
        return Ok(range);
    }
    let Some(start) = text(&block.start) else {
        return Err(PoolError::NoStart { field, index });
    };
    let address = |which: &'static str, value: &str| {
        value
            .parse::<IpAddr>()
            .map_err(|_| PoolError::BadBlockAddress {
                field,
                index,
                which,
                value: value.to_owned(),
            })
    };
    let first_ip = address("start", start)?;
    let last_ip = match text(&block.stop) {
        Some(stop) => address("stop", stop)?,
        None => first_ip,
    };
    let (family, first) = to_int(first_ip);
    let (last_family, last) = to_int(last_ip);
    let range = format!("{first_ip}-{last_ip}");
    if family != last_family {
        return Err(PoolError::BlockMixed {
            field,
            index,
            range,
        });
    }
    if first > last {
        return Err(PoolError::BlockReversed {
            field,
            index,
            range,
        });
    }
    Ok(AddrRange::new(family, first, last))
}

fn parse_selectors(
    field: &'static str,
    specs: &[LabelSelectorSpec],
) -> Result<Selectors, PoolError> {
    let mut selectors: Vec<Selector> = Vec::with_capacity(specs.len());
    let mut seen: BTreeSet<Selector> = BTreeSet::new();
    for (index, spec) in specs.iter().enumerate() {
        let selector = Selector::parse(spec).map_err(|source| PoolError::BadSelector {
            field,
            index,
            source,
        })?;
        // A set, not a search of the list: one line may hold thousands.
        if !seen.insert(selector.clone()) {
            return Err(PoolError::DuplicateSelector { field, index });
        }
        selectors.push(selector);
    }
    Ok(Selectors::new(selectors))
}

fn parse_allocation(
    spec: &crate::spec::ServiceAllocationSpec,
) -> Result<ServiceAllocation, PoolError> {
    let priority = match spec.priority {
        Some(p) if p < 0 => return Err(PoolError::NegativePriority { priority: p }),
        Some(0) | None => None,
        Some(p) => u64::try_from(p).ok(),
    };
    let mut namespaces = BTreeSet::new();
    for namespace in &spec.namespaces {
        if !namespaces.insert(namespace.clone()) {
            return Err(PoolError::DuplicateNamespace {
                namespace: namespace.clone(),
            });
        }
    }
    Ok(ServiceAllocation {
        priority,
        namespaces: namespaces.into_iter().collect(),
        namespace_selectors: parse_selectors("namespaceSelectors", &spec.namespace_selectors)?,
        service_selectors: parse_selectors("serviceSelectors", &spec.service_selectors)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{LabelSelectorRequirementSpec, ServiceAllocationSpec};

    fn spec(addresses: &[&str]) -> IPAddressPoolSpec {
        IPAddressPoolSpec {
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            ..Default::default()
        }
    }

    fn err(addresses: &[&str]) -> String {
        Pool::parse("p", &spec(addresses)).unwrap_err().to_string()
    }

    #[test]
    fn entries_of_every_form() {
        let pool = Pool::parse(
            "p",
            &spec(&[
                "10.0.0.5/24",
                "10.1.0.1 - 10.1.0.3",
                "10.2.0.9",
                "fd00::/64",
                "fd01::1-fd01::2",
            ]),
        )
        .unwrap();
        let shown: Vec<String> = pool.ranges.iter().map(|r| r.to_string()).collect();
        assert_eq!(
            shown,
            [
                "10.0.0.0-10.0.0.255",
                "10.1.0.1-10.1.0.3",
                "10.2.0.9-10.2.0.9",
                "fd00::-fd00::ffff:ffff:ffff:ffff",
                "fd01::1-fd01::2"
            ]
        );
        assert_eq!(pool.total(Family::V4).get(), Some(256 + 3 + 1));
        assert_eq!(pool.total(Family::V6).get(), Some((1u128 << 64) + 2));
        assert!(pool.auto_assign);
        assert!(!pool.avoid_buggy_ips);
    }

    #[test]
    fn host_and_all_space_prefixes() {
        let pool = Pool::parse("p", &spec(&["10.0.0.7/32", "fd00::7/128"])).unwrap();
        assert_eq!(pool.total(Family::V6).get(), Some(1));
        assert_eq!(pool.total(Family::V4).get(), Some(1));
        // ::/0 overlaps fd00::7/128.
        assert!(matches!(
            Pool::parse("p", &spec(&["fd00::7/128", "::/0"])),
            Err(PoolError::SelfOverlap { .. })
        ));
        let all = Pool::parse("p", &spec(&["::/0"])).unwrap();
        assert_eq!(all.total(Family::V6), AddressCount::ALL_IPV6);
    }

    #[test]
    fn rejections_name_the_entry() {
        assert_eq!(err(&[]), "spec.addresses is empty");
        assert_eq!(
            err(&["10.0.0.5-10.0.0.1"]),
            "range 10.0.0.5-10.0.0.1: first address is after the last"
        );
        assert_eq!(
            err(&["10.0.0.0/33"]),
            "address \"10.0.0.0/33\": not a valid prefix"
        );
        assert_eq!(
            err(&["10.0.0.300"]),
            "address \"10.0.0.300\": \"10.0.0.300\" is not an IP address"
        );
        assert_eq!(
            err(&["fe80::1%eth0"]),
            "address \"fe80::1%eth0\": \"fe80::1%eth0\" is not an IP address"
        );
        assert_eq!(
            err(&["10.0.0.1:80"]),
            "address \"10.0.0.1:80\": \"10.0.0.1:80\" is not an IP address"
        );
        assert_eq!(
            err(&["10.0.0.1-fd00::1"]),
            "range 10.0.0.1-fd00::1: first and last are of different IP families"
        );
        assert_eq!(err(&[" "]), "address \" \": empty entry");
        assert_eq!(
            err(&["10.0.0.0/24", "10.0.0.9"]),
            "addresses \"10.0.0.9\" overlap \"10.0.0.0/24\" in the same pool"
        );
    }

    #[test]
    fn many_entries_and_overlaps_found_by_the_sweep() {
        let many: Vec<String> = (0..20_000u32)
            .map(|i| std::net::Ipv4Addr::from(0x0a00_0000 + i * 2).to_string())
            .collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        let pool = Pool::parse("p", &spec(&refs)).unwrap();
        assert_eq!(pool.total(Family::V4).get(), Some(20_000));
        let mut with_overlap = refs.clone();
        with_overlap.push("10.0.0.0/30");
        assert!(matches!(
            Pool::parse("p", &spec(&with_overlap)),
            Err(PoolError::SelfOverlap { .. })
        ));
        // Nested and same-start entries, and families kept apart.
        assert_eq!(
            err(&["10.0.0.0/24", "fd00::/120", "10.1.0.0/24", "10.0.0.0/25"]),
            "addresses \"10.0.0.0/25\" overlap \"10.0.0.0/24\" in the same pool"
        );
        assert!(Pool::parse("p", &spec(&["10.0.0.0/24", "::a00:0/120"])).is_ok());
    }

    #[test]
    fn avoid_buggy_ips_in_a_slash_23() {
        let mut s = spec(&["10.0.0.0/23"]);
        s.avoid_buggy_ips = Some(true);
        let pool = Pool::parse("p", &s).unwrap();
        assert_eq!(pool.total(Family::V4).get(), Some(508));
        assert!(!pool.allows("10.0.0.255".parse().unwrap()));
        assert!(!pool.allows("10.0.1.0".parse().unwrap()));
        assert!(pool.allows("10.0.1.1".parse().unwrap()));
        assert!(!pool.allows("10.0.2.1".parse().unwrap()));
    }

    fn selector(key: &str, operator: &str, values: &[&str]) -> LabelSelectorSpec {
        LabelSelectorSpec {
            match_labels: BTreeMap::new(),
            match_expressions: vec![LabelSelectorRequirementSpec {
                key: key.into(),
                operator: operator.into(),
                values: values.iter().map(|v| v.to_string()).collect(),
            }],
        }
    }

    #[test]
    fn service_allocation_rules() {
        let mut s = spec(&["10.0.0.0/24"]);
        s.service_allocation = Some(ServiceAllocationSpec {
            priority: Some(5),
            namespaces: vec!["prod".into()],
            namespace_selectors: vec![selector("env", "In", &["staging"])],
            service_selectors: vec![selector("app", "Exists", &[])],
        });
        let pool = Pool::parse("p", &s).unwrap();
        assert_eq!(pool.priority_rank(), 5);
        let empty = BTreeMap::new();
        let app: BTreeMap<String, String> = [("app".to_string(), "x".to_string())].into();
        let staging: BTreeMap<String, String> = [("env".to_string(), "staging".to_string())].into();
        let subject = |namespace, labels, namespace_labels| Subject {
            name: "s",
            namespace,
            labels,
            namespace_labels,
        };
        assert!(pool.serves(&subject("prod", &app, &empty)));
        assert!(!pool.serves(&subject("prod", &empty, &empty)));
        assert!(pool.serves(&subject("dev", &app, &staging)));
        assert!(!pool.serves(&subject("dev", &app, &empty)));

        // serviceAllocation with nothing serves everything.
        let mut open = spec(&["10.0.0.0/24"]);
        open.service_allocation = Some(ServiceAllocationSpec::default());
        let open = Pool::parse("p", &open).unwrap();
        assert!(open.is_pinned());
        assert_eq!(open.priority_rank(), u64::MAX);
        assert!(open.serves(&subject("any", &empty, &empty)));
    }

    /// What each kind of rule makes a pool require of a Service.
    #[test]
    fn guards_name_what_a_served_service_must_have() {
        let labels = |pairs: &[(&str, &str)]| LabelSelectorSpec {
            match_labels: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            match_expressions: vec![],
        };
        let metallb = |allocation: ServiceAllocationSpec| {
            let mut s = spec(&["10.0.0.0/24"]);
            s.service_allocation = Some(allocation);
            let guard = Pool::parse("p", &s).unwrap().guard();
            guard.map(|facts| format!("{facts:?}"))
        };
        let guard = |allocation| metallb(allocation).unwrap_or_else(|| "none".into());
        assert_eq!(
            guard(ServiceAllocationSpec {
                namespaces: vec!["b".into(), "a".into()],
                ..Default::default()
            }),
            r#"{Namespace("a"), Namespace("b")}"#
        );
        // Namespaces and namespace selectors are ORed: all their facts.
        assert_eq!(
            guard(ServiceAllocationSpec {
                namespaces: vec!["a".into()],
                namespace_selectors: vec![labels(&[("tier", "gold")])],
                ..Default::default()
            }),
            r#"{Namespace("a"), NamespaceLabel("tier", "gold")}"#
        );
        // One namespace selector that names nothing: the namespace rule
        // tells nothing, the Service rule still does.
        assert_eq!(
            guard(ServiceAllocationSpec {
                namespaces: vec!["a".into()],
                namespace_selectors: vec![selector("tier", "Exists", &[])],
                service_selectors: vec![
                    labels(&[("app", "web")]),
                    selector("app", "In", &["api", "db"])
                ],
                ..Default::default()
            }),
            r#"{Label("app", "api"), Label("app", "db"), Label("app", "web")}"#
        );
        // Both rules tell: each listed namespace with each required label.
        assert_eq!(
            guard(ServiceAllocationSpec {
                namespaces: vec!["a".into(), "b".into()],
                service_selectors: vec![labels(&[("app", "web"), ("tier", "x")])],
                ..Default::default()
            }),
            r#"{NamespacedLabel("a", "app", "web"), NamespacedLabel("b", "app", "web")}"#
        );
        // With a namespace selector, or too many pairs: the rule with fewer
        // facts (the namespace on a tie).
        assert_eq!(
            guard(ServiceAllocationSpec {
                namespaces: vec!["a".into()],
                namespace_selectors: vec![labels(&[("tier", "gold")])],
                service_selectors: vec![labels(&[("app", "web")])],
                ..Default::default()
            }),
            r#"{Label("app", "web")}"#
        );
        let many: Vec<String> = (0..=MOST_PAIRED_FACTS).map(|i| format!("n{i}")).collect();
        let too_many = metallb(ServiceAllocationSpec {
            namespaces: many,
            service_selectors: vec![labels(&[("app", "web")])],
            ..Default::default()
        });
        assert_eq!(too_many.as_deref(), Some(r#"{Label("app", "web")}"#));
        assert_eq!(
            guard(ServiceAllocationSpec {
                service_selectors: vec![labels(&[("app", "web")]), LabelSelectorSpec::default()],
                ..Default::default()
            }),
            "none"
        );
        assert_eq!(
            guard(ServiceAllocationSpec {
                service_selectors: vec![selector("app", "NotIn", &["db"])],
                ..Default::default()
            }),
            "none"
        );
        assert_eq!(guard(ServiceAllocationSpec::default()), "none");
        // MetalLB sees no pseudo-labels: a real label of that key.
        assert_eq!(
            guard(ServiceAllocationSpec {
                service_selectors: vec![labels(&[(SERVICE_NAMESPACE_LABEL, "a")])],
                ..Default::default()
            }),
            format!("{{Label(\"{SERVICE_NAMESPACE_LABEL}\", \"a\")}}")
        );
        // Cilium: the pseudo-labels are the namespace and the name.
        let cilium = |selector: Option<LabelSelectorSpec>| {
            let spec = CiliumLoadBalancerIPPoolSpec {
                service_selector: selector,
                ..Default::default()
            };
            let guard = Pool::parse_cilium("p", &spec).unwrap().guard();
            guard.map(|facts| format!("{facts:?}"))
        };
        assert_eq!(
            cilium(Some(labels(&[(SERVICE_NAMESPACE_LABEL, "a")]))).as_deref(),
            Some(r#"{Namespace("a")}"#)
        );
        assert_eq!(
            cilium(Some(selector(SERVICE_NAME_LABEL, "In", &["x", "y"]))).as_deref(),
            Some(r#"{Name("x"), Name("y")}"#)
        );
        assert_eq!(
            cilium(Some(labels(&[("app", "web")]))).as_deref(),
            Some(r#"{Label("app", "web")}"#)
        );
        // A namespace and a label: the pair.
        assert_eq!(
            cilium(Some(labels(&[
                ("app", "web"),
                (SERVICE_NAMESPACE_LABEL, "a")
            ])))
            .as_deref(),
            Some(r#"{NamespacedLabel("a", "app", "web")}"#)
        );
        // A name is telling enough alone.
        assert_eq!(
            cilium(Some(labels(&[
                ("app", "web"),
                (SERVICE_NAME_LABEL, "s"),
                (SERVICE_NAMESPACE_LABEL, "a")
            ])))
            .as_deref(),
            Some(r#"{Name("s")}"#)
        );
        assert_eq!(cilium(Some(LabelSelectorSpec::default())), None);
        assert_eq!(cilium(Some(selector("app", "Exists", &[]))), None);
        assert_eq!(cilium(None), None);
    }

    #[test]
    fn malformed_and_duplicate_selectors() {
        let mut s = spec(&["10.0.0.0/24"]);
        s.service_allocation = Some(ServiceAllocationSpec {
            service_selectors: vec![
                selector("app", "Exists", &[]),
                selector("app", "Exists", &[]),
            ],
            ..Default::default()
        });
        assert_eq!(
            Pool::parse("p", &s).unwrap_err().to_string(),
            "serviceAllocation.serviceSelectors[1] duplicates an earlier selector"
        );
        s.service_allocation = Some(ServiceAllocationSpec {
            namespace_selectors: vec![selector("env", "Like", &["x"])],
            ..Default::default()
        });
        assert_eq!(
            Pool::parse("p", &s).unwrap_err().to_string(),
            "serviceAllocation.namespaceSelectors[0]: unknown operator \"Like\" for key \"env\""
        );
        s.service_allocation = Some(ServiceAllocationSpec {
            namespaces: vec!["a".into(), "a".into()],
            ..Default::default()
        });
        assert!(matches!(
            Pool::parse("p", &s),
            Err(PoolError::DuplicateNamespace { .. })
        ));
    }

    // ----- Cilium pools (docs/cilium.md §2.2–2.5) -----

    fn block(cidr: &str, start: &str, stop: &str) -> CiliumBlock {
        let text = |v: &str| (!v.is_empty()).then(|| v.to_owned());
        CiliumBlock {
            cidr: text(cidr),
            start: text(start),
            stop: text(stop),
        }
    }

    fn cilium(blocks: Vec<CiliumBlock>) -> CiliumLoadBalancerIPPoolSpec {
        CiliumLoadBalancerIPPoolSpec {
            blocks,
            ..Default::default()
        }
    }

    fn cilium_err(spec: &CiliumLoadBalancerIPPoolSpec) -> String {
        Pool::parse_cilium("p", spec).unwrap_err().to_string()
    }

    fn shown(pool: &Pool) -> Vec<String> {
        pool.ranges.iter().map(|r| r.to_string()).collect()
    }

    #[test]
    fn cilium_blocks_of_every_form_legacy_cidrs_first() {
        let mut spec = cilium(vec![
            block("10.0.0.12/24", "ignored", "ignored"),
            block("", "10.0.1.1", "10.0.1.9"),
            block("", "10.0.2.7", ""),
            // Go clients send "cidr": "" for a range block.
            CiliumBlock {
                cidr: Some(String::new()),
                start: Some("fd00::1".into()),
                stop: Some(String::new()),
            },
        ]);
        spec.cidrs = vec![block("10.9.0.0/30", "", "")];
        let pool = Pool::parse_cilium("p", &spec).unwrap();
        assert_eq!(
            shown(&pool),
            [
                "10.9.0.0-10.9.0.3",
                "10.0.0.0-10.0.0.255",
                "10.0.1.1-10.0.1.9",
                "10.0.2.7-10.0.2.7",
                "fd00::1-fd00::1"
            ]
        );
        assert_eq!(pool.kind, PoolKind::CiliumLoadBalancerIPPool);
        assert!(pool.auto_assign && !pool.avoid_buggy_ips && !pool.disabled);
        assert!(!pool.is_pinned());
        assert_eq!(pool.reserved(Family::V4), 0);
        assert_eq!(pool.total(Family::V4).get(), Some(4 + 256 + 9 + 1));
        // An empty pool is valid and serves nothing.
        let empty = Pool::parse_cilium("e", &CiliumLoadBalancerIPPoolSpec::default()).unwrap();
        assert!(empty.ranges.is_empty());
        assert_eq!(empty.total(Family::V6).get(), Some(0));
    }

    #[test]
    fn cilium_rejections_name_the_block() {
        let one = |b: CiliumBlock| cilium_err(&cilium(vec![block("10.0.5.0/24", "", ""), b]));
        assert_eq!(
            one(block("10.0.0.0/33", "", "")),
            "blocks[1]: cidr \"10.0.0.0/33\" is not a valid prefix"
        );
        assert_eq!(
            one(block("", "", "10.0.0.1")),
            "blocks[1]: neither cidr nor start is set"
        );
        assert_eq!(
            one(block("", "10.0.0.300", "")),
            "blocks[1]: start \"10.0.0.300\" is not an IP address"
        );
        assert_eq!(
            one(block("", "10.0.0.1", "x")),
            "blocks[1]: stop \"x\" is not an IP address"
        );
        assert_eq!(
            one(block("", "10.0.0.9", "10.0.0.1")),
            "blocks[1]: range 10.0.0.9-10.0.0.1: first address is after the last"
        );
        assert_eq!(
            one(block("", "10.0.0.1", "fd00::1")),
            "blocks[1]: range 10.0.0.1-fd00::1: first and last are of different IP families"
        );
        assert_eq!(
            one(block("", "10.0.5.64", "10.0.5.79")),
            "blocks[1] (10.0.5.64-10.0.5.79) overlaps blocks[0] (10.0.5.0-10.0.5.255) in the same pool"
        );
        let mut legacy = cilium(vec![block("10.0.5.0/24", "", "")]);
        legacy.cidrs = vec![block("10.0.5.0/24", "", "")];
        assert_eq!(
            cilium_err(&legacy),
            "blocks[0] (10.0.5.0-10.0.5.255) overlaps cidrs[0] (10.0.5.0-10.0.5.255) in the same pool"
        );
        let mut maybe = cilium(vec![]);
        maybe.allow_first_last_ips = Some("maybe".into());
        assert_eq!(
            cilium_err(&maybe),
            "allowFirstLastIPs \"maybe\" is neither \"Yes\" nor \"No\""
        );
        let mut bad_selector = cilium(vec![]);
        bad_selector.service_selector = Some(selector("app", "Contains", &[]));
        assert_eq!(
            cilium_err(&bad_selector),
            "serviceSelector: unknown operator \"Contains\" for key \"app\""
        );
    }

    #[test]
    fn allow_first_last_ips_no_reserves_the_ends_of_larger_cidr_blocks() {
        let mut spec = cilium(vec![
            block("10.0.0.5/32", "", ""),
            block("10.0.0.6/31", "", ""),
            block("fd00::1/128", "", ""),
            block("fd00::2/127", "", ""),
            block("10.0.10.16/30", "", ""),
            block("fd00:1::/120", "", ""),
            block("", "10.0.1.0", "10.0.1.255"),
        ]);
        let reserving = |spec: &CiliumLoadBalancerIPPoolSpec| {
            let pool = Pool::parse_cilium("p", spec).unwrap();
            pool.ranges
                .iter()
                .map(|r| r.reserves_ends())
                .collect::<Vec<_>>()
        };
        assert_eq!(reserving(&spec), [false; 7]);
        spec.allow_first_last_ips = Some("Yes".into());
        assert_eq!(reserving(&spec), [false; 7]);
        spec.allow_first_last_ips = Some("No".into());
        assert_eq!(
            reserving(&spec),
            [false, false, false, false, true, true, false]
        );
        let pool = Pool::parse_cilium("p", &spec).unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(!pool.allows(ip("10.0.10.16")) && pool.reserves(ip("10.0.10.16")));
        assert!(pool.allows(ip("10.0.10.17")) && pool.allows(ip("10.0.10.18")));
        assert!(!pool.allows(ip("10.0.10.19")) && pool.reserves(ip("10.0.10.19")));
        assert!(pool.reserves(ip("fd00:1::")) && pool.reserves(ip("fd00:1::ff")));
        assert!(pool.allows(ip("10.0.1.0")) && pool.allows(ip("10.0.0.6")));
        assert_eq!(pool.reserved(Family::V4), 2);
        assert_eq!(pool.reserved(Family::V6), 2);
        // The total counts the reserved ends too (Cilium's IPsTotal).
        assert_eq!(pool.total(Family::V4).get(), Some(1 + 2 + 4 + 256));
    }

    #[test]
    fn cilium_selector_sees_the_pseudo_labels_over_real_ones() {
        let mut spec = cilium(vec![block("10.0.0.0/24", "", "")]);
        spec.service_selector = Some(LabelSelectorSpec {
            match_labels: [(
                SERVICE_NAMESPACE_LABEL.to_string(),
                "tenant-one".to_string(),
            )]
            .into(),
            match_expressions: vec![],
        });
        let pool = Pool::parse_cilium("p", &spec).unwrap();
        assert!(pool.is_pinned());
        let empty = BTreeMap::new();
        let lying: BTreeMap<String, String> = [(
            SERVICE_NAMESPACE_LABEL.to_string(),
            "tenant-one".to_string(),
        )]
        .into();
        let subject = |name, namespace, labels| Subject {
            name,
            namespace,
            labels,
            namespace_labels: &empty,
        };
        assert!(pool.serves(&subject("s", "tenant-one", &empty)));
        // A real label of the same key is overwritten (TestPoolSelectorNamespace).
        assert_eq!(
            pool.unserved(&subject("s", "tenant-two", &lying)),
            Some(Unserved::ServiceSelector)
        );
        spec.service_selector = Some(selector(SERVICE_NAME_LABEL, "In", &["web", "api"]));
        let by_name = Pool::parse_cilium("p", &spec).unwrap();
        assert!(by_name.serves(&subject("api", "any", &empty)));
        assert!(!by_name.serves(&subject("db", "any", &empty)));
        // `{}` pins the pool and matches everything; absent serves all, unpinned.
        spec.service_selector = Some(LabelSelectorSpec::default());
        let all = Pool::parse_cilium("p", &spec).unwrap();
        assert!(all.is_pinned() && all.serves(&subject("x", "y", &empty)));
        // MetalLB pools see no pseudo-labels.
        let mut metallb = super::tests::spec(&["10.1.0.0/24"]);
        metallb.service_allocation = Some(ServiceAllocationSpec {
            service_selectors: vec![selector(SERVICE_NAME_LABEL, "Exists", &[])],
            ..Default::default()
        });
        let metallb = Pool::parse("m", &metallb).unwrap();
        assert!(!metallb.serves(&subject("x", "y", &empty)));
    }

    #[test]
    fn a_conflict_prints_as_cilium_writes_it() {
        let conflict = Conflict {
            range: parse_entry("10.0.0.0/24").unwrap(),
            other_range: parse_entry("10.0.0.0-10.0.0.255").unwrap(),
            other_pool: "blue".into(),
            other_kind: PoolKind::CiliumLoadBalancerIPPool,
        };
        assert_eq!(
            conflict.cilium_message(),
            "Pool conflicts since range '10.0.0.0 - 10.0.0.255' overlaps range '10.0.0.0 - 10.0.0.255' from IP Pool 'blue'"
        );
        assert_eq!(PoolKind::IPAddressPool.to_string(), "IPAddressPool");
        assert_eq!(
            PoolKind::IPAddressPool.other().to_string(),
            "CiliumLoadBalancerIPPool"
        );
    }
}
