//! Cilium's Service annotations and condition (docs/cilium.md §3, §4.2,
//! §4.3), through the Manager and the AllocatingController, against an
//! in-memory client that writes into the shared cache and echoes every
//! write back as a watch would (the machinery of tests/support, shared with
//! tests/controller.rs).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

mod support;

use manager::{
    ConditionKind, ControllerConfig, EventType, SharingAcrossNamespaces, CILIUM_CONDITION_TYPE,
    POOL_ANNOTATION,
};
use serde_json::{json, Value};
use support::{addrs, blocks, every_write, warnings, Harness, Record, Svc};

/// The shared `svc` at `metadata.generation` 1, as a cluster shows it:
/// Cilium's condition records the generation it saw.
fn svc(key: &str) -> Svc {
    support::svc(key).generation(1)
}

/// Cilium's `no_pool` message for a family.
const NO_POOL: &str =
    "False no_pool: There are no enabled CiliumLoadBalancerIPPools that match this service";
const SATISFIED: &str = "True satisfied: ";

// ----- docs/cilium.md §3.2, §3.3: the annotations -----

mod annotations {
    use super::*;

    #[tokio::test]
    async fn cilium_ips_request_addresses_with_spec_load_balancer_ip() {
        let h = Harness::synced().await;
        h.cilium_pool("c", blocks(&["10.0.10.0/24", "fd00:10::/120"]))
            .await;
        h.add(svc("ns/a").cilium_ips("10.0.10.21")).await;
        assert_eq!(h.ips("ns/a"), "10.0.10.21");
        // The alias, and spec.loadBalancerIP joined with it (the same
        // address twice is one), dual-stack.
        h.add(
            svc("ns/b")
                .ann("io.cilium/lb-ipam-ips", "10.0.10.22,fd00:10::22")
                .set(&["spec", "loadBalancerIP"], json!("10.0.10.22"))
                .set(&["spec", "clusterIPs"], json!(["10.96.0.11", "fd96::11"]))
                .set(&["spec", "ipFamilyPolicy"], json!("RequireDualStack")),
        )
        .await;
        assert_eq!(h.ips("ns/b"), "10.0.10.22 fd00:10::22");
        assert_eq!(h.cilium("ns/b"), SATISFIED);
    }

    #[tokio::test]
    async fn unreadable_parts_are_skipped_with_a_warning() {
        let h = Harness::synced().await;
        h.cilium_pool("c", blocks(&["10.0.10.0/24"])).await;
        h.take();
        h.add(svc("ns/a").cilium_ips("10.0.0.300, 10.0.10.7")).await;
        assert_eq!(h.ips("ns/a"), "10.0.10.7");
        assert_eq!(
            warnings(&h.take()),
            [
                r#"ns/a InvalidAnnotationValue: annotation "lbipam.cilium.io/ips": "10.0.0.300" is not an IP address; ignored"#
            ]
        );
    }

    #[tokio::test]
    async fn two_addresses_of_a_family_are_beyond_this_allocator() {
        let h = Harness::synced().await;
        h.cilium_pool("c", blocks(&["10.0.10.0/24"])).await;
        h.take();
        h.add(svc("ns/a").cilium_ips("10.0.10.1,10.0.10.2")).await;
        assert_eq!(h.ips("ns/a"), "");
        assert_eq!(
            warnings(&h.take()),
            [
                "ns/a LoadBalancerFailed: invalid request: lbipam.cilium.io/ips requests 2 IPv4 \
              addresses; this allocator holds one address per family"
            ]
        );
        assert_eq!(h.cilium("ns/a"), NO_POOL);
    }
}

// ----- docs/cilium.md §4.2: which annotations win -----

mod precedence {
    use super::*;

    #[tokio::test]
    async fn metallb_addresses_win_with_a_warning() {
        let h = Harness::synced().await;
        h.pool("m", addrs(&["10.0.0.0/24"])).await;
        h.take();
        h.add(
            svc("ns/a")
                .ann("metallb.io/loadBalancerIPs", "10.0.0.5")
                .cilium_ips("10.0.0.6"),
        )
        .await;
        assert_eq!(h.ips("ns/a"), "10.0.0.5");
        assert_eq!(
            warnings(&h.take()),
            [
                r#"ns/a IgnoredAnnotation: annotation "lbipam.cilium.io/ips" is ignored: "metallb.io/loadBalancerIPs" is set"#
            ]
        );
    }

    #[tokio::test]
    async fn metallb_sharing_key_wins_with_a_warning() {
        let h = Harness::synced().await;
        h.pool("m", addrs(&["10.0.0.0/24"])).await;
        h.add(svc("ns/a").ann("metallb.io/allow-shared-ip", "k").port(80))
            .await;
        h.take();
        // b's Cilium key is ignored: it shares a's address by the MetalLB
        // key, and the Cilium key alone would not share with a.
        h.add(
            svc("ns/b")
                .ann("metallb.io/allow-shared-ip", "k")
                .cilium_key("other")
                .port(81),
        )
        .await;
        assert_eq!(h.ips("ns/b"), h.ips("ns/a"));
        assert_eq!(
            warnings(&h.take()),
            [
                r#"ns/b IgnoredAnnotation: annotation "lbipam.cilium.io/sharing-key" is ignored: "metallb.io/allow-shared-ip" is set"#
            ]
        );
    }

