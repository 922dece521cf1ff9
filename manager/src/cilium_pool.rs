//! The status conditions of a `CiliumLoadBalancerIPPool` as Cilium writes
//! them (docs/cilium.md §2.8): three counts and the conflict state, from
//! what the allocator made of the pool. Hosts write them (kube-watcher) or
//! show them (the replay's `cilium_pools[]`, docs/replay.md §3).

use std::collections::HashMap;

use allocator::cilium::CiliumLoadBalancerIPPoolSpec;
use allocator::{
    AddressCount, CiliumCounts, Family, FamilyStats, Pool, PoolKind, PoolStats, RejectedPool,
    WideCount,
};
use subscriber::CiliumLoadBalancerIPPool;

/// `cilium.io/IPsTotal`.
const IPS_TOTAL: &str = "cilium.io/IPsTotal";
/// `cilium.io/IPsAvailable`.
const IPS_AVAILABLE: &str = "cilium.io/IPsAvailable";
/// `cilium.io/IPsUsed`.
const IPS_USED: &str = "cilium.io/IPsUsed";
/// `cilium.io/PoolConflict`.
const POOL_CONFLICT: &str = "cilium.io/PoolConflict";

/// One condition of a Cilium pool, without the timestamps and the
/// generation a host adds when it writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolCondition {
    pub condition_type: &'static str,
    /// `True`, `False` or `Unknown`.
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
}

/// The four conditions of the Cilium pool `pool`, in Cilium's order
/// (`IPsTotal`, `IPsAvailable`, `IPsUsed`, `PoolConflict`), given the
/// allocator's accepted pools (`stats`) and rejected pools (`rejected`).
///
/// An accepted pool counts its held addresses (once however many share
/// one) and its reserved ends as used; a pool rejected for an overlap holds
/// nothing, so its used count is its reserved ends, and its conflict names
/// the older pool. `None` where Cilium would write nothing: a pool the
/// allocator rejects for another reason (an invalid block or selector, or
/// its name taken by an older `IPAddressPool`; docs/cilium.md §10, open
/// question 2), or one it does not know.
pub fn cilium_pool_conditions(
    pool: &CiliumLoadBalancerIPPool,
    stats: &[PoolStats],
    rejected: &[RejectedPool],
) -> Option<[PoolCondition; 4]> {
    CiliumPoolFigures::new(stats, rejected).conditions(pool)
}

/// The allocator's accepted and rejected Cilium pools by name, built once
/// for the conditions of many pools: each pool then costs a lookup, not a
/// walk over every pool.
#[derive(Debug)]
pub struct CiliumPoolFigures<'a> {
    accepted: HashMap<&'a str, &'a PoolStats>,
    rejected: HashMap<&'a str, &'a RejectedPool>,
}

impl<'a> CiliumPoolFigures<'a> {
    pub fn new(stats: &'a [PoolStats], rejected: &'a [RejectedPool]) -> Self {
        let cilium = PoolKind::CiliumLoadBalancerIPPool;
        Self {
            accepted: stats
                .iter()
                .filter(|s| s.kind == cilium)
                .map(|s| (s.name.as_str(), s))
                .collect(),
            rejected: rejected
                .iter()
                .filter(|r| r.kind == cilium)
                .map(|r| (r.name.as_str(), r))
                .collect(),
        }
    }

    /// [`cilium_pool_conditions`] of `pool`.
    pub fn conditions(&self, pool: &CiliumLoadBalancerIPPool) -> Option<[PoolCondition; 4]> {
        let name = pool.metadata.name.as_deref()?;
        if let Some(stats) = self.accepted.get(name) {
            return Some(conditions(stats.cilium_counts(), None));
        }
        let conflict = self.rejected.get(name)?.conflict.as_ref()?;
        Some(conditions(
            conflicting_counts(name, &pool.spec),
            Some(conflict.cilium_message()),
        ))
    }
}

/// The counts of a pool rejected for a conflict: it holds nothing, so its
/// used count is its reserved ends. Its blocks are counted one by one (a
/// pool whose blocks overlap each other does not parse whole, and Cilium
/// counts every block); a block that does not parse counts nothing.
fn conflicting_counts(name: &str, spec: &CiliumLoadBalancerIPPoolSpec) -> CiliumCounts {
    let mut stats = PoolStats {
        name: name.to_owned(),
        kind: PoolKind::CiliumLoadBalancerIPPool,
        ipv4: FamilyStats::default(),
        ipv6: FamilyStats::default(),
    };
    for block in spec.cidrs.iter().chain(&spec.blocks) {
        let one = CiliumLoadBalancerIPPoolSpec {
            blocks: vec![block.clone()],
            allow_first_last_ips: spec.allow_first_last_ips.clone(),
            ..Default::default()
        };
        let Ok(one) = Pool::parse_cilium(name, &one) else {
            continue;
        };
        for (family, counts) in [(Family::V4, &mut stats.ipv4), (Family::V6, &mut stats.ipv6)] {
            counts.total = add(counts.total, one.total(family));
            counts.reserved = counts.reserved.saturating_add(one.reserved(family));
        }
    }
    stats.cilium_counts()
}

/// `a + b`, at most 2^128 (more only from blocks that overlap each other).
fn add(a: AddressCount, b: AddressCount) -> AddressCount {
    a.get()
        .zip(b.get())
        .and_then(|(a, b)| a.checked_add(b))
        .map_or(AddressCount::ALL_IPV6, AddressCount::from)
}

