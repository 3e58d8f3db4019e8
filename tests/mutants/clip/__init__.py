"""CLIP mutants: clipping.

Each window's unscaled mean is clipped right before the inner step, by one total norm over every group;
``unscale_gradients()`` makes the gradients that step will apply.
"""
