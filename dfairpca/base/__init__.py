"""Foundations every layer uses: parameter rules, the machine (CPUs, block size), the
version and code digest, the BLAS binding and the eigensolvers."""
