//! Decoding a line without building what the replay never reads
//! (docs/replay.md §1.3).
//!
//! A line is read in passes over its text, none of which builds a JSON tree:
//! the event (`type`, and `object` kept as borrowed raw JSON), the object's
//! `apiVersion` and `kind`, then the object into a lean type of its kind that
//! keeps only the fields the controller and the result read. Every other
//! field the kind declares is checked for its JSON type (a string where a
//! list belongs is still an error) and skipped without being built; unknown
//! fields are skipped, as k8s-openapi does. A `BOOKMARK`'s object, a
//! `managedFields` list or an annotation nobody reads thus costs nothing but
//! the time to scan it.
//!
//! As with a JSON object decoded into a map, a key given twice counts once,
//! the last one.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, Namespace, Service, ServicePort, ServiceSpec,
    ServiceStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

/// Annotation prefixes whose annotations are kept: the ones the rules read
/// (MetalLB's, under both prefixes, and Cilium LB-IPAM's). Every other
/// annotation is checked to be a string and dropped.
pub(crate) const KEPT_ANNOTATION_PREFIXES: [&str; 4] = [
    "metallb.io/",
    "metallb.universe.tf/",
    "lbipam.cilium.io/",
    "io.cilium/",
];

/// Whether the annotation `key` is kept.
pub(crate) fn is_kept_annotation(key: &str) -> bool {
    KEPT_ANNOTATION_PREFIXES
        .iter()
        .any(|prefix| key.starts_with(prefix))
}

/// A map key, borrowed from the line when it has no escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, text: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(text)))
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(text.to_owned())))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// What a visitor that accepts anything saw: the JSON type of a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    Null,
    Bool,
    Integer,
    Float,
    Str,
    Seq,
    Map,
}

/// Accepts any value, builds nothing of it but strings (when `keep_str`),
/// and tells what it was.
struct AnyVisitor {
    keep_str: bool,
}

/// The value an [`AnyVisitor`] returns.
struct Any {
    seen: Seen,
    text: Option<String>,
}

impl Any {
    fn of(seen: Seen) -> Self {
        Any { seen, text: None }
    }
}

impl<'de> Visitor<'de> for AnyVisitor {
    type Value = Any;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Any, E> {
        Ok(Any::of(Seen::Null))
    }
    fn visit_none<E: de::Error>(self) -> Result<Any, E> {
        Ok(Any::of(Seen::Null))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Any, E> {
        Ok(Any::of(Seen::Bool))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Any, E> {
        Ok(Any::of(Seen::Integer))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Any, E> {
        Ok(Any::of(Seen::Integer))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Any, E> {
        Ok(Any::of(Seen::Float))
    }
    fn visit_str<E: de::Error>(self, text: &str) -> Result<Any, E> {
        Ok(Any {
            seen: Seen::Str,
            text: self.keep_str.then(|| text.to_owned()),
        })
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Any, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Any::of(Seen::Seq))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Any, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Any::of(Seen::Map))
    }
}

/// A string, or `None` for any other value (skipped): for the fields that
/// decide how the rest is read (`type`, `apiVersion`, `kind`) and for the
/// names in error messages.
#[derive(Debug, Default)]
struct LooseStr(Option<String>, Option<Seen>);

impl<'de> Deserialize<'de> for LooseStr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let any = deserializer.deserialize_any(AnyVisitor { keep_str: true })?;
        Ok(LooseStr(any.text, Some(any.seen)))
    }
}

/// A field the kind declares but the replay does not read: its JSON type is
/// checked (null is allowed, as for any optional field) and it is skipped.
macro_rules! checked {
    ($(#[$doc:meta])* $name:ident, $expecting:literal, $($seen:ident)|+) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub(crate) struct $name;

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let any = deserializer.deserialize_any(AnyVisitor { keep_str: false })?;
                match any.seen {
                    Seen::Null $(| Seen::$seen)+ => Ok($name),
                    other => Err(de::Error::invalid_type(unexpected(other), &$expecting)),
                }
            }
        }
    };
}

