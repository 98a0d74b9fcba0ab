//! Program ⇄ JSON, exactly in the reference's on-disk layout, with strict typing on read.
//!
//! Reading is strict where the reference was lax (wrong JSON types, non-canonical ids,
//! non-positive dims, unknown enum names are load errors naming the JSON path) and lenient
//! where the format promises forward compatibility (unknown fields are ignored).

use crate::error::IrError;
use crate::ir::*;
use crate::json::{self, Map, Value};
use crate::registry::Registry;
use std::io::Read as _;
use std::path::Path;

/// A lazily rendered JSON path (a linked list on the stack: free unless an error is built).
#[derive(Clone, Copy)]
enum P<'a> {
    Root,
    Key(&'a P<'a>, &'a str),
    Idx(&'a P<'a>, usize),
}

impl P<'_> {
    fn render(&self) -> String {
        let mut segs = Vec::new();
        let mut cur = self;
        loop {
            match cur {
                P::Root => break,
                P::Key(parent, k) => {
                    segs.push(json::Seg::Key((*k).to_string()));
                    cur = parent;
                }
                P::Idx(parent, i) => {
                    segs.push(json::Seg::Index(*i));
                    cur = parent;
                }
            }
        }
        segs.reverse();
        json::JsonPath(segs).to_string()
    }
    fn err(&self, message: impl Into<String>) -> IrError {
        IrError::Field {
            path: self.render(),
            message: message.into(),
        }
    }
}

type R<T> = Result<T, IrError>;

fn expect_obj<'v>(v: &'v Value, p: &P) -> R<&'v Map> {
    v.as_object()
        .ok_or_else(|| p.err(format!("expected an object, found {}", v.type_name())))
}

fn expect_arr<'v>(v: &'v Value, p: &P) -> R<&'v [Value]> {
    v.as_array()
        .ok_or_else(|| p.err(format!("expected an array, found {}", v.type_name())))
}

fn req<'m>(m: &'m Map, key: &str, p: &P) -> R<&'m Value> {
    m.get(key)
        .ok_or_else(|| p.err(format!("missing required field '{key}'")))
}

fn int(v: &Value, p: &P) -> R<i64> {
    v.as_i64()
        .ok_or_else(|| p.err(format!("expected an integer, found {}", v.type_name())))
}

fn int_in(v: &Value, p: &P, lo: i64, hi: i64, what: &str) -> R<i64> {
    let i = int(v, p)?;
    if i < lo || i > hi {
        return Err(p.err(format!("{what} {i} is out of range [{lo}, {hi}]")));
    }
    Ok(i)
}

fn id(v: &Value, p: &P) -> R<u32> {
    Ok(int_in(v, p, 0, u32::MAX as i64, "id")? as u32)
}

fn real(v: &Value, p: &P) -> R<f64> {
    v.as_f64()
        .ok_or_else(|| p.err(format!("expected a number, found {}", v.type_name())))
}

fn boolean(v: &Value, p: &P) -> R<bool> {
    match v {
        Value::Bool(b) => Ok(*b),
        _ => Err(p.err(format!("expected a boolean, found {}", v.type_name()))),
    }
}

fn string(v: &Value, p: &P) -> R<String> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| p.err(format!("expected a string, found {}", v.type_name())))
}

fn opt<'m>(m: &'m Map, key: &str) -> Option<&'m Value> {
    m.get(key).filter(|v| !matches!(v, Value::Null))
}

fn enum_name<T>(v: &Value, p: &P, what: &str, parse: fn(&str) -> Option<T>, all: &str) -> R<T> {
    let s = v
        .as_str()
        .ok_or_else(|| p.err(format!("expected a {what} name, found {}", v.type_name())))?;
    parse(s).ok_or_else(|| p.err(format!("unknown {what} '{s}' (expected one of {all})")))
}

