"""Explicit targets for the tests (hidetc.target): nothing about the machine the suite
runs on is assumed but the ISA of the kernels it runs here.

CPU: this host's ISA, 2 cores (the task shapes the template tests were written
against); `cpu(n)` the same at n cores. CUDA: sm_90's reference GPU (its limits)."""
from hidetc import cpu_isa
from hidetc.target import CpuTarget, cuda_target


def cpu(cores: int) -> CpuTarget:
    return CpuTarget(isa=cpu_isa.current().name, cores=cores)


CPU = cpu(2)
CUDA = cuda_target("sm_90")
