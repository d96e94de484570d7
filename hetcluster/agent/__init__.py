"""The device agent: a gRPC daemon that reports what a device is and what it draws, and runs the
TensorFlow server processes a coordinator asks for.

Layout (servicer -> handlers -> state): ``config`` parses agent.toml, ``auth`` checks every call,
``servicer`` only maps exceptions to status codes, ``handlers`` are plain functions of
(request, state), ``state`` holds the device facts, power source and ``tasks`` supervision.
``client`` is what the rest of hetcluster uses to talk to agents. Nothing here imports
TensorFlow; only the child process ``tf_server`` does.
"""
