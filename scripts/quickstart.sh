#!/usr/bin/env bash
# The README's two commands. From a fresh clone on Debian 12 each does all of the set-up:
# install missing packages, configure, build; then
#   quickstart.sh main   runs the project's main job (the end-to-end demo)
#   quickstart.sh test   runs the whole test suite (ctest)
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-main}
shift || true
bash scripts/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default
case "$what" in
  main) exec ./build/stowage demo "$@" ;;
  test) exec ctest --preset default "$@" ;;
  *) echo "usage: $0 main|test" >&2; exit 2 ;;
esac
