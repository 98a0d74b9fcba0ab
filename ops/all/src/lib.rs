//! `amk-ops`: links every built-in op crate into the binary (so `inventory` sees their
//! registrations) and builds the registry from them.

// `extern crate` keeps each op crate linked even though nothing here names its items.
extern crate op_add;
extern crate op_allreduce_shard;
extern crate op_attention_causal;
extern crate op_attention_combine;
extern crate op_attention_gemv;
extern crate op_attention_merge;
extern crate op_attention_split;
extern crate op_attention_tile;
extern crate op_combine_gemv;
extern crate op_copy;
extern crate op_dequant;
extern crate op_embed;
extern crate op_fused;
extern crate op_gate_up_silu;
extern crate op_gelu;
extern crate op_gemm_tile;
extern crate op_gemv_tile;
extern crate op_kv_append;
extern crate op_layernorm;
extern crate op_linear_tile;
extern crate op_logit_stats;
extern crate op_mul;
extern crate op_next_token;
extern crate op_nop;
extern crate op_qkv_rope_append;
extern crate op_rmsnorm;
extern crate op_rmsnorm_gemv;
extern crate op_rope;
extern crate op_sample_argmax;
extern crate op_silu_mul;
extern crate op_softmax;
extern crate op_token_nll;
extern crate oplib_attention;
extern crate oplib_logits;
extern crate oplib_tile;

use amk_core::{IrError, Registry};

/// The registry of every built-in op.
pub fn registry() -> Result<Registry, IrError> {
    // Touch one item per crate so the linker cannot drop them.
    let _ = (
        &op_add::SPEC,
        &op_allreduce_shard::SPEC,
        &op_attention_causal::SPEC,
        &op_attention_combine::SPEC,
        &op_attention_gemv::SPEC,
        &op_attention_merge::SPEC,
        &op_attention_split::SPEC,
        &op_attention_tile::SPEC,
        &op_combine_gemv::SPEC,
        &op_copy::SPEC,
        &op_dequant::SPEC,
        &op_embed::SPEC,
        &op_fused::SPEC,
        &op_gate_up_silu::SPEC,
        &op_gelu::SPEC,
        &op_gemm_tile::SPEC,
        &op_gemv_tile::SPEC,
        &op_kv_append::SPEC,
        &op_logit_stats::SPEC,
        &op_layernorm::SPEC,
        &op_linear_tile::SPEC,
        &op_mul::SPEC,
        &op_next_token::SPEC,
        &op_qkv_rope_append::SPEC,
        &op_nop::SPEC,
        &op_rmsnorm::SPEC,
        &op_rmsnorm_gemv::SPEC,
        &op_rope::SPEC,
        &op_sample_argmax::SPEC,
        &op_silu_mul::SPEC,
        &op_softmax::SPEC,
        &op_token_nll::SPEC,
    );
    Registry::builtin()
}
