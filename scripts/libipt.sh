#!/usr/bin/env bash
# Builds libipt's own tools (pttc, ptdump) from source into a cache folder, for the test
# that runs libipt's test corpus through `pttrace dump` (crates/pttrace-cli/tests/
# libipt_corpus.rs) and for comparing by hand.
#
#   scripts/libipt.sh            build (or say that the cache is already complete)
#   scripts/libipt.sh --clean    remove the cache folder and build from scratch
#
# Cache layout (${PTTRACE_LIBIPT_DIR:-$HOME/.cache/pttrace/libipt}):
#   src/                libipt's tree at LIBIPT_COMMIT; src/test/src/*.ptt is the corpus
#   build/bin/pttc      turns a .ptt (assembly + PT packet directives) into the .pt trace,
#                       the code and the expected outputs (it runs yasm)
#   build/bin/ptdump    the reference packet listing
#   logs/               configure and make logs
#   stamp               what was built; present only after a full success
#
# Environment:
#   PTTRACE_LIBIPT_DIR  cache folder (default $HOME/.cache/pttrace/libipt)
#   LIBIPT_SRC          an already extracted libipt tree to copy instead of the mirror
#   LIBIPT_MIRROR       bare git repository of intel/libipt
#                       (default /work/.mirror/intel+libipt/repo)
#   LIBIPT_COMMIT       commit to build (default: the mirror's HEAD)
#   JOBS                make parallelism (default 2); the build runs under `nice -n 10`
#
# Needs cmake, a C compiler and yasm (Debian: apt-get install cmake build-essential yasm).
set -euo pipefail

DIR="${PTTRACE_LIBIPT_DIR:-$HOME/.cache/pttrace/libipt}"
LIBIPT_MIRROR="${LIBIPT_MIRROR:-/work/.mirror/intel+libipt/repo}"
JOBS="${JOBS:-2}"
STAMP="$DIR/stamp"

die() {
	echo "scripts/libipt.sh: $*" >&2
	exit 1
}

if [[ "${1:-}" == "--clean" ]]; then
	rm -rf "$DIR"
elif [[ -n "${1:-}" ]]; then
	die "unknown argument '$1' (use --clean or nothing)"
fi

for tool in cmake cc make yasm; do
	command -v "$tool" >/dev/null ||
		die "$tool is missing (Debian: apt-get install cmake build-essential yasm)"
done

if [[ -n "${LIBIPT_SRC:-}" ]]; then
	[[ -f "$LIBIPT_SRC/pttc/CMakeLists.txt" ]] || die "LIBIPT_SRC=$LIBIPT_SRC: no pttc/CMakeLists.txt there"
	want="src:$(cd "$LIBIPT_SRC" && pwd)"
else
	[[ -d "$LIBIPT_MIRROR" ]] ||
		die "no libipt source: $LIBIPT_MIRROR does not exist (set LIBIPT_MIRROR to a bare clone of github.com/intel/libipt, or LIBIPT_SRC to an extracted tree)"
	commit="${LIBIPT_COMMIT:-$(git --git-dir="$LIBIPT_MIRROR" rev-parse HEAD)}"
	want="commit:$commit"
fi

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
	echo "libipt tools already built in $DIR ($want)"
	exit 0
fi

rm -rf "$DIR/src" "$DIR/build" "$STAMP"
mkdir -p "$DIR/src" "$DIR/build" "$DIR/logs"
if [[ -n "${LIBIPT_SRC:-}" ]]; then
	cp -a "$LIBIPT_SRC/." "$DIR/src/"
else
	git --git-dir="$LIBIPT_MIRROR" archive "$commit" | tar -x -C "$DIR/src"
fi

echo "configuring libipt ($want) in $DIR/build"
(cd "$DIR/build" && cmake "$DIR/src" -DPTTC=ON -DPTDUMP=ON -DCMAKE_BUILD_TYPE=Release) \
	>"$DIR/logs/configure.log" 2>&1 || die "configure failed: see $DIR/logs/configure.log"
echo "building pttc and ptdump"
(cd "$DIR/build" && nice -n 10 make -j"$JOBS" pttc ptdump) >"$DIR/logs/make.log" 2>&1 ||
	die "make failed: see $DIR/logs/make.log"
for b in pttc ptdump; do
	[[ -x "$DIR/build/bin/$b" ]] || die "$DIR/build/bin/$b was not built: see $DIR/logs/make.log"
done
echo "$want" >"$STAMP"
echo "built $DIR/build/bin/pttc and $DIR/build/bin/ptdump; corpus: $DIR/src/test/src ($(ls "$DIR/src/test/src"/*.ptt | wc -l) .ptt files)"
