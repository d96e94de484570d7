"""The pre-training phase: real steps of the job per device and per calibration set, with power.

Light imports only; TensorFlow runs in the training subprocesses this phase starts.
"""

from hetcluster.profiling.profile import DeviceProfile, Profile, RunProfile, load_profile, save_profile

__all__ = ["DeviceProfile", "Profile", "RunProfile", "load_profile", "save_profile"]
