//! EMBED's CPU reference against a naive row gather: random ids (every integer dtype) over
//! random non-zero tables (every float dtype) of ranks 1–3, ids of ranks 0–2, viewed outputs,
//! the lowering's reshape bridge, out-of-range ids (never clamped, nothing written), and typed
//! errors for bad calls.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::json::Value;
use amk_core::testkit::{assert_close, call, random_nonzero, rng, task};
use amk_core::{DType, OpError, Opcode, Registry, Task, Tensor};
use op_embed::reference::run;
use rstest::rstest;

fn embed_task(hidden: i64) -> Task {
    task(Opcode::EMBED, 2, 1, &[("hidden", Value::Int(hidden))])
}

/// f16's subnormal spacing: tiny values round to a multiple of 2^-24.
fn atol(d: DType) -> f64 {
    if d == DType::F16 { 2f64.powi(-24) } else { 0.0 }
}

/// What the gather must produce, computed naively: for the k-th id, the whole table row.
fn gathered(ids: &Tensor, table: &Tensor) -> Vec<f64> {
    let rows = table.shape()[0] as usize;
    let row = table.numel() / rows;
    let mut want = Vec::new();
    for k in 0..ids.numel() {
        let id = ids.get_i64(k) as usize;
        for j in 0..row {
            want.push(table.get_f32(id * row + j) as f64);
        }
    }
    want
}

#[rstest]
// ids shape, table shape, out shape, ids dtype, table dtype, out dtype
#[case(&[], &[11, 4], &[4], DType::I32, DType::F32, DType::F32)]
#[case(&[1], &[5, 7], &[1, 7], DType::I32, DType::F32, DType::F16)]
#[case(&[3], &[9, 5], &[3, 5], DType::I8, DType::F16, DType::F32)]
#[case(&[2, 3], &[13, 6], &[2, 3, 6], DType::U8, DType::BF16, DType::BF16)]
#[case(&[5], &[17], &[5], DType::I32, DType::F32, DType::F32)]
#[case(&[4], &[6, 2, 3], &[4, 6], DType::I32, DType::BF16, DType::F32)]
#[case(&[7], &[3, 33], &[7, 33], DType::I32, DType::F16, DType::F16)]
#[case(&[1, 2], &[50, 64], &[2, 4, 16], DType::I32, DType::F32, DType::BF16)]
#[case(&[6], &[2, 1, 1, 5], &[30], DType::I8, DType::F32, DType::F32)]
fn matches_naive_gather(
    #[case] sid: &[u64],
    #[case] stab: &[u64],
    #[case] sout: &[u64],
    #[case] did: DType,
    #[case] dtab: DType,
    #[case] dout: DType,
) {
    let mut r = rng(stab.iter().sum::<u64>() * 13 + sid.len() as u64 + dout as u64 * 5);
    let rows = stab[0] as f64;
    let ids = Tensor::random(did, sid, &mut r, 0.0, rows - 1.0);
    let table = random_nonzero(dtab, stab, &mut r, -3.0, 3.0);
    let mut out = [Tensor::poisoned(dout, sout)];
    call(run, &embed_task(64), &[&ids, &table], &mut out).unwrap();
    assert_close(&out[0], &gathered(&ids, &table), 0.0, atol(dout));
}

#[test]
fn repeated_and_boundary_ids() {
    let mut r = rng(77);
    let table = random_nonzero(DType::F32, &[8, 3], &mut r, -1.0, 1.0);
    let ids = Tensor::from_i64(DType::I32, &[5], &[7, 0, 7, 3, 0]).unwrap();
    let mut out = [Tensor::poisoned(DType::F32, &[5, 3])];
    call(run, &embed_task(3), &[&ids, &table], &mut out).unwrap();
    assert_close(&out[0], &gathered(&ids, &table), 0.0, 0.0);
}