fn names<T: Copy + std::fmt::Display>(all: &[T]) -> String {
    all.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn check_version(
    m: &Map,
    key: &'static str,
    what: &'static str,
    current: &'static str,
) -> R<String> {
    let p = P::Key(&P::Root, key);
    let Some(v) = m.get(key) else {
        return Ok(current.to_string());
    };
    let s = match v {
        Value::Str(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        Value::Float(f) => {
            let mut s = String::new();
            json::write::write_float(*f, &mut s);
            s
        }
        other => {
            return Err(p.err(format!(
                "expected a version string, found {}",
                other.type_name()
            )));
        }
    };
    let major = s.split('.').next().unwrap_or("");
    let want = current.split('.').next().unwrap_or("");
    if major != want {
        return Err(IrError::Version {
            path: p.render(),
            what,
            found: s,
            supported: current,
        });
    }
    Ok(s)
}

/// Parses a program from JSON text. Opcode names resolve through `reg` (ABI names always).
pub fn from_json_str(text: &str, reg: &Registry) -> R<Program> {
    let v = json::parse(text)?;
    from_value(&v, reg)
}

/// Parses a program from raw bytes (UTF-8 JSON; a byte-order mark is refused).
pub fn from_json_bytes(bytes: &[u8], reg: &Registry) -> R<Program> {
    from_json_str(utf8_text(bytes)?, reg)
}

/// The program's text: UTF-8, without a byte-order mark.
fn utf8_text(bytes: &[u8]) -> R<&str> {
    let text = std::str::from_utf8(bytes).map_err(|e| IrError::Encoding {
        offset: e.valid_up_to(),
    })?;
    if text.starts_with('\u{feff}') {
        return Err(IrError::Field {
            path: "$".into(),
            message: "file starts with a byte-order mark; write plain UTF-8".into(),
        });
    }
    Ok(text)
}

/// The largest program [`load`] reads, as a file and once decompressed (128 MiB, some ten
/// times a 70B model's decode program); its parsed JSON values may take [`VALUE_BUDGET`] times
/// as much memory (a program's values take about five times its text). An input past either
/// is refused before the memory is taken, so a file of spaces, a gzip bomb or a file of `0,`
/// cannot exhaust memory (the CLI's `--max-program-mib` raises both).
pub const MAX_PROGRAM_BYTES: u64 = 128 << 20;

/// The parsed values' memory a program may take, as a multiple of its size limit.
pub const VALUE_BUDGET: u64 = 4;

/// Loads a program file; `*.gz` files (or any file starting with the gzip magic) are
/// decompressed transparently. Only a regular file is read (a FIFO would block, a device
/// never end), of at most [`MAX_PROGRAM_BYTES`], decompressed or not.
pub fn load(path: &Path, reg: &Registry) -> R<Program> {
    load_limited(path, reg, MAX_PROGRAM_BYTES)
}

/// [`load`] with another size limit: for the file and the decompressed text, and
/// [`VALUE_BUDGET`] times it for the parsed values.
pub fn load_limited(path: &Path, reg: &Registry, limit: u64) -> R<Program> {
    let io = |source| IrError::Io {
        path: path.to_path_buf(),
        source,
    };
    let too_large = |what| IrError::TooLarge {
        path: path.to_path_buf(),
        what,
        limit,
    };
    // `stat` first: opening a FIFO would block until a writer came.
    if !std::fs::metadata(path).map_err(io)?.is_file() {
        return Err(IrError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    let file = std::fs::File::open(path).map_err(io)?;
    let mut raw = Vec::new();
    file.take(limit.saturating_add(1))
        .read_to_end(&mut raw)
        .map_err(io)?;
    if raw.len() as u64 > limit {
        return Err(too_large("the file"));
    }
    let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(&raw[..])
            .take(limit.saturating_add(1))
            .read_to_end(&mut out)
            .map_err(|source| IrError::Gzip {
                path: path.to_path_buf(),
                source,
            })?;
        if out.len() as u64 > limit {
            return Err(too_large("the decompressed program"));
        }
        drop(raw); // the compressed bytes are not needed beside the text
        out
    } else if path.extension().is_some_and(|e| e == "gz") {
        return Err(IrError::Gzip {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, "missing gzip header"),
        });
    } else {
        raw
    };
    let text = utf8_text(&bytes)?;
    from_value(
        &json::parse_limited(text, limit.saturating_mul(VALUE_BUDGET))?,
        reg,
    )
}

/// Writes a program (pretty JSON, no trailing newline; gzip when the name ends in `.gz`).
pub fn save(p: &Program, path: &Path, reg: &Registry) -> R<()> {
    let text = to_json_string(p, reg)?;
    let io = |source| IrError::Io {
        path: path.to_path_buf(),
        source,
    };
    if path.extension().is_some_and(|e| e == "gz") {
        use std::io::Write as _;
        let f = std::fs::File::create(path).map_err(io)?;
        let mut gz = flate2::write::GzEncoder::new(f, flate2::Compression::default());
        gz.write_all(text.as_bytes()).map_err(io)?;
        gz.finish().map_err(io)?;
        Ok(())
    } else {
        std::fs::write(path, text).map_err(io)
    }
}

/// Decodes an already parsed JSON document.
pub fn from_value(v: &Value, reg: &Registry) -> R<Program> {
    let root = P::Root;
    let m = expect_obj(v, &root)?;
    let ir_version = check_version(m, "ir_version", "IR", IR_VERSION)?;
    let abi_version = check_version(m, "abi_version", "ABI", ABI_VERSION)?;
    let meta = match m.get("meta") {
        None | Some(Value::Null) => Map::new(),
        Some(v) => expect_obj(v, &P::Key(&root, "meta"))?.clone(),
    };
    let target = match opt(m, "target") {
        None => None,
        Some(v) => Some(target_from(v, &P::Key(&root, "target"))?),
    };
    let list = |key: &'static str| -> R<&[Value]> {
        match opt(m, key) {
            None => Ok(&[]),
            Some(v) => expect_arr(v, &P::Key(&root, key)),
        }
    };
    let pb = P::Key(&root, "buffers");
    let buffers = list("buffers")?
        .iter()
        .enumerate()
        .map(|(i, v)| buffer_from(v, &P::Idx(&pb, i), i))
        .collect::<R<Vec<_>>>()?;
    let pc = P::Key(&root, "counters");
    let counters = list("counters")?
        .iter()
        .enumerate()
        .map(|(i, v)| counter_from(v, &P::Idx(&pc, i), i))
        .collect::<R<Vec<_>>>()?;
    let pt = P::Key(&root, "tasks");
    let tasks = list("tasks")?
        .iter()
        .enumerate()
        .map(|(i, v)| task_from(v, &P::Idx(&pt, i), i, reg))
        .collect::<R<Vec<_>>>()?;
    let pages = match opt(m, "pages") {
        None => None,
        Some(v) => Some(pages_from(v, &P::Key(&root, "pages"))?),
    };
    let config = match opt(m, "config") {
        None => None,
        Some(v) => Some(config_from(v, &P::Key(&root, "config"))?),
    };
    let step_loop = match opt(m, "step_loop") {
        None => None,
        Some(v) => Some(step_loop_from(v, &P::Key(&root, "step_loop"))?),
    };
    Ok(Program {
        meta,
        target,
        buffers,
        counters,
        tasks,
        pages,
        config,
        ir_version,
        abi_version,
        step_loop,
    })
}

/// `{"gate": counter id, "halt": buffer id}` (ids are checked by the validator, like every
/// other reference).
fn step_loop_from(v: &Value, p: &P) -> R<StepLoop> {
    let m = expect_obj(v, p)?;
    Ok(StepLoop {
        gate: id(req(m, "gate", p)?, &P::Key(p, "gate"))?,
        halt: id(req(m, "halt", p)?, &P::Key(p, "halt"))?,
    })
}

fn canonical(m: &Map, p: &P, index: usize, what: &str) -> R<u32> {
    let id_v = req(m, "id", p)?;
    let pid = P::Key(p, "id");
    let got = id(id_v, &pid)?;
    if got as usize != index {
        return Err(pid.err(format!(
            "{what} ids must equal their list position: found {got} at position {index}"
        )));
    }
    Ok(got)
}

fn buffer_from(v: &Value, p: &P, index: usize) -> R<Buffer> {
    let m = expect_obj(v, p)?;
    let id = canonical(m, p, index, "buffer")?;
    let name = string(req(m, "name", p)?, &P::Key(p, "name"))?;
    let kind = enum_name(
        req(m, "kind", p)?,
        &P::Key(p, "kind"),
        "buffer kind",
        BufferKind::from_name,
        &names(BufferKind::ALL),
    )?;
    let dtype = enum_name(
        req(m, "dtype", p)?,
        &P::Key(p, "dtype"),
        "dtype",
        DType::from_name,
        &names(DType::ALL),
    )?;
    let ps = P::Key(p, "shape");
    let shape = expect_arr(req(m, "shape", p)?, &ps)?
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let pd = P::Idx(&ps, i);
            let d = int(d, &pd)?;
            if d <= 0 {
                return Err(pd.err(format!("shape dims must be positive, found {d}")));
            }
            Ok(d as u64)
        })
        .collect::<R<Vec<_>>>()?;
    let space = enum_name(
        req(m, "space", p)?,
        &P::Key(p, "space"),
        "memory space",
        MemSpace::from_name,
        &names(MemSpace::ALL),
    )?;
    let source = match opt(m, "source") {
        None => None,
        Some(v) => Some(string(v, &P::Key(p, "source"))?),
    };
    Ok(Buffer {
        id,
        name,
        kind,
        dtype,
        shape,
        space,
        source,
    })
}

