//! What a Service asks of the allocator, in plain values.

use std::fmt;
use std::net::IpAddr;

use crate::addr::Family;
use crate::pool::Subject;

/// Which families a Service needs (docs/allocation.md §4.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FamilyPolicy {
    /// One address of this family.
    Single(Family),
    /// One address of each family, from one pool.
    RequireDual,
    /// Both families from one pool if any pool has both free, else one
    /// address, of `primary` first.
    PreferDual { primary: Family },
}

impl FamilyPolicy {
    /// Whether `ips` has the families this policy accepts for a held or
    /// requested set: exactly one of a single family; one of each for dual
    /// stack, or one of either for `PreferDual` when `partial` is allowed.
    pub(crate) fn accepts(self, ips: &[IpAddr], partial: bool) -> bool {
        let v4 = ips.iter().filter(|ip| ip.is_ipv4()).count();
        let v6 = ips.len() - v4;
        match self {
            FamilyPolicy::Single(Family::V4) => (v4, v6) == (1, 0),
            FamilyPolicy::Single(Family::V6) => (v4, v6) == (0, 1),
            FamilyPolicy::RequireDual => (v4, v6) == (1, 1),
            FamilyPolicy::PreferDual { .. } => (v4, v6) == (1, 1) || (partial && v4 + v6 == 1),
        }
    }
}

impl fmt::Display for FamilyPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FamilyPolicy::Single(family) => write!(f, "single-stack {family}"),
            FamilyPolicy::RequireDual => f.write_str("dual-stack (required)"),
            FamilyPolicy::PreferDual { .. } => f.write_str("dual-stack (preferred)"),
        }
    }
}

/// A transport protocol of a Service port.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
    Other(Box<str>),
}

impl Protocol {
    /// Parses a Kubernetes protocol name; unset means TCP.
    pub fn from_k8s(name: Option<&str>) -> Protocol {
        match name {
            None | Some("TCP") => Protocol::Tcp,
            Some("UDP") => Protocol::Udp,
            Some("SCTP") => Protocol::Sctp,
            Some(other) => Protocol::Other(other.into()),
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
            Protocol::Other(name) => name,
        })
    }
}

/// A Service port: two Services on one address may not have one in common.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Port {
    pub protocol: Protocol,
    pub port: i32,
}

impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.port, self.protocol)
    }
}

/// Whose sharing rule a Service's sharing key follows (docs/cilium.md §4.2):
/// keys of the two rules never share an address, even when the strings are
/// equal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SharingRule {
    /// `metallb.io/allow-shared-ip` (docs/allocation.md §4.4).
    #[default]
    MetalLb,
    /// `lbipam.cilium.io/sharing-key` (docs/cilium.md §3.4): prefers
    /// joining an address its key already holds over a free one.
    Cilium,
}

impl SharingRule {
    /// The tag that keeps the two rules' groups apart.
    pub(crate) fn tag(self) -> char {
        match self {
            SharingRule::MetalLb => 'm',
            SharingRule::Cilium => 'c',
        }
    }
}

/// Which other namespaces a Service lets share its address
/// (`lbipam.cilium.io/sharing-cross-namespace`, docs/cilium.md §3.4). Two
/// Services share only if they are in one namespace, or each one admits
/// the other's namespace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SharingNamespaces<'a> {
    /// Any namespace: MetalLB's default.
    #[default]
    Any,
    /// These namespaces besides its own; `*` admits any.
    Listed(&'a [String]),
}

impl SharingNamespaces<'_> {
    /// Whether a Service in `namespace` is admitted.
    pub fn admits(&self, namespace: &str) -> bool {
        match self {
            SharingNamespaces::Any => true,
            SharingNamespaces::Listed(list) => list.iter().any(|n| n == "*" || n == namespace),
        }
    }
}

/// Everything the allocator needs to know about one Service.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// `namespace/name`.
    pub key: &'a str,
    /// For the pools' serviceAllocation rules.
    pub subject: Subject<'a>,
    pub families: FamilyPolicy,
    /// `allow-shared-ip` or Cilium's `sharing-key`; empty: no sharing.
    pub sharing_key: &'a str,
    /// Which rule `sharing_key` follows.
    pub sharing_rule: SharingRule,
    /// Which other namespaces may share its address.
    pub sharing_namespaces: SharingNamespaces<'a>,
    /// Empty for `externalTrafficPolicy: Cluster`, the pod selector for
    /// `Local`.
    pub backend_key: &'a str,
    pub ports: &'a [Port],
    /// The requested pool (`address-pool`), if any.
    pub pool: Option<&'a str>,
    /// The requested addresses (`loadBalancerIPs`), if any.
    pub addresses: &'a [IpAddr],
}
