"""The training plane: TensorFlow traffic only between authenticated fleet members.

TensorFlow's own gRPC servers have no authentication, run any op a client sends (read and write
files as their user) and listen on every interface whatever the cluster spec says. So every TF
process hetcluster starts (the workers an agent starts, the parameter server and the chief on the
coordinator host) runs in a network namespace of its own that has only loopback
(:mod:`isolation`), and sees every other task of its cluster at a local port
(:mod:`localspec`). Its parent (the agent, or the coordinator) holds the other end of a control
socket (:mod:`link`): it asks the child for sockets made inside the namespace, listens on them
for the child's outgoing connections, and connects through them to the child's own server.
Between hosts the parent forwards over mutual TLS with the fleet's CA (:mod:`tls`,
:mod:`forwarder`): a peer without a certificate from that CA gets no TF handshake and no byte
forwarded. Nothing here imports TensorFlow or gRPC.
"""