fn counter_from(v: &Value, p: &P, index: usize) -> R<Counter> {
    let m = expect_obj(v, p)?;
    let id = canonical(m, p, index, "counter")?;
    let init = match opt(m, "init") {
        None => 0,
        Some(v) => int(v, &P::Key(p, "init"))?,
    };
    let note = match opt(m, "note") {
        None => String::new(),
        Some(v) => string(v, &P::Key(p, "note"))?,
    };
    Ok(Counter { id, init, note })
}

fn id_list(v: &Value, p: &P) -> R<Vec<u32>> {
    expect_arr(v, p)?
        .iter()
        .enumerate()
        .map(|(i, x)| id(x, &P::Idx(p, i)))
        .collect()
}

fn task_from(v: &Value, p: &P, index: usize, reg: &Registry) -> R<Task> {
    let m = expect_obj(v, p)?;
    let own_id = canonical(m, p, index, "task")?;
    let pop = P::Key(p, "op");
    let op_v = req(m, "op", p)?;
    let op_name = op_v.as_str().ok_or_else(|| {
        pop.err(format!(
            "expected an opcode name, found {}",
            op_v.type_name()
        ))
    })?;
    let op = reg.resolve_name(op_name).ok_or_else(|| {
        pop.err(format!(
            "unknown opcode '{op_name}' (not an ABI opcode and not registered)"
        ))
    })?;
    let inputs = id_list(req(m, "inputs", p)?, &P::Key(p, "inputs"))?;
    let outputs = id_list(req(m, "outputs", p)?, &P::Key(p, "outputs"))?;
    let out_counter = id(req(m, "out_counter", p)?, &P::Key(p, "out_counter"))?;
    let waits = match opt(m, "waits") {
        None => Vec::new(),
        Some(v) => {
            let pw = P::Key(p, "waits");
            expect_arr(v, &pw)?
                .iter()
                .enumerate()
                .map(|(i, w)| {
                    let pi = P::Idx(&pw, i);
                    let wm = expect_obj(w, &pi)?;
                    Ok(Wait {
                        counter: id(req(wm, "counter", &pi)?, &P::Key(&pi, "counter"))?,
                        threshold: int(req(wm, "threshold", &pi)?, &P::Key(&pi, "threshold"))?,
                    })
                })
                .collect::<R<Vec<_>>>()?
        }
    };
    let params = match opt(m, "params") {
        None => Map::new(),
        Some(v) => expect_obj(v, &P::Key(p, "params"))?.clone(),
    };
    let floating = match opt(m, "floating") {
        None => false,
        Some(v) => boolean(v, &P::Key(p, "floating"))?,
    };
    let sm = match opt(m, "sm") {
        None => None,
        Some(v) => {
            Some(int_in(v, &P::Key(p, "sm"), i32::MIN as i64, i32::MAX as i64, "sm")? as i32)
        }
    };
    // A floating task runs on whichever SM completes its wait: it has no SM of its own, and
    // the file says so with -1 (or null).
    let sm = match (floating, sm) {
        (true, None | Some(-1)) => None,
        (true, Some(s)) => {
            return Err(P::Key(p, "sm").err(format!(
                "a floating task has no SM of its own (write -1 or null), found {s}"
            )));
        }
        (false, sm) => sm,
    };
    // Cost hints: integers, or floats with an integral value (tooling that computes them in
    // floating point writes `12.0`); anything else is refused like any other bad number.
    let est = |key: &'static str| -> R<i64> {
        match opt(m, key) {
            None => Ok(0),
            Some(Value::Float(f)) if f.fract() == 0.0 && f.abs() < 9.0e15 => Ok(*f as i64),
            Some(v) => int(v, &P::Key(p, key)),
        }
    };
    let label = match opt(m, "label") {
        None => String::new(),
        Some(v) => string(v, &P::Key(p, "label"))?,
    };
    Ok(Task {
        id: own_id,
        op,
        inputs,
        outputs,
        out_counter,
        waits,
        params,
        sm,
        floating,
        est_bytes: est("est_bytes")?,
        est_flops: est("est_flops")?,
        label,
    })
}

