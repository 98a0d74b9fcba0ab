//! Chat templates: a checkpoint's own Jinja template rendered as transformers'
//! `apply_chat_template` renders it, so any model's template works (ChatML, Llama 3, Mistral,
//! Qwen3 with its thinking switch) rather than a few recognised ones.
//!
//! transformers renders with a sandboxed Jinja environment with `trim_blocks` and
//! `lstrip_blocks`, loop controls, a `raise_exception(message)` and a `strftime_now(format)`
//! function and its own `tojson` filter (Python's `json.dumps`); the variables are the
//! conversation (`messages`, each `{role, content}`), `add_generation_prompt` and the special
//! tokens (`bos_token`, `eos_token`). minijinja, with the Python string methods of
//! `minijinja-contrib` (`.strip()`, `.startswith()`, ...), reproduces that here.

use crate::error::ModelError;
use minijinja::value::Kwargs;
use minijinja::{Environment, Error, ErrorKind, Value, context};

/// One conversation to render.
#[derive(Debug, Clone, Copy)]
pub struct Conversation<'a> {
    /// `(role, content)` messages, in order.
    pub messages: &'a [(&'a str, &'a str)],
    /// End with the opening of the assistant's turn.
    pub add_generation_prompt: bool,
    /// The model's BOS and EOS tokens as text (templates that write them).
    pub bos_token: Option<&'a str>,
    /// See `bos_token`.
    pub eos_token: Option<&'a str>,
}

/// Renders `conversation` with the Jinja `template`. A template that does not parse, uses
/// something this environment lacks, or raises (`raise_exception`) is a
/// [`ModelError::Tokenizer`] with the template's own message.
pub fn render(template: &str, conversation: &Conversation<'_>) -> Result<String, ModelError> {
    let env = environment();
    let tmpl = env
        .template_from_str(template)
        .map_err(|e| template_err("does not parse", &e))?;
    let messages: Vec<Value> = conversation
        .messages
        .iter()
        .map(|(role, content)| context! { role => *role, content => *content })
        .collect();
    tmpl.render(context! {
        messages => messages,
        add_generation_prompt => conversation.add_generation_prompt,
        bos_token => conversation.bos_token.unwrap_or(""),
        eos_token => conversation.eos_token.unwrap_or(""),
    })
    .map_err(|e| template_err("failed", &e))
}

/// transformers' template environment (see the module documentation).
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |message: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        },
    );
    env.add_function("strftime_now", |format: String| {
        strftime(&format, now_utc())
    });
    env.add_filter("tojson", tojson);
    env
}

fn template_err(what: &str, e: &Error) -> ModelError {
    let mut message = format!("chat template {what}: {e}");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        message.push_str(&format!(": {s}"));
        source = s.source();
    }
    ModelError::Tokenizer(message)
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`: `", "` and `": "` between
/// items without an indent, newlines and `indent` spaces with one.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let json: serde_json::Value = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    write_json(&json, indent, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn write_json(v: &serde_json::Value, indent: Option<usize>, depth: usize, out: &mut String) {
    use serde_json::Value as J;
    let (open, close, items): (char, char, Vec<(Option<&String>, &J)>) = match v {
        J::Array(a) => ('[', ']', a.iter().map(|x| (None, x)).collect()),
        J::Object(o) => ('{', '}', o.iter().map(|(k, x)| (Some(k), x)).collect()),
        scalar => {
            out.push_str(&scalar.to_string());
            return;
        }
    };
    out.push(open);
    for (i, (key, item)) in items.iter().enumerate() {
        match indent {
            Some(n) => {
                out.push_str(if i == 0 { "\n" } else { ",\n" });
                out.push_str(&" ".repeat(n * (depth + 1)));
            }
            None if i > 0 => out.push_str(", "),
            None => {}
        }
        if let Some(k) = key {
            out.push_str(&J::String((*k).clone()).to_string());
            out.push_str(": ");
        }
        write_json(item, indent, depth + 1, out);
    }
    if let (Some(n), false) = (indent, items.is_empty()) {
        out.push('\n');
        out.push_str(&" ".repeat(n * depth));
    }
    out.push(close);
}

/// A UTC calendar time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DateTime {
    /// Year, month (1–12), day (1–31).
    pub ymd: (i64, u32, u32),
    /// Hour, minute, second.
    pub hms: (u32, u32, u32),
}

fn now_utc() -> DateTime {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    from_unix(secs)
}

/// The UTC calendar time `secs` seconds after 1970-01-01 (days to civil date: Howard
/// Hinnant's algorithm).
pub fn from_unix(secs: i64) -> DateTime {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    let rem = rem as u32;
    DateTime {
        ymd: (year, month, day),
        hms: (rem / 3600, rem / 60 % 60, rem % 60),
    }
}

/// Python's `strftime` for the directives chat templates use (`%d %b %B %m %Y %y %H %M %S %j`
/// is not among them; `%%`); any other directive is kept as written.
pub fn strftime(format: &str, t: DateTime) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let (y, m, d) = t.ymd;
    let (hh, mm, ss) = t.hms;
    let month = MONTHS[(m as usize).clamp(1, 12) - 1];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('b') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('H') => out.push_str(&format!("{hh:02}")),
            Some('M') => out.push_str(&format!("{mm:02}")),
            Some('S') => out.push_str(&format!("{ss:02}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}
