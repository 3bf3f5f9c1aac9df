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
# The Python package for Debian's python3 (the interpreter python3-torch serves), with this build's
# libstowage.so inside it, so `import stowage` works from any folder. Built from a copy in build/
# (pip leaves its build files beside the sources); Debian marks its Python externally managed
# (PEP 668), so pip needs --break-system-packages and writes under /usr/local (or ~/.local).
py=/usr/bin/python3
staging=build/python-package
rm -rf "$staging" && mkdir -p "$staging" && cp -r python/pyproject.toml python/README.md python/stowage "$staging/"
cp -L build/libstowage.so "$staging/stowage/libstowage.so"
user=()
[[ $(id -u) == 0 ]] || user=(--user)
"$py" -m pip install --quiet --no-deps --no-build-isolation --break-system-packages "${user[@]}" "$staging"
(cd / && env -u STOWAGE_LIBRARY "$py" -c 'import stowage; stowage.device_count()') ||
  { echo "quickstart: the installed stowage package does not load its library" >&2; exit 1; }
case "$what" in
  main) exec ./build/stowage demo "$@" ;;
  test) exec ctest --preset default "$@" ;;
  *) echo "usage: $0 main|test" >&2; exit 2 ;;
esac
