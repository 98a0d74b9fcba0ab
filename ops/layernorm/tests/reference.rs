//! LAYERNORM's CPU reference against an independent f64 formula (torch `layer_norm`: biased
//! variance over the last dim): random non-zero inputs, poisoned outputs, with and without
//! bias, every float dtype, ranks 0–4, viewed weights/outputs, and typed errors for bad calls.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::json::Value;
use amk_core::testkit::{assert_close, call, random_nonzero, rng, task};
use amk_core::{DType, OpError, Opcode, Registry, Task, Tensor};
use op_layernorm::reference::run;
use rstest::rstest;

fn norm_task(n_in: usize, eps: f64, hidden: i64) -> Task {
    task(
        Opcode::LAYERNORM,
        n_in,
        1,
        &[("eps", Value::Float(eps)), ("hidden", Value::Int(hidden))],
    )
}

/// f16's subnormal spacing: tiny values round to a multiple of 2^-24.
fn atol(d: DType) -> f64 {
    if d == DType::F16 {
        2f64.powi(-24)
    } else {
        1e-12
    }
}

/// torch's layer_norm in f64: per row, mean and biased variance (one-pass formula
/// `E[x^2] - E[x]^2`, deliberately not the two-pass form of the implementation).
fn layernorm_f64(x: &Tensor, w: &Tensor, b: Option<&Tensor>, eps: f64) -> Vec<f64> {
    let h = w.numel();
    let eps = eps as f32 as f64;
    let xs: Vec<f64> = x.to_f32_vec().into_iter().map(f64::from).collect();
    let mut y = Vec::with_capacity(xs.len());
    for row in xs.chunks(h) {
        let n = h as f64;
        let mean = row.iter().sum::<f64>() / n;
        let var = row.iter().map(|v| v * v).sum::<f64>() / n - mean * mean;
        for (j, v) in row.iter().enumerate() {
            let bias = b.map_or(0.0, |b| b.get_f32(j) as f64);
            y.push((v - mean) / (var + eps).sqrt() * w.get_f32(j) as f64 + bias);
        }
    }
    y
}

#[rstest]
// x shape, param shape (w and b), y shape, (x, param, y) dtypes, with bias, eps
#[case(&[], &[1], &[], (DType::F32, DType::F32, DType::F32), true, 1e-5)]
#[case(&[1], &[1], &[1], (DType::F32, DType::F32, DType::F32), false, 1e-5)]
#[case(&[7], &[7], &[7], (DType::F16, DType::F32, DType::F32), true, 1e-5)]
#[case(&[3, 5], &[5], &[3, 5], (DType::F32, DType::BF16, DType::F16), false, 1e-6)]
#[case(&[2, 3, 4], &[1, 4], &[24], (DType::BF16, DType::BF16, DType::BF16), true, 1e-5)]
#[case(&[1, 2, 3, 5], &[5], &[1, 2, 3, 5], (DType::F32, DType::F16, DType::F32), true, 0.5)]
#[case(&[4, 33], &[33], &[4, 33], (DType::F32, DType::F32, DType::F16), true, 1e-5)]
#[case(&[1, 768], &[768], &[1, 768], (DType::BF16, DType::F32, DType::F32), false, 1e-5)]
#[case(&[3, 1, 1, 9], &[9], &[27], (DType::F16, DType::F16, DType::F16), true, 1e-5)]
fn matches_f64_formula(
    #[case] sx: &[u64],
    #[case] sp: &[u64],
    #[case] sy: &[u64],
    #[case] dtypes: (DType, DType, DType),
    #[case] bias: bool,
    #[case] eps: f64,
) {
    let (dx, dp, dy) = dtypes;
    let mut r = rng(sx.iter().sum::<u64>() * 3 + dx as u64 * 31 + dy as u64 + u64::from(bias));
    // An offset mean, so the centring matters.
    let x = random_nonzero(dx, sx, &mut r, -1.0, 5.0);
    let w = random_nonzero(dp, sp, &mut r, -2.0, 2.0);
    let b = random_nonzero(dp, sp, &mut r, -1.0, 1.0);
    let mut out = [Tensor::poisoned(dy, sy)];
    let hidden = w.numel() as i64;
    let ins: Vec<&Tensor> = if bias { vec![&x, &w, &b] } else { vec![&x, &w] };
    call(run, &norm_task(ins.len(), eps, hidden), &ins, &mut out).unwrap();
    let want = layernorm_f64(&x, &w, bias.then_some(&b), eps);
    assert_close(&out[0], &want, 1e-6, atol(dy));
}

