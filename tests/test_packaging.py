"""The published distribution: the sdist and the wheel as a user gets them, and the installed console script.

Both are built the way ``make dist`` builds them (``python -m build --no-isolation``: the sdist, then the wheel from
the unpacked sdist, with this environment's setuptools and no download), from a copy of the checkout's files
(``git ls-files``), so the checkout itself gets no ``build/`` or ``*.egg-info`` output. The wheel is installed into
a fresh venv with ``--no-deps``; that venv then sees this environment's site-packages (torch, pytest, ...) through
a ``.pth`` line that appends the folder to ``sys.path``. Such a line does not process that folder's own ``.pth``
files, so the checkout's editable install stays invisible there: ``lightning_optimizer`` is the installed wheel's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
DISTRIBUTION = PYPROJECT["project"]["name"]
VERSION = PYPROJECT["project"]["version"]
PACKAGE_DIRS: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]
"""``lightning_optimizer.spec`` -> ``spec``: each package and the checkout folder it is built from."""

# The optional imports at module top, the extra that brings each, and the module whose absence is reported.
OPTIONAL_MODULES = {
    "lightning_optimizer.reference.lightning": ("lightning", "lightning"),
    "lightning_optimizer.reference.pytorch_lightning": ("pytorch-lightning", "pytorch_lightning"),
    "lightning_optimizer.peers.lightning": ("peers", "pytorch_lightning"),
    "lightning_optimizer.peers.fabric": ("peers", "lightning_fabric"),
    "lightning_optimizer.peers.accelerate": ("peers", "accelerate"),
}

# A hang guard, never a speed check: the longest step (a build, an install, a suite run) took 11 s on 2 cores beside
# other jobs (load 3.5); 600 s is 55 times that.
TIMEOUT_S = 600
# Two fast checks of the suite for the installed console script.
FAST_CHECKS = ("test_wrapper_surface", "test_true_steps_now")

# The variables of this environment that would change what the fresh venv imports or how pytest runs there.
_DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTEST_ADDOPTS", "PYTEST_PLUGINS")


def _run(command: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    completed = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    assert completed.returncode == 0, (
        f"{command} exited {completed.returncode}\n--- stdout\n{completed.stdout}\n--- stderr\n{completed.stderr}"
    )
    return completed


@dataclass(frozen=True)
class Dist:
    sdist: Path
    wheel: Path
    sources: Path
    """The copy of the checkout they were built from."""


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """The sdist and the wheel built from a copy of the checkout's tracked and untracked, not ignored, files."""
    sources = tmp_path_factory.mktemp("sources")
    listed = _run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT).stdout
    for name in filter(None, listed.split("\0")):
        path = ROOT / name
        if path.is_file():  # a tracked file deleted in the work tree is not part of it
            (sources / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, sources / name)
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(sources)], cwd=out)
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return Dist(sdist=sdist, wheel=wheel, sources=sources)


def test_the_sdist_carries_the_packages_and_no_tests(dist: Dist) -> None:
    with tarfile.open(dist.sdist) as archive:
        names = {name.partition("/")[2] for name in archive.getnames()}
    assert dist.sdist.name == f"{DISTRIBUTION.replace('-', '_')}-{VERSION}.tar.gz"
    assert {"pyproject.toml", "README.md", "LICENSE", "PKG-INFO"} <= names
    assert not [name for name in names if name == "tests" or name.startswith("tests/")], "the sdist carries tests"
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]
    for folder in PACKAGE_DIRS.values():
        assert f"{folder}/__init__.py" in names
        assert f"{folder}/py.typed" in names


