"""CUDA C sources of bw24chat's kernels, shipped inside the wheel as data.

bw24chat.backends.kernel_build reads the ``*.cu`` files next to this module, compiles them
with NVRTC (through CuPy) for the GPU that is present and caches the result on disk.
"""
