#!/usr/bin/env bash
# BOLT from a trace, measured: the Lua 5.4 interpreter (Debian's upstream source tarball,
# `apt-get source lua5.4`) built as BOLT needs it, a CPU-bound Lua script
# (benches/bolt/bench.lua: recursion, sorts, string.format/gsub/gmatch, metatables) traced
# briefly under the QEMU backend, `pttrace profile --format bolt`, and BOLT 16 with that
# profile against the same build without BOLT and against BOLT's own instrumentation
# profile of the same short run. Paired rounds in alternating order; medians of ratios.
#
#   scripts/bolt_bench.sh [ROUNDS]      (default 12; needs bolt-16 and qemu-user)
#
# Everything is built in ~/.cache/pttrace/bolt (LUA_BOLT_DIR to change it).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ROUNDS=${1:-12}
WORK=${LUA_BOLT_DIR:-$HOME/.cache/pttrace/bolt}
SCRIPT=$ROOT/benches/bolt/bench.lua
TRACE_SCALE=3   # the traced run (about 1.1 G instructions)
RUN_SCALE=50    # the timed runs (about 1.5 s natively)
mkdir -p "$WORK"
for tool in llvm-bolt-16 qemu-x86_64; do
  command -v $tool >/dev/null || { echo "bolt_bench: $tool is missing (scripts/setup.sh installs it)" >&2; exit 1; }
done

# Lua's upstream sources, from Debian's source package (its orig tarball: Debian's patches
# add a multiarch header this build does not need).
if [ ! -d "$WORK/lua/src" ]; then
  (cd "$WORK" && rm -rf src-pkg && mkdir src-pkg && cd src-pkg && apt-get source --download-only lua5.4 >/dev/null) || {
    echo "bolt_bench: apt-get source lua5.4 failed: add a deb-src entry (scripts/dynamorio.sh adds one for trixie)" >&2
    exit 1
  }
  rm -rf "$WORK/lua" && mkdir "$WORK/lua"
  tar xzf "$WORK"/src-pkg/lua5.4_*.orig.tar.gz -C "$WORK/lua" --strip-components=1
fi

# BOLT 16 needs relocations (--emit-relocs), a non-PIE executable and no hot/cold
# splitting by gcc (with Debian gcc's defaults every BOLT'ed Lua crashed).
FLAGS="-O2 -g -fno-pie -no-pie -fno-reorder-blocks-and-partition -Wl,--emit-relocs"
LUA=$WORK/lua.base
if [ ! -x "$LUA" ]; then
  (cd "$WORK/lua/src" && gcc $FLAGS -DLUA_COMPAT_5_3 -DLUA_USE_LINUX -o "$LUA" \
     $(ls *.c | grep -v '^luac\.c$') -lm -ldl)
fi
cargo build --release -q -p pttrace-cli -p pttrace-qemu
PTTRACE=$ROOT/target/release/pttrace

secs() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N); echo "$t1 - $t0" | bc; }

echo "native run of the traced input: $(secs "$LUA" "$SCRIPT" $TRACE_SCALE) s"
rm -rf "$WORK/trace"
echo "traced (QEMU backend): $(secs "$PTTRACE" run --quiet -o "$WORK/trace" -- "$LUA" "$SCRIPT" $TRACE_SCALE) s"
echo "pttrace profile --format bolt: $(secs "$PTTRACE" profile "$WORK/trace" --format bolt -o "$WORK/trace.pa") s"
echo "pttrace decode --format summary: $(secs "$PTTRACE" decode "$WORK/trace" --format summary) s"

OPTS=(-reorder-blocks=ext-tsp -reorder-functions=hfsort -split-functions -split-all-cold -dyno-stats)
llvm-bolt-16 "$LUA" -o "$WORK/lua.trace" -pa -p "$WORK/trace.pa" "${OPTS[@]}" >"$WORK/bolt-trace.log" 2>&1
grep -E "PERF2BOLT: (read|traces)|non-empty execution|taken branches" "$WORK/bolt-trace.log" | sed 's/^/  trace profile: /'

# The reference: BOLT's own instrumentation of the same short run (BOLT prefixes the
# runtime library's path with /usr/lib/).
llvm-bolt-16 "$LUA" -instrument -o "$WORK/lua.instr" -instrumentation-file="$WORK/instr.fdata" \
  -runtime-instrumentation-lib=llvm-16/lib/libbolt_rt_instr.a >"$WORK/bolt-instr.log" 2>&1
rm -f "$WORK/instr.fdata"
"$WORK/lua.instr" "$SCRIPT" $TRACE_SCALE >/dev/null
llvm-bolt-16 "$LUA" -o "$WORK/lua.instrumented" -data="$WORK/instr.fdata" "${OPTS[@]}" >"$WORK/bolt-ref.log" 2>&1
grep -E "non-empty execution|taken branches|stale" "$WORK/bolt-ref.log" | sed 's/^/  instrumentation profile: /'

want=$("$LUA" "$SCRIPT" $RUN_SCALE)
for b in lua.trace lua.instrumented; do
  got=$("$WORK/$b" "$SCRIPT" $RUN_SCALE)
  [ "$got" = "$want" ] || { echo "bolt_bench: $b prints $got, not $want" >&2; exit 1; }
done

# Paired rounds, the order rotating with the round.
: >"$WORK/rounds.txt"
for r in $(seq 1 "$ROUNDS"); do
  declare -A t=()
  order=(lua.base lua.trace lua.instrumented)
  for k in $(seq 0 2); do
    b=${order[$(( (k + r) % 3 ))]}
    t[$b]=$(secs "$WORK/$b" "$SCRIPT" $RUN_SCALE)
  done
  echo "${t[lua.base]} ${t[lua.trace]} ${t[lua.instrumented]}" >>"$WORK/rounds.txt"
  echo "round $r: base ${t[lua.base]} s, trace-BOLT ${t[lua.trace]} s, instrumentation-BOLT ${t[lua.instrumented]} s"
done
python3 - "$WORK/rounds.txt" <<'EOF'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
med = lambda xs: statistics.median(xs)
base, trace, instr = zip(*rows)
r_trace = [b / t for b, t, _ in rows]
r_instr = [b / i for b, _, i in rows]
r_pair = [i / t for _, t, i in rows]
print(f"medians of {len(rows)} paired rounds: base {med(base):.3f} s, BOLT with the trace's "
      f"profile {med(trace):.3f} s, with BOLT's instrumentation profile {med(instr):.3f} s")
print(f"speed-up: trace profile {med(r_trace):.3f}x ({min(r_trace):.3f}..{max(r_trace):.3f}), "
      f"instrumentation profile {med(r_instr):.3f}x; trace vs instrumentation {med(r_pair):.3f}")
EOF
