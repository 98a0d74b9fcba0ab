//! The random stream of NEXT_TOKEN's sampling: one Gumbel variate per (seed, position, token
//! id), from a counter-based generator.
//!
//! A counter-based stream (a hash of the coordinates, no state carried between draws) is what
//! lets the device give every thread its own tokens in any order and still draw exactly what
//! the CPU draws: the noise of token `i` at position `q` depends on nothing else. The hash is
//! SplitMix64's finaliser `mix`:
//!
//! ```text
//! mix(z) = { z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
//!            z = (z ^ (z >> 27)) * 0x94D049BB133111EB;
//!            z ^ (z >> 31) }                                   (wrapping u64 arithmetic)
//! r(i)   = mix(mix(seed ^ q * 0x9E3779B97F4A7C15) ^ i)
//! u(i)   = ((r >> 41) as f32 + 0.5) / 2^23                     (exact in f32, in (0, 1))
//! g(i)   = −ln(−ln(u))                                          (f32 ln)
//! ```
//!
//! `u` keeps the top 23 bits of `r`: `x + 0.5` is exact in f32 only for `x < 2^23` (with 24
//! bits, `2^24 − 1 + 0.5` rounds to `2^24` and `u` to 1, whose noise is `+∞`), so every `u` is
//! an odd multiple of `2^-24` strictly inside (0, 1), and `g` is finite (within about
//! [−2.8, 16.6]).

/// SplitMix64's increment (the golden ratio), spreading positions over the seed space.
pub const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's finaliser: a bijective 64-bit hash with full avalanche.
pub const fn mix(z: u64) -> u64 {
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The per-position part of the stream (hashed once per draw, not once per token).
pub const fn position_base(seed: u64, q: u64) -> u64 {
    mix(seed ^ q.wrapping_mul(GOLDEN))
}

/// The uniform variate of token `i` under `base` ([`position_base`]): an odd multiple of
/// `2^-24` in (0, 1), exact in f32.
pub fn uniform(base: u64, i: u64) -> f32 {
    let r = mix(base ^ i);
    ((r >> 41) as f32 + 0.5) / 8_388_608.0
}

/// The Gumbel variate of token `i` under `base`: `−ln(−ln(u))`, in f32.
pub fn gumbel(base: u64, i: u64) -> f32 {
    -(-uniform(base, i).ln()).ln()
}
