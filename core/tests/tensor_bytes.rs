//! The tensors' little-endian byte layout (the device's and safetensors'): known bytes decode
//! to known values, every dtype round-trips, and a byte count that is not whole elements is
//! refused.
#![allow(clippy::unwrap_used)] // test file

use amk_core::sim::SplitMix;
use amk_core::{DType, Tensor};
use rstest::rstest;

#[test]
fn known_bytes_decode_to_known_values() {
    // 1.0 is 0x3f80 in bf16, 0x3c00 in f16, 0x3f800000 in f32; -2 is 0xfffffffe in i32.
    let bf = Tensor::from_le_bytes(DType::BF16, &[2], &[0x80, 0x3f, 0x00, 0xc0]).unwrap();
    assert_eq!(bf.to_f32_vec(), [1.0, -2.0]);
    let h = Tensor::from_le_bytes(DType::F16, &[1], &[0x00, 0x3c]).unwrap();
    assert_eq!(h.to_f32_vec(), [1.0]);
    let f = Tensor::from_le_bytes(DType::F32, &[1], &[0x00, 0x00, 0x80, 0x3f]).unwrap();
    assert_eq!(f.to_f32_vec(), [1.0]);
    let i = Tensor::from_le_bytes(DType::I32, &[1], &[0xfe, 0xff, 0xff, 0xff]).unwrap();
    assert_eq!(i.get_i64(0), -2);
    assert_eq!(bf.to_le_bytes(), [0x80, 0x3f, 0x00, 0xc0]);
    assert_eq!(i.to_le_bytes(), [0xfe, 0xff, 0xff, 0xff]);
}

#[rstest]
#[case::f32(DType::F32)]
#[case::f16(DType::F16)]
#[case::bf16(DType::BF16)]
#[case::i32(DType::I32)]
#[case::i8(DType::I8)]
#[case::u8(DType::U8)]
fn every_dtype_round_trips(#[case] dtype: DType) {
    let t = Tensor::random(dtype, &[3, 37], &mut SplitMix(9), -100.0, 100.0);
    let bytes = t.to_le_bytes();
    assert_eq!(bytes.len(), 3 * 37 * dtype.bits() as usize / 8);
    let back = Tensor::from_le_bytes(dtype, &[3, 37], &bytes).unwrap();
    assert_eq!(back.to_le_bytes(), bytes);
    assert_eq!(back.to_f32_vec(), t.to_f32_vec());
}

#[test]
fn bytes_that_are_not_whole_elements_are_refused() {
    assert!(Tensor::from_le_bytes(DType::F32, &[1], &[0, 0, 0x80]).is_err());
    assert!(Tensor::from_le_bytes(DType::BF16, &[2], &[0, 0, 0x80]).is_err());
}
