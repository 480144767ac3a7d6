"""Suite-wide settings. Compiles in the tests use the templates' default configs
(HIDETC_TUNE=0 turns automatic tuning off); the tuner's own tests ask for tuning
explicitly (tune=True), with their own records file."""
import os

os.environ.setdefault("HIDETC_TUNE", "0")

# Every pass a test runs through the Python runtime on a cpu artifact is run again
# through the artifact's own C runtime (`hidetc.load(OUT, runtime="c")`) and the outputs
# compared bit for bit (NaNs where NaNs): the two runtimes execute one plan, so every op,
# model and shape test checks the C runtime too. HIDETC_TEST_C_RUNTIME=0 turns it off.
if os.environ.get("HIDETC_TEST_C_RUNTIME", "1") != "0":
    from helpers.c_runtime_twin import install as _install_c_twin

    _install_c_twin()
