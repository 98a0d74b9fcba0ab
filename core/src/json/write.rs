//! JSON writing in the exact layout of Python's `json.dumps(obj, indent=2)`:
//! two-space indent, `", "`-free line breaks, `": "` after keys, `[]`/`{}` for empty
//! containers, ASCII-only output (`\uXXXX` escapes) and Python's float `repr`.
//! That makes files we write diff cleanly against files the reference tooling writes.

use super::value::Value;
use std::fmt::Write as _;

/// Pretty-prints `v` (no trailing newline).
pub fn to_pretty(v: &Value) -> String {
    let mut out = String::with_capacity(4096);
    pretty(v, 0, &mut out);
    out
}

fn indent(level: usize, out: &mut String) {
    out.push('\n');
    for _ in 0..level {
        out.push_str("  ");
    }
}

fn pretty(v: &Value, level: usize, out: &mut String) {
    match v {
        Value::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                indent(level + 1, out);
                pretty(item, level + 1, out);
            }
            indent(level, out);
            out.push(']');
        }
        Value::Object(m) if !m.is_empty() => {
            out.push('{');
            for (i, (k, item)) in m.0.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                indent(level + 1, out);
                write_str(k, out);
                out.push_str(": ");
                pretty(item, level + 1, out);
            }
            indent(level, out);
            out.push('}');
        }
        other => write_compact(other, out),
    }
}

/// Writes `v` on one line (Python's default separators `", "` and `": "`).
pub fn write_compact(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Value::Float(f) => write_float(*f, out),
        Value::Str(s) => write_str(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_compact(item, out);
            }
            out.push(']');
        }
        Value::Object(m) => {
            out.push('{');
            for (i, (k, item)) in m.0.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_str(k, out);
                out.push_str(": ");
                write_compact(item, out);
            }
            out.push('}');
        }
    }
}

/// Python's `repr(float)`: shortest round-trip digits, positional for exponents in
/// [-4, 16), otherwise `d.ddde±XX`; always shows a fraction or an exponent.
pub fn write_float(f: f64, out: &mut String) {
    if !f.is_finite() {
        // Never produced by the loader; keep the output valid JSON anyway.
        out.push_str("null");
        return;
    }
    if f == 0.0 {
        out.push_str(if f.is_sign_negative() { "-0.0" } else { "0.0" });
        return;
    }
    let sci = format!("{f:e}"); // e.g. "1.5e16", "-1e-6"
    let (mant, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let s = format!("{f}");
        out.push_str(&s);
        if !s.contains('.') {
            out.push_str(".0");
        }
    } else {
        out.push_str(mant);
        out.push('e');
        out.push(if exp < 0 { '-' } else { '+' });
        let _ = write!(out, "{:02}", exp.unsigned_abs());
    }
}

/// A JSON string literal with Python's `ensure_ascii` escaping.
pub fn write_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case(1e-6, "1e-06")]
    #[case(10000.0, "10000.0")]
    #[case(0.5, "0.5")]
    #[case(1.5e16, "1.5e+16")]
    #[case(1e16, "1e+16")]
    #[case(123456789012345.6, "123456789012345.6")]
    #[case(0.0001, "0.0001")]
    #[case(0.00001234, "1.234e-05")]
    #[case(-2.5, "-2.5")]
    #[case(0.125, "0.125")]
    #[case(3350.0, "3350.0")]
    fn floats_like_python_repr(#[case] f: f64, #[case] want: &str) {
        let mut s = String::new();
        write_float(f, &mut s);
        assert_eq!(s, want);
    }

    #[test]
    fn strings_are_ascii_escaped_like_python() {
        let mut s = String::new();
        write_str("a\"b\\c\n\u{7f}é😀", &mut s);
        assert_eq!(s, "\"a\\\"b\\\\c\\n\\u007f\\u00e9\\ud83d\\ude00\"");
    }
}
