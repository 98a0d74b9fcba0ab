//! KV_APPEND's CPU reference, called as a backend calls it (the cache passed in place as
//! `Input::InPlace(0)` and handed over as output 0): new rows land at `pos` (cast on store),
//! every other element of a random cache is bit-for-bit unchanged, and bad calls are typed
//! errors that leave the cache untouched; the row from a position input is the param's, and
//! the shape rule takes the param or the input, never both.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::json::Value;
use amk_core::testkit::{assert_close, random_nonzero, rng, shape_rule_kinds, task};
use amk_core::{
    Buffer, BufferKind, CpuCall, DType, ErrorKind, Input, MemSpace, OpError, Opcode, Task, Tensor,
};
use op_kv_append::reference::run;
use rstest::rstest;

fn pos_task(pos: i64) -> Task {
    task(Opcode::KV_APPEND, 2, 1, &[("pos", Value::Int(pos))])
}

/// Calls KV_APPEND in place: input 1 is the cache, aliased to output 0.
fn append(t: &Task, new: &Tensor, cache: Tensor) -> (Result<(), OpError>, Tensor) {
    let ins = [Input::Tensor(new), Input::InPlace(0)];
    let mut outs = [cache];
    let r = run(&mut CpuCall {
        task: t,
        registry: None,
        inputs: &ins,
        outputs: &mut outs,
    });
    let [cache] = outs;
    (r, cache)
}

/// Bits of every element, to prove "untouched" exactly.
fn bits(t: &Tensor) -> Vec<u32> {
    t.to_f32_vec().iter().map(|x| x.to_bits()).collect()
}

/// Expected cache after the append, in f64: the old values everywhere, `new` (as read, in
/// row-major order) over the destination elements. Also returns which elements were written.
fn expected(old: &Tensor, new: &Tensor, pos: usize) -> (Vec<f64>, Vec<bool>) {
    let mut want: Vec<f64> = old.to_f32_vec().iter().map(|&x| x as f64).collect();
    let mut written = vec![false; want.len()];
    let s = old.shape();
    let dest: Vec<usize> = if s.len() == 4 {
        let (b, max_seq, per) = (s[0] as usize, s[1] as usize, (s[2] * s[3]) as usize);
        (0..b)
            .flat_map(|i| (0..per).map(move |e| (i * max_seq + pos) * per + e))
            .collect()
    } else {
        let row = (old.numel() as u64 / s[0]) as usize;
        (pos * row..pos * row + new.numel()).collect()
    };
    assert_eq!(dest.len(), new.numel());
    for (i, &d) in dest.iter().enumerate() {
        want[d] = new.get_f32(i) as f64;
        written[d] = true;
    }
    (want, written)
}

#[rstest]
// Decode step: one roped k row [1, n_kv, hd] into [max_seq, n_kv, hd] at 0, middle, last.
#[case(&[1, 2, 4], &[8, 2, 4], 0, DType::F32, DType::F32)]
#[case(&[1, 2, 4], &[8, 2, 4], 3, DType::F32, DType::F32)]
#[case(&[1, 2, 4], &[8, 2, 4], 7, DType::F32, DType::F32)]
// A v row arriving flat [1, kv_dim], odd head_dim.
#[case(&[1, 15], &[6, 3, 5], 2, DType::F32, DType::F32)]
// Several rows at once (prefill chunk) ending exactly at the cache's end.
#[case(&[3, 2, 4], &[8, 2, 4], 5, DType::F32, DType::F32)]
// Flat rank-2 cache [max_seq, n_kv * hd] with a rank-1 row.
#[case(&[12], &[6, 12], 4, DType::F32, DType::F32)]
// Cast on store: f32 rows into f16 and bf16 caches, a bf16 row into an f32 cache.
#[case(&[1, 4, 64], &[16, 4, 64], 9, DType::F32, DType::F16)]
#[case(&[2, 8], &[5, 1, 8], 1, DType::F32, DType::BF16)]
#[case(&[1, 1, 3], &[4, 1, 3], 3, DType::BF16, DType::F32)]
// Batched rank-4 cache [B, max_seq, n_kv, hd]: new [B, n_kv, hd] or flat, at 0 and at the end.
#[case(&[2, 2, 3], &[2, 5, 2, 3], 0, DType::F32, DType::F32)]
#[case(&[12], &[2, 5, 2, 3], 4, DType::F32, DType::F32)]
#[case(&[3, 1, 7], &[3, 9, 1, 7], 6, DType::F32, DType::F16)]
fn writes_new_rows_and_nothing_else(
    #[case] new_shape: &[u64],
    #[case] cache_shape: &[u64],
    #[case] pos: usize,
    #[case] dnew: DType,
    #[case] dcache: DType,
) {
    let mut r = rng(new_shape.iter().product::<u64>() * 100 + pos as u64 + dcache as u64);
    let new = random_nonzero(dnew, new_shape, &mut r, -3.0, 3.0);
    let old = random_nonzero(dcache, cache_shape, &mut r, -3.0, 3.0);
    let (want, written) = expected(&old, &new, pos);
    let (res, cache) = append(&pos_task(pos as i64), &new, old.clone());
    res.unwrap();
    assert_eq!(cache.shape(), old.shape());
    assert_eq!(cache.dtype(), old.dtype());
    let (got_bits, old_bits) = (bits(&cache), bits(&old));
    for (i, w) in written.iter().enumerate() {
        if !w {
            assert_eq!(
                got_bits[i], old_bits[i],
                "element {i} was not to be touched"
            );
        }
    }
    assert!(written.iter().any(|w| *w));
    assert_close(&cache, &want, 0.0, 1e-7);
}