fn pages_from(v: &Value, p: &P) -> R<PageAllocation> {
    let m = expect_obj(v, p)?;
    let pb = P::Key(p, "buffer_to_page");
    let mut buffer_to_page = Vec::new();
    if let Some(b2p) = opt(m, "buffer_to_page") {
        for (k, v) in expect_obj(b2p, &pb)?.iter() {
            let pk = P::Key(&pb, k);
            let b: u32 = k
                .parse()
                .map_err(|_| pk.err(format!("key '{k}' is not a buffer id")))?;
            buffer_to_page.push((b, id(v, &pk)?));
        }
    }
    let pp = P::Key(p, "pages");
    let mut pages = Vec::new();
    // Required (the format's page allocation always lists its pages, the reference refuses
    // one without): an empty list is written as such.
    let list = req(m, "pages", p)?;
    for (i, pv) in expect_arr(list, &pp)?.iter().enumerate() {
        let pi = P::Idx(&pp, i);
        let pm = expect_obj(pv, &pi)?;
        let page_id = canonical(pm, &pi, i, "page")?;
        let space = enum_name(
            req(pm, "space", &pi)?,
            &P::Key(&pi, "space"),
            "memory space",
            MemSpace::from_name,
            &names(MemSpace::ALL),
        )?;
        let nbytes = int_in(
            req(pm, "nbytes", &pi)?,
            &P::Key(&pi, "nbytes"),
            0,
            i64::MAX,
            "nbytes",
        )? as u64;
        let live = |key: &'static str| -> R<i64> {
            match opt(pm, key) {
                None => Ok(-1),
                Some(v) => int(v, &P::Key(&pi, key)),
            }
        };
        pages.push(Page {
            id: page_id,
            space,
            nbytes,
            live_start: live("live_start")?,
            live_end: live("live_end")?,
        });
    }
    Ok(PageAllocation {
        buffer_to_page,
        pages,
    })
}

