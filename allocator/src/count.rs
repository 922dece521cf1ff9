//! Address counts: up to 2^128, all of IPv6, one more than `u128` holds.

use std::fmt;

/// A number of addresses, from 0 to 2^128 inclusive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AddressCount {
    /// Set only for 2^128 (then `low` is 0).
    all_of_ipv6: bool,
    low: u128,
}

impl AddressCount {
    /// 2^128: every IPv6 address (`::/0`).
    pub const ALL_IPV6: AddressCount = AddressCount {
        all_of_ipv6: true,
        low: 0,
    };

    /// `count` addresses.
    pub const fn new(count: u128) -> Self {
        AddressCount {
            all_of_ipv6: false,
            low: count,
        }
    }

    /// The count if it fits a `u128` (everything but 2^128).
    pub fn get(self) -> Option<u128> {
        (!self.all_of_ipv6).then_some(self.low)
    }

    /// The count, `u128::MAX` for 2^128.
    pub fn saturating_u128(self) -> u128 {
        self.get().unwrap_or(u128::MAX)
    }

    /// The addresses of `first..=last` (`first <= last`).
    pub(crate) fn span(first: u128, last: u128) -> Self {
        match (last - first).checked_add(1) {
            Some(count) => AddressCount::new(count),
            None => AddressCount::ALL_IPV6,
        }
    }

    /// The sum, capped at 2^128 (the most one family can hold).
    pub(crate) fn plus(self, other: AddressCount) -> Self {
        match (self.get(), other.get()) {
            (Some(a), Some(b)) => a
                .checked_add(b)
                .map_or(AddressCount::ALL_IPV6, AddressCount::new),
            _ => AddressCount::ALL_IPV6,
        }
    }

    /// The difference, floored at 0.
    pub(crate) fn minus(self, other: u128) -> Self {
        match self.get() {
            Some(value) => AddressCount::new(value.saturating_sub(other)),
            // 2^128 - n for n >= 1 fits.
            None if other > 0 => AddressCount::new(u128::MAX - (other - 1)),
            None => self,
        }
    }
}

impl From<u128> for AddressCount {
    fn from(count: u128) -> Self {
        AddressCount::new(count)
    }
}

impl fmt::Display for AddressCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.get() {
            Some(value) => value.fmt(f),
            None => f.write_str("340282366920938463463374607431768211456"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_reach_two_to_the_128() {
        assert_eq!(AddressCount::span(0, u128::MAX), AddressCount::ALL_IPV6);
        assert_eq!(AddressCount::span(1, u128::MAX).get(), Some(u128::MAX));
        assert_eq!(
            AddressCount::ALL_IPV6.to_string(),
            "340282366920938463463374607431768211456"
        );
        assert_eq!(
            AddressCount::new(u128::MAX).plus(1.into()),
            AddressCount::ALL_IPV6
        );
        assert_eq!(AddressCount::new(3).plus(4.into()), AddressCount::new(7));
        assert_eq!(
            AddressCount::ALL_IPV6.minus(1),
            AddressCount::new(u128::MAX)
        );
        assert_eq!(AddressCount::new(3).minus(5), AddressCount::new(0));
        assert!(AddressCount::ALL_IPV6 > AddressCount::new(u128::MAX));
    }
}
