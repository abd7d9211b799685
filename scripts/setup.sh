#!/usr/bin/env bash
# Installs the system packages the build and tests need (idempotent; Debian/Ubuntu).
# cmake + libclang-dev: libipt-sys builds Intel's libipt with CMake and binds it with
# bindgen; pkg-config, strace: C-package and shim tests; build-essential: C tests;
# qemu-user: the QEMU backend (qemu-x86_64 runs programs with pttrace's TCG plugin).
set -euo pipefail
pkgs=(build-essential cmake libclang-dev clang pkg-config strace qemu-user)
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
