#!/usr/bin/env bash
# Builds DynamoRIO from source into a cache folder, for the tests that run our
# libdrpttracer.so inside DynamoRIO (tests/dynamorio.rs) and for trying it by hand.
#
#   scripts/dynamorio.sh            build (or say that the cache is already complete)
#   scripts/dynamorio.sh --force    rebuild: configure and make again (keeps the sources)
#   scripts/dynamorio.sh --clean    remove the cache folder and build from scratch
#
# Cache layout (${PTTRACE_DYNAMORIO_DIR:-$HOME/.cache/pttrace/dynamorio}):
#   src/                DynamoRIO's tree at DYNAMORIO_COMMIT, with its submodules filled in:
#                       third_party/zlib, third_party/libipt (pinned commits) and
#                       third_party/elfutils (Debian's elfutils source package, see below)
#   build/              the release build tree:
#     bin64/drrun, cmake/ (DynamoRIO_DIR for find_package(DynamoRIO)),
#     clients/bin64/drmemtrace_launcher, clients/lib64/release/libdrmemtrace.so,
#     ext/lib64/release/libdrpttracer.so (DynamoRIO's own drpttracer)
#   elfutils/           the elfutils source package as downloaded by `apt-get source`
#   logs/               configure and make logs
#   stamp               what was built (commits, recipe); present only after a full success
#
# Environment:
#   PTTRACE_DYNAMORIO_DIR  cache folder (default $HOME/.cache/pttrace/dynamorio)
#   DYNAMORIO_SRC          an already extracted DynamoRIO tree to copy instead of using
#                          the mirror (its third_party submodules are filled in if empty)
#   DYNAMORIO_MIRROR       bare git repository of DynamoRIO
#                          (default /work/.mirror/DynamoRIO+dynamorio/repo)
#   DYNAMORIO_COMMIT       commit to build (default 05e316505beb..., the one REFERENCE.md
#                          section 11 was measured with)
#   ZLIB_MIRROR, LIBIPT_MIRROR   bare git repositories of madler/zlib and intel/libipt
#                          (default /work/.mirror/madler+zlib/repo, /work/.mirror/intel+libipt/repo)
#   ZLIB_COMMIT, LIBIPT_COMMIT   override the commits DynamoRIO pins for them
#   ELFUTILS_SRC           an extracted elfutils source tree (0.192 or one DynamoRIO's
#                          ext/drsyms/elfutils/*.patch apply to) instead of `apt-get source`
#   JOBS                   make parallelism (default 2); the build runs under `nice -n 10`
#
# Why each piece:
# - zlib: drmemtrace builds minizip from third_party/zlib/contrib/minizip (zip output).
# - libipt: DynamoRIO enables its PT post-processor (drpt2ir, drraw2trace's -enable_kernel
#   decoding) only when third_party/libipt/.git exists; a marker file stands in for it.
# - elfutils: ext/drsyms (which drmemtrace links) stops configuring with "Missing required
#   submodule third_party/elfutils" without it; at configure time it applies
#   ext/drsyms/elfutils/*.patch to a copy of three files with `patch -o` and builds libelf,
#   libdw, libdwelf, libebl as static PIC libraries with its own config.h. DynamoRIO's
#   submodule (its fork of elfutils) cannot be fetched here; Debian trixie's elfutils 0.192
#   source package takes those patches (bookworm's 0.188 does not), so a deb-src-only entry
#   for trixie is added in its own sources file when no 0.192 source is known to apt
#   (deb-src only: no trixie binary package becomes installable).
set -euo pipefail

DIR="${PTTRACE_DYNAMORIO_DIR:-$HOME/.cache/pttrace/dynamorio}"
DYNAMORIO_MIRROR="${DYNAMORIO_MIRROR:-/work/.mirror/DynamoRIO+dynamorio/repo}"
DYNAMORIO_COMMIT="${DYNAMORIO_COMMIT:-05e316505beb69586142243af1647449945772b7}"
ZLIB_MIRROR="${ZLIB_MIRROR:-/work/.mirror/madler+zlib/repo}"
LIBIPT_MIRROR="${LIBIPT_MIRROR:-/work/.mirror/intel+libipt/repo}"
# The commits DynamoRIO 05e31650 pins (`git ls-tree <commit> third_party/...`); used when
# the DynamoRIO tree comes from DYNAMORIO_SRC (no git history to ask).
ZLIB_PINNED_DEFAULT=51b7f2abdade71cd9bb0e7a373ef2610ec6f9daf
LIBIPT_PINNED_DEFAULT=c848a85c3104e2f5780741f85de5c9e65476ece2
ELFUTILS_VERSION=0.192
JOBS="${JOBS:-2}"
# Bump when the recipe changes, so that an old cache is rebuilt.
RECIPE=1
# drmgr & co. are built anyway for drmemtrace; named so that a client of our own
# (find_package(DynamoRIO) + use_DynamoRIO_extension) finds them in the build tree.
TARGETS=(drrun dynamorio drpreload drconfig drmemtrace drmemtrace_launcher drraw2trace
  drpttracer drmgr drx drreg drutil drwrap drsyms drcontainers)