checked!(
    /// A string, skipped.
    AnyStr, "a string", Str
);
checked!(
    /// A boolean, skipped.
    AnyBool, "a boolean", Bool
);
checked!(
    /// An integer, skipped.
    AnyInt, "an integer", Integer
);
checked!(
    /// An integer or a string (`targetPort`), skipped.
    AnyIntOrStr, "an integer or a string", Integer | Str
);
checked!(
    /// A list, skipped.
    AnySeq, "a sequence", Seq
);
checked!(
    /// An object, skipped.
    AnyMap, "a map", Map
);

fn unexpected(seen: Seen) -> de::Unexpected<'static> {
    match seen {
        Seen::Null => de::Unexpected::Unit,
        Seen::Bool => de::Unexpected::Other("boolean"),
        Seen::Integer => de::Unexpected::Other("integer"),
        Seen::Float => de::Unexpected::Other("floating point number"),
        Seen::Str => de::Unexpected::Other("string"),
        Seen::Seq => de::Unexpected::Seq,
        Seen::Map => de::Unexpected::Map,
    }
}

/// A field that may be given as null: whether it was given at all.
#[derive(Debug, Default)]
pub(crate) struct Given<T>(pub(crate) Option<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Given<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(deserializer).map(|value| Given(Some(value)))
    }
}

/// A struct read from a JSON object: the listed fields by their JSON name
/// (the last one wins when a key is repeated), every other key skipped.
macro_rules! lean {
    ($(#[$doc:meta])* $name:ident, $expecting:literal { $($field:ident: $ty:ty = $json:literal,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Default)]
        pub(crate) struct $name {
            $(pub(crate) $field: $ty,)*
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct LeanVisitor;
                impl<'de> Visitor<'de> for LeanVisitor {
                    type Value = $name;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($expecting)
                    }
                    #[allow(unused_mut)]
                    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<$name, A::Error> {
                        let mut value = $name::default();
                        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
                            match &*key {
                                $($json => value.$field = map.next_value()?,)*
                                _ => {
                                    map.next_value::<IgnoredAny>()?;
                                }
                            }
                        }
                        Ok(value)
                    }
                }
                deserializer.deserialize_map(LeanVisitor)
            }
        }
    };
}

lean!(
    /// `metadata`: what the rules read (name, namespace, labels, the kept
    /// annotations) and what the store keeps of an object's identity.
    LeanMeta, "ObjectMeta" {
        name: Option<String> = "name",
        namespace: Option<String> = "namespace",
        uid: Option<String> = "uid",
        resource_version: Option<String> = "resourceVersion",
        generation: Option<i64> = "generation",
        creation_timestamp: Option<Time> = "creationTimestamp",
        deletion_timestamp: Option<Time> = "deletionTimestamp",
        labels: Option<BTreeMap<String, String>> = "labels",
        annotations: Option<KeptAnnotations> = "annotations",
        deletion_grace_period_seconds: Option<AnyInt> = "deletionGracePeriodSeconds",
        finalizers: Option<AnySeq> = "finalizers",
        generate_name: Option<AnyStr> = "generateName",
        managed_fields: Option<AnySeq> = "managedFields",
        owner_references: Option<AnySeq> = "ownerReferences",
        self_link: Option<AnyStr> = "selfLink",
    }
);

/// `metadata.annotations`: the kept ones (see [`is_kept_annotation`]); the
/// others are checked to be strings and dropped.
#[derive(Debug, Default)]
pub(crate) struct KeptAnnotations(pub(crate) BTreeMap<String, String>);

impl<'de> Deserialize<'de> for KeptAnnotations {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct AnnotationsVisitor;
        impl<'de> Visitor<'de> for AnnotationsVisitor {
            type Value = KeptAnnotations;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<KeptAnnotations, A::Error> {
                let mut kept = BTreeMap::new();
                while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
                    if is_kept_annotation(&key) {
                        let value: String = map.next_value()?;
                        kept.insert(key.into_owned(), value);
                    } else {
                        // A string, like any annotation; null is not one.
                        map.next_value::<StrOnly>()?;
                    }
                }
                Ok(KeptAnnotations(kept))
            }
        }
        deserializer.deserialize_map(AnnotationsVisitor)
    }
}

