"""First call on a device machine: is the toolchain what the engine assumes?  (CuPy, NVRTC via
kernel_build with -arch=sm_90a, CUDA-graph capture with pinned-memory copies inside, the two
roofline numbers.)"""
import sys
import time

import numpy as np


def main():
    import cupy as cp

    from bw24chat.backends import kernel_build as kb
    from bw24chat.bench import measure_copy_bandwidth, measure_gemm_rate

    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    print("cupy", cp.__version__, "device", props["name"].decode(), "cc", dev.compute_capability, "SMs", props["multiProcessorCount"])
    print("nvrtc", cp.cuda.nvrtc.getVersion(), "runtime", cp.cuda.runtime.runtimeGetVersion(), "driver", cp.cuda.runtime.driverGetVersion())
    print("arch", kb.active_arch(), "include dirs", kb._cuda_include_dirs()[:2])
    for fam in kb.families():
        t = time.time()
        try:
            kb.get_module(fam, ())
            print(f"compiled {fam} in {time.time() - t:.1f}s")
        except Exception as e:  # noqa: BLE001
            print(f"FAILED {fam}: {str(e)[:2000]}")
    # graph capture with a pinned H2D copy, a kernel, a D2H copy inside
    src = r'''extern "C" __global__ void add1(int* x){ x[0] += 1; }'''
    k = cp.RawKernel(src, "add1")
    h = cp.cuda.alloc_pinned_memory(8)
    hv = np.frombuffer(h, np.int32, 2)
    d = cp.zeros(1, cp.int32)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        cp.cuda.runtime.memcpyAsync(d.data.ptr, h.ptr, 4, 1, s.ptr)  # H2D from pinned: legal in a graph
        k((1,), (1,), (d,))
        cp.cuda.runtime.memcpyAsync(h.ptr + 4, d.data.ptr, 4, 2, s.ptr)
        g = s.end_capture()
    for v in (5, 41):
        hv[0] = v
        g.launch(s)
        s.synchronize()
        print("graph replay", v, "->", hv[1], "(expect", v + 1, ")")
    print("copy GB/s", measure_copy_bandwidth(cp) / 1e9, "fp16 GEMM TFLOP/s", measure_gemm_rate(cp) / 1e12)
    try:
        import torch
        import transformers

        print("torch", torch.__version__, "transformers", transformers.__version__)
    except Exception as e:  # noqa: BLE001
        print("no torch/transformers", e)


if __name__ == "__main__":
    sys.exit(main())
