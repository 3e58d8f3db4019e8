"""TOGGLE mutants: toggling.

The other optimizers' parameters frozen while a closure or ``toggle_model()`` runs, every ``requires_grad`` flag
restored, ``sync_grad=False`` under every distributed module's sync suppression.
"""