    #[tokio::test]
    async fn keys_of_the_two_kinds_never_share() {
        let h = Harness::synced().await;
        h.pool("m", addrs(&["10.0.0.0/24"])).await;
        h.add(svc("ns/a").ann("metallb.io/allow-shared-ip", "k").port(80))
            .await;
        h.add(svc("ns/b").cilium_key("k").port(81)).await;
        assert_eq!(h.ips("ns/a"), "10.0.0.0");
        assert_eq!(h.ips("ns/b"), "10.0.0.1");
    }
}

// ----- docs/cilium.md §3.4: sharing across namespaces -----

mod cross_namespace {
    use super::*;

    #[tokio::test]
    async fn metallb_keys_share_across_namespaces_by_default() {
        let h = Harness::synced().await;
        h.pool("m", addrs(&["10.0.0.0/24"])).await;
        h.add(
            svc("ns-a/s")
                .ann("metallb.io/allow-shared-ip", "k")
                .port(80),
        )
        .await;
        h.add(
            svc("ns-b/s")
                .ann("metallb.io/allow-shared-ip", "k")
                .port(81),
        )
        .await;
        assert_eq!(h.ips("ns-b/s"), "10.0.0.0");
    }

    #[tokio::test]
    async fn metallb_keys_need_the_annotation_when_configured() {
        let config = ControllerConfig::default()
            .sharing_across_namespaces(SharingAcrossNamespaces::Annotated);
        let h = Harness::synced_with(config).await;
        h.pool("m", addrs(&["10.0.0.0/24"])).await;
        h.add(
            svc("ns-a/s")
                .ann("metallb.io/allow-shared-ip", "k")
                .port(80),
        )
        .await;
        h.add(
            svc("ns-b/s")
                .ann("metallb.io/allow-shared-ip", "k")
                .port(81),
        )
        .await;
        assert_eq!(h.ips("ns-b/s"), "10.0.0.1");
        // Same namespace: as before.
        h.add(
            svc("ns-a/t")
                .ann("metallb.io/allow-shared-ip", "k")
                .port(82),
        )
        .await;
        assert_eq!(h.ips("ns-a/t"), "10.0.0.0");
        // Both allowing the other: shared.
        h.add(
            svc("ns-c/s")
                .ann("metallb.io/allow-shared-ip", "j")
                .cross("ns-d")
                .port(80),
        )
        .await;
        h.add(
            svc("ns-d/s")
                .ann("metallb.io/allow-shared-ip", "j")
                .cross("ns-c")
                .port(81),
        )
        .await;
        assert_eq!(h.ips("ns-d/s"), h.ips("ns-c/s"));
    }
}

// ----- docs/cilium.md §3.4 rule 5: externalTrafficPolicy Local -----

mod local_policy {
    use super::*;

    fn local(svc: Svc, selector: Option<&str>) -> Svc {
        svc.set(&["spec", "externalTrafficPolicy"], json!("Local"))
            .set(
                &["spec", "selector"],
                selector.map_or(Value::Null, |app| json!({ "app": app })),
            )
    }

    #[tokio::test]
    async fn cilium_keys_share_local_services_with_the_same_selector_only() {
        let h = Harness::synced().await;
        h.cilium_pool("c", blocks(&["10.0.10.0/24"])).await;
        h.add(local(svc("ns/a").cilium_key("k").port(80), Some("web")))
            .await;
        h.add(local(svc("ns/b").cilium_key("k").port(81), Some("web")))
            .await;
        h.add(local(svc("ns/c").cilium_key("k").port(82), Some("db")))
            .await;
        h.add(local(svc("ns/d").cilium_key("k").port(83), None))
            .await;
        h.add(local(svc("ns/e").cilium_key("k").port(84), None))
            .await;
        assert_eq!(h.ips("ns/a"), "10.0.10.0");
        assert_eq!(h.ips("ns/b"), "10.0.10.0");
        assert_eq!(h.ips("ns/c"), "10.0.10.1");
        // Without a selector, never shared (not even with each other).
        assert_eq!(h.ips("ns/d"), "10.0.10.2");
        assert_eq!(h.ips("ns/e"), "10.0.10.3");
        // A MetalLB key keeps MetalLB's rule: two selector-less Local
        // Services share.
        h.add(local(
            svc("ns/f").ann("metallb.io/allow-shared-ip", "k").port(85),
            None,
        ))
        .await;
        h.add(local(
            svc("ns/g").ann("metallb.io/allow-shared-ip", "k").port(86),
            None,
        ))
        .await;
        assert_eq!(h.ips("ns/g"), h.ips("ns/f"));
    }
}

// ----- docs/cilium.md §3.6: the condition -----

mod condition {
    use super::*;

