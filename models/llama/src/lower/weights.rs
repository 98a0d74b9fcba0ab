//! Where a lowering's weight buffers come from, and one layer's set of them: shared by the
//! decode and the prefill lowerings, which name the same tensors in the same order (so a
//! program lowered beside another shares its casts and, on a GPU, its uploads).

use super::cast;
use crate::error::ModelError;
use crate::model::{self, Model, ModelFormat, layer_tensor};
use amk_core::{BufferId, DType, Program, WeightStore};

/// The program's weight buffers: the model's tensors, cast to the program's dtype into
/// `store` (a tensor already there is not cast again), or a synthetic model's shapes (the
/// backend generates its values; `store` stays empty).
pub(super) struct Weights<'m> {
    pub(super) model: &'m Model,
    dtype: DType,
    synthetic: Option<std::collections::HashMap<String, Vec<u64>>>,
    pub(super) store: WeightStore,
}

impl<'m> Weights<'m> {
    pub(super) fn new(model: &'m Model, dtype: DType, store: WeightStore) -> Self {
        let synthetic = (model.format == ModelFormat::Synthetic)
            .then(|| model::tensor_names(&model.config).into_iter().collect());
        Weights {
            model,
            dtype,
            synthetic,
            store,
        }
    }

    /// The WEIGHT buffer of tensor `name`, added to `p`.
    pub(super) fn buffer(&mut self, p: &mut Program, name: &str) -> Result<BufferId, ModelError> {
        let missing = || ModelError::MissingTensor(name.to_string());
        let shape = match &self.synthetic {
            Some(shapes) => shapes.get(name).ok_or_else(missing)?.clone(),
            None => {
                let t = self.model.weights.get(name).ok_or_else(missing)?;
                if self.store.get(name).is_none() {
                    self.store.insert_shared(name, cast(name, t, self.dtype)?);
                }
                t.shape().to_vec()
            }
        };
        Ok(p.new_weight(name, self.dtype, &shape, name))
    }
}

/// Qwen2's q/k/v biases or Qwen3's q/k norms.
#[derive(Clone, Copy)]
pub(super) struct Triple {
    pub(super) q: BufferId,
    pub(super) k: BufferId,
    pub(super) v: Option<BufferId>,
}

/// One layer's weight buffers.
pub(super) struct LayerWeights {
    pub(super) in_norm: BufferId,
    pub(super) q: BufferId,
    pub(super) k: BufferId,
    pub(super) v: BufferId,
    pub(super) biases: Option<Triple>,
    pub(super) qk_norms: Option<Triple>,
    pub(super) o: BufferId,
    pub(super) post_norm: BufferId,
    pub(super) gate: BufferId,
    pub(super) up: BufferId,
    pub(super) down: BufferId,
}

impl LayerWeights {
    /// Layer `l`'s buffers, added to `p` in the order both lowerings name them.
    pub(super) fn load(p: &mut Program, w: &mut Weights<'_>, l: usize) -> Result<Self, ModelError> {
        let mc = &w.model.config;
        let (bias, qk_norm) = (mc.attention_bias, mc.qk_norm);
        let mut get = |what: &str| w.buffer(p, &layer_tensor(l, what));
        let in_norm = get("input_layernorm.weight")?;
        let (q, k, v) = (
            get("self_attn.q_proj.weight")?,
            get("self_attn.k_proj.weight")?,
            get("self_attn.v_proj.weight")?,
        );
        let biases = match bias {
            true => Some(Triple {
                q: get("self_attn.q_proj.bias")?,
                k: get("self_attn.k_proj.bias")?,
                v: Some(get("self_attn.v_proj.bias")?),
            }),
            false => None,
        };
        let qk_norms = match qk_norm {
            true => Some(Triple {
                q: get("self_attn.q_norm.weight")?,
                k: get("self_attn.k_norm.weight")?,
                v: None,
            }),
            false => None,
        };
        Ok(LayerWeights {
            in_norm,
            q,
            k,
            v,
            biases,
            qk_norms,
            o: get("self_attn.o_proj.weight")?,
            post_norm: get("post_attention_layernorm.weight")?,
            gate: get("mlp.gate_proj.weight")?,
            up: get("mlp.up_proj.weight")?,
            down: get("mlp.down_proj.weight")?,
        })
    }
}
