//! Synthetic weights: seeded, reproducible random tensors that a backend can generate where the
//! data lives (e.g. on the GPU for an 8B-shape benchmark) and the host can reproduce bit for bit.
//!
//! Why a fixed formula rather than an RNG object: the CUDA backend fills device memory with a
//! kernel, the CPU VM needs the same numbers on the host, and a benchmark's f32 reference must
//! see exactly the weights its bf16 run sees. So every value is a pure function of
//! `(seed, tensor name, element index, init)`:
//!
//! ```text
//! ts   = mix(seed ^ fnv1a64(name))                       tensor seed
//! z    = mix(ts + (i + 1) · 0x9E3779B97F4A7C15)          (wrapping u64)
//! u    = ((z >> 40) − 2^23) · 2^-23                      in [-1, 1), exact in f32
//! v    = center + scale · u                              two f32 roundings, no fused multiply-add
//! out  = v rounded to the nearest bf16 (ties to even)    so f32 and bf16 programs share values
//! ```
//!
//! `mix` is SplitMix64's finaliser. Values are never all zero (`scale` must be non-zero) and lie
//! on the bf16 grid, so a tensor stored as F32, BF16 (exact) or F16 (one more rounding) holds
//! the same numbers an f32 reference would use.

use crate::ir::{BufferKind, DType, Program};
use crate::tensor::Tensor;
use crate::{BackendError, WeightStore};
use std::collections::BTreeMap;

/// How one tensor's values are spread: `center + scale · u`, `u` uniform in [-1, 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Init {
    /// The mean value (1.0 for norm weights, 0.0 for projections).
    pub center: f32,
    /// Half-width of the uniform spread; never 0.
    pub scale: f32,
}

/// SplitMix64's output function.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The per-tensor seed: `mix(seed ^ fnv1a64(name))`.
pub fn tensor_seed(seed: u64, name: &str) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in name.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    mix(seed ^ h)
}

/// Rounds to the nearest bf16 (ties to even), returned as f32. NaN and infinities do not occur
/// here (`|v| ≤ |center| + |scale|`).
pub fn round_bf16(v: f32) -> f32 {
    let b = v.to_bits();
    let r = b.wrapping_add(0x7fff + ((b >> 16) & 1)) & 0xffff_0000;
    f32::from_bits(r)
}