def test_the_wheel_carries_every_package_file_its_license_and_no_tests(dist: Dist) -> None:
    with zipfile.ZipFile(dist.wheel) as archive:
        names = set(archive.namelist())
        info = f"{DISTRIBUTION.replace('-', '_')}-{VERSION}.dist-info"
        metadata = archive.read(f"{info}/METADATA").decode()
        license_text = archive.read(f"{info}/licenses/LICENSE").decode()
    assert {name.split("/")[0] for name in names} == {"lightning_optimizer", info}, "only the packages, no tests"
    assert "Apache License" in license_text
    assert "Version 2.0, January 2004" in license_text
    assert "Copyright 2026 The lightning-optimizer authors" in license_text
    headers = metadata.partition("\n\n")[0].splitlines()
    assert f"Version: {VERSION}" in headers
    assert "License-Expression: Apache-2.0" in headers
    assert "License-File: LICENSE" in headers
    assert "Classifier: Typing :: Typed" in headers
    # Every file of the packages' folders (data files such as py.typed included) is in the wheel.
    for package, folder in PACKAGE_DIRS.items():
        prefix = package.replace(".", "/")
        expected = {
            f"{prefix}/{path.relative_to(dist.sources / folder).as_posix()}"
            for path in (dist.sources / folder).rglob("*")
            if path.is_file() and "__pycache__" not in path.parts
        }
        assert f"{prefix}/py.typed" in expected
        missing = expected - names
        assert not missing, f"files of {folder}/ the wheel lacks (pyproject.toml's package-data): {sorted(missing)}"


@pytest.fixture(scope="module")
def fresh_venv(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv with the wheel installed and this environment's site-packages appended to its ``sys.path``."""
    root = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=False).create(root)
    python, wheel = root / "bin" / "python", dist.wheel
    # Installed before the .pth exists: pip sees an empty environment, and no other copy of the distribution.
    _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        cwd=root,
    )
    site_packages = Path(
        _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=root).stdout.strip()
    )
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    lines = "".join(f"import sys; sys.path.append({path!r})\n" for path in ours)
    (site_packages / "_dependencies_of_the_test_environment.pth").write_text(lines, encoding="utf-8")
    return root


def _fresh_env(root: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in _DROPPED_ENV}
    env["PATH"] = f"{root / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(root)
    return env


def test_the_installed_packages_are_the_wheels_with_its_version(fresh_venv: Path, tmp_path: Path) -> None:
    program = textwrap.dedent(
        f"""
        import importlib, importlib.metadata, json
        packages = {sorted(PACKAGE_DIRS)!r}
        modules = [importlib.import_module(name) for name in packages]
        distribution = importlib.metadata.distribution({DISTRIBUTION!r})
        print(json.dumps({{
            "files": [module.__file__ for module in modules],
            "versions": [module.__version__ for module in modules],
            "metadata": distribution.version,
            "location": str(distribution.locate_file("")),
        }}))
        """
    )
    found = json.loads(_run([str(fresh_venv / "bin" / "python"), "-c", program], cwd=tmp_path).stdout)
    venv_root = fresh_venv.resolve()
    for file in found["files"]:
        assert Path(file).resolve().is_relative_to(venv_root), f"{file} is not the installed wheel's"
        assert not Path(file).resolve().is_relative_to(ROOT), f"{file} is the checkout's"
    assert Path(found["location"]).resolve().is_relative_to(venv_root)
    assert found["metadata"] == VERSION
    assert found["versions"] == [VERSION] * len(PACKAGE_DIRS)


def test_the_installed_console_script_runs_a_users_implementation(fresh_venv: Path, tmp_path: Path) -> None:
    (tmp_path / "my_impl.py").write_text(
        textwrap.dedent(
            """
            from pathlib import Path

            import lightning_optimizer.conformance
            from lightning_optimizer.reference.suite_info import conformance_info

            __all__ = ["conformance_info"]

            Path(__file__).with_name("suite_location.txt").write_text(lightning_optimizer.conformance.__file__)
            """
        ),
        encoding="utf-8",
    )
    env = _fresh_env(fresh_venv)
    command = [str(fresh_venv / "bin" / "lightning-optimizer-conformance"), "--impl=my_impl"]
    command += ["-k", " or ".join(FAST_CHECKS), "--devices=cpu", "--precisions=32-true", "--world-sizes=1"]
    command += ["--matrix=full"]  # a row per check
    completed = _run(command, cwd=tmp_path, env=env)
    output = completed.stdout + completed.stderr
    assert re.search(rf"\b{len(FAST_CHECKS)} passed\b", output), output
    for check in FAST_CHECKS:
        assert re.search(rf"^{check}\s+ok\s*$", output, flags=re.MULTILINE), output
    suite = Path((tmp_path / "suite_location.txt").read_text(encoding="utf-8")).resolve()
    assert suite.is_relative_to(fresh_venv.resolve()), f"the suite ran from {suite}, not the installed wheel"


