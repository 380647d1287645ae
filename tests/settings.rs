//! README.md's table of configuration keys is generated from their declarations
//! (`src/config/settings.rs`); this fails when the committed table differs from what the code
//! generates, and prints the table to paste. Regenerate it with
//! `OUTBOX_BLESS_README=1 cargo test --test settings`.

use std::path::Path;

const BEGIN: &str =
    "<!-- keys: generated from src/config/settings.rs (OUTBOX_BLESS_README=1 cargo test --test settings) -->\n";
const END: &str = "<!-- end of keys -->\n";

#[test]
fn readme_table_of_keys_matches_the_declarations() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let readme = std::fs::read_to_string(&path).expect("README.md");
    let start = readme
        .find(BEGIN)
        .map(|i| i + BEGIN.len())
        .unwrap_or_else(|| panic!("README.md has no line {BEGIN:?} (the table of keys goes after it, then {END:?})"));
    let end = start
        + readme[start..]
            .find(END)
            .unwrap_or_else(|| panic!("README.md has no {END:?} after {BEGIN:?}"));
    let generated = outbox::config::reference_table();
    if std::env::var_os("OUTBOX_BLESS_README").is_some() {
        std::fs::write(&path, format!("{}{generated}{}", &readme[..start], &readme[end..])).expect("write README.md");
        return;
    }
    let committed = &readme[start..end];
    if committed != generated {
        let first = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()));
        panic!(
            "README.md's table of keys is out of date with src/config/settings.rs (first difference at \
             row {}).\nRegenerate it with:\n    OUTBOX_BLESS_README=1 cargo test --test settings\nor paste \
             this between the two markers:\n{generated}",
            first + 1
        );
    }
}

/// `docs/architecture.md`, "Adding a setting", shows the declaration of `batch.size` as it is in
/// `src/config/settings.rs` (comments aside).
#[test]
fn the_declaration_shown_in_docs_architecture_md_is_the_real_one() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let block = |text: &str| -> Vec<String> {
        let start = text.find("\"batch.size\" {").expect("a declaration of batch.size");
        // Its closing brace, indented in the table, at the start of the line in the document.
        let end = ["\n    }\n", "\n}\n"]
            .iter()
            .filter_map(|close| text[start..].find(close))
            .min()
            .map(|n| start + n)
            .expect("its end");
        text[start..end]
            .lines()
            .map(|l| l.split(" //").next().unwrap_or("").trim().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    };
    let declared = block(&std::fs::read_to_string(root.join("src/config/settings.rs")).unwrap());
    let shown = block(&std::fs::read_to_string(root.join("docs/architecture.md")).unwrap());
    assert_eq!(
        shown, declared,
        "docs/architecture.md shows another declaration of batch.size"
    );
}