#[test]
fn a_cache_passed_as_an_ordinary_input_is_copied_then_appended() {
    let mut r = rng(5);
    let new = random_nonzero(DType::F32, &[1, 2, 3], &mut r, -1.0, 1.0);
    let cache = random_nonzero(DType::F32, &[4, 2, 3], &mut r, -1.0, 1.0);
    let (want, _) = expected(&cache, &new, 2);
    let mut out = [Tensor::poisoned(DType::F32, &[4, 2, 3])];
    amk_core::testkit::call(run, &pos_task(2), &[&new, &cache], &mut out).unwrap();
    assert_close(&out[0], &want, 0.0, 0.0);
}

#[test]
fn bad_calls_are_typed_errors_and_leave_the_cache_alone() {
    let mut r = rng(11);
    let row = random_nonzero(DType::F32, &[1, 2, 4], &mut r, -1.0, 1.0);
    let cache3 = random_nonzero(DType::F32, &[8, 2, 4], &mut r, -1.0, 1.0);
    let cache4 = random_nonzero(DType::F32, &[2, 5, 2, 4], &mut r, -1.0, 1.0);
    let batch_rows = random_nonzero(DType::F32, &[2, 2, 4], &mut r, -1.0, 1.0);
    let check = |t: &Task, new: &Tensor, cache: &Tensor, pred: fn(&OpError) -> bool| {
        let (res, after) = append(t, new, cache.clone());
        let e = res.unwrap_err();
        assert!(pred(&e), "unexpected error {e:?}");
        assert_eq!(bits(&after), bits(cache), "a failed call wrote the cache");
    };
    let bad_param = |e: &OpError| matches!(e, OpError::BadParam { .. });
    let shape = |e: &OpError| matches!(e, OpError::Shape(_));

    // pos beyond the cache (rank 3: pos + rows > max_seq; rank 4: pos >= max_seq), negative.
    check(&pos_task(8), &row, &cache3, bad_param);
    let two_rows = random_nonzero(DType::F32, &[2, 8], &mut r, -1.0, 1.0);
    check(&pos_task(7), &two_rows, &cache3, bad_param);
    check(&pos_task(5), &batch_rows, &cache4, bad_param);
    check(&pos_task(-1), &row, &cache3, bad_param);
    // pos missing or not an integer.
    let no_pos = task(Opcode::KV_APPEND, 2, 1, &[]);
    let (res, _) = append(&no_pos, &row, cache3.clone());
    assert_eq!(res, Err(OpError::MissingParam("pos".into())));
    check(
        &task(Opcode::KV_APPEND, 2, 1, &[("pos", Value::Float(1.5))]),
        &row,
        &cache3,
        bad_param,
    );
    // Not a whole number of rows; a batched cache given the wrong element count; bad ranks.
    let ragged = random_nonzero(DType::F32, &[7], &mut r, -1.0, 1.0);
    check(&pos_task(0), &ragged, &cache3, shape);
    check(&pos_task(0), &row, &cache4, shape);
    let rank1 = random_nonzero(DType::F32, &[64], &mut r, -1.0, 1.0);
    check(&pos_task(0), &row, &rank1, shape);
    let rank5 = random_nonzero(DType::F32, &[1, 2, 5, 2, 4], &mut r, -1.0, 1.0);
    check(&pos_task(0), &row, &rank5, shape);

    // Arity: one input, four inputs, no output.
    let t = pos_task(0);
    let mut outs = [cache3.clone()];
    let one = [Input::InPlace(0)];
    let e = run(&mut CpuCall {
        task: &t,
        registry: None,
        inputs: &one,
        outputs: &mut outs,
    });
    assert!(matches!(e, Err(OpError::Arity { .. })));
    let four = [
        Input::Tensor(&row),
        Input::InPlace(0),
        Input::Tensor(&row),
        Input::Tensor(&row),
    ];
    let e = run(&mut CpuCall {
        task: &t,
        registry: None,
        inputs: &four,
        outputs: &mut outs,
    });
    assert!(matches!(e, Err(OpError::Arity { .. })));
    let two = [Input::Tensor(&row), Input::InPlace(0)];
    let e = run(&mut CpuCall {
        task: &t,
        registry: None,
        inputs: &two,
        outputs: &mut [],
    });
    assert!(matches!(e, Err(OpError::Arity { .. })));
    // The cache aliased to an output that does not exist; the new rows passed in place.
    let e = run(&mut CpuCall {
        task: &t,
        registry: None,
        inputs: &[Input::Tensor(&row), Input::InPlace(1)],
        outputs: &mut outs,
    });
    assert!(matches!(e, Err(OpError::Arity { .. })));
    let e = run(&mut CpuCall {
        task: &t,
        registry: None,
        inputs: &[Input::InPlace(0), Input::InPlace(0)],
        outputs: &mut outs,
    });
    assert_eq!(e, Err(OpError::InPlaceInput(0)));
    assert_eq!(bits(&outs[0]), bits(&cache3));
    // A separate cache input whose size differs from the output.
    let mut out = [Tensor::poisoned(DType::F32, &[4, 2, 4])];
    assert!(matches!(
        amk_core::testkit::call(run, &t, &[&row, &cache3], &mut out),
        Err(OpError::Shape(_))
    ));
}

