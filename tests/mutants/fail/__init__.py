"""FAIL mutants: the failure policy.

What a failed call leaves of its window under ``"discard"`` (the default) and ``"restore"``, and how the policy is
given, reported and saved.
"""
