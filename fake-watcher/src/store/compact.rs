//! A stored Service in compact form: one byte string per Service, built
//! back into a `Service` when it is read (docs/replay.md §1.3 lists what a
//! stored Service keeps).
//!
//! A `Service` as k8s-openapi holds it takes about 3.4 KB for a Service as
//! `kubectl get -o json` prints it, even with only the fields the replay
//! keeps: an 824-byte struct, a B-tree node per map, a heap block per
//! string. The same Service here is a varint-encoded record of about 150
//! bytes. Keys of labels, annotations and the selector, and the values
//! that come from a small vocabulary (type, protocol, families, policies,
//! condition type, status and reason) are interned in [`Symbols`], counted
//! by the records that use them, so a cluster's vocabulary is kept once;
//! other strings are inline, IPv4 addresses, UUIDs and decimal numbers in
//! binary.
//!
//! A Service with a field outside that set (none comes from a stream, whose
//! decoder drops them) is not encoded: [`encode`] returns `None` and the
//! store keeps it whole.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, Service, ServicePort, ServiceSpec, ServiceStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

/// Interned strings, each counted by the records that use it and dropped
/// with the last one.
#[derive(Debug, Default)]
pub(crate) struct Symbols {
    ids: HashMap<Arc<str>, u32, foldhash::fast::RandomState>,
    /// By id: the text and how many records use it (`None`: a free id).
    table: Vec<Option<(Arc<str>, u32)>>,
    free: Vec<u32>,
}

impl Symbols {
    /// The id of `text`, counted once more.
    fn acquire(&mut self, text: &str) -> u32 {
        if let Some(&id) = self.ids.get(text) {
            if let Some(Some((_, count))) =
                usize::try_from(id).ok().and_then(|i| self.table.get_mut(i))
            {
                *count = count.saturating_add(1);
            }
            return id;
        }
        let text: Arc<str> = Arc::from(text);
        let id = match self.free.pop() {
            Some(id) => {
                if let Some(slot) = usize::try_from(id).ok().and_then(|i| self.table.get_mut(i)) {
                    *slot = Some((Arc::clone(&text), 1));
                }
                id
            }
            None => {
                let id = u32::try_from(self.table.len()).unwrap_or(u32::MAX);
                self.table.push(Some((Arc::clone(&text), 1)));
                id
            }
        };
        self.ids.insert(text, id);
        id
    }

    /// One use of `id` less.
    fn release(&mut self, id: u32) {
        let Some(slot) = usize::try_from(id).ok().and_then(|i| self.table.get_mut(i)) else {
            return;
        };
        let Some((text, count)) = slot else {
            return;
        };
        *count = count.saturating_sub(1);
        if *count == 0 {
            self.ids.remove(text);
            *slot = None;
            self.free.push(id);
        }
    }

    fn text(&self, id: u32) -> &str {
        usize::try_from(id)
            .ok()
            .and_then(|i| self.table.get(i))
            .and_then(Option::as_ref)
            .map_or("", |(text, _)| text)
    }

    /// How many strings are interned (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }
}

/// Text kinds, the low 3 bits of a text's header.
const INLINE: u64 = 0;
const SYMBOL: u64 = 1;
const IPV4: u64 = 2;
const UUID: u64 = 3;
const DECIMAL: u64 = 4;