/// Calls KV_APPEND in place with the row from a position input (no param).
fn append_at(new: &Tensor, cache: Tensor, pos: &Tensor) -> (Result<(), OpError>, Tensor) {
    let t = task(Opcode::KV_APPEND, 3, 1, &[]);
    let ins = [Input::Tensor(new), Input::InPlace(0), Input::Tensor(pos)];
    let mut outs = [cache];
    let r = run(&mut CpuCall {
        task: &t,
        registry: None,
        inputs: &ins,
        outputs: &mut outs,
    });
    let [cache] = outs;
    (r, cache)
}

/// A position buffer of `dtype` and `shape` whose element 0 is `p`; the rest are decoys.
fn pos_buffer(dtype: DType, shape: &[u64], p: i64) -> Tensor {
    let n = shape.iter().product::<u64>() as usize;
    let mut v = vec![1i64; n];
    v[0] = p;
    Tensor::from_i64(dtype, shape, &v).unwrap()
}

#[rstest]
// One row at the first, a middle and the last row of the cache, positions of several dtypes.
#[case(&[1, 2, 4], &[8, 2, 4], 0, DType::I32, &[1])]
#[case(&[1, 2, 4], &[8, 2, 4], 3, DType::I8, &[2])]
#[case(&[1, 2, 4], &[8, 2, 4], 7, DType::U8, &[3])]
// Several rows ending at the cache's end; a flat rank-2 cache.
#[case(&[3, 2, 4], &[8, 2, 4], 5, DType::I32, &[1])]
#[case(&[12], &[6, 12], 4, DType::I32, &[1])]
// Batched rank-4 cache: every batch's row at the position.
#[case(&[2, 2, 3], &[2, 5, 2, 3], 4, DType::I32, &[1])]
fn a_position_input_writes_that_row_as_the_param_does(
    #[case] new_shape: &[u64],
    #[case] cache_shape: &[u64],
    #[case] pos: usize,
    #[case] pdt: DType,
    #[case] pshape: &[u64],
) {
    let mut r = rng(new_shape.iter().product::<u64>() * 31 + pos as u64);
    let new = random_nonzero(DType::F32, new_shape, &mut r, -3.0, 3.0);
    let old = random_nonzero(DType::F32, cache_shape, &mut r, -3.0, 3.0);
    let (want, written) = expected(&old, &new, pos);
    let (res, cache) = append_at(&new, old.clone(), &pos_buffer(pdt, pshape, pos as i64));
    res.unwrap();
    let (got_bits, old_bits) = (bits(&cache), bits(&old));
    for (i, w) in written.iter().enumerate() {
        if !w {
            assert_eq!(
                got_bits[i], old_bits[i],
                "element {i} was not to be touched"
            );
        }
    }
    assert_close(&cache, &want, 0.0, 0.0);
    // The param form writes the same bits.
    let (res, by_param) = append(&pos_task(pos as i64), &new, old.clone());
    res.unwrap();
    assert_eq!(bits(&by_param), got_bits);
}

