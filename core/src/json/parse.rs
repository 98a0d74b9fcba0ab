//! A strict JSON parser (RFC 8259) producing [`Value`].
//!
//! Why our own: the IR loader must name the JSON path of every problem, refuse duplicate keys
//! and `NaN`/`Infinity` (which Python's `json` writes and `serde_json` reports only by line and
//! column), keep key order, and never overflow the stack on hostile nesting.

use super::path::{JsonPath, Seg};
use super::value::{Map, Value};

/// Deepest nesting accepted; deeper input is refused instead of recursing further.
pub const MAX_DEPTH: usize = 128;

/// The most memory [`parse`] lets a document's values take (256 MiB; [`parse_limited`] sets
/// another bound). Two bytes of input (`0,`) make a 32-byte value, so without a bound a
/// 260 KB gzipped file of `0,` took gigabytes before anything could refuse it.
pub const MAX_VALUE_BYTES: u64 = 256 << 20;

/// What one value costs in memory as the parser counts it: its slot in the parent's vector,
/// twice over (a growing vector may hold up to twice its length).
const VALUE_COST: u64 = 2 * std::mem::size_of::<Value>() as u64;
/// ... and one object entry (its key's bytes are counted on top).
const ENTRY_COST: u64 = 2 * std::mem::size_of::<(String, Value)>() as u64;

/// Why a document could not be parsed.
#[derive(Debug, Clone, PartialEq)]
pub enum ParseError {
    /// Not JSON at all: message plus 1-based line and column.
    Syntax {
        /// What was wrong.
        message: String,
        /// 1-based line.
        line: usize,
        /// 1-based column (in bytes).
        column: usize,
        /// The innermost value being read when the error was found.
        path: JsonPath,
    },
    /// Well-formed but refused (duplicate key, non-finite number), at a JSON path.
    Refused {
        /// Where.
        path: JsonPath,
        /// What was wrong.
        message: String,
    },
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParseError::Syntax {
                message,
                line,
                column,
                path,
            } => write!(
                f,
                "invalid JSON at line {line}, column {column} (in {path}): {message}"
            ),
            ParseError::Refused { path, message } => write!(f, "{path}: {message}"),
        }
    }
}

impl std::error::Error for ParseError {}

enum Err {
    Syntax(usize, String, Vec<Seg>),
    Refused(Vec<Seg>, String),
}

impl Err {
    fn under(mut self, seg: Seg) -> Err {
        match &mut self {
            Err::Syntax(_, _, p) | Err::Refused(p, _) => p.push(seg),
        }
        self
    }
}

/// Parses one complete JSON document (surrounding whitespace allowed, nothing else), its
/// values in at most [`MAX_VALUE_BYTES`] of memory.
pub fn parse(text: &str) -> Result<Value, ParseError> {
    parse_limited(text, MAX_VALUE_BYTES)
}

/// [`parse`], its values in at most `max_value_bytes` of memory (a document that needs more is
/// refused as soon as it does, before the memory is taken).
pub fn parse_limited(text: &str, max_value_bytes: u64) -> Result<Value, ParseError> {
    let bytes = text.as_bytes();
    let mut p = Parser {
        b: bytes,
        i: 0,
        left: max_value_bytes,
        limit: max_value_bytes,
    };
    let res = (|| {
        p.ws();
        let v = p.value(0)?;
        p.ws();
        if p.i != p.b.len() {
            return Err(Err::Syntax(
                p.i,
                "trailing characters after the document".into(),
                Vec::new(),
            ));
        }
        Ok(v)
    })();
    res.map_err(|e| match e {
        Err::Syntax(off, message, mut rev) => {
            let (line, column) = line_col(bytes, off);
            rev.reverse();
            ParseError::Syntax {
                message,
                line,
                column,
                path: JsonPath(rev),
            }
        }
        Err::Refused(mut rev, message) => {
            rev.reverse();
            ParseError::Refused {
                path: JsonPath(rev),
                message,
            }
        }
    })
}

fn line_col(b: &[u8], off: usize) -> (usize, usize) {
    let off = off.min(b.len());
    let before = &b[..off];
    let line = before.iter().filter(|&&c| c == b'\n').count() + 1;
    let col = off
        - before
            .iter()
            .rposition(|&c| c == b'\n')
            .map_or(0, |p| p + 1)
        + 1;
    (line, col)
}

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
    /// Bytes of value memory still allowed.
    left: u64,
    /// The bound it started from (for the message).
    limit: u64,
}