fn conditions(counts: CiliumCounts, conflict: Option<String>) -> [PoolCondition; 4] {
    let count = |condition_type, count: WideCount| PoolCondition {
        condition_type,
        status: "Unknown",
        reason: "noreason",
        message: count.to_string(),
    };
    let conflict = match conflict {
        Some(message) => PoolCondition {
            condition_type: POOL_CONFLICT,
            status: "True",
            reason: "cidr_overlap",
            message,
        },
        None => PoolCondition {
            condition_type: POOL_CONFLICT,
            status: "False",
            reason: "resolved",
            message: String::new(),
        },
    };
    [
        count(IPS_TOTAL, counts.total),
        count(IPS_AVAILABLE, counts.available),
        count(IPS_USED, counts.used),
        conflict,
    ]
}

#[cfg(test)]
mod tests {
    use allocator::Allocator;
    use serde_json::json;

    use super::*;

    fn pool(name: &str, spec: serde_json::Value) -> CiliumLoadBalancerIPPool {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
    }

    fn texts(conditions: Option<[PoolCondition; 4]>) -> Vec<String> {
        conditions
            .unwrap()
            .iter()
            .map(|c| {
                format!(
                    "{} {} {} {}",
                    c.condition_type, c.status, c.reason, c.message
                )
            })
            .collect()
    }

    #[test]
    fn accepted_conflicting_and_other_pools() {
        let mut allocator = Allocator::new();
        let older = pool(
            "older",
            json!({"blocks": [{"cidr": "10.0.0.0/24"}], "allowFirstLastIPs": "No"}),
        );
        let newer = pool(
            "newer",
            json!({"blocks": [{"cidr": "10.0.0.128/25"}, {"cidr": "fd00::/64"}],
                   "allowFirstLastIPs": "No"}),
        );
        let bad = pool("bad", json!({"blocks": [{"cidr": "10.0.0.0/33"}]}));
        allocator.set_cilium_pool_created("older", &older.spec, Some(1));
        allocator.set_cilium_pool_created("newer", &newer.spec, Some(2));
        allocator.set_cilium_pool_created("bad", &bad.spec, Some(3));
        let (stats, rejected) = (allocator.pool_stats(), allocator.rejected_pools());

        assert_eq!(
            texts(cilium_pool_conditions(&older, &stats, &rejected)),
            [
                "cilium.io/IPsTotal Unknown noreason 256",
                "cilium.io/IPsAvailable Unknown noreason 254",
                "cilium.io/IPsUsed Unknown noreason 2",
                "cilium.io/PoolConflict False resolved ",
            ]
        );
        // 128 + 2^64 addresses, four of them reserved ends.
        assert_eq!(
            texts(cilium_pool_conditions(&newer, &stats, &rejected)),
            [
                "cilium.io/IPsTotal Unknown noreason 18446744073709551744",
                "cilium.io/IPsAvailable Unknown noreason 18446744073709551740",
                "cilium.io/IPsUsed Unknown noreason 4",
                "cilium.io/PoolConflict True cidr_overlap Pool conflicts since range \
                 '10.0.0.128 - 10.0.0.255' overlaps range '10.0.0.0 - 10.0.0.255' from IP Pool 'older'",
            ]
        );
        assert_eq!(cilium_pool_conditions(&bad, &stats, &rejected), None);
        // A pool overlapping itself names itself, and counts every block
        // (as kube-watcher writes it).
        let twice = pool(
            "twice",
            json!({"blocks": [{"cidr": "10.1.0.0/24"}, {"cidr": "10.1.0.0/24"}]}),
        );
        allocator.set_cilium_pool_created("twice", &twice.spec, Some(4));
        let rejected = allocator.rejected_pools();
        assert_eq!(
            texts(cilium_pool_conditions(&twice, &stats, &rejected)),
            [
                "cilium.io/IPsTotal Unknown noreason 512",
                "cilium.io/IPsAvailable Unknown noreason 512",
                "cilium.io/IPsUsed Unknown noreason 0",
                "cilium.io/PoolConflict True cidr_overlap Pool conflicts since range \
                 '10.1.0.0 - 10.1.0.255' overlaps range '10.1.0.0 - 10.1.0.255' from IP Pool 'twice'",
            ]
        );
        assert_eq!(
            cilium_pool_conditions(&pool("unknown", json!({})), &stats, &rejected),
            None
        );
        // Two /24s and a /64, each with its ends reserved, the /24s
        // overlapping each other: each block counted.
        let mixed = pool(
            "mixed",
            json!({"blocks": [{"cidr": "10.2.0.0/24"}, {"cidr": "2001:db8::/64"},
                              {"cidr": "10.2.0.0/24"}],
                   "allowFirstLastIPs": "No"}),
        );
        allocator.set_cilium_pool_created("mixed", &mixed.spec, Some(5));
        let counts: Vec<String> =
            cilium_pool_conditions(&mixed, &stats, &allocator.rejected_pools())
                .unwrap()
                .iter()
                .map(|c| c.message.clone())
                .take(3)
                .collect();
        assert_eq!(
            counts,
            ["18446744073709552128", "18446744073709552122", "6"]
        );
    }
}
