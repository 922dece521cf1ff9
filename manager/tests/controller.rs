//! The Manager and the AllocatingController together, against an in-memory
//! client that writes into the shared cache and echoes every write back as a
//! watch would: one or more tests for every rule of docs/allocation.md §4 and §5.
//!
//! Each module is named after the section it covers; every step of a test
//! waits for the manager to be idle and checks the controller's invariants
//! (docs/allocation.md §6).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use manager::{ControllerConfig, EventType, CONDITION_TYPE, POOL_ANNOTATION};
use serde_json::{json, Value};
use support::{addrs, events, log, messages, svc, writes, Harness, Record, Svc};

// ----- docs/allocation.md §4.1: which Services -----

mod s4_1_which_services {
    use super::*;

    #[tokio::test]
    async fn services_that_are_not_load_balancers_are_ignored() {
        let h = Harness::with_pools(&[("a", addrs(&["10.0.0.1-10.0.0.3"]))]).await;
        h.add(svc("ns/cip").kind("ClusterIP")).await;
        h.add(svc("ns/np").kind("NodePort")).await;
        h.add(svc("ns/ext").kind("ExternalName")).await;
        assert!(h.take().is_empty());
        assert!(h.controller.holdings().is_empty());
        h.add(svc("ns/lb")).await;
        assert_eq!(h.status("ns/lb"), "10.0.0.1 @a");
        assert_eq!(h.status("ns/cip"), "none");
    }

    #[tokio::test]
    async fn leaving_load_balancer_releases_clears_status_and_annotation_without_event() {
        let h = Harness::with_pools(&[("a", addrs(&["10.0.0.1"]))]).await;
        h.add(svc("ns/a")).await;
        h.add(svc("ns/w")).await;
        assert_eq!(h.status("ns/a"), "10.0.0.1 @a");
        assert_eq!(h.waiting(), ["ns/w"]);
        h.take();

        h.edit("ns/a", |s| s.kind("ClusterIP")).await;
        // Cleared without any event for `a`; the release wakes `w` (§4.6).
        assert_eq!(
            log(&h.take()),
            [
                "ns/a <-  @-",
                "ns/w <- 10.0.0.1 @a",
                "ns/w Normal IPAllocated"
            ]
        );
        assert_eq!(h.status("ns/a"), "none");
        let a = h.service("ns/a");
        assert!(!a
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|an| an.contains_key(POOL_ANNOTATION)));
        assert_eq!(h.status("ns/w"), "10.0.0.1 @a");

        // Back to LoadBalancer: a new Service again, waiting now.
        h.edit("ns/a", |s| s.kind("LoadBalancer")).await;
        assert_eq!(events(&h.take()), ["ns/a Warning AllocationFailed"]);
        assert_eq!(h.waiting(), ["ns/a"]);
    }

    // Two hosts with different classes share the annotation name: a host
    // must not clear the status the other class's host wrote (§4.1).
    #[tokio::test]
    async fn a_service_of_another_class_keeps_the_status_its_own_host_wrote() {
        let h = Harness::with(ControllerConfig::default().lb_class("x"), None);
        h.pool("a", addrs(&["10.0.0.1-10.0.0.3"])).await;
        h.sync().await;
        h.add(svc("ns/y").class("y").held(&["10.0.0.1"], "other"))
            .await;
        assert_eq!(log(&h.take()), Vec::<String>::new());
        assert_eq!(h.status("ns/y"), "10.0.0.1 @other");
    }

    #[tokio::test]
    async fn a_service_of_another_class_with_a_foreign_status_is_left_alone() {
        // Without our annotation the status is not ours to clear.
        let h = Harness::with_pools(&[("a", addrs(&["10.0.0.1-10.0.0.3"]))]).await;
        h.add(svc("ns/y").class("y").status(&["10.0.0.1"])).await;
        assert!(h.take().is_empty());
        h.add(svc("ns/mine")).await;
        assert_eq!(h.status("ns/mine"), "10.0.0.1 @a");
    }
}

// ----- docs/allocation.md §4.2: what a Service may ask for -----

mod s4_2_requests {
    use super::*;

    async fn two_pools() -> Harness {
        Harness::with_pools(&[
            ("a", addrs(&["10.0.0.1-10.0.0.5", "fd00::1-fd00::5"])),
            (
                "b",
                json!({"addresses": ["10.0.1.1-10.0.1.3"], "autoAssign": false}),
            ),
        ])
        .await
    }

    #[tokio::test]
    async fn the_new_prefix_wins_and_an_overridden_old_one_is_not_reported() {
        let h = two_pools().await;
        h.add(
            svc("ns/a")
                .ann("metallb.universe.tf/loadBalancerIPs", "10.0.0.3")
                .request("10.0.0.2")
                .ann("metallb.universe.tf/address-pool", "b")
                .in_pool("a"),
        )
        .await;
        assert_eq!(h.status("ns/a"), "10.0.0.2 @a");
        assert_eq!(events(&h.take()), ["ns/a Normal IPAllocated"]);
    }

    #[tokio::test]
    async fn invalid_requests_are_load_balancer_failed_and_get_nothing() {
        let h = two_pools().await;
        h.add(svc("ns/both").request("10.0.0.1").lb_ip("10.0.0.1"))
            .await;
        h.add(svc("ns/garbage").request("10.0.0.x")).await;
        h.add(svc("ns/spec-garbage").lb_ip("nope")).await;
        h.add(svc("ns/two-v4").request("10.0.0.1, 10.0.0.2")).await;
        h.add(svc("ns/two-v6").request("fd00::1,fd00::2")).await;
        let records = h.take();
        assert!(writes(&records).is_empty());
        assert_eq!(
            events(&records),
            [
                "ns/both Warning LoadBalancerFailed",
                "ns/garbage Warning LoadBalancerFailed",
                "ns/spec-garbage Warning LoadBalancerFailed",
                "ns/two-v4 Warning LoadBalancerFailed",
                "ns/two-v6 Warning LoadBalancerFailed"
            ]
        );
        let messages = messages(&records);
        assert!(messages[0]
            .contains("both the metallb.io/loadBalancerIPs annotation and spec.loadBalancerIP"));
        assert!(messages[1].contains("\"10.0.0.x\" is not an IP address"));
        assert!(messages[2].contains("spec.loadBalancerIP: \"nope\""));
        assert!(messages[3].contains("more than one IPv4 address"));
        assert!(messages[4].contains("more than one IPv6 address"));
        // An invalid request is not waiting (§4.6).
        assert!(h.waiting().is_empty());
        assert!(h.controller.holdings().is_empty());
    }

    #[tokio::test]
    async fn a_holder_keeps_its_addresses_on_an_invalid_request() {
        let h = two_pools().await;
        h.add(svc("ns/a")).await;
        h.take();
        h.edit("ns/a", |s| s.request("10.0.0.1,10.0.0.2")).await;
        assert_eq!(log(&h.take()), ["ns/a Warning LoadBalancerFailed"]);
        assert_eq!(h.status("ns/a"), "10.0.0.1 @a");
        assert!(h.waiting().is_empty());
        // Another invalid request: another warning, still kept.
        h.edit("ns/a", |s| s.request("bad")).await;
        assert_eq!(log(&h.take()), ["ns/a Warning LoadBalancerFailed"]);
        assert_eq!(h.status("ns/a"), "10.0.0.1 @a");
        // Nobody else can take it meanwhile.
        h.add(svc("ns/b").request("10.0.0.1")).await;
        assert_eq!(events(&h.take()), ["ns/b Warning AllocationFailed"]);
        // A valid request again: moved exactly.
        h.edit("ns/a", |s| s.request("10.0.0.2")).await;
        assert_eq!(h.status("ns/a"), "10.0.0.2 @a");
        assert_eq!(
            events(&h.take()),
            [
                "ns/a Normal ClearAssignment",
                "ns/a Normal IPAllocated",
                // `b` waited for 10.0.0.1, which `a` just released (§4.6).
                "ns/b Normal IPAllocated"
            ]
        );
        assert_eq!(h.status("ns/b"), "10.0.0.1 @a");
    }

    #[tokio::test]
    async fn requested_addresses_of_the_wrong_family_fail() {
        let h = two_pools().await;
        h.add(svc("ns/v4-asks-v6").request("fd00::1")).await;
        h.add(svc("ns/v6-asks-v4").v6().lb_ip("10.0.0.1")).await;
        // A RequireDualStack Service that requests must request one of
        // each; a PreferDualStack one may ask for one address of either
        // family and then holds just that one (§4.2).
        h.add(
            svc("ns/dual-asks-one")
                .dual("RequireDualStack", false)
                .request("10.0.0.2"),
        )
        .await;
        h.add(
            svc("ns/prefer-asks-one")
                .dual("PreferDualStack", false)
                .request("fd00::4"),
        )
        .await;
        let records = h.take();
        assert_eq!(
            events(&records),
            [
                "ns/v4-asks-v6 Warning AllocationFailed",
                "ns/v6-asks-v4 Warning AllocationFailed",
                "ns/dual-asks-one Warning AllocationFailed",
                "ns/prefer-asks-one Normal IPAllocated"
            ]
        );
        for message in messages(&records).iter().take(3) {
            assert!(
                message.contains("do not match the service's IP families"),
                "{message}"
            );
        }
        assert_eq!(writes(&records), ["ns/prefer-asks-one <- fd00::4 @a"]);
        // Complete: it does not wait for the other family.
        assert!(!h.waiting().contains(&"ns/prefer-asks-one".to_owned()));
        // One of each, but from two pools.
        h.add(
            svc("ns/split")
                .dual("RequireDualStack", false)
                .request("10.0.1.1,fd00::3"),
        )
        .await;
        assert_eq!(
            messages(&h.take()),
            [
                "ns/split AllocationFailed: Failed to allocate IP for \"ns/split\": \
                 10.0.1.1 and fd00::3 are in different pools (\"b\", \"a\")"
            ]
        );
        // Both families, in any order: IPv4 first in the status.
        h.add(
            svc("ns/dual")
                .dual("RequireDualStack", true)
                .request("fd00::2, 10.0.0.2"),
        )
        .await;
        assert_eq!(h.status("ns/dual"), "10.0.0.2 fd00::2 @a");
    }

    #[tokio::test]
    async fn address_pool_annotation_selects_the_pool_even_without_auto_assign() {
        let h = Harness::with_pools(&[
            ("a", addrs(&["10.0.0.1"])),
            (
                "b",
                json!({"addresses": ["10.0.1.1-10.0.1.3"], "autoAssign": false}),
            ),
        ])
        .await;
        h.add(svc("ns/x").in_pool("b")).await;
        h.add(svc("ns/y")).await;
        assert_eq!(h.status("ns/x"), "10.0.1.1 @b");
        assert_eq!(h.status("ns/y"), "10.0.0.1 @a");
        h.take();
        // `a` is full and `b` is not for automatic allocation.
        h.add(svc("ns/z")).await;
        assert_eq!(
            messages(&h.take()),
            [
                "ns/z AllocationFailed: Failed to allocate IP for \"ns/z\": no available IPs: \
                 no pool has an IPv4 address free (tried a)"
            ]
        );
        assert_eq!(h.status("ns/z"), "none");
        // Naming `a` while it is full fails too; naming `b` works.
        h.add(svc("ns/w").in_pool("a")).await;
        assert_eq!(events(&h.take()), ["ns/w Warning AllocationFailed"]);
        h.edit("ns/w", |s| s.in_pool("b")).await;
        assert_eq!(h.status("ns/w"), "10.0.1.2 @b");
    }