/// A string (null refused), skipped.
struct StrOnly;

impl<'de> Deserialize<'de> for StrOnly {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let any = deserializer.deserialize_any(AnyVisitor { keep_str: false })?;
        match any.seen {
            Seen::Str => Ok(StrOnly),
            other => Err(de::Error::invalid_type(unexpected(other), &"a string")),
        }
    }
}

lean!(
    /// A Service: metadata, spec, and status (whether given at all matters).
    LeanService, "Service" {
        metadata: Option<LeanMeta> = "metadata",
        spec: Option<LeanSpec> = "spec",
        status: Given<Option<LeanStatus>> = "status",
    }
);

lean!(
    /// `spec` of a Service: what the rules read.
    LeanSpec, "ServiceSpec" {
        type_: Option<String> = "type",
        cluster_ip: Option<String> = "clusterIP",
        cluster_ips: Option<Vec<String>> = "clusterIPs",
        ip_families: Option<Vec<String>> = "ipFamilies",
        ip_family_policy: Option<String> = "ipFamilyPolicy",
        load_balancer_class: Option<String> = "loadBalancerClass",
        load_balancer_ip: Option<String> = "loadBalancerIP",
        external_traffic_policy: Option<String> = "externalTrafficPolicy",
        selector: Option<BTreeMap<String, String>> = "selector",
        ports: Option<Vec<LeanPort>> = "ports",
        allocate_load_balancer_node_ports: Option<AnyBool> = "allocateLoadBalancerNodePorts",
        external_ips: Option<AnySeq> = "externalIPs",
        external_name: Option<AnyStr> = "externalName",
        health_check_node_port: Option<AnyInt> = "healthCheckNodePort",
        internal_traffic_policy: Option<AnyStr> = "internalTrafficPolicy",
        load_balancer_source_ranges: Option<AnySeq> = "loadBalancerSourceRanges",
        publish_not_ready_addresses: Option<AnyBool> = "publishNotReadyAddresses",
        session_affinity: Option<AnyStr> = "sessionAffinity",
        session_affinity_config: Option<AnyMap> = "sessionAffinityConfig",
        traffic_distribution: Option<AnyStr> = "trafficDistribution",
    }
);

lean!(
    /// One of `spec.ports`: its protocol and port, all the rules read (a
    /// missing port is 0, as k8s-openapi reads it).
    LeanPort, "ServicePort" {
        port: Option<i32> = "port",
        protocol: Option<String> = "protocol",
        app_protocol: Option<AnyStr> = "appProtocol",
        name: Option<AnyStr> = "name",
        node_port: Option<AnyInt> = "nodePort",
        target_port: Option<AnyIntOrStr> = "targetPort",
    }
);

lean!(
    /// `status` of a Service: the ingress addresses and the conditions.
    LeanStatus, "ServiceStatus" {
        load_balancer: Option<LeanLoadBalancer> = "loadBalancer",
        conditions: Option<Vec<Condition>> = "conditions",
    }
);

lean!(
    /// `status.loadBalancer`.
    LeanLoadBalancer, "LoadBalancerStatus" {
        ingress: Option<Vec<LeanIngress>> = "ingress",
    }
);

lean!(
    /// One of `status.loadBalancer.ingress`: its `ip`.
    LeanIngress, "LoadBalancerIngress" {
        ip: Option<String> = "ip",
        hostname: Option<AnyStr> = "hostname",
        ip_mode: Option<AnyStr> = "ipMode",
        ports: Option<AnySeq> = "ports",
    }
);

lean!(
    /// A Namespace: only its metadata is read.
    LeanNamespace, "Namespace" {
        metadata: Option<LeanMeta> = "metadata",
        spec: Option<AnyMap> = "spec",
        status: Option<AnyMap> = "status",
    }
);

