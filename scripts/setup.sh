#!/usr/bin/env bash
# Installs the system packages the build and tests need (idempotent; Debian/Ubuntu).
# cmake + libclang-dev: libipt-sys builds Intel's libipt with CMake and binds it with
# bindgen; pkg-config, strace: C-package and shim tests; build-essential: C tests;
# qemu-user: the QEMU backend (qemu-x86_64 runs programs with pttrace's TCG plugin);
# chromium + fonts-dejavu-core: crates/pttrace-cli/tests/browser.rs opens `pttrace view`'s
# pictures in headless Chromium (with a font so text renders in its screenshots), driven by
# the npm packages of crates/pttrace-cli/tests/browser (playwright-core, speedscope),
# installed below with `npm ci`. libc6-dbg, dwz: the symbolizer's tests and named libc/ld.so
# frames; golang-go: Go's asynchronous preemption under the QEMU backend; default-jdk-headless:
# the JVM's faults and safepoints under the QEMU backend; lcov (gcov's counts as the oracle)
# and bolt-16 (reads `pttrace profile --format bolt`): crates/pttrace-cli/tests/profile.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(build-essential cmake libclang-dev clang pkg-config strace qemu-user chromium fonts-dejavu-core libc6-dbg dwz golang-go default-jdk-headless gdb lcov bolt-16)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v cargo >/dev/null || { echo "setup: cargo not found: install the Rust toolchain (rustup)"; exit 1; }
# The browser test's npm packages (exact versions from its package-lock.json),
# installed again only when the lock file changed since the last install.
command -v npm >/dev/null || { echo "setup: npm not found: install Node.js (>= 18) and npm"; exit 1; }
browser=crates/pttrace-cli/tests/browser
lock=$browser/package-lock.json
stamp=$browser/node_modules/.setup-lock.json
if ! cmp -s "$lock" "$stamp"; then
  echo "setup: npm ci in $browser"
  (cd "$browser" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)
  cp "$lock" "$stamp"
fi
