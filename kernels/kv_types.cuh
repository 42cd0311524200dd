// kv_types.cuh — the KV cache type codes (KV_TYPE), shared by the cache writer (rope.cu) and the
// attention kernels (attention_kv.cuh); cuda_ops.KV_CODE is the Python side.  Layouts:
// bw24chat/backends/kernel_refs.py.
#pragma once

#ifndef KV_TYPE
#define KV_TYPE 0
#endif
#define KV_BF16 0
#define KV_Q8_0 1
#define KV_FP8 2
#define KV_F32 3
