//! Smallest end-to-end checks: a valid tiled program validates, round-trips, and a dropped
//! wait is caught.

use amk_core::json::{Map, Value};
use amk_core::{BufferKind, DType, ErrorKind, Opcode, Program, validate};

fn params(kv: &[(&str, Value)]) -> Map {
    let mut m = Map::new();
    for (k, v) in kv {
        m.insert(*k, v.clone());
    }
    m
}

fn tiny() -> Program {
    let mut p = Program::new();
    let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::F32, &[1, 64]);
    let w = p.new_weight("w", DType::F32, &[128, 64], "w");
    let y = p.new_buffer("y", BufferKind::ACTIVATION, DType::F32, &[1, 128]);
    let z = p.new_buffer("z", BufferKind::IO_OUTPUT, DType::F32, &[1, 128]);
    let c0 = p.new_counter("y ready");
    let c1 = p.new_counter("z ready");
    for i in 0..4 {
        p.push_task(
            Opcode::GEMV_TILE,
            &[x, w],
            &[y],
            c0,
            &[],
            params(&[
                ("K", 64.into()),
                ("N_tile", 32.into()),
                ("n_off", (i * 32).into()),
            ]),
            format!("tile{i}"),
        );
    }
    p.push_task(
        Opcode::ADD,
        &[y, y],
        &[z],
        c1,
        &[(c0, 4)],
        Map::new(),
        "add",
    );
    p
}

#[test]
fn tiled_program_validates_and_round_trips() {
    let reg = amk_ops::registry().unwrap();
    assert_eq!(reg.len(), 32);
    let p = tiny();
    let r = validate(&p, &reg);
    assert!(r.ok(), "{}", r.report());
    let text = p.to_json(&reg).unwrap();
    let back = Program::from_json(&text, &reg).unwrap();
    assert_eq!(back, p);
    assert_eq!(back.to_json(&reg).unwrap(), text);
}

#[test]
fn dropped_wait_is_a_race() {
    let reg = amk_ops::registry().unwrap();
    let mut p = tiny();
    p.tasks[4].waits.clear();
    let r = validate(&p, &reg);
    assert!(r.has(ErrorKind::RawRace), "{}", r.report());
}

#[test]
fn integral_float_cost_hints_load() {
    let reg = amk_ops::registry().unwrap();
    let text = tiny().to_json(&reg).unwrap();
    let edited = text.replacen("\"est_bytes\": 0", "\"est_bytes\": 12.0", 1);
    assert_ne!(edited, text);
    let p = Program::from_json(&edited, &reg).unwrap();
    assert_eq!(p.tasks[0].est_bytes, 12);
    let half = text.replacen("\"est_bytes\": 0", "\"est_bytes\": 12.5", 1);
    let err = Program::from_json(&half, &reg).unwrap_err().to_string();
    assert!(err.contains("$.tasks[0].est_bytes"), "{err}");
}
