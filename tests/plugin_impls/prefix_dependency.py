"""An implementation module that exists but imports a missing module whose name is a prefix of its own."""

import plugin_imp  # type: ignore[import-not-found]  # noqa: F401
