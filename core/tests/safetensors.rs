//! `amk run --weights`' safetensors reader (`WeightStore::from_safetensors_bytes`) refuses what
//! the model importer's refuses — both go through `amk_core::safetensors::parse_header` —
//! instead of copying aliased ranges or ignoring trailing bytes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::{DType, Tensor, WeightStore};

/// A safetensors file: `header` JSON (padded to 8 bytes), then `data`.
fn file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut h = header.to_string();
    while !(8 + h.len()).is_multiple_of(8) {
        h.push(' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    out
}

#[test]
fn a_written_store_reads_back() {
    let mut w = WeightStore::new();
    w.insert(
        "a",
        Tensor::from_f32(DType::F32, &[2, 3], &[1., 2., 3., 4., 5., 6.]).unwrap(),
    );
    w.insert("b", Tensor::from_i64(DType::I32, &[2], &[7, -8]).unwrap());
    let r = WeightStore::from_safetensors_bytes(&w.to_safetensors_bytes()).unwrap();
    assert_eq!(r.get("a").unwrap().to_f32_vec(), [1., 2., 3., 4., 5., 6.]);
    assert_eq!(r.get("b").unwrap().get_i64(1), -8);
}

#[test]
fn aliased_ranges_are_refused_not_copied() {
    // 20,000 names for the same 256 KiB: a reader that copied each would make 5 GB of a
    // 1.4 MB file.
    let entries: Vec<String> = (0..20_000)
        .map(|i| format!(r#""t{i}":{{"dtype":"F32","shape":[65536],"data_offsets":[0,262144]}}"#))
        .collect();
    let bytes = file(&format!("{{{}}}", entries.join(",")), &vec![0u8; 262_144]);
    let t0 = std::time::Instant::now();
    let err = WeightStore::from_safetensors_bytes(&bytes).unwrap_err();
    assert!(err.contains("overlap"), "{err}");
    assert!(t0.elapsed().as_secs() < 10);
}

#[test]
fn trailing_bytes_holes_long_headers_and_unknown_dtypes_are_refused() {
    let one = r#"{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    assert!(WeightStore::from_safetensors_bytes(&file(one, &[0u8; 8])).is_ok());
    let err = WeightStore::from_safetensors_bytes(&file(one, &[0u8; 16])).unwrap_err();
    assert!(err.contains("cover only 8"), "{err}");
    let hole = r#"{"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
    let err = WeightStore::from_safetensors_bytes(&file(hole, &[0u8; 8])).unwrap_err();
    assert!(err.contains("hole"), "{err}");
    let mut long = 200_000_000u64.to_le_bytes().to_vec();
    long.resize(200_000_016, b' ');
    let err = WeightStore::from_safetensors_bytes(&long).unwrap_err();
    assert!(err.contains("limit"), "{err}");
    let bad_dtype = r#"{"x":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}}"#;
    let err = WeightStore::from_safetensors_bytes(&file(bad_dtype, &[0u8; 8])).unwrap_err();
    assert!(err.contains("C64") && err.contains("I32"), "{err}");
}