/// Parses a standalone ScheduleConfig document (the `config` object of a program file, e.g.
/// `amk lower --config cfg.json`), with the same strictness and JSON paths as programs.
pub fn schedule_config_from_json(text: &str) -> R<ScheduleConfig> {
    let v = json::parse(text)?;
    config_from(&v, &P::Root)
}

fn config_from(v: &Value, p: &P) -> R<ScheduleConfig> {
    let m = expect_obj(v, p)?;
    let mut c = ScheduleConfig::default();
    if let Some(t) = opt(m, "tiling") {
        let pt = P::Key(p, "tiling");
        for (group, kv) in expect_obj(t, &pt)?.iter() {
            let pg = P::Key(&pt, group);
            let mut entries = Vec::new();
            for (k, x) in expect_obj(kv, &pg)?.iter() {
                entries.push((k.to_string(), int(x, &P::Key(&pg, k))?));
            }
            c.tiling.push((group.to_string(), entries));
        }
    }
    if let Some(f) = opt(m, "fusion_grouping") {
        let pf = P::Key(p, "fusion_grouping");
        for (i, g) in expect_arr(f, &pf)?.iter().enumerate() {
            let pg = P::Idx(&pf, i);
            let group = expect_arr(g, &pg)?
                .iter()
                .enumerate()
                .map(|(j, s)| string(s, &P::Idx(&pg, j)))
                .collect::<R<Vec<_>>>()?;
            c.fusion_grouping.push(group);
        }
    }
    if let Some(s) = opt(m, "sm_assignment") {
        let ps = P::Key(p, "sm_assignment");
        c.sm_assignment = match s {
            Value::Str(name) => match name.as_str() {
                "round_robin" => SmAssignment::RoundRobin,
                "load_balance" => SmAssignment::LoadBalance,
                other => {
                    return Err(ps.err(format!(
                        "unknown SM assignment '{other}' (expected round_robin, load_balance or a task→SM map)"
                    )));
                }
            },
            Value::Object(map) => {
                let mut entries = Vec::new();
                for (k, v) in map.iter() {
                    let pk = P::Key(&ps, k);
                    let t: u32 = k
                        .parse()
                        .map_err(|_| pk.err(format!("key '{k}' is not a task id")))?;
                    entries.push((t, id(v, &pk)?));
                }
                SmAssignment::Explicit(entries)
            }
            other => {
                return Err(ps.err(format!(
                    "expected a strategy name or a task→SM map, found {}",
                    other.type_name()
                )));
            }
        };
    }
    if let Some(v) = opt(m, "pipelining_depth") {
        c.pipelining_depth = int(v, &P::Key(p, "pipelining_depth"))?;
    }
    if let Some(v) = opt(m, "page_allocation") {
        let pa = P::Key(p, "page_allocation");
        let s = string(v, &pa)?;
        c.page_allocation = PageStrategy::from_name(&s).ok_or_else(|| {
            pa.err(format!(
                "unknown page allocation '{s}' (expected none, linear or graph_color)"
            ))
        })?;
    }
    if let Some(v) = opt(m, "threads_per_block") {
        c.threads_per_block = int(v, &P::Key(p, "threads_per_block"))?;
    }
    if let Some(v) = opt(m, "smem_bytes_per_block") {
        c.smem_bytes_per_block = int(v, &P::Key(p, "smem_bytes_per_block"))?;
    }
    Ok(c)
}

