"""Target-neutral pieces of kernels that the cpu and cuda schedules share: geometry
(`conv_geometry`), per-line emitters (`scan_lines`, `topk_line`, `scatter_plan`),
reduction tables (`reducers`), and the two rules written for both targets at once
(`norm`, `empty`: they take the target's name, "cpu" or "cuda"). The callers
(`hidetc.schedules.cpu`, `hidetc.schedules.cuda`) map the lines or rows onto their
workers. Nothing here reads a machine fact (no CpuTarget or CudaTarget).
"""