lean!(
    /// What a DELETED event reads of its object.
    RefObject, "an object" {
        metadata: Option<RefMeta> = "metadata",
    }
);

lean!(
    /// What a DELETED event reads of its metadata.
    RefMeta, "ObjectMeta" {
        name: Option<String> = "name",
        namespace: Option<String> = "namespace",
    }
);

fn shrunk<T>(mut list: Vec<T>) -> Vec<T> {
    list.shrink_to_fit();
    list
}

impl LeanMeta {
    pub(crate) fn into_meta(self) -> ObjectMeta {
        ObjectMeta {
            name: self.name,
            namespace: self.namespace,
            uid: self.uid,
            resource_version: self.resource_version,
            generation: self.generation,
            creation_timestamp: self.creation_timestamp,
            deletion_timestamp: self.deletion_timestamp,
            labels: self.labels,
            annotations: self.annotations.map(|KeptAnnotations(kept)| kept),
            ..ObjectMeta::default()
        }
    }
}

impl LeanService {
    /// The Service as the store keeps it, and whether the line gave a
    /// `status` key (even null).
    pub(crate) fn into_service(self) -> (Service, bool) {
        let has_status = self.status.0.is_some();
        let spec = self.spec.map(|spec| ServiceSpec {
            type_: spec.type_,
            cluster_ip: spec.cluster_ip,
            cluster_ips: spec.cluster_ips.map(shrunk),
            ip_families: spec.ip_families.map(shrunk),
            ip_family_policy: spec.ip_family_policy,
            load_balancer_class: spec.load_balancer_class,
            load_balancer_ip: spec.load_balancer_ip,
            external_traffic_policy: spec.external_traffic_policy,
            selector: spec.selector,
            ports: spec.ports.map(|ports| {
                ports
                    .into_iter()
                    .map(|port| ServicePort {
                        port: port.port.unwrap_or_default(),
                        protocol: port.protocol,
                        ..ServicePort::default()
                    })
                    .collect()
            }),
            ..ServiceSpec::default()
        });
        let status = self.status.0.flatten().map(|status| ServiceStatus {
            load_balancer: status.load_balancer.map(|lb| LoadBalancerStatus {
                ingress: lb.ingress.map(|ingress| {
                    ingress
                        .into_iter()
                        .map(|entry| LoadBalancerIngress {
                            ip: entry.ip,
                            ..LoadBalancerIngress::default()
                        })
                        .collect()
                }),
            }),
            conditions: status.conditions.map(shrunk),
        });
        let service = Service {
            metadata: self.metadata.map(LeanMeta::into_meta).unwrap_or_default(),
            spec,
            status,
        };
        (service, has_status)
    }
}

impl LeanNamespace {
    pub(crate) fn into_namespace(self) -> Namespace {
        Namespace {
            metadata: self.metadata.map(LeanMeta::into_meta).unwrap_or_default(),
            ..Namespace::default()
        }
    }
}

/// The `type` of an event line.
#[derive(Debug)]
pub(crate) enum TypeField {
    /// No `type`, or null.
    Missing,
    Text(String),
    /// Not a string.
    Other,
}

/// An event line, its object left as raw JSON.
#[derive(Debug)]
pub(crate) enum Top<'a> {
    Event {
        event_type: TypeField,
        object: Option<&'a RawValue>,
        /// A top-level `kind` string (a bare object or a List has one).
        kind: Option<String>,
        /// Whether there is a top-level `items` key (a List).
        items: bool,
    },
    /// Not a JSON object.
    NotAnObject,
}