fn target_from(v: &Value, p: &P) -> R<GpuTarget> {
    let m = expect_obj(v, p)?;
    let gi = |k: &'static str| int(req(m, k, p)?, &P::Key(p, k));
    let gr = |k: &'static str| real(req(m, k, p)?, &P::Key(p, k));
    let or_r = |k: &'static str, d: f64| opt(m, k).map_or(Ok(d), |v| real(v, &P::Key(p, k)));
    let or_b = |k: &'static str, d: bool| opt(m, k).map_or(Ok(d), |v| boolean(v, &P::Key(p, k)));
    Ok(GpuTarget {
        name: string(req(m, "name", p)?, &P::Key(p, "name"))?,
        sm_arch: gi("sm_arch")?,
        num_sms: gi("num_sms")?,
        smem_bytes_per_sm: gi("smem_bytes_per_sm")?,
        smem_bytes_per_block_optin: gi("smem_bytes_per_block_optin")?,
        regs_per_sm: gi("regs_per_sm")?,
        max_threads_per_sm: gi("max_threads_per_sm")?,
        max_regs_per_thread: gi("max_regs_per_thread")?,
        l2_bytes: gi("l2_bytes")?,
        hbm_bytes: gi("hbm_bytes")?,
        hbm_bandwidth_gbs: gr("hbm_bandwidth_gbs")?,
        fp16_tflops: gr("fp16_tflops")?,
        clock_ghz: or_r("clock_ghz", 0.0)?,
        supports_cooperative: or_b("supports_cooperative", true)?,
        wddm_tdr: or_b("wddm_tdr", false)?,
        measured_bw_gbs: or_r("measured_bw_gbs", 0.0)?,
        note: opt(m, "note").map_or(Ok(String::new()), |v| string(v, &P::Key(p, "note")))?,
    })
}

// ---------------------------------------------------------------------------------------
// Writing

fn obj(entries: Vec<(&str, Value)>) -> Value {
    Value::Object(Map(entries
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()))
}

fn ints<I: IntoIterator<Item = u32>>(xs: I) -> Value {
    Value::Array(xs.into_iter().map(|x| Value::Int(x as i64)).collect())
}

fn opt_str(s: &Option<String>) -> Value {
    s.as_ref().map_or(Value::Null, |s| Value::Str(s.clone()))
}

/// The JSON document of a program (key order as the reference writes it). Refuses programs
/// whose maps would repeat a key (a file our own reader would then refuse).
pub fn to_value(p: &Program, reg: &Registry) -> R<Value> {
    check_writable(p)?;
    let buffers = p.buffers.iter().map(buffer_to).collect();
    let counters = p.counters.iter().map(counter_to).collect();
    let tasks = (p.tasks.iter())
        .map(|t| task_to(t, reg))
        .collect::<R<Vec<_>>>()?;
    let pages = p.pages.as_ref().map_or(Value::Null, pages_to);
    let config = p.config.as_ref().map_or(Value::Null, config_to);
    let target = p.target.as_ref().map_or(Value::Null, target_to);
    let mut fields = vec![
        ("ir_version", Value::Str(p.ir_version.clone())),
        ("abi_version", Value::Str(p.abi_version.clone())),
        ("meta", Value::Object(p.meta.clone())),
        ("target", target),
        ("buffers", Value::Array(buffers)),
        ("counters", Value::Array(counters)),
        ("tasks", Value::Array(tasks)),
        ("pages", pages),
        ("config", config),
    ];
    // Written only when present, so a program without a loop keeps the reference's format.
    if let Some(l) = &p.step_loop {
        fields.push((
            "step_loop",
            obj(vec![
                ("gate", Value::Int(l.gate as i64)),
                ("halt", Value::Int(l.halt as i64)),
            ]),
        ));
    }
    Ok(obj(fields))
}