    #[tokio::test]
    async fn satisfied_and_written_only_while_a_cilium_pool_exists() {
        let h = Harness::synced().await;
        h.pool("m", addrs(&["10.0.0.0/24"])).await;
        h.add(svc("ns/before")).await;
        assert_eq!(h.cilium("ns/before"), "none");
        h.cilium_pool("c", blocks(&["10.0.10.0/24"])).await;
        h.add(svc("ns/a")).await;
        assert_eq!(h.ips("ns/a"), "10.0.10.0");
        assert_eq!(h.cilium("ns/a"), SATISFIED);
        let shown = ConditionKind::Cilium
            .find(&h.service("ns/a"))
            .unwrap()
            .clone();
        assert_eq!(shown.type_, CILIUM_CONDITION_TYPE);
        assert_eq!(shown.observed_generation, Some(1));
        // Not a write of its own: the settled Service waits for one.
        assert_eq!(h.cilium("ns/before"), "none");
    }

    #[tokio::test]
    async fn already_allocated_incompatible_service() {
        let h = Harness::synced().await;
        h.cilium_pool("c", blocks(&["10.0.10.0/24"])).await;
        h.add(svc("ns/a").cilium_ips("10.0.10.5").cilium_key("k"))
            .await;
        h.add(svc("ns/b").cilium_ips("10.0.10.5").cilium_key("k"))
            .await;
        let shown = h.cilium("ns/b");
        assert!(
            shown.starts_with(
                "False already_allocated_incompatible_service: The IP '10.0.10.5' is already \
                 allocated to an incompatible service. Reason: "
            ),
            "{shown}"
        );
        assert!(shown.contains("port"), "{shown}");
    }

    #[tokio::test]
    async fn out_of_ips() {
        let h = Harness::synced().await;
        h.cilium_pool("c", blocks(&["10.0.10.1/32"])).await;
        h.add(svc("ns/a")).await;
        h.add(svc("ns/b")).await;
        assert_eq!(h.ips("ns/a"), "10.0.10.1");
        assert_eq!(
            h.cilium("ns/b"),
            "False out_of_ips: All enabled CiliumLoadBalancerIPPools that match this service \
             ran out of allocatable IPs"
        );
    }

    #[tokio::test]
    async fn removed_when_the_service_stops_being_handled() {
        let h = Harness::synced().await;
        h.cilium_pool("c", blocks(&["10.0.10.0/24"])).await;
        h.add(svc("ns/a")).await;
        assert_eq!(h.cilium("ns/a"), SATISFIED);
        h.edit("ns/a", |s| s.kind("NodePort")).await;
        assert_eq!(h.ips("ns/a"), "");
        assert_eq!(h.cilium("ns/a"), "none");
    }

    #[tokio::test]
    async fn only_generation_differs_counts_as_up_to_date() {
        let h = Harness::synced().await;
        h.cilium_pool("c", blocks(&["10.0.10.0/24"])).await;
        h.add(svc("ns/a")).await;
        h.take();
        // Cilium's condition from another generation (as Cilium leaves it
        // on a satisfied Service) needs no write.
        h.edit("ns/a", |mut s| {
            for condition in s.0["status"]["conditions"].as_array_mut().unwrap() {
                if condition["type"] == CILIUM_CONDITION_TYPE {
                    condition["observedGeneration"] = json!(7);
                }
            }
            s
        })
        .await;
        assert_eq!(every_write(&h.take()), Vec::<String>::new());
        // Another message is a write.
        h.edit("ns/a", |mut s| {
            for condition in s.0["status"]["conditions"].as_array_mut().unwrap() {
                if condition["type"] == CILIUM_CONDITION_TYPE {
                    condition["message"] = json!("stale");
                }
            }
            s
        })
        .await;
        assert_eq!(every_write(&h.take()), ["ns/a <- 10.0.10.0"]);
        assert_eq!(h.cilium("ns/a"), SATISFIED);
    }

    #[tokio::test]
    async fn switched_off_by_configuration() {
        let h = Harness::synced_with(ControllerConfig::default().without_cilium_conditions()).await;
        h.cilium_pool("c", blocks(&["10.0.10.0/24"])).await;
        h.add(svc("ns/a")).await;
        assert_eq!(h.ips("ns/a"), "10.0.10.0");
        assert_eq!(h.cilium("ns/a"), "none");
    }

    #[tokio::test]
    async fn no_longer_written_once_the_last_cilium_pool_is_gone() {
        let h = Harness::synced().await;
        h.pool("m", addrs(&["10.0.0.0/24"])).await;
        h.cilium_pool("c", blocks(&["10.0.10.0/24"])).await;
        h.delete_cilium_pool("c").await;
        h.add(svc("ns/a")).await;
        assert_eq!(h.ips("ns/a"), "10.0.0.0");
        assert_eq!(h.cilium("ns/a"), "none");
    }
}

// ----- docs/cilium.md §4.1, §4.3: one ordering for both kinds -----

mod mixed_order {
    use super::*;

