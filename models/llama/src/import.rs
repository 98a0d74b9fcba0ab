//! One entry for both formats: whichever importer recognises a path imports it.

use crate::gguf_import::GgufImporter;
use crate::hf::HfImporter;
use crate::{Model, ModelError};
use amk_core::Importer;
use std::path::Path;

/// The importer whose format `path` is (a HuggingFace directory, then a GGUF file), if any:
/// the cheap probes only (names and magic bytes).
pub fn importer_for(
    path: &Path,
) -> Option<&'static dyn Importer<Model = Model, Error = ModelError>> {
    if HfImporter.probe(path) {
        Some(&HfImporter)
    } else if GgufImporter.probe(path) {
        Some(&GgufImporter)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neither_format_has_no_importer() {
        let d = std::env::temp_dir().join(format!("amk-import-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        assert!(importer_for(&d).is_none());
        let f = d.join("x.bin");
        std::fs::write(&f, b"not a model").unwrap();
        assert!(importer_for(&f).is_none());
        let g = d.join("m.gguf");
        std::fs::write(&g, b"GGUF\x03\x00\x00\x00").unwrap();
        assert_eq!(importer_for(&g).map(|i| i.name()), Some("gguf"));
        let _ = std::fs::remove_dir_all(&d);
    }
}