/// Builds one record: the symbols it uses (counted), then the body, which
/// names them by their place in that list.
struct Encoder<'a> {
    symbols: &'a mut Symbols,
    /// Ids of the symbols used, in order of first use.
    used: Vec<u32>,
    body: Vec<u8>,
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        // The low 7 bits, with the continuation bit.
        out.push((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

impl Encoder<'_> {
    fn varint(&mut self, value: u64) {
        put_varint(&mut self.body, value);
    }

    fn signed(&mut self, value: i64) {
        self.varint(((value << 1) ^ (value >> 63)) as u64);
    }

    fn len(&mut self, len: usize) {
        self.varint(len as u64);
    }

    /// `value`, as a symbol when `intern` (a string from a vocabulary).
    fn text(&mut self, value: &str, intern: bool) {
        if intern {
            let id = self.symbols.acquire(value);
            let local = match self.used.iter().position(|&used| used == id) {
                Some(local) => {
                    // Counted once per record.
                    self.symbols.release(id);
                    local
                }
                None => {
                    self.used.push(id);
                    self.used.len() - 1
                }
            };
            self.varint(((local as u64) << 3) | SYMBOL);
        } else if let Some(ip) = canonical_ipv4(value) {
            self.varint(IPV4);
            self.body.extend_from_slice(&ip.octets());
        } else if let Some(uuid) = canonical_uuid(value) {
            self.varint(UUID);
            self.body.extend_from_slice(&uuid);
        } else if let Some(number) = canonical_decimal(value) {
            self.varint(DECIMAL);
            self.varint(number);
        } else {
            self.varint(((value.len() as u64) << 3) | INLINE);
            self.body.extend_from_slice(value.as_bytes());
        }
    }

    fn opt_text(&mut self, value: Option<&str>, intern: bool) {
        match value {
            None => self.body.push(0),
            Some(value) => {
                self.body.push(1);
                self.text(value, intern);
            }
        }
    }

    fn opt_i64(&mut self, value: Option<i64>) {
        match value {
            None => self.body.push(0),
            Some(value) => {
                self.body.push(1);
                self.signed(value);
            }
        }
    }

    /// `None` if the timestamp does not come back whole from its seconds
    /// and nanoseconds.
    fn time(&mut self, Time(time): &Time) -> Option<()> {
        let (seconds, nanos) = (time.as_second(), time.subsec_nanosecond());
        (Timestamp::new(seconds, nanos).ok()? == *time).then_some(())?;
        self.signed(seconds);
        self.signed(i64::from(nanos));
        Some(())
    }

    fn opt_time(&mut self, value: Option<&Time>) -> Option<()> {
        match value {
            None => self.body.push(0),
            Some(time) => {
                self.body.push(1);
                self.time(time)?;
            }
        }
        Some(())
    }

    fn opt_texts(&mut self, values: Option<&Vec<String>>, intern: bool) {
        match values {
            None => self.body.push(0),
            Some(values) => {
                self.len(values.len() + 1);
                for value in values {
                    self.text(value, intern);
                }
            }
        }
    }

    /// A map: keys interned, values inline.
    fn opt_map(&mut self, map: Option<&BTreeMap<String, String>>) {
        match map {
            None => self.body.push(0),
            Some(map) => {
                self.len(map.len() + 1);
                for (key, value) in map {
                    self.text(key, true);
                    self.text(value, false);
                }
            }
        }
    }

    fn finish(self) -> Box<[u8]> {
        let mut out = Vec::with_capacity(self.body.len() + self.used.len() * 3 + 2);
        put_varint(&mut out, self.used.len() as u64);
        for &id in &self.used {
            put_varint(&mut out, u64::from(id));
        }
        out.extend_from_slice(&self.body);
        out.into_boxed_slice()
    }

    /// Gives back the symbols counted by a record that is not kept.
    fn abandon(self) {
        for id in self.used {
            self.symbols.release(id);
        }
    }
}

/// The record of `service`, stored under `key` (`namespace/name`, which
/// gives back the name and namespace), or `None` if it has a field the
/// record does not keep.
pub(crate) fn encode(service: &Service, key: &str, symbols: &mut Symbols) -> Option<Box<[u8]>> {
    let mut encoder = Encoder {
        symbols,
        used: Vec::new(),
        body: Vec::with_capacity(256),
    };
    match encode_into(&mut encoder, service, key) {
        Some(()) => Some(encoder.finish()),
        None => {
            encoder.abandon();
            None
        }
    }
}

fn encode_into(out: &mut Encoder<'_>, service: &Service, key: &str) -> Option<()> {
    let Service {
        metadata,
        spec,
        status,
    } = service;
    // Every field named, so that a field added to k8s-openapi is not
    // dropped silently: it must be kept here or make the record whole.
    let ObjectMeta {
        annotations,
        creation_timestamp,
        deletion_grace_period_seconds,
        deletion_timestamp,
        finalizers,
        generate_name,
        generation,
        labels,
        managed_fields,
        name,
        namespace,
        owner_references,
        resource_version,
        self_link,
        uid,
    } = metadata;
    let (namespace, name) = (namespace.as_deref()?, name.as_deref()?);
    let from_key = key.split_once('/')?;
    if from_key != (namespace, name) || namespace.contains('/') {
        return None;
    }
    if deletion_grace_period_seconds.is_some()
        || finalizers.is_some()
        || generate_name.is_some()
        || managed_fields.is_some()
        || owner_references.is_some()
        || self_link.is_some()
    {
        return None;
    }
    out.opt_text(uid.as_deref(), false);
    out.opt_text(resource_version.as_deref(), false);
    out.opt_i64(*generation);
    out.opt_time(creation_timestamp.as_ref())?;
    out.opt_time(deletion_timestamp.as_ref())?;
    out.opt_map(labels.as_ref());
    out.opt_map(annotations.as_ref());
    match spec {
        None => out.body.push(0),
        Some(spec) => {
            out.body.push(1);
            encode_spec(out, spec)?;
        }
    }
    match status {
        None => out.body.push(0),
        Some(status) => {
            out.body.push(1);
            encode_status(out, status)?;
        }
    }
    Some(())
}

fn encode_spec(out: &mut Encoder<'_>, spec: &ServiceSpec) -> Option<()> {
    let ServiceSpec {
        allocate_load_balancer_node_ports,
        cluster_ip,
        cluster_ips,
        external_ips,
        external_name,
        external_traffic_policy,
        health_check_node_port,
        internal_traffic_policy,
        ip_families,
        ip_family_policy,
        load_balancer_class,
        load_balancer_ip,
        load_balancer_source_ranges,
        ports,
        publish_not_ready_addresses,
        selector,
        session_affinity,
        session_affinity_config,
        traffic_distribution,
        type_,
    } = spec;
    if allocate_load_balancer_node_ports.is_some()
        || external_ips.is_some()
        || external_name.is_some()
        || health_check_node_port.is_some()
        || internal_traffic_policy.is_some()
        || load_balancer_source_ranges.is_some()
        || publish_not_ready_addresses.is_some()
        || session_affinity.is_some()
        || session_affinity_config.is_some()
        || traffic_distribution.is_some()
    {
        return None;
    }
    out.opt_text(type_.as_deref(), true);
    out.opt_text(cluster_ip.as_deref(), false);
    out.opt_texts(cluster_ips.as_ref(), false);
    out.opt_texts(ip_families.as_ref(), true);
    out.opt_text(ip_family_policy.as_deref(), true);
    out.opt_text(load_balancer_class.as_deref(), true);
    out.opt_text(load_balancer_ip.as_deref(), false);
    out.opt_text(external_traffic_policy.as_deref(), true);
    out.opt_map(selector.as_ref());
    match ports {
        None => out.body.push(0),
        Some(ports) => {
            out.len(ports.len() + 1);
            for port in ports {
                let ServicePort {
                    app_protocol,
                    name,
                    node_port,
                    port,
                    protocol,
                    target_port,
                } = port;
                if app_protocol.is_some()
                    || name.is_some()
                    || node_port.is_some()
                    || target_port.is_some()
                {
                    return None;
                }
                out.signed(i64::from(*port));
                out.opt_text(protocol.as_deref(), true);
            }
        }
    }
    Some(())
}

fn encode_status(out: &mut Encoder<'_>, status: &ServiceStatus) -> Option<()> {
    let ServiceStatus {
        conditions,
        load_balancer,
    } = status;
    match conditions {
        None => out.body.push(0),
        Some(conditions) => {
            out.len(conditions.len() + 1);
            for condition in conditions {
                let Condition {
                    last_transition_time,
                    message,
                    observed_generation,
                    reason,
                    status,
                    type_,
                } = condition;
                out.time(last_transition_time)?;
                out.text(message, false);
                out.opt_i64(*observed_generation);
                out.text(reason, true);
                out.text(status, true);
                out.text(type_, true);
            }
        }
    }
    match load_balancer {
        None => out.body.push(0),
        Some(LoadBalancerStatus { ingress }) => {
            out.body.push(1);
            match ingress {
                None => out.body.push(0),
                Some(ingress) => {
                    out.len(ingress.len() + 1);
                    for entry in ingress {
                        let LoadBalancerIngress {
                            hostname,
                            ip,
                            ip_mode,
                            ports,
                        } = entry;
                        if hostname.is_some() || ip_mode.is_some() || ports.is_some() {
                            return None;
                        }
                        out.opt_text(ip.as_deref(), false);
                    }
                }
            }
        }
    }
    Some(())
}

/// An IPv4 address written as `Ipv4Addr` writes it: four decimal octets,
/// none with a leading zero.
fn canonical_ipv4(text: &str) -> Option<Ipv4Addr> {
    let mut octets = [0_u8; 4];
    let mut parts = text.split('.');
    for octet in &mut octets {
        let part = parts.next()?;
        if part.is_empty()
            || part.len() > 3
            || !part.bytes().all(|b| b.is_ascii_digit())
            || (part.len() > 1 && part.starts_with('0'))
        {
            return None;
        }
        *octet = part.parse().ok()?;
    }
    parts.next().is_none().then_some(Ipv4Addr::from(octets))
}

/// `ip` as `Ipv4Addr` prints it, without the formatting machinery (a read
/// of a Service prints two or three).
fn ipv4_text(octets: [u8; 4]) -> String {
    let mut text = String::with_capacity(15);
    allocator::push_ip(&mut text, IpAddr::V4(Ipv4Addr::from(octets)));
    text
}

/// A UUID in lowercase hex with its four hyphens.
fn canonical_uuid(text: &str) -> Option<[u8; 16]> {
    let bytes = text.as_bytes();
    if bytes.len() != 36 {
        return None;
    }
    let mut uuid = [0_u8; 16];
    let mut nibbles = 0_usize;
    for (at, &byte) in bytes.iter().enumerate() {
        if matches!(at, 8 | 13 | 18 | 23) {
            if byte != b'-' {
                return None;
            }
            continue;
        }
        let value = match byte {
            b'0'..=b'9' => byte - b'0',
            b'a'..=b'f' => byte - b'a' + 10,
            _ => return None,
        };
        let slot = uuid.get_mut(nibbles / 2)?;
        *slot = (*slot << 4) | value;
        nibbles += 1;
    }
    Some(uuid)
}

/// A decimal number as `u64` prints it (no sign, no leading zero).
fn canonical_decimal(text: &str) -> Option<u64> {
    let bytes = text.as_bytes();
    if bytes.is_empty()
        || bytes.len() > 19
        || !bytes.iter().all(u8::is_ascii_digit)
        || (bytes.len() > 1 && bytes.first() == Some(&b'0'))
    {
        return None;
    }
    text.parse().ok()
}

/// Reads a record back. Records are only ever made by [`encode`], so a
/// short or odd one cannot occur; reading one anyway gives empty values,
/// never a panic.
struct Decoder<'a> {
    bytes: &'a [u8],
    symbols: &'a Symbols,
    used: Vec<u32>,
}