    /// The candidate order of docs/cilium.md §4.3: pinned pools with a
    /// priority (MetalLB only), then pinned pools of both kinds by name (a
    /// Cilium pool with a serviceSelector is pinned), then unpinned pools
    /// of both kinds by name.
    #[tokio::test]
    async fn one_candidate_order_for_both_kinds() {
        let h = Harness::synced().await;
        h.pool("z-metal", addrs(&["10.0.5.1/32"])).await;
        h.cilium_pool("a-cilium", blocks(&["10.0.4.1/32"])).await;
        h.cilium_pool(
            "c-selected",
            json!({"blocks": [{"cidr": "10.0.3.1/32"}], "serviceSelector": {}}),
        )
        .await;
        h.pool(
            "b-pinned",
            json!({"addresses": ["10.0.2.1/32"],
                   "serviceAllocation": {"namespaces": ["ns"]}}),
        )
        .await;
        h.pool(
            "y-priority",
            json!({"addresses": ["10.0.1.1/32"],
                   "serviceAllocation": {"priority": 1, "namespaces": ["ns"]}}),
        )
        .await;
        for i in 1..=6 {
            h.add(svc(&format!("ns/s{i}"))).await;
        }
        let got: Vec<String> = (1..=6).map(|i| h.ips(&format!("ns/s{i}"))).collect();
        assert_eq!(
            got,
            ["10.0.1.1", "10.0.2.1", "10.0.3.1", "10.0.4.1", "10.0.5.1", ""]
        );
        assert_eq!(
            h.cilium("ns/s6"),
            "False out_of_ips: All enabled CiliumLoadBalancerIPPools that match this service \
             ran out of allocatable IPs"
        );
        // The pool annotation names only IPAddressPools' addresses.
        let pool_of = |key: &str| {
            h.service(key)
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(POOL_ANNOTATION).cloned())
        };
        assert_eq!(pool_of("ns/s2").as_deref(), Some("b-pinned"));
        // None for a Cilium pool's, as Cilium writes none (docs/cilium.md §5).
        assert_eq!(pool_of("ns/s3"), None);
    }

    /// A Cilium key joins an address its key holds before taking a free
    /// one (docs/cilium.md §4.3 item 3); a MetalLB key takes the first
    /// address that is free or shareable.
    #[tokio::test]
    async fn cilium_key_joins_before_a_fresh_address() {
        let h = Harness::synced().await;
        h.cilium_pool("c", blocks(&["10.0.10.0/24"])).await;
        h.add(svc("ns/plain")).await;
        h.add(svc("ns/c1").cilium_key("k").port(80)).await;
        h.add(svc("ns/m1").ann("metallb.io/allow-shared-ip", "k").port(80))
            .await;
        assert_eq!(h.ips("ns/c1"), "10.0.10.1");
        assert_eq!(h.ips("ns/m1"), "10.0.10.2");
        h.delete("ns/plain").await;
        h.add(svc("ns/c2").cilium_key("k").port(81)).await;
        h.add(svc("ns/m2").ann("metallb.io/allow-shared-ip", "k").port(81))
            .await;
        assert_eq!(h.ips("ns/c2"), "10.0.10.1");
        assert_eq!(h.ips("ns/m2"), "10.0.10.0");
    }

    /// `metallb.io/address-pool` names IPAddressPools only (docs/cilium.md
    /// §4.1).
    #[tokio::test]
    async fn address_pool_naming_a_cilium_pool_is_unknown() {
        let h = Harness::synced().await;
        h.cilium_pool("c", blocks(&["10.0.10.0/24"])).await;
        h.take();
        h.add(svc("ns/a").ann("metallb.io/address-pool", "c")).await;
        assert_eq!(h.ips("ns/a"), "");
        assert_eq!(
            warnings(&h.take()),
            [
                r#"ns/a AllocationFailed: Failed to allocate IP for "ns/a": unknown pool "c" (a CiliumLoadBalancerIPPool "c" exists; Cilium pools are chosen by their serviceSelector)"#
            ]
        );
        assert_eq!(h.cilium("ns/a"), NO_POOL);
    }

    /// A requested address in a disabled pool: Cilium skips the pool's
    /// ranges, so no pool contains it (docs/cilium.md §2.5).
    #[tokio::test]
    async fn requested_address_in_a_disabled_pool() {
        let h = Harness::synced().await;
        h.cilium_pool(
            "c",
            json!({"blocks": [{"cidr": "10.0.10.0/24"}], "disabled": true}),
        )
        .await;
        h.add(svc("ns/a").cilium_ips("10.0.10.5")).await;
        assert_eq!(
            h.cilium("ns/a"),
            "False no_pool: No pool exists with a CIDR containing '10.0.10.5'"
        );
        h.add(svc("ns/b")).await;
        assert_eq!(h.cilium("ns/b"), NO_POOL);
    }
}

mod families {
    use super::*;

