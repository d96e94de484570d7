"""Shared test settings: TF quiet and on legacy Keras, gRPC failing fast to the caller."""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
