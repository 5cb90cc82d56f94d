"""Small helpers: atomic checkpoint directories and files, timers, logging, plots."""
