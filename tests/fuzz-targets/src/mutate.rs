//! A small mutator for the smoke test (libFuzzer has its own): byte flips, interesting
//! integers, insertions, deletions, duplications and truncations of a seed, seeded and
//! reproducible.

use amk_core::sim::SplitMix;

/// Values that sit on the readers' boundaries: lengths and counts of 0, 1, all ones, and
/// powers of two around the size limits.
const INTERESTING: [u64; 10] = [
    0,
    1,
    0x7f,
    0xff,
    0xffff,
    0x7fff_ffff,
    0xffff_ffff,
    1 << 32,
    1 << 40,
    u64::MAX,
];

/// `seed` mutated `rounds` times with `rng`.
pub fn mutate(seed: &[u8], rng: &mut SplitMix, rounds: usize) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..rounds {
        let at = |rng: &mut SplitMix, n: usize| (rng.next() % (n as u64 + 1)) as usize;
        match rng.next() % 6 {
            0 if !v.is_empty() => {
                let i = at(rng, v.len() - 1);
                v[i] ^= 1 << (rng.next() % 8);
            }
            1 if v.len() >= 8 => {
                let i = at(rng, v.len() - 8);
                let x = INTERESTING[(rng.next() % INTERESTING.len() as u64) as usize];
                let width = [1usize, 2, 4, 8][(rng.next() % 4) as usize];
                v[i..i + width].copy_from_slice(&x.to_le_bytes()[..width]);
            }
            2 => {
                let i = at(rng, v.len());
                let n = (rng.next() % 16) as usize;
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                v.splice(i..i, bytes);
            }
            3 if !v.is_empty() => {
                let i = at(rng, v.len() - 1);
                let n = (rng.next() % 32) as usize;
                v.drain(i..(i + n).min(v.len()));
            }
            4 if !v.is_empty() => {
                let i = at(rng, v.len() - 1);
                let n = ((rng.next() % 64) as usize).min(v.len() - i);
                let chunk = v[i..i + n].to_vec();
                let j = at(rng, v.len());
                v.splice(j..j, chunk);
            }
            _ => {
                let n = at(rng, v.len());
                v.truncate(n);
            }
        }
    }
    v
}
