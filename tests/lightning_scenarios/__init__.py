"""What tests/test_lightning.py and its subprocess scenarios (run as ``python -m lightning_scenarios.<name>``) share."""
