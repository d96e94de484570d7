"""Shared test settings: the product's TF environment (hetcluster/tfenv.py) and no GPU."""

import os

from hetcluster.tfenv import prepare_tf_env

# the product's TF settings (hetcluster/tfenv.py), oneDNN included: TF's CPU allocator keeps the
# statistics that the memory tests read (get_memory_info('CPU:0')) only with oneDNN on
prepare_tf_env()
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

# no test spares another its solo runs: the store of known devices (profiling/known.py) is off
# unless a test gives its own
os.environ["HETCLUSTER_MEASUREMENTS"] = "off"