    #[tokio::test]
    async fn a_requested_pool_that_does_not_serve_or_does_not_exist_fails() {
        let h = Harness::with_pools(&[
            (
                "p",
                json!({
                    "addresses": ["10.0.2.1-10.0.2.3"],
                    "serviceAllocation": {"namespaces": ["other"]},
                }),
            ),
            ("q", addrs(&["10.0.0.1-10.0.0.3"])),
        ])
        .await;
        h.add(svc("ns/s").in_pool("p")).await;
        h.add(svc("ns/t").in_pool("nope")).await;
        let records = h.take();
        assert_eq!(
            messages(&records),
            [
                "ns/s AllocationFailed: Failed to allocate IP for \"ns/s\": \
                 pool \"p\" does not serve this service",
                "ns/t AllocationFailed: Failed to allocate IP for \"ns/t\": unknown pool \"nope\""
            ]
        );
        assert!(writes(&records).is_empty());
        assert_eq!(h.waiting(), ["ns/s", "ns/t"]);
        // A Service the pool serves gets it.
        h.add(svc("other/u").in_pool("p")).await;
        assert_eq!(h.status("other/u"), "10.0.2.1 @p");
        // A requested address in a pool that does not serve fails too.
        h.add(svc("ns/v").request("10.0.2.2")).await;
        assert!(messages(&h.take())
            .contains(&"ns/v AllocationFailed: Failed to allocate IP for \"ns/v\": pool \"p\" does not serve this service".to_owned()));
    }
}

// ----- docs/allocation.md §4.3: address family -----

mod s4_3_families {
    use super::*;

    #[tokio::test]
    async fn a_single_stack_service_gets_its_cluster_ip_family() {
        let h =
            Harness::with_pools(&[("a", addrs(&["fd00::1-fd00::3", "10.0.0.1-10.0.0.3"]))]).await;
        h.add(svc("ns/v4")).await;
        h.add(svc("ns/v6").v6()).await;
        assert_eq!(h.status("ns/v4"), "10.0.0.1 @a");
        assert_eq!(h.status("ns/v6"), "fd00::1 @a");
        // The old single clusterIP field alone is enough.
        h.add(svc("ns/old").unset(&["spec", "clusterIPs"])).await;
        assert_eq!(h.status("ns/old"), "10.0.0.2 @a");
    }

    #[tokio::test]
    async fn prefer_dual_stack_falls_back_to_one_family_then_completes() {
        let h = Harness::with_pools(&[("a", addrs(&["10.0.0.1-10.0.0.2", "fd00::1"]))]).await;
        h.add(svc("ns/t").v6()).await;
        h.take();
        h.add(svc("ns/p").dual("PreferDualStack", false)).await;
        assert_eq!(h.status("ns/p"), "10.0.0.1 @a");
        assert_eq!(
            messages(&h.take()),
            ["ns/p IPAllocated: Assigned IP [\"10.0.0.1\"]"]
        );
        // Holding one family, it waits for the other (§4.4 step 1).
        assert_eq!(h.waiting(), ["ns/p"]);
        // Only from the same pool: a free IPv6 elsewhere does not count.
        h.pool("b", addrs(&["fd00:9::1"])).await;
        assert_eq!(h.status("ns/p"), "10.0.0.1 @a");
        assert!(h.take().is_empty());
        h.delete("ns/t").await;
        assert_eq!(h.status("ns/p"), "10.0.0.1 fd00::1 @a");
        assert_eq!(
            messages(&h.take()),
            ["ns/p IPAllocated: Assigned IP [\"10.0.0.1\" \"fd00::1\"]"]
        );
        assert!(h.waiting().is_empty());
    }

    #[tokio::test]
    async fn prefer_dual_stack_completes_with_ipv4_when_ipv6_came_first() {
        let h = Harness::with_pools(&[("a", addrs(&["10.0.0.1", "fd00::1-fd00::2"]))]).await;
        h.add(svc("ns/t")).await;
        h.add(svc("ns/p").dual("PreferDualStack", true)).await;
        assert_eq!(h.status("ns/p"), "fd00::1 @a");
        h.delete("ns/t").await;
        // IPv4 first in the status, whatever the primary family.
        assert_eq!(h.status("ns/p"), "10.0.0.1 fd00::1 @a");
    }

    #[tokio::test]
    async fn prefer_dual_stack_picks_a_pool_with_both_then_primary_then_other() {
        let h = Harness::with_pools(&[
            ("a", addrs(&["10.0.0.1-10.0.0.2"])),
            ("b", addrs(&["fd00::1"])),
            ("c", addrs(&["fd00:2::1", "10.0.2.1"])),
        ])
        .await;
        // `c` is the only pool with both: it wins though `a` comes first.
        h.add(svc("ns/p1").dual("PreferDualStack", false)).await;
        assert_eq!(h.status("ns/p1"), "10.0.2.1 fd00:2::1 @c");
        // None has both: the primary family first...
        h.add(svc("ns/p2").dual("PreferDualStack", true)).await;
        assert_eq!(h.status("ns/p2"), "fd00::1 @b");
        h.add(svc("ns/p3").dual("PreferDualStack", false)).await;
        assert_eq!(h.status("ns/p3"), "10.0.0.1 @a");
        // ...else the other family.
        h.add(svc("ns/p4").dual("PreferDualStack", true)).await;
        assert_eq!(h.status("ns/p4"), "10.0.0.2 @a");
        h.add(svc("ns/p5").dual("PreferDualStack", true)).await;
        assert_eq!(h.status("ns/p5"), "none");
    }

    #[tokio::test]
    async fn a_service_without_cluster_ip_gets_no_address() {
        let h = Harness::with_pools(&[("a", addrs(&["10.0.0.1-10.0.0.3"]))]).await;
        h.add(svc("ns/headless").headless()).await;
        // The store, as an API server, gives every new Service a cluster IP
        // but an ExternalName one, and keeps it on an update: created as
        // ExternalName without one, then made a LoadBalancer, `none` has
        // none (the object is the LoadBalancer Service without clusterIP).
        h.add(
            svc("ns/none")
                .kind("ExternalName")
                .unset(&["spec", "clusterIP"])
                .unset(&["spec", "clusterIPs"]),
        )
        .await;
        h.edit("ns/none", |s| s.kind("LoadBalancer")).await;
        let spec = h.service("ns/none").spec.clone().unwrap();
        assert_eq!((spec.cluster_ip, spec.cluster_ips), (None, None));
        let records = h.take();
        assert!(writes(&records).is_empty());
        assert_eq!(
            messages(&records),
            [
                "ns/headless AllocationFailed: Failed to allocate IP for \"ns/headless\": \
                 the service has no cluster IP",
                "ns/none AllocationFailed: Failed to allocate IP for \"ns/none\": \
                 the service has no cluster IP"
            ]
        );
        assert!(h.controller.holdings().is_empty());
    }
}

// ----- docs/allocation.md §4.4: choosing addresses -----

mod s4_4_choosing {
    use super::*;

    #[tokio::test]
    async fn a_status_address_in_a_pool_without_auto_assign_is_kept() {
        let h = Harness::new();
        h.pool(
            "manual",
            json!({"addresses": ["10.0.1.1-10.0.1.3"], "autoAssign": false}),
        )
        .await;
        h.add(svc("ns/a").held(&["10.0.1.2"], "manual")).await;
        h.sync().await;
        assert!(h.take().is_empty());
        assert_eq!(h.status("ns/a"), "10.0.1.2 @manual");
        // And on later reconciliations too.
        h.edit("ns/a", |s| s.label("x", "y")).await;
        assert!(h.take().is_empty());
    }

    #[tokio::test]
    async fn clear_assignment_when_the_pool_no_longer_serves_the_service() {
        let h =
            Harness::with_pools(&[("p", addrs(&["10.0.0.1"])), ("q", addrs(&["10.0.1.1"]))]).await;
        h.add(svc("ns/a")).await;
        assert_eq!(h.status("ns/a"), "10.0.0.1 @p");
        h.take();
        h.pool(
            "p",
            json!({"addresses": ["10.0.0.1"], "serviceAllocation": {"namespaces": ["other"]}}),
        )
        .await;
        let records = h.take();
        assert_eq!(
            log(&records),
            // The restore pass announces every ClearAssignment first (§4.5, §4.6).
            [
                "ns/a Normal ClearAssignment",
                "ns/a <- 10.0.1.1 @q",
                "ns/a Normal IPAllocated"
            ]
        );
        assert_eq!(
            messages(&records)[0],
            "ns/a ClearAssignment: current IP [\"10.0.0.1\"] not allowed by config, clearing: \
             pool \"p\" does not serve this service"
        );
    }

    #[tokio::test]
    async fn pools_are_tried_pinned_by_priority_then_name_then_unpinned_by_name() {
        let pinned = |address: &str, priority: Option<i64>, namespace: &str| {
            let mut allocation = json!({ "namespaces": [namespace] });
            if let Some(priority) = priority {
                allocation["priority"] = json!(priority);
            }
            json!({"addresses": [address], "serviceAllocation": allocation})
        };
        let h = Harness::with_pools(&[
            ("b-plain", addrs(&["10.0.0.1"])),
            ("a-plain", addrs(&["10.0.0.2"])),
            ("z-prio1", pinned("10.0.0.3", Some(1), "ns")),
            ("c-prio2", pinned("10.0.0.4", Some(2), "ns")),
            ("b-prio2", pinned("10.0.0.5", Some(2), "ns")),
            ("p-zero", pinned("10.0.0.6", Some(0), "ns")),
            ("p-unset", pinned("10.0.0.7", None, "ns")),
            ("a-other", pinned("10.0.0.8", Some(1), "other")),
            (
                "a-manual",
                json!({"addresses": ["10.0.0.9"], "autoAssign": false}),
            ),
            (
                "a-gold",
                json!({
                    "addresses": ["10.0.0.10"],
                    "serviceAllocation": {
                        "priority": 3,
                        "serviceSelectors": [{"matchLabels": {"tier": "gold"}}],
                    },
                }),
            ),
        ])
        .await;
        for i in 1..=8 {
            h.add(svc(&format!("ns/s{i}"))).await;
        }
        let got: Vec<String> = (1..=8).map(|i| h.status(&format!("ns/s{i}"))).collect();
        assert_eq!(
            got,
            [
                "10.0.0.3 @z-prio1",
                "10.0.0.5 @b-prio2",
                "10.0.0.4 @c-prio2",
                "10.0.0.7 @p-unset",
                "10.0.0.6 @p-zero",
                "10.0.0.2 @a-plain",
                "10.0.0.1 @b-plain",
                "none"
            ]
        );
        let failed = messages(&h.take()).pop().unwrap();
        assert_eq!(
            failed,
            "ns/s8 AllocationFailed: Failed to allocate IP for \"ns/s8\": no available IPs: \
             no pool has an IPv4 address free \
             (tried z-prio1, b-prio2, c-prio2, p-unset, p-zero, a-plain, b-plain)"
        );
        // The selector-pinned pool serves only its Services.
        h.add(svc("ns/gold").label("tier", "gold")).await;
        assert_eq!(h.status("ns/gold"), "10.0.0.10 @a-gold");
    }

    #[tokio::test]
    async fn sharing_services_stack_on_the_lowest_address_where_their_ports_fit() {
        let h = Harness::with_pools(&[("a", addrs(&["10.0.0.1-10.0.0.6"]))]).await;
        h.add(svc("ns/a").shared("k").ports(&[("TCP", 80)])).await;
        h.add(svc("ns/b").shared("k").ports(&[("TCP", 443)])).await;
        h.add(svc("ns/c").shared("k").ports(&[("TCP", 80)])).await;
        h.add(svc("ns/d").ports(&[("TCP", 80)])).await;
        h.add(svc("ns/e").shared("k").ports(&[("TCP", 443)])).await;
        h.add(svc("ns/f").shared("j").ports(&[("TCP", 8080)])).await;
        h.add(svc("ns/g").shared("k").ports(&[("UDP", 80)])).await;
        let got: Vec<String> = ["a", "b", "c", "d", "e", "f", "g"]
            .iter()
            .map(|k| h.status(&format!("ns/{k}")))
            .collect();
        assert_eq!(
            got,
            [
                "10.0.0.1 @a",
                "10.0.0.1 @a",
                "10.0.0.2 @a",
                "10.0.0.3 @a",
                "10.0.0.2 @a",
                "10.0.0.4 @a",
                "10.0.0.1 @a"
            ]
        );
        // 80/TCP frees on 10.0.0.1: the next one stacks there again.
        h.delete("ns/a").await;
        h.add(svc("ns/h").shared("k").ports(&[("TCP", 80)])).await;
        assert_eq!(h.status("ns/h"), "10.0.0.1 @a");
        // A requested shared address with a port in common fails.
        h.take();
        h.add(
            svc("ns/i")
                .shared("k")
                .ports(&[("TCP", 443)])
                .request("10.0.0.1"),
        )
        .await;
        assert_eq!(
            messages(&h.take()),
            [
                "ns/i AllocationFailed: Failed to allocate IP for \"ns/i\": \
                 10.0.0.1 cannot be used: port 443/TCP is already used on it by ns/b"
            ]
        );
    }