    /// A PreferDualStack Service half-served: Cilium's reason for the
    /// missing family (docs/cilium.md §3.5, §3.6).
    #[tokio::test]
    async fn half_served_prefer_dual_stack_is_unsatisfied() {
        let h = Harness::synced().await;
        h.cilium_pool("c", blocks(&["10.0.10.0/24"])).await;
        let dual = |key: &str| {
            svc(key)
                .set(&["spec", "clusterIPs"], json!(["10.96.0.11", "fd96::11"]))
                .set(&["spec", "ipFamilies"], json!(["IPv4", "IPv6"]))
                .set(&["spec", "ipFamilyPolicy"], json!("PreferDualStack"))
        };
        h.add(dual("ns/a")).await;
        assert_eq!(h.ips("ns/a"), "10.0.10.0");
        assert_eq!(h.cilium("ns/a"), NO_POOL);
        // Its pool has IPv6 addresses, none free.
        h.cilium_pool("c", blocks(&["10.0.10.0/24", "fd00:10::1/128"]))
            .await;
        h.add(dual("ns/b")).await;
        assert_eq!(h.ips("ns/a"), "10.0.10.0 fd00:10::1");
        assert_eq!(h.cilium("ns/a"), SATISFIED);
        assert_eq!(h.ips("ns/b"), "10.0.10.1");
        assert_eq!(
            h.cilium("ns/b"),
            "False out_of_ips: All enabled CiliumLoadBalancerIPPools that match this service \
             ran out of allocatable IPs"
        );
    }

    /// Requested addresses of two families from two Cilium pools
    /// (docs/cilium.md §4.3 item 4).
    #[tokio::test]
    async fn requested_pair_from_two_cilium_pools() {
        let h = Harness::synced().await;
        h.cilium_pool("c4", blocks(&["10.0.10.0/24"])).await;
        h.cilium_pool("c6", blocks(&["fd00:10::/120"])).await;
        h.add(
            svc("ns/a")
                .cilium_ips("10.0.10.5,fd00:10::5")
                .set(&["spec", "clusterIPs"], json!(["10.96.0.11", "fd96::11"]))
                .set(&["spec", "ipFamilyPolicy"], json!("RequireDualStack")),
        )
        .await;
        assert_eq!(h.ips("ns/a"), "10.0.10.5 fd00:10::5");
        assert_eq!(h.cilium("ns/a"), SATISFIED);
    }

    fn require_dual(key: &str) -> Svc {
        svc(key)
            .set(&["spec", "clusterIPs"], json!(["10.96.0.11", "fd96::11"]))
            .set(&["spec", "ipFamilies"], json!(["IPv4", "IPv6"]))
            .set(&["spec", "ipFamilyPolicy"], json!("RequireDualStack"))
    }

    /// `"key Reason: message"` of every Normal event.
    fn normal_events(records: &[Record]) -> Vec<String> {
        records
            .iter()
            .filter_map(|r| match r {
                Record::Event {
                    key,
                    event_type: EventType::Normal,
                    reason,
                    message,
                } => Some(format!("{key} {reason}: {message}")),
                _ => None,
            })
            .collect()
    }

    /// No one pool has both families: one from each Cilium pool; the pool
    /// of one family removed, only that family's address moves
    /// (docs/cilium.md §3.5, §4.3 item 4).
    #[tokio::test]
    async fn dual_stack_from_two_cilium_pools_and_one_removed() {
        let h = Harness::synced().await;
        h.cilium_pool("c4", blocks(&["10.0.10.0/24"])).await;
        h.cilium_pool("c6", blocks(&["fd00:10::/120"])).await;
        h.add(require_dual("ns/a")).await;
        assert_eq!(h.ips("ns/a"), "10.0.10.0 fd00:10::");
        assert_eq!(h.cilium("ns/a"), SATISFIED);
        h.cilium_pool("d6", blocks(&["fd00:20::/120"])).await;
        h.take();
        h.delete_cilium_pool("c6").await;
        assert_eq!(h.ips("ns/a"), "10.0.10.0 fd00:20::");
        assert_eq!(h.cilium("ns/a"), SATISFIED);
        let records = h.take();
        assert_eq!(
            normal_events(&records),
            [
                r#"ns/a ClearAssignment: current IP ["fd00:10::"] not allowed by config, clearing: fd00:10:: is not in any pool"#,
                r#"ns/a IPAllocated: Assigned IP ["10.0.10.0" "fd00:20::"]"#,
            ]
        );
        // No IPv6 pool left: a RequireDualStack Service gets both or none.
        h.delete_cilium_pool("d6").await;
        assert_eq!(h.ips("ns/a"), "");
    }

    /// A PreferDualStack Service held in a Cilium pool with no IPv6 waits
    /// for one from another Cilium pool that serves it, and is woken by a
    /// delete there.
    #[tokio::test]
    async fn half_served_in_a_cilium_pool_completes_from_another() {
        let h = Harness::synced().await;
        h.cilium_pool("c4", blocks(&["10.0.10.0/24"])).await;
        h.cilium_pool("c6", blocks(&["fd00:10::/128"])).await;
        let prefer = |key: &str| {
            require_dual(key).set(&["spec", "ipFamilyPolicy"], json!("PreferDualStack"))
        };
        h.add(prefer("ns/a")).await;
        assert_eq!(h.ips("ns/a"), "10.0.10.0 fd00:10::");
        h.add(prefer("ns/b")).await;
        assert_eq!(h.ips("ns/b"), "10.0.10.1");
        h.delete("ns/a").await;
        assert_eq!(h.ips("ns/b"), "10.0.10.1 fd00:10::");
    }

