//! Address counts: up to 2^128, all of IPv6, one more than `u128` holds;
//! and [`WideCount`], the sum over both families (Cilium's pool counts,
//! docs/cilium.md §2.8), up to 2^128 + 2^32.

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

/// A count over both families, exact at any size: up to 2^129 (a pool of
/// `::/0` and `0.0.0.0/0` has 2^128 + 2^32 addresses, more than `u128`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WideCount {
    /// Multiples of 2^128 (0 to 2).
    carry: u8,
    low: u128,
}

/// 2^128 in decimal.
const TWO_TO_128: &str = "340282366920938463463374607431768211456";

impl WideCount {
    /// `count` over one family.
    pub fn of(count: AddressCount) -> Self {
        match count.get() {
            Some(low) => WideCount { carry: 0, low },
            None => WideCount { carry: 1, low: 0 },
        }
    }

    /// The sum of the counts of both families.
    pub fn sum(a: AddressCount, b: AddressCount) -> Self {
        WideCount::of(a).plus(WideCount::of(b))
    }

    /// The sum (exact: carries never exceed 2 for counts of two families).
    pub fn plus(self, other: WideCount) -> Self {
        let (low, over) = self.low.overflowing_add(other.low);
        WideCount {
            carry: self
                .carry
                .saturating_add(other.carry)
                .saturating_add(u8::from(over)),
            low,
        }
    }

    /// The difference, floored at 0.
    pub fn minus(self, other: WideCount) -> Self {
        if other >= self {
            return WideCount::default();
        }
        let (low, borrow) = self.low.overflowing_sub(other.low);
        WideCount {
            carry: self.carry - other.carry - u8::from(borrow),
            low,
        }
    }

    /// The count if it fits a `u128`.
    pub fn get(self) -> Option<u128> {
        (self.carry == 0).then_some(self.low)
    }
}

impl From<u128> for WideCount {
    fn from(count: u128) -> Self {
        WideCount {
            carry: 0,
            low: count,
        }
    }
}

/// `a + b` for decimal digit strings.
fn add_decimal(a: &str, b: &str) -> String {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut digits = Vec::with_capacity(a.len().max(b.len()) + 1);
    let mut carry = 0u8;
    for i in 0..a.len().max(b.len()) {
        let digit = |s: &[u8]| {
            s.len()
                .checked_sub(i + 1)
                .and_then(|j| s.get(j))
                .map_or(0, |d| d - b'0')
        };
        let sum = digit(a) + digit(b) + carry;
        digits.push(b'0' + sum % 10);
        carry = sum / 10;
    }
    if carry > 0 {
        digits.push(b'0' + carry);
    }
    digits.iter().rev().map(|d| char::from(*d)).collect()
}

impl fmt::Display for WideCount {
    /// Plain decimal, as Go's `big.Int.String()` writes Cilium's counts.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.carry == 0 {
            return self.low.fmt(f);
        }
        let mut text = self.low.to_string();
        for _ in 0..self.carry {
            text = add_decimal(&text, TWO_TO_128);
        }
        f.write_str(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_counts_are_exact_past_u128() {
        let v4_all = AddressCount::new(1 << 32);
        let both = WideCount::sum(AddressCount::ALL_IPV6, v4_all);
        assert_eq!(both.to_string(), "340282366920938463463374607436063178752");
        assert_eq!(both.get(), None);
        assert_eq!(
            WideCount::sum(AddressCount::ALL_IPV6, AddressCount::ALL_IPV6).to_string(),
            "680564733841876926926749214863536422912"
        );
        assert_eq!(
            WideCount::sum(AddressCount::new(u128::MAX), AddressCount::new(1)).to_string(),
            TWO_TO_128
        );
        assert_eq!(WideCount::sum(256.into(), 0.into()).to_string(), "256");
        // 2^128 + 2^32 - 2 = (2^128 - 2) + 2^32.
        let used = WideCount::from(2);
        assert_eq!(
            both.minus(used).to_string(),
            "340282366920938463463374607436063178750"
        );
        assert_eq!(both.minus(both), WideCount::default());
        assert_eq!(used.minus(both), WideCount::default());
        assert_eq!(
            WideCount::of(AddressCount::ALL_IPV6).minus(used).get(),
            Some(u128::MAX - 1)
        );
        assert_eq!(add_decimal("999", "1"), "1000");
    }

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