impl Decoder<'_> {
    fn byte(&mut self) -> u8 {
        let (&first, rest) = self.bytes.split_first().unwrap_or((&0, &[]));
        self.bytes = rest;
        first
    }

    fn varint(&mut self) -> u64 {
        let mut value = 0_u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte();
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
        }
        value
    }

    fn signed(&mut self) -> i64 {
        let value = self.varint();
        ((value >> 1) as i64) ^ -((value & 1) as i64)
    }

    fn len(&mut self) -> usize {
        usize::try_from(self.varint()).unwrap_or(0)
    }

    fn take(&mut self, count: usize) -> &[u8] {
        let count = count.min(self.bytes.len());
        let (taken, rest) = self.bytes.split_at(count);
        self.bytes = rest;
        taken
    }

    fn text(&mut self) -> String {
        let header = self.varint();
        match header & 7 {
            SYMBOL => {
                let local = usize::try_from(header >> 3).unwrap_or(usize::MAX);
                let id = self.used.get(local).copied().unwrap_or(u32::MAX);
                self.symbols.text(id).to_owned()
            }
            IPV4 => {
                let mut octets = [0_u8; 4];
                for (slot, byte) in octets.iter_mut().zip(self.take(4)) {
                    *slot = *byte;
                }
                ipv4_text(octets)
            }
            UUID => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let mut text = String::with_capacity(36);
                for (at, byte) in self.take(16).iter().enumerate() {
                    if matches!(at, 4 | 6 | 8 | 10) {
                        text.push('-');
                    }
                    for nibble in [byte >> 4, byte & 0xf] {
                        let digit = HEX.get(usize::from(nibble)).copied().unwrap_or(b'0');
                        text.push(char::from(digit));
                    }
                }
                text
            }
            DECIMAL => self.varint().to_string(),
            _ => {
                let len = usize::try_from(header >> 3).unwrap_or(0);
                String::from_utf8_lossy(self.take(len)).into_owned()
            }
        }
    }

    fn present(&mut self) -> bool {
        self.byte() != 0
    }

    fn opt_text(&mut self) -> Option<String> {
        self.present().then(|| self.text())
    }

    fn opt_i64(&mut self) -> Option<i64> {
        self.present().then(|| self.signed())
    }

    fn time(&mut self) -> Time {
        let seconds = self.signed();
        let nanos = i32::try_from(self.signed()).unwrap_or(0);
        Time(Timestamp::new(seconds, nanos).unwrap_or(Timestamp::UNIX_EPOCH))
    }

    fn opt_time(&mut self) -> Option<Time> {
        self.present().then(|| self.time())
    }

    /// A list length plus one, 0 for none.
    fn opt_len(&mut self) -> Option<usize> {
        self.len().checked_sub(1)
    }

    fn opt_texts(&mut self) -> Option<Vec<String>> {
        let len = self.opt_len()?;
        Some((0..len).map(|_| self.text()).collect())
    }

    fn opt_map(&mut self) -> Option<BTreeMap<String, String>> {
        let len = self.opt_len()?;
        Some(
            (0..len)
                .map(|_| {
                    let key = self.text();
                    (key, self.text())
                })
                .collect(),
        )
    }
}