    /// P unpinned Cilium pools of one IPv6 address each, all held: every
    /// later PreferDualStack Service holds IPv4 and waits on them all,
    /// found and named as one group, not pool by pool (the walk over the
    /// pools took P steps per reconciliation: over P² here). A delete in
    /// any of them still completes the Service that waited longest.
    #[tokio::test]
    async fn waiting_on_many_cilium_pools_costs_no_walk_over_them() {
        const P: usize = 200;
        let h = Harness::synced().await;
        h.cilium_pool("c4", blocks(&["10.0.0.0/16"])).await;
        for p in 0..P {
            let block = format!("fd00:{p:x}::1/128");
            h.cilium_pool(&format!("c6-{p:03}"), blocks(&[block.as_str()]))
                .await;
        }
        let prefer = |key: &str| svc(key).dual("PreferDualStack", false);
        for p in 0..P {
            h.add(prefer(&format!("ns/full-{p:03}"))).await;
        }
        assert_eq!(h.ips("ns/full-077"), "10.0.0.77 fd00:4d::1");
        let before = h.controller.allocator_steps();
        for i in 0..P {
            h.add(prefer(&format!("ns/s{i:03}"))).await;
        }
        let steps = h.controller.allocator_steps() - before;
        assert!(steps <= 20 * P as u64, "{steps} steps for {P} Services");
        assert_eq!(h.ips("ns/s000"), "10.0.0.200");
        h.delete("ns/full-077").await;
        assert_eq!(h.ips("ns/s000"), "10.0.0.200 fd00:4d::1");
        assert_eq!(h.ips("ns/s001"), "10.0.0.201");
    }
}

// ----- docs/cilium.md §3.6, §3.7: taking over from Cilium -----

mod takeover {
    use super::*;

    /// A Service as Cilium left it: an address, Cilium's condition from an
    /// older generation, none of ours.
    fn from_cilium(key: &str, ip: &str) -> Svc {
        svc(key)
            .set(&["metadata", "generation"], json!(3))
            .set(
                &["status", "loadBalancer", "ingress"],
                json!([{ "ip": ip }]),
            )
            .set(
                &["status", "conditions"],
                json!([{"type": CILIUM_CONDITION_TYPE, "status": "True",
                        "reason": "satisfied", "message": "", "observedGeneration": 1,
                        "lastTransitionTime": "2024-01-01T00:00:00Z"}]),
            )
    }

    #[tokio::test]
    async fn held_addresses_stay_and_cilium_condition_is_kept() {
        let h = Harness::unsynced(ControllerConfig::default());
        // Before sync: the initial list (queued, decided at sync).
        h.cilium_pool("c", blocks(&["10.0.10.0/24"])).await;
        h.add(from_cilium("ns/a", "10.0.10.7")).await;
        h.add(from_cilium("ns/b", "10.0.10.3").cilium_ips("10.0.10.3"))
            .await;
        h.sync().await;
        assert_eq!(h.ips("ns/a"), "10.0.10.7");
        assert_eq!(h.ips("ns/b"), "10.0.10.3");
        let records = h.take();
        // No address moved: only our own condition was added.
        assert_eq!(
            every_write(&records),
            ["ns/a <- 10.0.10.7", "ns/b <- 10.0.10.3"]
        );
        assert!(
            !records.iter().any(|r| matches!(r, Record::Event { .. })),
            "{records:?}"
        );
        assert_eq!(h.cilium("ns/a"), SATISFIED);
        // A restart now (everything shows what it holds) writes nothing.
        let again = Harness::unsynced(ControllerConfig::default());
        again.cilium_pool("c", blocks(&["10.0.10.0/24"])).await;
        for key in ["ns/a", "ns/b"] {
            let shown = Svc(serde_json::to_value(&*h.service(key)).unwrap());
            again.add(shown).await;
        }
        again.sync().await;
        assert_eq!(again.take(), Vec::<Record>::new());
    }

    /// At a restart the pool of one family is gone: the other address
    /// stays, the missing family comes from another Cilium pool.
    #[tokio::test]
    async fn a_pair_whose_ipv6_pool_is_gone_keeps_its_ipv4_address() {
        let h = Harness::unsynced(ControllerConfig::default());
        h.cilium_pool("c4", blocks(&["10.0.10.0/24"])).await;
        h.cilium_pool("d6", blocks(&["fd00:20::/120"])).await;
        h.add(
            from_cilium("ns/a", "10.0.10.7")
                .set(&["spec", "clusterIPs"], json!(["10.96.0.11", "fd96::11"]))
                .set(&["spec", "ipFamilies"], json!(["IPv4", "IPv6"]))
                .set(&["spec", "ipFamilyPolicy"], json!("RequireDualStack"))
                .set(
                    &["status", "loadBalancer", "ingress"],
                    json!([{ "ip": "10.0.10.7" }, { "ip": "fd00:10::9" }]),
                ),
        )
        .await;
        h.sync().await;
        assert_eq!(h.ips("ns/a"), "10.0.10.7 fd00:20::");
        assert_eq!(h.cilium("ns/a"), SATISFIED);
    }

