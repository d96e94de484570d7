"""hetcluster: choose which devices of a heterogeneous fleet train a DNN job, then train it.

Nothing here imports TensorFlow or scikit-learn; those load lazily where they are used, so
`hetcluster --help` and the device agent start fast.
"""

__version__ = "0.1.0"