    #[tokio::test]
    async fn avoid_buggy_ips_skips_and_releases_dot_zero_and_dot_255() {
        let h = Harness::with_pools(&[("p", addrs(&["10.0.0.255-10.0.1.1"]))]).await;
        h.add(svc("ns/a")).await;
        h.add(svc("ns/b")).await;
        assert_eq!(h.status("ns/a"), "10.0.0.255 @p");
        assert_eq!(h.status("ns/b"), "10.0.1.0 @p");
        h.take();
        h.pool(
            "p",
            json!({"addresses": ["10.0.0.255-10.0.1.2"], "avoidBuggyIPs": true}),
        )
        .await;
        assert_eq!(h.status("ns/a"), "10.0.1.1 @p");
        assert_eq!(h.status("ns/b"), "10.0.1.2 @p");
        let records = h.take();
        assert_eq!(
            events(&records),
            // The restore pass announces every ClearAssignment first (§4.5, §4.6).
            [
                "ns/a Normal ClearAssignment",
                "ns/b Normal ClearAssignment",
                "ns/a Normal IPAllocated",
                "ns/b Normal IPAllocated"
            ]
        );
        assert!(
            messages(&records)[0].ends_with("10.0.0.255 is avoided by pool \"p\" (avoidBuggyIPs)")
        );
        // Nor can they be requested.
        h.add(svc("ns/c").request("10.0.1.0")).await;
        assert_eq!(h.status("ns/c"), "none");
    }
}

// ----- docs/allocation.md §4.5: start, sync and restart -----

mod s4_5_sync {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn nothing_is_decided_or_written_before_sync() {
        let h = Harness::new();
        h.pool("a", addrs(&["10.0.0.1-10.0.0.3"])).await;
        h.namespace("ns", &[("env", "prod")]).await;
        h.add(svc("ns/a")).await;
        h.add(svc("ns/b").held(&["10.0.0.3"], "a")).await;
        h.edit("ns/a", |s| s.label("x", "y")).await;
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(h.take().is_empty());
        assert!(h.controller.holdings().is_empty());
        assert_eq!(h.controller.stats().reconciliations, 0);
        assert!(
            tokio::time::timeout(Duration::from_secs(1), h.manager.idle())
                .await
                .is_err()
        );
        h.sync().await;
        assert_eq!(h.status("ns/a"), "10.0.0.1 @a");
        assert_eq!(h.status("ns/b"), "10.0.0.3 @a");
    }

    /// Services of many kinds, allocated on a fresh controller.
    async fn populated() -> Harness {
        let h = Harness::with_pools(&[
            ("a", addrs(&["10.0.0.1-10.0.0.10", "fd00::1-fd00::5"])),
            (
                "b",
                json!({"addresses": ["10.0.1.1-10.0.1.5"], "autoAssign": false}),
            ),
        ])
        .await;
        h.add(svc("ns/gone")).await;
        h.add(svc("ns/auto")).await;
        h.add(svc("ns/req").request("10.0.0.7")).await;
        h.add(svc("ns/in-b").in_pool("b")).await;
        h.add(svc("ns/sh1").shared("k").ports(&[("TCP", 80)])).await;
        h.add(svc("ns/sh2").shared("k").ports(&[("TCP", 443)]))
            .await;
        h.add(svc("ns/dual").dual("RequireDualStack", true)).await;
        h.add(svc("ns/prefer").dual("PreferDualStack", false)).await;
        h.add(svc("ns/v6").v6()).await;
        h.add(svc("ns/cip").kind("ClusterIP")).await;
        h.delete("ns/gone").await;
        h
    }

    #[tokio::test]
    async fn a_restarted_controller_keeps_every_address_and_writes_nothing() {
        let first = populated().await;
        let statuses: BTreeMap<String, String> = first
            .services()
            .iter()
            .map(|(key, _)| (key.clone(), first.status(key)))
            .collect();
        assert_eq!(statuses["ns/auto"], "10.0.0.2 @a");

        let h = Harness::new();
        let pools: BTreeMap<String, Value> = first
            .pools()
            .iter()
            .map(|pool| {
                (
                    pool.metadata.name.clone().unwrap(),
                    serde_json::to_value(&pool.spec).unwrap(),
                )
            })
            .collect();
        for (name, spec) in pools {
            h.pool(&name, spec).await;
        }
        // Seen in another order than they were allocated in.
        let mut services: Vec<Service> = first
            .services()
            .iter()
            .map(|(_, service)| (**service).clone())
            .collect();
        services.sort_by(|a, b| b.metadata.name.cmp(&a.metadata.name));
        for service in services {
            h.add(Svc(serde_json::to_value(&service).unwrap())).await;
        }
        h.sync().await;
        assert!(h.take().is_empty(), "no write and no event at restart");
        for (key, status) in &statuses {
            assert_eq!(&h.status(key), status, "{key}");
        }
        assert_eq!(h.controller.holdings(), first.controller.holdings());
        assert_eq!(h.controller.pool_stats(), first.controller.pool_stats());
    }

    #[tokio::test]
    async fn of_two_claims_the_first_seen_keeps_and_the_other_moves_after_the_kept() {
        let h = Harness::new();
        h.pool("a", addrs(&["10.0.0.1-10.0.0.5"])).await;
        h.add(svc("ns/e-new")).await;
        h.add(svc("ns/c-first").held(&["10.0.0.1"], "a")).await;
        h.add(svc("ns/b-second").held(&["10.0.0.1"], "a")).await;
        h.add(svc("ns/d-third").held(&["10.0.0.3"], "a")).await;
        h.add(svc("ns/a-new")).await;
        h.sync().await;
        assert_eq!(h.status("ns/c-first"), "10.0.0.1 @a");
        assert_eq!(h.status("ns/d-third"), "10.0.0.3 @a");
        // Released, then re-allocated before the newcomers.
        assert_eq!(h.status("ns/b-second"), "10.0.0.2 @a");
        assert_eq!(h.status("ns/e-new"), "10.0.0.4 @a");
        assert_eq!(h.status("ns/a-new"), "10.0.0.5 @a");
        assert_eq!(
            log(&h.take()),
            // The restore pass announces every ClearAssignment first (§4.5, §4.6).
            [
                "ns/b-second Normal ClearAssignment",
                "ns/b-second <- 10.0.0.2 @a",
                "ns/b-second Normal IPAllocated",
                "ns/e-new <- 10.0.0.4 @a",
                "ns/e-new Normal IPAllocated",
                "ns/a-new <- 10.0.0.5 @a",
                "ns/a-new Normal IPAllocated"
            ]
        );
    }

    #[tokio::test]
    async fn services_without_addresses_get_them_in_first_seen_order_and_recreated_is_new() {
        let h = Harness::new();
        h.pool("a", addrs(&["10.0.0.1-10.0.0.5"])).await;
        h.add(svc("ns/x")).await;
        h.add(svc("ns/c")).await;
        h.add(svc("ns/b")).await;
        // Updates do not change when a Service was first seen...
        h.edit("ns/c", |s| s.label("l", "v")).await;
        // ...but a delete and re-create does.
        h.delete("ns/x").await;
        h.add(svc("ns/x")).await;
        h.sync().await;
        assert_eq!(h.status("ns/c"), "10.0.0.1 @a");
        assert_eq!(h.status("ns/b"), "10.0.0.2 @a");
        assert_eq!(h.status("ns/x"), "10.0.0.3 @a");
    }

    // §4.5: a PreferDualStack Service that kept one family completes it
    // among the Services left without addresses, after those that had to
    // release theirs, so the last free IPv6 goes to `r`, not `p`.
    #[tokio::test]
    async fn at_sync_prefer_dual_stack_completion_waits_for_services_without_addresses() {
        let h = Harness::new();
        h.pool("a", addrs(&["10.0.0.1-10.0.0.3", "fd00::1"])).await;
        h.add(svc("ns/r").v6().held(&["fd00::7"], "gone")).await;
        h.add(
            svc("ns/p")
                .dual("PreferDualStack", false)
                .held(&["10.0.0.1"], "a"),
        )
        .await;
        h.sync().await;
        assert_eq!(h.status("ns/r"), "fd00::1 @a");
        assert_eq!(h.status("ns/p"), "10.0.0.1 @a");
        assert_eq!(h.waiting(), ["ns/p"]);
    }

    // §4.5: ...and at its first-seen place among the others: `p`, seen
    // before `n`, gets the last free IPv6 first.
    #[tokio::test]
    async fn at_sync_prefer_dual_stack_completion_takes_its_first_seen_place() {
        let h = Harness::new();
        h.pool("a", addrs(&["10.0.0.1-10.0.0.3", "fd00::1"])).await;
        h.add(
            svc("ns/p")
                .dual("PreferDualStack", false)
                .held(&["10.0.0.1"], "a"),
        )
        .await;
        h.add(svc("ns/n").v6()).await;
        h.add(svc("ns/m")).await;
        h.sync().await;
        assert_eq!(h.status("ns/p"), "10.0.0.1 fd00::1 @a");
        assert_eq!(h.status("ns/n"), "none");
        assert_eq!(h.status("ns/m"), "10.0.0.2 @a");
        assert_eq!(h.waiting(), ["ns/n"]);
    }
}

// ----- docs/allocation.md §4.6: when things change -----

mod s4_6_changes {
    use super::*;

    async fn one_address_held() -> Harness {
        let h = Harness::with_pools(&[("a", addrs(&["10.0.0.1"]))]).await;
        h.add(svc("ns/holder")).await;
        h
    }

    // §4.5/§4.6: a Service deleted and re-created before the worker sees the
    // delete is new: it waits afresh, behind Services that waited longer.
    #[tokio::test]
    async fn a_recreated_service_starts_waiting_afresh() {
        let h = one_address_held().await;
        h.add(svc("ns/w")).await;
        h.add(svc("ns/x")).await;
        assert_eq!(h.waiting(), ["ns/w", "ns/x"]);
        h.recreate(svc("ns/w")).await;
        assert_eq!(h.waiting(), ["ns/x", "ns/w"]);
        h.delete("ns/holder").await;
        assert_eq!(h.status("ns/x"), "10.0.0.1 @a");
        assert_eq!(h.status("ns/w"), "none");
    }

    #[tokio::test]
    async fn a_service_deleted_then_recreated_later_waits_afresh() {
        let h = one_address_held().await;
        h.add(svc("ns/w")).await;
        h.add(svc("ns/x")).await;
        h.delete("ns/w").await;
        h.add(svc("ns/w")).await;
        assert_eq!(h.waiting(), ["ns/x", "ns/w"]);
        h.delete("ns/holder").await;
        assert_eq!(h.status("ns/x"), "10.0.0.1 @a");
    }

    // §4.6 and §4.9: every delete wakes the waiting that what it freed
    // could serve; a delete that frees nothing could serve none of them
    // (they would fail again alike), so it reconciles only its own key.
    #[tokio::test]
    async fn a_delete_wakes_the_waiting_its_address_can_serve_and_other_changes_do_not() {
        let h = one_address_held().await;
        h.add(svc("ns/w")).await;
        h.add(svc("ns/cip").kind("ClusterIP")).await;
        // Unrelated changes reconcile only their own key.
        let before = h.reconciliations();
        h.edit("ns/holder", |s| s.label("x", "y")).await;
        h.edit("ns/cip", |s| s.label("x", "y")).await;
        assert_eq!(h.reconciliations() - before, 2);
        let before = h.reconciliations();
        h.delete("ns/cip").await;
        assert_eq!(h.reconciliations() - before, 1);
        h.add(svc("ns/w2")).await;
        assert_eq!(h.waiting(), ["ns/w", "ns/w2"]);
        let before = h.reconciliations();
        h.delete("ns/w2").await;
        assert_eq!(h.reconciliations() - before, 1);
        assert_eq!(h.waiting(), ["ns/w"]);
        // The holder's delete frees the address: `w` is woken and gets it.
        let before = h.reconciliations();
        h.delete("ns/holder").await;
        assert_eq!(h.reconciliations() - before, 2);
        assert_eq!(h.status("ns/w"), "10.0.0.1 @a");
        assert!(h.waiting().is_empty());
    }

