"""Runtime: the artifact directory format, the static memory plan, the weights file,
and the executors that run a compiled artifact."""
