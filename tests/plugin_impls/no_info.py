"""An ``--impl`` module that exposes no ``conformance_info``."""

NAME = "not an implementation record"
