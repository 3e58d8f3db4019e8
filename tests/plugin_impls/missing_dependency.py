"""An implementation module that exists but imports a module that does not."""

import plugin_impls_absent_dependency  # type: ignore[import-not-found]  # noqa: F401
