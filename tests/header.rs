//! `include/outbox.h` is generated from `src/ffi` by cbindgen and committed; this fails when the
//! committed header differs from what the code generates. Regenerate it with
//! `OUTBOX_BLESS_HEADER=1 cargo test --test header`. The Go module carries a copy of it
//! (`bindings/go/outbox.h`, so that it builds from a vendor directory or the module cache),
//! checked and regenerated the same way.

use std::path::Path;

fn generate() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml parses");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(root.join("src/ffi/mod.rs"))
        .generate()
        .expect("cbindgen generates the header");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("the header is UTF-8")
}

#[test]
fn committed_header_matches_the_ffi_code() {
    check(&Path::new(env!("CARGO_MANIFEST_DIR")).join("include/outbox.h"));
}

#[test]
fn go_module_copy_of_the_header_matches_the_ffi_code() {
    check(&Path::new(env!("CARGO_MANIFEST_DIR")).join("bindings/go/outbox.h"));
}

fn check(path: &Path) {
    let generated = generate();
    if std::env::var_os("OUTBOX_BLESS_HEADER").is_some() {
        std::fs::write(path, &generated).expect("write the header");
        return;
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    if committed != generated {
        let first = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()));
        panic!(
            "{} is out of date with src/ffi (first difference at line {}).\n\
             Regenerate it with:\n    OUTBOX_BLESS_HEADER=1 cargo test --test header\n\
             then review and commit the header.\n--- committed: {:?}\n+++ generated: {:?}",
            path.display(),
            first + 1,
            committed.lines().nth(first).unwrap_or("<end of file>"),
            generated.lines().nth(first).unwrap_or("<end of file>"),
        );
    }
}