#[test]
fn reshape_bridge_flat_to_heads() {
    // The lowering's bridge: ids = [0] over a flat [1, dim] activation, written as heads.
    let mut r = rng(5);
    let flat = random_nonzero(DType::F32, &[1, 96], &mut r, -2.0, 2.0);
    let ids = Tensor::from_i64(DType::I32, &[1], &[0]).unwrap();
    let mut out = [Tensor::poisoned(DType::F32, &[6, 16])];
    call(run, &embed_task(16), &[&ids, &flat], &mut out).unwrap();
    assert_eq!(out[0].to_f32_vec(), flat.to_f32_vec());
    // Batched: ids = arange(B) over [B, dim] -> [B, heads, head_dim], again a pure view.
    let flat = random_nonzero(DType::BF16, &[3, 40], &mut r, -2.0, 2.0);
    let ids = Tensor::from_i64(DType::I32, &[3], &[0, 1, 2]).unwrap();
    let mut out = [Tensor::poisoned(DType::BF16, &[3, 5, 8])];
    call(run, &embed_task(8), &[&ids, &flat], &mut out).unwrap();
    assert_eq!(out[0].to_f32_vec(), flat.to_f32_vec());
}

#[test]
fn integer_tables_copy_exactly() {
    let table = Tensor::from_i64(DType::I32, &[2, 2], &[16_777_217, -5, 7, 2_000_000_001]).unwrap();
    let ids = Tensor::from_i64(DType::I32, &[2], &[1, 0]).unwrap();
    let mut out = [Tensor::poisoned(DType::I32, &[4])];
    call(run, &embed_task(2), &[&ids, &table], &mut out).unwrap();
    let got: Vec<i64> = (0..4).map(|i| out[0].get_i64(i)).collect();
    assert_eq!(got, [7, 2_000_000_001, 16_777_217, -5]);
}

#[rstest]
#[case(&[0, 1, 9], 2, 9)]
#[case(&[0, -1], 1, -1)]
#[case(&[1000], 0, 1000)]
#[case(&[-2_147_483_648], 0, -2_147_483_648)]
fn out_of_range_ids_are_errors_not_clamps(
    #[case] id_vals: &[i64],
    #[case] at: usize,
    #[case] value: i64,
) {
    let mut r = rng(9);
    let table = random_nonzero(DType::F32, &[9, 4], &mut r, -1.0, 1.0);
    let ids = Tensor::from_i64(DType::I32, &[id_vals.len() as u64], id_vals).unwrap();
    let mut out = [Tensor::poisoned(DType::F32, &[id_vals.len() as u64, 4])];
    let got = call(run, &embed_task(4), &[&ids, &table], &mut out);
    assert_eq!(
        got,
        Err(OpError::IndexOutOfRange {
            at,
            value,
            limit: 9
        })
    );
    // Checked before anything is written.
    assert!(out[0].to_f32_vec().iter().all(|v| v.is_nan()));
}

#[test]
fn bad_calls_are_typed_errors() {
    let ids = Tensor::from_i64(DType::I32, &[2], &[0, 1]).unwrap();
    let table = Tensor::zeros(DType::F32, &[4, 3]);
    let t = embed_task(3);
    let mut out = [Tensor::poisoned(DType::F32, &[2, 3])];
    // Float ids.
    let fids = Tensor::zeros(DType::F32, &[2]);
    assert!(matches!(
        call(run, &t, &[&fids, &table], &mut out),
        Err(OpError::DType(_))
    ));
    // Output not len(ids) x row elements.
    let mut short = [Tensor::poisoned(DType::F32, &[5])];
    assert!(matches!(
        call(run, &t, &[&ids, &table], &mut short),
        Err(OpError::Shape(_))
    ));
    // Missing / mistyped hidden.
    let none = task(Opcode::EMBED, 2, 1, &[]);
    assert_eq!(
        call(run, &none, &[&ids, &table], &mut out),
        Err(OpError::MissingParam("hidden".into()))
    );
    let real = task(Opcode::EMBED, 2, 1, &[("hidden", Value::Float(3.5))]);
    assert!(matches!(
        call(run, &real, &[&ids, &table], &mut out),
        Err(OpError::BadParam { .. })
    ));
    // Arity.
    assert!(matches!(
        call(run, &t, &[&ids], &mut out),
        Err(OpError::Arity { what: "inputs", .. })
    ));
    assert!(matches!(
        call(run, &t, &[&ids, &table, &table], &mut out),
        Err(OpError::Arity { what: "inputs", .. })
    ));
    assert!(matches!(
        call(run, &t, &[&ids, &table], &mut []),
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
        .reference(Opcode::EMBED)
        .expect("EMBED has a CPU reference");
    assert!(r.in_place.is_empty());
}
