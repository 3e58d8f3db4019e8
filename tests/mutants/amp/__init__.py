"""AMP mutants: 16-mixed as torch's AMP recipe runs it.

Autocast and ``GradScaler``, one unscaling per real step, one scaler update per iteration, non-finite steps skipped,
open windows rescaled when the scale changes, the recipe's scaled loss, unscaled backwards refused.
"""
