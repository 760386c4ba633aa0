//! The core's layers, checked on its source: the data layer (`ids`,
//! `types`, `config`, `error`, `event`, `decision`, `pending` and every
//! module under `state/`) names no policy pass and no part of the speed
//! layer, so each of its modules can be read alone; and the policy passes
//! under `cycle/` read the state through `Policy` (which holds `&State`)
//! and change nothing, except the cycle's driver (`cycle/mod.rs`), which
//! orders the passes and applies their decisions.

use std::path::{Path, PathBuf};

/// The data layer's top-level modules: what a data module may name.
const DATA: [&str; 8] = [
    "ids", "types", "config", "error", "event", "decision", "pending", "state",
];

/// The file under `cycle/` that drives the cycle: it orders the passes and
/// applies their decisions, so it alone holds the allocator mutably.
const DRIVERS: [&str; 1] = ["mod.rs"];

/// What the unit tests of any module may name besides.
const TEST_SUPPORT: &str = "testing";

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules a source text's code (not its comments) names
/// through `crate::` paths, including the braces of
/// `use crate::{a::X, b::Y}`.
fn crate_modules(text: &str) -> Vec<String> {
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let text = code.as_str();
    let mut named = Vec::new();
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let item = item.trim();
                if let Some((module, _)) = item.split_once("::") {
                    named.push(module.to_string());
                }
            }
            continue;
        }
        let module: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        // `crate::Allocator` and the other re-exports at the root name the
        // public API, which the passes make up.
        if module.starts_with(|c: char| c.is_ascii_uppercase()) {
            named.push(format!("<root>::{module}"));
        } else {
            named.push(module);
        }
    }
    named
}

/// (file, module named) for every data-layer file naming a module outside
/// the data layer.
fn data_layer_violations() -> Vec<(String, String)> {
    let mut files = Vec::new();
    rust_files(&src().join("state"), &mut files);
    for module in DATA.iter().filter(|m| **m != "state") {
        files.push(src().join(format!("{module}.rs")));
    }
    let mut bad = Vec::new();
    for file in files {
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for module in crate_modules(&text) {
            if !DATA.contains(&module.as_str()) && module != TEST_SUPPORT {
                bad.push((file.display().to_string(), module));
            }
        }
    }
    bad
}

#[test]
fn no_data_module_imports_a_policy_pass_or_the_speed_layer() {
    let bad = data_layer_violations();
    assert!(
        bad.is_empty(),
        "data-layer modules naming modules outside the data layer: {bad:#?}"
    );
}

/// Source text without its comment lines.
fn code_of(file: &Path) -> String {
    std::fs::read_to_string(file)
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// (file, what it does) for every pass file outside `DRIVERS` that
/// implements the allocator or reaches the state mutably.
fn mutating_passes() -> Vec<(String, &'static str)> {
    let mut files = Vec::new();
    rust_files(&src().join("cycle"), &mut files);
    let mut bad = Vec::new();
    for file in files {
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if DRIVERS.contains(&name) {
            continue;
        }
        let code = code_of(&file);
        for needle in [
            "impl Allocator",
            "&mut self.state",
            "job_mut(",
            "&mut State",
        ] {
            if code.contains(needle) {
                bad.push((file.display().to_string(), needle));
            }
        }
    }
    bad
}

#[test]
fn policy_passes_read_the_state_and_change_nothing() {
    let bad = mutating_passes();
    assert!(
        bad.is_empty(),
        "pass files outside the cycle's driver that mutate: {bad:#?}"
    );
}

#[test]
fn every_driver_file_the_check_skips_exists() {
    for name in DRIVERS {
        assert!(src().join("cycle").join(name).is_file(), "cycle/{name}");
    }
}

#[test]
fn the_import_scan_sees_plain_grouped_and_root_paths() {
    let text = "use crate::cycle::CycleCtx;\n/// [`crate::explain`]\nuse crate::{ids::JobIdx, memo::Memo};\nlet a = crate::Allocator::new();";
    assert_eq!(
        crate_modules(text),
        vec!["cycle", "ids", "memo", "<root>::Allocator"]
    );
}

#[test]
fn every_data_module_the_check_reads_exists() {
    for module in DATA
        .iter()
        .filter(|m| **m != "state")
        .chain([&TEST_SUPPORT])
    {
        assert!(src().join(format!("{module}.rs")).is_file(), "{module}.rs");
    }
    assert!(src().join("state").join("mod.rs").is_file());
}
