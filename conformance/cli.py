"""``lightning-optimizer-conformance``: run the installed suite against an implementation.

Every argument goes to pytest, e.g. ``lightning-optimizer-conformance --impl=my_module --precisions=32-true
--report-json=conformance.json``. As with ``python -m``, ``--impl`` is imported with the current folder first on
the module path. The suite runs under its own pytest configuration (``suite.ini`` beside this module), never the
caller's: a ``pytest.ini``, ``pyproject.toml``, ``tox.ini``, ``setup.cfg`` or ``conftest.py`` of the folder it
runs in changes nothing (not ``python_files``, not ``addopts``, not the warning filters). Flags given on the
command line still apply, after the suite's own (``-o``, ``-W``, ``-p``, ``-x``, ...). The rootdir, and so
pytest's cache, is the current folder.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

__all__ = ["SUITE_CONFIG", "main", "pytest_arguments"]

SUITE_CONFIG = Path(__file__).with_name("suite.ini")
"""The suite's own pytest configuration, used instead of any the caller's folder has."""

INSTALL_HINT = "pip install 'lightning-optimizer[conformance]'"
NEEDS = ("pytest", "hypothesis", "mypy")
"""What the suite runs on besides the package's own dependencies (the ``conformance`` extra)."""


def pytest_arguments(args: list[str], cwd: Path) -> list[str]:
    """The pytest command line that runs the installed suite in ``cwd`` with ``args``, the caller's flags."""
    package = Path(__file__).parent
    return [
        f"--config-file={SUITE_CONFIG}",
        f"--rootdir={cwd}",
        f"--confcutdir={package}",  # no conftest.py above the suite's folder (a venv inside the project) loads
        "-p",
        "lightning_optimizer.conformance.plugin",
        *args,
        str(package),  # by path, not --pyargs: pytest then loads no conftest.py of the current folder
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the suite with the plugin loaded; return pytest's exit code (2 when pytest is not installed)."""
    args = sys.argv[1:] if argv is None else argv
    missing = [name for name in NEEDS if not _installed(name)]
    if missing:
        print(f"lightning-optimizer-conformance needs {', '.join(missing)}: {INSTALL_HINT}", file=sys.stderr)
        return 2
    import pytest

    cwd = Path.cwd()
    if str(cwd) not in sys.path and "" not in sys.path:  # `python -m` has it already; a console script does not
        sys.path.insert(0, str(cwd))
    return int(pytest.main(pytest_arguments(args, cwd)))


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken install, or a module set to None in sys.modules
        return False


if __name__ == "__main__":
    sys.exit(main())
