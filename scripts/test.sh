#!/usr/bin/env bash
# The whole test suite: cargo tests (unit, integration, doc), clippy/fmt, then the C tests
# through CMake + ctest against the same debug build.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
cargo build --lib --bins
cargo test
# The QEMU plugin's unit tests (its library is `test = false`: a plain `cargo test`
# skips them; their test binary links, the plugin symbols only referenced).
cargo test -p pttrace-qemu --lib
rm -rf build/ctest
cmake -S . -B build/ctest -DDRPTTRACER_PROFILE=debug >/dev/null
cmake --build build/ctest -j2
ctest --test-dir build/ctest --output-on-failure
