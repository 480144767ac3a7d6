"""Runtime: the artifact directory format, the static memory plan, the weights file,
the executors that run a compiled artifact, and the execution contexts (`contexts`)
that let any number of threads run one loaded model."""