    /// A recorded Cilium cluster with a Service whose IPv4 address is in
    /// one pool and IPv6 in another replays with no address moved
    /// (docs/cilium.md §3.7, docs/allocation.md §4.5).
    #[tokio::test]
    async fn a_pair_in_two_cilium_pools_stays() {
        let h = Harness::unsynced(ControllerConfig::default());
        h.cilium_pool("c4", blocks(&["10.0.10.0/24"])).await;
        h.cilium_pool("c6", blocks(&["fd00:10::/120"])).await;
        let dual = |key: &str, ips: &[&str]| {
            let ingress: Vec<Value> = ips.iter().map(|ip| json!({ "ip": ip })).collect();
            from_cilium(key, ips[0])
                .set(&["spec", "clusterIPs"], json!(["10.96.0.11", "fd96::11"]))
                .set(&["spec", "ipFamilies"], json!(["IPv4", "IPv6"]))
                .set(&["spec", "ipFamilyPolicy"], json!("RequireDualStack"))
                .set(&["status", "loadBalancer", "ingress"], json!(ingress))
        };
        h.add(dual("ns/a", &["10.0.10.7", "fd00:10::9"])).await;
        h.add(dual("ns/b", &["10.0.10.3", "fd00:10::2"]).cilium_ips("10.0.10.3,fd00:10::2"))
            .await;
        h.add(
            from_cilium("ns/c", "fd00:10::7")
                .set(&["spec", "clusterIPs"], json!(["fd96::12"]))
                .set(&["spec", "ipFamilies"], json!(["IPv6"])),
        )
        .await;
        h.sync().await;
        assert_eq!(h.ips("ns/a"), "10.0.10.7 fd00:10::9");
        assert_eq!(h.ips("ns/b"), "10.0.10.3 fd00:10::2");
        assert_eq!(h.ips("ns/c"), "fd00:10::7");
        let records = h.take();
        assert_eq!(
            every_write(&records),
            [
                "ns/a <- 10.0.10.7 fd00:10::9",
                "ns/b <- 10.0.10.3 fd00:10::2",
                "ns/c <- fd00:10::7"
            ]
        );
        assert!(
            !records.iter().any(|r| matches!(r, Record::Event { .. })),
            "{records:?}"
        );
        assert_eq!(h.cilium("ns/a"), SATISFIED);
        assert_eq!(h.cilium("ns/b"), SATISFIED);
        // A restart now writes nothing.
        let again = Harness::unsynced(ControllerConfig::default());
        again.cilium_pool("c4", blocks(&["10.0.10.0/24"])).await;
        again.cilium_pool("c6", blocks(&["fd00:10::/120"])).await;
        for key in ["ns/a", "ns/b", "ns/c"] {
            let shown = Svc(serde_json::to_value(&*h.service(key)).unwrap());
            again.add(shown).await;
        }
        again.sync().await;
        assert_eq!(again.take(), Vec::<Record>::new());
    }
}

// ----- the speed shortcuts change nothing (ControllerConfig::exhaustive) -----

mod shortcuts {
    use super::*;

    /// What one step left: its writes and Events, every Service's
    /// addresses and Cilium condition.
    use support::Step;

    const KEYS: [&str; 8] = [
        "ns/a", "ns/b", "ns/c", "ns/d", "ns/e", "ns/f", "ns/g", "ns/h",
    ];

    fn step(h: &Harness) -> Step {
        support::step(h, &KEYS, |key| {
            format!("{} / {}", h.ips(key), h.cilium(key))
        })
    }

    fn with_status(svc: Svc, ip: &str) -> Svc {
        svc.set(
            &["status", "loadBalancer", "ingress"],
            json!([{ "ip": ip }]),
        )
    }

    /// Cilium pools and keys through every shortcut: Services kept at sync
    /// (settled in the second pass), echoes of our writes, Services
    /// waiting in one demand class woken by a delete, pool changes that
    /// touch only some holders, a pool deleted under its holders, a
    /// sharing key moved.
    async fn cilium_steps(config: ControllerConfig) -> (Vec<Step>, u64) {
        let h = Harness::unsynced(config);
        let mut steps = Vec::new();
        h.cilium_pool("c", blocks(&["10.0.10.0/30"])).await;
        h.add(with_status(svc("ns/a"), "10.0.10.1")).await;
        h.add(with_status(
            svc("ns/b").cilium_key("k").port(80),
            "10.0.10.2",
        ))
        .await;
        h.add(with_status(svc("ns/c"), "10.0.99.9")).await;
        h.sync().await;
        steps.push(step(&h));
        for key in ["ns/d", "ns/e", "ns/f", "ns/g"] {
            h.add(svc(key)).await;
            steps.push(step(&h));
        }
        h.add(svc("ns/h").cilium_key("k").port(81)).await;
        steps.push(step(&h));
        h.edit("ns/a", |s| s.label("tier", "front")).await;
        steps.push(step(&h));
        h.delete("ns/a").await;
        steps.push(step(&h));
        h.cilium_pool("d", blocks(&["10.0.12.0/31"])).await;
        steps.push(step(&h));
        h.cilium_pool("c", blocks(&["10.0.10.0/30", "10.0.11.0/31"]))
            .await;
        steps.push(step(&h));
        h.edit("ns/h", |s| s.cilium_key("other")).await;
        steps.push(step(&h));
        h.delete_cilium_pool("d").await;
        steps.push(step(&h));
        h.pool("m", addrs(&["10.0.20.0/31"])).await;
        steps.push(step(&h));
        h.delete("ns/b").await;
        steps.push(step(&h));
        h.delete_cilium_pool("c").await;
        steps.push(step(&h));
        (steps, h.controller.stats().reconciliations)
    }

