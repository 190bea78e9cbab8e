# moraine developer recipes. `just --list` shows them. Nothing here is needed to build or test:
# the README's two commands work without `just`.

# Formatting, lints (warnings are errors) on every feature combination, and docs; CI runs it
# before the tests.
check:
    ./integration/check

# Everything the README's test command runs.
test:
    ./integration/run-tests

# The TiKV backend's suite against the in-process fake cluster (or a real one with PD_ADDRS).
test-tikv:
    cargo test --locked --features tikv --all-targets

# Serve on the embedded default.
serve *ARGS:
    cargo run -- serve {{ARGS}}

# Regenerate the checked-in protobuf code from proto/ (uses a vendored protoc).
proto:
    cargo run --manifest-path proto/gen/Cargo.toml

# Regenerate the fake TiKV cluster's gRPC server stubs (integration/fake_tikv/generated) from
# the kvproto files in the tikv-client crate (build with --features tikv once to download it).
proto-tikv:
    cargo run --manifest-path proto/tikv-gen/Cargo.toml

# Print the golden key and value vectors as the code produces them now. Never rewrites them.
golden:
    cargo test --lib golden -- --nocapture

# Fuzzes every target (moraine::fuzz) for SECONDS each with libFuzzer: nightly Rust, and
# cargo-fuzz, installed here when missing. The dev profile (with AddressSanitizer) builds in
# about 20 minutes on two cores; an optimized fuzz build of the dependencies takes far longer. The test suite runs the same targets briefly on
# stable (`cargo test --lib fuzz`; MORAINE_FUZZ_RUNS sets how many inputs per target).
fuzz SECONDS="60":
    command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
    for target in key value fold ingest sql; do cargo +nightly fuzz run --dev "$target" -- -max_total_time={{SECONDS}} || exit 1; done

# Benchmarks (release profile).
bench:
    cargo bench

# Writes benches/results/compare-SCALE.{json,md} from a release build; builds its own venv
# (benches/compare-env); needs initdb/pg_ctl/postgres on PATH for the PostgreSQL column; never
# run by the test suite. (SCALE: small = 10k mappings, medium = 100k, large = 1M.)
# moraine against PostgreSQL 15, SQLite and a Flight transport anchor, on a synthetic catalog.
bench-compare SCALE="medium":
    cargo build --release --locked --bin moraine
    benches/compare-env --scale {{SCALE}} --binary "$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/release/moraine"
