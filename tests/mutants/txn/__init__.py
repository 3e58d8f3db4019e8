"""TXN mutants: transactions.

A real step whose preparation or inner step raises propagates the exception and leaves the window, the loss scaler's
record and the outcome as the failure policy says.
"""
