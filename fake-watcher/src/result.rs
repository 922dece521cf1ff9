//! The result of a replay (docs/replay.md §3) and its per-line trace.
//!
//! Field order is the documented key order: serializing a [`ReplayResult`]
//! gives the §3 document.

use std::fmt;
use std::net::IpAddr;

use allocator::AddressCount;
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::client::{EventRecord, WriteRecord};

/// The §3 result document.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayResult {
    /// Every Service of type LoadBalancer in the store, sorted by key.
    pub services: Vec<ServiceResult>,
    /// Every Event the controller emitted, in order.
    pub events: Vec<EventRecord>,
    /// Every accepted pool, sorted by name.
    pub pools: Vec<PoolResult>,
    /// Every rejected pool, sorted by name.
    pub rejected_pools: Vec<RejectedPoolResult>,
    /// Every `CiliumLoadBalancerIPPool` in the store, sorted by name, with
    /// the conditions a host would write on it (docs/cilium.md §2.8).
    #[serde(default)]
    pub cilium_pools: Vec<CiliumPoolResult>,
}

/// One LoadBalancer Service at the end of the replay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceResult {
    /// `namespace/name`.
    pub key: String,
    /// `status.loadBalancer.ingress[].ip`, in order.
    pub ips: Vec<String>,
    /// The `metallb.io/ip-allocated-from-pool` annotation.
    pub pool: Option<String>,
    /// `status.conditions` as a host would write them (the controller's
    /// `metallb.io/AddressAssigned` and any other the stream gave), without
    /// the timestamps a replay cannot make deterministic.
    #[serde(default)]
    pub conditions: Vec<ConditionResult>,
}

/// One condition of a Service (docs/replay.md §3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConditionResult {
    #[serde(rename = "type")]
    pub condition_type: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    pub reason: String,
    pub message: String,
}

/// One accepted pool's counters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolResult {
    pub name: String,
    /// `IPAddressPool` or `CiliumLoadBalancerIPPool`.
    #[serde(default = "metallb_kind")]
    pub kind: String,
    pub ipv4: FamilyResult,
    pub ipv6: FamilyResult,
}

/// One family's counters of a pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FamilyResult {
    /// Usable addresses (after avoidBuggyIPs).
    pub total: Count,
    /// Addresses in use; a shared address counts once.
    pub assigned: Count,
}

/// One rejected pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectedPoolResult {
    pub name: String,
    /// `IPAddressPool` or `CiliumLoadBalancerIPPool`.
    #[serde(default = "metallb_kind")]
    pub kind: String,
    /// The reason, as logged.
    pub reason: String,
}

/// The kind of a pool in a document written before pools had one.
fn metallb_kind() -> String {
    subscriber::POOL_KIND.to_owned()
}

/// One `CiliumLoadBalancerIPPool` and its status conditions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CiliumPoolResult {
    pub name: String,
    /// `cilium.io/IPsTotal`, `IPsAvailable`, `IPsUsed` (exact decimal
    /// counts) and `PoolConflict`, as they would be written; none for a
    /// pool rejected for another reason than an overlap (Cilium writes
    /// nothing on an invalid pool).
    pub conditions: Vec<ConditionResult>,
}

/// A count of addresses (up to 2^128): a JSON integer below 2^53, a decimal
/// string from there up (JSON readers lose precision past 2^53 - 1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Count(pub AddressCount);

impl From<u128> for Count {
    fn from(count: u128) -> Self {
        Count(AddressCount::new(count))
    }
}

/// The largest count written as a JSON integer.
pub const MAX_SAFE_INTEGER: u128 = (1 << 53) - 1;

impl Serialize for Count {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self
            .0
            .get()
            .filter(|c| *c <= MAX_SAFE_INTEGER)
            .map(u64::try_from)
        {
            Some(Ok(small)) => serializer.serialize_u64(small),
            _ => serializer.collect_str(&self.0),
        }
    }
}

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CountVisitor;

        impl Visitor<'_> for CountVisitor {
            type Value = Count;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a non-negative integer or a decimal string")
            }

            fn visit_u64<E: de::Error>(self, value: u64) -> Result<Count, E> {
                Ok(Count::from(u128::from(value)))
            }

            fn visit_i64<E: de::Error>(self, value: i64) -> Result<Count, E> {
                u128::try_from(value)
                    .map(Count::from)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(value), &self))
            }

            fn visit_str<E: de::Error>(self, value: &str) -> Result<Count, E> {
                if value == AddressCount::ALL_IPV6.to_string() {
                    return Ok(Count(AddressCount::ALL_IPV6));
                }
                value
                    .parse::<u128>()
                    .map(Count::from)
                    .map_err(|_| E::invalid_value(de::Unexpected::Str(value), &self))
            }
        }

        deserializer.deserialize_any(CountVisitor)
    }
}

impl fmt::Display for Count {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// One applied line of a replay, for snapshot tests.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceStep {
    /// The line number; 0 for a pool from `--config`.
    pub line: u64,
    pub event: TraceEvent,
    /// The controller's status writes while the line was processed.
    pub writes: Vec<WriteRecord>,
    /// The Events emitted while the line was processed.
    pub events: Vec<EventRecord>,
    /// What every Service holds once the manager is idle, sorted by key.
    pub holdings: Vec<HoldingRecord>,
    /// Errors the subscriber chain returned for the line's event.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// docs/allocation.md §6 invariants broken after the line (when checked).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub violations: Vec<String>,
}

/// The event of a [`TraceStep`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// `ADDED`, `MODIFIED`, `DELETED` or `SYNCED`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The object's kind (none for SYNCED).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The object's key (none for SYNCED).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// What one Service holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldingRecord {
    pub key: String,
    /// IPv4 first.
    pub ips: Vec<IpAddr>,
    pub pool: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_past_2_pow_53_are_strings() {
        let counts = [
            Count::from(0),
            Count::from(MAX_SAFE_INTEGER),
            Count::from(MAX_SAFE_INTEGER + 1),
            Count::from(u128::MAX),
            Count(AddressCount::ALL_IPV6),
        ];
        let json = serde_json::to_string(&counts).unwrap();
        assert_eq!(
            json,
            "[0,9007199254740991,\"9007199254740992\",\"340282366920938463463374607431768211455\",\"340282366920938463463374607431768211456\"]"
        );
        let back: Vec<Count> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, counts);
        assert!(serde_json::from_str::<Count>("-1").is_err());
        assert!(serde_json::from_str::<Count>("\"x\"").is_err());
    }
}
