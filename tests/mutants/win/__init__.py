"""WIN mutants: windows changed from outside the wrappers.

Parameters added to or removed from an optimizer behind its wrapper's back, and gradients of an open window cleared
by the module's or the inner optimizer's ``zero_grad()``: found at the next call, refused before anything changes.
"""
