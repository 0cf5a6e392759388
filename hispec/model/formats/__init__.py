"""Weight formats and their kernels: the GGUF file's own 4-bit blocks (q4: the modules; q4_kernel: the
C++ kernel built at first use, csrc/; q4_layer: a whole decoder layer in one native call, and its int8-
activation copy a8)."""
