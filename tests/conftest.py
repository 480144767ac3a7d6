"""Suite-wide settings. Compiles in the tests use the templates' default configs
(HIDETC_TUNE=0 turns automatic tuning off); the tuner's own tests ask for tuning
explicitly (tune=True), with their own records file."""
import os

os.environ.setdefault("HIDETC_TUNE", "0")
