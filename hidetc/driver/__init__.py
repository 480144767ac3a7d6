"""The compile driver: the stages in order -- `config`, `backend` (what differs per
target), `tune` (records, measuring, search), `plan`, `build` / `build_cuda`, `verify` --
and the Python API that runs them (`api`)."""
