//! KV_APPEND's CPU reference, called as a backend calls it (the cache passed in place as
//! `Input::InPlace(0)` and handed over as output 0): new rows land at `pos` (cast on store),
//! every other element of a random cache is bit-for-bit unchanged, and bad calls are typed
//! errors that leave the cache untouched.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::json::Value;
use amk_core::testkit::{assert_close, random_nonzero, rng, task};
use amk_core::{CpuCall, DType, Input, OpError, Opcode, Task, Tensor};
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

    // Arity: one input, three inputs, no output.
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
    let three = [Input::Tensor(&row), Input::InPlace(0), Input::Tensor(&row)];
    let e = run(&mut CpuCall {
        task: &t,
        registry: None,
        inputs: &three,
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

#[test]
fn the_registration_declares_the_in_place_pair() {
    let reg = amk_core::inventory::iter::<amk_core::OpRegistration>
        .into_iter()
        .find(|r| r.spec.code == Opcode::KV_APPEND)
        .expect("KV_APPEND is registered");
    let reference = reg.reference.expect("KV_APPEND has a CPU reference");
    assert_eq!(reference.in_place, &[(1, 0)]);
}
