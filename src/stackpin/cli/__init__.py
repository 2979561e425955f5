"""Thin click commands, one module per verb; the work happens in the core modules."""