SRC="$DIR/src"
BUILD="$DIR/build"
LOGS="$DIR/logs"
STAMP="$DIR/stamp"

say() { printf 'dynamorio.sh: %s\n' "$*"; }
die() {
  local code=$1
  shift
  printf 'dynamorio.sh: error: %s\n' "$*" >&2
  exit "$code"
}

# Step timing: `step NAME` starts a step; `done_step` prints its time and records it.
TIMES=()
step_name=""
step_start=0
now() { date +%s.%N; }
step() {
  step_name=$1
  step_start=$(now)
  say "== $step_name"
}
done_step() {
  local t
  t=$(awk -v a="$step_start" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
  TIMES+=("$(printf '%-26s %7ss' "$step_name" "$t")")
  say "   $step_name: ${t}s"
}

expected_outputs=(
  "$BUILD/bin64/drrun"
  "$BUILD/cmake/DynamoRIOConfig.cmake"
  "$BUILD/lib64/release/libdynamorio.so"
  "$BUILD/clients/bin64/drmemtrace_launcher"
  "$BUILD/clients/lib64/release/libdrmemtrace.so"
  "$BUILD/clients/bin64/drraw2trace"
  "$BUILD/ext/lib64/release/libdrpttracer.so"
  "$BUILD/ext/lib64/release/libdrmgr.so"
)

print_summary() {
  cat <<EOF
dynamorio.sh: DynamoRIO $(sed -n 's/^dynamorio_commit=//p' "$STAMP" 2>/dev/null) in $DIR
  drrun                 $BUILD/bin64/drrun
  DynamoRIO_DIR         $BUILD/cmake   (find_package(DynamoRIO))
  drmemtrace launcher   $BUILD/clients/bin64/drmemtrace_launcher
  drmemtrace client     $BUILD/clients/lib64/release/libdrmemtrace.so
  drraw2trace           $BUILD/clients/bin64/drraw2trace
  DR's drpttracer       $BUILD/ext/lib64/release/libdrpttracer.so
  sources               $SRC
  logs                  $LOGS
EOF
}

stamp_text() {
  cat <<EOF
recipe=$RECIPE
dynamorio_commit=$DYNAMORIO_COMMIT
zlib_commit=$1
libipt_commit=$2
elfutils=$3
targets=${TARGETS[*]}
EOF
}

force=0
case "${1:-}" in
  "") ;;
  --force) force=1 ;;
  --clean)
    say "removing $DIR"
    rm -rf "$DIR"
    ;;
  -h | --help)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
    ;;
  *) die 64 "unknown argument '$1' (use --force, --clean or --help)" ;;
esac

# ---- 0. Already built? --------------------------------------------------------------
if [ "$force" = 0 ] && [ -f "$STAMP" ] &&
  grep -qx "recipe=$RECIPE" "$STAMP" && grep -qx "dynamorio_commit=$DYNAMORIO_COMMIT" "$STAMP"; then
  all=1
  for f in "${expected_outputs[@]}"; do [ -e "$f" ] || all=0; done
  if [ "$all" = 1 ]; then
    say "already built (stamp $STAMP matches commit $DYNAMORIO_COMMIT, recipe $RECIPE): nothing to do"
    print_summary
    exit 0
  fi
  say "stamp present but outputs missing: building again"
fi
total_start=$(now)
mkdir -p "$DIR" "$LOGS"