/// Element `i` of the tensor whose seed is `ts` (see the module docs).
pub fn value(ts: u64, i: u64, init: Init) -> f32 {
    let z = mix(ts.wrapping_add((i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    let u = ((z >> 40) as i32 - (1 << 23)) as f32 * (1.0 / (1u32 << 23) as f32);
    let prod = init.scale * u;
    round_bf16(init.center + prod)
}

/// A whole tensor of `dtype` and `shape` (F32, F16 or BF16).
pub fn tensor(
    dtype: DType,
    shape: &[u64],
    seed: u64,
    name: &str,
    init: Init,
) -> Result<Tensor, BackendError> {
    let n: u64 = shape.iter().product();
    let ts = tensor_seed(seed, name);
    let vals: Vec<f32> = (0..n).map(|i| value(ts, i, init)).collect();
    if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
        return Err(BackendError::Weights {
            buffer: name.to_string(),
            message: format!("synthetic weights are float; the buffer is {dtype}"),
        });
    }
    Tensor::from_f32(dtype, shape, &vals).map_err(|e| BackendError::Weights {
        buffer: name.to_string(),
        message: e.to_string(),
    })
}

/// Synthetic weights for a whole program: a seed and an [`Init`] per tensor name (a WEIGHT or
/// CONST buffer's `source`).
#[derive(Debug, Clone, Default)]
pub struct SyntheticWeights {
    /// The run's seed.
    pub seed: u64,
    /// The spread of each tensor, by name.
    pub inits: BTreeMap<String, Init>,
    /// Tensors whose values repeat another tensor's (same seed name, so the same values when
    /// the shapes match): e.g. an untied LM head initialised to the embedding.
    pub same_values: BTreeMap<String, String>,
    /// Tensors bound as given instead of generated, by name: values that random ones cannot
    /// stand for (a model's RoPE frequency divisors). A buffer whose source is here is not
    /// planned ([`SyntheticWeights::plan`]) but bound ([`SyntheticWeights::exact_bindings`]).
    pub exact: WeightStore,
}

/// One WEIGHT/CONST buffer's synthetic content (see [`SyntheticWeights::plan`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Planned<'a> {
    /// The buffer's index in the program.
    pub buffer: usize,
    /// The tensor it binds (its `source`).
    pub name: &'a str,
    /// The name whose seed generates the values (`name` unless it repeats another tensor).
    pub seed_name: &'a str,
    /// The spread.
    pub init: Init,
}

impl SyntheticWeights {
    /// What every WEIGHT/CONST buffer of `p` holds, in buffer order; an error names a buffer
    /// without a source or with no init.
    pub fn plan<'a>(&'a self, p: &'a Program) -> Result<Vec<Planned<'a>>, BackendError> {
        let mut out = Vec::new();
        for (i, b) in p.buffers.iter().enumerate() {
            if !matches!(b.kind, BufferKind::WEIGHT | BufferKind::CONST) {
                continue;
            }
            let err = |message: String| BackendError::Weights {
                buffer: b.name.clone(),
                message,
            };
            let src = b
                .source
                .as_deref()
                .ok_or_else(|| err("the buffer has no `source` naming its tensor".into()))?;
            if self.exact.get(src).is_some() {
                continue;
            }
            let init = *self
                .inits
                .get(src)
                .ok_or_else(|| err(format!("no synthetic init for tensor '{src}'")))?;
            if init.scale == 0.0 || !init.scale.is_finite() || !init.center.is_finite() {
                return Err(err(format!(
                    "synthetic init of '{src}' must have a finite, non-zero scale (got {init:?})"
                )));
            }
            let seed_name = self.same_values.get(src).map_or(src, String::as_str);
            out.push(Planned {
                buffer: i,
                name: src,
                seed_name,
                init,
            });
        }
        Ok(out)
    }

    /// The WEIGHT/CONST buffers of `p` bound to [`SyntheticWeights::exact`] tensors, in buffer
    /// order, each checked against its buffer's dtype and shape.
    pub fn exact_bindings<'a>(
        &'a self,
        p: &'a Program,
    ) -> Result<Vec<(usize, &'a std::sync::Arc<crate::Tensor>)>, BackendError> {
        let mut out = Vec::new();
        for (i, b) in p.buffers.iter().enumerate() {
            if !matches!(b.kind, BufferKind::WEIGHT | BufferKind::CONST) {
                continue;
            }
            let Some(t) = b.source.as_deref().and_then(|s| self.exact.get(s)) else {
                continue;
            };
            if t.dtype() != b.dtype || t.shape() != b.shape.as_slice() {
                return Err(BackendError::Weights {
                    buffer: b.name.clone(),
                    message: format!(
                        "the given tensor is {} {:?}, the buffer {} {:?}",
                        t.dtype(),
                        t.shape(),
                        b.dtype,
                        b.shape
                    ),
                });
            }
            out.push((i, t));
        }
        Ok(out)
    }

    /// The same weights on the host, for a backend that reads a [`WeightStore`] (the CPU VM).
    pub fn materialize(&self, p: &Program) -> Result<WeightStore, BackendError> {
        let mut store = WeightStore::new();
        for (b, t) in self.exact_bindings(p)? {
            if let Some(src) = &p.buffers[b].source {
                store.insert_shared(src.clone(), t.clone());
            }
        }
        for w in self.plan(p)? {
            if store.get(w.name).is_some() {
                continue;
            }
            let b = &p.buffers[w.buffer];
            let t = tensor(b.dtype, &b.shape, self.seed, w.seed_name, w.init)?;
            store.insert(w.name, t);
        }
        Ok(store)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests

    use super::*;

    const W: Init = Init {
        center: 0.0,
        scale: 0.02,
    };

    #[test]
    fn values_are_reproducible_spread_and_on_the_bf16_grid() {
        let ts = tensor_seed(7, "model.layers.0.mlp.up_proj.weight");
        let v: Vec<f32> = (0..10_000).map(|i| value(ts, i, W)).collect();
        assert_eq!(v, (0..10_000).map(|i| value(ts, i, W)).collect::<Vec<_>>());
        assert!(
            v.iter().all(|x| x.to_bits() & 0xffff == 0),
            "off the bf16 grid"
        );
        // bf16 rounding may step just past the spread's edge.
        assert!(v.iter().all(|x| x.abs() <= 0.02 * (1.0 + 1.0 / 256.0)));
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
        // Uniform on [-0.02, 0.02): mean 0, variance 0.02² / 3.
        assert!(mean.abs() < 1e-3, "mean {mean}");
        assert!(
            (var / (0.02f64 * 0.02 / 3.0) - 1.0).abs() < 0.05,
            "variance {var}"
        );
        let distinct: std::collections::BTreeSet<u32> = v.iter().map(|x| x.to_bits()).collect();
        assert!(
            distinct.len() > 200,
            "only {} distinct values",
            distinct.len()
        );
    }

    #[test]
    fn names_and_seeds_give_different_tensors() {
        let a = tensor_seed(1, "a.weight");
        assert_ne!(a, tensor_seed(2, "a.weight"));
        assert_ne!(a, tensor_seed(1, "b.weight"));
        let va: Vec<f32> = (0..64).map(|i| value(a, i, W)).collect();
        let vb: Vec<f32> = (0..64)
            .map(|i| value(tensor_seed(1, "b.weight"), i, W))
            .collect();
        assert_ne!(va, vb);
    }

    #[test]
    fn bf16_rounding_is_to_nearest_even() {
        // 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1.0).
        assert_eq!(round_bf16(1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(round_bf16(1.0 + 3.0 / 256.0), 1.0 + 4.0 / 256.0);
        assert_eq!(round_bf16(-0.3), -0.30078125);
        // The same as half's conversion.
        for &x in &[0.1f32, -0.7, 1.2345e-3, 2.71] {
            assert_eq!(round_bf16(x), half::bf16::from_f32(x).to_f32());
        }
    }

    #[test]
    fn norms_sit_around_their_center_and_tensors_cast_exactly() {
        let init = Init {
            center: 1.0,
            scale: 0.1,
        };
        let t32 = tensor(DType::F32, &[4, 8], 3, "n", init).unwrap();
        let t16 = tensor(DType::BF16, &[4, 8], 3, "n", init).unwrap();
        assert_eq!(t32.to_f32_vec(), t16.to_f32_vec());
        assert!(t32.to_f32_vec().iter().all(|&x| (0.89..=1.11).contains(&x)));
        assert!(tensor(DType::I32, &[2], 3, "n", init).is_err());
    }
}