    /// Half-served PreferDualStack Services held in a Cilium pool, waiting
    /// for IPv6 on the Cilium pools that serve them (unpinned ones, and
    /// one pinned by a label) as groups: each step the same as when every
    /// waiting Service is run again, through deletes in either group, one
    /// in a MetalLB pool that cannot serve them, a label change, a pinned
    /// pool changed under its holder and a pool deleted.
    async fn half_served_steps(config: ControllerConfig) -> Vec<Step> {
        let h = Harness::unsynced(config);
        let mut steps = Vec::new();
        let front = json!({ "matchLabels": { "tier": "front" } });
        let pinned = |selector: &Value| json!({ "blocks": [{ "cidr": "fd00:20::1/128" }], "serviceSelector": selector });
        h.cilium_pool("c4", blocks(&["10.0.10.0/29"])).await;
        h.cilium_pool("c6", blocks(&["fd00:10::/127"])).await;
        h.cilium_pool("p6", pinned(&front)).await;
        h.pool("m6", addrs(&["fd00:30::/127"])).await;
        h.sync().await;
        let prefer = |key: &str| svc(key).dual("PreferDualStack", false);
        for key in ["ns/a", "ns/b"] {
            h.add(prefer(key)).await;
            steps.push(step(&h));
        }
        h.add(prefer("ns/c").label("tier", "front")).await;
        steps.push(step(&h));
        h.add(prefer("ns/d")).await;
        steps.push(step(&h));
        h.add(prefer("ns/e").label("tier", "front")).await;
        steps.push(step(&h));
        h.add(svc("ns/f").v6()).await;
        steps.push(step(&h));
        for key in ["ns/f", "ns/c"] {
            h.delete(key).await;
            steps.push(step(&h));
        }
        h.edit("ns/d", |s| s.label("tier", "front")).await;
        steps.push(step(&h));
        h.delete("ns/a").await;
        steps.push(step(&h));
        h.add(prefer("ns/g").label("tier", "front")).await;
        steps.push(step(&h));
        let back = json!({ "matchLabels": { "tier": "back" } });
        h.cilium_pool("p6", pinned(&back)).await;
        steps.push(step(&h));
        h.delete("ns/b").await;
        steps.push(step(&h));
        h.delete_cilium_pool("c6").await;
        steps.push(step(&h));
        steps
    }

    #[tokio::test]
    async fn half_served_cilium_waits_give_the_same_result_without_shortcuts() {
        let fast = half_served_steps(ControllerConfig::default()).await;
        let full = half_served_steps(support::exhaustive()).await;
        support::assert_same_steps(&fast, &full);
        // Two waited for IPv6 and got it from a pool of their groups: e
        // from the pinned one, d from an unpinned one.
        let shown = |line: &str| {
            fast.iter()
                .any(|(_, shown)| shown.iter().any(|s| s.starts_with(line)))
        };
        assert!(shown("ns/e: 10.0.10.4 / False"), "{fast:#?}");
        assert!(shown("ns/e: 10.0.10.4 fd00:20::1 / True"), "{fast:#?}");
        assert!(shown("ns/d: 10.0.10.3 / False"), "{fast:#?}");
        assert!(shown("ns/d: 10.0.10.3 fd00:10:: / True"), "{fast:#?}");
    }

    #[tokio::test]
    async fn cilium_pools_and_keys_give_the_same_result_without_shortcuts() {
        let (fast, fast_work) = cilium_steps(ControllerConfig::default()).await;
        let (full, full_work) = cilium_steps(support::exhaustive()).await;
        support::assert_same_steps(&fast, &full);
        // The scenario takes shortcuts, and some Service waited and got
        // an address later.
        assert!(fast_work < full_work, "{fast_work} vs {full_work}");
        let waited = |key: &str| {
            let waiting = format!("{key}:  / False out_of_ips");
            let served = format!("{key}: 10.");
            fast.iter()
                .position(|(_, shown)| shown.iter().any(|s| s.starts_with(&waiting)))
                .is_some_and(|from| {
                    fast[from..]
                        .iter()
                        .any(|(_, shown)| shown.iter().any(|s| s.starts_with(&served)))
                })
        };
        assert!(
            KEYS.iter().filter(|key| waited(key)).count() >= 2,
            "{fast:#?}"
        );
    }
}
