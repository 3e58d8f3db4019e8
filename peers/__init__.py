"""Adapters that hold the frameworks users pick today to the conformance suite (``--impl=lightning_optimizer.peers.<name>``)."""