impl Parser<'_> {
    /// Counts `bytes` of value memory, or refuses the document when they are past the bound.
    fn spend(&mut self, bytes: u64) -> Result<(), Err> {
        match self.left.checked_sub(bytes) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => Err(Err::Refused(
                vec![],
                format!(
                    "the document's values would take more than {} MiB of memory",
                    self.limit >> 20
                ),
            )),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        while let Some(c) = self.peek() {
            if matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
                self.i += 1;
            } else {
                break;
            }
        }
    }

    fn eat_lit(&mut self, lit: &[u8]) -> bool {
        if self.b[self.i..].starts_with(lit) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, Err> {
        if depth > MAX_DEPTH {
            return Err(Err::Syntax(
                self.i,
                format!("nesting deeper than {MAX_DEPTH} levels"),
                Vec::new(),
            ));
        }
        match self.peek() {
            None => Err(Err::Syntax(
                self.i,
                "unexpected end of input".into(),
                Vec::new(),
            )),
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => Ok(Value::Str(self.string()?)),
            Some(b't') if self.eat_lit(b"true") => Ok(Value::Bool(true)),
            Some(b'f') if self.eat_lit(b"false") => Ok(Value::Bool(false)),
            Some(b'n') if self.eat_lit(b"null") => Ok(Value::Null),
            Some(b'N') if self.eat_lit(b"NaN") => Err(Err::Refused(
                vec![],
                "NaN is not a valid number here (only finite numbers are accepted)".into(),
            )),
            Some(b'I') if self.eat_lit(b"Infinity") => Err(Err::Refused(
                vec![],
                "Infinity is not a valid number here (only finite numbers are accepted)".into(),
            )),
            Some(b'-') if self.b[self.i..].starts_with(b"-Infinity") => {
                self.i += 9;
                Err(Err::Refused(
                    vec![],
                    "-Infinity is not a valid number here (only finite numbers are accepted)"
                        .into(),
                ))
            }
            Some(c) if c == b'-' || c.is_ascii_digit() => self.number(),
            Some(_) => Err(Err::Syntax(
                self.i,
                "expected a JSON value".into(),
                Vec::new(),
            )),
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value, Err> {
        self.i += 1; // '{'
        let mut entries: Vec<(String, Value)> = Vec::new();
        let mut index: Option<std::collections::HashSet<String>> = None;
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(Value::Object(Map(entries)));
        }
        loop {
            self.ws();
            if self.peek() != Some(b'"') {
                return Err(Err::Syntax(
                    self.i,
                    "expected a string key".into(),
                    Vec::new(),
                ));
            }
            let key = self.string()?;
            self.spend(ENTRY_COST)?;
            // Duplicate detection: linear for small objects, hashed once they grow.
            let dup = match &mut index {
                Some(set) => !set.insert(key.clone()),
                None => {
                    let d = entries.iter().any(|(k, _)| *k == key);
                    if entries.len() >= 16 {
                        index = Some(entries.iter().map(|(k, _)| k.clone()).collect());
                        if let Some(set) = &mut index {
                            set.insert(key.clone());
                        }
                    }
                    d
                }
            };
            if dup {
                return Err(Err::Refused(
                    vec![Seg::Key(key)],
                    "duplicate key in object".into(),
                ));
            }
            self.ws();
            if self.peek() != Some(b':') {
                return Err(Err::Syntax(
                    self.i,
                    "expected ':' after key".into(),
                    Vec::new(),
                ));
            }
            self.i += 1;
            self.ws();
            let v = self
                .value(depth + 1)
                .map_err(|e| e.under(Seg::Key(key.clone())))?;
            entries.push((key, v));
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Ok(Value::Object(Map(entries)));
                }
                _ => {
                    return Err(Err::Syntax(
                        self.i,
                        "expected ',' or '}' in object".into(),
                        Vec::new(),
                    ));
                }
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, Err> {
        self.i += 1; // '['
        let mut items = Vec::new();
        self.ws();
        if self.peek() == Some(b']') {
            self.i += 1;
            return Ok(Value::Array(items));
        }
        loop {
            self.ws();
            let idx = items.len();
            self.spend(VALUE_COST)
                .map_err(|e| e.under(Seg::Index(idx)))?;
            let v = self
                .value(depth + 1)
                .map_err(|e| e.under(Seg::Index(idx)))?;
            items.push(v);
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    return Ok(Value::Array(items));
                }
                _ => {
                    return Err(Err::Syntax(
                        self.i,
                        "expected ',' or ']' in array".into(),
                        Vec::new(),
                    ));
                }
            }
        }
    }

    fn hex4(&mut self) -> Result<u32, Err> {
        let Some(h) = self.b.get(self.i..self.i + 4) else {
            return Err(Err::Syntax(
                self.i,
                "truncated \\u escape".into(),
                Vec::new(),
            ));
        };
        let mut v = 0u32;
        for &c in h {
            let d = (c as char).to_digit(16).ok_or_else(|| {
                Err::Syntax(self.i, "invalid hex digit in \\u escape".into(), Vec::new())
            })?;
            v = v * 16 + d;
        }
        self.i += 4;
        Ok(v)
    }

    fn string(&mut self) -> Result<String, Err> {
        self.i += 1; // opening quote
        let mut out = String::new();
        loop {
            // Copy a run of plain bytes at once (the input is valid UTF-8: it came from &str).
            let start = self.i;
            while let Some(c) = self.peek() {
                if c == b'"' || c == b'\\' || c < 0x20 {
                    break;
                }
                self.i += 1;
            }
            if self.i > start {
                // Both ends lie on ASCII bytes, hence on char boundaries.
                out.push_str(&String::from_utf8_lossy(&self.b[start..self.i]));
            }
            match self.peek() {
                None => {
                    return Err(Err::Syntax(
                        self.i,
                        "unterminated string".into(),
                        Vec::new(),
                    ));
                }
                Some(b'"') => {
                    self.i += 1;
                    self.spend(out.len() as u64)?;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.i += 1;
                    let Some(e) = self.peek() else {
                        return Err(Err::Syntax(
                            self.i,
                            "unterminated escape".into(),
                            Vec::new(),
                        ));
                    };
                    self.i += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let cp = if (0xD800..0xDC00).contains(&hi) {
                                if !self.eat_lit(b"\\u") {
                                    return Err(Err::Syntax(
                                        self.i,
                                        "unpaired surrogate".into(),
                                        Vec::new(),
                                    ));
                                }
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return Err(Err::Syntax(
                                        self.i,
                                        "unpaired surrogate".into(),
                                        Vec::new(),
                                    ));
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else if (0xDC00..0xE000).contains(&hi) {
                                return Err(Err::Syntax(
                                    self.i,
                                    "unpaired surrogate".into(),
                                    Vec::new(),
                                ));
                            } else {
                                hi
                            };
                            match char::from_u32(cp) {
                                Some(c) => out.push(c),
                                None => {
                                    return Err(Err::Syntax(
                                        self.i,
                                        "invalid code point".into(),
                                        Vec::new(),
                                    ));
                                }
                            }
                        }
                        _ => {
                            return Err(Err::Syntax(
                                self.i - 1,
                                "invalid escape".into(),
                                Vec::new(),
                            ));
                        }
                    }
                }
                Some(_) => {
                    return Err(Err::Syntax(
                        self.i,
                        "control character inside a string".into(),
                        Vec::new(),
                    ));
                }
            }
        }
    }

    fn number(&mut self) -> Result<Value, Err> {
        let start = self.i;
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek() {
            Some(b'0') => self.i += 1,
            Some(c) if c.is_ascii_digit() => {
                while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                    self.i += 1;
                }
            }
            _ => return Err(Err::Syntax(self.i, "invalid number".into(), Vec::new())),
        }
        let mut is_float = false;
        if self.peek() == Some(b'.') {
            is_float = true;
            self.i += 1;
            if !self.peek().is_some_and(|c| c.is_ascii_digit()) {
                return Err(Err::Syntax(
                    self.i,
                    "digit expected after '.'".into(),
                    Vec::new(),
                ));
            }
            while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                self.i += 1;
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            is_float = true;
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if !self.peek().is_some_and(|c| c.is_ascii_digit()) {
                return Err(Err::Syntax(
                    self.i,
                    "digit expected in exponent".into(),
                    Vec::new(),
                ));
            }
            while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                self.i += 1;
            }
        }
        let text = std::str::from_utf8(&self.b[start..self.i]).unwrap_or("");
        // An integer beyond i64 is a number all the same (JSON numbers have no size: HF's
        // tokenizer_config.json writes `model_max_length` as 1e30): a Float, which a field that
        // needs an integer refuses at its own path.
        if !is_float && let Ok(v) = text.parse::<i64>() {
            return Ok(Value::Int(v));
        }
        match text.parse::<f64>() {
            Ok(f) if f.is_finite() => Ok(Value::Float(f)),
            _ => Err(Err::Refused(
                vec![],
                format!("number {text} is not a finite 64-bit float"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_past_the_budget_are_refused_at_their_path() {
        let text = format!("{{\"a\": [{}0]}}", "0,".repeat(1000));
        assert!(parse_limited(&text, 1 << 20).is_ok());
        match parse_limited(&text, 4096) {
            Err(ParseError::Refused { path, message }) => {
                assert!(path.to_string().starts_with("$.a["), "{path}");
                assert!(message.contains("MiB of memory"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        // Object entries and strings count too.
        let keys: Vec<String> = (0..200)
            .map(|i| format!("\"k{i}\": \"{}\"", "x".repeat(40)))
            .collect();
        let text = format!("{{{}}}", keys.join(","));
        assert!(parse_limited(&text, 1 << 20).is_ok());
        assert!(matches!(
            parse_limited(&text, 8192),
            Err(ParseError::Refused { .. })
        ));
    }
}