# ---- 1. System packages ---------------------------------------------------------------
step "apt packages"
pkgs=(cmake make gcc g++ patch perl xz-utils dpkg-dev libsnappy-dev liblz4-dev zlib1g-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  $sudo apt-get update -qq || die 1 "apt-get update failed (network? run it by hand to see why)"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >"$LOGS/apt-install.log" 2>&1 ||
    die 1 "apt-get install ${missing[*]} failed: see $LOGS/apt-install.log"
else
  say "all present: ${pkgs[*]}"
fi
done_step

# ---- 2. DynamoRIO's source ------------------------------------------------------------
# Extracts tree `commit` of bare repository `repo` into `dest`, file by file, so that blobs
# missing from a partial snapshot are skipped (listed in dest/.pttrace-missing-blobs)
# instead of failing the whole extraction like `git archive` would. Submodule entries
# (mode 160000) are left as empty folders.
extract_tree() {
  local repo=$1 commit=$2 dest=$3
  local tmp="$dest.partial"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  local list="$tmp/.pttrace-tree"
  git --git-dir="$repo" ls-tree -r -z --full-tree "$commit" >"$list" ||
    die 1 "git ls-tree $commit failed in $repo"
  # Which blobs the snapshot has (one batch query instead of a process per file).
  local present="$tmp/.pttrace-present"
  tr '\0' '\n' <"$list" | awk '$2 == "blob" { print $3 }' |
    git --git-dir="$repo" cat-file --batch-check='%(objectname) %(objecttype)' |
    awk '$2 == "blob" { print $1 }' >"$present"
  local -A have=()
  local h
  while read -r h; do have[$h]=1; done <"$present"
  local n=0 skipped=0 meta mode type hash path
  : >"$tmp/.pttrace-missing-blobs"
  while IFS= read -r -d '' meta; do
    path=${meta#*$'\t'}
    read -r mode type hash <<<"${meta%%$'\t'*}"
    case "$type" in
      commit)
        mkdir -p "$tmp/$path"
        continue
        ;;
      blob) ;;
      *) continue ;;
    esac
    if [ -z "${have[$hash]:-}" ]; then
      printf '%s %s\n' "$hash" "$path" >>"$tmp/.pttrace-missing-blobs"
      skipped=$((skipped + 1))
      continue
    fi
    mkdir -p "$tmp/$(dirname "$path")"
    if [ "$mode" = 120000 ]; then
      ln -sfn "$(git --git-dir="$repo" cat-file blob "$hash")" "$tmp/$path"
    else
      git --git-dir="$repo" cat-file blob "$hash" >"$tmp/$path"
      if [ "$mode" = 100755 ]; then chmod +x "$tmp/$path"; fi
    fi
    n=$((n + 1))
  done <"$list"
  rm -f "$list" "$present"
  printf '%s\n' "$commit" >"$tmp/.pttrace-commit"
  rm -rf "$dest"
  mv "$tmp" "$dest"
  say "extracted $n files of $(basename "$(dirname "$repo")") $commit into $dest ($skipped missing from the snapshot, listed in $dest/.pttrace-missing-blobs)"
}

have_commit() { git --git-dir="$1" cat-file -e "$2^{commit}" 2>/dev/null; }

step "DynamoRIO source"
if [ -f "$SRC/.pttrace-commit" ] && [ "$(cat "$SRC/.pttrace-commit")" = "$DYNAMORIO_COMMIT" ] &&
  [ -f "$SRC/CMakeLists.txt" ]; then
  say "source already at $SRC ($DYNAMORIO_COMMIT)"
elif [ -n "${DYNAMORIO_SRC:-}" ]; then
  [ -f "$DYNAMORIO_SRC/CMakeLists.txt" ] && [ -d "$DYNAMORIO_SRC/ext/drpttracer" ] ||
    die 2 "DYNAMORIO_SRC=$DYNAMORIO_SRC is not a DynamoRIO source tree (no CMakeLists.txt or ext/drpttracer)"
  say "copying $DYNAMORIO_SRC into $SRC"
  rm -rf "$SRC.partial"
  cp -a "$DYNAMORIO_SRC" "$SRC.partial"
  rm -rf "$SRC.partial/.git"
  printf '%s\n' "$DYNAMORIO_COMMIT" >"$SRC.partial/.pttrace-commit"
  rm -rf "$SRC"
  mv "$SRC.partial" "$SRC"
elif [ -d "$DYNAMORIO_MIRROR" ] && have_commit "$DYNAMORIO_MIRROR" "$DYNAMORIO_COMMIT"; then
  extract_tree "$DYNAMORIO_MIRROR" "$DYNAMORIO_COMMIT" "$SRC"
else
  die 2 "no DynamoRIO source: neither DYNAMORIO_SRC nor commit $DYNAMORIO_COMMIT in the mirror
  $DYNAMORIO_MIRROR. Get it with:
    git clone https://github.com/DynamoRIO/dynamorio /path/to/dynamorio
    git -C /path/to/dynamorio checkout $DYNAMORIO_COMMIT
  and run again with DYNAMORIO_SRC=/path/to/dynamorio (submodules are filled in by this
  script; or set DYNAMORIO_MIRROR to a bare clone that has the commit)."
fi
done_step

