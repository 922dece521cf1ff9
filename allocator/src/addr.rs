//! Addresses as integers: IPv4 and IPv6 both live in `u128`, tagged by family,
//! so one set of interval code serves both.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::count::AddressCount;

/// An IP family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// The family of `ip`.
    pub fn of(ip: IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// The other family.
    pub fn other(self) -> Family {
        match self {
            Family::V4 => Family::V6,
            Family::V6 => Family::V4,
        }
    }

    /// 0 for IPv4, 1 for IPv6: an index into per-family arrays.
    pub(crate) fn index(self) -> usize {
        match self {
            Family::V4 => 0,
            Family::V6 => 1,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// Appends `ip` as its `Display` text. The controller writes an address
/// into every status and condition message, and `format!`'s machinery costs
/// about ten times this loop for IPv4 (IPv6 is rare and keeps `Display`).
pub fn push_ip(text: &mut String, ip: IpAddr) {
    let IpAddr::V4(v4) = ip else {
        use fmt::Write as _;
        let _ = write!(text, "{ip}");
        return;
    };
    for (at, octet) in v4.octets().into_iter().enumerate() {
        if at > 0 {
            text.push('.');
        }
        if octet >= 100 {
            text.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            text.push(char::from(b'0' + octet / 10 % 10));
        }
        text.push(char::from(b'0' + octet % 10));
    }
}

/// `ip` as its family and its integer value.
pub(crate) fn to_int(ip: IpAddr) -> (Family, u128) {
    match ip {
        IpAddr::V4(v4) => (Family::V4, u128::from(u32::from(v4))),
        IpAddr::V6(v6) => (Family::V6, u128::from(v6)),
    }
}

/// The address of `family` with integer value `value` (IPv4 values are
/// truncated to 32 bits; callers only pass values they got from `to_int`).
pub(crate) fn from_int(family: Family, value: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(value as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(value)),
    }
}

/// Whether an IPv4 address ends in `.0` or `.255`, which some old firmware
/// mishandles (MetalLB's avoidBuggyIPs).
pub(crate) fn is_buggy(family: Family, value: u128) -> bool {
    family == Family::V4 && matches!(value & 0xff, 0 | 0xff)
}

/// Which addresses of a pool's family may be handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Usable {
    pub(crate) family: Family,
    pub(crate) avoid_buggy: bool,
}

impl Usable {
    pub(crate) fn is_usable(self, value: u128) -> bool {
        !(self.avoid_buggy && is_buggy(self.family, value))
    }

    /// The lowest usable value at or above `value`, if any.
    pub(crate) fn next_at_or_above(self, value: u128) -> Option<u128> {
        if !self.avoid_buggy || self.family == Family::V6 {
            return Some(value);
        }
        match value & 0xff {
            0 => value.checked_add(1),
            0xff => value.checked_add(2),
            _ => Some(value),
        }
    }

    /// The highest usable value at or below `value`, if any.
    pub(crate) fn next_at_or_below(self, value: u128) -> Option<u128> {
        if !self.avoid_buggy || self.family == Family::V6 {
            return Some(value);
        }
        match value & 0xff {
            0 => value.checked_sub(2),
            0xff => value.checked_sub(1),
            _ => Some(value),
        }
    }

    /// How many usable values lie in `first..=last` (`first <= last`).
    pub(crate) fn count(self, first: u128, last: u128) -> AddressCount {
        let all = AddressCount::span(first, last);
        if !self.avoid_buggy || self.family == Family::V6 {
            return all;
        }
        let with_low_byte = |low: u128| {
            let up_to = |n: u128| if n < low { 0 } else { (n - low) / 256 + 1 };
            up_to(last) - first.checked_sub(1).map_or(0, up_to)
        };
        all.minus(with_low_byte(0) + with_low_byte(0xff))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(s: &str) -> u128 {
        to_int(s.parse().unwrap()).1
    }

    #[test]
    fn push_ip_writes_what_display_writes() {
        let octets = [0, 1, 9, 10, 42, 99, 100, 199, 200, 255];
        let mut text = String::from("at ");
        for a in octets {
            for b in octets {
                let ip = IpAddr::V4(Ipv4Addr::new(a, b, 255 - a, b / 3));
                text.truncate(3);
                push_ip(&mut text, ip);
                assert_eq!(text, format!("at {ip}"));
            }
        }
        for ip in ["::", "fd00::1", "2001:db8::ffff:0:1", "::ffff:10.0.0.1"] {
            let ip: IpAddr = ip.parse().unwrap();
            text.clear();
            push_ip(&mut text, ip);
            assert_eq!(text, ip.to_string());
        }
    }

    #[test]
    fn buggy_counting_in_a_range_crossing_octets() {
        let usable = Usable {
            family: Family::V4,
            avoid_buggy: true,
        };
        // .250 to .5 of the next /24: .255 and .0 are avoided.
        assert_eq!(
            usable.count(v4("10.0.0.250"), v4("10.0.1.5")).get(),
            Some(10)
        );
        // A /23: 512 addresses less two .0 and two .255.
        assert_eq!(
            usable.count(v4("10.0.0.0"), v4("10.0.1.255")).get(),
            Some(508)
        );
        assert_eq!(usable.count(v4("0.0.0.0"), v4("0.0.0.0")).get(), Some(0));
        assert_eq!(
            usable
                .count(v4("255.255.255.255"), v4("255.255.255.255"))
                .get(),
            Some(0)
        );
        assert_eq!(
            usable.count(v4("10.0.0.1"), v4("10.0.0.254")).get(),
            Some(254)
        );
    }

    #[test]
    fn next_usable_skips_the_gap_between_octets() {
        let usable = Usable {
            family: Family::V4,
            avoid_buggy: true,
        };
        assert_eq!(
            usable.next_at_or_above(v4("10.0.0.255")),
            Some(v4("10.0.1.1"))
        );
        assert_eq!(
            usable.next_at_or_above(v4("10.0.1.0")),
            Some(v4("10.0.1.1"))
        );
        assert_eq!(
            usable.next_at_or_below(v4("10.0.1.0")),
            Some(v4("10.0.0.254"))
        );
        assert_eq!(usable.next_at_or_below(v4("0.0.0.0")), None);
        let plain = Usable {
            family: Family::V6,
            avoid_buggy: true,
        };
        assert_eq!(plain.next_at_or_above(u128::MAX), Some(u128::MAX));
        assert_eq!(plain.count(0, u128::MAX - 1).get(), Some(u128::MAX));
        assert_eq!(plain.count(0, u128::MAX), AddressCount::ALL_IPV6);
    }
}