    // §4.9: a Service that tried the unpinned pools waits on all of them at
    // once (one key per family), woken by a delete in any of them; a
    // delete in a pinned pool wakes only those that pool serves, and one in
    // a pool without autoAssign wakes none of them.
    #[tokio::test]
    async fn a_delete_in_any_unpinned_pool_wakes_those_that_tried_them() {
        let h = Harness::with_pools(&[
            ("a", addrs(&["10.0.0.1"])),
            ("b", addrs(&["10.0.1.1"])),
            ("c", json!({"addresses": ["10.0.3.1"], "autoAssign": false})),
            (
                "p",
                json!({"addresses": ["10.0.2.1"], "serviceAllocation": {"namespaces": ["other"]}}),
            ),
        ])
        .await;
        h.add(svc("other/hp")).await;
        h.add(svc("ns/h1")).await;
        h.add(svc("ns/h2")).await;
        h.add(svc("ns/hc").in_pool("c")).await;
        h.add(svc("ns/w")).await;
        h.add(svc("other/wp")).await;
        assert_eq!(h.status("other/hp"), "10.0.2.1 @p");
        assert_eq!(h.status("ns/h2"), "10.0.1.1 @b");
        assert_eq!(h.waiting(), ["ns/w", "other/wp"]);
        let before = h.reconciliations();
        h.delete("ns/hc").await;
        assert_eq!(h.reconciliations() - before, 1);
        let before = h.reconciliations();
        h.delete("other/hp").await;
        assert_eq!(h.reconciliations() - before, 2);
        assert_eq!(h.status("other/wp"), "10.0.2.1 @p");
        assert_eq!(h.waiting(), ["ns/w"]);
        let before = h.reconciliations();
        h.delete("ns/h2").await;
        assert_eq!(h.reconciliations() - before, 2);
        assert_eq!(h.status("ns/w"), "10.0.1.1 @b");
    }

    // §4.9: a Service that tried pinned pools waits on their rules (one
    // key per rules and family), woken by a delete in any pool with those
    // rules and not by one in a pool pinned otherwise.
    #[tokio::test]
    async fn a_delete_in_a_pinned_pool_wakes_those_that_tried_its_rules() {
        let to = |namespace: &str, ip: &str| json!({"addresses": [ip], "serviceAllocation": {"namespaces": [namespace]}});
        let h = Harness::with_pools(&[
            ("p1", to("other", "10.0.1.1")),
            ("p2", to("other", "10.0.2.1")),
            ("q", to("third", "10.0.3.1")),
        ])
        .await;
        h.add(svc("other/h1")).await;
        h.add(svc("other/h2")).await;
        h.add(svc("third/hq")).await;
        h.add(svc("other/w")).await;
        h.add(svc("third/wq")).await;
        assert_eq!(h.status("other/h2"), "10.0.2.1 @p2");
        assert_eq!(h.waiting(), ["other/w", "third/wq"]);
        let before = h.reconciliations();
        h.delete("other/h2").await;
        assert_eq!(h.reconciliations() - before, 2);
        assert_eq!(h.status("other/w"), "10.0.2.1 @p2");
        assert_eq!(h.waiting(), ["third/wq"]);
        let before = h.reconciliations();
        h.delete("third/hq").await;
        assert_eq!(h.reconciliations() - before, 2);
        assert_eq!(h.status("third/wq"), "10.0.3.1 @q");
    }

    #[tokio::test]
    async fn releasing_an_address_by_moving_wakes_the_waiting() {
        let h = Harness::with_pools(&[
            ("a", addrs(&["10.0.0.1-10.0.0.2"])),
            ("b", json!({"addresses": ["10.0.1.1"], "autoAssign": false})),
        ])
        .await;
        h.add(svc("ns/mover").request("10.0.0.1")).await;
        h.add(svc("ns/w").request("10.0.0.1")).await;
        assert_eq!(h.waiting(), ["ns/w"]);
        h.take();
        h.edit("ns/mover", |s| {
            s.no_ann("metallb.io/loadBalancerIPs").in_pool("b")
        })
        .await;
        assert_eq!(h.status("ns/mover"), "10.0.1.1 @b");
        assert_eq!(h.status("ns/w"), "10.0.0.1 @a");
        assert_eq!(
            log(&h.take()),
            [
                "ns/mover <- 10.0.1.1 @b",
                "ns/mover Normal ClearAssignment",
                "ns/mover Normal IPAllocated",
                "ns/w <- 10.0.0.1 @a",
                "ns/w Normal IPAllocated"
            ]
        );
    }

    #[tokio::test]
    async fn an_invalid_request_is_not_waiting() {
        let h = one_address_held().await;
        h.add(svc("ns/w")).await;
        assert_eq!(h.waiting(), ["ns/w"]);
        h.edit("ns/w", |s| s.request("10.0.0.1,10.0.0.2")).await;
        assert!(h.waiting().is_empty());
        // The delete wakes nobody: only the delete itself is reconciled.
        let before = h.reconciliations();
        h.delete("ns/holder").await;
        assert_eq!(h.reconciliations() - before, 1);
        assert_eq!(h.status("ns/w"), "none");
        h.edit("ns/w", |s| s.request("10.0.0.1")).await;
        assert_eq!(h.status("ns/w"), "10.0.0.1 @a");
    }

    #[tokio::test]
    async fn a_sharing_key_or_port_change_reconsiders_the_others_on_the_address() {
        let h = Harness::with_pools(&[("a", addrs(&["10.0.0.1-10.0.0.3"]))]).await;
        h.add(svc("ns/a").shared("k").ports(&[("TCP", 80)])).await;
        h.add(svc("ns/b").shared("k").ports(&[("TCP", 443)])).await;
        h.add(svc("ns/c")).await;
        assert_eq!(h.status("ns/b"), "10.0.0.1 @a");
        h.take();
        // A port change that still fits: `a` keeps, and so does `b`, which
        // is settled and need not run again to know it (§4.9): no two
        // holders of an address conflict, and sharing rules are symmetric.
        let before = h.reconciliations();
        h.edit("ns/a", |s| s.ports(&[("TCP", 8080)])).await;
        assert_eq!(h.reconciliations() - before, 1);
        assert_eq!(h.status("ns/b"), "10.0.0.1 @a");
        assert!(h.take().is_empty());
        // A label change is not a sharing change.
        let before = h.reconciliations();
        h.edit("ns/a", |s| s.label("x", "y")).await;
        assert_eq!(h.reconciliations() - before, 1);
        assert!(h.take().is_empty());
        // Another key: `a` may not stay; `b` keeps 10.0.0.1.
        h.edit("ns/a", |s| s.shared("k2")).await;
        assert_eq!(h.status("ns/a"), "10.0.0.3 @a");
        assert_eq!(h.status("ns/b"), "10.0.0.1 @a");
        assert_eq!(
            events(&h.take()),
            ["ns/a Normal ClearAssignment", "ns/a Normal IPAllocated"]
        );
    }

    #[tokio::test]
    async fn a_pool_change_reconsiders_services_with_addresses_first() {
        let h = Harness::with_pools(&[("a", addrs(&["10.0.0.1"]))]).await;
        // `w` is seen first but has no address; `h` holds one.
        h.add(svc("ns/w").kind("ClusterIP")).await;
        h.add(svc("ns/h")).await;
        h.edit("ns/w", |s| s.kind("LoadBalancer")).await;
        assert_eq!(h.waiting(), ["ns/w"]);
        h.take();
        h.pool("a", addrs(&["10.0.0.9"])).await;
        assert_eq!(h.status("ns/h"), "10.0.0.9 @a");
        assert_eq!(h.status("ns/w"), "none");
        assert_eq!(
            events(&h.take()),
            ["ns/h Normal ClearAssignment", "ns/h Normal IPAllocated"]
        );
    }

    #[tokio::test]
    async fn a_pool_delete_releases_with_clear_assignment() {
        let h = Harness::with_pools(&[
            ("a", addrs(&["10.0.0.1-10.0.0.2"])),
            ("b", addrs(&["10.0.1.1"])),
        ])
        .await;
        h.add(svc("ns/x")).await;
        h.add(svc("ns/y")).await;
        h.take();
        h.delete_pool("a").await;
        assert_eq!(h.status("ns/x"), "10.0.1.1 @b");
        assert_eq!(h.status("ns/y"), "none");
        let records = h.take();
        assert_eq!(
            log(&records),
            // The restore pass announces every ClearAssignment first (§4.5, §4.6).
            [
                "ns/x Normal ClearAssignment",
                "ns/y Normal ClearAssignment",
                "ns/x <- 10.0.1.1 @b",
                "ns/x Normal IPAllocated",
                "ns/y <-  @-",
                "ns/y Warning AllocationFailed"
            ]
        );
        assert!(messages(&records)[0].ends_with("10.0.0.1 is not in any pool"));
        assert_eq!(h.waiting(), ["ns/y"]);
    }

    #[tokio::test]
    async fn a_namespace_label_change_reconsiders_every_service() {
        let h = Harness::with_pools(&[(
            "prod",
            json!({
                "addresses": ["10.0.5.1"],
                "serviceAllocation": {"namespaceSelectors": [{"matchLabels": {"env": "prod"}}]},
            }),
        )])
        .await;
        h.namespace("team", &[]).await;
        h.add(svc("team/s")).await;
        assert_eq!(h.status("team/s"), "none");
        h.take();
        h.namespace("team", &[("env", "prod")]).await;
        assert_eq!(h.status("team/s"), "10.0.5.1 @prod");
        h.take();
        // A change of something else than labels changes nothing.
        let before = h.reconciliations();
        h.namespace("team", &[("env", "prod")]).await;
        assert_eq!(h.reconciliations(), before);
        h.namespace("team", &[("env", "dev")]).await;
        assert_eq!(h.status("team/s"), "none");
        let records = h.take();
        assert_eq!(
            events(&records),
            [
                "team/s Normal ClearAssignment",
                "team/s Warning AllocationFailed"
            ]
        );
        assert!(messages(&records)[0].ends_with("pool \"prod\" does not serve this service"));
    }
}

// ----- docs/allocation.md §4.7: what is written -----

mod s4_7_writes {
    use super::*;

    #[tokio::test]
    async fn a_write_only_when_something_changed_and_the_echo_converges() {
        let h = Harness::with_pools(&[("a", addrs(&["10.0.0.1-10.0.0.3"]))]).await;
        let before = h.reconciliations();
        h.add(svc("ns/a")).await;
        // The add only: the echo of its write shows what is held and
        // changes nothing else, so it is not queued.
        assert_eq!(h.reconciliations() - before, 1);
        assert_eq!(writes(&h.take()), ["ns/a <- 10.0.0.1 @a"]);
        h.edit("ns/a", |s| s.label("x", "y")).await;
        h.edit("ns/a", |s| s.ports(&[("TCP", 81), ("UDP", 53)]))
            .await;
        h.edit("ns/a", |s| s.ann("unrelated", "v")).await;
        h.pool("b", addrs(&["10.0.1.1"])).await;
        h.namespace("ns", &[("x", "y")]).await;
        assert!(h.take().is_empty());
        // Status lost (a user, a failed write elsewhere): written back.
        h.edit("ns/a", |s| s.status(&[])).await;
        assert_eq!(writes(&h.take()), ["ns/a <- 10.0.0.1 @a"]);
        // The pool annotation removed by a user: only that is written.
        h.edit("ns/a", |s| s.no_ann(POOL_ANNOTATION)).await;
        assert_eq!(log(&h.take()), ["ns/a <- 10.0.0.1 @a"]);
        h.edit("ns/a", |s| s.kind("NodePort")).await;
        assert_eq!(writes(&h.take()), ["ns/a <-  @-"]);
        h.edit("ns/a", |s| s.label("x", "z")).await;
        assert!(h.take().is_empty());
    }