# ---- 3. Submodules zlib and libipt ----------------------------------------------------
pinned_commit() { # sub-path default
  local c=""
  if [ -d "$DYNAMORIO_MIRROR" ] && have_commit "$DYNAMORIO_MIRROR" "$DYNAMORIO_COMMIT"; then
    c=$(git --git-dir="$DYNAMORIO_MIRROR" ls-tree "$DYNAMORIO_COMMIT" "$1" | awk '$2 == "commit" { print $3 }')
  fi
  printf '%s\n' "${c:-$2}"
}

# fill_submodule path mirror commit name url
fill_submodule() {
  local sub=$1 mirror=$2 commit=$3 name=$4 url=$5
  local dest="$SRC/$sub"
  if [ -f "$dest/.pttrace-commit" ] && [ "$(cat "$dest/.pttrace-commit")" = "$commit" ]; then
    say "$sub already at $commit"
    return
  fi
  if [ -n "$(ls -A "$dest" 2>/dev/null | grep -v '^\.pttrace' || true)" ] && [ ! -f "$dest/.pttrace-commit" ]; then
    say "$sub already populated (came with DYNAMORIO_SRC): kept as is"
    return
  fi
  [ -d "$mirror" ] || die 2 "no $name mirror at $mirror: clone $url (bare) there or set the
  variable naming it; DynamoRIO $DYNAMORIO_COMMIT pins $name at $commit"
  have_commit "$mirror" "$commit" || die 2 "$name commit $commit (pinned by DynamoRIO) is not in
  $mirror: fetch it into that repository, or set the commit variable to one that is there"
  extract_tree "$mirror" "$commit" "$dest"
}

step "submodules zlib, libipt"
ZLIB_COMMIT="${ZLIB_COMMIT:-$(pinned_commit third_party/zlib "$ZLIB_PINNED_DEFAULT")}"
LIBIPT_COMMIT="${LIBIPT_COMMIT:-$(pinned_commit third_party/libipt "$LIBIPT_PINNED_DEFAULT")}"
fill_submodule third_party/zlib "$ZLIB_MIRROR" "$ZLIB_COMMIT" zlib https://github.com/madler/zlib
fill_submodule third_party/libipt "$LIBIPT_MIRROR" "$LIBIPT_COMMIT" libipt https://github.com/intel/libipt
# DynamoRIO builds its PT post-processor only when third_party/libipt/.git exists.
[ -e "$SRC/third_party/libipt/.git" ] ||
  printf 'gitdir: (extracted by scripts/dynamorio.sh at %s)\n' "$LIBIPT_COMMIT" >"$SRC/third_party/libipt/.git"
done_step

