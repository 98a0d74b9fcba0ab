//! The Q/K row permutation of llama.cpp's converter, and its inverse.
//!
//! Hugging Face Llama checkpoints use the "rotate half" RoPE layout: within each head of
//! `head_dim` rows, row `i` pairs with row `i + head_dim/2`. `convert_hf_to_gguf.py` permutes
//! the rows of `q_proj`/`k_proj` so that the pairs become adjacent (GGUF/ggml's interleaved
//! RoPE): per head, rows viewed as `[2, head_dim/2, K]` are swapped to `[head_dim/2, 2, K]`.
//! So GGUF row `h·hd + 2i + j` holds HF row `h·hd + j·hd/2 + i`. For K, `n_heads` is the
//! number of KV heads.

use crate::error::ModelError;
use amk_core::tensor::Tensor;

fn rows_perm(t: &Tensor, n_heads: usize, to_gguf: bool) -> Result<Tensor, ModelError> {
    let rows = *t.shape().first().ok_or_else(|| {
        ModelError::Shape("cannot permute the rows of a rank-0 tensor".to_string())
    })? as usize;
    if n_heads == 0 || !rows.is_multiple_of(n_heads) || !(rows / n_heads).is_multiple_of(2) {
        return Err(ModelError::Shape(format!(
            "{rows} rows cannot be split into {n_heads} heads of an even head_dim"
        )));
    }
    let hd = rows / n_heads;
    let half = hd / 2;
    let bytes = t.to_le_bytes();
    if rows == 0 || !bytes.len().is_multiple_of(rows) {
        return Ok(t.clone());
    }
    let rb = bytes.len() / rows;
    let mut out = vec![0u8; bytes.len()];
    for h in 0..n_heads {
        for i in 0..half {
            for j in 0..2 {
                let gguf = h * hd + 2 * i + j;
                let hf = h * hd + j * half + i;
                let (src, dst) = if to_gguf { (hf, gguf) } else { (gguf, hf) };
                out[dst * rb..(dst + 1) * rb].copy_from_slice(&bytes[src * rb..(src + 1) * rb]);
            }
        }
    }
    Tensor::from_le_bytes(t.dtype(), t.shape(), &out)
        .map_err(|e| ModelError::Shape(format!("row permutation: {e}")))
}

/// Undoes the converter's permutation: GGUF (interleaved pairs) rows → HF (rotate-half) rows.
/// Works on any dtype (rows are moved as bytes); `n_heads` must split the rows into heads of
/// an even size.
pub fn unpermute_qk(t: &Tensor, n_heads: usize) -> Result<Tensor, ModelError> {
    rows_perm(t, n_heads, false)
}

/// The converter's permutation: HF (rotate-half) rows → GGUF (interleaved pairs) rows.
pub fn permute_qk(t: &Tensor, n_heads: usize) -> Result<Tensor, ModelError> {
    rows_perm(t, n_heads, true)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use amk_core::ir::DType;

    #[test]
    fn one_head_by_hand() {
        // head_dim 4, K = 2. HF rows r0..r3; GGUF order is r0, r2, r1, r3.
        let hf: Vec<f32> = vec![0., 1., 10., 11., 20., 21., 30., 31.];
        let gguf: Vec<f32> = vec![0., 1., 20., 21., 10., 11., 30., 31.];
        let t_hf = Tensor::from_f32(DType::F32, &[4, 2], &hf).unwrap();
        let t_gg = Tensor::from_f32(DType::F32, &[4, 2], &gguf).unwrap();
        assert_eq!(permute_qk(&t_hf, 1).unwrap(), t_gg);
        assert_eq!(unpermute_qk(&t_gg, 1).unwrap(), t_hf);
    }

    #[test]
    fn round_trips() {
        for (heads, hd, k, dt) in [
            (3, 8, 5, DType::F32),
            (2, 6, 3, DType::F16),
            (4, 4, 1, DType::BF16),
        ] {
            let n = heads * hd * k;
            let v: Vec<f32> = (0..n).map(|i| i as f32).collect();
            let t = Tensor::from_f32(dt, &[(heads * hd) as u64, k as u64], &v).unwrap();
            let p = permute_qk(&t, heads).unwrap();
            assert_ne!(p, t);
            assert_eq!(unpermute_qk(&p, heads).unwrap(), t);
            assert_eq!(
                permute_qk(&unpermute_qk(&t, heads).unwrap(), heads).unwrap(),
                t
            );
        }
    }

    #[test]
    fn bad_heads_are_errors() {
        let t = Tensor::from_f32(DType::F32, &[6, 1], &[0.; 6]).unwrap();
        assert!(matches!(unpermute_qk(&t, 0), Err(ModelError::Shape(_))));
        assert!(matches!(unpermute_qk(&t, 4), Err(ModelError::Shape(_))));
        assert!(matches!(unpermute_qk(&t, 6), Err(ModelError::Shape(_))));
        let s = Tensor::from_f32(DType::F32, &[], &[1.0]).unwrap();
        assert!(matches!(unpermute_qk(&s, 1), Err(ModelError::Shape(_))));
    }
}
