#!/usr/bin/env bash
# Installs the Debian packages stowage builds with, when any is missing.
# As root it runs apt-get; otherwise it prints the exact command to run.
set -euo pipefail
pkgs=(build-essential cmake pkg-config git python3 python3-pytest python3-torch python3-pip python3-setuptools
      libnuma-dev libhwloc-dev libjemalloc-dev libspdlog-dev libfmt-dev
      libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev libdlpack-dev
      clang libclang-rt-14-dev clang-format clang-tidy libxml2-utils)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "stowage needs: ${missing[*]}" >&2
  echo "run as root:  $cmd" >&2
  exit 1
fi
echo "installing: ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
