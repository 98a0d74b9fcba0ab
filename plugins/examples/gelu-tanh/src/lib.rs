//! Example amk op plugin: `example.gelu_tanh`, the tanh approximation of GELU,
//! `y = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, elementwise, one input and one output of
//! the same shape, F32/F16/BF16 in and out (the two dtypes may differ), fp32 math.
//!
//! Built as a `cdylib` (`libamk_plugin_example_gelu_tanh.so`), loaded with
//! `amk --plugin path/to/libamk_plugin_example_gelu_tanh.so ...`. See `docs/plugins.md`.

use amk_plugin_abi::plugin::PluginCall;
use amk_plugin_abi::{OpDescriptorV1, PluginDescriptorV1, cpu_reference, export_plugin};

/// The op's requested code.
pub const CODE: u32 = 1001;

/// The op's namespaced name.
pub const NAME: &str = "example.gelu_tanh";

/// CUDA device function, compiled into the megakernel by the CUDA backend (the contract is
/// in `docs/plugins.md`): the whole block runs one task, elementwise over the output, with the
/// same fp32 formula as [`gelu_tanh`] and the same cast on store.
pub const CUDA_SOURCE: &str = r#"
__device__ __forceinline__ float gelu_tanh_scalar(float x) {
    const float k = 0.7978846f; // sqrt(2 / pi), as the CPU reference rounds it
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

__device__ void amk_example_gelu_tanh(const amk_task_ctx& ctx) {
    const amk_buffer_t* x = amk_in(ctx, 0);
    const amk_buffer_t* y = amk_out(ctx, 0);
    const bool ok_in = x->dtype == AMK_F32 || x->dtype == AMK_F16 || x->dtype == AMK_BF16;
    const bool ok_out = y->dtype == AMK_F32 || y->dtype == AMK_F16 || y->dtype == AMK_BF16;
    if (!ok_in || !ok_out) { amk_fail(ctx, AMK_ERR_DTYPE, ok_in ? y->dtype : x->dtype); return; }
    if (x->numel != y->numel) { amk_fail(ctx, AMK_ERR_SHAPE, y->numel); return; }
    for (long long i = threadIdx.x; i < y->numel; i += AMK_THREADS) {
        amk_st(y, i, gelu_tanh_scalar(amk_ld(x, i)));
    }
}
"#;

/// The CUDA entry name.
pub const CUDA_ENTRY: &str = "amk_example_gelu_tanh";

/// The tanh-approximated GELU of one value, in fp32.
pub fn gelu_tanh(x: f32) -> f32 {
    const K: f32 = 0.797_884_6; // √(2/π)
    0.5 * x * (1.0 + (K * (x + 0.044_715 * x * x * x)).tanh())
}

/// The op's reference over safe views: checks arity, shapes and dtypes, then writes every
/// output element.
pub fn gelu_tanh_reference(call: &mut PluginCall<'_>) -> Result<(), String> {
    let [x] = call.inputs.as_slice() else {
        return Err(format!("expected 1 input, got {}", call.inputs.len()));
    };
    let x = *x;
    let [y] = call.outputs.as_mut_slice() else {
        return Err(format!("expected 1 output, got {}", call.outputs.len()));
    };
    if x.shape != y.shape {
        return Err(format!(
            "input shape {:?} and output shape {:?} differ",
            x.shape, y.shape
        ));
    }
    let n = x.numel().ok_or("shape overflows")?;
    for i in 0..n {
        let v = x
            .get_f32(i)
            .ok_or_else(|| format!("input dtype {:?} is not F32/F16/BF16", x.dtype))?;
        if !y.set_f32(i, gelu_tanh(v)) {
            return Err(format!("output dtype {:?} is not F32/F16/BF16", y.dtype));
        }
    }
    Ok(())
}

cpu_reference!(pub gelu_tanh_c => gelu_tanh_reference);

/// The op table.
static OPS: [OpDescriptorV1; 1] = [OpDescriptorV1::new(NAME, CODE, 1, 1, 1, Some(gelu_tanh_c))
    .with_summary("y = 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))), elementwise")
    .with_cuda(CUDA_SOURCE, CUDA_ENTRY, 0)];

export_plugin!(PluginDescriptorV1::new(
    "amk-example-gelu-tanh",
    env!("CARGO_PKG_VERSION"),
    &OPS
));

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests
mod tests {
    use super::*;
    use amk_plugin_abi::plugin::{DType, PluginTensor, PluginTensorMut};
    use half::{bf16, f16};

    fn gelu_tanh_f64(x: f64) -> f64 {
        0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
    }

    #[test]
    fn scalar_matches_the_f64_formula() {
        for i in -4000..=4000 {
            let x = i as f32 * 0.0025; // [-10, 10]
            let (got, want) = (f64::from(gelu_tanh(x)), gelu_tanh_f64(f64::from(x)));
            assert!(
                (got - want).abs() <= 2e-6 * (1.0 + want.abs()),
                "x={x}: {got} vs {want}"
            );
        }
        assert_eq!(gelu_tanh(0.0), 0.0);
        assert_eq!(gelu_tanh(100.0), 100.0);
        assert_eq!(gelu_tanh(-100.0), 0.0);
    }

    fn encode(dtype: DType, xs: &[f32]) -> Vec<u8> {
        xs.iter()
            .flat_map(|&x| match dtype {
                DType::F32 => x.to_le_bytes().to_vec(),
                DType::F16 => f16::from_f32(x).to_le_bytes().to_vec(),
                DType::BF16 => bf16::from_f32(x).to_le_bytes().to_vec(),
                _ => unreachable!(),
            })
            .collect()
    }

    fn decode(dtype: DType, b: &[u8]) -> Vec<f64> {
        match dtype {
            DType::F32 => b
                .chunks(4)
                .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
            DType::F16 => b
                .chunks(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            DType::BF16 => b
                .chunks(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            _ => unreachable!(),
        }
    }

    fn run(din: DType, dout: DType, xs: &[f32], out_shape: &[u64]) -> Result<Vec<f64>, String> {
        let shape = [xs.len() as u64];
        let data = encode(din, xs);
        let mut out = encode(dout, &vec![f32::NAN; xs.len()]);
        let mut call = PluginCall {
            inputs: vec![PluginTensor {
                dtype: Some(din),
                shape: &shape,
                data: &data,
            }],
            outputs: vec![PluginTensorMut {
                dtype: Some(dout),
                shape: out_shape,
                data: &mut out,
            }],
            params: vec![],
        };
        gelu_tanh_reference(&mut call)?;
        drop(call);
        Ok(decode(dout, &out))
    }

    #[test]
    fn reference_over_every_float_dtype_pair() {
        let xs: Vec<f32> = (0..37).map(|i| (i as f32 - 18.0) * 0.37).collect();
        let tol = |d: DType| match d {
            DType::F32 => 1e-6,
            DType::F16 => 2e-3,
            _ => 1.6e-2,
        };
        for din in [DType::F32, DType::F16, DType::BF16] {
            for dout in [DType::F32, DType::F16, DType::BF16] {
                let got = run(din, dout, &xs, &[xs.len() as u64]).unwrap();
                // The input is rounded to its dtype first; the formula sees the same value.
                let rounded = decode(din, &encode(din, &xs));
                for (i, (&g, &x)) in got.iter().zip(&rounded).enumerate() {
                    let want = gelu_tanh_f64(x);
                    let t = tol(dout) + 1e-6;
                    assert!(
                        (g - want).abs() <= t * (1.0 + want.abs()),
                        "{din}->{dout} [{i}] x={x}: {g} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn bad_calls_are_errors_not_panics() {
        let e = run(DType::F32, DType::F32, &[1.0, 2.0], &[3]).unwrap_err();
        assert!(e.contains("shape"), "{e}");
        let data = [1u8, 2];
        let shape = [2u64];
        let mut out = [0u8; 8];
        let mut call = PluginCall {
            inputs: vec![PluginTensor {
                dtype: Some(DType::U8),
                shape: &shape,
                data: &data,
            }],
            outputs: vec![PluginTensorMut {
                dtype: Some(DType::F32),
                shape: &shape,
                data: &mut out,
            }],
            params: vec![],
        };
        assert!(
            gelu_tanh_reference(&mut call)
                .unwrap_err()
                .contains("dtype")
        );
        call.inputs.clear();
        assert!(
            gelu_tanh_reference(&mut call)
                .unwrap_err()
                .contains("1 input")
        );
    }
}