#[test]
fn bad_position_inputs_are_typed_errors_and_leave_the_cache_alone() {
    let mut r = rng(23);
    let row = random_nonzero(DType::F32, &[1, 2, 4], &mut r, -1.0, 1.0);
    let two_rows = random_nonzero(DType::F32, &[2, 8], &mut r, -1.0, 1.0);
    let cache3 = random_nonzero(DType::F32, &[8, 2, 4], &mut r, -1.0, 1.0);
    let cache4 = random_nonzero(DType::F32, &[2, 5, 2, 4], &mut r, -1.0, 1.0);
    let batch_rows = random_nonzero(DType::F32, &[2, 2, 4], &mut r, -1.0, 1.0);
    let check = |new: &Tensor, cache: &Tensor, pos: &Tensor, want: OpError| {
        let (res, after) = append_at(new, cache.clone(), pos);
        assert_eq!(res, Err(want));
        assert_eq!(bits(&after), bits(cache), "a failed call wrote the cache");
    };
    let index = |value: i64, limit: u64| OpError::IndexOutOfRange {
        at: 0,
        value,
        limit,
    };
    let i32_pos = |p: i64| pos_buffer(DType::I32, &[1], p);
    // Past the cache: one row at max_seq; two rows from the last row; a batched cache.
    check(&row, &cache3, &i32_pos(8), index(8, 8));
    check(&two_rows, &cache3, &i32_pos(7), index(7, 7));
    check(&batch_rows, &cache4, &i32_pos(5), index(5, 5));
    // Negative.
    check(&row, &cache3, &i32_pos(-1), index(-1, 8));
    check(
        &batch_rows,
        &cache4,
        &pos_buffer(DType::I8, &[2], -7),
        index(-7, 5),
    );
    // Not integers; no element.
    let fpos = random_nonzero(DType::F32, &[1], &mut r, 1.0, 2.0);
    let (res, after) = append_at(&row, cache3.clone(), &fpos);
    assert!(matches!(res, Err(OpError::DType(_))), "{res:?}");
    assert_eq!(bits(&after), bits(&cache3));
    let (res, _) = append_at(&row, cache3.clone(), &Tensor::zeros(DType::I32, &[0]));
    assert!(matches!(res, Err(OpError::DType(_))), "{res:?}");
    // The param and the input together: one source of truth.
    let both = pos_task(2);
    let ins = [
        Input::Tensor(&row),
        Input::InPlace(0),
        Input::Tensor(&i32_pos(2)),
    ];
    let mut outs = [cache3.clone()];
    let e = run(&mut CpuCall {
        task: &both,
        registry: None,
        inputs: &ins,
        outputs: &mut outs,
    });
    assert!(matches!(e, Err(OpError::BadParam { .. })), "{e:?}");
    assert_eq!(bits(&outs[0]), bits(&cache3));
}

fn slice_task(pos: i64, off: i64, tile: i64) -> Task {
    task(
        Opcode::KV_APPEND,
        2,
        1,
        &[
            ("pos", Value::Int(pos)),
            ("n_off", Value::Int(off)),
            ("N_tile", Value::Int(tile)),
        ],
    )
}

