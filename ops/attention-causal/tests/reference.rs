//! ATTENTION_CAUSAL's CPU reference equals ATTENTION_TILE (checked against f64 formulas in its
//! own crate) run row by row with that row's position, bit for bit; touches nothing outside its
//! tile; refuses bad calls and positions outside the cache with typed errors.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::json::Value;
use amk_core::testkit::{call, random_nonzero, rng, task};
use amk_core::{DType, OpError, Opcode, Tensor};
use rstest::rstest;

const MAX_SEQ: u64 = 20;

fn params(
    nh: usize,
    nkv: usize,
    hd: usize,
    rows: (usize, usize),
    cols: (usize, usize),
) -> Vec<(&'static str, Value)> {
    let int = |v: usize| Value::Int(v as i64);
    vec![
        ("head_dim", int(hd)),
        ("n_heads", int(nh)),
        ("n_kv_heads", int(nkv)),
        ("scale", Value::Float(0.3)),
        ("m_off", int(rows.0)),
        ("M_tile", int(rows.1)),
        ("n_off", int(cols.0)),
        ("N_tile", int(cols.1)),
    ]
}

#[rstest]
#[case::f32_gqa(DType::F32, 6, 2, 8)]
#[case::bf16_mha(DType::BF16, 2, 2, 16)]
fn equals_decode_attention_row_by_row(
    #[case] dt: DType,
    #[case] nh: usize,
    #[case] nkv: usize,
    #[case] hd: usize,
) {
    let rows = 5usize;
    let width = nh * hd;
    let mut r = rng(nh as u64 * 13 + hd as u64);
    let q = random_nonzero(dt, &[rows as u64, width as u64], &mut r, -1.0, 1.0);
    let shape = [MAX_SEQ, nkv as u64, hd as u64];
    let kc = random_nonzero(dt, &shape, &mut r, -1.0, 1.0);
    let vc = random_nonzero(dt, &shape, &mut r, -1.0, 1.0);
    let positions = [7i64, 8, 9, 10, 11];
    let pos = Tensor::from_i64(DType::I32, &[rows as u64], &positions).unwrap();
    // The tile: rows 1..4, the heads of the second KV head onwards.
    let h0 = nh / nkv;
    let t = task(
        Opcode::ATTENTION_CAUSAL,
        4,
        1,
        &params(nh, nkv, hd, (1, 3), (h0 * hd, width - h0 * hd)),
    );
    let mut got = [Tensor::poisoned(dt, &[rows as u64, width as u64])];
    call(
        op_attention_causal::reference::run,
        &t,
        &[&q, &kc, &vc, &pos],
        &mut got,
    )
    .unwrap();
    for (row, &p) in positions.iter().enumerate() {
        let qr = Tensor::from_f32(
            dt,
            &[1, width as u64],
            &(0..width)
                .map(|i| q.get_f32(row * width + i))
                .collect::<Vec<_>>(),
        )
        .unwrap();
        let pr = Tensor::from_i64(DType::I32, &[1], &[p]).unwrap();
        let dec = task(
            Opcode::ATTENTION_TILE,
            4,
            1,
            &[
                ("head_dim", Value::Int(hd as i64)),
                ("kv_start", Value::Int(0)),
                ("kv_len", Value::Int(MAX_SEQ as i64)),
                ("scale", Value::Float(0.3)),
                ("n_heads", Value::Int(nh as i64)),
                ("n_kv_heads", Value::Int(nkv as i64)),
            ],
        );
        let mut want = [Tensor::poisoned(dt, &[1, width as u64])];
        call(
            op_attention_tile::reference::run,
            &dec,
            &[&qr, &kc, &vc, &pr],
            &mut want,
        )
        .unwrap();
        for c in 0..width {
            let a = got[0].get_f32(row * width + c);
            if (1..4).contains(&row) && c >= h0 * hd {
                let b = want[0].get_f32(c);
                assert_eq!(a.to_bits(), b.to_bits(), "row {row} column {c}: {a} vs {b}");
            } else {
                assert!(
                    a.is_nan(),
                    "row {row} column {c} outside the tile was written"
                );
            }
        }
    }
}

#[test]
fn bad_calls_are_typed_errors() {
    let mut r = rng(3);
    let q = random_nonzero(DType::F32, &[2, 8], &mut r, -1.0, 1.0);
    let kc = random_nonzero(DType::F32, &[MAX_SEQ, 1, 4], &mut r, -1.0, 1.0);
    let run = |pos: &[i64], p: &[(&str, Value)]| {
        let pos = Tensor::from_i64(DType::I32, &[pos.len() as u64], pos).unwrap();
        let mut out = [Tensor::poisoned(DType::F32, &[2, 8])];
        let t = task(Opcode::ATTENTION_CAUSAL, 4, 1, p);
        call(
            op_attention_causal::reference::run,
            &t,
            &[&q, &kc, &kc, &pos],
            &mut out,
        )
    };
    let all = params(2, 1, 4, (0, 2), (0, 8));
    assert!(run(&[0, 1], &all).is_ok());
    assert!(matches!(
        run(&[0, MAX_SEQ as i64], &all),
        Err(OpError::IndexOutOfRange { .. })
    ));
    assert!(matches!(
        run(&[0, -1], &all),
        Err(OpError::IndexOutOfRange { .. })
    ));
    assert!(matches!(run(&[0], &all), Err(OpError::DType(_))));
    assert!(matches!(
        run(&[0, 1], &params(2, 1, 4, (1, 2), (0, 8))),
        Err(OpError::Shape(_))
    ));
    assert!(matches!(
        run(&[0, 1], &params(2, 1, 4, (0, 2), (2, 4))),
        Err(OpError::Shape(_))
    ));
}