impl<'de> Deserialize<'de> for Top<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TopVisitor;
        impl<'de> Visitor<'de> for TopVisitor {
            type Value = Top<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top<'de>, A::Error> {
                let mut event_type = TypeField::Missing;
                let mut object = None;
                let mut kind = None;
                let mut items = false;
                while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
                    match &*key {
                        "kind" => kind = map.next_value::<LooseStr>()?.0,
                        "items" => {
                            items = true;
                            map.next_value::<IgnoredAny>()?;
                        }
                        "type" => {
                            let LooseStr(text, seen) = map.next_value()?;
                            event_type = match (text, seen) {
                                (Some(text), _) => TypeField::Text(text),
                                (None, Some(Seen::Null)) => TypeField::Missing,
                                (None, _) => TypeField::Other,
                            };
                        }
                        "object" => object = Some(map.next_value::<&'de RawValue>()?),
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(Top::Event {
                    event_type,
                    object,
                    kind,
                    items,
                })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Top<'de>, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Top::NotAnObject)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Top<'de>, E> {
                Ok(Top::NotAnObject)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Top<'de>, E> {
                Ok(Top::NotAnObject)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Top<'de>, E> {
                Ok(Top::NotAnObject)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Top<'de>, E> {
                Ok(Top::NotAnObject)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Top<'de>, E> {
                Ok(Top::NotAnObject)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Top<'de>, E> {
                Ok(Top::NotAnObject)
            }
        }
        deserializer.deserialize_any(TopVisitor)
    }
}

/// The object's `apiVersion` and `kind`, the rest skipped.
#[derive(Debug)]
pub(crate) enum Header {
    Object {
        api_version: Option<String>,
        kind: Option<String>,
    },
    NotAnObject,
}

impl<'de> Deserialize<'de> for Header {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct HeaderVisitor;
        impl<'de> Visitor<'de> for HeaderVisitor {
            type Value = Header;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Header, A::Error> {
                let mut api_version = None;
                let mut kind = None;
                while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
                    match &*key {
                        "apiVersion" => api_version = map.next_value::<LooseStr>()?.0,
                        "kind" => kind = map.next_value::<LooseStr>()?.0,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(Header::Object { api_version, kind })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Header, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Header::NotAnObject)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Header, E> {
                Ok(Header::NotAnObject)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Header, E> {
                Ok(Header::NotAnObject)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Header, E> {
                Ok(Header::NotAnObject)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Header, E> {
                Ok(Header::NotAnObject)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Header, E> {
                Ok(Header::NotAnObject)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Header, E> {
                Ok(Header::NotAnObject)
            }
        }
        deserializer.deserialize_any(HeaderVisitor)
    }
}

/// `metadata.name` and `metadata.namespace` read loosely (anything that is
/// not a string is none), for error messages.
#[derive(Debug, Default)]
pub(crate) struct Hint {
    pub(crate) name: Option<String>,
    pub(crate) namespace: Option<String>,
}

impl<'de> Deserialize<'de> for Hint {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct HintVisitor {
            top: bool,
        }
        impl<'de> Visitor<'de> for HintVisitor {
            type Value = Hint;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Hint, A::Error> {
                let mut hint = Hint::default();
                while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
                    match (self.top, &*key) {
                        (true, "metadata") => {
                            hint = map.next_value_seed(HintSeed)?;
                        }
                        (false, "name") => hint.name = map.next_value::<LooseStr>()?.0,
                        (false, "namespace") => hint.namespace = map.next_value::<LooseStr>()?.0,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(hint)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Hint, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Hint::default())
            }
            fn visit_unit<E: de::Error>(self) -> Result<Hint, E> {
                Ok(Hint::default())
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Hint, E> {
                Ok(Hint::default())
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Hint, E> {
                Ok(Hint::default())
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Hint, E> {
                Ok(Hint::default())
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Hint, E> {
                Ok(Hint::default())
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Hint, E> {
                Ok(Hint::default())
            }
        }
        /// The metadata level.
        struct HintSeed;
        impl<'de> de::DeserializeSeed<'de> for HintSeed {
            type Value = Hint;
            fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Hint, D::Error> {
                deserializer.deserialize_any(HintVisitor { top: false })
            }
        }
        deserializer.deserialize_any(HintVisitor { top: true })
    }
}
