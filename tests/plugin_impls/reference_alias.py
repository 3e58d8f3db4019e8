"""The reference's record under an attribute not named ``conformance_info`` (the static check is then n/a)."""

from lightning_optimizer.reference.suite_info import conformance_info

info = conformance_info