# ---- 4. elfutils ----------------------------------------------------------------------
# True when every DynamoRIO elfutils patch applies to tree $1 (dry run).
patches_apply() {
  local tree=$1 p
  for p in "$SRC"/ext/drsyms/elfutils/*.patch; do
    patch -p1 --dry-run -s -d "$tree" -o /dev/null <"$p" >/dev/null 2>&1 || return 1
  done
}

step "elfutils $ELFUTILS_VERSION"
EU_DEST="$SRC/third_party/elfutils"
ELFUTILS_ID=""
if [ -f "$EU_DEST/.pttrace-elfutils" ]; then
  ELFUTILS_ID=$(cat "$EU_DEST/.pttrace-elfutils")
  say "elfutils already in place ($ELFUTILS_ID)"
elif [ -d "$EU_DEST/libelf" ]; then
  ELFUTILS_ID="came with DYNAMORIO_SRC"
  say "third_party/elfutils already populated: kept as is"
else
  eu_tree=""
  if [ -n "${ELFUTILS_SRC:-}" ]; then
    [ -d "$ELFUTILS_SRC/libelf" ] || die 2 "ELFUTILS_SRC=$ELFUTILS_SRC has no libelf/ folder"
    eu_tree=$ELFUTILS_SRC
    ELFUTILS_ID="ELFUTILS_SRC=$ELFUTILS_SRC"
  else
    eu_dl="$DIR/elfutils"
    eu_tree=$(find "$eu_dl" -maxdepth 1 -type d -name "elfutils-$ELFUTILS_VERSION*" 2>/dev/null | head -n1 || true)
    if [ -z "$eu_tree" ]; then
      # Does apt know a 0.192 source package? If not, add trixie as deb-src only.
      srcver() { apt-cache showsrc elfutils 2>/dev/null | sed -n 's/^Version: //p' | grep "^$ELFUTILS_VERSION-" | sort -V | tail -n1; }
      ver=$(srcver || true)
      if [ -z "$ver" ]; then
        list=/etc/apt/sources.list.d/pttrace-trixie-src.sources
        if [ ! -f "$list" ]; then
          say "adding a deb-src-only entry for Debian trixie ($list) for elfutils $ELFUTILS_VERSION's source"
          printf '%s\n' \
            "# Added by pttrace's scripts/dynamorio.sh: source packages only (elfutils $ELFUTILS_VERSION" \
            "# for building DynamoRIO); no trixie binary package becomes installable." \
            "Types: deb-src" \
            "URIs: http://deb.debian.org/debian" \
            "Suites: trixie" \
            "Components: main" \
            "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" | $sudo tee "$list" >/dev/null
        fi
        $sudo apt-get update -qq || die 1 "apt-get update failed after adding $list"
        ver=$(srcver || true)
        [ -n "$ver" ] || die 2 "apt knows no elfutils $ELFUTILS_VERSION source package even with $list.
  Get elfutils-$ELFUTILS_VERSION's source (https://sourceware.org/elfutils/ftp/$ELFUTILS_VERSION/)
  and run again with ELFUTILS_SRC=/path/to/elfutils-$ELFUTILS_VERSION"
      fi
      say "apt-get source elfutils=$ver"
      rm -rf "$eu_dl"
      mkdir -p "$eu_dl"
      # -o: the _apt sandbox user cannot write into root's home; download as root.
      (cd "$eu_dl" && apt-get source -q -o APT::Sandbox::User=root "elfutils=$ver") \
        >"$LOGS/apt-source.log" 2>&1 ||
        die 1 "apt-get source elfutils=$ver failed: see $LOGS/apt-source.log"
      eu_tree=$(find "$eu_dl" -maxdepth 1 -type d -name "elfutils-$ELFUTILS_VERSION*" | head -n1)
      [ -n "$eu_tree" ] || die 1 "apt-get source did not unpack an elfutils-$ELFUTILS_VERSION folder in $eu_dl (see $LOGS/apt-source.log)"
    fi
    ELFUTILS_ID="debian source $(basename "$eu_tree")"
  fi
  patches_apply "$eu_tree" || die 2 "DynamoRIO's ext/drsyms/elfutils/*.patch do not apply to $eu_tree:
  DynamoRIO $DYNAMORIO_COMMIT needs elfutils $ELFUTILS_VERSION (or its fork https://github.com/DynamoRIO/elfutils)"
  rm -rf "$EU_DEST"
  cp -a "$eu_tree" "$EU_DEST"
  printf '%s\n' "$ELFUTILS_ID" >"$EU_DEST/.pttrace-elfutils"
  say "elfutils from $eu_tree -> $EU_DEST"
fi
done_step

# ---- 5. Configure ---------------------------------------------------------------------
step "cmake configure"
if [ "$force" = 1 ] || [ ! -f "$BUILD/CMakeCache.txt" ] || [ ! -f "$BUILD/Makefile" ]; then
  rm -rf "$BUILD"
  mkdir -p "$BUILD"
  (cd "$BUILD" && nice -n 10 cmake -DBUILD_DOCS=OFF -DBUILD_TESTS=OFF -DBUILD_SAMPLES=OFF \
    -DDEBUG=OFF -DCMAKE_BUILD_TYPE=Release "$SRC") >"$LOGS/configure.log" 2>&1 || {
    tail -n 30 "$LOGS/configure.log" >&2
    die 1 "cmake configure failed: see $LOGS/configure.log"
  }
  grep -q 'libipt submodule is not initialized' "$LOGS/configure.log" &&
    say "warning: DynamoRIO did not see third_party/libipt: no PT post-processor"
else
  say "build tree already configured ($BUILD)"
fi
done_step

# ---- 6. Build -------------------------------------------------------------------------
step "make -j$JOBS (${#TARGETS[@]} targets)"
(cd "$BUILD" && nice -n 10 make -j"$JOBS" "${TARGETS[@]}") >"$LOGS/make.log" 2>&1 || {
  grep -E 'error|Error' "$LOGS/make.log" | head -n 20 >&2 || true
  die 1 "make failed: see $LOGS/make.log"
}
done_step

# ---- 7. Check and stamp ---------------------------------------------------------------
miss=()
for f in "${expected_outputs[@]}"; do [ -e "$f" ] || miss+=("$f"); done
[ ${#miss[@]} -eq 0 ] || die 1 "build finished but these are missing: ${miss[*]} (see $LOGS/make.log)"
stamp_text "$ZLIB_COMMIT" "$LIBIPT_COMMIT" "$ELFUTILS_ID" >"$STAMP"
say "times:"
for t in "${TIMES[@]}"; do printf '  %s\n' "$t"; done
printf '  %-26s %7ss\n' total "$(awk -v a="$total_start" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')"
print_summary
