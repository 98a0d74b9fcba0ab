//! The generators' deterministic randomness: equal seeds give equal programs everywhere.

use amk_core::sim::SplitMix;

/// A small deterministic random source (SplitMix64 from `amk_core::sim`) with the helpers the
/// generators need. Equal seeds give equal programs on every platform.
pub struct Rng(SplitMix);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        let mut r = Rng(SplitMix(seed ^ 0x0A3C_5EED_F00D_1234));
        r.next_u64();
        r
    }
    /// 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next()
    }
    /// Uniform in `[0, n)` (0 when `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }
    /// Uniform index in `[0, n)` (0 when `n == 0`).
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }
    /// Uniform in `[lo, hi]` (inclusive; `lo` when `hi < lo`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            lo
        } else {
            lo + self.below(hi - lo + 1)
        }
    }
    /// True with probability `pct`/100.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
    /// A random element.
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> Option<&'a T> {
        if xs.is_empty() {
            None
        } else {
            xs.get(self.index(xs.len()))
        }
    }
    /// Fisher–Yates shuffle.
    pub fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            let j = self.index(i + 1);
            xs.swap(i, j);
        }
    }
    /// An independent generator derived from this one.
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.next_u64())
    }
}

/// Mixes several numbers into one seed (order-sensitive).
pub fn seed_of(parts: &[u64]) -> u64 {
    let mut s = SplitMix(0x1234_5678_9ABC_DEF0);
    let mut acc = 0u64;
    for &p in parts {
        s.0 ^= p.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        acc = acc.rotate_left(17) ^ s.next();
    }
    acc
}