def test_optional_imports_name_the_extra_to_install(tmp_path: Path) -> None:
    """Without the optional packages each module that needs one says which extra brings it."""
    blocked = sorted({"pytorch_lightning", "lightning_fabric", "lightning", "accelerate"})
    program = textwrap.dedent(
        f"""
        import importlib, json, sys

        class Missing:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {blocked!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        sys.meta_path.insert(0, Missing())
        found = {{}}
        for module in {sorted(OPTIONAL_MODULES)!r}:
            try:
                importlib.import_module(module)
            except ImportError as error:
                found[module] = [type(error).__name__, error.name, str(error)]
            else:
                found[module] = None
        print(json.dumps(found))
        """
    )
    found = json.loads(_run([sys.executable, "-c", program], cwd=tmp_path).stdout)
    for module, (extra, missing) in OPTIONAL_MODULES.items():
        assert found[module] is not None, f"{module} imported without {missing}"
        kind, name, message = found[module]
        assert kind == "ModuleNotFoundError"
        assert name == missing, f"{module}: ModuleNotFoundError.name is {name!r}, not {missing!r}"
        assert f"pip install '{DISTRIBUTION}[{extra}]'" in message, message


def _extras_closure(extra: str) -> list[Requirement]:
    """The requirements of ``extra``, with the project's own extras it names expanded."""
    found: list[Requirement] = []
    for line in PYPROJECT["project"]["optional-dependencies"][extra]:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) == canonicalize_name(DISTRIBUTION):
            for inner in sorted(requirement.extras):
                found += _extras_closure(inner)
        else:
            found.append(requirement)
    return found


def test_dev_requirements_pin_the_dev_extra() -> None:
    """``requirements/dev.txt`` pins exactly the ``dev`` extra, the other dependencies but torch, and the backend."""
    pins: dict[str, str] = {}
    for line in (ROOT / "requirements" / "dev.txt").read_text(encoding="utf-8").splitlines():
        line = line.partition("#")[0].strip()
        if line:
            name, separator, version = line.partition("==")
            assert separator, f"requirements/dev.txt: {line!r} is not a pin (name==version)"
            pins[canonicalize_name(name)] = version.strip()
    wanted = _extras_closure("dev")
    wanted += [Requirement(line) for line in PYPROJECT["project"]["dependencies"]]
    wanted += [Requirement(line) for line in PYPROJECT["build-system"]["requires"]]
    wanted = [requirement for requirement in wanted if canonicalize_name(requirement.name) != "torch"]  # Makefile
    names = {canonicalize_name(requirement.name) for requirement in wanted}
    assert set(pins) == names, f"pinned, not wanted: {sorted(set(pins) - names)}; unpinned: {sorted(names - set(pins))}"
    for requirement in wanted:
        pin = pins[canonicalize_name(requirement.name)]
        assert requirement.specifier.contains(pin, prereleases=True), f"{requirement.name}=={pin} is not {requirement}"


def test_the_package_map_is_one_folder_per_subpackage_as_the_readme_says() -> None:
    """``pyproject.toml`` maps ``<folder>/`` onto ``lightning_optimizer.<folder>``, and the README's Layout says so."""
    setuptools = PYPROJECT["tool"]["setuptools"]
    mapping: dict[str, str] = setuptools["package-dir"]
    assert mapping == {
        f"lightning_optimizer.{folder}": folder for folder in ("spec", "reference", "conformance", "peers")
    }
    for package, folder in mapping.items():
        assert (ROOT / folder / "__init__.py").is_file(), f"{package} maps onto {folder}/, which is not a package"
    subpackages = {
        f"lightning_optimizer.{path.parent.relative_to(ROOT).as_posix().replace('/', '.')}"
        for folder in mapping.values()
        for path in (ROOT / folder).rglob("__init__.py")
    }
    assert subpackages == set(setuptools["packages"]), "every package folder is listed in [tool.setuptools] packages"
    layout = (ROOT / "README.md").read_text(encoding="utf-8").split("## Layout", 1)[1]
    for package, folder in mapping.items():
        assert re.search(rf"^{folder}/\s+{re.escape(package)}\s", layout, re.MULTILINE), f"README Layout: {folder}/"
