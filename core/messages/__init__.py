"""Typed messages between processes, one module each, imported by both ends."""