#[rstest]
// Three rows of 8 into [8, 2, 4] at 5: the first half of each row, a middle slice, the last.
#[case(&[3, 2, 4], &[8, 2, 4], 5, 0, 4, DType::F32)]
#[case(&[3, 2, 4], &[8, 2, 4], 2, 3, 2, DType::F32)]
#[case(&[3, 8], &[8, 2, 4], 0, 7, 1, DType::BF16)]
// A flat rank-2 cache, the whole row as one slice.
#[case(&[2, 6], &[4, 6], 1, 0, 6, DType::F32)]
fn a_column_slice_writes_its_columns_of_every_row_and_nothing_else(
    #[case] new_shape: &[u64],
    #[case] cache_shape: &[u64],
    #[case] pos: usize,
    #[case] off: usize,
    #[case] tile: usize,
    #[case] dt: DType,
) {
    let mut r = rng(pos as u64 * 31 + off as u64 * 7 + tile as u64);
    let new = random_nonzero(dt, new_shape, &mut r, -3.0, 3.0);
    let old = random_nonzero(dt, cache_shape, &mut r, -3.0, 3.0);
    let row = (old.numel() as u64 / cache_shape[0]) as usize;
    let mut want: Vec<f64> = old.to_f32_vec().iter().map(|&x| x as f64).collect();
    for i in 0..new.numel() / row {
        for c in off..off + tile {
            want[(pos + i) * row + c] = new.get_f32(i * row + c) as f64;
        }
    }
    let (res, cache) = append(&slice_task(pos as i64, off as i64, tile as i64), &new, old);
    res.unwrap();
    assert_close(&cache, &want, 0.0, 0.0);
}

#[test]
fn slices_that_cover_the_row_equal_the_whole_append() {
    let mut r = rng(77);
    let new = random_nonzero(DType::F32, &[4, 3, 8], &mut r, -3.0, 3.0);
    let old = random_nonzero(DType::F32, &[10, 3, 8], &mut r, -3.0, 3.0);
    let (res, whole) = append(&pos_task(6), &new, old.clone());
    res.unwrap();
    let mut sliced = old;
    for (off, tile) in [(0, 8), (8, 8), (16, 8)] {
        let (res, c) = append(&slice_task(6, off, tile), &new, sliced);
        res.unwrap();
        sliced = c;
    }
    assert_eq!(bits(&sliced), bits(&whole));
}

#[test]
fn bad_column_slices_are_typed_errors_and_leave_the_cache_alone() {
    let mut r = rng(78);
    let new = random_nonzero(DType::F32, &[2, 8], &mut r, -3.0, 3.0);
    let old = random_nonzero(DType::F32, &[4, 2, 4], &mut r, -3.0, 3.0);
    let lone = task(
        Opcode::KV_APPEND,
        2,
        1,
        &[("pos", Value::Int(0)), ("N_tile", Value::Int(4))],
    );
    for (t, what) in [
        (slice_task(0, 6, 4), "past the row"),
        (slice_task(0, -1, 4), "negative n_off"),
        (slice_task(0, 0, 0), "empty slice"),
        (lone, "N_tile without n_off"),
    ] {
        let (res, cache) = append(&t, &new, old.clone());
        assert!(
            matches!(
                res,
                Err(OpError::BadParam { .. } | OpError::MissingParam(_))
            ),
            "{what}: {res:?}"
        );
        assert_eq!(bits(&cache), bits(&old), "{what}");
    }
    // A batched cache takes no slices.
    let b_new = random_nonzero(DType::F32, &[2, 8], &mut r, -3.0, 3.0);
    let b_old = random_nonzero(DType::F32, &[2, 4, 2, 4], &mut r, -3.0, 3.0);
    let (res, cache) = append(&slice_task(0, 0, 4), &b_new, b_old.clone());
    assert!(matches!(res, Err(OpError::Shape(_))), "{res:?}");
    assert_eq!(bits(&cache), bits(&b_old));
}

