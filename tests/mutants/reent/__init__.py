"""REENT mutants: re-entry.

A ``step()`` called while a ``step()`` of the same context runs is refused and changes nothing.
"""