/// Gives back the symbols `record` uses (the record is being dropped).
pub(crate) fn release(record: &[u8], symbols: &mut Symbols) {
    let mut decoder = Decoder {
        bytes: record,
        symbols: &Symbols::default(),
        used: Vec::new(),
    };
    let count = decoder.len();
    let ids: Vec<u32> = (0..count)
        .map(|_| u32::try_from(decoder.varint()).unwrap_or(u32::MAX))
        .collect();
    for id in ids {
        symbols.release(id);
    }
}

/// The Service of `record`, stored under `key`.
pub(crate) fn decode(record: &[u8], key: &str, symbols: &Symbols) -> Service {
    let mut decoder = Decoder {
        bytes: record,
        symbols,
        used: Vec::new(),
    };
    let count = decoder.len();
    decoder.used = (0..count)
        .map(|_| u32::try_from(decoder.varint()).unwrap_or(u32::MAX))
        .collect();
    let (namespace, name) = key.split_once('/').unwrap_or(("", key));
    let metadata = ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        uid: decoder.opt_text(),
        resource_version: decoder.opt_text(),
        generation: decoder.opt_i64(),
        creation_timestamp: decoder.opt_time(),
        deletion_timestamp: decoder.opt_time(),
        labels: decoder.opt_map(),
        annotations: decoder.opt_map(),
        ..ObjectMeta::default()
    };
    let spec = decoder.present().then(|| decode_spec(&mut decoder));
    let status = decoder.present().then(|| decode_status(&mut decoder));
    Service {
        metadata,
        spec,
        status,
    }
}

