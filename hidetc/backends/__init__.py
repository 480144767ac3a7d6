"""The backends layer: what turns scheduled, fused tensor programs into something that
runs. `codegen` prints them (C for the cpu, CUDA C++ for cuda), `toolchain` compiles
the printed source (gcc, nvcc, the content-hash object cache), `runtime` loads and
executes an artifact (executors, the CUDA emulator, the arena plan, the manifest).
Below the driver, above fusion (tests/architecture, the import-linter contract in
pyproject.toml)."""
