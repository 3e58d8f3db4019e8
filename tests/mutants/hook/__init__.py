"""HOOK mutants: the framework's hooks.

``before_backward``, ``before_optimizer_step`` and ``after_step``: where and how often they run, hooks that raise,
registration and removal, copies that carry none.
"""
