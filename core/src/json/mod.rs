//! Our JSON layer: a strict parser with JSON-path errors and a writer that matches the
//! reference tooling's layout byte for byte (see `write`).

pub mod parse;
pub mod path;
pub mod value;
pub mod write;

pub use parse::{MAX_VALUE_BYTES, ParseError, parse, parse_limited};
pub use path::{JsonPath, Seg};
pub use value::{Map, Value};
pub use write::to_pretty;
