"""The package needs neither PyTorch nor a compiler, and pip installs it."""
from conftest import PACKAGE_ROOT


def test_imports_and_allocates_without_torch(python):
    r = python("import sys\n"
               "sys.modules['torch'] = None  # any import of torch now fails\n"
               "import stowage\n"
               "p = stowage.raw_alloc(1 << 20)\n"
               "print(stowage.memory_allocated() >= 1 << 20)\n"
               "stowage.raw_free(p, 1 << 20)\n"
               "b = stowage.empty((3, 5), 'bfloat16')\n"
               "print(b.shape, b.dtype, b.nbytes)\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["True", "(3, 5) bfloat16 30"], r.stdout


def test_stowage_torch_says_it_needs_torch(python):
    r = python("import sys\nsys.modules['torch'] = None\nimport stowage.torch\n"
               "try: stowage.torch.enable()\n"
               "except stowage.StowageError as e: print(e)\n")
    assert r.returncode == 0, r.stderr
    assert "stowage.torch needs PyTorch" in r.stdout, r.stdout


def test_pip_installs_the_package(python, tmp_path):
    import shutil
    import subprocess
    import sys
    source = tmp_path / "src"
    shutil.copytree(PACKAGE_ROOT, source, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info"))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                        "--no-index", "--target", str(tmp_path / "site"), str(source)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    shim = tmp_path / "site" / "stowage" / "_shim"
    assert (shim / "torch_allocator.cpp").is_file() and (shim / "stowage.h").is_file()
    r = python("import sys; sys.path.insert(0, %r)\n"
               "import stowage\nassert stowage.__file__.startswith(%r)\n"
               "p = stowage.raw_alloc(4096); stowage.raw_free(p, 4096); print('ok')"
               % (str(tmp_path / "site"), str(tmp_path / "site")))
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_the_library_path_is_a_file_when_the_loader_found_it_by_name(python, tmp_path):
    """After `cmake --install`, find_library gives a bare soname: path() (what the drop-in's shim
    links and PyTorch's pluggable allocator loads) is still the file the loader mapped."""
    import os
    import stowage
    real = os.path.realpath(stowage._lib.path())
    os.symlink(real, tmp_path / "libstowage.so.0")
    r = python("import os, stowage\n"
               "from stowage import _lib\n"
               "print(_lib.library()._name)\n"
               "print(_lib.path())\n",
               env={"STOWAGE_LIBRARY": "libstowage.so.0", "LD_LIBRARY_PATH": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    name, path = r.stdout.split()
    assert name == "libstowage.so.0"
    assert path == str(tmp_path / "libstowage.so.0")
    assert os.path.realpath(path) == real