/// What the JSON format cannot hold: a buffer bound to two pages, a task listed twice in an
/// explicit SM assignment, a tiling group or key twice, map keys that collide.
fn check_writable(p: &Program) -> R<()> {
    if let Some(pa) = &p.pages
        && let Some(b) = first_repeat(pa.buffer_to_page.iter().map(|&(b, _)| b))
    {
        return Err(IrError::Serialize(format!(
            "the page table binds buffer {b} more than once"
        )));
    }
    if let Some(ScheduleConfig {
        sm_assignment: SmAssignment::Explicit(map),
        ..
    }) = &p.config
        && let Some(t) = first_repeat(map.iter().map(|&(t, _)| t))
    {
        return Err(IrError::Serialize(format!(
            "the explicit SM assignment lists task {t} more than once"
        )));
    }
    if let Some(c) = &p.config {
        let groups: Vec<&str> = c.tiling.iter().map(|(g, _)| g.as_str()).collect();
        if let Some(g) = first_repeat_str(&groups) {
            return Err(IrError::Serialize(format!(
                "tiling group '{g}' appears twice"
            )));
        }
        for (g, kv) in &c.tiling {
            let keys: Vec<&str> = kv.iter().map(|(k, _)| k.as_str()).collect();
            if let Some(k) = first_repeat_str(&keys) {
                return Err(IrError::Serialize(format!(
                    "tiling.{g} has key '{k}' twice"
                )));
            }
        }
    }
    check_map_keys(&p.meta, "meta")?;
    for t in &p.tasks {
        check_map_keys(&t.params, &format!("task {} params", t.id))?;
    }
    Ok(())
}

fn buffer_to(b: &crate::Buffer) -> Value {
    obj(vec![
        ("id", Value::Int(b.id as i64)),
        ("name", Value::Str(b.name.clone())),
        ("kind", Value::from(b.kind.name())),
        ("dtype", Value::from(b.dtype.name())),
        (
            "shape",
            Value::Array(b.shape.iter().map(|&d| Value::Int(d as i64)).collect()),
        ),
        ("space", Value::from(b.space.name())),
        ("source", opt_str(&b.source)),
    ])
}

fn counter_to(c: &crate::Counter) -> Value {
    obj(vec![
        ("id", Value::Int(c.id as i64)),
        ("init", Value::Int(c.init)),
        ("note", Value::Str(c.note.clone())),
    ])
}

/// A task, its op by the registry's name.
fn task_to(t: &crate::Task, reg: &Registry) -> R<Value> {
    let op = reg.name_of(t.op).ok_or_else(|| {
        IrError::Serialize(format!(
            "task {}: opcode code {} has no name in the registry",
            t.id, t.op.0
        ))
    })?;
    let waits = (t.waits.iter())
        .map(|w| {
            obj(vec![
                ("counter", Value::Int(w.counter as i64)),
                ("threshold", Value::Int(w.threshold)),
            ])
        })
        .collect();
    let sm = match (t.floating, t.sm) {
        (true, _) => Value::Int(-1),
        (false, s) => s.map_or(Value::Null, |s| Value::Int(s as i64)),
    };
    let mut fields = vec![
        ("id", Value::Int(t.id as i64)),
        ("op", Value::Str(op.into_owned())),
        ("inputs", ints(t.inputs.iter().copied())),
        ("outputs", ints(t.outputs.iter().copied())),
        ("out_counter", Value::Int(t.out_counter as i64)),
        ("waits", Value::Array(waits)),
        ("params", Value::Object(t.params.clone())),
        ("sm", sm),
    ];
    // Written only when set, so a program without floating tasks keeps the reference's format.
    if t.floating {
        fields.push(("floating", Value::Bool(true)));
    }
    fields.extend([
        ("est_bytes", Value::Int(t.est_bytes)),
        ("est_flops", Value::Int(t.est_flops)),
        ("label", Value::Str(t.label.clone())),
    ]);
    Ok(obj(fields))
}

fn pages_to(pa: &crate::PageAllocation) -> Value {
    let pages = (pa.pages.iter())
        .map(|pg| {
            obj(vec![
                ("id", Value::Int(pg.id as i64)),
                ("space", Value::from(pg.space.name())),
                ("nbytes", Value::Int(pg.nbytes as i64)),
                ("live_start", Value::Int(pg.live_start)),
                ("live_end", Value::Int(pg.live_end)),
            ])
        })
        .collect();
    obj(vec![
        (
            "buffer_to_page",
            Value::Object(Map(pa
                .buffer_to_page
                .iter()
                .map(|&(b, pg)| (b.to_string(), Value::Int(pg as i64)))
                .collect())),
        ),
        ("pages", Value::Array(pages)),
    ])
}

fn first_repeat_str<'s>(keys: &[&'s str]) -> Option<&'s str> {
    keys.iter()
        .enumerate()
        .find(|&(i, k)| keys[..i].contains(k))
        .map(|(_, k)| *k)
}