fn decode_spec(decoder: &mut Decoder<'_>) -> ServiceSpec {
    ServiceSpec {
        type_: decoder.opt_text(),
        cluster_ip: decoder.opt_text(),
        cluster_ips: decoder.opt_texts(),
        ip_families: decoder.opt_texts(),
        ip_family_policy: decoder.opt_text(),
        load_balancer_class: decoder.opt_text(),
        load_balancer_ip: decoder.opt_text(),
        external_traffic_policy: decoder.opt_text(),
        selector: decoder.opt_map(),
        ports: decoder.opt_len().map(|len| {
            (0..len)
                .map(|_| ServicePort {
                    port: i32::try_from(decoder.signed()).unwrap_or(0),
                    protocol: decoder.opt_text(),
                    ..ServicePort::default()
                })
                .collect()
        }),
        ..ServiceSpec::default()
    }
}

fn decode_status(decoder: &mut Decoder<'_>) -> ServiceStatus {
    let conditions = decoder.opt_len().map(|len| {
        (0..len)
            .map(|_| Condition {
                last_transition_time: decoder.time(),
                message: decoder.text(),
                observed_generation: decoder.opt_i64(),
                reason: decoder.text(),
                status: decoder.text(),
                type_: decoder.text(),
            })
            .collect()
    });
    let load_balancer = decoder.present().then(|| LoadBalancerStatus {
        ingress: decoder.opt_len().map(|len| {
            (0..len)
                .map(|_| LoadBalancerIngress {
                    ip: decoder.opt_text(),
                    ..LoadBalancerIngress::default()
                })
                .collect()
        }),
    });
    ServiceStatus {
        conditions,
        load_balancer,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn service(value: serde_json::Value) -> Service {
        serde_json::from_value(value).unwrap()
    }

    /// A Service with every field the record keeps, several of each.
    fn full() -> Service {
        service(json!({
            "metadata": {
                "name": "web", "namespace": "prod",
                "uid": "0a1b2c3d-0000-4000-8000-00000000abcd",
                "resourceVersion": "12345", "generation": -3,
                "creationTimestamp": "2026-11-02T10:15:30Z",
                "deletionTimestamp": "2026-11-02T10:15:31Z",
                "labels": {"app": "web", "tier": "front", "": ""},
                "annotations": {"metallb.io/address-pool": "main", "metallb.io/ip-allocated-from-pool": "main"},
            },
            "spec": {
                "type": "LoadBalancer", "clusterIP": "10.96.0.1",
                "clusterIPs": ["10.96.0.1", "fd00:10:96::1"],
                "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack",
                "loadBalancerClass": "metallb", "loadBalancerIP": "01.2.3.4",
                "externalTrafficPolicy": "Local",
                "selector": {"app": "web"},
                "ports": [{"port": 80, "protocol": "TCP"}, {"port": -1}, {"port": 53, "protocol": "UDP"}],
            },
            "status": {
                "conditions": [{
                    "type": "metallb.io/AddressAssigned", "status": "True", "reason": "Assigned",
                    "message": "Assigned IP [\"172.16.0.0\"] ünïcode", "observedGeneration": 7,
                    "lastTransitionTime": "1970-01-01T00:00:01Z",
                }],
                "loadBalancer": {"ingress": [{"ip": "172.16.0.0"}, {"ip": "fd00::1"}, {}]},
            },
        }))
    }

    #[test]
    fn a_service_comes_back_whole_and_its_symbols_go_with_it() {
        let mut symbols = Symbols::default();
        let original = full();
        let record = encode(&original, "prod/web", &mut symbols).unwrap();
        assert_eq!(decode(&record, "prod/web", &symbols), original);
        let second = encode(&original, "prod/web", &mut symbols).unwrap();
        assert!(symbols.len() > 5);
        release(&record, &mut symbols);
        // Still used by the second record.
        assert_eq!(decode(&second, "prod/web", &symbols), original);
        release(&second, &mut symbols);
        assert_eq!(symbols.len(), 0);
    }

    #[test]
    fn absent_and_empty_stay_apart() {
        let mut symbols = Symbols::default();
        for value in [
            json!({"metadata": {"name": "a", "namespace": "n"}}),
            json!({"metadata": {"name": "a", "namespace": "n", "labels": {}, "annotations": {}},
                   "spec": {"ports": [], "clusterIPs": [], "selector": {}},
                   "status": {"conditions": [], "loadBalancer": {"ingress": []}}}),
            json!({"metadata": {"name": "a", "namespace": "n"}, "spec": {}, "status": {"loadBalancer": {}}}),
            json!({"metadata": {"name": "a", "namespace": "n", "uid": "", "resourceVersion": "007"}}),
        ] {
            let original = service(value);
            let record = encode(&original, "n/a", &mut symbols).unwrap();
            assert_eq!(decode(&record, "n/a", &symbols), original);
        }
    }

    #[test]
    fn a_field_the_record_does_not_keep_is_refused_and_counts_nothing() {
        let mut symbols = Symbols::default();
        for value in [
            json!({"metadata": {"name": "a", "namespace": "n", "labels": {"k": "v"}},
                   "spec": {"ports": [{"port": 80, "name": "http"}]}}),
            json!({"metadata": {"name": "a", "namespace": "n", "finalizers": ["x"]}}),
            json!({"metadata": {"name": "a", "namespace": "n"}, "spec": {"sessionAffinity": "None"}}),
            json!({"metadata": {"name": "a", "namespace": "n", "labels": {"k": "v"}},
                   "status": {"loadBalancer": {"ingress": [{"hostname": "h"}]}}}),
            // Name and namespace must be the key's.
            json!({"metadata": {"name": "b", "namespace": "n"}}),
            json!({"metadata": {"namespace": "n"}}),
        ] {
            assert_eq!(encode(&service(value), "n/a", &mut symbols), None);
        }
        assert_eq!(symbols.len(), 0);
    }

    #[test]
    fn only_canonical_forms_are_binary() {
        assert_eq!(canonical_ipv4("10.0.0.1"), Some(Ipv4Addr::new(10, 0, 0, 1)));
        for text in ["0.0.0.0", "255.255.255.255", "1.20.100.9", "192.168.0.10"] {
            let ip = canonical_ipv4(text).unwrap();
            assert_eq!(ipv4_text(ip.octets()), text);
            assert_eq!(ip.to_string(), text);
        }
        for text in [
            "256.0.0.1",
            "1.2.3",
            "1.2.3.4.5",
            "1..2.3",
            "+1.2.3.4",
            "1.2.3.4 ",
            "00.1.2.3",
        ] {
            assert_eq!(canonical_ipv4(text), None, "{text}");
        }
        assert_eq!(canonical_ipv4("10.0.0.01"), None);
        assert_eq!(canonical_ipv4(" 10.0.0.1"), None);
        assert!(canonical_uuid("0a1b2c3d-0000-4000-8000-00000000abcd").is_some());
        assert_eq!(canonical_uuid("0A1B2C3D-0000-4000-8000-00000000ABCD"), None);
        assert_eq!(canonical_uuid("0a1b2c3d00000-4000-8000-00000000abcd"), None);
        assert_eq!(canonical_decimal("0"), Some(0));
        assert_eq!(canonical_decimal("18446744073709551615"), None);
        assert_eq!(canonical_decimal("01"), None);
        assert_eq!(canonical_decimal("-1"), None);
        assert_eq!(canonical_decimal(""), None);
    }
}
