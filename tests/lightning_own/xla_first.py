"""pytest plugin for Lightning's own tests, both sides: torch_xla imported before any test, where installed.

Lightning's accelerator discovery imports torch_xla inside a test, which sets environment variables
(``PJRT_DYNAMIC_PLUGINS``) that the tests' own leak check would blame on that test.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("torch_xla") is not None:
    import torch_xla  # noqa: F401
