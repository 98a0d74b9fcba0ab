//! GGUF reader tests: files written by `gguf::write::GgufWriter` (v2 and v3, every metadata
//! value type, tensors of every supported type built from known quantisation codes, with the
//! expected values computed here from those codes), error cases, truncation and corruption,
//! and optionally a real model file named by `$AMK_TEST_GGUF`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use amk_core::ir::DType;
use amk_core::sim::SplitMix;
use amk_model_llama::gguf::write::GgufWriter;
use amk_model_llama::{GgmlType, GgufFile, GgufValue, ModelError, ValueType, unpermute_qk};
use half::{bf16, f16};
use rstest::rstest;

fn rng_u8(r: &mut SplitMix, n: u64) -> u8 {
    (r.next() % n) as u8
}

/// A representable f16 scale, returned with its bits.
fn scale(r: &mut SplitMix) -> (f32, [u8; 2]) {
    let x = f16::from_f32(0.001 + (r.next() % 1000) as f32 / 4096.0);
    (x.to_f32(), x.to_le_bytes())
}

/// `(bytes, expected values)` for `n` elements of a quantised type.
fn quantised(ty: GgmlType, n: usize, r: &mut SplitMix) -> (Vec<u8>, Vec<f32>) {
    let mut bytes = Vec::new();
    let mut want = Vec::new();
    match ty {
        GgmlType::Q8_0 => {
            for _ in 0..n / 32 {
                let (d, db) = scale(r);
                bytes.extend_from_slice(&db);
                for _ in 0..32 {
                    let q = r.next() as u8 as i8;
                    bytes.push(q as u8);
                    want.push(d * q as f32);
                }
            }
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            for _ in 0..n / 32 {
                let (d, db) = scale(r);
                let (m, mb) = scale(r);
                let m = -m;
                bytes.extend_from_slice(&db);
                if ty == GgmlType::Q4_1 {
                    bytes.extend_from_slice(&f16::from_f32(m).to_le_bytes());
                }
                let q: Vec<u8> = (0..32).map(|_| rng_u8(r, 16)).collect();
                let _ = mb;
                for k in 0..16 {
                    bytes.push(q[k] | (q[k + 16] << 4));
                }
                for &qe in &q {
                    want.push(if ty == GgmlType::Q4_0 {
                        d * (qe as f32 - 8.0)
                    } else {
                        d * qe as f32 + m
                    });
                }
            }
        }
        GgmlType::Q4_K => {
            for _ in 0..n / 256 {
                let (d, db) = scale(r);
                let (dmin, dminb) = scale(r);
                let sc: Vec<u8> = (0..8).map(|_| rng_u8(r, 64)).collect();
                let mn: Vec<u8> = (0..8).map(|_| rng_u8(r, 64)).collect();
                let q: Vec<u8> = (0..256).map(|_| rng_u8(r, 16)).collect();
                bytes.extend_from_slice(&db);
                bytes.extend_from_slice(&dminb);
                let mut scales = [0u8; 12];
                for j in 0..4 {
                    scales[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
                    scales[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
                    scales[j + 8] = (sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4);
                }
                bytes.extend_from_slice(&scales);
                let mut qs = [0u8; 128];
                for (e, &qe) in q.iter().enumerate() {
                    let (sub, g, l) = (e / 32, e / 64, e % 32);
                    qs[32 * g + l] |= if sub % 2 == 0 { qe } else { qe << 4 };
                }
                bytes.extend_from_slice(&qs);
                for (e, &qe) in q.iter().enumerate() {
                    let sub = e / 32;
                    want.push(d * sc[sub] as f32 * qe as f32 - dmin * mn[sub] as f32);
                }
            }
        }
        GgmlType::Q6_K => {
            for _ in 0..n / 256 {
                let (d, db) = scale(r);
                let sc: Vec<i8> = (0..16).map(|_| r.next() as u8 as i8).collect();
                let c: Vec<u8> = (0..256).map(|_| rng_u8(r, 64)).collect();
                let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
                for (e, &ce) in c.iter().enumerate() {
                    let (n, rr) = (e / 128, e % 128);
                    let (quarter, l) = (rr / 32, rr % 32);
                    let lo = ce & 0xF;
                    let hi = ce >> 4;
                    let qli = 64 * n + l + if quarter % 2 == 1 { 32 } else { 0 };
                    ql[qli] |= if quarter < 2 { lo } else { lo << 4 };
                    qh[32 * n + l] |= hi << (2 * quarter);
                    let si = 8 * n + l / 16 + 2 * quarter;
                    want.push(d * sc[si] as f32 * (ce as i32 - 32) as f32);
                }
                bytes.extend_from_slice(&ql);
                bytes.extend_from_slice(&qh);
                bytes.extend(sc.iter().map(|&s| s as u8));
                bytes.extend_from_slice(&db);
            }
        }
        _ => panic!("no test encoder for {ty}"),
    }
    (bytes, want)
}

fn every_value() -> Vec<(&'static str, GgufValue)> {
    vec![
        ("t.u8", GgufValue::U8(200)),
        ("t.i8", GgufValue::I8(-100)),
        ("t.u16", GgufValue::U16(60000)),
        ("t.i16", GgufValue::I16(-30000)),
        ("t.u32", GgufValue::U32(4_000_000_000)),
        ("t.i32", GgufValue::I32(-2_000_000_000)),
        ("t.f32", GgufValue::F32(1.5e-5)),
        ("t.bool", GgufValue::Bool(true)),
        ("t.bool_false", GgufValue::Bool(false)),
        ("t.string", GgufValue::String("héllo ▁world".into())),
        ("t.empty_string", GgufValue::String(String::new())),
        ("t.u64", GgufValue::U64(u64::MAX)),
        ("t.i64", GgufValue::I64(i64::MIN)),
        ("t.f64", GgufValue::F64(-2.25e100)),
        (
            "t.strings",
            GgufValue::Array(
                ValueType::String,
                ["<s>", "</s>", "▁the", "", "Ġa"]
                    .iter()
                    .map(|s| GgufValue::String(s.to_string()))
                    .collect(),
            ),
        ),
        (
            "t.f32s",
            GgufValue::Array(
                ValueType::F32,
                vec![GgufValue::F32(-1.0), GgufValue::F32(0.5)],
            ),
        ),
        (
            "t.i32s",
            GgufValue::Array(ValueType::I32, vec![GgufValue::I32(1), GgufValue::I32(-3)]),
        ),
        ("t.empty", GgufValue::Array(ValueType::U8, vec![])),
        (
            "t.nested",
            GgufValue::Array(
                ValueType::Array,
                vec![
                    GgufValue::Array(ValueType::U16, vec![GgufValue::U16(1), GgufValue::U16(2)]),
                    GgufValue::Array(ValueType::String, vec![GgufValue::String("x".into())]),
                    GgufValue::Array(
                        ValueType::Array,
                        vec![GgufValue::Array(
                            ValueType::Bool,
                            vec![GgufValue::Bool(true)],
                        )],
                    ),
                ],
            ),
        ),
    ]
}

struct Fixture {
    bytes: Vec<u8>,
    /// name, row-major shape, expected values.
    tensors: Vec<(String, Vec<u64>, Vec<f32>)>,
}

fn fixture(version: u32, alignment: Option<u32>) -> Fixture {
    let mut r = SplitMix(version as u64 * 1000 + alignment.unwrap_or(0) as u64);
    let mut w = GgufWriter::new(version);
    w.kv("general.architecture", GgufValue::String("llama".into()));
    if let Some(a) = alignment {
        w.kv("general.alignment", GgufValue::U32(a));
    }
    for (k, v) in every_value() {
        w.kv(k, v);
    }
    let mut tensors = Vec::new();
    // F32 / F16 / BF16 with exactly representable values.
    let f32v: Vec<f32> = (0..15).map(|i| i as f32 * 0.37 - 2.0).collect();
    w.tensor_f32("f32", &[3, 5], &f32v);
    tensors.push(("f32".to_string(), vec![3, 5], f32v));
    let f16v: Vec<f32> = (0..6).map(|i| i as f32 * 0.25 - 1.0).collect();
    w.tensor(
        "f16",
        &[2, 3],
        GgmlType::F16,
        f16v.iter()
            .flat_map(|&x| f16::from_f32(x).to_le_bytes())
            .collect(),
    );
    tensors.push(("f16".to_string(), vec![2, 3], f16v));
    let bf16v: Vec<f32> = (0..7)
        .map(|i| (i as f32 - 3.0) * 0.5 * (1u32 << (3 * i)) as f32)
        .collect();
    w.tensor(
        "bf16",
        &[7],
        GgmlType::BF16,
        bf16v
            .iter()
            .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
            .collect(),
    );
    tensors.push(("bf16".to_string(), vec![7], bf16v));
    for (name, ty, shape) in [
        ("q8_0", GgmlType::Q8_0, vec![3u64, 64]),
        ("q4_0", GgmlType::Q4_0, vec![2, 2, 32]),
        ("q4_1", GgmlType::Q4_1, vec![5, 96]),
        ("q4_k", GgmlType::Q4_K, vec![3, 256]),
        ("q6_k", GgmlType::Q6_K, vec![2, 512]),
    ] {
        let n = shape.iter().product::<u64>() as usize;
        let (bytes, want) = quantised(ty, n, &mut r);
        w.tensor(name, &shape, ty, bytes);
        tensors.push((name.to_string(), shape, want));
    }
    // Types with a known layout that we do not decode, and an unknown type.
    w.tensor("q5_0", &[32], GgmlType::Q5_0, vec![0; 22]);
    w.tensor("mystery", &[4], GgmlType(99), vec![]);
    Fixture {
        bytes: w.to_bytes(),
        tensors,
    }
}

#[rstest]
fn round_trip(
    #[values(2, 3)] version: u32,
    #[values(None, Some(8), Some(64))] alignment: Option<u32>,
) {
    let fx = fixture(version, alignment);
    let g = GgufFile::parse(fx.bytes.clone()).unwrap();
    assert_eq!(g.version(), version);
    assert_eq!(g.alignment(), alignment.unwrap_or(32) as u64);
    assert_eq!(g.data_start() as u64 % g.alignment(), 0);
    assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
    for (k, v) in every_value() {
        assert_eq!(g.get(k), Some(&v), "{k}");
    }
    // Metadata order is file order.
    let keys: Vec<&str> = g.metadata().iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys[0], "general.architecture");
    // Accessors.
    assert_eq!(g.get_u32("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(g.get_u32("t.u8").unwrap(), 200);
    assert_eq!(g.get_u64("t.u64").unwrap(), u64::MAX);
    assert_eq!(g.get_i64("t.i64").unwrap(), i64::MIN);
    assert_eq!(g.get_f32("t.f32").unwrap(), 1.5e-5);
    assert!(g.get_bool("t.bool").unwrap());
    assert_eq!(
        g.get_str_array("t.strings").unwrap(),
        vec!["<s>", "</s>", "▁the", "", "Ġa"]
    );
    assert_eq!(g.get_f32_array("t.f32s").unwrap(), vec![-1.0, 0.5]);
    assert_eq!(g.get_i64_array("t.i32s").unwrap(), vec![1, -3]);
    assert_eq!(g.get_array_len("t.empty").unwrap(), (ValueType::U8, 0));
    assert!(matches!(
        g.get_u32("t.i32"),
        Err(ModelError::KeyType { .. })
    ));
    assert!(matches!(
        g.get_u32("t.string"),
        Err(ModelError::KeyType { .. })
    ));
    assert!(matches!(
        g.get_str("t.u32"),
        Err(ModelError::KeyType { .. })
    ));
    assert!(matches!(
        g.get_str_array("t.f32s"),
        Err(ModelError::KeyType { .. })
    ));
    assert!(matches!(g.get_u32("nope"), Err(ModelError::MissingKey(k)) if k == "nope"));
    let e = g.get_u32("t.string").unwrap_err().to_string();
    assert!(e.contains("t.string") && e.contains("string"), "{e}");

    // Tensors.
    let names = g.tensor_names();
    assert_eq!(names.len(), fx.tensors.len() + 2);
    for (name, shape, want) in &fx.tensors {
        assert!(names.contains(&name.as_str()));
        let info = g.tensor_info(name).unwrap();
        assert_eq!(&info.shape, shape, "{name}");
        let t = g.tensor(name).unwrap();
        assert_eq!(t.dtype(), DType::F32);
        assert_eq!(t.shape(), &shape[..], "{name}");
        let got = t.as_f32().unwrap();
        assert_eq!(got.len(), want.len(), "{name}");
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{name}[{i}]: {a} vs {b}");
        }
    }
    match g.tensor("q5_0") {
        Err(ModelError::UnsupportedTensorType {
            tensor,
            type_name,
            code,
        }) => {
            assert_eq!(
                (tensor.as_str(), type_name.as_str(), code),
                ("q5_0", "Q5_0", 6)
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(g.tensor("q5_0").unwrap_err().to_string().contains("Q5_0"));
    assert!(matches!(
        g.tensor("mystery"),
        Err(ModelError::UnsupportedTensorType { code: 99, .. })
    ));
    assert!(matches!(
        g.tensor("nope"),
        Err(ModelError::MissingTensor(_))
    ));
}

#[test]
fn read_from_disk_and_io_error() {
    let dir = std::env::temp_dir().join(format!("amk-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("x.gguf");
    std::fs::write(&p, fixture(3, None).bytes).unwrap();
    let g = GgufFile::read(&p).unwrap();
    assert_eq!(g.tensor("f32").unwrap().shape(), &[3, 5]);
    let e = GgufFile::read(dir.join("missing.gguf")).unwrap_err();
    assert!(matches!(e, ModelError::Io { .. }));
    assert!(e.to_string().contains("missing.gguf"));
    std::fs::remove_dir_all(&dir).unwrap();
}

fn header(version: u32, n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&n_tensors.to_le_bytes());
    b.extend_from_slice(&n_kv.to_le_bytes());
    b
}

fn err(bytes: Vec<u8>) -> ModelError {
    GgufFile::parse(bytes).unwrap_err()
}

#[test]
fn empty_file_is_fine() {
    let g = GgufFile::parse(header(3, 0, 0)).unwrap();
    assert!(g.tensor_names().is_empty());
    assert!(g.metadata().is_empty());
}

#[test]
fn bad_headers() {
    assert!(matches!(
        err(b"GGML\x03\0\0\0".to_vec()),
        ModelError::BadMagic { .. }
    ));
    assert!(matches!(err(vec![]), ModelError::BadMagic { .. }));
    assert!(matches!(err(b"GG".to_vec()), ModelError::BadMagic { .. }));
    for v in [0, 1, 4, 0x0300_0000] {
        assert!(matches!(err(header(v, 0, 0)), ModelError::UnsupportedVersion(x) if x == v));
    }
    assert!(err(header(1, 0, 0)).to_string().contains("version 1"));
    assert!(matches!(
        err(b"GGUF\x03\0".to_vec()),
        ModelError::Truncated { .. }
    ));
    // Absurd counts.
    assert!(matches!(
        err(header(3, u64::MAX, 0)),
        ModelError::Corrupt(_)
    ));
    assert!(matches!(
        err(header(3, 0, u64::MAX)),
        ModelError::Corrupt(_)
    ));
    assert!(matches!(
        err(header(2, 1 << 40, 1 << 40)),
        ModelError::Corrupt(_)
    ));
}

#[test]
fn bad_metadata() {
    // Key string length beyond the file.
    let mut b = header(3, 0, 1);
    b.extend_from_slice(&1_000_000u64.to_le_bytes());
    b.extend_from_slice(b"abcdefghijklmnopqrstuvwxyz");
    let e = err(b);
    assert!(matches!(e, ModelError::Truncated { .. }), "{e}");
    assert!(e.to_string().contains("truncated"));
    // String value length u64::MAX.
    let mut b = header(3, 0, 1);
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(b'k');
    b.extend_from_slice(&8u32.to_le_bytes());
    b.extend_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(err(b), ModelError::Truncated { .. }));
    // Unknown value type.
    let mut b = header(3, 0, 1);
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(b'k');
    b.extend_from_slice(&13u32.to_le_bytes());
    b.extend_from_slice(&[0; 16]);
    assert!(matches!(err(b), ModelError::Corrupt(m) if m.contains("value type 13")));
    // Absurd array count.
    let mut b = header(3, 0, 1);
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(b'k');
    b.extend_from_slice(&9u32.to_le_bytes());
    b.extend_from_slice(&8u32.to_le_bytes());
    b.extend_from_slice(&(u64::MAX / 2).to_le_bytes());
    b.extend_from_slice(&[0; 64]);
    assert!(matches!(err(b), ModelError::Corrupt(m) if m.contains("absurd")));
    // Invalid UTF-8, bad bool.
    let mut b = header(3, 0, 1);
    b.extend_from_slice(&2u64.to_le_bytes());
    b.extend_from_slice(&[0xC3, 0x28]);
    b.extend_from_slice(&0u32.to_le_bytes());
    b.push(0);
    assert!(matches!(err(b), ModelError::Corrupt(m) if m.contains("UTF-8")));
    let mut w = GgufWriter::new(3);
    w.kv("b", GgufValue::Bool(true));
    let mut b = w.to_bytes();
    // magic, version, counts (24) + key length and "b" (9) + value type (4).
    assert_eq!(b[37], 1);
    b[37] = 7;
    assert!(matches!(err(b), ModelError::Corrupt(m) if m.contains("bool")));
    // Deep nesting.
    let mut v = GgufValue::U8(1);
    for _ in 0..40 {
        v = GgufValue::Array(v.value_type(), vec![v]);
    }
    let mut w = GgufWriter::new(3);
    w.kv("deep", v);
    assert!(matches!(err(w.to_bytes()), ModelError::Corrupt(m) if m.contains("nested")));
    // Duplicate key.
    let mut w = GgufWriter::new(2);
    w.kv("a", GgufValue::U8(1)).kv("a", GgufValue::U8(2));
    assert!(matches!(err(w.to_bytes()), ModelError::Corrupt(m) if m.contains("duplicate")));
    // Alignment.
    for (a, ok) in [
        (GgufValue::U32(0), false),
        (GgufValue::U32(3), false),
        (GgufValue::U64(32), false),
        (GgufValue::U32(16), true),
    ] {
        let mut w = GgufWriter::new(3);
        w.kv("general.alignment", a);
        assert_eq!(GgufFile::parse(w.to_bytes()).is_ok(), ok);
    }
}

/// The byte position of the offset field of the (only) tensor named `name`.
fn offset_field(bytes: &[u8], name: &str, n_dims: usize) -> usize {
    let mut pat = (name.len() as u64).to_le_bytes().to_vec();
    pat.extend_from_slice(name.as_bytes());
    let at = bytes.windows(pat.len()).position(|w| w == pat).unwrap();
    at + pat.len() + 4 + 8 * n_dims + 4
}

#[test]
fn bad_tensor_infos() {
    let one = |f: &dyn Fn(&mut GgufWriter)| {
        let mut w = GgufWriter::new(3);
        f(&mut w);
        w.to_bytes()
    };
    // Offset beyond the file.
    let mut b = one(&|w| {
        w.tensor_f32("w", &[2, 4], &[0.0; 8]);
    });
    let at = offset_field(&b, "w", 2);
    b[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(matches!(err(b.clone()), ModelError::Truncated { what, .. } if what.contains("'w'")));
    b[at..at + 8].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
    assert!(matches!(err(b.clone()), ModelError::Truncated { .. }));
    // Misaligned offset.
    b[at..at + 8].copy_from_slice(&4u64.to_le_bytes());
    assert!(matches!(err(b), ModelError::Corrupt(m) if m.contains("alignment")));
    // Dims whose product overflows.
    let mut b = one(&|w| {
        w.tensor("w", &[1 << 40, 1 << 40], GgmlType::F32, vec![]);
    });
    assert!(matches!(err(b.clone()), ModelError::Corrupt(m) if m.contains("overflow")));
    // Too many dims.
    let at = offset_field(&b, "w", 2) - 4 - 16 - 4;
    b[at..at + 4].copy_from_slice(&5u32.to_le_bytes());
    assert!(matches!(err(b), ModelError::Corrupt(_)));
    // Row length not a multiple of the block size.
    let b = one(&|w| {
        w.tensor("w", &[2, 16], GgmlType::Q8_0, vec![0; 34]);
    });
    assert!(matches!(err(b), ModelError::Corrupt(m) if m.contains("block size 32")));
    // Data shorter than the shape needs.
    let b = one(&|w| {
        w.tensor("w", &[2, 32], GgmlType::Q4_0, vec![0; 18]);
    });
    assert!(matches!(err(b), ModelError::Truncated { .. }));
    // Duplicate tensor names.
    let b = one(&|w| {
        w.tensor_f32("w", &[1], &[1.0])
            .tensor_f32("w", &[1], &[2.0]);
    });
    assert!(matches!(err(b), ModelError::Corrupt(m) if m.contains("duplicate")));
}

#[rstest]
fn truncation_never_panics(#[values(2, 3)] version: u32) {
    let full = fixture(version, None).bytes;
    assert!(GgufFile::parse(full.clone()).is_ok());
    let cuts = (0..full.len())
        .step_by(97)
        .chain(0..300.min(full.len()))
        .chain(full.len() - 40..full.len());
    for cut in cuts {
        match GgufFile::parse(full[..cut].to_vec()) {
            Ok(_) => panic!("a file cut at {cut} of {} bytes parsed", full.len()),
            Err(e) => {
                let msg = e.to_string();
                assert!(!msg.is_empty());
                assert!(
                    matches!(
                        e,
                        ModelError::Truncated { .. }
                            | ModelError::BadMagic { .. }
                            | ModelError::Corrupt(_)
                    ),
                    "cut {cut}: {e}"
                );
            }
        }
    }
}

#[rstest]
fn corruption_never_panics(#[values(2, 3)] version: u32) {
    let full = fixture(version, Some(16)).bytes;
    let mut r = SplitMix(0xC0FFEE + version as u64);
    let (mut ok, mut bad) = (0, 0);
    for round in 0..3000 {
        let mut b = full.clone();
        let flips = 1 + r.next() % 4;
        for _ in 0..flips {
            // Bias towards the header, where structure lives.
            let limit = if round % 2 == 0 {
                1200.min(b.len())
            } else {
                b.len()
            };
            let i = (r.next() % limit as u64) as usize;
            b[i] = match r.next() % 4 {
                0 => 0xFF,
                1 => 0,
                _ => r.next() as u8,
            };
        }
        match GgufFile::parse(b) {
            Ok(g) => {
                ok += 1;
                for name in g.tensor_names() {
                    let _ = g.tensor(name);
                }
                for (k, _) in g.metadata() {
                    let _ = g.get_u32(k);
                    let _ = g.get_str_array(k);
                    let _ = g.get_f32_array(k);
                }
            }
            Err(e) => {
                bad += 1;
                assert!(!e.to_string().is_empty());
            }
        }
    }
    assert!(ok > 0 && bad > 0, "ok {ok}, bad {bad}");
}

#[test]
fn unpermute_of_a_gguf_tensor() {
    // A q_proj written permuted (as the converter does) comes back in HF order.
    let (heads, hd, k) = (2usize, 4usize, 3usize);
    let hf: Vec<f32> = (0..heads * hd * k).map(|i| i as f32).collect();
    let mut gguf = vec![0f32; hf.len()];
    for h in 0..heads {
        for i in 0..hd / 2 {
            for j in 0..2 {
                let (dst, src) = (h * hd + 2 * i + j, h * hd + j * hd / 2 + i);
                gguf[dst * k..dst * k + k].copy_from_slice(&hf[src * k..src * k + k]);
            }
        }
    }
    let mut w = GgufWriter::new(3);
    w.tensor_f32(
        "blk.0.attn_q.weight",
        &[(heads * hd) as u64, k as u64],
        &gguf,
    );
    let g = GgufFile::parse(w.to_bytes()).unwrap();
    let t = unpermute_qk(&g.tensor("blk.0.attn_q.weight").unwrap(), heads).unwrap();
    assert_eq!(t.as_f32().unwrap(), &hf[..]);
}

/// A real model file, when `$AMK_TEST_GGUF` names one.
#[test]
fn real_gguf_file() {
    let Ok(path) = std::env::var("AMK_TEST_GGUF") else {
        println!("note: AMK_TEST_GGUF is not set; skipping the real-file test");
        return;
    };
    let g = GgufFile::read(&path).unwrap();
    assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
    let infos = g.tensor_infos();
    println!(
        "{path}: GGUF v{}, {} tensors, {} metadata keys",
        g.version(),
        infos.len(),
        g.metadata().len()
    );
    let mut by_type = std::collections::BTreeMap::<String, usize>::new();
    for t in infos {
        *by_type.entry(t.ggml_type.name().to_string()).or_default() += 1;
    }
    println!("tensor types: {by_type:?}");
    for t in infos
        .iter()
        .filter(|t| !t.name.starts_with("blk.") || t.name.starts_with("blk.0."))
    {
        println!("  {} {:?} {}", t.name, t.shape, t.ggml_type.name());
    }
    for (k, v) in g.metadata() {
        match v {
            GgufValue::Array(t, items) => {
                println!("  {k}: array of {} x {}", items.len(), t.name())
            }
            v => println!("  {k}: {v:?}"),
        }
    }
    let emb = g.tensor("token_embd.weight").unwrap();
    let v = emb.as_f32().unwrap();
    assert!(v.iter().all(|x| x.is_finite()));
    println!(
        "token_embd.weight: shape {:?}, first values {:?}",
        emb.shape(),
        &v[..4.min(v.len())]
    );
    let vocab = g.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(vocab.len() as u64, emb.shape()[0]);
    for name in g.tensor_names() {
        let info = g.tensor_info(name).unwrap();
        if info.ggml_type.is_supported() {
            g.tensor(name).unwrap();
        }
    }
}

/// Metadata memory stays in proportion to the file: an array of scalars costs its bytes (a
/// 20 MB array of u8 takes 20 MB), and an array of strings, 32 bytes an element against at
/// least 8 in the file, is refused past the budget before anything is allocated for it.
#[test]
fn metadata_arrays_are_bounded_in_memory() {
    let file = |elem: u32, n: u64, elem_bytes: &[u8]| {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes()); // version
        b.extend(0u64.to_le_bytes()); // tensors
        b.extend(1u64.to_le_bytes()); // metadata keys
        b.extend(3u64.to_le_bytes());
        b.extend(b"big");
        b.extend(9u32.to_le_bytes()); // array
        b.extend(elem.to_le_bytes());
        b.extend(n.to_le_bytes());
        for _ in 0..n {
            b.extend_from_slice(elem_bytes);
        }
        b
    };
    let g = GgufFile::parse(file(0, 20 << 20, &[7])).unwrap();
    assert_eq!(g.get_array_len("big").unwrap(), (ValueType::U8, 20 << 20));
    match g.get("big") {
        Some(GgufValue::Scalars(a)) => {
            assert_eq!(a.bytes().len(), 20 << 20);
            assert_eq!(a.get(5), Some(GgufValue::U8(7)));
        }
        other => panic!("{other:?}"),
    }
    // 17 M empty strings: 136 MB of file, 544 MB as values.
    let e = GgufFile::parse(file(8, 17 << 20, &0u64.to_le_bytes())).unwrap_err();
    assert!(
        matches!(&e, ModelError::Corrupt(m) if m.contains("memory")),
        "{e}"
    );
}

/// Arrays of scalars read back as the `Array` values they were written from, element for
/// element, and write back byte for byte; a bool byte other than 0 or 1 is refused.
#[test]
fn scalar_arrays_equal_their_values_and_round_trip() {
    let values = GgufValue::Array(
        ValueType::I16,
        vec![GgufValue::I16(-2), GgufValue::I16(300)],
    );
    let mut w = GgufWriter::new(3);
    w.kv("a", values.clone());
    let bytes = w.to_bytes();
    let g = GgufFile::parse(bytes.clone()).unwrap();
    let read = g.get("a").unwrap();
    assert!(matches!(read, GgufValue::Scalars(_)), "{read:?}");
    assert_eq!(read, &values);
    assert_eq!(&values, read);
    let mut again = GgufWriter::new(3);
    again.kv("a", read.clone());
    assert_eq!(again.to_bytes(), bytes);
    assert_ne!(
        read,
        &GgufValue::Array(ValueType::I16, vec![GgufValue::I16(-2)])
    );
    // Every scalar type decodes as written; floats compare as numbers, as Array values do.
    let every = [
        GgufValue::Array(ValueType::U8, vec![GgufValue::U8(0), GgufValue::U8(255)]),
        GgufValue::Array(ValueType::I8, vec![GgufValue::I8(-128), GgufValue::I8(7)]),
        GgufValue::Array(
            ValueType::U64,
            vec![GgufValue::U64(u64::MAX), GgufValue::U64(1)],
        ),
        GgufValue::Array(
            ValueType::I64,
            vec![GgufValue::I64(i64::MIN), GgufValue::I64(-1)],
        ),
        GgufValue::Array(
            ValueType::F64,
            vec![GgufValue::F64(-0.5), GgufValue::F64(1e300)],
        ),
        GgufValue::Array(
            ValueType::Bool,
            vec![GgufValue::Bool(true), GgufValue::Bool(false)],
        ),
        GgufValue::Array(
            ValueType::F32,
            vec![GgufValue::F32(-0.0), GgufValue::F32(f32::NAN)],
        ),
    ];
    let mut w = GgufWriter::new(3);
    for (i, v) in every.iter().enumerate() {
        w.kv(format!("k{i}"), v.clone());
    }
    let g = GgufFile::parse(w.to_bytes()).unwrap();
    for (i, v) in every.iter().enumerate() {
        let read = g.get(&format!("k{i}")).unwrap();
        let GgufValue::Scalars(a) = read else {
            panic!("{read:?}")
        };
        let GgufValue::Array(_, items) = v else {
            unreachable!()
        };
        for (j, item) in items.iter().enumerate() {
            let got = a.get(j).unwrap();
            let same = got == *item
                || (got.as_f64().is_some_and(f64::is_nan)
                    && item.as_f64().is_some_and(f64::is_nan));
            assert!(same, "k{i}[{j}]: {got:?} vs {item:?}");
        }
        assert_eq!(a.get(items.len()), None);
        assert_eq!(a.get(usize::MAX), None);
    }
    // NaN is unequal to itself, in either form; -0 equals 0.
    assert_ne!(g.get("k6").unwrap(), g.get("k6").unwrap());
    let zero = GgufValue::Array(ValueType::F32, vec![GgufValue::F32(0.0)]);
    let mut w = GgufWriter::new(3);
    w.kv(
        "z",
        GgufValue::Array(ValueType::F32, vec![GgufValue::F32(-0.0)]),
    );
    assert_eq!(
        GgufFile::parse(w.to_bytes()).unwrap().get("z").unwrap(),
        &zero
    );
    assert!(amk_model_llama::ScalarArray::new(ValueType::Bool, vec![0, 2]).is_err());
    assert!(amk_model_llama::ScalarArray::new(ValueType::U32, vec![0, 0, 0]).is_err());
    assert!(amk_model_llama::ScalarArray::new(ValueType::String, vec![]).is_err());
}

/// A metadata value stays 32 bytes (the budget's per-element cost of strings and nested
/// arrays): the packed scalars live behind a box.
#[cfg(target_pointer_width = "64")]
#[test]
fn a_metadata_value_is_32_bytes() {
    assert_eq!(std::mem::size_of::<GgufValue>(), 32);
}
