"""Small helpers: atomic checkpoint directories."""
