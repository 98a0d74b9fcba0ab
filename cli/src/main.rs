//! The `amk` command line.
fn main() {}
