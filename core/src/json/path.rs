//! JSON paths (`$.tasks[3].waits[0].threshold`) for error messages.

use std::fmt;

/// One step of a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    /// Object member.
    Key(String),
    /// Array element.
    Index(usize),
}

/// A path from the document root.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct JsonPath(pub Vec<Seg>);

impl fmt::Display for JsonPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("$")?;
        for s in &self.0 {
            match s {
                Seg::Key(k) if is_ident(k) => write!(f, ".{k}")?,
                Seg::Key(k) => write!(f, "[{k:?}]")?,
                Seg::Index(i) => write!(f, "[{i}]")?,
            }
        }
        Ok(())
    }
}

fn is_ident(k: &str) -> bool {
    !k.is_empty()
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !k.starts_with(|c: char| c.is_ascii_digit())
}
