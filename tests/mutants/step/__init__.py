"""STEP mutants: when a call steps.

``make_optimizer_step`` True, False or None and the schedule; the outcome a call reports (``last_outcome``), the
keyword arguments it forwards, what it returns.
"""
