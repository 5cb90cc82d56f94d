"""Engines: the shared training/scoring algorithms (base.Engine) and the backends."""