    #[tokio::test]
    async fn event_reasons_types_and_messages() {
        let h = Harness::with_pools(&[("a", addrs(&["10.0.0.1", "fd00::1"]))]).await;
        h.add(svc("ns/dual").dual("RequireDualStack", true)).await;
        h.add(svc("ns/full")).await;
        h.add(svc("ns/bad").request("x")).await;
        h.add(svc("ns/old").ann("metallb.universe.tf/address-pool", "a"))
            .await;
        h.delete("ns/dual").await;
        h.pool("a", addrs(&["10.0.0.2"])).await;
        let expected = [
            (
                "ns/dual",
                EventType::Normal,
                "IPAllocated",
                "Assigned IP [\"10.0.0.1\" \"fd00::1\"]",
            ),
            (
                "ns/full",
                EventType::Warning,
                "AllocationFailed",
                "Failed to allocate IP for \"ns/full\": no available IPs: \
                 no pool has an IPv4 address free (tried a)",
            ),
            (
                "ns/bad",
                EventType::Warning,
                "LoadBalancerFailed",
                "invalid request: the loadBalancerIPs annotation: \"x\" is not an IP address",
            ),
            (
                "ns/old",
                EventType::Warning,
                "AllocationFailed",
                "Failed to allocate IP for \"ns/old\": no available IPs: \
                 no pool has an IPv4 address free (tried a)",
            ),
            // `dual` goes: `full` (waiting longest) gets 10.0.0.1.
            (
                "ns/full",
                EventType::Normal,
                "IPAllocated",
                "Assigned IP [\"10.0.0.1\"]",
            ),
            // The pool changes: `full` is released, and `old`, waiting,
            // cannot have 10.0.0.2 before `full`, which had an address.
            (
                "ns/full",
                EventType::Normal,
                "ClearAssignment",
                "current IP [\"10.0.0.1\"] not allowed by config, clearing: \
                 10.0.0.1 is not in any pool",
            ),
            (
                "ns/full",
                EventType::Normal,
                "IPAllocated",
                "Assigned IP [\"10.0.0.2\"]",
            ),
        ];
        let got: Vec<(String, EventType, String, String)> = h
            .take()
            .into_iter()
            .filter_map(|r| match r {
                Record::Event {
                    key,
                    event_type,
                    reason,
                    message,
                } => Some((key, event_type, reason, message)),
                _ => None,
            })
            .collect();
        let expected: Vec<(String, EventType, String, String)> = expected
            .iter()
            .map(|(k, t, r, m)| (k.to_string(), *t, r.to_string(), m.to_string()))
            .collect();
        assert_eq!(got, expected);
        // DeprecatedAnnotation is a Warning, on the write that gives `old`
        // its address.
        h.pool("a", addrs(&["10.0.0.2-10.0.0.3"])).await;
        assert_eq!(
            events(&h.take()),
            [
                "ns/old Normal IPAllocated",
                "ns/old Warning DeprecatedAnnotation"
            ]
        );
    }

    // §4.7: a re-created Service (new uid) gets its AllocationFailed even
    // when its delete and re-add are coalesced into one reconciliation.
    #[tokio::test]
    async fn a_recreated_service_gets_its_warning_again() {
        let h = Harness::with_pools(&[("a", addrs(&["10.0.0.1"]))]).await;
        h.add(svc("ns/holder")).await;
        h.add(svc("ns/w")).await;
        assert_eq!(
            events(&h.take()),
            [
                "ns/holder Normal IPAllocated",
                "ns/w Warning AllocationFailed"
            ]
        );
        h.recreate(svc("ns/w")).await;
        assert_eq!(events(&h.take()), ["ns/w Warning AllocationFailed"]);
    }

    #[tokio::test]
    async fn no_ip_allocated_when_a_held_address_is_kept_at_restart() {
        let h = Harness::new();
        h.pool("a", addrs(&["10.0.0.1-10.0.0.3", "fd00::1"])).await;
        h.add(svc("ns/a").held(&["10.0.0.2"], "a")).await;
        h.add(
            svc("ns/d")
                .dual("RequireDualStack", false)
                .held(&["10.0.0.3", "fd00::1"], "a"),
        )
        .await;
        h.sync().await;
        assert!(h.take().is_empty());
        assert_eq!(h.status("ns/d"), "10.0.0.3 fd00::1 @a");
    }

    #[tokio::test]
    async fn an_identical_warning_is_not_repeated() {
        let h = Harness::with_pools(&[("a", addrs(&["10.0.0.1"]))]).await;
        h.add(svc("ns/holder")).await;
        h.add(svc("ns/w")).await;
        assert_eq!(
            events(&h.take()),
            [
                "ns/holder Normal IPAllocated",
                "ns/w Warning AllocationFailed"
            ]
        );
        // Reconciled again and again, failing the same way: silence.
        h.add(svc("ns/cip").kind("ClusterIP")).await;
        h.delete("ns/cip").await;
        h.edit("ns/w", |s| s.label("x", "y")).await;
        h.pool("b", json!({"addresses": ["10.0.9.1"], "autoAssign": false}))
            .await;
        assert!(h.take().is_empty());
        // Another failure is announced, and so is the first one again after it.
        h.edit("ns/w", |s| s.in_pool("nope")).await;
        h.edit("ns/w", |s| s.no_ann("metallb.io/address-pool"))
            .await;
        assert_eq!(
            events(&h.take()),
            [
                "ns/w Warning AllocationFailed",
                "ns/w Warning AllocationFailed"
            ]
        );
        // An invalid request: announced once.
        h.edit("ns/w", |s| s.request("nope")).await;
        h.edit("ns/w", |s| s.label("x", "z")).await;
        assert_eq!(events(&h.take()), ["ns/w Warning LoadBalancerFailed"]);
        // A success forgets the warning: the same failure is news again.
        h.edit("ns/w", |s| s.no_ann("metallb.io/loadBalancerIPs"))
            .await;
        h.take();
        h.delete("ns/holder").await;
        assert_eq!(h.status("ns/w"), "10.0.0.1 @a");
        h.add(svc("ns/holder")).await;
        assert_eq!(
            events(&h.take()),
            [
                "ns/w Normal IPAllocated",
                "ns/holder Warning AllocationFailed"
            ]
        );
        // A deleted and re-created Service starts afresh.
        h.delete("ns/holder").await;
        h.add(svc("ns/holder")).await;
        assert_eq!(events(&h.take()), ["ns/holder Warning AllocationFailed"]);
    }
}

// ----- docs/allocation.md §5: the manager, failures and rejected pools -----

mod s5_manager {
    use super::*;

    /// A mixed workload: adds, sharing, dual stack, requests, deletes, a type
    /// change, a pool change and an old-prefix annotation.
    async fn churn(h: &Harness) {
        h.pool("a", addrs(&["10.0.0.1-10.0.0.30", "fd00::1-fd00::10"]))
            .await;
        h.pool(
            "b",
            json!({"addresses": ["10.0.1.1-10.0.1.10"], "autoAssign": false}),
        )
        .await;
        h.sync().await;
        for i in 0..12 {
            h.add(svc(&format!("ns/s{i:02}"))).await;
        }
        for (i, port) in [80, 443, 8080, 80].iter().enumerate() {
            h.add(
                svc(&format!("ns/sh{i}"))
                    .shared("k")
                    .ports(&[("TCP", *port)]),
            )
            .await;
        }
        h.add(svc("ns/dual").dual("RequireDualStack", true)).await;
        h.add(svc("ns/prefer").dual("PreferDualStack", false)).await;
        h.add(svc("ns/req").request("10.0.0.25")).await;
        h.add(svc("ns/in-b").in_pool("b")).await;
        h.add(svc("ns/old").ann("metallb.universe.tf/address-pool", "b"))
            .await;
        h.delete("ns/s03").await;
        h.delete("ns/s07").await;
        h.edit("ns/s05", |s| s.kind("ClusterIP")).await;
        h.add(svc("ns/late")).await;
        h.pool("a", addrs(&["10.0.0.4-10.0.0.40", "fd00::1-fd00::10"]))
            .await;
        h.edit("ns/s11", |s| s.in_pool("b")).await;
    }

    fn events_by_key(records: &[Record]) -> BTreeMap<String, Vec<String>> {
        let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for event in events(records) {
            let (key, rest) = event.split_once(' ').unwrap();
            by_key
                .entry(key.to_owned())
                .or_default()
                .push(rest.to_owned());
        }
        by_key
    }