#[test]
fn known_values() {
    // Row [1, 2, 3, 6]: mean 3, biased var (4 + 1 + 0 + 9) / 4 = 3.5.
    let x = Tensor::from_f32(DType::F32, &[1, 4], &[1.0, 2.0, 3.0, 6.0]).unwrap();
    let w = Tensor::from_f32(DType::F32, &[4], &[1.0, 1.0, 2.0, 1.0]).unwrap();
    let b = Tensor::from_f32(DType::F32, &[4], &[0.0, 10.0, 0.0, 0.0]).unwrap();
    let mut out = [Tensor::poisoned(DType::F32, &[4])];
    call(run, &norm_task(3, 0.0, 4), &[&x, &w, &b], &mut out).unwrap();
    let s = 3.5f64.sqrt();
    assert_close(
        &out[0],
        &[-2.0 / s, 10.0 - 1.0 / s, 0.0, 3.0 / s],
        1e-7,
        0.0,
    );
}

#[test]
fn bad_calls_are_typed_errors() {
    let x = Tensor::zeros(DType::F32, &[2, 4]);
    let w = Tensor::zeros(DType::F32, &[4]);
    let t = norm_task(2, 1e-5, 4);
    let t3 = norm_task(3, 1e-5, 4);
    let mut out = [Tensor::poisoned(DType::F32, &[2, 4])];
    // Missing params.
    let no_eps = task(Opcode::LAYERNORM, 2, 1, &[("hidden", Value::Int(4))]);
    assert_eq!(
        call(run, &no_eps, &[&x, &w], &mut out),
        Err(OpError::MissingParam("eps".into()))
    );
    let no_hidden = task(Opcode::LAYERNORM, 2, 1, &[("eps", Value::Float(1e-5))]);
    assert_eq!(
        call(run, &no_hidden, &[&x, &w], &mut out),
        Err(OpError::MissingParam("hidden".into()))
    );
    assert!(matches!(
        call(run, &norm_task(2, 1e-5, -4), &[&x, &w], &mut out),
        Err(OpError::BadParam { .. })
    ));
    // hidden is not x's last dim.
    let w2 = Tensor::zeros(DType::F32, &[2]);
    assert!(matches!(
        call(run, &norm_task(2, 1e-5, 2), &[&x, &w2], &mut out),
        Err(OpError::Shape(_))
    ));
    // Weight or bias of the wrong size.
    let w5 = Tensor::zeros(DType::F32, &[5]);
    assert!(matches!(
        call(run, &t, &[&x, &w5], &mut out),
        Err(OpError::Shape(_))
    ));
    assert!(matches!(
        call(run, &t3, &[&x, &w, &w5], &mut out),
        Err(OpError::Shape(_))
    ));
    // Output of the wrong size.
    let mut small = [Tensor::poisoned(DType::F32, &[2, 3])];
    assert!(matches!(
        call(run, &t, &[&x, &w], &mut small),
        Err(OpError::Shape(_))
    ));
    // Arity.
    assert!(matches!(
        call(run, &t, &[&x], &mut out),
        Err(OpError::Arity { what: "inputs", .. })
    ));
    assert!(matches!(
        call(run, &t, &[&x, &w, &w, &w], &mut out),
        Err(OpError::Arity { what: "inputs", .. })
    ));
    assert!(matches!(
        call(run, &t, &[&x, &w], &mut []),
        Err(OpError::Arity {
            what: "outputs",
            ..
        })
    ));
    assert!(out[0].to_f32_vec().iter().all(|v| v.is_nan()));
}

#[test]
fn registered_with_its_reference() {
    let reg = Registry::builtin().unwrap();
    let r = reg
        .reference(Opcode::LAYERNORM)
        .expect("LAYERNORM has a CPU reference");
    assert!(r.in_place.is_empty());
}