#[test]
fn the_shape_rule_checks_a_column_slice() {
    let slice = |off: i64, tile: i64| {
        [
            ("pos", Value::Int(0)),
            ("n_off", Value::Int(off)),
            ("N_tile", Value::Int(tile)),
        ]
    };
    assert!(findings(&[2, 8], &[8, 2, 4], None, &slice(4, 4)).is_empty());
    assert_eq!(
        findings(&[2, 8], &[8, 2, 4], None, &slice(6, 4)),
        vec![ErrorKind::TileOutOfBounds]
    );
    assert_eq!(
        findings(&[2, 8], &[8, 2, 4], None, &slice(0, 0)),
        vec![ErrorKind::TileOutOfBounds]
    );
    assert_eq!(
        findings(
            &[2, 8],
            &[8, 2, 4],
            None,
            &[("pos", Value::Int(0)), ("n_off", Value::Int(0))]
        ),
        vec![ErrorKind::MissingParam]
    );
    assert_eq!(
        findings(&[2, 8], &[2, 8, 2, 4], None, &slice(0, 4)),
        vec![ErrorKind::ShapeMismatch]
    );
    assert_eq!(
        op_kv_append::SPEC.write_region,
        amk_core::WriteRegion::OverwrittenColumns
    );
}

fn buffer(id: u32, dtype: DType, shape: &[u64]) -> Buffer {
    Buffer {
        id,
        name: format!("b{id}"),
        kind: BufferKind::KV_CACHE,
        dtype,
        shape: shape.to_vec(),
        space: MemSpace::HBM,
        source: None,
    }
}

/// KV_APPEND's static shape rule on `[new, cache (, pos)] -> cache` with the given params.
fn findings(
    new: &[u64],
    cache: &[u64],
    pos: Option<(DType, &[u64])>,
    params: &[(&str, Value)],
) -> Vec<ErrorKind> {
    let mut buffers = vec![buffer(0, DType::F32, new), buffer(1, DType::F32, cache)];
    let mut t = task(Opcode::KV_APPEND, 2, 1, params);
    if let Some((dt, shape)) = pos {
        buffers.push(buffer(2, dt, shape));
        t.inputs.push(2);
    }
    t.outputs = vec![1];
    assert!(
        op_kv_append::SPEC.check.is_some(),
        "KV_APPEND has a shape rule"
    );
    shape_rule_kinds(&op_kv_append::SPEC, &t, &buffers)
}

#[test]
fn the_shape_rule_takes_the_param_or_the_input() {
    let pos = |p: i64| [("pos", Value::Int(p))];
    let int_pos: Option<(DType, &[u64])> = Some((DType::I32, &[1]));
    // The param alone, as before.
    assert!(findings(&[1, 8], &[8, 2, 4], None, &pos(7)).is_empty());
    assert_eq!(
        findings(&[1, 8], &[8, 2, 4], None, &pos(8)),
        vec![ErrorKind::TileOutOfBounds]
    );
    // The input alone: any integer buffer with an element; the rows must fit at all.
    assert!(findings(&[1, 8], &[8, 2, 4], int_pos, &[]).is_empty());
    assert!(findings(&[8, 8], &[8, 2, 4], Some((DType::U8, &[4])), &[]).is_empty());
    assert!(findings(&[2, 8], &[2, 8, 2, 4], int_pos, &[]).is_empty());
    assert_eq!(
        findings(&[9, 8], &[8, 2, 4], int_pos, &[]),
        vec![ErrorKind::TileOutOfBounds]
    );
    assert_eq!(
        findings(&[1, 8], &[8, 2, 4], Some((DType::F32, &[1])), &[]),
        vec![ErrorKind::ShapeMismatch]
    );
    assert_eq!(
        findings(&[1, 8], &[8, 2, 4], Some((DType::I32, &[0])), &[]),
        vec![ErrorKind::ShapeMismatch]
    );
    // Both, or neither.
    assert_eq!(
        findings(&[1, 8], &[8, 2, 4], int_pos, &pos(3)),
        vec![ErrorKind::ShapeMismatch]
    );
    assert_eq!(
        findings(&[1, 8], &[8, 2, 4], None, &[]),
        vec![ErrorKind::MissingParam]
    );
    assert_eq!(op_kv_append::SPEC.max_inputs, Some(3));
}

#[test]
fn the_registration_declares_the_in_place_pair() {
    let reg = amk_core::inventory::iter::<amk_core::OpRegistration>
        .into_iter()
        .find(|r| r.spec.code == Opcode::KV_APPEND)
        .expect("KV_APPEND is registered");
    let reference = reg.reference.expect("KV_APPEND has a CPU reference");
    assert_eq!(reference.in_place, &[(1, 0)]);
}