    fn statuses(h: &Harness) -> BTreeMap<String, String> {
        h.services()
            .iter()
            .map(|(key, _)| (key.clone(), h.status(key)))
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_failing_every_third_write_still_converges() {
        let h = Harness::with(ControllerConfig::default(), Some(3));
        churn(&h).await;
        let reference = Harness::new();
        churn(&reference).await;

        let records = h.all();
        let failed = records
            .iter()
            .filter(|r| matches!(r, Record::FailedWrite { .. }))
            .count();
        assert!(failed >= 5, "only {failed} failed writes");
        assert_eq!(h.controller.stats().write_errors, failed as u64);

        // Every LoadBalancer Service has its addresses, as without failures.
        let got = statuses(&h);
        for (key, status) in &got {
            if key == "ns/s05" {
                assert_eq!(status, "none");
            } else {
                assert!(status.starts_with("10.0."), "{key}: {status}");
            }
        }
        assert_eq!(got, statuses(&reference));
        assert_eq!(h.controller.holdings(), reference.controller.holdings());
        assert_eq!(h.controller.pool_stats(), reference.controller.pool_stats());

        // No address handed out twice but to the sharing group.
        let mut owners: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for holding in h.controller.holdings() {
            for ip in holding.ips {
                owners
                    .entry(ip.to_string())
                    .or_default()
                    .push(holding.key.clone());
            }
        }
        for (ip, keys) in owners {
            assert!(
                keys.len() == 1 || keys.iter().all(|k| k.starts_with("ns/sh")),
                "{ip} held by {keys:?}"
            );
        }

        // Events are announced once, on the write that succeeded: per
        // Service, the same events as without failures.
        assert_eq!(events_by_key(&records), events_by_key(&reference.all()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_write_is_retried_and_its_events_come_once() {
        // Attempts 2, 4, 6, ... fail.
        let h = Harness::with(ControllerConfig::default(), Some(2));
        h.pool("a", addrs(&["10.0.0.1-10.0.0.3"])).await;
        h.sync().await;
        h.add(svc("ns/a")).await;
        h.add(svc("ns/b").ann("metallb.universe.tf/allow-shared-ip", "k"))
            .await;
        assert_eq!(
            log(&h.take()),
            [
                "ns/a <- 10.0.0.1 @a",
                "ns/a Normal IPAllocated",
                "ns/b <- FAILED",
                "ns/b <- 10.0.0.2 @a",
                "ns/b Normal IPAllocated",
                "ns/b Warning DeprecatedAnnotation"
            ]
        );
        // A failing clear after a type change is retried too.
        h.edit("ns/a", |s| s.kind("ClusterIP")).await;
        assert_eq!(log(&h.take()), ["ns/a <- FAILED", "ns/a <-  @-"]);
        assert_eq!(h.status("ns/a"), "none");
        // A Warning whose write failed is announced when the retry succeeds.
        h.pool(
            "a",
            json!({"addresses": ["10.0.0.1-10.0.0.3"], "serviceAllocation": {"namespaces": ["other"]}}),
        )
        .await;
        assert_eq!(
            log(&h.take()),
            // The restore pass announces every ClearAssignment first (§4.5, §4.6).
            [
                "ns/b Normal ClearAssignment",
                "ns/b <- FAILED",
                "ns/b <-  @-",
                "ns/b Warning AllocationFailed",
                "ns/b Warning DeprecatedAnnotation"
            ]
        );
    }

    #[tokio::test]
    async fn a_change_of_an_older_pool_can_reject_a_newer_one() {
        let h = Harness::with_pools(&[
            ("a", addrs(&["10.0.0.1-10.0.0.3"])),
            ("b", addrs(&["10.0.1.1-10.0.1.3"])),
        ])
        .await;
        h.add(svc("ns/s").in_pool("b")).await;
        h.add(svc("ns/t").in_pool("b")).await;
        assert_eq!(h.status("ns/t"), "10.0.1.2 @b");
        h.take();
        // `a` (older) now overlaps `b`: `b` is rejected and does not exist
        // for allocation any more.
        h.pool("a", addrs(&["10.0.0.1-10.0.0.3", "10.0.1.2-10.0.1.3"]))
            .await;
        let rejected = h.controller.rejected_pools();
        assert_eq!(rejected.len(), 1);
        assert_eq!(rejected[0].name, "b");
        assert_eq!(h.status("ns/s"), "none");
        assert_eq!(h.status("ns/t"), "none");
        let records = h.take();
        assert_eq!(
            events(&records),
            // The restore pass announces every ClearAssignment first (§4.5, §4.6).
            [
                "ns/s Normal ClearAssignment",
                "ns/t Normal ClearAssignment",
                "ns/s Warning AllocationFailed",
                "ns/t Warning AllocationFailed"
            ]
        );
        assert!(messages(&records)[2].ends_with("unknown pool \"b\""));
    }

    // §3.1: a pool rejected because an older pool changed to overlap it is
    // logged and counted too.
    #[tokio::test]
    async fn a_pool_rejected_by_another_pools_change_is_counted() {
        let h = Harness::with_pools(&[
            ("a", addrs(&["10.0.0.1-10.0.0.3"])),
            ("b", addrs(&["10.0.1.1-10.0.1.3"])),
        ])
        .await;
        assert_eq!(h.controller.stats().pool_rejections, 0);
        h.pool("a", addrs(&["10.0.0.1-10.0.0.3", "10.0.1.2-10.0.1.3"]))
            .await;
        assert_eq!(h.controller.rejected_pools().len(), 1);
        assert_eq!(h.controller.stats().pool_rejections, 1);
    }

    // §3.1/§4.5: the older of two overlapping pools (by creationTimestamp)
    // stays, whatever order a restarted host lists them in.
    #[tokio::test]
    async fn the_older_of_two_overlapping_pools_stays_across_a_restart() {
        let first = Harness::new();
        first
            .pool_created(
                "z-old",
                "2020-01-01T00:00:00Z",
                addrs(&["10.0.0.1-10.0.0.8"]),
            )
            .await;
        first
            .pool_created(
                "a-new",
                "2024-01-01T00:00:00Z",
                addrs(&["10.0.0.5-10.0.0.6"]),
            )
            .await;
        first.sync().await;
        assert_eq!(first.controller.rejected_pools()[0].name, "a-new");
        first.add(svc("ns/s").request("10.0.0.5")).await;
        assert_eq!(first.status("ns/s"), "10.0.0.5 @z-old");

        // Restart: the list comes in name order.
        let h = Harness::new();
        h.pool_created(
            "a-new",
            "2024-01-01T00:00:00Z",
            addrs(&["10.0.0.5-10.0.0.6"]),
        )
        .await;
        h.pool_created(
            "z-old",
            "2020-01-01T00:00:00Z",
            addrs(&["10.0.0.1-10.0.0.8"]),
        )
        .await;
        let s = first.service("ns/s");
        h.add(Svc(serde_json::to_value(&*s).unwrap())).await;
        h.sync().await;
        assert_eq!(h.controller.rejected_pools()[0].name, "a-new");
        assert_eq!(h.status("ns/s"), "10.0.0.5 @z-old");
        assert!(h.take().is_empty());
    }

    #[tokio::test]
    async fn a_rejected_pool_is_counted_and_the_others_keep_working() {
        let h = Harness::new();
        h.pool("bad", addrs(&["10.0.0.300"])).await;
        h.pool("a", addrs(&["10.0.0.1-10.0.0.3"])).await;
        h.sync().await;
        assert_eq!(h.controller.stats().pool_rejections, 1);
        let rejected = h.controller.rejected_pools();
        assert_eq!(rejected.len(), 1);
        assert_eq!(rejected[0].name, "bad");
        assert!(rejected[0].reason.contains("is not an IP address"));
        h.add(svc("ns/x")).await;
        assert_eq!(h.status("ns/x"), "10.0.0.1 @a");
        // Naming a rejected pool is naming an unknown pool.
        h.add(svc("ns/y").in_pool("bad")).await;
        assert!(messages(&h.take()).contains(
            &"ns/y AllocationFailed: Failed to allocate IP for \"ns/y\": unknown pool \"bad\""
                .to_owned()
        ));
        // An overlap: the newer pool is rejected, the older keeps working.
        h.pool("wide", addrs(&["10.0.0.0/29"])).await;
        assert_eq!(h.controller.stats().pool_rejections, 2);
        assert!(h.controller.rejected_pools()[1]
            .reason
            .contains("of pool \"a\""));
        h.add(svc("ns/z")).await;
        assert_eq!(h.status("ns/z"), "10.0.0.2 @a");
        h.take();
        // Deleting the older brings the newer in: held addresses stay, only
        // the annotation changes.
        h.delete_pool("a").await;
        assert_eq!(h.controller.rejected_pools().len(), 1);
        assert_eq!(h.status("ns/x"), "10.0.0.1 @wide");
        assert_eq!(h.status("ns/z"), "10.0.0.2 @wide");
        assert_eq!(
            log(&h.take()),
            ["ns/x <- 10.0.0.1 @wide", "ns/z <- 10.0.0.2 @wide"]
        );
        // Fixing the bad pool brings it in.
        h.pool("bad", addrs(&["10.0.3.1"])).await;
        assert_eq!(h.status("ns/y"), "10.0.3.1 @bad");
        assert_eq!(h.controller.stats().pool_rejections, 2);
    }
}

/// Cost regressions (docs/allocation.md §4.9), counted in reconciliations
/// and restores at sizes where the old code did at least 20 times the work
/// of the bound asserted.
mod cost {
    use super::*;

    const N: usize = 400;

    fn work(h: &Harness) -> u64 {
        let stats = h.controller.stats();
        stats.reconciliations + stats.restores
    }

    /// N Services of one sharing key on one address, each its own port;
    /// then each changes its port's protocol in turn. The others on the
    /// address are settled and keep (no two conflicting holders share an
    /// address), so a change costs its own reconciliation, not one per
    /// holder (the old code reconsidered every holder: N²/2 in all). One
    /// that now conflicts still moves.
    #[tokio::test(flavor = "current_thread")]
    async fn a_holder_changing_its_ports_costs_no_look_at_the_settled_others() {
        let h = Harness::with_pools(&[("a", addrs(&["10.0.0.0/24"]))]).await;
        for i in 0..N {
            let port = i32::try_from(i).unwrap() + 1;
            h.add(svc(&format!("ns/s{i}")).shared("k").port(port)).await;
        }
        assert_eq!(h.status("ns/s0"), "10.0.0.0 @a");
        let before = work(&h);
        for i in 0..N {
            let port = i32::try_from(i).unwrap() + 1;
            h.edit(&format!("ns/s{i}"), |s| s.ports(&[("UDP", port)]))
                .await;
        }
        assert!(work(&h) - before <= 3 * N as u64, "{}", work(&h) - before);
        for i in 0..N {
            assert_eq!(h.status(&format!("ns/s{i}")), "10.0.0.0 @a");
        }
        h.edit("ns/s1", |s| s.ports(&[("UDP", 1)])).await;
        assert_eq!(h.status("ns/s1"), "10.0.0.1 @a");
        assert_eq!(h.status("ns/s0"), "10.0.0.0 @a");
    }

    /// N half-served PreferDualStack Services of one key share an IPv4
    /// address and wait for IPv6 (the one IPv6 address is held by a
    /// Service that does not share); each changes its port in turn. Such a
    /// change concerns IPv4 only, so the waiting others are not run again
    /// (the old code ran every holder: N² in all); once the IPv6 address
    /// is freed they complete, as before.
    #[tokio::test(flavor = "current_thread")]
    async fn half_served_holders_are_not_run_again_for_a_change_of_the_family_they_hold() {
        let h = Harness::with_pools(&[("a", addrs(&["10.0.0.0/24", "fd00::1"]))]).await;
        h.add(svc("ns/t").v6()).await;
        let half = |i: usize, protocol: &str| {
            let port = i32::try_from(i).unwrap() + 1;
            svc(&format!("ns/s{i}"))
                .dual("PreferDualStack", false)
                .shared("k")
                .ports(&[(protocol, port)])
        };
        for i in 0..N {
            h.add(half(i, "TCP")).await;
        }
        assert_eq!(h.waiting().len(), N);
        let before = work(&h);
        for i in 0..N {
            h.edit(&format!("ns/s{i}"), |_| half(i, "UDP")).await;
        }
        assert!(work(&h) - before <= 3 * N as u64, "{}", work(&h) - before);
        assert_eq!(h.status("ns/s0"), "10.0.0.0 @a");
        h.delete("ns/t").await;
        assert_eq!(h.status("ns/s0"), "10.0.0.0 fd00::1 @a");
        assert_eq!(h.status(&format!("ns/s{}", N - 1)), "10.0.0.0 fd00::1 @a");
    }

    /// N Services alike wait for the full pool of their Namespace while
    /// another pool (of a Namespace without Services) changes N times.
    /// The change touched nothing they hold, so none is restored, and each
    /// second pass runs the first of them only: the others would fail
    /// again alike, as they did (the old code restored and ran all N on
    /// each change, 2N² in all). Freeing the address still serves the one
    /// that has waited longest.
    #[tokio::test(flavor = "current_thread")]
    async fn a_change_runs_one_of_the_waiting_services_alike() {
        let pinned = |namespace: &str, address: &str| json!({"addresses": [address], "serviceAllocation": {"namespaces": [namespace]}});
        let h = Harness::with_pools(&[("small", pinned("w", "10.0.0.1"))]).await;
        h.add(svc("w/holder")).await;
        for i in 0..N {
            h.add(svc(&format!("w/s{i}"))).await;
        }
        assert_eq!(h.waiting().len(), N);
        let before = work(&h);
        for i in 0..N {
            let address = format!("10.1.{}.{}", i / 256, i % 256);
            h.pool("other", pinned("empty", &address)).await;
        }
        let changes = work(&h) - before;
        assert!(changes <= 3 * N as u64, "{changes}");
        assert_eq!(h.waiting().len(), N);
        h.delete("w/holder").await;
        assert_eq!(h.status("w/s0"), "10.0.0.1 @small");
        assert_eq!(h.waiting().len(), N - 1);
    }

    /// The work of N Services added and deleted in turn, each freeing an
    /// IPv4 address of pool `a`.
    async fn work_of_unrelated_churn(h: &Harness) -> u64 {
        let before = work(h);
        for i in 0..N {
            h.add(svc(&format!("ns/s{i}"))).await;
            h.delete(&format!("ns/s{i}")).await;
        }
        work(h) - before
    }

    /// Half-served PreferDualStack Services wait for an IPv6 address that
    /// never comes; churn of other Services (each delete frees an IPv4
    /// address) wakes none of them.
    #[tokio::test(flavor = "current_thread")]
    async fn half_served_dual_stack_services_cost_nothing_per_unrelated_delete() {
        let h = Harness::with_pools(&[("a", addrs(&["10.0.0.0/16", "fd00::1"]))]).await;
        h.add(svc("ns/hog").v6()).await;
        for i in 0..N {
            h.add(svc(&format!("ns/d{i}")).dual("PreferDualStack", false))
                .await;
        }
        assert_eq!(h.waiting().len(), N);
        // One reconciliation for each add and each delete: the old code
        // reconsidered every waiting Service on each delete (N² in all).
        let churn = work_of_unrelated_churn(&h).await;
        assert!(churn <= 3 * N as u64, "{churn}");
        // Freeing the IPv6 address completes the longest waiting.
        h.delete("ns/hog").await;
        assert_eq!(h.status("ns/d0"), "10.0.0.0 fd00::1 @a");
        assert_eq!(h.waiting().len(), N - 1);
    }

    /// The same with a sharing key (each its own port, all on one IPv4
    /// address): such a Service may also get its missing family by sharing
    /// an IPv6 address, so it waits for a holder leaving one, not for any
    /// delete (the old code ran all N on each delete).
    #[tokio::test(flavor = "current_thread")]
    async fn half_served_services_that_may_share_cost_nothing_per_unrelated_delete() {
        let h = Harness::with_pools(&[("a", addrs(&["10.0.0.0/16", "fd00::1"]))]).await;
        h.add(svc("ns/hog").v6()).await;
        for i in 0..N {
            let port = i32::try_from(i).unwrap() + 1;
            let half = svc(&format!("ns/d{i}"))
                .dual("PreferDualStack", false)
                .shared("k")
                .port(port);
            h.add(half).await;
        }
        assert_eq!(h.waiting().len(), N);
        assert_eq!(h.status("ns/d1"), "10.0.0.0 @a");
        let churn = work_of_unrelated_churn(&h).await;
        assert!(churn <= 3 * N as u64, "{churn}");
        // Freeing the IPv6 address completes them all on it, in order.
        h.delete("ns/hog").await;
        assert_eq!(h.status("ns/d0"), "10.0.0.0 fd00::1 @a");
        assert_eq!(h.status(&format!("ns/d{}", N - 1)), "10.0.0.0 fd00::1 @a");
        assert!(h.waiting().is_empty());
    }

    /// The work of N pools of one address each (`p0000` holds 10.1.0.0,
    /// and so on) added one by one.
    async fn work_of_adding_pools(h: &Harness) -> u64 {
        let before = work(h);
        for p in 0..N {
            h.pool(
                &format!("p{p:04}"),
                addrs(&[&format!("10.1.{}.{}/32", p / 256, p % 256)]),
            )
            .await;
        }
        work(h) - before
    }

    /// Pools added one by one beside N Services that hold addresses: the
    /// first pass after each change looks only at what it may touch.
    #[tokio::test(flavor = "current_thread")]
    async fn pools_added_beside_live_services_look_only_at_what_they_touch() {
        let h = Harness::with_pools(&[("a", addrs(&["10.0.0.0/16"]))]).await;
        for i in 0..N {
            h.add(svc(&format!("ns/s{i}"))).await;
        }
        // The old first pass restored all N Services on each change.
        let added = work_of_adding_pools(&h).await;
        assert!(added <= 2 * N as u64, "{added}");
        // A change that moves addresses still reconsiders their holders.
        h.pool("a", addrs(&["10.0.0.0/24"])).await;
        assert_eq!(h.status("ns/s0"), "10.0.0.0 @a");
    }

    /// Namespaces labelled one by one beside N Services that hold
    /// addresses in other namespaces: a pool's selectors read only the
    /// labels of a Service's own Namespace, so the first pass looks at the
    /// holders of the changed Namespace alone (the old one restored all N
    /// on each change). A holder in the changed Namespace that the new
    /// labels no longer allow still moves.
    #[tokio::test(flavor = "current_thread")]
    async fn a_namespace_label_change_looks_only_at_that_namespaces_holders() {
        let h = env_prod_and_a("10.1.5.0/24").await;
        h.namespace("team", &[("env", "prod")]).await;
        h.add(svc("team/s")).await;
        for i in 0..N {
            h.add(svc(&format!("ns{}/s{i}", i % 10))).await;
        }
        assert_eq!(h.status("team/s"), "10.1.5.0 @prod");
        assert!(h.waiting().is_empty());
        let before = work(&h);
        for i in 0..N {
            h.namespace(&format!("new{i}"), &[("env", "dev")]).await;
        }
        assert!(work(&h) - before <= N as u64, "{}", work(&h) - before);
        h.namespace("ns3", &[("env", "dev")]).await;
        assert_eq!(h.status("ns3/s3"), "10.0.0.3 @a");
        h.take();
        h.namespace("team", &[("env", "dev")]).await;
        assert_eq!(h.status("team/s"), "10.0.1.144 @a");
        assert_eq!(
            events(&h.take()),
            ["team/s Normal ClearAssignment", "team/s Normal IPAllocated"]
        );
    }

    /// N holders in one Namespace, which is then relabelled N times with a
    /// label no pool's selectors read (the old code restored all N on each
    /// change: N² in all); then a small Namespace moved in and out of a
    /// pinned pool N times, which costs its one holder each time, not a
    /// look at every holder's key. A change that matters still moves.
    #[tokio::test(flavor = "current_thread")]
    async fn namespace_changes_cost_what_they_may_touch() {
        let h = env_prod_and_a("10.1.4.0/22").await;
        h.namespace("big", &[("env", "prod")]).await;
        for i in 0..N {
            h.add(svc(&format!("big/s{i}"))).await;
        }
        h.namespace("small", &[("env", "dev")]).await;
        h.add(svc("small/s")).await;
        assert_eq!(h.status("big/s0"), "10.1.4.0 @prod");
        assert_eq!(h.status("small/s"), "10.0.0.0 @a");
        let before = work(&h);
        for i in 0..N {
            h.namespace("big", &[("env", "prod"), ("rev", &i.to_string())])
                .await;
        }
        assert_eq!(work(&h) - before, 0);
        let before = work(&h);
        for i in 0..N {
            let env = if i % 2 == 0 { "prod" } else { "dev" };
            h.namespace("small", &[("env", env)]).await;
        }
        // Restored and kept each time: prod serves it, but it keeps `a`.
        assert!(work(&h) - before <= N as u64, "{}", work(&h) - before);
        assert_eq!(h.status("small/s"), "10.0.0.0 @a");
        h.take();
        h.namespace("big", &[("env", "dev")]).await;
        assert_eq!(h.status("big/s0"), "10.0.0.1 @a");
        let events = events(&h.take());
        assert_eq!(events.len(), 2 * N, "{events:?}");
    }

    /// A harness with the pool `prod` (`addresses`) for Namespaces labelled
    /// `env: prod`, and the pool `a` for all.
    async fn env_prod_and_a(addresses: &str) -> Harness {
        Harness::with_pools(&[
            (
                "prod",
                json!({
                    "addresses": [addresses],
                    "serviceAllocation": {"namespaceSelectors": [{"matchLabels": {"env": "prod"}}]},
                }),
            ),
            ("a", addrs(&["10.0.0.0/16"])),
        ])
        .await
    }

    /// N Services whose request is invalid, then N pools added one by
    /// one: no pool makes a request valid, so the first pass after each
    /// change does not look at them (it restored and ran all N on each,
    /// since each had a Warning). Fixed, one gets an address at once.
    #[tokio::test(flavor = "current_thread")]
    async fn invalid_requests_are_not_run_again_for_each_pool_change() {
        let h = Harness::with_pools(&[]).await;
        for i in 0..N {
            let invalid = svc(&format!("ns/s{i}")).ann("metallb.io/loadBalancerIPs", "not-an-ip");
            h.add(invalid).await;
        }
        assert!(h.waiting().is_empty());
        let added = work_of_adding_pools(&h).await;
        assert!(added <= 2 * N as u64, "{added}");
        h.take();
        h.edit("ns/s7", |s| s.ann("metallb.io/loadBalancerIPs", "10.1.0.9"))
            .await;
        assert_eq!(h.status("ns/s7"), "10.1.0.9 @p0009");
    }

    /// N Services each naming a pool that does not exist yet, then the N
    /// pools added one by one: each pool change looks at the Services that
    /// named it, not at every waiting one (the old code restored and ran
    /// all that still waited on each change: about N² in all). Each gets
    /// its pool's address as it comes.
    #[tokio::test(flavor = "current_thread")]
    async fn services_waiting_for_the_pool_they_name_cost_nothing_per_other_pool() {
        let h = Harness::with_pools(&[]).await;
        for i in 0..N {
            h.add(svc(&format!("ns/s{i}")).in_pool(&format!("p{i:04}")))
                .await;
        }
        assert_eq!(h.waiting().len(), N);
        let added = work_of_adding_pools(&h).await;
        assert!(added <= 3 * N as u64, "{added}");
        assert!(h.waiting().is_empty());
        for i in [0, 7, N - 1] {
            let address = format!("10.1.{}.{}", i / 256, i % 256);
            assert_eq!(h.status(&format!("ns/s{i}")), format!("{address} @p{i:04}"));
        }
    }

    /// The same for N Services each asking for an address outside every
    /// pool: a pool change looks at those asking for one of its addresses
    /// (before or after the change) alone.
    #[tokio::test(flavor = "current_thread")]
    async fn services_asking_for_an_address_outside_the_pools_cost_nothing_per_other_pool() {
        let h = Harness::with_pools(&[]).await;
        for i in 0..N {
            let address = format!("10.1.{}.{}", i / 256, i % 256);
            h.add(svc(&format!("ns/s{i}")).request(&address)).await;
        }
        assert_eq!(h.waiting().len(), N);
        let added = work_of_adding_pools(&h).await;
        assert!(added <= 3 * N as u64, "{added}");
        assert!(h.waiting().is_empty());
        assert_eq!(h.status("ns/s9"), "10.1.0.9 @p0009");
        // A pool that drops an address: its Service waits again, and
        // comes back with the pool that takes the address in.
        h.pool("p0009", addrs(&["10.2.0.9/32"])).await;
        assert_eq!(h.status("ns/s9"), "none");
        h.pool("q", addrs(&["10.1.0.9/32"])).await;
        assert_eq!(h.status("ns/s9"), "10.1.0.9 @q");
    }

    /// The same for N Services, each in its own Namespace, naming a pool
    /// that serves Namespaces labelled `env: prod`: labelling a Namespace
    /// looks at the Services in it alone.
    #[tokio::test(flavor = "current_thread")]
    async fn services_refused_for_their_namespace_cost_nothing_per_other_namespace() {
        let h = env_prod_and_a("10.1.0.0/16").await;
        for i in 0..N {
            h.add(svc(&format!("n{i}/s")).in_pool("prod")).await;
        }
        assert_eq!(h.waiting().len(), N);
        let before = work(&h);
        for i in 0..N {
            h.namespace(&format!("n{i}"), &[("env", "prod")]).await;
        }
        assert!(work(&h) - before <= 3 * N as u64, "{}", work(&h) - before);
        assert!(h.waiting().is_empty());
        assert_eq!(h.status("n0/s"), "10.1.0.0 @prod");
        assert_eq!(h.status(&format!("n{}/s", N - 1)), "10.1.1.143 @prod");
    }

    use support::Step;

    const PARKED: [&str; 7] = [
        "ns/s1", "ns/s2", "team/s3", "ns/s4", "ns/s5", "ns/s6", "ns/s7",
    ];

    fn step(h: &Harness) -> Step {
        support::step(h, &PARKED, |key| {
            format!("{} / {}", h.status(key), h.condition(key))
        })
    }

    /// Services that failed for the configuration alone (a pool unknown,
    /// rejected, of Cilium, not serving their Namespace; an address outside
    /// every pool, or in another pool than the one named), through changes
    /// of other pools, of the pools they wait on, of a pool whose
    /// acceptance another's delete changes, and of their Namespace.
    async fn parked_steps(config: ControllerConfig) -> Vec<Step> {
        let h = Harness::unsynced(config);
        let mut steps = Vec::new();
        let prod = json!({
            "addresses": ["10.0.3.0/30"],
            "serviceAllocation": {"namespaceSelectors": [{"matchLabels": {"env": "prod"}}]},
        });
        h.pool("a", addrs(&["10.0.0.0/29"])).await;
        h.pool("prod", prod).await;
        h.cilium_pool("cp", support::blocks(&["10.0.5.0/30"])).await;
        h.sync().await;
        steps.push(step(&h));
        h.add(svc("ns/s1").in_pool("late")).await;
        h.add(svc("ns/s2").request("10.9.0.1")).await;
        h.add(svc("team/s3").in_pool("prod")).await;
        h.add(svc("ns/s4").in_pool("b").request("10.0.0.1")).await;
        h.add(svc("ns/s5").in_pool("cp")).await;
        h.add(svc("ns/s6").in_pool("m")).await;
        h.add(svc("ns/s7").in_pool("a").request("10.0.9.1")).await;
        steps.push(step(&h));
        for (name, range) in [("other", "10.0.7.0/30"), ("late", "10.0.8.0/30")] {
            h.pool(name, addrs(&[range])).await;
            steps.push(step(&h));
        }
        h.pool("x", addrs(&["10.9.0.0/30"])).await;
        steps.push(step(&h));
        h.namespace("team", &[("env", "dev")]).await;
        steps.push(step(&h));
        h.namespace("team", &[("env", "prod")]).await;
        steps.push(step(&h));
        h.pool("b", addrs(&["10.0.10.0/30"])).await;
        steps.push(step(&h));
        h.pool("a", addrs(&["10.0.1.0/29", "10.0.9.0/30"])).await;
        steps.push(step(&h));
        h.pool("b", addrs(&["10.0.0.0/30"])).await;
        steps.push(step(&h));
        // m overlaps the older Cilium pool cm: rejected until cm goes.
        h.cilium_pool("cm", support::blocks(&["10.0.6.0/30"])).await;
        h.pool("m", addrs(&["10.0.6.0/31"])).await;
        steps.push(step(&h));
        h.delete_cilium_pool("cm").await;
        steps.push(step(&h));
        h.delete_cilium_pool("cp").await;
        h.pool("cp", addrs(&["10.0.11.0/30"])).await;
        steps.push(step(&h));
        h.delete_pool("late").await;
        steps.push(step(&h));
        steps
    }

    #[tokio::test]
    async fn parked_waits_give_the_same_result_without_shortcuts() {
        let fast = parked_steps(ControllerConfig::default()).await;
        let full = parked_steps(support::exhaustive()).await;
        support::assert_same_steps(&fast, &full);
        // Each got an address once what it waited on changed; the last
        // step took s1's pool away again.
        for key in PARKED {
            let served = format!("{key}: 10.");
            assert!(
                fast.iter()
                    .any(|(_, shown)| shown.iter().any(|s| s.starts_with(&served))),
                "{key} never got an address: {fast:#?}"
            );
        }
        let last = &fast.last().unwrap().1;
        assert!(
            last[0].starts_with("ns/s1: none / False UnknownPool"),
            "{last:#?}"
        );
    }

    /// Deletes from one big sharing group: a delete asks whether the
    /// address it left is still held, not who holds it (the old code
    /// listed every other holder on each delete: N² in all).
    #[tokio::test(flavor = "current_thread")]
    async fn a_delete_from_a_big_sharing_group_does_not_list_its_holders() {
        let h = Harness::with_pools(&[("a", addrs(&["10.0.0.0/30"]))]).await;
        for i in 0..N {
            let port = i32::try_from(i + 1).unwrap();
            h.add(svc(&format!("ns/s{i}")).shared("k").port(port)).await;
        }
        assert_eq!(h.status("ns/s399"), "10.0.0.0 @a");
        let before = h.controller.allocator_steps();
        for i in (0..N).step_by(2) {
            h.delete(&format!("ns/s{i}")).await;
        }
        let steps = h.controller.allocator_steps() - before;
        // The old code: 60,000 (the holders left, 400 down to 200, listed
        // on each of 200 deletes).
        assert!(
            steps <= 10 * N as u64,
            "{steps} steps for {} deletes",
            N / 2
        );
        // The last holder's delete frees the address for a waiting one.
        h.add(svc("ns/alone")).await;
        h.add(svc("ns/late")).await;
        h.add(svc("ns/later")).await;
        h.add(svc("ns/waits")).await;
        assert_eq!(h.waiting(), ["ns/waits"]);
        for i in (1..N).step_by(2) {
            h.delete(&format!("ns/s{i}")).await;
        }
        assert_eq!(h.status("ns/waits"), "10.0.0.0 @a");
    }

    /// Services that may share, each with a key of its own, wait on a full
    /// pool while Services of another Namespace take and free addresses
    /// of a pool that serves only them: no such delete frees anything the
    /// waiting could use, so none of them is woken (the old code
    /// reconsidered each on every delete: N² in all). A holder that
    /// changes its ports in place wakes no one (§4.6), but the next delete
    /// that releases something wakes those that may fit now.
    #[tokio::test(flavor = "current_thread")]
    async fn sharing_services_wait_for_a_change_of_holders_not_for_any_delete() {
        let other =
            json!({"addresses": ["10.0.1.0/24"], "serviceAllocation": {"namespaces": ["other"]}});
        let h = Harness::with_pools(&[("a", addrs(&["10.0.0.1/32"])), ("b", other)]).await;
        h.add(svc("ns/holder").shared("k").port(80)).await;
        h.add(svc("ns/joiner").shared("k").port(80)).await;
        for i in 0..N {
            h.add(svc(&format!("ns/w{i}")).shared(&format!("k{i}")).port(80))
                .await;
        }
        assert_eq!(h.waiting().len(), N + 1);
        let before = work(&h);
        for i in 0..N {
            let key = format!("other/c{i}");
            h.add(svc(&key)).await;
            assert_eq!(h.status(&key), "10.0.1.0 @b");
            h.delete(&key).await;
        }
        assert!(work(&h) - before <= 3 * N as u64, "{}", work(&h) - before);
        h.edit("ns/holder", |s| s.port(81)).await;
        assert_eq!(h.status("ns/joiner"), "none");
        h.add(svc("other/x")).await;
        assert_eq!(h.status("ns/joiner"), "none");
        h.delete("other/x").await;
        assert_eq!(h.status("ns/joiner"), "10.0.0.1 @a");
        assert_eq!(h.waiting().len(), N);
    }
}

/// docs/allocation.md §4.7: the `metallb.io/AddressAssigned` condition, one
/// reason per outcome, the message being the Event's.
mod s4_7_conditions {
    use super::*;

    fn reason_of(h: &Harness, key: &str) -> String {
        let condition = h.condition(key);
        condition.split(':').next().unwrap_or_default().to_owned()
    }

    #[tokio::test]
    async fn a_reason_for_every_outcome() {
        let h = Harness::with_pools(&[
            ("a", addrs(&["10.0.0.1-10.0.0.2"])),
            (
                "buggy",
                json!({"addresses": ["10.0.1.0/24"], "avoidBuggyIPs": true, "autoAssign": false}),
            ),
            (
                "pinned",
                json!({"addresses": ["10.0.2.0/30"], "serviceAllocation": {"namespaces": ["other"]}}),
            ),
        ])
        .await;
        h.add(svc("ns/ok").shared("k").ports(&[("TCP", 80)])).await;
        h.add(svc("ns/second")).await;
        h.add(svc("ns/full")).await;
        h.add(svc("ns/unknown").in_pool("nope")).await;
        h.add(svc("ns/not-served").in_pool("pinned")).await;
        h.add(svc("ns/outside").request("10.9.9.9")).await;
        h.add(svc("ns/avoided").request("10.0.1.0")).await;
        h.add(svc("ns/in-use").request("10.0.0.2")).await;
        h.add(
            svc("ns/refused")
                .request("10.0.0.1")
                .shared("k")
                .ports(&[("TCP", 80)]),
        )
        .await;
        h.add(svc("ns/family").request("fd00::1")).await;
        h.add(svc("ns/no-v6").v6().in_pool("buggy")).await;
        h.add(svc("ns/headless").headless()).await;
        h.add(svc("ns/invalid").request("x")).await;
        let expected = [
            ("ns/ok", "True Assigned"),
            ("ns/second", "True Assigned"),
            ("ns/full", "False PoolExhausted"),
            ("ns/unknown", "False UnknownPool"),
            ("ns/not-served", "False PoolDoesNotServe"),
            ("ns/outside", "False AddressOutsidePools"),
            ("ns/avoided", "False AddressAvoided"),
            ("ns/in-use", "False AddressInUse"),
            ("ns/refused", "False SharingRefused"),
            ("ns/family", "False WrongFamily"),
            ("ns/no-v6", "False FamilyUnavailable"),
            ("ns/headless", "False NoClusterIP"),
            ("ns/invalid", "False InvalidRequest"),
        ];
        for (key, reason) in expected {
            assert_eq!(reason_of(&h, key), reason, "{key}: {}", h.condition(key));
        }
        // The message is the Event's.
        assert_eq!(
            h.condition("ns/full"),
            "False PoolExhausted: Failed to allocate IP for \"ns/full\": \
             no available IPs: no pool has an IPv4 address free (tried a)"
        );
        assert_eq!(
            h.condition("ns/ok"),
            "True Assigned: Assigned IP [\"10.0.0.1\"]"
        );
        // A Service with no pool serving it at all.
        let h = Harness::with_pools(&[(
            "pinned",
            json!({"addresses": ["10.0.2.0/30"], "serviceAllocation": {"namespaces": ["other"]}}),
        )])
        .await;
        h.add(svc("ns/none")).await;
        assert_eq!(reason_of(&h, "ns/none"), "False NoPoolServes");
    }

    #[tokio::test]
    async fn other_conditions_stay_and_ours_goes_when_the_service_stops_being_ours() {
        let h = Harness::with_pools(&[("a", addrs(&["10.0.0.1-10.0.0.2"]))]).await;
        let theirs = json!([{
            "type": "example.com/Ready",
            "status": "True",
            "reason": "Fine",
            "message": "theirs",
            "lastTransitionTime": "2024-01-01T00:00:00Z",
        }]);
        h.add(svc("ns/a").set(&["status", "conditions"], theirs))
            .await;
        let types = |h: &Harness| -> Vec<String> {
            let service = h.service("ns/a");
            let conditions = service.status.as_ref().unwrap().conditions.clone();
            conditions
                .unwrap_or_default()
                .into_iter()
                .map(|c| c.type_)
                .collect()
        };
        assert_eq!(types(&h), ["example.com/Ready", CONDITION_TYPE]);
        h.edit("ns/a", |s| s.kind("ClusterIP")).await;
        assert_eq!(types(&h), ["example.com/Ready"]);
        assert_eq!(h.status("ns/a"), "none");
    }

    #[tokio::test]
    async fn the_transition_time_moves_only_when_the_status_does() {
        let h = Harness::with_pools(&[("a", addrs(&["10.0.0.1"]))]).await;
        h.add(svc("ns/holder")).await;
        h.add(svc("ns/w")).await;
        let condition = |h: &Harness| {
            let service = h.service("ns/w");
            service
                .status
                .as_ref()
                .unwrap()
                .conditions
                .as_ref()
                .unwrap()
                .iter()
                .find(|c| c.type_ == CONDITION_TYPE)
                .cloned()
                .unwrap()
        };
        let first = condition(&h);
        assert_eq!(first.status, "False");
        // Another failure, same status: the time stays (the store writes
        // every change at one time, its clock, so change it by hand first).
        h.edit("ns/w", |s| {
            let mut s = s;
            s.0["status"]["conditions"][0]["lastTransitionTime"] = json!("2020-01-01T00:00:00Z");
            s.in_pool("gone")
        })
        .await;
        let second = condition(&h);
        assert_eq!(second.reason, "UnknownPool");
        assert_eq!(
            second.last_transition_time.0.to_string(),
            "2020-01-01T00:00:00Z"
        );
        // Assigned at last: the status changes, so does the time.
        h.edit("ns/w", |s| s.no_ann("metallb.io/address-pool"))
            .await;
        h.delete("ns/holder").await;
        let third = condition(&h);
        assert_eq!(third.status, "True");
        assert_ne!(
            third.last_transition_time.0.to_string(),
            "2020-01-01T00:00:00Z"
        );
    }
}
