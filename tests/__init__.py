import os

# One BLAS (and OpenMP) thread in every test process and in what it starts (xdist workers,
# `rlrollout serve`, the validator's child): the reference model's matrices are 64 wide, so a
# second BLAS thread only hands work over and spins while it waits. On CI's two cores, shared by
# two workers, that spinning was a third of a mutation-matrix row's CPU time. Set here, before
# tests/conftest.py first imports numpy (OpenBLAS reads it once, when it loads), unless chosen.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
