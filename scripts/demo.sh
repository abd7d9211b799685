#!/usr/bin/env bash
# The main job: build, check the machine, trace a real program (/bin/ls) in user mode
# (Intel PT hardware when present, otherwise the QEMU backend, or single-stepping where
# qemu-x86_64 is missing), decode it and draw it (timeline + flame graph).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --lib --bins
out=${1:-/tmp/pttrace-demo}
rm -rf "$out"
./target/release/pttrace check
./target/release/pttrace run --out "$out" -- /bin/ls /
./target/release/pttrace report "$out"
./target/release/pttrace decode "$out" --format summary
echo "first decoded instructions of the trace (pttrace decode $out --format disasm):"
# head closes the pipe early on purpose: the pipeline's status is head's.
(set +o pipefail; ./target/release/pttrace decode "$out" --format disasm | head -n 25)
# The pictures: a timeline (Chrome trace JSON: ui.perfetto.dev, speedscope), a flame graph
# and collapsed stacks; view prints where they are.
./target/release/pttrace view "$out"