/// Refuses a map (at any depth) that repeats a key.
fn check_map_keys(m: &Map, what: &str) -> R<()> {
    let keys: Vec<&str> = m.0.iter().map(|(k, _)| k.as_str()).collect();
    if let Some(k) = first_repeat_str(&keys) {
        return Err(IrError::Serialize(format!("{what} has key '{k}' twice")));
    }
    for (k, v) in m.iter() {
        check_value_keys(v, &format!("{what}.{k}"))?;
    }
    Ok(())
}

fn check_value_keys(v: &Value, what: &str) -> R<()> {
    match v {
        Value::Object(m) => check_map_keys(m, what),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, x)| check_value_keys(x, &format!("{what}[{i}]"))),
        _ => Ok(()),
    }
}

fn first_repeat(ids: impl Iterator<Item = u32>) -> Option<u32> {
    let mut seen = std::collections::HashSet::new();
    ids.into_iter().find(|&x| !seen.insert(x))
}

fn config_to(c: &ScheduleConfig) -> Value {
    let tiling = Value::Object(Map(c
        .tiling
        .iter()
        .map(|(g, kv)| {
            (
                g.clone(),
                Value::Object(Map(kv
                    .iter()
                    .map(|(k, v)| (k.clone(), Value::Int(*v)))
                    .collect())),
            )
        })
        .collect()));
    let fusion = Value::Array(
        c.fusion_grouping
            .iter()
            .map(|g| Value::Array(g.iter().map(|s| Value::Str(s.clone())).collect()))
            .collect(),
    );
    let sm = match &c.sm_assignment {
        SmAssignment::Explicit(map) => Value::Object(Map(map
            .iter()
            .map(|&(t, s)| (t.to_string(), Value::Int(s as i64)))
            .collect())),
        other => Value::from(other.name()),
    };
    obj(vec![
        ("tiling", tiling),
        ("fusion_grouping", fusion),
        ("sm_assignment", sm),
        ("pipelining_depth", Value::Int(c.pipelining_depth)),
        ("page_allocation", Value::from(c.page_allocation.name())),
        ("threads_per_block", Value::Int(c.threads_per_block)),
        ("smem_bytes_per_block", Value::Int(c.smem_bytes_per_block)),
    ])
}

fn target_to(t: &GpuTarget) -> Value {
    obj(vec![
        ("name", Value::Str(t.name.clone())),
        ("sm_arch", Value::Int(t.sm_arch)),
        ("num_sms", Value::Int(t.num_sms)),
        ("smem_bytes_per_sm", Value::Int(t.smem_bytes_per_sm)),
        (
            "smem_bytes_per_block_optin",
            Value::Int(t.smem_bytes_per_block_optin),
        ),
        ("regs_per_sm", Value::Int(t.regs_per_sm)),
        ("max_threads_per_sm", Value::Int(t.max_threads_per_sm)),
        ("max_regs_per_thread", Value::Int(t.max_regs_per_thread)),
        ("l2_bytes", Value::Int(t.l2_bytes)),
        ("hbm_bytes", Value::Int(t.hbm_bytes)),
        ("hbm_bandwidth_gbs", Value::Float(t.hbm_bandwidth_gbs)),
        ("fp16_tflops", Value::Float(t.fp16_tflops)),
        ("clock_ghz", Value::Float(t.clock_ghz)),
        ("supports_cooperative", Value::Bool(t.supports_cooperative)),
        ("wddm_tdr", Value::Bool(t.wddm_tdr)),
        ("measured_bw_gbs", Value::Float(t.measured_bw_gbs)),
        ("note", Value::Str(t.note.clone())),
    ])
}

/// Pretty JSON text of a program (no trailing newline), as the reference writes it.
pub fn to_json_string(p: &Program, reg: &Registry) -> R<String> {
    Ok(json::to_pretty(&to_value(p, reg)?))
}

impl Program {
    /// Parses JSON text (see [`from_json_str`]).
    pub fn from_json(text: &str, reg: &Registry) -> R<Program> {
        from_json_str(text, reg)
    }
    /// Pretty JSON text (see [`to_json_string`]).
    pub fn to_json(&self, reg: &Registry) -> R<String> {
        to_json_string(self, reg)
    }
    /// Loads a `.json` or `.json.gz` file.
    pub fn load(path: &Path, reg: &Registry) -> R<Program> {
        load(path, reg)
    }
    /// Saves to a `.json` or `.json.gz` file.
    pub fn save(&self, path: &Path, reg: &Registry) -> R<()> {
        save(self, path, reg)
    }
}
