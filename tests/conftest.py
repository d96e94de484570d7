"""Shared test settings: TF quiet and on legacy Keras, gRPC failing fast to the caller."""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
# TF's CPU allocator keeps the statistics that get_memory_info('CPU:0') reads only with oneDNN on,
# which TF turns on by default only on CPUs with AVX-512 VNNI/BF16 or AMX (an AVX2-only AMD EPYC
# raised "Cannot reset memory stats for device 'CPU:0'"): the memory tests measure with it on
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
